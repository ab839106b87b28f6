"""Weight stashing and vertical sync for the ``pipedream`` schedule (PipeDream §3.3).

A stage updates its weights after every backward, so micro-batches in flight were run
forward on older weights. Weight stashing keeps, for each of them, the version its forward
used, and its backward computes the gradient with that same version; the gradient is then
applied to the latest weights. With vertical sync every stage runs micro-batch ``mb`` on
the version that stage 0 used for it (``ops.first_stage_versions``), so a stage also keeps
versions older than the ones in flight until the last forward that needs them.

Versions are counted in micro-batches whose gradients they include (``applied``): a stage
of ``r`` replicas adds ``r`` per update (one all-reduced round). A version is a detached copy
of the trainable parameters, shared by every micro-batch that uses it and dropped when none
in flight or to come needs it. Synchronous schedules do not use this class: they run every
micro-batch of a step on the live parameters.

Parameters are named ``layer.param`` so that a version outlives a change of the stage's
layers (live repartition, ``migration/switch.py``): ``params`` is the worker's dict of the
parameters it owns, which a hand-off grows or shrinks; ``on_snapshot(version, skip)`` runs
before the live parameters are copied as ``version`` (a layer arriving at that version must
have arrived, unless it is in ``skip``), ``fetch(version, names)`` supplies the parameters
of ``version`` that this stage did not make itself (a layer whose old stage made that
version), and ``older(microbatch, version)`` maps each layer that the forward of
``microbatch`` runs on a version older than the stage's ``version`` to that version (a
layer just moved here from upstream, ``transition.moved_version``): that forward gets
weights of its own, the stage's version with those layers' older ones.
"""

from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn


class WeightVersions:
    """The weight versions of one pipedream worker over a segment (see the module docstring)."""

    def __init__(
        self,
        params: dict[str, nn.Parameter],
        replicas: int,
        applied: int,
        forwards: Iterable[int],
        first_stage_versions: Mapping[int, int] | None,
        on_snapshot: Callable[[int, Collection[str]], None] | None = None,
        fetch: Callable[[int, list[str]], Mapping[str, Tensor]] | None = None,
        older: Callable[[int, int], Mapping[str, int]] | None = None,
    ) -> None:
        self.params = params
        self.on_snapshot = on_snapshot
        self.fetch = fetch
        self.older = older
        self.replicas = replicas
        self.first_applied = applied
        self.applied = applied
        self.required = first_stage_versions
        self.forwards_left = deque(forwards)
        self.stashes: dict[int, dict[str, Tensor]] = {}
        self.inflight: dict[int, int] = {}
        self.own: dict[int, dict[str, Tensor]] = {}  # a forward's weights of its own

    def _ideal(self, microbatch: int) -> int:
        """The version micro-batch ``microbatch``'s forward runs on."""
        if self.required is None or self.required[microbatch] >= self.applied:
            return self.applied
        wanted = self.required[microbatch]
        return self.first_applied + self.replicas * ((wanted - self.first_applied) // self.replicas)

    def _snapshot(self, skip: Collection[str] = ()) -> dict[str, Tensor]:
        if self.on_snapshot is not None:
            self.on_snapshot(self.applied, skip)
        return {
            name: param.detach().clone().requires_grad_(True) if param.requires_grad else param
            for name, param in self.params.items()
        }

    def for_forward(self, microbatch: int, names: Sequence[str] | None = None) -> dict[str, Tensor]:
        """The weights micro-batch ``microbatch`` runs forward (and later backward) on;
        ``names`` are the parameters it needs (default: those the stage owns)."""
        assert self.forwards_left and self.forwards_left[0] == microbatch, microbatch
        self.forwards_left.popleft()
        version = self._ideal(microbatch)
        older = dict(self.older(microbatch, version)) if self.older is not None else {}
        if version == self.applied and version not in self.stashes:
            self.stashes[version] = self._snapshot(skip=older)
        assert version in self.stashes, f"weight version {version} was not kept"
        stash = self.stashes[version]
        missing = [name for name in names or () if name not in stash and _layer(name) not in older]
        if missing:
            assert self.fetch is not None, f"parameters {missing} of version {version}"
            stash.update(self.fetch(version, missing))
        self.inflight[microbatch] = version
        if not older:
            return stash
        by_version: dict[int, list[str]] = {}
        for name in names or ():
            if _layer(name) in older:
                by_version.setdefault(older[_layer(name)], []).append(name)
        weights = dict(stash)
        for older_version, group in by_version.items():
            assert self.fetch is not None, f"parameters {group} of version {older_version}"
            weights.update(self.fetch(older_version, group))
        self.own[microbatch] = weights
        return weights

    def for_backward(self, microbatch: int) -> dict[str, Tensor]:
        if microbatch in self.own:
            return self.own[microbatch]
        return self.stashes[self.inflight[microbatch]]

    def release(self, microbatch: int) -> None:
        """The backward of ``microbatch`` is done: its version may go."""
        del self.inflight[microbatch]
        self.own.pop(microbatch, None)
        self._collect()

    def before_update(self) -> None:
        """Keep the live version if a forward to come runs on it (vertical sync)."""
        if self.applied in self.stashes:
            return
        for microbatch in self.forwards_left:
            version = self._ideal(microbatch)
            if version == self.applied:
                self.stashes[version] = self._snapshot()
            if version >= self.applied:
                return

    def after_update(self) -> None:
        self.applied += self.replicas
        self._collect()

    def _collect(self) -> None:
        keep = set(self.inflight.values())
        oldest_to_come = (
            self._ideal(self.forwards_left[0]) if self.forwards_left else self.applied + 1
        )
        for version in list(self.stashes):
            if version not in keep and version < oldest_to_come:
                del self.stashes[version]

    @property
    def num_versions(self) -> int:
        """Versions held besides the live parameters."""
        return len(self.stashes)


def _layer(name: str) -> str:
    """The layer of a parameter named ``layer.param``."""
    return name.split(".", 1)[0]


def trainable(weights: Mapping[str, Tensor]) -> list[tuple[str, Tensor]]:
    return [(name, tensor) for name, tensor in weights.items() if tensor.requires_grad]


@torch.no_grad()
def set_gradients(
    params: Mapping[str, nn.Parameter], grads: Mapping[str, Tensor | None], *, accumulate: bool
) -> None:
    """Put ``grads`` into the live parameters' ``.grad`` (adding to it when ``accumulate``)."""
    for name, grad in grads.items():
        if grad is None:
            continue
        param = params[name]
        if param.grad is None or not accumulate:
            param.grad = grad.detach()
        else:
            param.grad.add_(grad)
