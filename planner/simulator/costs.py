"""Per-stage work and memory of a plan: the numbers the simulator and planners share.

Memory policies change what a stage keeps between a micro-batch's forward and its backward:

keep       the layer's ``saved_bytes`` stay on the device.
swap       they go to host memory after the forward and come back before the backward.
recompute  nothing of the layer is kept; each run of consecutive recompute layers keeps only
           its inputs (the checkpoint), and the forward of the run is repeated before the
           backward (GPipe's rematerialization).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from pipestudio.planner.formats.plan import OPTIMIZER_STATE_FACTOR, Plan, StageLayout
from pipestudio.planner.formats.profile import Profile

#: Key of the model's input data among a stage's checkpoint producers.
_INPUT = -1


@dataclass(frozen=True)
class StageCosts:
    """One replica's work per micro-batch and its memory, by kind."""

    fwd_ms: float
    bwd_ms: float
    recompute_ms: float
    update_ms: float
    param_bytes: int
    optimizer_bytes: int
    keep_bytes: int
    swap_bytes: int
    recompute_bytes: int
    checkpoint_bytes: int
    workspace_bytes: int
    #: zero-bubble's halves of the backward (``Layer.input_grad_ms``, ``weight_grad_ms``),
    #: and the saved bytes that only the weight half needs: those of the layers with
    #: parameters (it frees them; the input half frees the rest).
    input_ms: float = 0.0
    weight_ms: float = 0.0
    weight_bytes: int = 0

    @property
    def kept_bytes(self) -> int:
        """Activations a micro-batch holds on the device between forward and backward."""
        return self.keep_bytes + self.checkpoint_bytes


def stage_costs(profile: Profile, plan: Plan, layout: StageLayout) -> list[StageCosts]:
    """Work and memory of every stage, for the plan's policies."""
    factor = OPTIMIZER_STATE_FACTOR[plan.optimizer]
    return [
        layer_set_costs(
            profile,
            indices,
            {idx: plan.policy(profile.layers[idx].name) for idx in indices},
            factor,
        )
        for indices in layout.stage_layers
    ]


def layer_set_costs(
    profile: Profile, indices: Sequence[int], policy: dict[int, str], optimizer_factor: int
) -> StageCosts:
    """Work and memory of one stage made of the layers ``indices`` under ``policy``."""
    layers, preds = profile.layers, profile.graph.preds
    keep = swap = recompute = 0
    fwd = bwd = recompute_ms = update = input_ms = weight_ms = 0.0
    params = workspace = weight_bytes = 0
    producers: set[int] = set()
    for idx in indices:
        layer = layers[idx]
        fwd += layer.fwd_ms
        bwd += layer.bwd_ms
        update += layer.update_ms
        input_ms += layer.input_grad_ms
        weight_ms += layer.weight_grad_ms
        if layer.param_bytes:
            weight_bytes += layer.saved_bytes
        params += layer.param_bytes
        workspace = max(workspace, layer.workspace_bytes)
        if policy[idx] == "keep":
            keep += layer.saved_bytes
        elif policy[idx] == "swap":
            swap += layer.saved_bytes
        else:
            recompute += layer.saved_bytes
            recompute_ms += layer.fwd_ms
            inputs = preds[idx] or (_INPUT,)
            producers.update(p for p in inputs if policy.get(p) != "recompute")
    checkpoint = sum(
        profile.input_bytes if p == _INPUT else layers[p].output_bytes for p in producers
    )
    return StageCosts(
        fwd_ms=fwd,
        bwd_ms=bwd,
        recompute_ms=recompute_ms,
        update_ms=update,
        param_bytes=params,
        optimizer_bytes=optimizer_factor * params,
        keep_bytes=keep,
        swap_bytes=swap,
        recompute_bytes=recompute,
        checkpoint_bytes=checkpoint,
        workspace_bytes=workspace,
        input_ms=input_ms,
        weight_ms=weight_ms,
        weight_bytes=weight_bytes,
    )


def boundary_bytes(profile: Profile, layout: StageLayout) -> dict[tuple[int, int], int]:
    """Bytes per micro-batch sent from stage a to a later stage c, keyed (a, c).

    A tensor goes straight from the stage that makes it to each later stage that uses it
    (torchgpipe's portals), once per destination stage however many layers there read it.
    """
    stage_of = layout.stage_of_layer
    senders: dict[tuple[int, int], set[int]] = {}
    for src, succs in enumerate(profile.graph.succs):
        for dst in succs:
            if stage_of[dst] != stage_of[src]:
                senders.setdefault((stage_of[src], stage_of[dst]), set()).add(src)
    return {
        pair: sum(profile.layers[src].output_bytes for src in sources)
        for pair, sources in sorted(senders.items())
    }
