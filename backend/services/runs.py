"""Runs: launching an approved plan on registered workers, stopping, and reading back.

Ranks go stage by stage (stage 0's replicas first, as the engine numbers them) to the
chosen online workers, each taking as many as it has free slots, in registration order.
A run that checkpoints keeps them in ``<checkpoint_dir>/run-<id>``; one that asked to
resume and failed waits in ``resuming`` (``messages.begin_resume``) until ``relaunch``
finds enough free slots on connected workers (any of them: the ones it ran on may be
gone) and starts its next attempt from the last checkpoint, or fails it after
``wait_s``.
"""

import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from pipestudio.allowlist import model_allowed
from pipestudio.backend import models
from pipestudio.backend.errors import ConflictError, InputError
from pipestudio.backend.repositories import Events, Metrics, Plans, Profiles, Runs, Workers
from pipestudio.backend.schemas.runs import RunCreate, RunPublic
from pipestudio.backend.services import messages
from pipestudio.backend.services.plans import plan_for_launch
from pipestudio.builtin_models import builtin_layer_names
from pipestudio.planner import Plan

Send = Callable[[str, dict[str, Any]], bool]


def run_public(session: Session, run: models.Run) -> RunPublic:
    ranks = Runs(session).ranks(run.id)
    return RunPublic.model_validate(
        {
            **{c: getattr(run, c) for c in RunPublic.model_fields if c != "ranks"},
            "ranks": [r.__dict__ for r in ranks],
        }
    )


def _names(workers: list[models.Worker]) -> str:
    return ", ".join(f"{w.name} ({w.id})" for w in workers)


def _allowing(online: list[models.Worker], model: str, chosen: bool) -> list[models.Worker]:
    """The workers of ``online`` that run ``model`` (``allowlist.py``); a conflict when
    the caller ``chosen`` them and one refuses, or when none runs it."""
    refusing = [w for w in online if not model_allowed(model, w.builtin_models, w.allowed_models)]
    if refusing and (chosen or len(refusing) == len(online)):
        raise ConflictError(
            f"model {model!r} is not allowed on worker(s) {_names(refusing)}: a worker runs "
            "its built-in models and the factories its own --allow-model patterns "
            "(PIPESTUDIO_ALLOWED_MODELS) match"
        )
    return [w for w in online if w not in refusing]


def _assign(
    session: Session, plan: Plan, model: str, worker_ids: list[str] | None, connected: set[str]
) -> list[tuple[int, str, int, int]]:
    """(rank, worker_id, stage, replica) for every rank of the plan, on online workers
    (those of ``worker_ids`` when given) that allow ``model``."""
    online = [w for w in Workers(session).online() if w.id in connected]
    if worker_ids is not None:
        unknown = sorted(set(worker_ids) - {w.id for w in online})
        if unknown:
            raise ConflictError(f"worker_ids: worker(s) {', '.join(unknown)} are not online")
        online = [w for w in online if w.id in worker_ids]
    allowing = _allowing(online, model, chosen=worker_ids is not None) if online else []
    busy = Runs(session).busy_ranks_by_worker()
    free = [(w.id, w.slots - busy.get(w.id, 0)) for w in allowing]
    slots = [worker_id for worker_id, count in free for _ in range(max(count, 0))]
    workers = (
        # interleaved: rank d runs chunks d, d + p, ...; its row names the first
        [(rank, 0) for rank in range(plan.num_workers)]
        if plan.interleaved
        else [
            (stage_idx, replica)
            for stage_idx, stage in enumerate(plan.stages)
            for replica in range(stage.replicas)
        ]
    )
    if len(slots) < len(workers):
        refusing = [w for w in online if w not in allowing]
        raise ConflictError(
            f"the plan needs {len(workers)} ranks but the {len(allowing)} online worker(s) "
            f"that allow model {model!r} have {len(slots)} free slot(s)"
            + (f"; {_names(refusing)} do not allow it" if refusing else "")
        )
    return [
        (rank, slots[rank], stage_idx, replica) for rank, (stage_idx, replica) in enumerate(workers)
    ]


#: What a run keeps of its request, besides its columns, to start (and restart) it.
_SETTINGS = {
    "lr",
    "seed",
    "device",
    "threads_per_rank",
    "timeout_s",
    "checkpoint_every",
    "on_failure",
    "max_resumes",
    "on_nonfinite_loss",
}
#: What the engine takes from the settings (``runtime/agent/ranks.py``).
_ENGINE_SETTINGS = (
    "lr",
    "seed",
    "device",
    "threads_per_rank",
    "timeout_s",
    "checkpoint_every",
    "checkpoint_dir",
    "on_nonfinite_loss",
)


def launch(
    session: Session,
    data: RunCreate,
    connected: set[str],
    send: Send,
    checkpoint_root: str | None = None,
) -> models.Run:
    """Store the run and its ranks, commit, then send each worker its assignment."""
    if checkpoint_root is None:
        for field, asked in (
            ("checkpoint_every", data.checkpoint_every > 0),
            ("on_failure", data.on_failure == "resume"),
        ):
            if asked:
                raise ConflictError(
                    f"{field}={getattr(data, field)!r} needs the backend's "
                    "checkpoint directory, and this server has none "
                    "(PIPESTUDIO_CHECKPOINT_DIR)"
                )
    plan_row, plan = plan_for_launch(session, data.plan_id)
    builtin = {
        name
        for worker in Workers(session).online()
        for name in worker.builtin_models or []
        if isinstance(name, str)
    }
    profile = Profiles(session).get(plan_row.profile_id)
    model, model_args, differing = planned_model(profile, data, builtin)
    check_layers(profile, plan, model, model_args, "model" if data.model else "model_args")
    assignment = _assign(session, plan, model, data.worker_ids, connected)
    run = Runs(session).add(
        models.Run(
            plan_id=plan_row.id,
            state="starting",
            model=model,
            model_args=model_args,
            precision=plan.precision,
            steps=data.steps,
            settings=data.model_dump(include=_SETTINGS),
            created_by=data.author,
        )
    )
    if checkpoint_root is not None:
        run.settings = {
            **run.settings,
            "checkpoint_dir": os.path.join(checkpoint_root, f"run-{run.id}"),
        }
    plan_row.state = "launched"
    session.add(
        models.Event(
            run_id=run.id,
            kind="launch",
            data={
                "plan_id": plan_row.id,
                "ranks": [list(a) for a in assignment],
                **({"differs_from_profile": differing} if differing else {}),
            },
            message=f"launched plan {plan_row.id} on {len(assignment)} ranks"
            + (
                f"; model_args {', '.join(differing)}: the plan's predictions are for the "
                "profiled model"
                if differing
                else ""
            ),
        )
    )
    _start_attempt(session, run, plan, assignment, send)
    return run


def planned_model(
    profile: models.Profile, data: RunCreate, builtin: set[str]
) -> tuple[str, dict[str, str], list[str]]:
    """The model and arguments a run builds: the request's, else the plan's profile's (its
    ``model`` and ``config.*`` metadata, which the profiler records), and the arguments
    given to the profile's model that the profile recorded with another value (a smaller
    model to try the plan on is fine, but its predictions are not the run's: the launch
    event says so; whether the model still has the plan's layers only a build can tell,
    which the workers do before they train). 422 when no model is given for a profile
    whose model is none of the online workers' ``builtin`` ones."""
    document = profile.document if isinstance(profile.document, dict) else {}
    found = document.get("metadata")
    metadata: dict[str, Any] = found if isinstance(found, dict) else {}
    recorded = {
        key.removeprefix("config."): value
        for key, value in metadata.items()
        if key.startswith("config.")
    }
    model = data.model or profile.model
    if data.model is None and model not in builtin:
        raise InputError(
            "model",
            f"the plan's profile {profile.id} measured model {model!r}, "
            "which is not a built-in model; name the factory that builds it "
            "(MODULE:FACTORY)",
        )
    if model != profile.model:
        return model, dict(data.model_args or {}), []
    if data.model_args is None:
        return model, {key: _text(value) for key, value in recorded.items()}, []
    differing = [
        f"{key}={value} (the profile's {key}={_text(recorded[key])})"
        for key, value in sorted(data.model_args.items())
        if key in recorded and not _same(value, recorded[key])
    ]
    return model, dict(data.model_args), differing


def check_layers(
    profile: models.Profile, plan: Plan, model: str, model_args: dict[str, str], field: str
) -> None:
    """422 (on ``field``) when built-in ``model`` with ``model_args`` does not have exactly
    the plan's layers, naming those it lacks and those no stage holds: a worker would
    refuse the plan when it builds the model (``builtin_models.py`` knows a built-in model's
    layers without building it). Other models, and plans of operator-level profiles, are
    left to the workers' own check."""
    metadata = profile.document.get("metadata") if isinstance(profile.document, dict) else None
    if isinstance(metadata, dict) and metadata.get("granularity") == "op":
        return
    try:
        names = builtin_layer_names(model, model_args)
    except ValueError as exc:
        raise InputError(field, f"model {model!r}: {exc}") from None
    if names is None:
        return
    placed = [layer for stage in plan.stages for layer in stage.layers]
    has, holds = set(names), set(placed)
    missing = [layer for layer in placed if layer not in has]
    unplaced = [layer for layer in names if layer not in holds]
    if missing or unplaced:
        given = ", ".join(f"{k}={v}" for k, v in sorted(model_args.items())) or "its defaults"
        problems = (
            [f"the plan places layer(s) {_some(missing)}, which it does not have"]
            if missing
            else []
        ) + ([f"its layer(s) {_some(unplaced)} are in no stage of the plan"] if unplaced else [])
        raise InputError(
            field, f"model {model!r} with {given} does not build this plan: " + "; ".join(problems)
        )


def _some(names: list[str], shown: int = 8) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _same(given: str, recorded: object) -> bool:
    """Whether an argument given as text is the value the profile recorded."""
    if given == _text(recorded):
        return True
    if isinstance(recorded, bool) or not isinstance(recorded, int | float):
        return False
    try:
        return float(given) == float(recorded)
    except ValueError:
        return False


def relaunch(
    session: Session,
    run: models.Run,
    connected: set[str],
    send: Send,
    waited_s: float,
    wait_s: float,
) -> messages.Actions | None:
    """Start the next attempt of a ``resuming`` run if enough slots are free; after
    ``wait_s`` without them, fail it. None while it keeps waiting, else what the
    dashboards are to be told."""
    plan = Plan.model_validate(Plans(session).get(run.plan_id).document)
    try:
        assignment = _assign(session, plan, run.model, None, connected)
    except ConflictError as exc:
        if waited_s < wait_s:
            return None
        return fail(
            session,
            run,
            f"attempt {run.attempt} could not start within {wait_s:.0f} s: {exc}",
            send,
            resume=False,
        )
    run.state = "starting"
    session.add(
        models.Event(
            run_id=run.id,
            kind="resume",
            data={"attempt": run.attempt, "ranks": [list(a) for a in assignment]},
            message=f"attempt {run.attempt} on {len(assignment)} ranks, from the last checkpoint",
        )
    )
    _start_attempt(session, run, plan, assignment, send)
    return messages.Actions(
        to_watchers=[(run.id, messages.run_message(run, Runs(session).ranks(run.id)))]
    )


def _start_attempt(
    session: Session,
    run: models.Run,
    plan: Plan,
    assignment: list[tuple[int, str, int, int]],
    send: Send,
) -> None:
    """Store the attempt's ranks, commit, then send each worker its assignment."""
    session.add_all(
        models.RunRank(
            run_id=run.id,
            rank=rank,
            worker_id=worker_id,
            stage=stage,
            replica=replica,
            state="assigned",
        )
        for rank, worker_id, stage, replica in assignment
    )
    session.commit()
    config = {
        "plan": plan.model_dump(mode="json"),
        "model": run.model,
        "model_args": run.model_args,
        "steps": run.steps,
        **{key: run.settings[key] for key in _ENGINE_SETTINGS if key in run.settings},
        "resume": run.attempt > 0,
    }
    hosts = {
        worker_id: session.get(models.Worker, worker_id).host  # type: ignore[union-attr]
        for worker_id in dict.fromkeys(a[1] for a in assignment)
    }
    for worker_id, host in hosts.items():
        ranks = [
            {"rank": r, "stage": s, "replica": p} for r, w, s, p in assignment if w == worker_id
        ]
        # ranks of this run on the worker's host, whichever worker runs them: they share
        # its cores, so each rank takes cores / host_ranks threads (``engine/rank.py``)
        host_ranks = sum(1 for a in assignment if hosts[a[1]] == host)
        message = {
            "type": "assign",
            "run_id": run.id,
            "attempt": run.attempt,
            "world_size": len(assignment),
            "ranks": ranks,
            "config": config,
            "open_store": ranks[0]["rank"] == 0,
            "host_ranks": host_ranks,
        }
        if not send(worker_id, message):
            fail(session, run, f"worker {worker_id} could not be reached", send)
            break


def fail(
    session: Session, run: models.Run, reason: str, send: Send, *, resume: bool = True
) -> messages.Actions:
    """Fail the run (or, with ``resume``, start resuming it: ``messages.end_run``); what
    the dashboards are to be told."""
    actions = messages.end_run(session, run, "failed", reason, resume=resume)
    session.commit()
    for worker_id, message in actions.to_workers:
        send(worker_id, message)
    return messages.Actions(to_watchers=actions.to_watchers)


def stop(session: Session, run_id: int, send: Send) -> tuple[models.Run, messages.Actions]:
    run = Runs(session).get(run_id, for_update=True)
    if run.state in messages.TERMINAL_RUN_STATES:
        raise ConflictError(f"run {run_id} is already {run.state}")
    actions = messages.end_run(session, run, "stopped", "stopped on request")
    session.commit()
    for worker_id, message in actions.to_workers:
        send(worker_id, message)
    return run, actions


def command(run: models.Run, name: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "command",
        "command_id": uuid.uuid4().hex,
        "run_id": run.id,
        "command": name,
        "payload": payload,
    }


def metrics(
    session: Session,
    run_id: int,
    kinds: Sequence[str],
    stage: int | None,
    start_ms: float | None,
    end_ms: float | None,
    max_points: int,
) -> tuple[list[models.Metric], int, int]:
    Runs(session).get(run_id)
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise InputError("query.end_ms", f"end_ms {end_ms} is before start_ms {start_ms}")
    return Metrics(session).query(run_id, kinds, stage, start_ms, end_ms, max_points)


def events(
    session: Session, run_id: int, kinds: list[str] | None, after_id: int, limit: int
) -> list[models.Event]:
    Runs(session).get(run_id)
    return Events(session).query(run_id, kinds, after_id, limit)
