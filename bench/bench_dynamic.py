"""A dynamic workload repaired online: blocks switch on in one stage, the job repartitions.

The ``dynamic`` model (4 transformer blocks, width 256, sequence 64) trains on 2 stages,
1f1b, 4 micro-batches of 4, one thread per rank, with blocks 0 and 1 active; at step
``SWITCH`` blocks 2 and 3, both on stage 1, switch on. The plan is balanced for the first
phase: ``embed, block0 | block1..3, head``. Three runs, each with the online planner
measuring every 2 steps (the same per-layer timing and planner thread in all three, so
they differ only in what is done with its proposals):

- ``static``: proposals are held, never applied (the imbalance without repartitioning);
- ``auto``: ``--auto-repartition`` applies them (the repair);
- ``best``: blocks 0 to 3 active from step 0, on the partition ``auto`` ended on: what the
  engine does on the new model's best plan with no migration at all.

The *simulated best* is the exact planner's plan for the new model simulated on the profile
the engine measured in the same run over the same two steps (each ``proposal`` event's
``optimal`` candidate), so simulation and measurement see the machine in the same state.
A run's figure after the switch (from ``SWITCH + SETTLE`` on) is its median samples/s over
the median simulated best of the same steps; and for every 6-step window after the switch,
its median samples/s over the simulated best of the proposals measured within it: ``auto``
has recovered at the first window from which every later one is within 10%.

The machine is shared, so ``--rounds N`` repeats the three runs with their order rotated
(``static, auto, best``, then ``auto, best, static``, ...), printing every run with the
load average before it, and draws docs/img/live_repartition.png: samples/s per step (every
run; medians over rounds bold) and below each window's share of its simulated best. Exits
non-zero when ``auto``'s median ratio over rounds is below 0.9.
"""

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pipestudio.planner import Plan, parse_document
from pipestudio.runtime.engine import EngineConfig, launch
from pipestudio.runtime.engine.migration.settings import MigrationSettings
from pipestudio.runtime.models.dynamic import DynamicSpec, dynamic

HERE = Path(__file__).resolve()
IMAGE = HERE.parents[1] / "docs" / "img" / "live_repartition.png"
SWITCH, STEPS, SETTLE, MB, NUM_MB, ROLLING = 8, 30, 8, 4, 4, 6
ARGS = {"layers": 4, "width": 256, "heads": 4, "seq_len": 64, "vocab": 256}
FIRST = [["embed", "block0"], ["block1", "block2", "block3", "head"]]
KINDS = ("static", "auto", "best")


class _Switched(DynamicSpec):
    def active_blocks(self, step: int) -> set[int]:
        return {0, 1, 2, 3} if step >= SWITCH else {0, 1}


class _AllOn(DynamicSpec):
    def active_blocks(self, step: int) -> set[int]:
        return {0, 1, 2, 3}


def build(seed: int = 0) -> DynamicSpec:
    """The built-in ``dynamic`` model with blocks 2 and 3 switched on at ``SWITCH``."""
    spec = dynamic(**ARGS, seed=seed)
    spec.__class__ = _Switched
    return spec


def build_all_on(seed: int = 0) -> DynamicSpec:
    """The same model with every block active from the start."""
    spec = dynamic(**ARGS, seed=seed)
    spec.__class__ = _AllOn
    return spec


def run(kind: str, stages: list[list[str]]) -> dict[str, Any]:
    plan = parse_document(
        Plan,
        {
            "model": "dynamic",
            "schedule": "1f1b",
            "num_microbatches": NUM_MB,
            "microbatch_size": MB,
            "optimizer": "adam",
            "stages": [{"layers": names} for names in stages],
        },
    )
    repartition = MigrationSettings(every=2, auto=kind == "auto", min_gain_fraction=0.05)
    model = f"{HERE}:{'build_all_on' if kind == 'best' else 'build'}"
    config = EngineConfig(
        plan=plan,
        model=model,
        steps=STEPS,
        threads_per_rank=1,
        timeout_s=60.0,
        migration=repartition,
    )
    events: list[dict[str, Any]] = []
    result = launch(config, events.append)
    assert result.ok and result.summary is not None, result.message
    samples = [MB * NUM_MB / t * 1e3 for t in result.summary["step_times_ms"]]
    simulated = {}
    for event in events:
        optimal = [c for c in event.get("candidates", []) if c["name"] == "optimal"]
        if event["type"] == "proposal" and optimal and optimal[0]["step_time_ms"]:
            simulated[event["window_step"]] = MB * NUM_MB / optimal[0]["step_time_ms"] * 1e3
    return {
        "samples": samples,
        "simulated": simulated,
        "final": [stage["layers"] for stage in result.summary["stages"]],
        "migrations": [e for e in events if e["type"] == "migration" and e["phase"] == "scheduled"],
    }


def windows(r: dict[str, Any]) -> list[tuple[int, float]]:
    """(first step, measured over simulated best) of every ``ROLLING``-step window after
    the switch: the median samples/s of its steps over the median simulated best of the
    proposals measured within it."""
    result = []
    for first in range(SWITCH, STEPS - ROLLING + 1):
        sims = [v for w, v in r["simulated"].items() if first <= w - 1 and w < first + ROLLING]
        if sims:
            measured = statistics.median(r["samples"][first : first + ROLLING])
            result.append((first, measured / statistics.median(sims)))
    return result


def figures(r: dict[str, Any]) -> dict[str, Any]:
    """Medians from ``SWITCH + SETTLE`` on, and the first step from which every window is
    within 10% of the simulated best."""
    samples, simulated = r["samples"], r["simulated"]
    settled = [v for w, v in simulated.items() if w - 1 >= SWITCH + SETTLE]
    tail = statistics.median(samples[SWITCH + SETTLE :])
    sim_tail = statistics.median(settled) if settled else float("nan")
    ratios = windows(r)
    recovered = next(
        (first for idx, (first, _) in enumerate(ratios) if all(x >= 0.9 for _, x in ratios[idx:])),
        None,
    )
    return {
        "tail": tail,
        "simulated": sim_tail,
        "ratio": tail / sim_tail,
        "before": statistics.median(samples[2:SWITCH]),
        "recovered": recovered,
        "windows": ratios,
    }


def plot(results: dict[str, list[dict[str, Any]]]) -> None:
    """Samples/s per step (top) and each window's share of its simulated best (bottom)."""
    colors = {"static": "tab:gray", "auto": "tab:blue", "best": "tab:orange"}
    labels = {
        "static": "static plan (proposals held)",
        "auto": "--auto-repartition",
        "best": "best plan from step 0 (all blocks on)",
    }
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6), sharex=True)
    for kind in KINDS:
        runs = results[kind]
        for r in runs:
            top.plot(r["samples"], color=colors[kind], alpha=0.25, lw=0.8)
            steps, ratios = zip(*[(first + ROLLING / 2, x) for first, x in windows(r)], strict=True)
            bottom.plot(steps, ratios, color=colors[kind], alpha=0.25, lw=0.8)
        top.plot(
            [statistics.median(r["samples"][i] for r in runs) for i in range(STEPS)],
            color=colors[kind],
            lw=2,
            label=f"{labels[kind]}, median of {len(runs)}",
        )
        by_first: dict[int, list[float]] = {}
        for r in runs:
            for first, x in windows(r):
                by_first.setdefault(first, []).append(x)
        bottom.plot(
            [first + ROLLING / 2 for first in sorted(by_first)],
            [statistics.median(by_first[first]) for first in sorted(by_first)],
            color=colors[kind],
            lw=2,
        )
    bottom.axhline(1.0, ls="--", color="tab:green", label="simulated best (same steps)")
    bottom.axhline(0.9, ls=":", color="tab:green", label="within 10%")
    for ax in (top, bottom):
        ax.axvline(SWITCH, ls=":", color="black")
        for r in results["auto"]:
            for m in r["migrations"]:
                ax.axvline(m["step"], ls="-.", color="tab:red", alpha=0.5)
    top.set_ylabel("samples/s")
    top.set_title(
        f"blocks 2, 3 switch on at step {SWITCH} (dotted); auto-repartition migrates (dash-dot)",
        fontsize=9,
    )
    bottom.set_ylabel(f"{ROLLING}-step median /\nsimulated best")
    bottom.set_xlabel("step")
    top.legend(fontsize=7)
    bottom.legend(fontsize=7)
    fig.tight_layout()
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMAGE, dpi=120)


def _report(kind: str, r: dict[str, Any], f: dict[str, Any]) -> str:
    moves = "; ".join(
        f"step {m['step']}: "
        + ", ".join(f"{x['layer']} {x['from_stage']}->{x['to_stage']}" for x in m["moves"])
        for m in r["migrations"]
    )
    steps = "never" if f["recovered"] is None else f"step {f['recovered']}"
    within = "/".join(f"{x:.2f}" for _, x in f["windows"])
    return (
        f"  {kind:6} before {f['before']:5.1f} after {f['tail']:5.1f} samples/s, simulated "
        f"best {f['simulated']:5.1f}, ratio {f['ratio']:.2f}; every window within 10% "
        f"from: {steps}"
        + (f"; migrations: {moves}" if moves else "")
        + f"\n    {ROLLING}-step windows from step {SWITCH}, measured/simulated: {within}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="repetitions (default 2)")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    best_stages = [["embed", "block0", "block1"], ["block2", "block3", "head"]]
    for round_idx in range(args.rounds):
        order = KINDS[round_idx % 3 :] + KINDS[: round_idx % 3]
        for kind in order:
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            r = run(kind, best_stages if kind == "best" else FIRST)
            if kind == "auto":
                best_stages = r["final"]
            results[kind].append(r)
            print(
                f"round {round_idx + 1}, load average {load}\n" + _report(kind, r, figures(r)),
                flush=True,
            )
            print("    samples/s: " + " ".join(f"{s:.1f}" for s in r["samples"]), flush=True)
    print(
        f"\nafter the switch (steps {SWITCH + SETTLE}..{STEPS - 1}), medians over "
        f"{args.rounds} rounds:"
    )
    ratios = {}
    for kind in KINDS:
        fs = [figures(r) for r in results[kind]]
        ratios[kind] = statistics.median(f["ratio"] for f in fs)
        each = ", ".join(f"{f['ratio']:.2f}" for f in fs)
        print(
            f"  {kind:6} {statistics.median(f['tail'] for f in fs):5.1f} samples/s, "
            f"{ratios[kind]:.2f} of the simulated best (runs: {each})"
        )
    for kind in KINDS:
        recovered = [figures(r)["recovered"] for r in results[kind]]
        later = [x for r in results[kind] for first, x in windows(r) if first >= SWITCH + 4]
        print(
            f"  {kind:6} every later {ROLLING}-step window within 10% from: "
            + ", ".join("never" if s is None else f"step {s}" for s in recovered)
            + f"; windows from step {SWITCH + 4} within 10%: "
            f"{sum(x >= 0.9 for x in later)}/{len(later)}"
        )
    plot(results)
    print(f"wrote {IMAGE}")
    return 0 if ratios["auto"] >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
