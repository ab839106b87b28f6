"""Running the engine from tests: tiny plans, a forked job, its final parameters."""

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pipestudio.planner import Plan, parse_document
from pipestudio.runtime.engine import EngineConfig, TrainResult, launch
from pipestudio.runtime.engine.checkpoint import read_latest
from pipestudio.runtime.models import MODELS, ModelSpec
from tests.runtime.helpers import TINY

Params = dict[str, torch.Tensor]


def model_args(name: str) -> dict[str, str]:
    return {key: str(value) for key, value in TINY[name].items()}


def builder(name: str, **changes: Any) -> Callable[[], ModelSpec]:
    return partial(MODELS[name], **{**TINY[name], **changes})


def make_plan(
    model: str,
    stages: list[list[str]],
    schedule: str,
    *,
    replicas: list[int] | None = None,
    num_microbatches: int = 4,
    microbatch_size: int = 2,
    optimizer: str = "adam",
    policies: dict[str, str] | None = None,
    vertical_sync: bool = False,
    precision: str = "fp32",
    virtual_stages: int = 1,
) -> Plan:
    replicas = replicas or [1] * len(stages)
    return parse_document(
        Plan,
        {
            "model": model,
            "schedule": schedule,
            "vertical_sync": vertical_sync,
            "virtual_stages": virtual_stages,
            "num_microbatches": num_microbatches,
            "microbatch_size": microbatch_size,
            "optimizer": optimizer,
            "policies": policies or {},
            "precision": precision,
            "stages": [
                {"layers": layers, "replicas": r}
                for layers, r in zip(stages, replicas, strict=True)
            ],
        },
    )


def run(
    plan: Plan,
    model: str,
    steps: int,
    folder: Path,
    sink: Callable[[dict[str, Any]], None] | None = None,
    **settings: Any,
) -> TrainResult:
    """A forked job with one thread per rank that checkpoints into ``folder``."""
    start_method = settings.pop("start_method", "forkserver")
    changes = settings.pop("model_changes", {})
    config = EngineConfig(
        plan=plan,
        model=model,
        model_args={**model_args(model), **{k: str(v) for k, v in changes.items()}},
        steps=steps,
        threads_per_rank=1,
        checkpoint_dir=str(folder),
        timeout_s=settings.pop("timeout_s", 15.0),
        **settings,
    )
    return launch(config, sink, start_method=start_method)


def final_params(folder: Path, plan: Plan, layer_names: list[str]) -> Params:
    """Every parameter of the latest checkpoint, named ``layer.param`` as in the model."""
    meta = read_latest(str(folder))
    assert meta is not None, f"no checkpoint in {folder}"
    params: Params = {}
    for stage_idx, stage in enumerate(plan.stages):
        names = [name for name in layer_names if name in stage.layers]
        state = torch.load(
            folder / meta["path"] / f"stage{stage_idx}-replica0.pt",
            weights_only=False,
            map_location="cpu",
        )
        for key, value in state["model"].items():
            pos, _, rest = key.partition(".")
            full = f"{names[int(pos)]}.{rest}"
            if "running_" not in rest and "num_batches" not in rest:
                params[full] = value
    return params


def max_relative_difference(got: Params, expected: Params) -> float:
    """The largest ``|got - expected| / |expected|`` (Frobenius norms) over the tensors."""
    assert set(got) == set(expected), set(got) ^ set(expected)
    return max(
        float((got[k] - expected[k]).norm() / expected[k].norm().clamp_min(1e-12)) for k in expected
    )
