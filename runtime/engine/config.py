"""What a training run needs: the plan, the model, how long, and where results go.

``build_model`` turns the run's model into what the plan's stages hold: with
``granularity="op"`` the model cut into tensor operators (``runtime/fx_ops.py``), so a plan
made from an operator-level profile names its layers; with ``deferred_batchnorm`` every
BatchNorm tracks running statistics over a stage replica's micro-batches of a step
(``runtime/batchnorm.py``).

``on_nonfinite_loss``: ``"fail"`` (the default) ends the job at the first step whose loss
is NaN or infinite, naming the step and the stage (``errors.NonFiniteLoss``), where a
diverged run would otherwise train on NaN weights to the end and checkpoint them.
``"continue"`` trains on and reports the loss as it is.

``loss_scale`` and ``loss_scale_growth_interval``: an ``fp16`` plan's dynamic loss scaling
starts at that scale and doubles it after that many steps in a row without an overflow
(``execution/scaling.py``; GradScaler's defaults).
"""

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from pipestudio.planner.formats.plan import Plan
from pipestudio.runtime.batchnorm import defer_batchnorm
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.execution.scaling import GROWTH_INTERVAL, INIT_SCALE
from pipestudio.runtime.engine.migration.settings import MigrationSettings, check_replicas
from pipestudio.runtime.engine.ops import Op
from pipestudio.runtime.fx_ops import GRANULARITIES, Granularity, op_spec
from pipestudio.runtime.models import MODELS, ModelSpec, load_model
from pipestudio.runtime.models.loading import import_factory

#: Called by every rank before each of its ops with (rank, op); tests use it to kill or
#: stall a rank at a chosen point. It must be picklable (a module-level function).
OpHook = Callable[[int, Op], None]
#: Called by every rank before each update's overflow check with (rank, step, this rank's
#: parameters by ``layer.param``); tests use it to inject an overflowing gradient. Picklable.
UpdateHook = Callable[[int, int, Mapping[str, torch.nn.Parameter]], None]
DeviceKind = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[DeviceKind, ...] = get_args(DeviceKind)
OnNonfiniteLoss = Literal["fail", "continue"]
ON_NONFINITE_LOSS: tuple[OnNonfiniteLoss, ...] = get_args(OnNonfiniteLoss)


@dataclass
class EngineConfig:
    """A training run. ``steps`` counts from the start of training, so a resumed run with
    the same ``steps`` finishes the job; ``checkpoint_every`` 0 saves at the end only."""

    plan: Plan
    model: str
    model_args: dict[str, str] = field(default_factory=dict)
    steps: int = 1
    lr: float | None = None
    threads_per_rank: int | None = None
    metrics_path: str | None = None
    trace_path: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    seed: int | None = None
    device: DeviceKind = "auto"
    timeout_s: float = 20.0
    before_op: OpHook | None = None
    migration: MigrationSettings | None = None
    granularity: Granularity = "layer"
    deferred_batchnorm: bool = False
    on_nonfinite_loss: OnNonfiniteLoss = "fail"
    loss_scale: float = INIT_SCALE
    loss_scale_growth_interval: int = GROWTH_INTERVAL
    before_update: UpdateHook | None = None

    def check(self) -> None:
        """Raise ``EngineError`` naming the first bad setting."""
        for name, value, low in (
            ("steps", self.steps, 1),
            ("checkpoint_every", self.checkpoint_every, 0),
        ):
            if value < low:
                raise EngineError(f"{name} must be >= {low}, got {value}")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise EngineError(f"threads per rank must be >= 1, got {self.threads_per_rank}")
        if self.lr is not None and not self.lr > 0:
            raise EngineError(f"the learning rate must be > 0, got {self.lr}")
        if self.timeout_s <= 0:
            raise EngineError(f"the timeout must be > 0 seconds, got {self.timeout_s}")
        if self.device not in DEVICES:
            raise EngineError(
                f"device {self.device!r} is unknown; expected one of {', '.join(DEVICES)}"
            )
        if self.plan.interleaved and self.plan.num_workers < 2:
            raise EngineError(
                "interleaved-1f1b needs 2 or more devices to train (its chunks alternate "
                f"between devices); this plan has {self.plan.num_workers}"
            )
        if self.plan.interleaved and self.plan.precision == "fp16":
            raise EngineError(
                "the plan's precision 'fp16' needs a loss scale that all stages agree on "
                "once per step, which interleaved-1f1b does not do yet: train it in bf16 or "
                "fp32"
            )
        if self.plan.precision == "fp16" and self.plan.schedule == "pipedream":
            raise EngineError(
                "the plan's precision 'fp16' needs a loss scale that all "
                "stages agree on once per step, which schedule 'pipedream' "
                "(an update per micro-batch) has not: train it in bf16, or "
                "fp16 with gpipe or 1f1b"
            )
        if not (math.isfinite(self.loss_scale) and self.loss_scale > 0):
            raise EngineError(f"the loss scale must be a finite number > 0, got {self.loss_scale}")
        if self.loss_scale_growth_interval < 1:
            raise EngineError(
                f"the loss scale's growth interval must be >= 1 step, got "
                f"{self.loss_scale_growth_interval}"
            )
        if self.granularity not in GRANULARITIES:
            raise EngineError(
                f"granularity {self.granularity!r} is unknown; expected one of "
                f"{', '.join(GRANULARITIES)}"
            )
        if self.on_nonfinite_loss not in ON_NONFINITE_LOSS:
            raise EngineError(
                f"on_nonfinite_loss {self.on_nonfinite_loss!r} is unknown; "
                f"expected one of {', '.join(ON_NONFINITE_LOSS)}"
            )
        if (self.resume or self.checkpoint_every) and not self.checkpoint_dir:
            raise EngineError("--resume and --checkpoint-every need --checkpoint-dir")
        if self.migration is not None:
            self.migration.check()
            if self.migration.enabled:
                check_replicas(self.plan)
                if self.plan.schedule in ("zero-bubble", "interleaved-1f1b"):
                    raise EngineError(
                        f"live migration is not available under schedule "
                        f"{self.plan.schedule!r} (a rank's ops of one micro-batch are not "
                        "contiguous there); train it without --migrate, or migrate a 1f1b run"
                    )


def build_model(config: EngineConfig) -> ModelSpec:
    """The model with the run's arguments (``seed`` goes to a factory that takes one), at
    the run's granularity and with its BatchNorm setting (module docstring)."""
    args = dict(config.model_args)
    if config.seed is not None and "seed" not in args:
        factory = MODELS[config.model] if config.model in MODELS else import_factory(config.model)
        if "seed" in inspect.signature(factory).parameters:
            args["seed"] = str(config.seed)
    spec = load_model(config.model, args)
    if config.granularity == "op":
        spec = op_spec(spec, config.plan.microbatch_size)
    if config.deferred_batchnorm:
        _defer_batchnorm(spec, config.plan)
    return spec


def _defer_batchnorm(spec: ModelSpec, plan: Plan) -> None:
    """Each replica of a stage runs ``num_microbatches / replicas`` micro-batches a step."""
    replicas = {name: stage.replicas for stage in plan.stages for name in stage.layers}
    spec.layers = [
        (name, defer_batchnorm(module, plan.num_microbatches // replicas.get(name, 1)))
        for name, module in spec.layers
    ]
