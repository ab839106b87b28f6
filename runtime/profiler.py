"""The layer profiler: measures a ``ModelSpec`` layer by layer into a planner ``Profile``.

As PipeDream's profiler does (Narayanan et al. SOSP'19, §3.1), each layer is timed alone
on its real input, which is what the partitioners need: per-layer forward and backward
time, the bytes of its output (what crosses a stage boundary), of its parameters, and of
what it keeps for its backward (``activation_memory.py`` says exactly what is counted).

Layers are profiled one at a time in topological order. Each is copied to the device,
measured, and dropped; its output is kept only until its last reader has been measured.
So a model that does not fit one device whole can still be profiled on it, and the user's
modules are never moved, trained or touched: BatchNorm's running statistics change only
in the copies. Data is micro-batch 0 of ``spec.sample``.

With ``granularity="op"`` the spec is first cut into its tensor operators (``fx_ops.py``,
DawnPiper's fine-grained graph) and every operator is measured as a layer, so a planner can
cut inside what the model calls a layer; what an operator saves of its inputs is charged
to the operator that made them (``profiler_ops.py``).
"""

import copy
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from pipestudio.planner import Edge, Layer, Profile
from pipestudio.runtime.activation_memory import (
    count_saved_bytes,
    measure_workspace_bytes,
    tensor_bytes,
)
from pipestudio.runtime.backward_split import (
    WeightWork,
    capturing,
    input_half,
    weight_half,
    weight_modules,
)
from pipestudio.runtime.devices import describe_device, resolve_device, synchronize
from pipestudio.runtime.errors import SettingsError
from pipestudio.runtime.fx_ops import (
    GRANULARITIES,
    Granularity,
    op_description,
    op_kind,
    op_spec,
)
from pipestudio.runtime.models.spec import DATA, ModelSpec
from pipestudio.runtime.optimizers import OPTIMIZERS, make_optimizer
from pipestudio.runtime.precision import autocast_dtype, forwards, matmuls
from pipestudio.runtime.profiler_ops import SavedInputs
from pipestudio.runtime.timing import median_ms, nothing

_CUDA_WORKSPACE = (
    "peak of torch.cuda.max_memory_allocated over a forward and backward, less "
    "what was allocated before and the output and saved bytes"
)


@dataclass(frozen=True)
class ProfileSettings:
    """How every layer is measured."""

    device: torch.device
    dtype: torch.dtype
    warmup: int
    repeats: int
    optimizer: str
    granularity: Granularity = "layer"
    precision: str = "fp32"  # ``runtime/precision.py``


def profile_model(
    spec: ModelSpec,
    microbatch_size: int,
    device: str | torch.device = "cpu",
    warmup: int = 2,
    repeats: int = 5,
    dtype: torch.dtype = torch.float32,
    *,
    optimizer: str = "adam",
    threads: int | None = None,
    granularity: Granularity = "layer",
    precision: str = "fp32",
) -> Profile:
    """Measure every layer of ``spec`` at ``microbatch_size`` samples per micro-batch.

    Times are medians of ``repeats`` runs after ``warmup`` runs. ``threads`` sets torch's
    CPU thread count for the measurement (restored afterwards); None leaves it as it is.
    ``granularity="op"`` measures every tensor operator instead (``fx_ops.op_spec``).
    ``precision`` is the arithmetic measured (``runtime/precision.py``): bf16 and fp16
    autocast the forwards over ``dtype`` (float32) weights, so times, saved and output
    bytes are what autocast makes. On a CPU the profile also carries the peak TFLOP/s
    measured before the layers, on the same threads (``measured_peak_tflops``).
    """
    _check_settings(microbatch_size, warmup, repeats, optimizer, threads)
    if autocast_dtype(precision) is not None and dtype != torch.float32:
        raise SettingsError(
            f"precision {precision!r} autocasts over float32 weights; the "
            f"weights cannot also be {str(dtype).removeprefix('torch.')}"
        )
    if granularity not in GRANULARITIES:
        raise SettingsError(
            f"granularity {granularity!r} is unknown; expected one of {', '.join(GRANULARITIES)}"
        )
    if granularity == "op":
        spec = op_spec(spec, microbatch_size)
    settings = ProfileSettings(
        resolve_device(device), dtype, warmup, repeats, optimizer, granularity, precision
    )
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        data, _ = spec.sample(microbatch_size, 0)
        data = _to_device(data, settings)
        with torch.enable_grad(), matmuls(precision):
            peak = measured_peak_tflops(precision) if settings.device.type == "cpu" else None
            layers = profile_layers(spec, data, settings)
        edges = spec.edges()
        return Profile(
            model=spec.name,
            microbatch_size=microbatch_size,
            dtype=str(dtype).removeprefix("torch."),
            precision=precision,
            device=describe_device(settings.device),
            peak_tflops=peak,
            input_bytes=tensor_bytes(data),
            layers=layers,
            edges=None if edges is None else [Edge(src=src, dst=dst) for src, dst in edges],
            metadata=_metadata(spec, settings),
        )
    finally:
        torch.set_num_threads(previous_threads)


#: The matmul that measures a CPU's peak: at 512 x 512 the cores' vector units are already
#: near their best (about 90 GFLOP/s per core in float32 and 220 in bfloat16 on the
#: machines this was written on, within 5% of 1024 x 1024), for a few milliseconds a try.
PEAK_MATMUL = 512
PEAK_TRIES = 3


def measured_peak_tflops(precision: str) -> float:
    """The best TFLOP/s of a few ``PEAK_MATMUL``-square CPU matmuls in the dtype the
    precision's matmuls run in (float32 for fp32 and tf32), on torch's current threads:
    the denominator of a CPU's model FLOP utilisation (``planner/simulator/peaks.py``)."""
    dtype = autocast_dtype(precision) or torch.float32
    size = PEAK_MATMUL
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(dtype)
    b = torch.randn(size, size, generator=generator).to(dtype)
    best = math.inf
    for attempt in range(PEAK_TRIES + 1):
        start = time.perf_counter()
        torch.mm(a, b)
        if attempt:  # the first warms up
            best = min(best, time.perf_counter() - start)
    return 2 * size**3 / max(best, 1e-9) / 1e12


def median_profile(profiles: list[Profile]) -> Profile:
    """One profile of several measurements of the same model taken at once: each layer's
    forward, backward and update the median over them. The ranks of a run compute at the
    same time on cores that share caches and memory bandwidth; a model profiled by as many
    processes at once is timed as they will run it (docs/benchmarks.md, "Simulator
    fidelity")."""
    first = profiles[0]
    names = [layer.name for layer in first.layers]
    if any([layer.name for layer in p.layers] != names for p in profiles):
        raise SettingsError("the profiles to merge are not of the same layers")
    layers = []
    for idx, layer in enumerate(first.layers):
        update: dict[str, float | None] = {
            field: statistics.median(getattr(p.layers[idx], field) for p in profiles)
            for field in ("fwd_ms", "bwd_ms", "update_ms")
        }
        for field in ("bwd_input_ms", "bwd_weight_ms"):
            measured = [v for p in profiles if (v := getattr(p.layers[idx], field)) is not None]
            update[field] = statistics.median(measured) if measured else None
        layers.append(layer.model_copy(update=update))
    metadata = {**first.metadata, "profiled_together": len(profiles)}
    return first.model_copy(update={"layers": layers, "metadata": metadata})


def profile_layers(spec: ModelSpec, data: Tensor, settings: ProfileSettings) -> list[Layer]:
    """Every layer measured on the outputs of the layers it reads (see module docstring)."""
    graph = spec.graph_inputs()
    readers_left = Counter(src for sources in graph.values() for src in sources)
    activations: dict[str, Tensor] = {DATA: data}
    measured: list[Layer] = []
    saved_inputs = SavedInputs(data) if settings.granularity == "op" else None
    for layer_name, module in spec.layers:
        inputs = [_layer_input(activations[src], src) for src in graph[layer_name]]
        layer = copy.deepcopy(module).to(device=settings.device, dtype=settings.dtype).train()
        result, output = profile_layer(layer_name, layer, inputs, settings)
        measured.append(result)
        activations[layer_name] = output.detach()
        if saved_inputs is not None:
            saved_inputs.record(layer_name, layer, inputs, activations[layer_name])
        for src in graph[layer_name]:
            readers_left[src] -= 1
            if readers_left[src] == 0:
                del activations[src]
    return measured if saved_inputs is None else saved_inputs.charged(measured)


def profile_layer(
    layer_name: str, layer: nn.Module, inputs: list[Tensor], settings: ProfileSettings
) -> tuple[Layer, Tensor]:
    """One layer's measurements, and its output from the first forward (before any update)."""
    with forwards(settings.precision, settings.device):
        output, saved_bytes = count_saved_bytes(layer, inputs)
    output_bytes = tensor_bytes(output)

    def forward(_: object) -> Tensor:
        with forwards(settings.precision, settings.device):
            return layer(*inputs)

    fwd_ms = median_ms(
        forward, nothing, settings.device, warmup=settings.warmup, repeats=settings.repeats
    )
    bwd_ms, workspace_bytes, halves = 0.0, 0, None
    fwd_flops, bwd_flops = count_flops(layer, inputs, settings)
    if output.requires_grad:
        bwd_ms, workspace_bytes = _measure_backward(
            layer,
            inputs,
            torch.ones_like(output),
            settings,
            output_bytes=output_bytes,
            saved_bytes=saved_bytes,
        )
        halves = _measure_halves(layer, inputs, torch.ones_like(output), settings)
    result = Layer(
        name=layer_name,
        kind=op_kind(layer) or type(layer).__name__,
        fwd_ms=fwd_ms,
        bwd_ms=bwd_ms,
        param_bytes=sum(tensor_bytes(p) for p in layer.parameters()),
        saved_bytes=saved_bytes,
        output_bytes=output_bytes,
        workspace_bytes=workspace_bytes,
        update_ms=_measure_update(layer, settings),
        fwd_flops=fwd_flops,
        bwd_flops=bwd_flops,
        description=op_description(layer) or describe_module(layer),
        bwd_input_ms=None if halves is None else halves[0],
        bwd_weight_ms=None if halves is None else halves[1],
    )
    return result, output


def count_flops(
    layer: nn.Module, inputs: list[Tensor], settings: ProfileSettings
) -> tuple[int, int]:
    """The layer's forward and backward FLOPs on ``inputs``, as PyTorch's FLOP counter
    counts them from the shapes of the ops that run (in the profile's precision; an op it
    has no formula for counts 0). The backward is towards the inputs that ask for a
    gradient and the parameters, as in a stage (``autograd.grad``: no ``.grad`` is
    touched)."""
    with FlopCounterMode(display=False) as counter, forwards(settings.precision, settings.device):
        output = layer(*inputs)
    fwd_flops = counter.get_total_flops()
    bwd_flops = 0
    wrt = [x for x in inputs if x.requires_grad]
    wrt += [p for p in layer.parameters() if p.requires_grad]
    if output.requires_grad and wrt:
        with FlopCounterMode(display=False) as counter:
            torch.autograd.grad(output, wrt, torch.ones_like(output), allow_unused=True)
        bwd_flops = counter.get_total_flops()
    return int(fwd_flops), int(bwd_flops)


def _measure_backward(
    layer: nn.Module,
    inputs: list[Tensor],
    grad_output: Tensor,
    settings: ProfileSettings,
    *,
    output_bytes: int,
    saved_bytes: int,
) -> tuple[float, int]:
    """Backward milliseconds (each run after a fresh, untimed forward) and workspace bytes.

    Gradients flow to the inputs that ask for one and to the parameters, as in a stage.
    """
    wrt = [x for x in inputs if x.requires_grad]
    wrt += [p for p in layer.parameters() if p.requires_grad]

    def forward() -> Tensor:
        for x in inputs:
            x.grad = None  # each micro-batch sends a fresh input gradient upstream
        with forwards(settings.precision, settings.device):
            return layer(*inputs)

    def backward(output: Tensor) -> None:
        torch.autograd.backward(output, grad_output, inputs=wrt)

    bwd_ms = median_ms(
        backward, forward, settings.device, warmup=settings.warmup, repeats=settings.repeats
    )
    workspace_bytes = measure_workspace_bytes(
        lambda: backward(forward()),
        settings.device,
        output_bytes=output_bytes,
        saved_bytes=saved_bytes,
    )
    return bwd_ms, workspace_bytes


def _measure_halves(
    layer: nn.Module, inputs: list[Tensor], grad_output: Tensor, settings: ProfileSettings
) -> tuple[float, float] | None:
    """Milliseconds of the input and weight halves of the backward, as a zero-bubble
    schedule runs them (``runtime/backward_split.py``): per repeat a fresh forward
    (untimed), the input half, then the weight half, each timed. None for a layer without
    parameters that take a gradient."""
    modules = weight_modules(layer)
    if not modules:
        return None
    wanted = [x for x in inputs if x.requires_grad]
    input_times: list[float] = []

    def halved() -> WeightWork:
        work = WeightWork()
        with forwards(settings.precision, settings.device), capturing(modules, work):
            output = layer(*inputs)
        synchronize(settings.device)
        start = time.perf_counter()
        input_half([output], [grad_output], wanted, work)
        synchronize(settings.device)
        input_times.append((time.perf_counter() - start) * 1e3)
        return work

    weight_ms = median_ms(
        weight_half, halved, settings.device, warmup=settings.warmup, repeats=settings.repeats
    )
    return statistics.median(input_times[settings.warmup :]), weight_ms


def _measure_update(layer: nn.Module, settings: ProfileSettings) -> float:
    """Optimizer step milliseconds over the parameters the backward gave a gradient; 0 when
    there are none (no parameters, or an inactive block that did not use them)."""
    params = [p for p in layer.parameters() if p.grad is not None]
    if not params:
        return 0.0
    step = make_optimizer(settings.optimizer, params).step
    return median_ms(
        lambda _: step(), nothing, settings.device, warmup=settings.warmup, repeats=settings.repeats
    )


def describe_module(module: nn.Module, max_chars: int = 120) -> str:
    """A one-line repr: the class and its children's classes, or a leaf's settings."""
    children = [type(child).__name__ for child in module.children()]
    text = f"{type(module).__name__}({', '.join(children) if children else module.extra_repr()})"
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def _layer_input(activation: Tensor, src: str) -> Tensor:
    """A leaf that asks for its gradient, as a stage's received activation does; the data
    and integer inputs (token ids) need none."""
    if src == DATA or not activation.is_floating_point():
        return activation
    return activation.detach().requires_grad_(True)


def _to_device(data: Tensor, settings: ProfileSettings) -> Tensor:
    dtype = settings.dtype if data.is_floating_point() else data.dtype
    return data.to(device=settings.device, dtype=dtype)


def _metadata(spec: ModelSpec, settings: ProfileSettings) -> dict[str, str | int | float | bool]:
    on_cuda = settings.device.type == "cuda"
    metadata: dict[str, str | int | float | bool] = {
        "profiler": "pipestudio.runtime.profiler",
        "torch": torch.__version__,
        "warmup": settings.warmup,
        "repeats": settings.repeats,
        "statistic": "median",
        "timer": "torch.cuda.Event" if on_cuda else "time.perf_counter",
        "optimizer": settings.optimizer,
        "granularity": settings.granularity,
        "grad_output": "ones",
        "workspace_bytes": _CUDA_WORKSPACE if on_cuda else "not measured on CPU: reported as 0",
    }
    metadata.update({f"config.{key}": value for key, value in spec.config.items()})
    return metadata


def _check_settings(
    microbatch_size: int, warmup: int, repeats: int, optimizer: str, threads: int | None
) -> None:
    if microbatch_size < 1:
        raise SettingsError(f"micro-batch size must be >= 1, got {microbatch_size}")
    if repeats < 1:
        raise SettingsError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise SettingsError(f"warmup must be >= 0, got {warmup}")
    if threads is not None and threads < 1:
        raise SettingsError(f"threads must be >= 1, got {threads}")
    if optimizer not in OPTIMIZERS:
        raise SettingsError(
            f"optimizer {optimizer!r} is unknown; expected one of {', '.join(OPTIMIZERS)}"
        )
