"""What a live migration costs, beside stopping, reshaping the checkpoint and restarting.

An ``mlp`` of 6 blocks (width 512) on 3 stages, 4 micro-batches of 32 per step, one
thread per rank, trains 24 steps and migrates three times across both boundaries:
``block2`` 0->1 and ``block4`` 2->1 at step 6, back at 12, again at 18 (3.2 MB of
parameters and Adam state per moved layer). A step's time is the interval between the
last stage's ends of consecutive steps (what a pipelined stream delivers, every schedule).

- live: each migrating step's time over the median of the steady steps around it (four
  before and four after, leaving out migrating steps and steps 0 and 1); a run's figure is
  the median of its three migrations. Target: each migration's median over the runs at
  most 1.5.
- restart: train to step 6 with a checkpoint, reshape the checkpoint into the new
  partition (parameters and optimizer state per stage), resume with the new plan to step
  24 (the later migrations live). Its extra cost (``restart +s``) is the time between the
  last stage's ends of steps 5 and 6 (as this process sees them arrive) less a steady
  step: the training stall, to set beside what the live migration added to its step
  (``live +ms``). Wall times from launch to the end of both ways are printed too; process
  start-up under load makes them vary by seconds.

One step takes tens of milliseconds, so on a shared machine a single step is noisy:
``--runs N`` repeats the whole measurement (schedules interleaved within a run) and prints
every run with the load average before it, then the median over runs, and each
migration's ratio as a median over the runs (steady steps likewise, for scale). Beside the
migrating steps, every steady step is put over its neighbours the same way (``noise``: the
largest such ratio in the run), so a migration's ratio can be read against what the
machine does to steps that migrate nothing; the summary counts single migrations and
steady steps above 1.5. ``--width`` and ``--microbatch-size`` change the blocks (and so the
bytes moved, 12 bytes per weight with Adam) and the compute per step. Exits non-zero when
a migration's median ratio over the runs exceeds 1.5 (a single step strays by as much here
whether it migrates or not, so the target is held against each migration over runs).
"""

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pipestudio.planner import Plan, parse_document
from pipestudio.runtime.engine import EngineConfig, launch
from pipestudio.runtime.engine.migration.settings import (
    MigrationSettings,
    new_plan,
    parse_migration,
)
from pipestudio.runtime.models import MODELS

ARGS = {"layers": "6", "width": "512", "in_features": "512", "out_features": "16"}
MICROBATCH_SIZE = 32
NAMES = [f"block{i}" for i in range(6)] + ["head"]
STAGES = [NAMES[0:3], NAMES[3:4], NAMES[4:7]]
MIGRATIONS = ("6:block2@1,block4@1", "12:block2@0,block4@2", "18:block2@1,block4@1")
STEPS, TARGET, AROUND = 24, 1.5, 4
SCHEDULES = ("gpipe", "1f1b", "pipedream")


def make_plan(schedule: str) -> Plan:
    return parse_document(
        Plan,
        {
            "model": "mlp",
            "schedule": schedule,
            "num_microbatches": 4,
            "microbatch_size": MICROBATCH_SIZE,
            "optimizer": "adam",
            "stages": [{"layers": s} for s in STAGES],
        },
    )


def train(
    plan: Plan, steps: int, folder: Path, migrations: tuple[str, ...] = (), **settings: Any
) -> tuple[float, list[float], list[dict[str, Any]]]:
    """Wall seconds, the step times (0 for step 0) and the events of a run; each event
    gets ``seen_s``, when this process received it."""
    repartition = (
        MigrationSettings(migrations=[parse_migration(m) for m in migrations])
        if migrations
        else None
    )
    config = EngineConfig(
        plan=plan,
        model="mlp",
        model_args=ARGS,
        steps=steps,
        threads_per_rank=1,
        checkpoint_dir=str(folder),
        timeout_s=60.0,
        migration=repartition,
        **settings,
    )
    events: list[dict[str, Any]] = []
    start = time.perf_counter()
    result = launch(config, lambda e: events.append({**e, "seen_s": time.perf_counter()}))
    wall_s = time.perf_counter() - start
    assert result.ok, result.message
    last = sorted(
        (e["step"], e["end_ms"])
        for e in events
        if e["type"] == "step" and e["stage"] == plan.num_stages - 1
    )
    return wall_s, [0.0] + [b[1] - a[1] for a, b in itertools.pairwise(last)], events


def reshape(folder: Path, old: Plan, new: Plan) -> None:
    """Rewrite the latest checkpoint of ``old`` as one of ``new`` (the offline way)."""
    meta = json.loads((folder / "latest.json").read_text())
    step_dir = folder / meta["path"]
    layers: dict[str, dict[str, Any]] = {}
    for idx, stage in enumerate(old.stages):
        names = [n for n in NAMES if n in stage.layers]
        state = torch.load(step_dir / f"stage{idx}-replica0.pt", weights_only=False)
        keys = list(state["model"])
        opt = state["optimizer"]["state"]
        for pos, key in enumerate(keys):
            where, _, rest = key.partition(".")
            entry = layers.setdefault(names[int(where)], {"model": {}, "opt": {}})
            entry["model"][rest] = state["model"][key]
            if pos in opt:
                entry["opt"][rest] = opt[pos]
        group = state["optimizer"]["param_groups"][0]
        rng = {k: state[k] for k in ("torch_rng", "cuda_rng", "python_rng", "step")}
    for idx, stage in enumerate(new.stages):
        names = [n for n in NAMES if n in stage.layers]
        model, opt = {}, {}
        for where, name in enumerate(names):
            for rest, value in layers[name]["model"].items():
                opt_state = layers[name]["opt"].get(rest)
                if opt_state is not None:
                    opt[len(model)] = opt_state
                model[f"{where}.{rest}"] = value
        groups = [{**group, "params": list(range(len(model)))}]
        torch.save(
            {**rng, "model": model, "optimizer": {"state": opt, "param_groups": groups}},
            step_dir / f"stage{idx}-replica0.pt",
        )
    meta["plan"] = json.loads(new.to_json())
    (folder / "latest.json").write_text(json.dumps(meta))


def migration_ratios(
    times: list[float], steps: list[int], of: list[int] | None = None
) -> list[float]:
    """Each step of ``of`` (default: the migrating ``steps``) over the median steady step
    around it (leaving out itself, the migrating steps and steps 0 and 1)."""
    ratios = []
    for step in steps if of is None else of:
        around = [
            times[j]
            for j in range(step - AROUND, step + AROUND + 1)
            if 2 <= j < len(times) and j not in steps and j != step
        ]
        ratios.append(times[step] / statistics.median(around))
    return ratios


def measure(schedule: str, root: Path) -> dict[str, Any]:
    plan = make_plan(schedule)
    steps = [parse_migration(m).step for m in MIGRATIONS]
    live_s, times, events = train(plan, STEPS, root / f"{schedule}-live", MIGRATIONS)
    ratios = migration_ratios(times, steps)
    steady_steps = [j for j in range(2, len(times)) if j not in steps]
    noise = migration_ratios(times, steps, of=steady_steps)
    waits = [
        max(
            e["wait_ms"]
            for e in events
            if e["type"] == "migration" and e["phase"] == "done" and e["step"] == step
        )
        for step in steps
    ]
    target = new_plan(plan, parse_migration(MIGRATIONS[0]).moves, NAMES)
    folder = root / f"{schedule}-restart"
    start = time.perf_counter()
    _, _, before = train(plan, steps[0], folder)
    reshape(folder, plan, target)
    _, _, after = train(target, STEPS, folder, MIGRATIONS[1:], resume=True)
    restart_s = time.perf_counter() - start
    steady = statistics.median(t for i, t in enumerate(times) if i >= 2 and i not in steps)
    stall_s = _last_stage_seen(after, plan, steps[0]) - _last_stage_seen(before, plan, steps[0] - 1)
    return {
        "steady_ms": steady,
        "migrating_ms": [times[s] for s in steps],
        "ratios": ratios,
        "steady_ratios": noise,
        "ratio": statistics.median(ratios),
        "wait_ms": waits,
        "live_s": live_s,
        "restart_s": restart_s,
        "restart_cost_ms": stall_s * 1e3 - steady,
        "live_cost_ms": times[steps[0]] - steady,
    }


def _last_stage_seen(events: list[dict[str, Any]], plan: Plan, step: int) -> float:
    return next(
        e["seen_s"]
        for e in events
        if e["type"] == "step" and e["step"] == step and e["stage"] == plan.num_stages - 1
    )


def _row(schedule: str, r: dict[str, Any]) -> str:
    migrating = "/".join(f"{t:.0f}" for t in r["migrating_ms"])
    ratios = "/".join(f"{x:.2f}" for x in r["ratios"])
    waits = "/".join(f"{w:.1f}" for w in r["wait_ms"])
    noise = sorted(r["steady_ratios"])
    return (
        f"{schedule:10} {r['steady_ms']:9.1f} {migrating:>14} {ratios:>15} "
        f"{r['ratio']:6.2f} {noise[-1]:6.2f} {waits:>15} {r['live_cost_ms']:7.0f} "
        f"{r['restart_cost_ms'] / 1e3:10.1f} {r['live_s']:7.1f} {r['restart_s']:9.1f}"
    )


def _per_step(runs: list[dict[str, Any]]) -> str:
    """Each migrating step's ratio as a median over the runs (one figure per migration,
    with a single step's noise taken out), beside the same statistic for every steady step:
    the largest of those says how far a step that moves nothing strays by this measure."""
    steps = [parse_migration(m).step for m in MIGRATIONS]
    migrating = [statistics.median(r["ratios"][i] for r in runs) for i in range(len(steps))]
    steady = [
        statistics.median(r["steady_ratios"][i] for r in runs)
        for i in range(len(runs[0]["steady_ratios"]))
    ]
    shown = ", ".join(f"step {s} {x:.2f}" for s, x in zip(steps, migrating, strict=True))
    return (
        f"per migration, median over {len(runs)} runs: {shown}; steady steps the same "
        f"way: max {max(steady):.2f}, median {statistics.median(steady):.2f}"
    )


def main() -> int:
    global MICROBATCH_SIZE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument(
        "--width",
        type=int,
        default=int(ARGS["width"]),
        help="the blocks' width (default %(default)s)",
    )
    parser.add_argument(
        "--microbatch-size",
        type=int,
        default=MICROBATCH_SIZE,
        help="samples per micro-batch (default %(default)s)",
    )
    args = parser.parse_args()
    assert MODELS["mlp"]
    ARGS.update(width=str(args.width), in_features=str(args.width))
    MICROBATCH_SIZE = args.microbatch_size
    root = Path(tempfile.mkdtemp(prefix="bench-migration-"))
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in SCHEDULES}
    header = (
        f"{'schedule':10} {'steady ms':>9} {'migrating ms':>14} {'ratios':>15} "
        f"{'median':>6} {'noise':>6} {'max wait ms':>15} {'live +ms':>7} "
        f"{'restart +s':>10} {'live s':>7} {'restart s':>9}"
    )
    print(f"mlp width {args.width}, micro-batches of {args.microbatch_size}", flush=True)
    try:
        for run in range(args.runs):
            print(
                f"run {run + 1}/{args.runs}, load average "
                f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}\n{header}",
                flush=True,
            )
            for schedule in SCHEDULES:
                r = measure(schedule, root / f"run{run}")
                results[schedule].append(r)
                print(_row(schedule, r), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    failed = False
    for schedule, runs in results.items():
        median = statistics.median(r["ratio"] for r in runs)
        failed |= any(
            statistics.median(r["ratios"][i] for r in runs) > TARGET for i in range(len(MIGRATIONS))
        )
        single = [x for r in runs for x in r["ratios"]]
        steady = [x for r in runs for x in r["steady_ratios"]]
        medians = ", ".join(f"{r['ratio']:.2f}" for r in runs)
        print(
            f"{schedule}: median ratio over {len(runs)} runs {median:.2f} (runs: "
            f"{medians}); single migrations over "
            f"{TARGET}: {sum(x > TARGET for x in single)} of {len(single)} (max "
            f"{max(single):.2f}); steady steps over {TARGET} times their neighbours: "
            f"{sum(x > TARGET for x in steady)} of {len(steady)} (max {max(steady):.2f})"
        )
        print(f"  {_per_step(runs)}")
    print(f"target: each migrating step at most {TARGET}x a steady step (its median over the runs)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
