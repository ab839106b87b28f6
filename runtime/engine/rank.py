"""A rank from start to end: join the job, train, gather the timelines, leave.

Each rank builds the whole model from the factory with the run's seed, so every rank
starts from the same weights, and keeps its stage's layers. After training, rank 0
gathers every worker's measured timeline (one ``gather_json`` over gloo, once, so it
costs the run nothing while it trains), publishes the ``summary`` event (with each stage's
layers in the partition the run ended on, after any live repartition) and writes the
Chrome trace. A rank that fails records why in the store for the others (``faults.py``)
and publishes an ``error`` event before it raises: ``root_rank``, the ``message`` and,
when another attempt would fail again, ``retry`` false; the root of such a failure also
names its ``cause`` (``nonfinite_loss``), so that whoever collects the errors reports it
first.
"""

import os
import socket
import sys
from dataclasses import replace
from typing import Any, NoReturn

import torch

from pipestudio.gc_freeze import settle_heap
from pipestudio.planner.simulator.trace import write_chrome_trace
from pipestudio.runtime.engine import checkpoint as ckpt
from pipestudio.runtime.engine.config import EngineConfig, build_model
from pipestudio.runtime.engine.errors import WorkerFailure
from pipestudio.runtime.engine.exchange import gather_json
from pipestudio.runtime.engine.faults import Watchdog
from pipestudio.runtime.engine.interleaved import ChunkedRank
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.rendezvous import StoreAddress, join, leave
from pipestudio.runtime.engine.telemetry.measured import measured_result, summary_event
from pipestudio.runtime.engine.telemetry.metrics import EventSink
from pipestudio.runtime.engine.worker import Worker
from pipestudio.runtime.precision import matmuls


def exit_now(code: int) -> NoReturn:
    """End a rank's process at once, without the interpreter's finalization.

    A rank is done when ``run_rank`` returns: its events are sent, its files written. At
    finalization, C++ static destructors of torch ran while a gloo or store thread was still
    joinable and aborted the process ("terminate called without an active exception",
    SIGABRT, no Python frame on the stack) after training had finished: seen in 2 of
    about 35 local runs with live migrations. ``os._exit`` skips that."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads(ranks_here: int) -> int:
    """Threads of one of ``ranks_here`` ranks that share this host's cores."""
    return max(1, host_cores() // max(ranks_here, 1))


def run_rank(
    config: EngineConfig, rank: int, address: StoreAddress, sink: EventSink, ranks_here: int
) -> dict[str, Any] | None:
    """Train as ``rank``; rank 0 returns the ``summary`` event, the others None."""
    torch.set_num_threads(config.threads_per_rank or default_threads(ranks_here))
    if config.resume and config.checkpoint_dir:
        config = replace(config, plan=ckpt.resume_plan(config.checkpoint_dir, config.plan))
    if config.seed is not None:
        torch.manual_seed(config.seed)
    spec = build_model(config)
    layout = EngineLayout(config.plan, spec.name, spec.layer_names, spec.graph_inputs())
    ctx = join(layout, rank, address, config.device, config.timeout_s)
    watchdog = Watchdog(address, rank, layout.world_size, layout.describe, config.timeout_s)
    stage_idx, replica = layout.worker(rank)
    try:
        worker: Worker | ChunkedRank = (
            ChunkedRank(config, spec, layout, ctx, watchdog, sink)
            if config.plan.interleaved
            else Worker(config, spec, layout, ctx, watchdog, sink)
        )
        start_step = min(_resume(config, each) for each in worker.workers)
        settle_heap()  # and again after the first step (``Worker.run_segment``)
        sink(
            {
                "type": "start",
                "rank": rank,
                "stage": stage_idx,
                "replica": replica,
                "host": socket.gethostname(),
                "device": str(ctx.device),
                "cores": host_cores(),
                "threads": torch.get_num_threads(),
                "world_size": layout.world_size,
                "schedule": config.plan.schedule,
                "start_step": start_step,
                "steps": config.steps,
                "time_ms": ctx.clock.now_ms(),
            }
        )
        with matmuls(config.plan.precision):
            worker.train(start_step)
        summary = _gather(config, worker.workers, list(range(start_step, config.steps)))
        watchdog.finish()
        return summary
    except BaseException as exc:
        if isinstance(exc, WorkerFailure):  # its root is recorded (faults.py, worker.py)
            failure = exc
        else:
            failure = WorkerFailure(
                f"{layout.describe(rank)} failed: {type(exc).__name__}: {exc}", rank
            )
            watchdog.record_failure(rank, str(failure))
        sink(
            {
                "type": "error",
                "rank": rank,
                "stage": stage_idx,
                "replica": replica,
                "root_rank": failure.root_rank,
                "message": str(failure),
                **({} if failure.cause is None else {"cause": failure.cause}),
                **({} if failure.retry else {"retry": False}),
            }
        )
        raise
    finally:
        leave()


def run_rank_reporting(
    config: EngineConfig, rank: int, address: StoreAddress, sink: EventSink, *, ranks_here: int
) -> bool:
    """``run_rank`` in a child process: a failure that the rank did not report itself is
    reported to ``sink`` as an ``error`` event naming the rank. True when the rank ended
    well."""
    reported = False

    def report(event: Any) -> None:
        nonlocal reported
        reported = reported or event["type"] == "error"
        sink(event)

    try:
        run_rank(config, rank, address, report, ranks_here=ranks_here)
    except BaseException as exc:
        if not reported:
            sink(
                {
                    "type": "error",
                    "rank": rank,
                    "root_rank": rank,
                    "message": f"rank {rank} failed: {type(exc).__name__}: {exc}",
                }
            )
        return False
    return True


def _resume(config: EngineConfig, worker: Worker) -> int:
    if not (config.resume and config.checkpoint_dir):
        return 0
    if (
        ckpt.check_compatible(config.checkpoint_dir, config.plan, config.model, config.model_args)
        == 0
    ):
        return 0
    return ckpt.load_rank(
        config.checkpoint_dir,
        worker.stage_idx,
        worker.replica,
        worker.stage.module,
        worker.optimizer,
        worker.ctx.device,
        worker.scaler,
    )


def _report(worker: Worker) -> dict[str, Any]:
    optimizer_bytes = 0
    if worker.optimizer is not None:
        optimizer_bytes = sum(
            t.numel() * t.element_size()
            for state in worker.optimizer.state.values()
            for t in state.values()
            if torch.is_tensor(t) and t.dim() > 0
        )
    return {
        "stage": worker.stage_idx,
        "replica": worker.replica,
        "timeline": worker.recorder.timeline,
        "steps": worker.recorder.steps,
        "memory": worker.recorder.memory,
        "max_weight_versions": worker.max_versions,
        "param_bytes": sum(
            p.numel() * p.element_size() for p in worker.live.latest.runner.params.values()
        ),
        "optimizer_bytes": optimizer_bytes,
    }


def _gather(config: EngineConfig, workers: list[Worker], steps: list[int]) -> dict[str, Any] | None:
    """The summary at rank 0 from every stage worker's report (several per rank when it
    holds chunks); None elsewhere."""
    worker = workers[0]
    worker.watchdog.doing("gathering the timelines at rank 0")
    try:
        gathered = gather_json([_report(each) for each in workers], dst=0)
    except Exception as exc:
        raise worker.watchdog.failure("gathering the timelines", None, exc) from exc
    if gathered is None:
        return None
    reports = [report for rank_reports in gathered for report in rank_reports]
    plan = worker.live.latest.plan  # the partition the run ended on
    summary = summary_event(plan, reports, steps)
    for stage in summary["stages"]:
        stage["layers"] = list(plan.stages[stage["index"]].layers)
    worker.recorder.sink(summary)
    if config.trace_path and steps:
        write_chrome_trace(measured_result(plan, reports, steps), config.trace_path)
    return summary
