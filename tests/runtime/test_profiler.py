"""The layer profiler's Profile: valid, faithful to the spec, exact in its sizes."""

import json

import pytest
import torch

from pipestudio.planner import Profile
from pipestudio.runtime.activation_memory import tensor_bytes
from pipestudio.runtime.errors import DeviceError, SettingsError
from pipestudio.runtime.models import DynamicSpec, ModelSpec
from pipestudio.runtime.profiler import median_profile, profile_model
from tests.runtime.helpers import TINY, layer_outputs, tiny

MICROBATCH = 4
QUICK = {"warmup": 1, "repeats": 2, "threads": 1}
#: The profiles the module's timing checks read: medians of five, since they compare
#: times of sub-millisecond ops, and with two a single preempted run (the suite runs in
#: two processes) moves the median by half.
PROFILED = {**QUICK, "repeats": 5}


@pytest.fixture(scope="module", params=["mlp", "unet", "resnet"])
def profiled(request: pytest.FixtureRequest) -> tuple[ModelSpec, Profile]:
    spec = tiny(request.param)
    return spec, profile_model(spec, MICROBATCH, **PROFILED)


def test_profile_is_a_valid_document(profiled: tuple[ModelSpec, Profile]) -> None:
    spec, profile = profiled
    again = Profile.model_validate(json.loads(profile.to_json()))
    assert again == profile
    assert profile.model == spec.name and profile.microbatch_size == MICROBATCH
    assert profile.dtype == "float32" and profile.device == "cpu (1 thread)"
    assert profile.metadata["torch"] == torch.__version__
    assert profile.metadata["repeats"] == PROFILED["repeats"]
    assert profile.metadata["warmup"] == 1
    assert profile.metadata["config.seed"] == 0


def test_layers_and_edges_follow_the_spec(profiled: tuple[ModelSpec, Profile]) -> None:
    spec, profile = profiled
    assert [layer.name for layer in profile.layers] == spec.layer_names
    assert [layer.kind for layer in profile.layers] == [
        type(module).__name__ for _, module in spec.layers
    ]
    edges = spec.edges()
    if edges is None:
        assert profile.edges is None
    else:
        assert [(e.src, e.dst) for e in profile.edges or []] == edges


def test_sizes_are_exact(profiled: tuple[ModelSpec, Profile]) -> None:
    spec, profile = profiled
    data, _ = spec.sample(MICROBATCH, 0)
    outputs = layer_outputs(spec, data)
    assert profile.input_bytes == tensor_bytes(data)
    for (name, module), layer in zip(spec.layers, profile.layers, strict=True):
        assert layer.param_bytes == sum(
            p.numel() * p.element_size() for p in module.parameters()
        ), name
        assert layer.output_bytes == tensor_bytes(outputs[name]), name
        assert layer.workspace_bytes == 0  # not measured on CPU


def test_times_are_positive(profiled: tuple[ModelSpec, Profile]) -> None:
    _, profile = profiled
    for layer in profile.layers:
        assert layer.fwd_ms > 0 and layer.bwd_ms > 0, layer.name
        assert (layer.update_ms > 0) == (layer.param_bytes > 0), layer.name


def test_the_backward_is_split_into_its_weight_half(
    profiled: tuple[ModelSpec, Profile],
) -> None:
    """Both halves measured for every layer with parameters (``backward_split.py``, as
    the engine runs them); none without, whose backward is all input half."""
    _, profile = profiled
    for layer in profile.layers:
        if layer.param_bytes:
            assert layer.bwd_weight_ms is not None and layer.bwd_input_ms is not None
            assert layer.bwd_weight_ms > 0 and layer.bwd_input_ms >= 0, layer.name
            # split, the halves cost about what one backward does (cold caches: more)
            assert layer.bwd_input_ms + layer.bwd_weight_ms < 3 * layer.bwd_ms + 1, layer.name
        else:
            assert layer.bwd_weight_ms is None and layer.weight_grad_ms == 0, layer.name
            assert layer.input_grad_ms == layer.bwd_ms
    merged = median_profile([profile, profile])
    assert [(layer.bwd_input_ms, layer.bwd_weight_ms) for layer in merged.layers] == [
        (layer.bwd_input_ms, layer.bwd_weight_ms) for layer in profile.layers
    ]


def test_saved_bytes_of_a_linear_gelu_block() -> None:
    spec = tiny("mlp")
    profile = profile_model(spec, MICROBATCH, **QUICK)
    width = int(TINY["mlp"]["width"])
    # GELU keeps its input (the Linear's output); the block's own input and weights are out.
    assert profile.layers[0].saved_bytes == MICROBATCH * width * 4
    assert profile.layers[-1].name == "head" and profile.layers[-1].saved_bytes == 0


def test_rescaled_profile_scales_activations_not_parameters() -> None:
    profile = profile_model(tiny("mlp"), MICROBATCH, **QUICK)
    double = profile.rescaled(2 * MICROBATCH)
    for small, big in zip(profile.layers, double.layers, strict=True):
        assert big.output_bytes == 2 * small.output_bytes
        assert big.saved_bytes == 2 * small.saved_bytes
        assert big.param_bytes == small.param_bytes
        assert big.fwd_ms == pytest.approx(2 * small.fwd_ms)
    assert double.input_bytes == 2 * profile.input_bytes


def test_dtype_sets_the_bytes() -> None:
    spec = tiny("mlp")
    single = profile_model(spec, MICROBATCH, **QUICK)
    double = profile_model(spec, MICROBATCH, dtype=torch.float64, **QUICK)
    assert double.dtype == "float64" and double.input_bytes == 2 * single.input_bytes
    assert [2 * layer.param_bytes for layer in single.layers] == [
        layer.param_bytes for layer in double.layers
    ]


def test_bf16_autocast_measures_half_width_activations_over_fp32_weights() -> None:
    """mlp's blocks are Linear then GELU: under bf16 autocast the Linear runs in 16 bits
    and GELU keeps its input's dtype, so each block's output bytes halve; the weights (and
    so the parameter bytes) stay float32, as in mixed-precision training."""
    spec = tiny("mlp")
    fp32 = profile_model(spec, MICROBATCH, **QUICK)
    bf16 = profile_model(spec, MICROBATCH, precision="bf16", **QUICK)
    assert (fp32.precision, bf16.precision) == ("fp32", "bf16")
    assert bf16.dtype == "float32" and bf16.input_bytes == fp32.input_bytes
    for full, half in zip(fp32.layers[:-1], bf16.layers[:-1], strict=True):
        assert half.output_bytes * 2 == full.output_bytes, full.name
        assert half.param_bytes == full.param_bytes
    with pytest.raises(
        SettingsError, match="autocasts over float32 weights; the weights cannot also be float16"
    ):
        profile_model(spec, MICROBATCH, dtype=torch.float16, precision="bf16", **QUICK)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_flops_are_the_matmuls_of_each_pass(precision: str) -> None:
    """A Linear of i inputs and o outputs on n samples: the forward is 2 n i o FLOPs, the
    backward as much for the weights' gradient and as much again for the input's, which
    block0 (it reads the data, which asks for no gradient) does not compute. The count
    depends on shapes, not on the precision."""
    spec = tiny("mlp")
    shape = TINY["mlp"]
    num, inp, width = MICROBATCH, int(shape["in_features"]), int(shape["width"])
    profile = profile_model(spec, MICROBATCH, precision=precision, **QUICK)
    block0, block1 = profile.layers[0], profile.layers[1]
    assert (block0.fwd_flops, block0.bwd_flops) == (2 * num * inp * width,) * 2
    assert (block1.fwd_flops, block1.bwd_flops) == (
        2 * num * width * width,
        4 * num * width * width,
    )
    assert profile.rescaled(2 * MICROBATCH).layers[1].fwd_flops == 2 * block1.fwd_flops


def test_a_cpu_profile_carries_its_measured_peak_for_mfu() -> None:
    """The profiler times the CPU's matmuls once, on its threads, in the precision's dtype;
    the simulator's model FLOP utilisation divides by it (a device the table lacks has
    none otherwise)."""
    from pipestudio.planner import plan_template, simulate

    profile = profile_model(tiny("mlp"), MICROBATCH, **QUICK)
    assert profile.peak_tflops is not None and 0.001 < profile.peak_tflops < 100
    result = simulate(profile, plan_template(profile, 2, 4, "1f1b"))
    assert result.mfu == pytest.approx(result.model_tflops / (2 * profile.peak_tflops))
    unknown = profile.model_copy(update={"peak_tflops": None})
    assert simulate(unknown, plan_template(profile, 2, 4, "1f1b")).mfu is None


def test_the_users_model_is_left_untouched() -> None:
    spec = tiny("resnet")
    spec.as_module().eval()
    before = {
        f"{name}.{key}": value.clone()
        for name, module in spec.layers
        for key, value in module.state_dict().items()
    }
    profile_model(spec, MICROBATCH, optimizer="sgd", **QUICK)
    after = {
        f"{name}.{key}": value
        for name, module in spec.layers
        for key, value in module.state_dict().items()
    }
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert all(not module.training for _, module in spec.layers)
    assert all(p.grad is None for _, module in spec.layers for p in module.parameters())


def test_an_inactive_block_costs_no_memory_and_no_update() -> None:
    spec = tiny("dynamic")
    assert isinstance(spec, DynamicSpec)
    spec.blocks[0].set_active(False)
    block = profile_model(spec, MICROBATCH, **QUICK).layers[1]
    assert block.name == "block0" and block.param_bytes > 0
    assert block.saved_bytes == 0 and block.update_ms == 0


def test_threads_are_restored() -> None:
    threads = torch.get_num_threads()
    profile_model(tiny("mlp"), 1, warmup=0, repeats=1, threads=1)
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({"microbatch_size": 0}, SettingsError, "micro-batch size must be >= 1, got 0"),
        ({"repeats": 0}, SettingsError, "repeats must be >= 1, got 0"),
        ({"optimizer": "rmsprop"}, SettingsError, "optimizer 'rmsprop' is unknown"),
        ({"device": "tpu"}, DeviceError, "device 'tpu' is not understood"),
        ({"device": "meta"}, DeviceError, "device 'meta' is not supported"),
    ],
)
def test_bad_settings_are_named(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    settings: dict[str, object] = {"microbatch_size": 1, **kwargs}
    with pytest.raises(error, match=message):
        profile_model(tiny("mlp"), **settings)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_named() -> None:
    with pytest.raises(DeviceError, match="device 'cuda' was requested but CUDA is not"):
        profile_model(tiny("mlp"), 1, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_profile_measures_workspace() -> None:
    spec = tiny("gpt")
    profile = profile_model(spec, MICROBATCH, device="cuda", warmup=1, repeats=3)
    assert profile.device.startswith(torch.cuda.get_device_name())
    assert profile.metadata["timer"] == "torch.cuda.Event"
    assert all(layer.fwd_ms > 0 and layer.bwd_ms > 0 for layer in profile.layers)
    assert any(layer.workspace_bytes > 0 for layer in profile.layers)
    assert profile.layers[1].saved_bytes > 0
    assert next(spec.layers[0][1].parameters()).device.type == "cpu"


def test_profiles_taken_at_once_merge_by_each_layers_median() -> None:
    def measured(scale: float, names: tuple[str, ...] = ("a", "b")) -> Profile:
        return Profile.model_validate(
            {
                "model": "m",
                "microbatch_size": 1,
                "layers": [
                    {
                        "name": name,
                        "fwd_ms": scale * (i + 1),
                        "bwd_ms": 2 * scale,
                        "update_ms": scale,
                        "output_bytes": 8,
                    }
                    for i, name in enumerate(names)
                ],
            }
        )

    merged = median_profile([measured(1.0), measured(5.0), measured(2.0)])
    assert [layer.fwd_ms for layer in merged.layers] == [2.0, 4.0]
    assert [layer.bwd_ms for layer in merged.layers] == [4.0, 4.0]
    assert merged.metadata["profiled_together"] == 3
    with pytest.raises(SettingsError, match="not of the same layers"):
        median_profile([measured(1.0), measured(1.0, ("a", "c"))])
