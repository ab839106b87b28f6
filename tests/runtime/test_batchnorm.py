"""Deferred batch normalization (runtime/batchnorm.py): mini-batch running statistics."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pipestudio.runtime.batchnorm import DeferredBatchNorm, defer_batchnorm, recomputation
from pipestudio.runtime.errors import SettingsError


def _microbatches(seed: int, chunks: int = 4) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 5, 5, generator=generator) * 3 + 1 for _ in range(chunks)]


@pytest.mark.parametrize("momentum", [0.1, None])
def test_running_statistics_equal_batchnorm_on_the_whole_minibatch(momentum: float | None) -> None:
    whole = nn.BatchNorm2d(3, momentum=momentum)
    deferred = defer_batchnorm(copy.deepcopy(whole), chunks=4)
    assert isinstance(deferred, DeferredBatchNorm)
    for step in range(3):
        parts = _microbatches(step)
        whole(torch.cat(parts))
        outputs = [deferred(part) for part in parts]
        # each micro-batch is still normalized by its own statistics, as BatchNorm would
        for part, output in zip(parts, outputs, strict=True):
            torch.testing.assert_close(output, nn.BatchNorm2d(3)(part), rtol=0, atol=0)
    # float32 merge of four partial means/variances vs one pass over the whole: ~1e-7
    torch.testing.assert_close(deferred.running_mean, whole.running_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(deferred.running_var, whole.running_var, rtol=1e-6, atol=1e-6)
    assert int(deferred.num_batches_tracked) == int(whole.num_batches_tracked) == 3


def test_nothing_is_committed_before_the_last_microbatch_and_recomputation_is_not_tracked() -> None:
    deferred = DeferredBatchNorm(3, chunks=4)
    parts = _microbatches(0)
    for part in parts[:3]:
        deferred(part)
        with recomputation():
            deferred(part)
    assert torch.equal(deferred.running_mean, torch.zeros(3)) and deferred.tracked == 3
    deferred(parts[3])
    whole = nn.BatchNorm2d(3)
    whole(torch.cat(parts))
    torch.testing.assert_close(deferred.running_mean, whole.running_mean, rtol=1e-6, atol=1e-6)


def test_evaluation_uses_the_running_statistics() -> None:
    deferred = DeferredBatchNorm(3, chunks=1)
    deferred(_microbatches(0)[0])
    deferred.eval()
    x = _microbatches(1)[0]
    expected = F.batch_norm(
        x,
        deferred.running_mean,
        deferred.running_var,
        deferred.weight,
        deferred.bias,
        False,
        0.0,
        deferred.eps,
    )
    torch.testing.assert_close(deferred(x), expected)


def test_conversion_keeps_parameters_buffers_and_state_dict_keys() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 3, 1),
        nn.BatchNorm2d(3),
        nn.Sequential(nn.BatchNorm1d(3, track_running_stats=False)),
    )
    norm = model[1]
    keys = set(model.state_dict())
    converted = defer_batchnorm(model, chunks=2)
    assert converted is model and isinstance(model[1], DeferredBatchNorm)
    assert model[1].weight is norm.weight and model[1].running_mean is norm.running_mean
    assert type(model[2][0]) is nn.BatchNorm1d  # no running statistics to defer
    assert set(model.state_dict()) == keys  # checkpoints stay interchangeable
    with pytest.raises(SettingsError, match="chunks >= 1, got 0"):
        DeferredBatchNorm(3, chunks=0)
