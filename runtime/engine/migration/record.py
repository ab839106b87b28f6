"""What a checkpoint keeps of the coordinator's decisions, so that a resumed run takes up
its migrations where the stopped one left them (``coordinator.py``'s docstring says how).

A scripted migration (``--migrate STEP:LAYER@STAGE,...``) is named in a record by its index
among the scripted ones sorted by step, with its step and moves so that a list edited since
can still be matched (``match_record``).
"""

from typing import Any

from pipestudio.planner.formats.plan import Plan
from pipestudio.runtime.engine.migration.settings import ScriptedMigration

#: (the step it is due at, its index among the scripted migrations, the migration)
Scheduled = tuple[int, int, ScriptedMigration]


def match_record(
    scripted: list[Scheduled], recorded: list[dict[str, Any]]
) -> dict[int, dict[str, Any]]:
    """Each scripted migration's entry in a checkpoint's record (by index): the entry of
    its index when it records the same step and moves, else the first unclaimed one that
    does (a list that gained moves shifts the indices)."""
    result: dict[int, dict[str, Any]] = {}
    unclaimed = list(recorded)
    keys = {index: recorded_form(migration) for _, index, migration in scripted}
    for by_index in (True, False):
        for index, key in keys.items():
            if index in result:
                continue
            entry = next(
                (
                    e
                    for e in unclaimed
                    if (e["step"], e["moves"]) == key and (e["index"] == index or not by_index)
                ),
                None,
            )
            if entry is not None:
                result[index] = entry
                unclaimed.remove(entry)
    return result


def command_line_form(migration: ScriptedMigration) -> str:
    """A scripted migration as ``--migrate`` writes it."""
    return f"{migration.step}:" + ",".join(f"{layer}@{stage}" for layer, stage in migration.moves)


def recorded_form(migration: ScriptedMigration) -> tuple[int, list[list[Any]]]:
    """A scripted migration as a checkpoint's record writes it: its step and moves."""
    return migration.step, [list(move) for move in migration.moves]


def already_made(plan: Plan, moves: tuple[tuple[str, int], ...]) -> bool:
    """Whether every (layer, stage) of ``moves`` is already so in ``plan``."""
    stage_of = {name: idx for idx, stage in enumerate(plan.stages) for name in stage.layers}
    return all(stage_of.get(layer) == stage for layer, stage in moves)
