"""``gpt``: a decoder-only transformer (GPT-2 layout) cut into embedding, blocks and head.

Layers: ``embed`` (token + learned positional embedding), ``block{i}`` (pre-LN causal
self-attention and MLP, each with a residual), ``head`` (final LayerNorm and the LM head).
Data are random token ids; the targets are the same sequence shifted by one token. There is
no dropout, so a pipeline run and the single-process reference compute the same numbers.
"""

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models.spec import ModelSpec, sample_generator, seeded


class Embedding(nn.Module):
    """Token ids (batch, seq) -> embeddings (batch, seq, width), positions added."""

    def __init__(self, vocab: int, width: int, seq_len: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(positions)


class CausalSelfAttention(nn.Module):
    """Multi-head attention where a position sees only itself and earlier positions."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        # Written without reading shapes or iterating a tensor, so torch.fx can trace it
        # (``--granularity op``): (batch, seq, width) -> (batch, heads, seq, width / heads).
        q, k, v = self.qkv(x).chunk(3, dim=2)
        q, k, v = (t.unflatten(2, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).flatten(2))


class Block(nn.Module):
    """One transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits."""

    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, x: Tensor) -> Tensor:
        return self.lm_head(self.ln(x))


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross entropy over every position of the micro-batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def transformer_spec(
    name: str,
    block_type: Callable[[int, int, int], nn.Module],
    *,
    layers: int,
    width: int,
    heads: int,
    seq_len: int,
    vocab: int,
    mlp_ratio: int,
    seed: int,
) -> ModelSpec:
    """The GPT layer list with blocks made by ``block_type(width, heads, mlp_ratio)``."""
    for arg, value in (
        ("layers", layers),
        ("width", width),
        ("heads", heads),
        ("seq_len", seq_len),
        ("vocab", vocab),
        ("mlp_ratio", mlp_ratio),
    ):
        if value < 1:
            raise ModelError(f"{name}: {arg} must be >= 1, got {value}")
    if width % heads:
        raise ModelError(f"{name}: width {width} is not divisible by heads {heads}")
    with seeded(seed):
        model_layers: list[tuple[str, nn.Module]] = [("embed", Embedding(vocab, width, seq_len))]
        model_layers += [
            (f"block{idx}", block_type(width, heads, mlp_ratio)) for idx in range(layers)
        ]
        model_layers.append(("head", Head(width, vocab)))

    def sample(microbatch_size: int, index: int) -> tuple[Tensor, Tensor]:
        tokens = torch.randint(
            0, vocab, (microbatch_size, seq_len + 1), generator=sample_generator(seed, index)
        )
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    config: dict[str, int | float | str | bool] = {
        "layers": layers,
        "width": width,
        "heads": heads,
        "seq_len": seq_len,
        "vocab": vocab,
        "mlp_ratio": mlp_ratio,
        "seed": seed,
    }
    return ModelSpec(name=name, layers=model_layers, sample=sample, loss=lm_loss, config=config)


def gpt(
    *,
    layers: int = 4,
    width: int = 128,
    heads: int = 4,
    seq_len: int = 64,
    vocab: int = 512,
    mlp_ratio: int = 4,
    seed: int = 0,
) -> ModelSpec:
    """A GPT with ``layers`` blocks of ``width`` channels; see the module docstring."""
    return transformer_spec(
        "gpt",
        Block,
        layers=layers,
        width=width,
        heads=heads,
        seq_len=seq_len,
        vocab=vocab,
        mlp_ratio=mlp_ratio,
        seed=seed,
    )
