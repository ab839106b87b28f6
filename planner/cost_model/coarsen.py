"""Planning a non-sequential profile on its sequential backbone.

A profile's layers are listed in a topological order, so cutting that order anywhere gives
stages whose edges all point forward. The backbone is that order seen as a chain: element
t is layer t, and what flows from element t to t+1 is every tensor made at or before t and
read after it (skip connections and branches included, each producer once). Planners for
chains then run unchanged, and their stages map back to the graph's layers.

The backbone over-counts two things, which keeps plans on the safe side: a recomputed run
keeps everything crossing its start although it may need less, and a stage sends everything
crossing its end to the next stage although the simulator sends a tensor straight to the
stage that reads it.
"""

from collections.abc import Callable
from dataclasses import replace

from pipestudio.planner.algorithms.request import PlannerOutput, PlanRequest
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.profile import Profile
from pipestudio.planner.simulator.simulate import simulate


def crossing_bytes(profile: Profile) -> list[int]:
    """crossing[t]: bytes of the tensors made at or before layer t and read after it."""
    layers, succs = profile.layers, profile.graph.succs
    last_reader = [max(succs[idx], default=idx) for idx in range(len(layers))]
    ends: dict[int, list[int]] = {}
    for idx, reader in enumerate(last_reader):
        ends.setdefault(reader, []).append(idx)
    result, live = [], 0
    for idx, layer in enumerate(layers):
        if last_reader[idx] > idx:
            live += layer.output_bytes
        for producer in ends.get(idx, []):
            if producer != idx:
                live -= layers[producer].output_bytes
        result.append(live)
    return result


def backbone(profile: Profile) -> Profile:
    """The chain view of ``profile`` (see the module docstring)."""
    if profile.is_chain:
        return profile
    crossing = crossing_bytes(profile)
    layers = [
        layer.model_copy(update={"output_bytes": crossing[idx] or layer.output_bytes})
        for idx, layer in enumerate(profile.layers)
    ]
    return profile.model_copy(update={"layers": layers, "edges": None})


def plan_on_backbone(
    request: PlanRequest, planner: Callable[[PlanRequest], PlannerOutput]
) -> PlannerOutput:
    """Run a chain planner on the backbone and give its plan the graph's layers back.

    What the planner proved of the simulated step holds for the backbone, whose transfers
    and checkpoints the graph's simulation does not repeat, so not for the graph: a
    planner's ``step_ms`` becomes the graph's simulated step (the backbone's is kept as
    ``step_backbone_ms``), and no step is claimed optimal or bounded."""
    chain = backbone(request.scaled)
    output = planner(replace(request, profile=chain, microbatch_size=chain.microbatch_size))
    plan = Plan.model_validate(output.plan.model_dump())  # same names, same order
    provenance = {**plan.provenance, "backbone": True}
    details = output.details
    if "step_ms" in details:
        step = simulate(request.scaled, plan, request.cluster, with_timeline=False)
        details = {
            **details,
            "step_backbone_ms": details["step_ms"],
            "step_ms": step.step_time_ms,
            "step_optimal": False,
            "step_lower_bound_ms": None,
            "step_gap": None,
        }
        provenance.update(step_optimal=False, step_gap=None)
    return PlannerOutput(
        plan.model_copy(update={"provenance": provenance}), output.objective_ms, details
    )
