"""Starting a job: one process per stage replica on this machine, or one rank under torchrun.

``launch`` binds a ``TCPStore`` on port 0 (the OS picks a free port, so two jobs never
collide), starts ``world_size`` processes (rank order: stage 0's replicas, then stage 1's,
...) and hands each the store's address. Each child streams its events back over its own
pipe (no lock shared between children, so a child killed mid-write harms only its own
stream); the launcher writes them to the JSON-lines file and passes them to the caller's
sink. It waits for every child. When one fails, the others are given ``grace_s`` to end
by themselves (they do, within the timeout, each naming the rank at the root), and the
launcher then terminates the rest; the result names the first rank that failed and carries
every rank's error. The first rank is the first whose error names a ``cause`` (a
non-finite loss), else the first seen to exit with an error: when one rank fails on
purpose, the others end within moments, too close for the order of exits to tell.

Children start by ``spawn`` (the default) or ``forkserver``, never by a plain ``fork``: the
store's server thread, and any thread of the caller, runs while the launcher forks, and a
child forked while another thread holds a lock (the store client's, the allocator's)
blocks forever on it. ``forkserver`` forks from a single-threaded server that has imported
torch, its compiler front end and the engine once (``FORKSERVER_PRELOAD``), so a child
starts in a fraction of a second and safely.

``train_from_env`` is the torchrun path: the process is one rank and uses RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; each rank appends its events to
the JSON-lines file itself.
"""

import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, Literal, cast, get_args

import torch.distributed as dist

from pipestudio.planner.formats.plan import Plan
from pipestudio.runtime.engine.config import EngineConfig, build_model
from pipestudio.runtime.engine.errors import EngineError, WorkerFailure
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.rank import exit_now, run_rank, run_rank_reporting
from pipestudio.runtime.engine.rendezvous import StoreAddress, address_from_env
from pipestudio.runtime.engine.telemetry.metrics import Event, EventSink, JsonlSink

#: How the launcher may start its children (see the module docstring).
StartMethod = Literal["spawn", "forkserver"]
START_METHODS: tuple[StartMethod, ...] = get_args(StartMethod)

#: What the fork server imports once for every child. An optimizer's first parameter group
#: imports ``torch._dynamo`` (its ``add_param_group`` is wrapped to keep the compiler out):
#: about 800 modules and 1 s of CPU, which each rank would otherwise pay again before its
#: first step. Importing it makes no torch.cuda call, so a child may still use CUDA.
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "pipestudio.runtime.engine"]


@dataclass
class TrainResult:
    """How a job ended: ``summary`` from rank 0 when it succeeded, else the errors;
    ``retry`` false when a rank said that another attempt would fail the same way."""

    ok: bool
    summary: dict[str, Any] | None = None
    errors: dict[int, str] = field(default_factory=dict)
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    first_failed_rank: int | None = None
    retry: bool = True

    @property
    def message(self) -> str:
        if self.ok:
            return "ok"
        first = self.first_failed_rank
        lines = [self.errors.get(first, "") if first is not None else "the job failed"]
        lines += [text for rank, text in sorted(self.errors.items()) if rank != first]
        return "\n".join(line for line in lines if line)


def check_config(config: EngineConfig) -> EngineLayout:
    """Raise ``EngineError`` for a bad setting, model or plan before any process starts."""
    config.check()
    spec = build_model(config)
    return EngineLayout(config.plan, spec.name, spec.layer_names, spec.graph_inputs())


def _child(
    config: EngineConfig, rank: int, address: StoreAddress, conn: Connection, world_size: int
) -> None:
    ended_well = run_rank_reporting(
        config, rank, address, lambda event: conn.send(("event", event)), ranks_here=world_size
    )
    conn.close()
    exit_now(0 if ended_well else 1)


def launch(
    config: EngineConfig,
    sink: EventSink | None = None,
    *,
    start_method: StartMethod = "spawn",
    grace_s: float | None = None,
) -> TrainResult:
    """Run the job on this machine (see the module docstring)."""
    if start_method not in START_METHODS:
        raise EngineError(
            f"start method {start_method!r} is not one of {START_METHODS}: a "
            "plain fork can deadlock a child (see the launcher's docstring)"
        )
    layout = check_config(config)
    world = layout.world_size
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world,
        True,
        wait_for_workers=False,
        timeout=timedelta(seconds=config.timeout_s),
    )
    address = StoreAddress("127.0.0.1", store.port)
    context: Any = mp.get_context(start_method)  # one of START_METHODS: it has Process
    if start_method == "forkserver":
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
    sinks = _sinks(config.metrics_path, sink, config.plan)
    readers: dict[Connection, int] = {}
    processes = []
    for rank in range(world):
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(
            target=_child,
            name=f"pipestudio-rank{rank}",
            args=(config, rank, address, writer, world),
        )
        process.start()
        writer.close()
        readers[reader] = rank
        processes.append(process)
    try:
        return _supervise(
            processes, readers, sinks, config.timeout_s + 15.0 if grace_s is None else grace_s
        )
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()
        for target in sinks:
            if isinstance(target, JsonlSink):
                target.close()


def _sinks(
    metrics_path: str | None, sink: EventSink | None, plan: Plan | None = None
) -> list[EventSink]:
    """The event sinks; a metrics file starts with ``plan`` when given (one writer does),
    so ``pipestudio calibrate`` needs no ``--plan``."""
    sinks: list[EventSink] = []
    if metrics_path:
        metrics = JsonlSink(metrics_path)
        if plan is not None:
            metrics({"type": "plan", "plan": json.loads(plan.to_json())})
        sinks.append(metrics)
    if sink is not None:
        sinks.append(sink)
    return sinks


def _supervise(
    processes: list[Any], readers: dict[Connection, int], sinks: list[EventSink], grace_s: float
) -> TrainResult:
    result = TrainResult(ok=False)
    failed_at: float | None = None
    cause_rank: int | None = None  # the first rank whose error names a cause
    while readers or any(p.exitcode is None for p in processes):
        for conn in cast(list[Connection], wait(list(readers), timeout=0.2)):
            try:
                _, event = conn.recv()
            except (EOFError, OSError):
                del readers[conn]
                continue
            if event["type"] == "summary":
                result.summary = event
            if event["type"] == "error":
                result.errors[event["rank"]] = event["message"]
                if event.get("cause") is not None and cause_rank is None:
                    cause_rank = event["rank"]
                result.retry = result.retry and event.get("retry") is not False
            for target in sinks:
                target(event)
        for rank, process in enumerate(processes):
            if process.exitcode not in (None, 0) and rank not in result.exit_codes:
                result.exit_codes[rank] = process.exitcode
                if result.first_failed_rank is None:
                    result.first_failed_rank, failed_at = rank, time.monotonic()
        if not readers and failed_at is None and all(p.exitcode is not None for p in processes):
            break
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            for process in processes:
                if process.exitcode is None:
                    process.terminate()
            failed_at = float("inf")
    for rank, process in enumerate(processes):
        process.join()
        result.exit_codes[rank] = process.exitcode
        if process.exitcode != 0 and rank not in result.errors:
            result.errors[rank] = (
                f"rank {rank} exited with status {process.exitcode} without reporting an error"
            )
    result.ok = all(code == 0 for code in result.exit_codes.values())
    if cause_rank is not None:
        result.first_failed_rank = cause_rank
    return result


def train_from_env(config: EngineConfig, sink: EventSink | None = None) -> TrainResult:
    """Run as the rank torchrun's environment names (see the module docstring)."""
    layout = check_config(config)
    rank, world = int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "0"))
    if world != layout.world_size:
        raise EngineError(
            f"WORLD_SIZE is {world} but the plan has {layout.world_size} "
            "stage replicas; start one process per replica"
        )
    sinks = _sinks(config.metrics_path, sink, config.plan if rank == 0 else None)

    def fanout(event: Event) -> None:
        for target in sinks:
            target(event)

    try:
        summary = run_rank(
            config,
            rank,
            address_from_env(),
            fanout,
            ranks_here=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )
    except Exception as exc:
        return TrainResult(
            ok=False,
            errors={rank: str(exc)},
            first_failed_rank=rank,
            retry=not isinstance(exc, WorkerFailure) or exc.retry,
        )
    return TrainResult(ok=True, summary=summary)
