"""Single-process references the engine is held to, written apart from the engine's code.

``train_single``: plain training of the whole model, micro-batch by micro-batch with
accumulated gradients and one optimizer step per mini-batch (what gpipe and 1f1b must
equal). ``train_pipedream``: an emulation of PipeDream's weight stashing (§3.3): every stage
keeps its own live weights and optimizer and runs its ops in its ``worker_order``; a
forward runs on a copy of the stage's weights taken then (or, with vertical sync, on the
copy of the version stage 0 used for that micro-batch), its backward computes the gradient
on that copy and the stage applies it to its live weights. Ops run in any order consistent
with the data dependencies: each stage's state evolves only through its own op sequence.
"""

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

from pipestudio.planner import Plan
from pipestudio.planner.simulator.schedule import FORWARD, worker_order
from pipestudio.runtime.models import DATA, ModelSpec
from pipestudio.runtime.optimizers import make_optimizer

Params = dict[str, Tensor]

#: How close a bf16 pipeline must come to its single-process autocast reference. bf16 keeps
#: 8 significant bits: one rounding of a value is up to 2^-9 = 0.2% off, and a pipeline that
#: rounded anything differently from the single process (another order of a sum inside a
#: 16-bit op, a tensor cast at another point, a gradient sent in another dtype) would be off
#: by that much in the weights' updates. Both run the same autocast ops on the same float32
#: weights and add float32 gradients in the same micro-batch order, so they agree far closer
#: (to the bit on the test runs): the bound is 100 x fp32's rounding, far below one bf16
#: rounding, and the tests check that the same training in float32 lies more than 100 x the
#: bound away, so a pipeline that silently trained in fp32 fails them.
BF16_TOLERANCE = 1e-5


def _optimizer(plan: Plan, params: list[nn.Parameter], lr: float | None) -> torch.optim.Optimizer:
    optimizer = make_optimizer(plan.optimizer, params)
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    return optimizer


def layer_params(spec: ModelSpec) -> Params:
    return {
        f"{name}.{key}": value.detach().clone()
        for name, module in spec.layers
        for key, value in module.named_parameters()
    }


_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(plan: Plan) -> torch.autocast:
    """CPU autocast in the plan's 16-bit dtype; disabled for fp32 and tf32."""
    dtype = _AUTOCAST.get(plan.precision)
    return torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)


def train_single(
    build: Callable[[], ModelSpec], plan: Plan, steps: int, lr: float | None = None
) -> Params:
    """Plain training; a bf16 or fp16 plan's forwards (loss included) run under CPU
    autocast over the float32 weights, as mixed-precision training does (``autocast``)."""
    params, _ = _train(build, plan, steps, lr, torch.amp.GradScaler("cpu", enabled=False))
    return params


#: Called before each update of ``train_scaled`` with (step, parameters by ``layer.param``).
Poison = Callable[[int, dict[str, nn.Parameter]], None]


def train_scaled(
    build: Callable[[], ModelSpec],
    plan: Plan,
    steps: int,
    init_scale: float,
    growth_interval: int,
    poison: Poison | None = None,
) -> tuple[Params, list[tuple[float, bool]]]:
    """``train_single`` for an fp16 plan with ``torch.amp.GradScaler``: the parameters and,
    per step, the scale it ran with and whether its update was skipped (an overflow: the
    only event that lowers the scale)."""
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    return _train(build, plan, steps, None, scaler, poison)


def _train(
    build: Callable[[], ModelSpec],
    plan: Plan,
    steps: int,
    lr: float | None,
    scaler: torch.amp.GradScaler,
    poison: Poison | None = None,
) -> tuple[Params, list[tuple[float, bool]]]:
    """Micro-batch by micro-batch with accumulated gradients and one update per step,
    through ``scaler`` (a disabled one scales nothing and always steps)."""
    spec = build()
    model = spec.as_module()
    named = {
        f"{name}.{key}": param
        for name, module in spec.layers
        for key, param in module.named_parameters()
    }
    optimizer = _optimizer(plan, list(model.parameters()), lr)
    num_mb, size = plan.num_microbatches, plan.microbatch_size
    scales = []
    for step in range(steps):
        for k in range(num_mb):
            data, targets = spec.sample(size, step * num_mb + k)
            with autocast(plan):
                loss = spec.loss(model(data), targets) / num_mb
            scaler.scale(loss).backward()
        if poison is not None:
            poison(step, named)
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        scales.append((scale, scaler.get_scale() < scale))
        optimizer.zero_grad(set_to_none=True)
    return layer_params(spec), scales


class _Stage:
    """One stage of the emulation: live layers, optimizer, op queue, weight history."""

    def __init__(
        self, spec: ModelSpec, plan: Plan, idx: int, num_mb_total: int, lr: float | None
    ) -> None:
        self.names = [name for name in spec.layer_names if name in plan.stages[idx].layers]
        self.live = nn.ModuleDict({name: dict(spec.layers)[name] for name in self.names})
        self.optimizer = _optimizer(plan, list(self.live.parameters()), lr)
        self.ops = worker_order("pipedream", list(range(num_mb_total)), plan.warmup_forwards(idx))
        self.history = [copy.deepcopy(self.live)]  # version v: the weights after v updates
        self.stash: dict[
            int, tuple[nn.ModuleDict, dict[str, Tensor], dict[str, Tensor], Tensor | None]
        ] = {}


def train_pipedream(
    build: Callable[[], ModelSpec], plan: Plan, steps: int, lr: float | None = None
) -> Params:
    spec = build()
    assert all(stage.replicas == 1 for stage in plan.stages)
    inputs = spec.graph_inputs()
    total = steps * plan.num_microbatches
    stages = [_Stage(spec, plan, idx, total, lr) for idx in range(plan.num_stages)]
    stage_of = {name: idx for idx, stage in enumerate(stages) for name in stage.names}
    outputs: dict[tuple[int, str], Tensor] = {}  # (mb, layer) -> activation sent on
    grads: dict[tuple[int, str], list[Tensor]] = {}  # (mb, layer) -> gradients came back
    version0: dict[int, int] = {}
    consumers = {
        name: {
            stage_of[r]
            for r, srcs in inputs.items()
            if name in srcs and stage_of[r] != stage_of[name]
        }
        for name in spec.layer_names
    }
    while any(stage.ops for stage in stages):
        progressed = False
        for idx, stage in enumerate(stages):
            if not stage.ops:
                continue
            kind, mb = stage.ops[0]
            if kind == FORWARD:
                needed = [
                    (mb, src)
                    for name in stage.names
                    for src in inputs[name]
                    if src != DATA and stage_of[src] != idx
                ]
                if any(key not in outputs for key in needed):
                    continue
                _forward(spec, plan, stages, idx, mb, outputs, version0, consumers)
            else:
                needed_grads = [(mb, name) for name in stage.names for _ in consumers[name]]
                if any(len(grads.get(key, [])) < len(consumers[key[1]]) for key in needed_grads):
                    continue
                _backward(stage, mb, grads)
            stage.ops.pop(0)
            progressed = True
        assert progressed, "the emulation deadlocked"
    return layer_params(spec)


def _forward(
    spec: ModelSpec,
    plan: Plan,
    stages: list[_Stage],
    idx: int,
    mb: int,
    outputs: dict[tuple[int, str], Tensor],
    version0: dict[int, int],
    consumers: dict[str, set[int]],
) -> None:
    stage = stages[idx]
    if idx == 0:
        version0[mb] = len(stage.history) - 1
    if plan.vertical_sync:
        weights = copy.deepcopy(stage.history[version0[mb]])
    else:
        weights = copy.deepcopy(stage.live)
    data, targets = spec.sample(plan.microbatch_size, mb)
    inputs = spec.graph_inputs()
    acts: dict[str, Tensor] = {DATA: data}
    received: dict[str, Tensor] = {}
    with autocast(plan):
        for name in stage.names:
            for src in inputs[name]:
                if src not in acts:
                    leaf = outputs[(mb, src)].detach().clone().requires_grad_(True)
                    acts[src] = received[src] = leaf
            acts[name] = weights[name](*(acts[src] for src in inputs[name]))
        loss = None
        if idx == len(stages) - 1:
            loss = spec.loss(acts[spec.layer_names[-1]], targets) / plan.num_microbatches
    for name in stage.names:
        if consumers[name]:
            outputs[(mb, name)] = acts[name]
    sent = {name: acts[name] for name in stage.names if consumers[name]}
    stage.stash[mb] = (weights, received, sent, loss)


def _backward(stage: _Stage, mb: int, grads: dict[tuple[int, str], list[Tensor]]) -> None:
    weights, received, sent, loss = stage.stash.pop(mb)
    roots = [loss] if loss is not None else []
    root_grads: list[Tensor | None] = [None] if loss is not None else []
    for name, tensor in sent.items():
        roots.append(tensor)
        root_grads.append(torch.stack(grads.pop((mb, name))).sum(0))
    torch.autograd.backward(roots, root_grads)
    for src, leaf in received.items():
        grads.setdefault((mb, src), []).append(
            leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        )
    for (name, live), (_, stashed) in zip(
        stage.live.named_parameters(), weights.named_parameters(), strict=True
    ):
        assert name
        live.grad = None if stashed.grad is None else stashed.grad.clone()
    stage.optimizer.step()
    stage.optimizer.zero_grad(set_to_none=True)
    stage.history.append(copy.deepcopy(stage.live))
