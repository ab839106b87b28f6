"""``deferred_batchnorm``: a pipelined resnet keeps the running statistics of whole-mini-batch
training (torchgpipe's deferred batch norm), and without it does not.

The reference trains in one process on the whole mini-batch at once (all micro-batches
concatenated, one forward and backward per step). Its BatchNorm updates the running
statistics exactly as ``nn.BatchNorm2d`` does on that whole batch, and normalizes each
micro-batch's rows by their own statistics, as a pipeline must (and as torchgpipe does):
normalizing by the whole mini-batch would need every micro-batch before the first could go
on. Tolerance 1e-5 relative, as for the other schedules: the two runs differ only in float32
summation order (convolutions over 2 vs 8 samples, gradients accumulated per micro-batch,
variances merged from micro-batches), which after 4 steps leaves differences near 1e-7.
"""

import functools
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pipestudio.cli import main
from pipestudio.planner import Plan
from pipestudio.runtime import engine
from pipestudio.runtime.engine.checkpoint import read_latest
from pipestudio.runtime.fx_ops import op_spec, source_layer
from pipestudio.runtime.optimizers import make_optimizer
from tests.runtime.engine.helpers import (
    Params,
    builder,
    make_plan,
    max_relative_difference,
    model_args,
    run,
)

STEPS = 4


class _WholeBatchNorm(nn.BatchNorm2d):
    """Running statistics of the whole mini-batch, each micro-batch normalized by its own."""

    chunks = 1

    def forward(self, x: Tensor) -> Tensor:
        assert self.num_batches_tracked is not None
        with torch.no_grad():
            F.batch_norm(
                x,
                self.running_mean,
                self.running_var,
                None,
                None,
                True,
                self.momentum or 0.0,
                self.eps,
            )
            self.num_batches_tracked += 1
        return torch.cat(
            [
                F.batch_norm(part, None, None, self.weight, self.bias, True, 0.0, self.eps)
                for part in x.chunk(self.chunks)
            ]
        )


def _train_whole_batch(plan: Plan, steps: int) -> Params:
    spec = builder("resnet")()
    for _, layer in spec.layers:
        for module in layer.modules():
            if type(module) is nn.BatchNorm2d:
                module.__class__ = _WholeBatchNorm
                module.chunks = plan.num_microbatches  # type: ignore[assignment]
    model = spec.as_module()
    optimizer = make_optimizer(plan.optimizer, list(model.parameters()))
    num_mb = plan.num_microbatches
    for step in range(steps):
        parts = [spec.sample(plan.microbatch_size, step * num_mb + k) for k in range(num_mb)]
        data, targets = (torch.cat(tensors) for tensors in zip(*parts, strict=True))
        spec.loss(model(data), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        f"{name}.{key}": value.detach().clone()
        for name, layer in spec.layers
        for key, value in layer.state_dict().items()
    }


def _final_state(folder: Path, plan: Plan, layer_names: list[str]) -> Params:
    """Parameters and buffers of the latest checkpoint, named ``layer.key``."""
    meta = read_latest(str(folder))
    assert meta is not None
    state: Params = {}
    for stage_idx, stage in enumerate(plan.stages):
        names = [name for name in layer_names if name in stage.layers]
        saved = torch.load(
            folder / meta["path"] / f"stage{stage_idx}-replica0.pt",
            weights_only=False,
            map_location="cpu",
        )["model"]
        for key, value in saved.items():
            pos, _, rest = key.partition(".")
            state[f"{names[int(pos)]}.{rest}"] = value
    return state


def _split(state: Params) -> tuple[Params, Params]:
    """(parameters, running means and variances)."""
    stats = {key: value for key, value in state.items() if ".running_" in key}
    params = {
        key: value
        for key, value in state.items()
        if key not in stats and "num_batches_tracked" not in key
    }
    return params, stats


STAGES_3 = [["stem", "block0"], ["block1"], ["block2", "head"]]


@pytest.mark.parametrize(
    ("schedule", "stages", "policies"),
    [
        ("gpipe", STAGES_3, {}),
        ("1f1b", [["stem", "block0", "block1"], ["block2", "head"]], {"block0": "recompute"}),
    ],
)
def test_deferred_batchnorm_equals_whole_minibatch_training(
    schedule: str, stages: list[list[str]], policies: dict[str, str], tmp_path: Path
) -> None:
    plan = make_plan("resnet", stages, schedule, optimizer="momentum", policies=policies)
    result = run(plan, "resnet", STEPS, tmp_path, deferred_batchnorm=True)
    assert result.ok, result.message
    got = _final_state(tmp_path, plan, builder("resnet")().layer_names)
    expected = _train_whole_batch(plan, STEPS)
    got_params, got_stats = _split(got)
    expected_params, expected_stats = _split(expected)
    assert max_relative_difference(got_stats, expected_stats) <= 1e-5
    assert max_relative_difference(got_params, expected_params) <= 1e-5
    assert all(
        int(value) == STEPS for key, value in got.items() if key.endswith("num_batches_tracked")
    )


def test_without_it_running_statistics_follow_microbatches(tmp_path: Path) -> None:
    plan = make_plan("resnet", STAGES_3, "gpipe", optimizer="momentum")
    result = run(plan, "resnet", STEPS, tmp_path)
    assert result.ok, result.message
    got_params, got_stats = _split(_final_state(tmp_path, plan, builder("resnet")().layer_names))
    expected_params, expected_stats = _split(_train_whole_batch(plan, STEPS))
    assert max_relative_difference(got_params, expected_params) <= 1e-5  # same training
    assert max_relative_difference(got_stats, expected_stats) > 1e-2  # other statistics


def test_the_cli_trains_resnet_operators_with_deferred_batchnorm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        engine, "launch", functools.partial(engine.launch, start_method="forkserver")
    )
    ops = op_spec(builder("resnet")(), 2)
    cut = ops.layer_names.index("block1.bn2")  # block0's output skips to block1.shortcut
    plan = make_plan(
        "resnet", [ops.layer_names[:cut], ops.layer_names[cut:]], "1f1b", optimizer="momentum"
    )
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan.model_dump_json())
    status = main(
        [
            "train",
            "--plan",
            str(plan_path),
            "--model",
            "resnet",
            *(
                arg
                for key, value in model_args("resnet").items()
                for arg in ("--model-arg", f"{key}={value}")
            ),
            "--steps",
            "2",
            "--threads-per-rank",
            "1",
            "--granularity",
            "op",
            "--deferred-batchnorm",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
        ]
    )
    assert status == 0, capsys.readouterr().err
    by_op = _final_state(tmp_path / "ckpt", plan, ops.layer_names)
    rename = {
        f"{name}.{key}": f"{source_layer(piece)}.{key}"
        for name, piece in ops.layers
        for key in piece.state_dict()
    }
    got_params, got_stats = _split({rename[key]: value for key, value in by_op.items()})
    expected_params, expected_stats = _split(_train_whole_batch(plan, 2))
    assert max_relative_difference(got_stats, expected_stats) <= 1e-5
    assert max_relative_difference(got_params, expected_params) <= 1e-5
