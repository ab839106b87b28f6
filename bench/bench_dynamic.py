"""A dynamic workload repaired online: blocks switch on in one stage, the job repartitions.

The ``dynamic`` model (4 transformer blocks, width 256, sequence 64) trains on 2 stages,
1f1b, one thread per rank, with blocks 0 and 1 active; at step ``SWITCH`` blocks 2 and 3,
both on stage 1, switch on (``build`` below: the built-in model with that activation
schedule). The plan is balanced for the first phase: ``embed, block0 | block1..3, head``.

- without repartition the last stage carries three active blocks to the first's one;
- with ``--auto-repartition --repartition-every 2`` the online planner sees it in the
  engine's per-layer measurements and migrates.

Prints samples/s per step for both runs and, after the switch, the steps until the
repartitioned run stays within 10% of the simulated best plan for the new model (the
exact planner's plan simulated on the observed profile, from the ``proposal`` event), and
draws docs/img/live_repartition.png. Exits non-zero when it does not recover by the end.
"""

import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pipestudio.planner import Plan, parse_document
from pipestudio.runtime.engine import EngineConfig, launch
from pipestudio.runtime.engine.repartition import RepartitionConfig
from pipestudio.runtime.models.dynamic import DynamicSpec, dynamic

HERE = Path(__file__).resolve()
IMAGE = HERE.parents[1] / "docs" / "img" / "live_repartition.png"
SWITCH, STEPS, MB, NUM_MB = 12, 36, 4, 4
ARGS = {"layers": 4, "width": 256, "heads": 4, "seq_len": 64, "vocab": 256}


class _Switched(DynamicSpec):
    def active_blocks(self, step: int) -> set[int]:
        return {0, 1, 2, 3} if step >= SWITCH else {0, 1}


def build(seed: int = 0) -> DynamicSpec:
    """The built-in ``dynamic`` model with blocks 2 and 3 switched on at ``SWITCH``."""
    spec = dynamic(**ARGS, seed=seed)
    spec.__class__ = _Switched
    return spec


def run(auto: bool) -> tuple[list[float], list[dict[str, Any]]]:
    plan = parse_document(Plan, {
        "model": "dynamic", "schedule": "1f1b", "num_microbatches": NUM_MB,
        "microbatch_size": MB, "optimizer": "adam",
        "stages": [{"layers": ["embed", "block0"]},
                   {"layers": ["block1", "block2", "block3", "head"]}]})
    repartition = RepartitionConfig(every=2, auto=True, min_gain_fraction=0.05) if auto else None
    events: list[dict[str, Any]] = []
    config = EngineConfig(plan=plan, model=f"{HERE}:build", steps=STEPS, threads_per_rank=1,
                          timeout_s=60.0, repartition=repartition)
    result = launch(config, events.append)
    assert result.ok and result.summary is not None, result.message
    samples = MB * NUM_MB
    return [samples / t * 1e3 for t in result.summary["step_times_ms"]], events


def simulated_best(events: list[dict[str, Any]]) -> float | None:
    """Samples/s of the exact planner's plan on the profile observed after the switch."""
    for event in events:
        if event["type"] == "proposal" and event.get("window_step", 0) >= SWITCH:
            optimal = [c for c in event.get("candidates", []) if c["name"] == "optimal"]
            if optimal and optimal[0]["step_time_ms"]:
                return float(MB * NUM_MB / optimal[0]["step_time_ms"] * 1e3)
    return None


def main() -> int:
    plain, _ = run(auto=False)
    repaired, events = run(auto=True)
    best = simulated_best(events)
    migrations = [e for e in events if e["type"] == "migration" and e["phase"] == "scheduled"]
    print("step  static samples/s  auto samples/s")
    for step, (a, b) in enumerate(zip(plain, repaired, strict=True)):
        print(f"{step:4d} {a:17.1f} {b:15.1f}")
    for m in migrations:
        print(f"migration at step {m['step']} ({m['source']}): "
              + ", ".join(f"{x['layer']} {x['from_stage']}->{x['to_stage']}"
                          for x in m["moves"]))
    before = statistics.median(plain[2:SWITCH])
    after_static = statistics.median(plain[SWITCH + 2:])
    recovered = None
    if best is not None:
        for step in range(SWITCH, STEPS - 2):
            if all(x >= 0.9 * best for x in repaired[step:step + 3]):
                recovered = step
                break
    tail = statistics.median(repaired[-8:])
    print(f"before the switch: {before:.1f} samples/s; after it, static plan: "
          f"{after_static:.1f}; repartitioned (last 8 steps): {tail:.1f}")
    if best is not None:
        print(f"simulated best for the new model: {best:.1f} samples/s; repartitioned run at "
              f"{100 * tail / best:.0f}% of it; within 10% from step {recovered} "
              f"({None if recovered is None else recovered - SWITCH} steps after the switch)")
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(plain, label="static plan", color="tab:gray")
    ax.plot(repaired, label="--auto-repartition", color="tab:blue")
    if best is not None:
        ax.axhline(best, ls="--", color="tab:green", label="simulated best (new model)")
    ax.axvline(SWITCH, ls=":", color="black", label="blocks 2, 3 switch on")
    for m in migrations:
        ax.axvline(m["step"], ls="-.", color="tab:red", alpha=0.6)
    ax.set_xlabel("step")
    ax.set_ylabel("samples/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(IMAGE, dpi=120)
    print(f"wrote {IMAGE}")
    return 0 if recovered is not None else 1


if __name__ == "__main__":
    sys.exit(main())
