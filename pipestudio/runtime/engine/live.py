"""A rank's live repartition: its partitions over micro-batches, and the state it moves.

The worker asks ``partition(mb)`` which layers to run a micro-batch on, calls
``learn_until(step)`` before it first touches an op of a step (the migrations that the
job's coordinator announced for that step begin then, ``control.py``), ``after_update``
after every update (versions and hand-offs that became due are sent) and
``ensure_arrived(mb)`` before it needs the live state of a layer arriving for ``mb``.
The protocol is ``transition.py``'s; the messages are ``handoff.py``'s.
"""

import time
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.handoff import (
    HANDOFF_SLOT,
    Channel,
    layer_state,
    layer_versions,
    load_layer_state,
    tag,
)
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.repartition import with_stages
from pipestudio.runtime.engine.stage import StageRunner
from pipestudio.runtime.engine.transition import (
    Partition,
    Transition,
    exchanges,
    needed_versions,
    runner_keys,
)

if TYPE_CHECKING:
    from pipestudio.runtime.engine.control import ControlClient
    from pipestudio.runtime.engine.worker import Worker


class LiveRepartition:
    """One rank's partitions and migrations (see the module docstring)."""

    def __init__(self, worker: "Worker", control: "ControlClient | None") -> None:
        self.worker, self.control = worker, control
        self.modules = dict(worker.spec.layers)
        runner = worker.stage
        first = Partition(0, worker.plan, worker.layout, worker.io, runner, runner_keys(runner))
        self.partitions = [first]
        self.owned: dict[str, nn.Parameter] = first.qualified()
        self.transitions: list[Transition] = []
        self.channel = Channel(worker.ctx.timeout_s, worker.watchdog)
        self.start_step = 0
        self.known_step = -1
        self.applied = 0

    def start(self, start_step: int) -> None:
        self.start_step, self.known_step = start_step, start_step - 1
        self.applied = start_step * self.worker.plan.num_microbatches

    def partition(self, microbatch: int) -> Partition:
        for part in reversed(self.partitions):
            if part.switch_mb <= microbatch:
                return part
        return self.partitions[0]

    @property
    def latest(self) -> Partition:
        return self.partitions[-1]

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
        runner = StageRunner(self.modules, io, w.spec.graph_inputs(), w.spec.loss,
                             plan.num_microbatches, w.ctx.device, w.swap, w.recorder)
        step = decision["step"]
        switch_mb = step * plan.num_microbatches
        outgoing, incoming = exchanges(self.latest.layout, layout, w.ctx.rank)
        self.partitions.append(Partition(switch_mb, plan, layout, io, runner,
                                         runner_keys(runner)))
        transition = Transition(decision["id"], step, switch_mb, outgoing, incoming,
                                started_ms=w.ctx.clock.now_ms())
        for peer in outgoing:
            transition.needed[peer] = needed_versions(
                plan, layout.worker(peer)[0], step, self.start_step, w.config.steps,
                w.config.checkpoint_every)
        self.transitions.append(transition)
        self.after_update(self.applied)

    def after_update(self, applied: int) -> None:
        """Send the versions and hand-offs due now that ``applied`` micro-batches are in."""
        self.applied = applied
        for t in self.transitions:
            for peer, layers in t.outgoing.items():
                if peer not in t.handed_off:
                    self._send_due(t, peer, layers)

    def _send_due(self, t: Transition, peer: int, layers: list[str]) -> None:
        modules = {name: self.modules[name] for name in layers}
        for version in sorted(t.needed.get(peer, ())):
            if (peer, version) in t.versions_sent:
                continue
            if version < self.applied:
                raise EngineError(f"migration {t.migration_id}: weight version {version} of "
                                  f"{layers} was needed after it was replaced")
            if version == self.applied:
                t.sent_bytes += self.channel.send(
                    layer_versions(modules), peer, tag(t.migration_id, 1 + t.switch_mb - version))
                t.versions_sent.add((peer, version))
        if self.applied >= t.switch_mb:
            t.sent_bytes += self.channel.send(layer_state(modules, self.worker.optimizer), peer,
                                              tag(t.migration_id, HANDOFF_SLOT))
            t.handed_off.add(peer)
            prefixes = tuple(f"{name}." for name in layers)
            for full in [full for full in self.owned if full.startswith(prefixes)]:
                del self.owned[full]
            self._rebuild_optimizer({})
            self._maybe_done(t)

    def ensure_arrived(self, microbatch: int) -> None:
        """Receive the hand-offs of migrations that switch at or before ``microbatch``."""
        for t in self.transitions:
            if t.switch_mb > microbatch:
                continue
            for peer, layers in t.incoming.items():
                if peer in t.received:
                    continue
                what = (f"receiving layers {layers} from {self.worker.layout.describe(peer)} "
                        f"(migration {t.migration_id})")
                start = time.perf_counter()
                before = self.channel.received_bytes
                state = self.channel.receive(peer, tag(t.migration_id, HANDOFF_SLOT), what)
                t.received_bytes += self.channel.received_bytes - before
                modules = {name: self.modules[name] for name in layers}
                extra = load_layer_state(modules, state, self.worker.ctx.device)
                t.wait_ms += (time.perf_counter() - start) * 1e3
                for name in layers:
                    for key, param in modules[name].named_parameters():
                        self.owned[f"{name}.{key}"] = param
                t.received.add(peer)
                self._rebuild_optimizer(extra)
                self._maybe_done(t)

    def fetch(self, version: int, names: list[str]) -> dict[str, Tensor]:
        """Parameters ``names`` (``layer.param``) at ``version``, from their old stage."""
        result: dict[str, Tensor] = {}
        sources: dict[tuple[int, int], Transition] = {}
        for layer in sorted({name.split(".", 1)[0] for name in names}):
            t = min((t for t in self.transitions if layer in t.layers_in()
                     and t.switch_mb > version), key=lambda t: t.switch_mb)
            peer = next(p for p, layers in t.incoming.items() if layer in layers)
            sources[(t.migration_id, peer)] = t
        for (_, peer), t in sources.items():
            what = (f"receiving weight version {version} of {t.incoming[peer]} from "
                    f"{self.worker.layout.describe(peer)} (migration {t.migration_id})")
            start, before = time.perf_counter(), self.channel.received_bytes
            message = self.channel.receive(peer, tag(t.migration_id, 1 + t.switch_mb - version),
                                           what)
            t.wait_ms += (time.perf_counter() - start) * 1e3
            t.received_bytes += self.channel.received_bytes - before
            for name, params in message.items():
                for key, value in params.items():
                    trainable = self.modules[name].get_parameter(key).requires_grad
                    result[f"{name}.{key}"] = value.to(self.worker.ctx.device).requires_grad_(
                        trainable)
        return {name: result[name] for name in names}

    def _rebuild_optimizer(self, extra: dict[nn.Parameter, dict[str, Any]]) -> None:
        """An optimizer over the owned parameters, in the newest partition's order."""
        w = self.worker
        order = [p for full, p in self.latest.qualified().items() if full in self.owned]
        seen = {id(p) for p in order}
        order += [p for p in self.owned.values() if id(p) not in seen]
        old = w.optimizer
        w.optimizer = w.make_optimizer([p for p in order if p.requires_grad])
        if w.optimizer is None:
            return
        for param in order:
            if old is not None and param in old.state:
                w.optimizer.state[param] = old.state[param]
            elif param in extra:
                w.optimizer.state[param] = extra[param]

    def _maybe_done(self, t: Transition) -> None:
        if not t.done:
            return
        w = self.worker
        w.recorder.sink({
            "type": "migration", "phase": "done", "id": t.migration_id, "step": t.step,
            "switch_microbatch": t.switch_mb, "stage": w.stage_idx, "replica": w.replica,
            "rank": w.ctx.rank, "layers_out": t.layers_out(), "layers_in": t.layers_in(),
            "sent_bytes": t.sent_bytes, "received_bytes": t.received_bytes,
            "wait_ms": t.wait_ms,
            "elapsed_ms": w.ctx.clock.now_ms() - t.started_ms, "time_ms": w.ctx.clock.now_ms()})

    def finish(self) -> None:
        """Wait for this rank's migration messages to be received."""
        self.channel.drain()
