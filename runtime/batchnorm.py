"""Deferred batch normalization: BatchNorm's running statistics over a whole mini-batch.

A pipeline feeds a BatchNorm layer one micro-batch at a time, so a plain ``nn.BatchNorm``
updates its running mean and variance once per micro-batch, from a few samples each: after
a step they differ from what training on the whole mini-batch gives, and the model
evaluated later is not the model trained without pipelining. torchgpipe's deferred batch
normalization (Kim et al. 2020, §3.4) fixes this: each micro-batch is still normalized by
its own statistics (normalizing by the whole mini-batch's would have to wait for all of
its micro-batches, which is what a pipeline avoids), but the running statistics are only
accumulated, and committed once ``chunks`` micro-batches have passed, from the statistics
of all of them together, exactly as one ``nn.BatchNorm`` forward over the concatenated
mini-batch would update them (``num_batches_tracked`` counts mini-batches).

The per-micro-batch means and variances are merged with Chan et al.'s pairwise update
(1979), which stays accurate where ``E[x^2] - E[x]^2`` would cancel. A forward repeated by
a recomputation (``recomputation()``, entered by the engine's recompute policy) is not
counted again.
"""

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from pipestudio.runtime.errors import SettingsError

_RECOMPUTING = contextvars.ContextVar("pipestudio_recomputing", default=False)


@contextlib.contextmanager
def recomputation() -> Iterator[None]:
    """Inside this block forwards are recomputations: deferred BatchNorm does not track them."""
    token = _RECOMPUTING.set(True)
    try:
        yield
    finally:
        _RECOMPUTING.reset(token)


class DeferredBatchNorm(_BatchNorm):
    """BatchNorm whose running statistics follow mini-batches of ``chunks`` micro-batches."""

    acc_mean: Tensor
    acc_m2: Tensor

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        chunks: int = 1,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats=True)
        if chunks < 1:
            raise SettingsError(f"deferred BatchNorm needs chunks >= 1, got {chunks}")
        self.chunks = chunks
        self.tracked = 0
        assert self.running_mean is not None
        self.register_buffer("acc_mean", torch.zeros_like(self.running_mean), persistent=False)
        self.register_buffer("acc_m2", torch.zeros_like(self.running_mean), persistent=False)
        self.acc_count = 0

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of 2 or more dimensions, got {input.dim()}")

    def forward(self, input: Tensor) -> Tensor:
        if not self.training:
            return super().forward(input)
        if not _RECOMPUTING.get():
            self._track(input)
            if self.tracked == self.chunks:
                self._commit()
        return F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)

    def _track(self, input: Tensor) -> None:
        """Merge this micro-batch's per-channel mean and M2 into the accumulators."""
        with torch.no_grad():
            dims = [dim for dim in range(input.dim()) if dim != 1]
            count = input.numel() // input.shape[1]
            x = input.detach().to(self.acc_mean.dtype)
            var, mean = torch.var_mean(x, dim=dims, correction=0)
            total = self.acc_count + count
            delta = mean - self.acc_mean
            self.acc_mean += delta * (count / total)
            self.acc_m2 += var * count + delta.square() * (self.acc_count * count / total)
            self.acc_count = total
            self.tracked += 1

    def _commit(self) -> None:
        """Update the running statistics from the accumulated mini-batch, as BatchNorm does."""
        assert self.running_mean is not None and self.running_var is not None
        assert self.num_batches_tracked is not None
        with torch.no_grad():
            self.num_batches_tracked += 1
            factor = (
                1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            )
            unbiased = self.acc_m2 / max(self.acc_count - 1, 1)
            self.running_mean.mul_(1 - factor).add_(self.acc_mean, alpha=factor)
            self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
            self.acc_mean.zero_()
            self.acc_m2.zero_()
        self.acc_count = 0
        self.tracked = 0

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, chunks={self.chunks}"


def defer_batchnorm(module: nn.Module, chunks: int) -> nn.Module:
    """``module`` with every BatchNorm that tracks running statistics replaced, in place, by
    a ``DeferredBatchNorm`` sharing its parameters and buffers; returns ``module``, or its
    replacement when ``module`` is itself a BatchNorm. ``SyncBatchNorm`` is left alone."""
    if isinstance(module, _BatchNorm) and _convertible(module):
        return _deferred(module, chunks)
    for name, child in list(module.named_children()):
        replacement = defer_batchnorm(child, chunks)
        if replacement is not child:
            setattr(module, name, replacement)
    return module


def _convertible(norm: _BatchNorm) -> bool:
    return norm.track_running_stats and not isinstance(norm, DeferredBatchNorm | nn.SyncBatchNorm)


def _deferred(norm: _BatchNorm, chunks: int) -> DeferredBatchNorm:
    deferred = DeferredBatchNorm(norm.num_features, norm.eps, norm.momentum, norm.affine, chunks)
    if norm.affine:
        deferred.weight, deferred.bias = norm.weight, norm.bias
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        deferred.register_buffer(name, getattr(norm, name))
    assert norm.running_mean is not None
    deferred.acc_mean = torch.zeros_like(norm.running_mean)
    deferred.acc_m2 = torch.zeros_like(norm.running_mean)
    return deferred.train(norm.training)
