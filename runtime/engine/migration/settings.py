"""What a job may repartition, and how: settings, scripted moves, and checked new plans.

A repartition of a running job keeps its stages, replicas, devices, schedule and
micro-batches and changes only which stage holds which layer (and, from the online
planner, layers' memory policies). ``new_plan`` builds the plan after a set of moves and
checks it against the model; ``parse_migration`` reads the scripted form
``STEP:LAYER@STAGE[,LAYER@STAGE...]`` of ``pipestudio train --migrate``.

Replicated stages are refused: a job with a stage of more than one replica cannot be
repartitioned live (``MigrationError`` names the stage). Moving a layer to a replicated
stage would have to split its optimizer state among replicas whose micro-batches
interleave with the migration's, which this runtime does not do.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipestudio.planner.formats.plan import Plan
from pipestudio.runtime.engine.errors import EngineError


class MigrationError(EngineError):
    """A repartition request that cannot be carried out (the message says why)."""


@dataclass(frozen=True)
class ScriptedMigration:
    """Moves to apply so that micro-batches of ``step`` onwards run on the new partition."""

    step: int
    moves: tuple[tuple[str, int], ...]  # (layer, destination stage)


@dataclass
class MigrationSettings:
    """Live repartitioning of a run (docs/runtime.md, "Live repartition").

    ``migrations`` are applied at their steps; ``control_dir`` is the command channel
    (``coordinator.py``); with ``every`` > 0 the online planner runs on the measurements of every
    ``every`` steps and applies a worthwhile proposal itself (``auto``) or holds it for
    approval. ``payback_steps`` and ``min_gain_fraction`` are ``replan``'s hysteresis.
    """

    migrations: list[ScriptedMigration] = field(default_factory=list)
    control_dir: str | None = None
    every: int = 0
    auto: bool = False
    payback_steps: float = 100.0
    min_gain_fraction: float = 0.05
    cluster_path: str | None = None

    def check(self) -> None:
        if self.every < 0:
            raise MigrationError(f"--repartition-every must be >= 0, got {self.every}")
        if self.auto and self.every == 0:
            raise MigrationError("--auto-repartition needs --repartition-every N > 0")
        for migration in self.migrations:
            if migration.step < 1:
                raise MigrationError(
                    f"a migration at step {migration.step}: migrations "
                    "take effect at step 1 or later"
                )

    @property
    def enabled(self) -> bool:
        return bool(self.migrations or self.control_dir or self.every)


def parse_migration(text: str) -> ScriptedMigration:
    """``STEP:LAYER@STAGE[,LAYER@STAGE...]``, e.g. ``4:block2@1,block5@3``."""
    step_text, sep, spec = text.partition(":")
    if not sep or not step_text.strip().isdigit():
        raise MigrationError(
            f"--migrate {text!r}: expected STEP:LAYER@STAGE[,...], e.g. 4:block2@1"
        )
    moves = []
    for item in spec.split(","):
        layer, at, stage = item.strip().rpartition("@")
        if not at or not layer or not stage.isdigit():
            raise MigrationError(f"--migrate {text!r}: move {item!r} is not LAYER@STAGE")
        moves.append((layer, int(stage)))
    return ScriptedMigration(int(step_text), tuple(moves))


def check_replicas(plan: Plan) -> None:
    """Refuse plans with replicated stages (module docstring)."""
    for idx, stage in enumerate(plan.stages):
        if stage.replicas > 1:
            raise MigrationError(
                f"stage {idx} has {stage.replicas} replicas: live "
                "repartition supports one replica per stage only"
            )


def new_plan(plan: Plan, moves: Sequence[tuple[str, int]], layer_names: Sequence[str]) -> Plan:
    """``plan`` with each (layer, stage) move applied; stages keep model order."""
    check_replicas(plan)
    stage_of = {name: idx for idx, stage in enumerate(plan.stages) for name in stage.layers}
    for layer, stage_idx in moves:
        if layer not in stage_of:
            raise MigrationError(
                f"cannot move layer {layer!r}: the model's layers are {', '.join(layer_names)}"
            )
        if not 0 <= stage_idx < plan.num_stages:
            raise MigrationError(
                f"cannot move layer {layer!r} to stage {stage_idx}: the "
                f"plan has stages 0..{plan.num_stages - 1}"
            )
        stage_of[layer] = stage_idx
    return with_stages(
        plan,
        [[name for name in layer_names if stage_of[name] == idx] for idx in range(plan.num_stages)],
    )


def with_stages(
    plan: Plan, layers: Sequence[Sequence[str]], policies: Mapping[str, str] | None = None
) -> Plan:
    """``plan`` with these layers per stage (and policies); an empty stage is refused."""
    for idx, names in enumerate(layers):
        if not names:
            raise MigrationError(f"the repartition leaves stage {idx} without layers")
    stages = [
        stage.model_copy(update={"layers": list(names)})
        for stage, names in zip(plan.stages, layers, strict=True)
    ]
    update: dict[str, object] = {"stages": stages}
    if policies is not None:
        update["policies"] = dict(policies)
    return plan.model_copy(update=update)


def moved_layers(old: Plan, new: Plan) -> list[tuple[str, int, int]]:
    """(layer, from stage, to stage) of every layer whose stage differs."""
    before = {name: idx for idx, stage in enumerate(old.stages) for name in stage.layers}
    after = {name: idx for idx, stage in enumerate(new.stages) for name in stage.layers}
    return [(name, before[name], after[name]) for name in before if before[name] != after[name]]
