"""What a live migration costs, beside stopping, reshaping the checkpoint and restarting.

An ``mlp`` of 6 blocks (width 512) on 3 stages, 4 micro-batches of 32 per step, one
thread per rank, trains 12 steps and moves ``block2`` from stage 0 to stage 1 and
``block4`` from stage 2 to stage 1 at step 6:

- live: ``pipestudio train --migrate 6:block2@1,block4@1``; the migrating step's time over
  the median steady step (steps 2..11 but 6). Target: at most 1.5.
- restart: train to step 6 with a checkpoint, reshape the checkpoint into the new
  partition (parameters and optimizer state per stage), resume with the new plan to 12.
  Its cost is its wall time less the live run's, both from launch to the end.

Prints both and exits non-zero when the ratio exceeds 1.5 for a schedule.
"""

import itertools
import json
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
from pipestudio.runtime.engine.repartition import RepartitionConfig, new_plan, parse_migration
from pipestudio.runtime.models import MODELS

ARGS = {"layers": "6", "width": "512", "in_features": "512", "out_features": "16"}
NAMES = [f"block{i}" for i in range(6)] + ["head"]
STAGES = [NAMES[0:3], NAMES[3:4], NAMES[4:7]]
MIGRATE, STEPS, TARGET = "6:block2@1,block4@1", 12, 1.5


def make_plan(schedule: str) -> Plan:
    return parse_document(Plan, {"model": "mlp", "schedule": schedule, "num_microbatches": 4,
                                 "microbatch_size": 32, "optimizer": "adam",
                                 "stages": [{"layers": s} for s in STAGES]})


def train(plan: Plan, steps: int, folder: Path, **settings: Any) -> tuple[float, list[float]]:
    """Wall seconds and, per step after the first, the time between the last stage's ends
    of consecutive steps (what a pipelined stream delivers, for every schedule)."""
    config = EngineConfig(plan=plan, model="mlp", model_args=ARGS, steps=steps,
                          threads_per_rank=1, checkpoint_dir=str(folder), timeout_s=60.0,
                          **settings)
    events: list[dict[str, Any]] = []
    start = time.perf_counter()
    result = launch(config, events.append)
    wall_s = time.perf_counter() - start
    assert result.ok, result.message
    last = sorted((e["step"], e["end_ms"]) for e in events
                  if e["type"] == "step" and e["stage"] == plan.num_stages - 1)
    return wall_s, [0.0] + [b[1] - a[1] for a, b in itertools.pairwise(last)]


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
        torch.save({**rng, "model": model, "optimizer": {"state": opt, "param_groups": groups}},
                   step_dir / f"stage{idx}-replica0.pt")
    meta["plan"] = json.loads(new.to_json())
    (folder / "latest.json").write_text(json.dumps(meta))


def measure(schedule: str, root: Path) -> dict[str, float]:
    plan = make_plan(schedule)
    live = RepartitionConfig(migrations=[parse_migration(MIGRATE)])
    live_s, times = train(plan, STEPS, root / f"{schedule}-live", repartition=live)
    migrating = times[6]
    steady = statistics.median(t for i, t in enumerate(times) if i >= 2 and i != 6)
    target = new_plan(plan, parse_migration(MIGRATE).moves, NAMES)
    folder = root / f"{schedule}-restart"
    start = time.perf_counter()
    train(plan, 6, folder)
    reshape(folder, plan, target)
    train(target, STEPS, folder, resume=True)
    restart_s = time.perf_counter() - start
    return {"steady_ms": steady, "migrating_ms": migrating, "ratio": migrating / steady,
            "live_s": live_s, "restart_s": restart_s,
            "restart_cost_ms": (restart_s - live_s) * 1e3 + migrating - steady}


def main() -> int:
    assert MODELS["mlp"]
    root = Path(tempfile.mkdtemp(prefix="bench-migration-"))
    failed = False
    print(f"{'schedule':10} {'steady ms':>10} {'migrating ms':>13} {'ratio':>6} "
          f"{'live s':>7} {'restart s':>10} {'restart cost ms':>16}")
    try:
        for schedule in ("gpipe", "1f1b", "pipedream"):
            r = measure(schedule, root)
            failed |= r["ratio"] > TARGET
            print(f"{schedule:10} {r['steady_ms']:10.1f} {r['migrating_ms']:13.1f} "
                  f"{r['ratio']:6.2f} {r['live_s']:7.2f} {r['restart_s']:10.2f} "
                  f"{r['restart_cost_ms']:16.0f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"target: the migrating step at most {TARGET}x a steady step")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
