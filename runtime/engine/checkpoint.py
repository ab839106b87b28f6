"""Checkpoints: every stage replica's state at a flushed step boundary, to resume exactly.

Layout of ``DIR``::

    DIR/latest.json                     {"step": S, "path": "step-0000S", ...}
    DIR/step-0000S/stage{s}-replica{r}.pt

Each rank writes its own file (``torch.save`` to a temporary name, then an atomic rename):
the stage's parameters and buffers, the optimizer state, the next step (the data position:
micro-batch ``step * num_microbatches`` comes next), the random states of torch (CPU and
CUDA) and of Python, and an fp16 run's loss scale (``execution/scaling.py``). Rank 0 writes
``latest.json`` once every rank has written its file, then removes the previous step's
directory, so a crash at any moment leaves a complete checkpoint behind. ``latest.json``
also records the plan and the model, and a resume that differs in either is refused,
except that a plan repartitioned live (other layers per stage, other policies) resumes
with the checkpoint's partition (``resume_plan``); and the live repartition's
coordinator state: which migrations were in effect at the step and which are queued or due
(``repartition``, ``control.Coordinator.record``). Synchronous schedules are flushed after
every step; a ``pipedream`` stream is cut at every checkpoint (``ops.segments``), so no
micro-batch is in flight and no stashed weight version needs saving.
"""

import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipestudio.planner.formats.plan import Plan
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.execution.scaling import LossScaler


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def save_rank(
    root: str,
    step: int,
    stage_idx: int,
    replica: int,
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    device: torch.device,
    loss_scaler: LossScaler | None = None,
) -> None:
    folder = _step_dir(Path(root), step)
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step,
        "model": module.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "python_rng": random.getstate(),
        "loss_scaler": None if loss_scaler is None else loss_scaler.state_dict(),
    }
    path = folder / f"stage{stage_idx}-replica{replica}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def publish(
    root: str,
    step: int,
    plan: Plan,
    model: str,
    model_args: dict[str, str],
    repartition: dict[str, Any] | None = None,
) -> None:
    """Rank 0, once every rank has saved ``step``: point ``latest.json`` at it (with the
    live repartition's record, ``control.Coordinator.record``, when it has one)."""
    root_path = Path(root)
    previous = read_latest(root)
    meta: dict[str, Any] = {
        "step": step,
        "path": _step_dir(root_path, step).name,
        "model": model,
        "model_args": model_args,
        "plan": json.loads(plan.to_json()),
        "saved_at": time.time(),
    }
    if repartition is not None:
        meta["repartition"] = repartition
    tmp = root_path / "latest.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2), encoding="utf-8")
    tmp.replace(root_path / "latest.json")
    if previous is not None and previous["step"] != step:
        shutil.rmtree(root_path / previous["path"], ignore_errors=True)


def read_latest(root: str) -> dict[str, Any] | None:
    path = Path(root) / "latest.json"
    if not path.exists():
        return None
    meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return meta


def _skeleton(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan without what a live repartition changes: stages' layers and policies."""
    stages = [{k: v for k, v in stage.items() if k != "layers"} for stage in plan["stages"]]
    return {**{k: v for k, v in plan.items() if k != "policies"}, "stages": stages}


def resume_plan(root: str, plan: Plan) -> Plan:
    """The plan a resumed run continues with: the checkpoint's when it is ``plan``
    repartitioned (the run migrated layers live before it stopped), else ``plan`` (which
    ``check_compatible`` then judges)."""
    meta = read_latest(root)
    if meta is None:
        return plan
    ours = json.loads(plan.to_json())
    if meta["plan"] != ours and _skeleton(meta["plan"]) == _skeleton(ours):
        return Plan.model_validate(meta["plan"])
    return plan


def check_compatible(root: str, plan: Plan, model: str, model_args: dict[str, str]) -> int:
    """The step the checkpoint in ``root`` resumes at (0 when there is none)."""
    meta = read_latest(root)
    if meta is None:
        return 0
    if meta["model"] != model or meta["model_args"] != model_args:
        raise EngineError(
            f"the checkpoint in {root} is of model {meta['model']!r} "
            f"{meta['model_args']}, not {model!r} {model_args}"
        )
    if meta["plan"] != json.loads(plan.to_json()):
        raise EngineError(
            f"the checkpoint in {root} was made with another plan; resume "
            "with the plan it was made with"
        )
    step: int = meta["step"]
    return step


def load_rank(
    root: str,
    stage_idx: int,
    replica: int,
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    device: torch.device,
    loss_scaler: LossScaler | None = None,
) -> int:
    """Restore this rank's state (and fp16's loss scale); the step to continue at."""
    meta = read_latest(root)
    assert meta is not None
    path = Path(root) / meta["path"] / f"stage{stage_idx}-replica{replica}.pt"
    # tensors and plain data only: a checkpoint directory is shared, and a pickle that
    # runs code is not what any rank wrote
    state = torch.load(path, map_location=device, weights_only=True)
    module.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"].cpu())
    if state["cuda_rng"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), device)
    random.setstate(state["python_rng"])
    if loss_scaler is not None and state.get("loss_scaler") is not None:
        loss_scaler.load_state_dict(state["loss_scaler"])
    step: int = state["step"]
    return step
