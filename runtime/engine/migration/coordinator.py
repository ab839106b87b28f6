"""The job's migrations: one coordinator decides, every rank follows its verdicts.

Ranks run ahead of and behind one another, so they must agree on the micro-batch at which a
migration switches without waiting for each other. Rank 0 is the coordinator (vPipe's
global planner, Zhao et al. TPDS'22 §4): when it first touches an op of step ``k`` it
writes the store key ``repartition/verdict/k``, the migrations it schedules then (often
none), each effective at a step ``>= k + lead`` (``>= k`` at the run's first step, below).
Every other rank reads that key when it first touches step ``k`` (a blocking ``get`` with
the job's timeout), which is before it can post a receive for, or run, any micro-batch of
the migration. The lead is 1 step for ``gpipe``/``1f1b``, so that each rank builds its new
partition, posts its receives and sends its hand-off (``executor.py``) during the step before,
not between the flush and its first forward, and ``1 + ceil((W + 1) / m)`` steps under
``pipedream`` (W the first stage's warm-up forwards, m micro-batches per step), so that the
old stage knows before it makes the first weight version the new stage will need.
Migrations follow one another: the next takes effect at least ``lead`` steps later. A run
starts flushed, so at its first step nothing needs sending ahead and a migration due then
takes effect at once. A resumed run starts on its checkpoint's partition and follows its
``record``: the scripted migrations made by then are behind it, the others are due at
the step recorded (one overdue at once), and the migrations queued but not in effect at
the checkpoint's step (scripted, commanded, approved or the online planner's) are queued
again in their order; with the same control directory, the commands read before are not
read again and the held proposals stay held (another directory is read from its first
command). A checkpoint without a record (or a ``--migrate`` list that changed) falls
back to: the scripted steps before the first are behind it, and a migration scripted at
the first step is skipped when the partition already holds it; with a record, a move for
a step before the first that the record has no word of (added to the list since) gets a
``rejected`` event saying it is not made. Under ``pipedream`` a
migration decided across a checkpoint cut switches at the cut; one that would share the
cut with another is decided after it.

The coordinator schedules, in order: scripted migrations (``--migrate``), commands from
the control directory (``intake.py``), and the online planner's proposals (``online.py``);
what a checkpoint keeps of all that is ``record.py``'s. Each scheduled migration is a
``migration`` event (phase ``scheduled``; each rank adds phase ``done`` with its bytes and
waits, ``executor.py``).
"""

import json
import math
from typing import Any

from pipestudio.planner.formats.plan import Plan
from pipestudio.runtime.engine.checkpoint import read_latest
from pipestudio.runtime.engine.config import EngineConfig
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.migration.intake import CommandIntake, Request
from pipestudio.runtime.engine.migration.online import STORE_PREFIX, OnlinePlanner, window_key
from pipestudio.runtime.engine.migration.record import (
    Scheduled,
    already_made,
    command_line_form,
    match_record,
    recorded_form,
)
from pipestudio.runtime.engine.migration.settings import (
    MigrationSettings,
    check_replicas,
    moved_layers,
    new_plan,
    with_stages,
)
from pipestudio.runtime.engine.ops import segments
from pipestudio.runtime.engine.telemetry.meter import LayerMeter
from pipestudio.runtime.engine.telemetry.metrics import EventSink, Recorder
from pipestudio.runtime.engine.telemetry.observe import window_report
from pipestudio.runtime.models import ModelSpec


def lead_steps(plan: Plan) -> int:
    """How many steps ahead a migration is decided (module docstring)."""
    if plan.schedule != "pipedream":
        return 1
    return 1 + math.ceil((plan.warmup_forwards(0) + 1) / plan.num_microbatches)


class MigrationControl:
    """A rank's side of the control (module docstring); rank 0 also holds the coordinator."""

    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        rank: int,
        world_size: int,
        store: Any,
        sink: EventSink,
    ) -> None:
        assert config.migration is not None
        self.settings: MigrationSettings = config.migration
        self.rank, self.world_size, self.store = rank, world_size, store
        self.measures = self.settings.every > 0
        self.coordinator = Coordinator(config, spec, store, sink) if rank == 0 else None

    def start(self, start_step: int) -> None:
        if self.coordinator is not None:
            self.coordinator.start(start_step)

    def verdict(self, step: int, plan: Plan) -> list[dict[str, Any]]:
        """The migrations decided at ``step`` (rank 0 decides, the others read)."""
        key = f"{STORE_PREFIX}/verdict/{step}"
        if self.coordinator is not None:
            decisions = self.coordinator.decide(step, plan)
            self.store.set(key, json.dumps(decisions))
            return decisions
        result: list[dict[str, Any]] = json.loads(self.store.get(key).decode())
        return result

    def record(self, step: int) -> dict[str, Any] | None:
        """The coordinator's record for a checkpoint of ``step`` (rank 0; None elsewhere)."""
        return self.coordinator.record(step) if self.coordinator is not None else None

    def after_step(self, step: int, recorder: Recorder, meter: LayerMeter | None) -> None:
        """Publish this rank's window of measurements when ``step`` ends one."""
        every = self.settings.every
        if meter is None or every <= 0 or (step + 1) % every:
            return
        report = window_report(recorder, meter, step + 1 - every, step)
        self.store.set(window_key(step, self.rank), json.dumps(report))


class Coordinator:
    """Rank 0's decisions (module docstring): the requests queued, in order, and the
    migrations scheduled from them; commands come through ``intake``, proposals from
    ``online``."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, store: Any, sink: EventSink) -> None:
        assert config.migration is not None
        self.config, self.spec, self.sink = config, spec, sink
        self.settings = config.migration
        self.lead = lead_steps(config.plan)
        self.next_id, self.last_effective = 1, -(10**9)
        self.first_step = 0
        #: the scripted migrations in order of step (a record names them by index), and
        #: those not queued yet
        self.migrations = sorted(self.settings.migrations, key=lambda m: m.step)
        self.scripted: list[Scheduled] = [(m.step, i, m) for i, m in enumerate(self.migrations)]
        self.requests: list[Request] = []  # queued, not decided yet (in order)
        self.queued: list[Request] = []  # every request queued, as decided
        self.consumed: set[int] = set()  # scripted migrations made before this run
        self.unrecorded: set[int] = set()  # the checkpoint resumed from has no word of
        self.intake = CommandIntake(self.settings, self._target, config.plan, self._queue)
        self.online = OnlinePlanner(config, spec, store, sink, self.intake, self._queue)

    def start(self, start_step: int) -> None:
        """The run starts at ``start_step`` (module docstring), on what its checkpoint's
        ``record`` says; without one, the scripted migrations before ``start_step`` are
        taken as made."""
        self.first_step = start_step
        if self.settings.every > 0:
            self.online.start(start_step)
        meta = (
            read_latest(self.config.checkpoint_dir)
            if self.config.resume and self.config.checkpoint_dir and start_step
            else None
        )
        record = (meta or {}).get("repartition") or {}
        entries = match_record(self.scripted, record.get("scripted", []))
        kept = []
        for due, index, migration in self.scripted:
            entry = entries.get(index)
            if entry is None:
                self.unrecorded.add(index)
                if due >= start_step:
                    kept.append((due, index, migration))
                elif record:  # added to the list since the stopped run
                    self.sink(
                        {
                            "type": "migration",
                            "phase": "rejected",
                            "source": "scripted",
                            "reason": f"--migrate {command_line_form(migration)} is for step "
                            f"{migration.step}, before step {start_step} where "
                            "this run resumes, and the checkpoint has no record "
                            "of it: not made (give it a later step)",
                        }
                    )
            elif entry["due"] is None:
                self.consumed.add(index)  # made, or queued (below)
            else:
                kept.append((max(entry["due"], start_step), index, migration))
        self.scripted = kept
        if not record:
            return
        self.next_id = record["next_id"]
        same = record["control_dir"] == self.intake.where()
        if same:  # the commands read before, and the proposals held, are behind it
            self.intake.restore(record)
        index_now = {entry["index"]: index for index, entry in entries.items()}
        for entry in record["queued"]:
            request = {
                key: value
                for key, value in entry["request"].items()
                if same or key not in ("seq", "proposal")
            }  # files of another dir
            request["step"] = max(entry["effective"] or request.get("step") or 0, start_step)
            if request["source"] == "scripted":  # its place in this run's list, if any
                request["index"] = index_now.get(request["index"])
            self._queue(request)

    def record(self, step: int) -> dict[str, Any]:
        """What a checkpoint of ``step`` keeps for a resumed run: every scripted migration
        (by its index among them sorted by step) with the step it is due at, or None when
        it is made or queued; every request queued and not in effect at ``step``, in
        order, with the step it was decided for (None: not decided yet); the control
        directory, its last command read, the proposals held and the next numbers."""
        entries: dict[int, int | None] = dict.fromkeys(self.consumed)
        queued = []
        for request in self.queued:
            effective = request.get("effective")
            if request["source"] == "scripted" and request["index"] is not None:
                entries[request["index"]] = None
            if not request.get("rejected") and (effective is None or effective > step):
                queued.append(
                    {
                        "request": {
                            k: v for k, v in request.items() if k not in ("effective", "rejected")
                        },
                        "effective": effective,
                    }
                )
        for scheduled, index, _ in self.scripted:
            entries[index] = scheduled
        scripted = []
        for index, due in sorted(entries.items()):
            step, moves = recorded_form(self.migrations[index])
            scripted.append({"index": index, "step": step, "moves": moves, "due": due})
        return {
            "scripted": scripted,
            "queued": queued,
            "next_id": self.next_id,
            **self.intake.state(),
        }

    def _queue(self, request: Request) -> None:
        self.requests.append(request)
        self.queued.append(request)

    def decide(self, step: int, plan: Plan) -> list[dict[str, Any]]:
        """The migrations scheduled at ``step`` on ``plan`` (each effective at a later step,
        module docstring)."""
        while self.scripted and self.scripted[0][0] - self.lead <= step:
            due, index, scripted = self.scripted.pop(0)
            if (
                index in self.unrecorded
                and scripted.step == self.first_step
                and already_made(plan, scripted.moves)
            ):
                self.consumed.add(index)
                continue  # made before the checkpoint this run resumed from
            self._queue(
                {
                    "moves": recorded_form(scripted)[1],
                    "step": due,
                    "source": "scripted",
                    "index": index,
                }
            )
        self.intake.read()
        if self.settings.every > 0:
            self.online.step(step, plan, self.last_effective, busy=bool(self.requests))
        lead = 0 if step == self.first_step else self.lead  # flushed: nothing to send ahead
        decisions = []
        while self.requests:
            effective = max(
                step + lead, self.last_effective + self.lead, self.requests[0].get("step") or 0
            )
            effective = self._before_cut(step, effective)
            if effective >= self.config.steps or effective <= self.last_effective:
                break  # (the cut before it takes a migration already: decide after it)
            decision = self._schedule(self.requests.pop(0), plan, effective)
            if decision is not None:
                decisions.append(decision)
                plan = with_stages(plan, decision["stages"], decision["policies"])
        return decisions

    def _before_cut(self, step: int, effective: int) -> int:
        """Under pipedream, a checkpoint cut between now and then becomes the switch."""
        cuts = [
            first
            for first, _ in segments(
                self.config.plan, 0, self.config.steps, self.config.checkpoint_every
            )
        ]
        inside = [cut for cut in cuts if step < cut < effective]
        return inside[0] if inside and self.config.plan.schedule == "pipedream" else effective

    def _schedule(self, request: Request, plan: Plan, effective: int) -> dict[str, Any] | None:
        migration_id = self.next_id
        try:
            target = self._target(request, plan)
            moves = moved_layers(plan, target)
        except (EngineError, ValueError) as exc:
            self.intake.answer(request, {"accepted": False, "reason": str(exc)})
            self.sink(
                {
                    "type": "migration",
                    "phase": "rejected",
                    "reason": str(exc),
                    "source": request["source"],
                }
            )
            request["rejected"] = True
            return None
        self.next_id += 1
        self.last_effective = request["effective"] = effective
        self.intake.answer(
            request,
            {"accepted": True, "reason": "scheduled", "migration": migration_id, "step": effective},
        )
        self.sink(
            {
                "type": "migration",
                "phase": "scheduled",
                "id": migration_id,
                "step": effective,
                "source": request["source"],
                "moves": [{"layer": n, "from_stage": a, "to_stage": b} for n, a, b in moves],
                "proposal": request.get("proposal"),
            }
        )
        return {
            "id": migration_id,
            "step": effective,
            "stages": [stage.layers for stage in target.stages],
            "policies": dict(target.policies),
        }

    def _target(self, request: Request, plan: Plan) -> Plan:
        """The plan ``request`` asks for, from ``plan``, checked against the model."""
        check_replicas(plan)
        if "moves" in request:
            target = new_plan(plan, [tuple(m) for m in request["moves"]], self.spec.layer_names)
        else:
            target = with_stages(plan, request["stages"], request.get("policies"))
        EngineLayout(target, self.spec.name, self.spec.layer_names, self.spec.graph_inputs())
        return target
