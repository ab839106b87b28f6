"""``dynamic``: a GPT whose blocks switch on and off during training (vPipe's NAS workloads).

vPipe (Zhao et al., TPDS'22) targets training where the active part of a network
changes over time, as in neural architecture search that samples a sub-network of a
super-network, or progressive growing. Here every block keeps its parameters but an inactive
block is the identity, so its stage's work shrinks to almost nothing and the balance of the
pipeline drifts, which is what the online planner must notice and repair.

The schedule changes the active set every ``switch_every`` steps (a phase):
``random`` activates ``num_active`` blocks drawn afresh each phase (a NAS-like sampler);
``grow`` starts with the first ``num_active`` blocks and activates one more per phase.
A new spec has every block active; call ``apply_step(step)`` at the start of each step.
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models.gpt import Block, transformer_spec
from pipestudio.runtime.models.spec import ModelSpec, sample_generator

SCHEDULES: tuple[str, ...] = ("random", "grow")


class SwitchableBlock(Block):
    """A transformer block that is the identity while inactive, keeping its parameters."""

    def __init__(self, width: int, heads: int, mlp_ratio: int = 4):
        super().__init__(width, heads, mlp_ratio)
        self.active = True

    def set_active(self, active: bool) -> None:
        self.active = active

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) if self.active else x

    def extra_repr(self) -> str:
        return f"active={self.active}"


@dataclass(kw_only=True)
class DynamicSpec(ModelSpec):
    """A ``ModelSpec`` whose blocks follow an activation schedule (module docstring)."""

    blocks: list[SwitchableBlock] = field(default_factory=list)
    schedule: str = "random"
    switch_every: int = 5
    num_active: int = 0
    seed: int = 0

    def active_blocks(self, step: int) -> set[int]:
        """Indices of the blocks active at training step ``step`` (0-based)."""
        phase = step // self.switch_every
        num_blocks = len(self.blocks)
        if self.schedule == "grow":
            return set(range(min(num_blocks, self.num_active + phase)))
        order = torch.randperm(
            num_blocks, generator=sample_generator(self.seed, phase, stream="dynamic-schedule")
        )
        return {int(idx) for idx in order[: self.num_active]}

    def apply_step(self, step: int) -> set[int]:
        """Switch every block on or off as the schedule says for ``step``; returns the set."""
        active = self.active_blocks(step)
        for idx, block in enumerate(self.blocks):
            block.set_active(idx in active)
        return active


def dynamic(
    *,
    layers: int = 4,
    width: int = 128,
    heads: int = 4,
    seq_len: int = 64,
    vocab: int = 512,
    mlp_ratio: int = 4,
    schedule: str = "random",
    switch_every: int = 5,
    num_active: int | None = None,
    seed: int = 0,
) -> DynamicSpec:
    """A GPT (see ``gpt``) with switchable blocks; ``num_active`` defaults to half of them."""
    if schedule not in SCHEDULES:
        raise ModelError(
            f"dynamic: schedule {schedule!r} is unknown; expected one of {', '.join(SCHEDULES)}"
        )
    if switch_every < 1:
        raise ModelError(f"dynamic: switch_every must be >= 1 step, got {switch_every}")
    num_active = max(1, layers // 2) if num_active is None else num_active
    if not 0 <= num_active <= layers:
        raise ModelError(
            f"dynamic: num_active must be between 0 and layers ({layers}), got {num_active}"
        )
    base = transformer_spec(
        "dynamic",
        SwitchableBlock,
        layers=layers,
        width=width,
        heads=heads,
        seq_len=seq_len,
        vocab=vocab,
        mlp_ratio=mlp_ratio,
        seed=seed,
    )
    blocks = [module for _, module in base.layers if isinstance(module, SwitchableBlock)]
    config = {
        **base.config,
        "schedule": schedule,
        "switch_every": switch_every,
        "num_active": num_active,
    }
    return DynamicSpec(
        name=base.name,
        layers=base.layers,
        sample=base.sample,
        loss=base.loss,
        config=config,
        blocks=blocks,
        schedule=schedule,
        switch_every=switch_every,
        num_active=num_active,
        seed=seed,
    )
