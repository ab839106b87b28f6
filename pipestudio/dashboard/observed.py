"""An observed profile from a run's measurements, for the online planner to weigh.

The engine measures each stage's compute per step, not each layer's. The observed profile
is the plan's profile with every layer's forward, backward and update time scaled by its
stage's measured compute over the compute the simulator predicts for that stage (the
first step, which warms caches up, is left out). A stage that runs slower than predicted
makes its layers look heavier, which is what the online planner (vPipe's repartition,
``planner/replan.py``) needs to move layers off it.
"""

from collections.abc import Sequence
from typing import Any

from pipestudio.planner import Plan, Profile, simulate
from pipestudio.planner.errors import PlannerError


def measured_busy_ms(steps: Sequence[dict[str, Any]], num_stages: int) -> list[float]:
    """Mean measured compute per step of every stage (over its replicas and steps)."""
    first = min((e["step"] for e in steps), default=0)
    later = [e for e in steps if e["step"] > first] or list(steps)
    busy = []
    for stage_idx in range(num_stages):
        mine = [e["busy_ms"] for e in later if e["stage"] == stage_idx]
        if not mine:
            raise PlannerError(f"stage {stage_idx} has reported no step yet: wait for the "
                               "run's first steps")
        busy.append(sum(mine) / len(mine))
    return busy


def observed_profile(profile: Profile, plan: Plan, steps: Sequence[dict[str, Any]]
                     ) -> Profile:
    predicted = simulate(profile, plan, None, with_timeline=False)
    measured = measured_busy_ms(steps, plan.num_stages)
    stage_of = {name: stage_idx for stage_idx, stage in enumerate(plan.stages)
                for name in stage.layers}
    factors = [m / p.busy_ms if p.busy_ms > 0 else 1.0
               for m, p in zip(measured, predicted.stages, strict=True)]
    layers = [layer.model_copy(update={
        "fwd_ms": layer.fwd_ms * factors[stage_of[layer.name]],
        "bwd_ms": layer.bwd_ms * factors[stage_of[layer.name]],
        "update_ms": layer.update_ms * factors[stage_of[layer.name]]})
        for layer in profile.layers]
    metadata = {**profile.metadata, "observed_from": "run measurements (per-stage scaling)"}
    return profile.model_copy(update={"layers": layers, "metadata": metadata})
