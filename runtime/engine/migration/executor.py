"""A rank's live repartition: its partitions over micro-batches, and the state it moves.

The worker asks ``partition(mb)`` which layers to run a micro-batch on, calls
``learn_until(step)`` before it first touches an op of a step (the migrations that the
job's coordinator announced for that step begin then, ``coordinator.py``), ``after_update``
after every update (versions and hand-offs that became due are sent) and
``ensure_arrived(mb)`` before it needs the weights of a layer arriving for ``mb`` and
``ensure_trainable()`` before an update (or a checkpoint) needs their optimizer state. A
rank posts the receives of the versions and weights a migration brings it as soon as it
learns of the migration, and that of the training state once the weights are in. The
protocol is ``switch.py``'s; the messages are ``wire.py``'s.
"""

import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from pipestudio.planner.formats.plan import Plan
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.execution.stage import StageRunner
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.migration.settings import with_stages
from pipestudio.runtime.engine.migration.switch import (
    Partition,
    RankMigration,
    exchanges,
    needed_versions,
    runner_keys,
)
from pipestudio.runtime.engine.migration.wire import (
    TRAINING_SLOT,
    WEIGHTS_SLOT,
    Channel,
    Outgoing,
    header_of,
    layer_training,
    layer_versions,
    layer_weights,
    load_layer_training,
    load_layer_weights,
    message_tag_of,
    weight_layout,
)

if TYPE_CHECKING:
    from pipestudio.runtime.engine.migration.coordinator import MigrationControl
    from pipestudio.runtime.engine.worker import Worker


class MigrationExecutor:
    """One rank's partitions and migrations (see the module docstring)."""

    def __init__(self, worker: "Worker", control: "MigrationControl | None") -> None:
        self.worker, self.control = worker, control
        self.modules = dict(worker.spec.layers)
        runner = worker.stage
        first = Partition(0, worker.plan, worker.layout, worker.io, runner, runner_keys(runner))
        self.partitions = [first]
        self.owned: dict[str, nn.Parameter] = first.qualified()
        self.untrained: set[str] = set()  # owned, optimizer state not arrived yet
        self.transitions: list[RankMigration] = []
        self.channel = Channel(worker.ctx.rank, worker.ctx.timeout_s, worker.watchdog)
        self.start_step = 0
        self.known_step = -1
        self.applied = 0

    def start(self, start_step: int) -> None:
        self.start_step, self.known_step = start_step, start_step - 1
        self.applied = start_step * self.worker.plan.num_microbatches
        if self.control is not None:
            self.control.start(start_step)

    def partition(self, microbatch: int) -> Partition:
        for part in reversed(self.partitions):
            if part.switch_microbatch <= microbatch:
                return part
        return self.partitions[0]

    @property
    def latest(self) -> Partition:
        return self.partitions[-1]

    @property
    def arriving(self) -> bool:
        """Whether the weights of some layer migrating here have not been taken yet."""
        return any(len(t.received) < len(t.incoming) for t in self.transitions)

    def learn_until(self, step: int) -> None:
        """Begin the migrations announced for steps up to ``step``."""
        if self.control is None:
            return
        while self.known_step < step:
            self.known_step += 1
            for decision in self.control.verdict(self.known_step, self.latest.plan):
                self.begin(decision)

    def begin(self, decision: dict[str, Any]) -> None:
        w = self.worker
        plan = with_stages(self.latest.plan, decision["stages"], decision["policies"])
        layout = EngineLayout(plan, w.spec.name, w.spec.layer_names, w.spec.graph_inputs())
        io = layout.stages[w.stage_idx]
        runner = StageRunner(
            self.modules,
            io,
            w.spec.graph_inputs(),
            w.spec.loss,
            plan.num_microbatches,
            w.ctx.device,
            w.swap,
            w.recorder,
            plan.precision,
            split_backward=plan.schedule == "zero-bubble",
        )
        step = decision["step"]
        switch_microbatch = step * plan.num_microbatches
        old_layout = self.latest.layout
        outgoing, incoming = exchanges(old_layout, layout, w.ctx.rank)
        self.partitions.append(
            Partition(switch_microbatch, plan, layout, io, runner, runner_keys(runner))
        )
        transition = RankMigration(
            decision["id"],
            step,
            switch_microbatch,
            outgoing,
            incoming,
            started_ms=w.ctx.clock.now_ms(),
        )
        for peer in outgoing:
            needed = self._needed(plan, w.stage_idx, layout.worker(peer)[0], step)
            transition.needed[peer] = set(needed.values())
        for peer, layers in incoming.items():
            modules = {name: self.modules[name] for name in layers}
            versions = header_of(layer_versions(modules))
            older = self._needed(plan, old_layout.worker(peer)[0], w.stage_idx, step)
            transition.older[peer] = older
            for version in sorted(set(older.values())):
                self.channel.expect(
                    peer,
                    message_tag_of(transition.migration_id, 1 + switch_microbatch - version),
                    versions,
                )
            self.channel.expect(
                peer,
                message_tag_of(transition.migration_id, WEIGHTS_SLOT),
                *weight_layout(modules),
                follow=message_tag_of(transition.migration_id, TRAINING_SLOT),
            )
        self.transitions.append(transition)
        self.after_update(self.applied)

    def _needed(self, plan: Plan, old_stage: int, new_stage: int, step: int) -> dict[int, int]:
        config = self.worker.config
        return needed_versions(
            plan, old_stage, new_stage, step, self.start_step, config.steps, config.checkpoint_every
        )

    def older_versions(self, microbatch: int, version: int) -> dict[str, int]:
        """The layers that the forward of ``microbatch``, on this stage's ``version``, runs
        on an older version, and that version (``transition.moved_version``)."""
        result: dict[str, int] = {}
        for t in self.transitions:
            for peer, layers in t.incoming.items():
                older = t.older.get(peer, {}).get(microbatch)
                if older is not None and older < version:
                    result.update(dict.fromkeys(layers, older))
        return result

    def after_update(self, applied: int) -> None:
        """Send the versions and hand-offs due now that ``applied`` micro-batches are in:
        the weights to every new stage first (each waits for them before a forward), each
        announcing the training state that follows (waited for only before an update)."""
        self.applied = applied
        due = []
        for t in self.transitions:
            for peer, layers in t.outgoing.items():
                if peer not in t.handed_off:
                    self._send_versions(t, peer, layers)
                    if self.applied >= t.switch_microbatch:
                        due.append((t, peer, {name: self.modules[name] for name in layers}))
        training = [
            Outgoing(layer_training(modules, self.worker.optimizer), frozen=True)
            for _, _, modules in due
        ]
        for (t, peer, modules), state in zip(due, training, strict=True):
            t.sent_bytes += self.channel.send(
                Outgoing(layer_weights(modules), frozen=True),
                peer,
                message_tag_of(t.migration_id, WEIGHTS_SLOT),
                announce=state,
            )
        for (t, peer, modules), state in zip(due, training, strict=True):
            t.sent_bytes += self.channel.send(
                state, peer, message_tag_of(t.migration_id, TRAINING_SLOT), described=True
            )
            t.handed_off.add(peer)
            prefixes = tuple(f"{name}." for name in modules)
            for full in [full for full in self.owned if full.startswith(prefixes)]:
                del self.owned[full]
        if due:
            self._rebuild_optimizer({})
            for t, _, modules in due:
                self._let_go(t, modules)
            for t in {id(t): t for t, _, _ in due}.values():
                self._maybe_done(t)
        self._release(applied)

    def _let_go(self, t: RankMigration, modules: Mapping[str, nn.Module]) -> None:
        """Layers handed on: their gradients went with the hand-off, their optimizer state
        left with the old optimizer; on a GPU the copy this rank keeps goes back to host
        memory, so the stage's memory falls by all the layers took, unless a later
        partition already begun brings the layer back here (its runner put it on the
        device when it began)."""
        returning = {
            name
            for part in self.partitions
            if part.switch_microbatch > t.switch_microbatch
            for name in part.runner.names
        }
        for name, module in modules.items():
            for param in module.parameters():
                param.grad = None
            if self.worker.ctx.device.type != "cpu" and name not in returning:
                module.to("cpu")

    def _release(self, applied: int) -> None:
        """Let go of what a migration sent once a whole step has passed its switch: by then
        every new stage has posted every receive, or will without anything more from this
        rank (it needs only micro-batches up to the switch's from here, all sent), so the
        wait ends."""
        num_microbatches = self.worker.plan.num_microbatches
        for t in self.transitions:
            if (
                t.outgoing
                and not t.released
                and t.handed_off == set(t.outgoing)
                and applied > t.switch_microbatch + num_microbatches
            ):
                self.channel.release(t.migration_id)
                t.released = True

    def _send_versions(self, t: RankMigration, peer: int, layers: list[str]) -> None:
        """``pipedream``: the weight versions of ``layers`` the peer needs, as they are made."""
        modules = {name: self.modules[name] for name in layers}
        for version in sorted(t.needed.get(peer, ())):
            if (peer, version) in t.versions_sent:
                continue
            if version < self.applied:
                raise EngineError(
                    f"migration {t.migration_id}: weight version {version} of "
                    f"{layers} was needed after it was replaced"
                )
            if version == self.applied:
                t.sent_bytes += self.channel.send(
                    Outgoing(layer_versions(modules), frozen=False),
                    peer,
                    message_tag_of(t.migration_id, 1 + t.switch_microbatch - version),
                )
                t.versions_sent.add((peer, version))

    def _receive(self, t: RankMigration, peer: int, slot: int, what: str) -> dict[str, Any]:
        start, before = time.perf_counter(), self.channel.received_bytes
        message = self.channel.receive(
            peer,
            message_tag_of(t.migration_id, slot),
            f"{what} from {self.worker.layout.describe(peer)} (migration {t.migration_id})",
        )
        t.wait_ms += (time.perf_counter() - start) * 1e3
        t.received_bytes += self.channel.received_bytes - before
        return message

    def ensure_arrived(
        self, microbatch: int, layer: str | None = None, skip: Collection[str] = ()
    ) -> None:
        """Receive the weights of layers arriving for ``microbatch`` or earlier (with
        ``layer``: only of the message that brings it, so a stage's forward can run the
        layers it has while a later one is still on its way; not of those in ``skip``)."""
        for t in self.transitions:
            if t.switch_microbatch > microbatch:
                continue
            for peer, layers in t.incoming.items():
                if (
                    peer in t.received
                    or (layer is not None and layer not in layers)
                    or any(name in skip for name in layers)
                ):
                    continue
                modules = {name: self.modules[name] for name in layers}
                load_layer_weights(
                    modules, self._receive(t, peer, WEIGHTS_SLOT, f"receiving layers {layers}")
                )
                for name in layers:
                    for key, param in modules[name].named_parameters():
                        self.owned[f"{name}.{key}"] = param
                        self.untrained.add(f"{name}.{key}")
                t.received.add(peer)

    def before_snapshot(self, version: int, skip: Collection[str]) -> None:
        """Weight stashing copies the live parameters as ``version``: the layers arriving
        for it must be in, except those in ``skip`` (``weights.WeightVersions``)."""
        self.ensure_arrived(version, skip=skip)

    def ensure_trainable(self) -> None:
        """Receive the training state of every layer whose weights have arrived."""
        for t in self.transitions:
            for peer in sorted(t.received - t.trained):
                layers = t.incoming[peer]
                modules = {name: self.modules[name] for name in layers}
                message = self._receive(
                    t, peer, TRAINING_SLOT, f"receiving the optimizer state of {layers}"
                )
                extra = load_layer_training(modules, message, self.worker.ctx.device)
                for name in layers:
                    for key, _ in modules[name].named_parameters():
                        self.untrained.discard(f"{name}.{key}")
                t.trained.add(peer)
                self._rebuild_optimizer(extra)
                self._maybe_done(t)

    def fetch(self, version: int, names: list[str]) -> dict[str, Tensor]:
        """Parameters ``names`` (``layer.param``) at ``version``, from their old stage."""
        result: dict[str, Tensor] = {}
        sources: dict[tuple[int, int], RankMigration] = {}
        for layer in sorted({name.split(".", 1)[0] for name in names}):
            t = min(
                (
                    t
                    for t in self.transitions
                    if layer in t.layers_in() and t.switch_microbatch > version
                ),
                key=lambda t: t.switch_microbatch,
            )
            peer = next(p for p, layers in t.incoming.items() if layer in layers)
            sources[(t.migration_id, peer)] = t
        for (_, peer), t in sources.items():
            if (peer, version) not in t.fetched:
                t.fetched[(peer, version)] = self._receive(
                    t,
                    peer,
                    1 + t.switch_microbatch - version,
                    f"receiving weight version {version} of {t.incoming[peer]}",
                )
            message = t.fetched[(peer, version)]
            for name, params in message.items():
                for key, value in params.items():
                    trainable = self.modules[name].get_parameter(key).requires_grad
                    result[f"{name}.{key}"] = value.to(self.worker.ctx.device).requires_grad_(
                        trainable
                    )
        return {name: result[name] for name in names}

    def _rebuild_optimizer(self, extra: dict[nn.Parameter, dict[str, Any]]) -> None:
        """An optimizer over the owned parameters, in the newest partition's order."""
        w = self.worker
        trained = {full: p for full, p in self.owned.items() if full not in self.untrained}
        order = [p for full, p in self.latest.qualified().items() if full in trained]
        seen = {id(p) for p in order}
        order += [p for p in trained.values() if id(p) not in seen]
        old = w.optimizer
        w.optimizer = w.make_optimizer([p for p in order if p.requires_grad])
        if w.optimizer is None:
            return
        for param in order:
            if old is not None and param in old.state:
                w.optimizer.state[param] = old.state[param]
            elif param in extra:
                w.optimizer.state[param] = extra[param]

    def _maybe_done(self, t: RankMigration) -> None:
        if not t.done:
            return
        t.fetched.clear()
        w = self.worker
        w.recorder.sink(
            {
                "type": "migration",
                "phase": "done",
                "id": t.migration_id,
                "step": t.step,
                "switch_microbatch": t.switch_microbatch,
                "stage": w.stage_idx,
                "replica": w.replica,
                "rank": w.ctx.rank,
                "layers_out": t.layers_out(),
                "layers_in": t.layers_in(),
                "sent_bytes": t.sent_bytes,
                "received_bytes": t.received_bytes,
                "wait_ms": t.wait_ms,
                "elapsed_ms": w.ctx.clock.now_ms() - t.started_ms,
                "time_ms": w.ctx.clock.now_ms(),
            }
        )

    def finish(self) -> None:
        """Wait for this rank's migration messages to be received."""
        self.channel.drain()
