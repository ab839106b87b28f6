"""The job's repartition control: one coordinator decides, every rank follows its verdicts.

Ranks run ahead of and behind one another, so they must agree on the micro-batch at which a
migration switches without waiting for each other. Rank 0 is the coordinator (vPipe's
global planner, Zhao et al. TPDS'22 §4): when it first touches an op of step ``k`` it
writes the store key ``repartition/verdict/k``, the migrations it schedules then (often
none), each effective at a step ``>= k + lead`` (``>= k`` at the run's first step, below).
Every other rank reads that key when it first touches step ``k`` (a blocking ``get`` with
the job's timeout), which is before it can post a receive for, or run, any micro-batch of
the migration. The lead is 1 step for ``gpipe``/``1f1b``, so that each rank builds its new
partition, posts its receives and sends its hand-off (``live.py``) during the step before,
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
the control directory (``commands.py``), and the online planner's proposals. Every
``every`` steps each rank publishes its window of measurements (``observe.py``); once
every rank's window is in, the coordinator builds the observed profile and runs
``pipestudio.planner.replan.online.evaluate_replan`` in a thread, so training does not wait for
it. A worthwhile proposal is applied (``auto``) or held for approval; each evaluation is
a ``proposal`` event, and each scheduled migration a ``migration`` event (phase
``scheduled``; each rank adds phase ``done`` with its bytes and waits, ``live.py``).
"""

import json
import math
import os
import threading
from pathlib import Path
from typing import Any

from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.documents import load_document
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.proposal import Proposal
from pipestudio.planner.replan.online import evaluate_replan
from pipestudio.runtime.engine.checkpoint import read_latest
from pipestudio.runtime.engine.commands import pending_commands, write_json
from pipestudio.runtime.engine.config import EngineConfig
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.meter import LayerMeter
from pipestudio.runtime.engine.metrics import EventSink, Recorder
from pipestudio.runtime.engine.observe import observed_profile, window_report
from pipestudio.runtime.engine.ops import segments
from pipestudio.runtime.engine.repartition import (
    RepartitionConfig,
    ScriptedMigration,
    check_replicas,
    moved_layers,
    new_plan,
    with_stages,
)
from pipestudio.runtime.models import ModelSpec

_PREFIX = "repartition"


def lead_steps(plan: Plan) -> int:
    if plan.schedule != "pipedream":
        return 1
    return 1 + math.ceil((plan.warmup_forwards(0) + 1) / plan.num_microbatches)


class ControlClient:
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
        assert config.repartition is not None
        self.settings: RepartitionConfig = config.repartition
        self.rank, self.world_size, self.store = rank, world_size, store
        self.measures = self.settings.every > 0
        self.coordinator = Coordinator(config, spec, store, sink) if rank == 0 else None

    def start(self, start_step: int) -> None:
        if self.coordinator is not None:
            self.coordinator.start(start_step)

    def verdict(self, step: int, plan: Plan) -> list[dict[str, Any]]:
        key = f"{_PREFIX}/verdict/{step}"
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
        every = self.settings.every
        if meter is None or every <= 0 or (step + 1) % every:
            return
        report = window_report(recorder, meter, step + 1 - every, step)
        self.store.set(f"{_PREFIX}/measure/{step}/{self.rank}", json.dumps(report))


class Coordinator:
    """Rank 0's decisions (module docstring)."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, store: Any, sink: EventSink) -> None:
        assert config.repartition is not None
        self.config, self.spec, self.store, self.sink = config, spec, store, sink
        self.settings = config.repartition
        self.lead = lead_steps(config.plan)
        self.world_size = config.plan.num_workers
        self.next_id, self.last_effective = 1, -(10**9)
        self.first_step = 0
        #: the scripted migrations in order of step (a record names them by index), and
        #: (the step it is due, its index, the migration) of those not queued yet
        self.migrations = sorted(self.settings.migrations, key=lambda m: m.step)
        self.scripted = [(m.step, i, m) for i, m in enumerate(self.migrations)]
        self.requests: list[dict[str, Any]] = []  # queued, not decided yet (in order)
        self.queued: list[dict[str, Any]] = []  # every request queued, as decided
        self.consumed: set[int] = set()  # scripted migrations made before this run
        self.unrecorded: set[int] = set()  # the checkpoint resumed from has no word of
        self.held: dict[int, dict[str, Any]] = {}  # id -> stages, policies, proposal
        self.seen_seq, self.next_window = 0, self.settings.every - 1
        self.next_proposal = 1
        self.cluster = (
            load_document(Cluster, self.settings.cluster_path)
            if self.settings.cluster_path
            else None
        )
        self._thread: threading.Thread | None = None
        self._result: tuple[int, Proposal | Exception] | None = None

    def start(self, start_step: int) -> None:
        """The run starts at ``start_step`` (module docstring), on what its checkpoint's
        ``record`` says; without one, the scripted migrations before ``start_step`` are
        taken as made."""
        self.first_step = start_step
        every = self.settings.every
        if every > 0:  # the first window of measurements wholly in this run
            self.next_window = every * (-(-start_step // every) + 1) - 1
        meta = (
            read_latest(self.config.checkpoint_dir)
            if self.config.resume and self.config.checkpoint_dir and start_step
            else None
        )
        record = (meta or {}).get("repartition") or {}
        entries = _match(self.scripted, record.get("scripted", []))
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
                            "reason": f"--migrate {_text(migration)} is for step "
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
        same = record["control_dir"] == self._control_dir()
        if same:  # the commands read before, and the proposals held, are behind it
            self.seen_seq, self.next_proposal = record["seen"], record["next_proposal"]
            self.held = {int(pid): held for pid, held in record["held"].items()}
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
            step, moves = _key(self.migrations[index])
            scripted.append({"index": index, "step": step, "moves": moves, "due": due})
        return {
            "scripted": scripted,
            "queued": queued,
            "next_id": self.next_id,
            "control_dir": self._control_dir(),
            "seen": self.seen_seq,
            "next_proposal": self.next_proposal,
            "held": {str(pid): held for pid, held in self.held.items()},
        }

    def _control_dir(self) -> str | None:
        control_dir = self.settings.control_dir
        return os.path.realpath(control_dir) if control_dir else None

    def _queue(self, request: dict[str, Any]) -> None:
        self.requests.append(request)
        self.queued.append(request)

    def decide(self, step: int, plan: Plan) -> list[dict[str, Any]]:
        while self.scripted and self.scripted[0][0] - self.lead <= step:
            due, index, scripted = self.scripted.pop(0)
            if (
                index in self.unrecorded
                and scripted.step == self.first_step
                and _holds(plan, scripted.moves)
            ):
                self.consumed.add(index)
                continue  # made before the checkpoint this run resumed from
            self._queue(
                {"moves": _key(scripted)[1], "step": due, "source": "scripted", "index": index}
            )
        self._read_commands()
        if self.settings.every > 0:
            self._online(step, plan)
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

    def _schedule(
        self, request: dict[str, Any], plan: Plan, effective: int
    ) -> dict[str, Any] | None:
        migration_id = self.next_id
        try:
            target = self._target(request, plan)
            moves = moved_layers(plan, target)
        except (EngineError, ValueError) as exc:
            self._answer(request, {"accepted": False, "reason": str(exc)})
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
        self._answer(
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

    def _target(self, request: dict[str, Any], plan: Plan) -> Plan:
        check_replicas(plan)
        if "moves" in request:
            target = new_plan(plan, [tuple(m) for m in request["moves"]], self.spec.layer_names)
        else:
            target = with_stages(plan, request["stages"], request.get("policies"))
        EngineLayout(target, self.spec.name, self.spec.layer_names, self.spec.graph_inputs())
        return target

    def _answer(self, request: dict[str, Any], status: dict[str, Any]) -> None:
        if request.get("seq") and self.settings.control_dir:
            write_json(_path(self.settings.control_dir, "status", request["seq"]), status)
        if request.get("proposal") and self.settings.control_dir:
            self._proposal_file(
                request["proposal"],
                "applied" if status["accepted"] else "rejected",
                status.get("step"),
            )

    def _read_commands(self) -> None:
        if not self.settings.control_dir:
            return
        for seq, command in pending_commands(self.settings.control_dir, self.seen_seq):
            self.seen_seq = max(self.seen_seq, seq)
            kind = command.get("command")
            if kind in ("migrate", "propose"):
                request = {**command, "seq": seq, "source": "command"}
                if kind == "migrate":
                    self._queue(request)
                else:
                    self._hold_command(request)
            elif kind in ("approve", "reject") and command.get("proposal") in self.held:
                held = self.held.pop(command["proposal"])
                if kind == "approve":
                    self._queue(
                        {
                            "stages": held["stages"],
                            "policies": held["policies"],
                            "seq": seq,
                            "proposal": command["proposal"],
                            "source": "approved",
                        }
                    )
                else:
                    self._proposal_file(command["proposal"], "rejected", None)
                    write_json(
                        _path(self.settings.control_dir, "status", seq),
                        {"accepted": True, "reason": "rejected"},
                    )
            else:
                write_json(
                    _path(self.settings.control_dir, "status", seq),
                    {"accepted": False, "reason": f"unknown command or proposal: {command}"},
                )

    def _hold_command(self, request: dict[str, Any]) -> None:
        """A repartition posted as a proposal: checked now, held until approved."""
        try:
            target = self._target(request, self.config.plan)
        except (EngineError, ValueError) as exc:
            self._answer({"seq": request["seq"]}, {"accepted": False, "reason": str(exc)})
            return
        self.hold(target, None)
        self._answer(
            {"seq": request["seq"]},
            {"accepted": True, "reason": "held", "proposal": self.next_proposal - 1},
        )

    def hold(self, target: Plan, proposal: Proposal | None) -> int:
        pid = self.next_proposal
        self.next_proposal += 1
        self.held[pid] = {
            "stages": [s.layers for s in target.stages],
            "policies": dict(target.policies),
            "proposal": None if proposal is None else proposal.model_dump(mode="json"),
        }
        self._proposal_file(pid, "held", None)
        return pid

    def _proposal_file(self, pid: int, status: str, step: int | None) -> None:
        if self.settings.control_dir is None:
            return
        path = _path(self.settings.control_dir, "proposals", pid)
        held = self.held.get(pid)
        previous = (
            held["proposal"]
            if held
            else (json.loads(path.read_text()).get("proposal") if path.exists() else None)
        )
        write_json(path, {"id": pid, "status": status, "step": step, "proposal": previous})

    def _online(self, step: int, plan: Plan) -> None:
        """Collect a finished evaluation; start one on the newest complete window."""
        if self._result is not None:
            finished, outcome = self._result
            self._result = None
            self._conclude(finished, outcome, plan)
        if self._thread is not None and self._thread.is_alive():
            return
        every = self.settings.every
        window: int | None = None
        while self.next_window < step:
            keys = [f"{_PREFIX}/measure/{self.next_window}/{r}" for r in range(self.world_size)]
            if not self.store.check(keys):
                break
            window, self.next_window = self.next_window, self.next_window + every
        if window is None or window - every + 1 <= self.last_effective or self.requests:
            return
        reports = [
            json.loads(self.store.get(f"{_PREFIX}/measure/{window}/{r}").decode())
            for r in range(self.world_size)
        ]
        self._thread = threading.Thread(
            target=self._evaluate,
            args=(window, reports, plan),
            name="pipestudio-replan",
            daemon=True,
        )
        self._thread.start()

    def _evaluate(self, window: int, reports: list[dict[str, Any]], plan: Plan) -> None:
        try:
            profile = observed_profile(
                self.spec.name,
                plan.microbatch_size,
                self.spec.layer_names,
                self.spec.edges(),
                reports,
            )
            outcome: Proposal | Exception = evaluate_replan(
                plan,
                profile,
                self.cluster,
                payback_steps=self.settings.payback_steps,
                min_gain_fraction=self.settings.min_gain_fraction,
            )
        except Exception as exc:  # reported as an event; training goes on
            outcome = exc
        self._result = (window, outcome)

    def _conclude(self, window: int, outcome: Proposal | Exception, plan: Plan) -> None:
        event: dict[str, Any] = {"type": "proposal", "window_step": window}
        if isinstance(outcome, Exception):
            self.sink({**event, "error": f"{type(outcome).__name__}: {outcome}"})
            return
        stale = [s.layers for s in outcome.current_stages] != [s.layers for s in plan.stages]
        event.update(
            worthwhile=outcome.worthwhile and not stale,
            reason=outcome.reason,
            step_time_now_ms=outcome.step_time_now_ms,
            step_time_after_ms=outcome.step_time_after_ms,
            gain_ms=outcome.gain_ms,
            gain_fraction=outcome.gain_fraction,
            migration_bytes=outcome.migration_bytes,
            moves=[m.model_dump() for m in outcome.moves],
            candidates=[c.model_dump() for c in outcome.candidates],
        )
        if outcome.worthwhile and not stale:
            pid = self.hold(outcome.new_plan, outcome)
            event.update(id=pid, status="applied" if self.settings.auto else "held")
            if self.settings.auto:
                held = self.held.pop(pid)
                self._queue({**held, "proposal": pid, "source": "auto"})
        self.sink(event)


def _match(
    scripted: list[tuple[int, int, ScriptedMigration]], recorded: list[dict[str, Any]]
) -> dict[int, dict[str, Any]]:
    """Each scripted migration's entry in a checkpoint's record (by index): the entry of
    its index when it records the same step and moves, else the first unclaimed one that
    does (a list that gained moves shifts the indices)."""
    result: dict[int, dict[str, Any]] = {}
    unclaimed = list(recorded)
    keys = {index: _key(migration) for _, index, migration in scripted}
    for by_index in (True, False):
        for index, key in keys.items():
            if index in result:
                continue
            entry = next(
                (
                    e
                    for e in unclaimed
                    if (e["step"], e["moves"]) == key and (e["index"] == index or not by_index)
                ),
                None,
            )
            if entry is not None:
                result[index] = entry
                unclaimed.remove(entry)
    return result


def _text(migration: ScriptedMigration) -> str:
    """As ``--migrate`` writes it."""
    return f"{migration.step}:" + ",".join(f"{layer}@{stage}" for layer, stage in migration.moves)


def _key(migration: ScriptedMigration) -> tuple[int, list[list[Any]]]:
    """A scripted migration as a checkpoint's record writes it."""
    return migration.step, [list(move) for move in migration.moves]


def _holds(plan: Plan, moves: tuple[tuple[str, int], ...]) -> bool:
    """Whether every (layer, stage) of ``moves`` is already so in ``plan``."""
    stage_of = {name: idx for idx, stage in enumerate(plan.stages) for name in stage.layers}
    return all(stage_of.get(layer) == stage for layer, stage in moves)


def _path(control_dir: str, kind: str, number: int) -> Path:
    return Path(control_dir) / kind / f"{number:06d}.json"
