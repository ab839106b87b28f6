"""Simulator fidelity: the engine's measured step time against ``pipestudio simulate``'s.

For each model (``gpt``, ``resnet``) and stage count (2, 4) this

1. profiles the model with the engine's own profiler (``pipestudio.runtime.profiler``) at
   the threads each rank will have (``cores // stages``, at least 1), just before the run,
   so that both see the machine in the same state. With ``--profile-together`` (the
   default) it runs one profiler process per stage at once and takes each layer's median
   over them: the ranks of a run compute at the same time on cores that share caches and
   memory bandwidth, and on a 16-core machine a layer profiled alone ran 1.3 to 1.6 times
   faster than two profiled at once (``--no-profile-together`` profiles in one process);
2. describes this machine as a cluster: one device per core, every pair linked at the gloo
   bandwidth measured here (two processes ping-pong a tensor as large as the model's
   median layer output over gloo; one-way bytes over one-way time), unlimited memory;
3. plans with ``balance-time`` (``--algorithm``) and predicts the step time with
   ``pipestudio.planner.simulator.simulate``, the code ``pipestudio simulate`` runs;
4. trains the plan with the engine, warming up for ``--warm-seconds`` (at least
   ``--warm-steps``) and timing at least ``--half-seconds`` per half (at least ``--steps`` steps in
   all) at the predicted pace, and takes the mean of the timed steps' times
   (``summary.step_times_ms``, cut as the simulator cuts steps), and prints measured,
   predicted and the relative error (target: within 15%), with the stages' compute measured
   in the run over the compute the profile predicts (``busy_ms``): a ratio far from 1 says
   the error comes from compute that ran slower or faster than profiled (cores shared with
   other ranks or other work), not from the schedule or the links.

With more stages than cores (4 stages on 2 cores), ranks share cores: each gets 1 thread,
the profile is measured with 1 thread, and the prediction is made twice: on a cluster with
a device per stage (``own``, what the plan asks for) and on the machine as it is, the
stages placed round-robin on the cores (``shared``: the simulator runs the compute of
stages on one device one op at a time, which is what time-sharing a core amounts to).
Every run's profile, cluster, plan and prediction are written to ``--out`` so that
``pipestudio simulate PROFILE PLAN --cluster CLUSTER`` reproduces each prediction.

Calibration (``pipestudio.planner.simulator.calibrate``, as ``pipestudio calibrate`` runs it): the
run's op events of the first half of its timed steps make a calibrated profile and
cluster, and the second half's mean step is compared with the prediction before and after
(``error_before``, ``error_after``: measured / predicted - 1). The op times hold whatever
sharing of cores slowed them, so the calibrated prediction uses a device per stage, as the
backend's does; with more ranks than cores, calibration also counts the waits for a core
between ops (``core_wait``, printed). The events are written to ``--out`` as ops.jsonl,
for ``pipestudio calibrate``.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from runtime_vs_torch import wait_for_quiet

from pipestudio.planner import Cluster, Plan, Profile, cluster_template, simulate
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.request import PlanRequest
from pipestudio.planner.simulator.calibrate import Sharing, calibrate
from pipestudio.planner.simulator.placement import Host, shared_placement
from pipestudio.runtime.engine import EngineConfig, launch
from pipestudio.runtime.models import load_model
from pipestudio.runtime.profiler import median_profile, profile_model

#: (model arguments, micro-batch size): 8 layers each, so that 4 stages have 2 layers each.
MODELS: dict[str, tuple[dict[str, str], int]] = {
    "gpt": ({"layers": "6", "width": "256", "heads": "4", "seq_len": "64", "vocab": "1024"}, 4),
    "resnet": ({"blocks": "6", "width": "16", "image_size": "32"}, 16),
    "mlp": ({"layers": "7", "width": "512", "in_features": "512", "out_features": "512"}, 32),
}
TIMEOUT_S = 120.0
TARGET = 0.15  # uncalibrated
CALIBRATED_TARGET = 0.10
MAX_STEPS = 400


def _pingpong_rank(rank: int, port: int, num_bytes: int, repeats: int, conn: Any) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=TIMEOUT_S))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S)
    )
    buffer = torch.zeros(max(1, num_bytes // 4))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        if rank == 0:
            dist.send(buffer, 1)
            dist.recv(buffer, 1)
        else:
            dist.recv(buffer, 0)
            dist.send(buffer, 0)
        times.append(time.perf_counter() - start)
    conn.send(times)
    dist.destroy_process_group()


def measure_gloo_gbps(num_bytes: int, repeats: int = 30) -> float:
    """Gbit/s of one gloo transfer of ``num_bytes`` between two processes here (median)."""
    store = dist.TCPStore(
        "127.0.0.1", 0, 3, True, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT_S)
    )
    context = mp.get_context("spawn")
    reader, writer = context.Pipe(duplex=False)
    processes = [
        context.Process(
            target=_pingpong_rank, args=(rank, store.port, num_bytes, repeats + 5, writer)
        )
        for rank in range(2)
    ]
    for process in processes:
        process.start()
    times = reader.recv()
    for process in processes:
        process.join(TIMEOUT_S)
    one_way_s = statistics.median(times[5:]) / 2
    return num_bytes * 8 / one_way_s / 1e9


def _profile_rank(
    model: str,
    args: dict[str, str],
    microbatch_size: int,
    threads: int,
    repeats: int,
    conn: Any,
) -> None:
    profile = profile_model(
        load_model(model, args), microbatch_size, "cpu", warmup=3, repeats=repeats, threads=threads
    )
    conn.send(profile.to_json())
    conn.close()


def profile_together(
    model: str,
    microbatch_size: int,
    threads: int,
    repeats: int,
    copies: int,
    args: dict[str, str] | None = None,
) -> Profile:
    """The model (built with ``args``, by default its ``MODELS`` entry's) profiled by
    ``copies`` processes at once; each layer's times are the median over the copies (see
    the module docstring)."""
    args = MODELS[model][0] if args is None else args
    context = mp.get_context("spawn")
    readers, processes = [], []
    for _ in range(copies):
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(
            target=_profile_rank,
            args=(model, args, microbatch_size, threads, repeats, writer),
        )
        process.start()
        writer.close()
        readers.append(reader)
        processes.append(process)
    profiles = [Profile.model_validate_json(reader.recv()) for reader in readers]
    for process in processes:
        process.join(TIMEOUT_S)
    return median_profile(profiles)


def balanced_plan(
    profile: Profile,
    stages: int,
    schedule: str,
    num_microbatches: int,
    cluster: Cluster,
    algorithm: str,
) -> Plan:
    request = PlanRequest(
        profile=profile,
        num_microbatches=num_microbatches,
        schedule=schedule,
        num_stages=stages,
        cluster=cluster,
    )
    return PLANNERS[algorithm](request).plan


def measured_run(
    plan: Plan, model: str, args: dict[str, str], warm_steps: int, num_steps: int, threads: int
) -> tuple[list[float], list[float], list[dict[str, Any]]]:
    """The timed steps' times, each stage's mean compute per timed step (``busy_ms`` of its
    ``step`` events: forwards, backwards, update), and every op event of the run."""
    config = EngineConfig(
        plan=plan,
        model=model,
        model_args=args,
        steps=warm_steps + num_steps,
        threads_per_rank=threads,
        device="cpu",
        timeout_s=TIMEOUT_S,
    )
    busy: dict[int, list[float]] = {}
    ops: list[dict[str, Any]] = []

    def sink(event: dict[str, Any]) -> None:
        if event["type"] == "step" and event["step"] >= warm_steps:
            busy.setdefault(event["stage"], []).append(event["busy_ms"])
        elif event["type"] == "op":
            ops.append(event)

    result = launch(config, sink)
    if not result.ok or result.summary is None:
        raise RuntimeError(f"the engine failed: {result.message}")
    return (
        list(result.summary["step_times_ms"][warm_steps:]),
        [statistics.mean(busy[stage]) for stage in sorted(busy)],
        ops,
    )


def step_counts(options: argparse.Namespace, predicted_ms: float) -> tuple[int, int]:
    """Warm-up and timed steps: at least ``--warm-steps`` and ``--steps``, and enough that
    the warm-up lasts ``--warm-seconds`` and each half of the timed steps ``--half-seconds``
    at the predicted pace (a run of short steps otherwise calibrates on a few steps still
    warming up: a 4-stage mlp's first timed steps on 16 cores took 101, 46 and 32 ms, its
    last 26 to 29). At most ``MAX_STEPS`` timed steps."""
    warm = max(options.warm_steps, math.ceil(options.warm_seconds * 1000 / predicted_ms))
    half = max(options.steps // 2, math.ceil(options.half_seconds * 1000 / predicted_ms))
    return warm, min(2 * half, MAX_STEPS)


def _save(out: Path, name: str, document: Any) -> None:
    (out / f"{name}.json").write_text(
        document.to_json() if hasattr(document, "to_json") else json.dumps(document, indent=1)
    )


def run_case(
    model: str, stages: int, options: argparse.Namespace, bandwidth_gbps: float
) -> list[dict]:
    """Profile, plan, predict and train one case; its rows (``own``, and ``shared``)."""
    cores = os.cpu_count() or 1
    threads = max(1, cores // stages)
    args, microbatch_size = MODELS[model]
    wait_for_quiet(options.quiet_load, options.quiet_wait)
    copies = min(stages, cores) if options.profile_together else 1
    profile = profile_together(model, microbatch_size, threads, options.repeats, copies)
    own = cluster_template([stages], [bandwidth_gbps], name=f"{stages} devices, gloo")
    plan = balanced_plan(
        profile, stages, options.schedule, options.microbatches, own, options.algorithm
    )
    predictions = {"own": (plan, own)}
    sharing = Sharing(
        [Host("this machine", cores, threads)], [[0] * stage.replicas for stage in plan.stages]
    )
    placed = shared_placement(plan, own, sharing.hosts, sharing.host_of)
    if placed is not None:  # more ranks than cores: as the backend predicts such a run
        predictions["shared"] = placed
    warm_steps, num_steps = step_counts(
        options,
        min(
            simulate(profile, *placed_plan, num_steps=1, with_timeline=False).step_time_ms
            for placed_plan in predictions.values()
        ),
    )
    steps_ms, busy_ms, ops = measured_run(plan, model, args, warm_steps, num_steps, threads)
    measured = statistics.mean(steps_ms)
    # calibrated from the first half of the timed steps, judged on the second half
    half = num_steps // 2
    first_half = range(warm_steps, warm_steps + half)
    judged = statistics.mean(steps_ms[half:])
    out = Path(options.out) / f"{model}-{stages}"
    out.mkdir(parents=True, exist_ok=True)
    _save(out, "profile", profile)
    (out / "ops.jsonl").write_text("\n".join(json.dumps(op) for op in ops))
    # The run's op times already hold whatever sharing of cores slowed them, so the
    # calibrated prediction is made on a device per stage, as the backend's is (with the
    # waits for a core between ops when ranks outnumber cores: calibration.core_wait).
    calibration = calibrate(profile, plan, ops, own, first_half, sharing=sharing)
    calibrated = simulate(
        calibration.profile, plan, calibration.cluster, with_timeline=False
    ).step_time_ms
    _save(out, "calibrated-profile", calibration.profile)
    if calibration.cluster is not None:
        _save(out, "calibrated-cluster", calibration.cluster)
    rows = []
    for label, (sim_plan, cluster) in predictions.items():
        result = simulate(profile, sim_plan, cluster, num_steps=1, with_timeline=False)
        predicted_busy = [stage.busy_ms for stage in result.stages]
        _save(out, f"plan-{label}", sim_plan)
        _save(out, f"cluster-{label}", cluster)
        rows.append(
            {
                "model": model,
                "stages": stages,
                "threads": threads,
                "cluster": label,
                "stage_layers": [len(s.layers) for s in plan.stages],
                "measured_ms": measured,
                "measured_steps_ms": steps_ms,
                "warm_steps": warm_steps,
                "predicted_ms": result.step_time_ms,
                "measured_busy_ms": busy_ms,
                "predicted_busy_ms": predicted_busy,
                "compute_ratio": sum(busy_ms) / sum(predicted_busy),
                "load_average": os.getloadavg()[0],
                "error": (measured - result.step_time_ms) / result.step_time_ms,
                "judged_ms": judged,
                "calibrated_ms": calibrated,
                "error_before": (judged - result.step_time_ms) / result.step_time_ms,
                "error_after": (judged - calibrated) / calibrated,
                "calibration": calibration.summary(),
            }
        )
    _save(out, "results", rows)
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gpt,resnet,mlp")
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b"))
    parser.add_argument("--algorithm", default="balance-time", choices=sorted(PLANNERS))
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--warm-steps", type=int, default=2)
    parser.add_argument(
        "--steps",
        type=int,
        default=10,
        help="timed steps: the first half calibrates, the second judges",
    )
    parser.add_argument(
        "--warm-seconds",
        type=float,
        default=1.0,
        help="warm up for at least this long at the predicted pace",
    )
    parser.add_argument(
        "--half-seconds",
        type=float,
        default=2.0,
        help="time each half of the timed steps for at least this long",
    )
    parser.add_argument(
        "--repeats", type=int, default=15, help="profiler repeats per layer (median)"
    )
    parser.add_argument(
        "--profile-together",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one profiler process per stage at once "
        "(default), or --no-profile-together: one process alone",
    )
    parser.add_argument("--out", default=".pipestudio/bench/fidelity")
    parser.add_argument(
        "--quiet-load",
        type=float,
        default=3.0,
        help="before each case, wait for the load average to fall below this",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=90.0,
        help="but wait no longer than this many seconds (default 90)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    models = options.models.split(",")
    sizes = sorted({int(output) for model in models for output in _median_output(model)})
    gbps = {size: measure_gloo_gbps(size) for size in sizes}
    print(
        f"{os.cpu_count()} cores, torch {torch.__version__}, {options.schedule}, "
        f"{options.microbatches} micro-batches, {options.algorithm}; gloo bandwidth "
        + ", ".join(f"{g:.2f} Gbit/s at {s} B" for s, g in gbps.items()),
        flush=True,
    )
    rows = []
    for model in models:
        bandwidth = gbps[int(_median_output(model)[0])]
        for stages in (int(s) for s in options.stages.split(",")):
            case = run_case(model, stages, options, bandwidth)
            for row in case:
                _print_row(row)
            rows.append(case[-1])  # the machine as it is: "shared" when there is one
    worst = max(abs(row["error"]) for row in rows)
    after = max(abs(row["error_after"]) for row in rows)
    passed = after <= CALIBRATED_TARGET
    print(
        f"\nuncalibrated: largest |error| {worst:.1%} (the machine as it is, target "
        f"{TARGET:.0%}); calibrated from the first half of the timed steps, judged on the "
        f"second: largest |error| {after:.1%}, target {CALIBRATED_TARGET:.0%}: "
        + ("PASS" if passed else "FAIL")
    )
    return 0 if passed else 1


def _median_output(model: str) -> list[float]:
    args, microbatch_size = MODELS[model]
    spec = load_model(model, args)
    data, _ = spec.sample(microbatch_size, 0)
    sizes = []
    with torch.no_grad():
        for _, layer in spec.layers:
            data = layer(data)
            sizes.append(data.numel() * data.element_size())
    return [statistics.median(sizes[:-1])]


def _print_row(row: dict) -> None:
    print(
        f"{row['model']:<7} {row['stages']} stages {row['threads']} thread(s)/rank "
        f"{row['cluster']:<7} layers {row['stage_layers']}: measured "
        f"{row['measured_ms']:8.1f} ms  predicted {row['predicted_ms']:8.1f} ms  error "
        f"{row['error']:+.1%}  compute measured/profiled {row['compute_ratio']:.2f}  "
        f"(load average {row['load_average']:.1f}); second half {row['judged_ms']:.1f} ms: "
        f"error {row['error_before']:+.1%} before calibration, "
        f"{row['error_after']:+.1%} after"
        + (
            f" (waits for a core: compute x{row['calibration']['core_wait']:.3f})"
            if row["calibration"]["core_wait"] != 1.0
            else ""
        ),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
