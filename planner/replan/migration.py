"""What a repartition must send between devices, and how long that takes.

vPipe (Zhao et al., TPDS'22) migrates a layer between stages by sending its state to
the new stage while training goes on. The state of a layer on a worker is its parameters,
their gradients and its optimizer state (``OPTIMIZER_STATE_FACTOR`` bytes per parameter
byte); under ``pipedream`` the old stage also holds one stashed weight version per
micro-batch in flight besides the live weights (PipeDream §3.3), which the micro-batches
still in flight need for their backward, so those move too. Activations are not counted:
the synchronous schedules migrate at a flush, when none are in flight.

Replica j of the new stage receives from replica j mod r of the old one (r its replicas).
Transfers between different (sender, receiver) device pairs run in parallel; those of one
pair run one after another; a transfer to the same device or over a level without a
bandwidth is free. So the migration takes as long as the busiest pair, and nothing without
a cluster. Contention between pairs that share a physical link is not modelled.
"""

from dataclasses import dataclass

from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.plan import OPTIMIZER_STATE_FACTOR, Plan
from pipestudio.planner.formats.profile import Profile
from pipestudio.planner.formats.proposal import LayerMove, MigrationBreakdown, Transfer
from pipestudio.planner.units import transfer_ms


@dataclass(frozen=True)
class Migration:
    """The layer moves between two plans of one model and what they send."""

    moves: list[LayerMove]
    breakdown: MigrationBreakdown
    transfers: list[Transfer]

    @property
    def total_bytes(self) -> int:
        return sum(transfer.transfer_bytes for transfer in self.transfers)

    @property
    def duration_ms(self) -> float:
        """The busiest device pair's transfers, one after another (module docstring)."""
        per_pair: dict[tuple[int, int], float] = {}
        for transfer in self.transfers:
            pair = (transfer.from_device, transfer.to_device)
            per_pair[pair] = per_pair.get(pair, 0.0) + transfer.transfer_ms
        return max(per_pair.values(), default=0.0)


def layer_moves(profile: Profile, current: Plan, new: Plan) -> list[LayerMove]:
    """Layers whose stage index differs between the plans, in the profile's layer order."""
    before = {name: idx for idx, stage in enumerate(current.stages) for name in stage.layers}
    after = {name: idx for idx, stage in enumerate(new.stages) for name in stage.layers}
    return [
        LayerMove(layer=layer.name, from_stage=before[layer.name], to_stage=after[layer.name])
        for layer in profile.layers
        if before[layer.name] != after[layer.name]
    ]


def plan_migration(
    profile: Profile, current: Plan, new: Plan, cluster: Cluster | None
) -> Migration:
    """The moves from ``current`` to ``new`` (same stages, replicas and devices) and their
    transfers (module docstring)."""
    moves = layer_moves(profile, current, new)
    factor = OPTIMIZER_STATE_FACTOR[current.optimizer]
    devices = current.worker_devices()
    params = {layer.name: layer.param_bytes for layer in profile.layers}
    grouped: dict[tuple[int, int, int, int], list[str]] = {}
    kinds = {"parameter": 0, "gradient": 0, "optimizer": 0, "weight_version": 0}
    for move in moves:
        src, dst = move.from_stage, move.to_stage
        stashed = stashed_versions(current, src)
        for replica, to_device in enumerate(devices[dst]):
            from_device = devices[src][replica % len(devices[src])]
            grouped.setdefault((src, dst, from_device, to_device), []).append(move.layer)
            kinds["parameter"] += params[move.layer]
            kinds["gradient"] += params[move.layer]
            kinds["optimizer"] += factor * params[move.layer]
            kinds["weight_version"] += stashed * params[move.layer]
    transfers = []
    for (src, dst, from_device, to_device), names in grouped.items():
        per_param = 2 + factor + stashed_versions(current, src)
        num_bytes = per_param * sum(params[name] for name in names)
        bandwidth = None if cluster is None else cluster.bandwidth_gbps(from_device, to_device)
        transfers.append(
            Transfer(
                from_stage=src,
                to_stage=dst,
                from_device=from_device,
                to_device=to_device,
                layers=names,
                transfer_bytes=num_bytes,
                transfer_ms=transfer_ms(num_bytes, bandwidth),
            )
        )
    breakdown = MigrationBreakdown(
        parameter_bytes=kinds["parameter"],
        gradient_bytes=kinds["gradient"],
        optimizer_bytes=kinds["optimizer"],
        weight_version_bytes=kinds["weight_version"],
    )
    return Migration(moves, breakdown, transfers)


def stashed_versions(plan: Plan, stage_idx: int) -> int:
    """Weight versions a replica of the stage keeps besides its live weights: one per
    micro-batch in flight after the first under ``pipedream`` (its warm-up forwards),
    none otherwise."""
    return plan.warmup_forwards(stage_idx) if plan.schedule == "pipedream" else 0
