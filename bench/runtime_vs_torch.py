"""Throughput of ``pipestudio train``'s engine against ``torch.distributed.pipelining``.

Both systems train the same model split into the same stages (equal layer counts), with the
same schedule (``gpipe``: ``ScheduleGPipe``; ``1f1b``: ``Schedule1F1B``; ``zero-bubble``:
``ScheduleInterleavedZeroBubble`` with one stage per rank, its ZB-H1 form;
``interleaved-1f1b``: ``ScheduleInterleaved1F1B`` with ``--virtual-stages`` chunks per
rank, chunk c on rank c mod stages), the same
micro-batches (micro-batch ``k`` of step ``t`` is the model's ``sample(size, t * M + k)``),
the same optimizer (Adam), gloo between processes on this machine, and the same number of
torch threads per rank. Every run binds its own ``TCPStore`` on port 0, so no port is fixed.

A run trains ``--warm-steps`` untimed steps, then ``--steps`` timed ones. A step ends when
the last rank has finished its part of it (its update, and for the engine its sends); the
timed window runs from the end of the last warm step to the end of the last step, for both
systems alike. Each round runs both systems back to back (which goes first alternates
between rounds), so both see the same load on a noisy machine; a round's ratio is ours /
torch, and the ratio printed is the median over ``--rounds`` rounds, beside each system's
median samples/s. Before each round the script waits (at most ``--quiet-wait`` seconds)
for the machine's load average to fall below ``--quiet-load``, and it prints the load.

Target: ratio >= 1.0 for both schedules, at ``--stages 2`` on a 2-core machine and at
``--stages 4`` on a 16-core one. Exits non-zero when a ratio is below ``--target``.
"""

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta
from itertools import pairwise
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipestudio.planner import Plan
from pipestudio.runtime.engine import EngineConfig, launch
from pipestudio.runtime.models import load_model
from pipestudio.runtime.optimizers import make_optimizer

#: Model arguments: chains of at least 8 layers, so that 2 and 4 stages split them evenly.
MODELS: dict[str, dict[str, str]] = {
    "gpt": {"layers": "6", "width": "256", "heads": "4", "seq_len": "64", "vocab": "1024"},
    "mlp": {"layers": "7", "width": "1024", "in_features": "256"},
}
MICROBATCH_SIZE = {"gpt": 4, "mlp": 64}
TIMEOUT_S = 120.0


def wait_for_quiet(max_load: float, max_wait_s: float) -> float:
    """Wait until the 1-minute load average is below ``max_load`` (at most ``max_wait_s``);
    the load average then. On a shared machine this keeps runs out of others' bursts."""
    deadline = time.monotonic() + max_wait_s
    while os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(5.0)
    return os.getloadavg()[0]


def equal_plan(
    model: str,
    layer_names: list[str],
    schedule: str,
    num_stages: int,
    num_microbatches: int,
    microbatch_size: int,
    virtual_stages: int = 1,
) -> Plan:
    """Stages of consecutive layers, as equal in count as the layers allow (interleaved:
    ``num_stages`` x ``virtual_stages`` chunks)."""
    chunks = virtual_stages if schedule == "interleaved-1f1b" else 1
    count = num_stages * chunks
    bounds = [round(idx * len(layer_names) / count) for idx in range(count + 1)]
    return Plan.model_validate(
        {
            "model": model,
            "schedule": schedule,
            "virtual_stages": chunks,
            "num_microbatches": num_microbatches,
            "microbatch_size": microbatch_size,
            "optimizer": "adam",
            "stages": [{"layers": layer_names[a:b]} for a, b in pairwise(bounds)],
        }
    )


def timed_samples_per_s(step_ends_ms: list[float], warm_steps: int, plan: Plan) -> float:
    """Samples per second from the end of the last warm step to the end of the last step."""
    timed_ms = step_ends_ms[-1] - step_ends_ms[warm_steps - 1]
    num_steps = len(step_ends_ms) - warm_steps
    return num_steps * plan.num_microbatches * plan.microbatch_size / timed_ms * 1e3


def run_ours(
    plan: Plan, model: str, args: dict[str, str], num_steps: int, warm_steps: int, threads: int
) -> float:
    config = EngineConfig(
        plan=plan,
        model=model,
        model_args=args,
        steps=warm_steps + num_steps,
        threads_per_rank=threads,
        device="cpu",
        timeout_s=TIMEOUT_S,
    )
    result = launch(config)
    if not result.ok or result.summary is None:
        raise RuntimeError(f"the engine failed: {result.message}")
    ends, total = [], 0.0
    for step_ms in result.summary["step_times_ms"]:
        total += step_ms
        ends.append(total)
    return timed_samples_per_s(ends, warm_steps, plan)


def _torch_batch(spec: Any, plan: Plan, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    first = step * plan.num_microbatches
    pairs = [spec.sample(plan.microbatch_size, first + k) for k in range(plan.num_microbatches)]
    return torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])


def _torch_rank(
    rank: int,
    port: int,
    plan: Plan,
    model: str,
    args: dict[str, str],
    num_steps: int,
    threads: int,
    conn: Any,
) -> None:
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
    )

    torch.set_num_threads(threads)
    world = plan.num_workers
    store = dist.TCPStore("127.0.0.1", port, world, False, timeout=timedelta(seconds=TIMEOUT_S))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=TIMEOUT_S)
    )
    spec = load_model(model, args)
    layers = dict(spec.layers)
    chunks = list(range(rank, plan.num_stages, world))  # the plan's own placement
    modules = [nn.Sequential(*[layers[name] for name in plan.stages[c].layers]) for c in chunks]
    stages = [
        PipelineStage(module, chunk, plan.num_stages, torch.device("cpu"))
        for chunk, module in zip(chunks, modules, strict=True)
    ]
    stage, module = stages[0], nn.ModuleList(modules)
    schedule: Any
    if plan.schedule == "interleaved-1f1b":
        schedule = ScheduleInterleaved1F1B(stages, plan.num_microbatches, loss_fn=spec.loss)
    elif plan.schedule == "zero-bubble":
        schedule = ScheduleInterleavedZeroBubble([stage], plan.num_microbatches, loss_fn=spec.loss)
    else:
        kind = ScheduleGPipe if plan.schedule == "gpipe" else Schedule1F1B
        schedule = kind(stage, plan.num_microbatches, loss_fn=spec.loss)
    optimizer = make_optimizer(plan.optimizer, module.parameters())
    ends_ms = []
    for step in range(num_steps):
        data, targets = _torch_batch(spec, plan, step)
        first, last = 0 in chunks, plan.num_stages - 1 in chunks
        if first and last:
            schedule.step(data, target=targets, return_outputs=False)
        elif first:
            schedule.step(data, return_outputs=False)
        elif last:
            schedule.step(target=targets, return_outputs=False)
        else:
            schedule.step(return_outputs=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ends_ms.append(time.time() * 1e3)
    conn.send(ends_ms)
    conn.close()
    dist.destroy_process_group()


def run_torch(
    plan: Plan, model: str, args: dict[str, str], num_steps: int, warm_steps: int, threads: int
) -> float:
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        plan.num_workers + 1,
        True,
        wait_for_workers=False,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    context = mp.get_context("spawn")
    readers, processes = [], []
    for rank in range(plan.num_workers):
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(
            target=_torch_rank,
            args=(rank, store.port, plan, model, args, warm_steps + num_steps, threads, writer),
        )
        process.start()
        writer.close()
        readers.append(reader)
        processes.append(process)
    try:
        per_rank = []
        for reader in readers:
            if not reader.poll(TIMEOUT_S * 4):
                raise RuntimeError("torch.distributed.pipelining timed out")
            per_rank.append(reader.recv())
    finally:
        for process in processes:
            process.join(TIMEOUT_S)
            if process.is_alive():
                process.kill()
    ends = [
        max(rank_ends[step] for rank_ends in per_rank) for step in range(warm_steps + num_steps)
    ]
    return timed_samples_per_s(ends, warm_steps, plan)


def compare(model: str, schedule: str, options: argparse.Namespace) -> tuple[float, float, float]:
    """Median samples/s of ours and of torch over alternating rounds, and the median of
    the rounds' ratios (each round's two runs ran back to back, under the same load)."""
    spec = load_model(model, MODELS[model])
    plan = equal_plan(
        model,
        spec.layer_names,
        schedule,
        options.stages,
        options.microbatches,
        MICROBATCH_SIZE[model],
        options.virtual_stages,
    )
    runners = {"ours": run_ours, "torch": run_torch}
    figures: dict[str, list[float]] = {"ours": [], "torch": []}
    for round_idx in range(options.rounds):
        wait_for_quiet(options.quiet_load, options.quiet_wait)
        order = ["ours", "torch"] if round_idx % 2 == 0 else ["torch", "ours"]
        for name in order:
            figures[name].append(
                runners[name](
                    plan, model, MODELS[model], options.steps, options.warm_steps, options.threads
                )
            )
        print(
            f"  {model} {schedule} round {round_idx}: ours {figures['ours'][-1]:.1f} "
            f"torch {figures['torch'][-1]:.1f} samples/s (load average "
            f"{os.getloadavg()[0]:.1f})",
            flush=True,
        )
    ratios = [a / b for a, b in zip(figures["ours"], figures["torch"], strict=True)]
    return (
        statistics.median(figures["ours"]),
        statistics.median(figures["torch"]),
        statistics.median(ratios),
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--models", default="gpt,mlp")
    parser.add_argument("--schedules", default="gpipe,1f1b")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument(
        "--virtual-stages", type=int, default=2, help="chunks per rank for interleaved-1f1b"
    )
    parser.add_argument("--warm-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per rank (default: cores // stages, at least 1)",
    )
    parser.add_argument("--target", type=float, default=1.0)
    parser.add_argument(
        "--quiet-load",
        type=float,
        default=3.0,
        help="before each round, wait for the load average to fall below this",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=90.0,
        help="but wait no longer than this many seconds (default 90)",
    )
    options = parser.parse_args(argv)
    if options.threads is None:
        options.threads = max(1, (os.cpu_count() or 1) // options.stages)
    if options.warm_steps < 1 or options.steps < 1 or options.rounds < 1:
        parser.error("--warm-steps, --steps and --rounds must be >= 1")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    print(
        f"{options.stages} stages, {options.microbatches} micro-batches, "
        f"{options.threads} threads per rank, {os.cpu_count()} cores, torch "
        f"{torch.__version__}; {options.warm_steps} warm + {options.steps} timed steps, "
        f"{options.rounds} alternating rounds; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows = []
    for model in options.models.split(","):
        for schedule in options.schedules.split(","):
            rows.append((model, schedule, *compare(model, schedule, options)))
    print(
        f"\n{'model':<6} {'schedule':<17} {'ours/s':>9} {'torch/s':>9} {'ratio':>6}  "
        "(median samples/s; median of the rounds' ratios)"
    )
    for model, schedule, ours, theirs, ratio in rows:
        print(f"{model:<6} {schedule:<17} {ours:>9.1f} {theirs:>9.1f} {ratio:>6.2f}")
    worst = min(row[-1] for row in rows)
    verdict = "PASS" if worst >= options.target else "FAIL"
    print(f"\n{verdict}: lowest ratio ours/torch {worst:.2f}, target {options.target}")
    return 0 if worst >= options.target else 1


if __name__ == "__main__":
    sys.exit(main())
