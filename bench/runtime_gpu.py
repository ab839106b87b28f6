"""Swap and recompute on a CUDA device: a stage's peak memory and step time beside keeping.

On one GPU this

1. profiles the model on the GPU with the engine's profiler (CUDA events, saved bytes
   counted through ``saved_tensors_hooks``) and writes the profile to ``--out``;
2. measures the host link: pinned copies of 256 MiB device to host and host to device;
3. picks the layers to treat: the set with the fewest saved bytes that still holds at least
   ``--fraction`` (default half) of the stage's saved bytes;
4. trains one GPipe stage holding the whole model (every micro-batch's activations are alive
   at the end of the forward phase: the case swap is for) with each policy variant: ``keep``
   everything, ``swap`` or ``recompute`` the chosen layers, and ``swap-all`` or
   ``recompute-all`` every layer (``swap-all`` pins host memory for every activation of
   all but the last micro-batch, whose backward comes right after it). Variants run one
   after another in ``--rounds`` rounds, the order rotating between rounds, ``--warm-steps``
   untimed steps then ``--steps`` timed ones each; a variant's step time is the median over
   its timed steps of every round, its peak the largest CUDA ``max_memory_allocated`` of the
   stage in any timed step;
5. prints per variant the step time and peak over keep's, with the bytes swapped per step,
   the swap and recompute time the engine measured, the achieved TFLOP/s (the profile's
   model FLOPs per step over the measured step) and the simulator's predictions for the
   same plan from the GPU profile (the host link as measured here) with their errors;
6. with ``--shared``, trains the model as two ``1f1b`` stages that share the one GPU (the
   engine stages their exchanges through pinned host memory and gloo, whose rate between
   two processes is measured at the boundary tensor's size and given the simulator as the
   device's ``staging_gbps``) and prints the measured step beside
   the simulator's prediction of the two stages on one device.

7. with ``--plain``, trains the same model in one process without PipeStudio (the whole
   model as one module, the same micro-batches, autocast, Adam, gradients accumulated over
   the micro-batches, CUDA events around each step) and prints its step time and TFLOP/s
   beside keep's.

``--precision`` (fp32, tf32, bf16, fp16) profiles and trains in that arithmetic
(``runtime/precision.py``); the TFLOP/s are then set beside the device's peak for it
(``planner/simulator/peaks.py``) as the model FLOP utilisation.

Target: swapping at least half of the stage's saved bytes lowers its peak by at least 40%
(peak ratio <= 0.60) and costs at most 10% step time (time ratio <= 1.10). The verdict is
printed for each swap variant; the script exits non-zero when none meets both. Needs CUDA;
``--device cpu`` only checks that the script runs (on CPU nothing is swapped and the peak
is the process's resident set).
"""

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from runtime_fidelity import measure_gloo_gbps

from pipestudio.planner import Plan, Profile, cluster_template, simulate
from pipestudio.planner.formats.documents import PRECISIONS
from pipestudio.planner.simulator.peaks import peak_tflops
from pipestudio.runtime.engine import EngineConfig, launch
from pipestudio.runtime.models import load_model
from pipestudio.runtime.profiler import profile_model

#: Wide blocks and long sequences: compute grows with width squared and saved bytes with
#: width, so at width 4096 a block's forward outlasts copying half its activations.
MODEL_ARGS = {"layers": "2", "width": "4096", "heads": "32", "seq_len": "1024", "vocab": "8192"}
MICROBATCH_SIZE = 8
TIMEOUT_S = 300.0
GIB = 1024**3


def host_link_gbps(num_bytes: int = 256 * 1024**2, repeats: int = 10) -> dict[str, float]:
    """Median Gbit/s of pinned copies device->host and host->device."""
    device = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    rates = {}
    for name, (dst, src) in {"d2h": (host, device), "h2d": (device, host)}.items():
        times = []
        for _ in range(repeats + 2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        rates[name] = num_bytes * 8 / statistics.median(times[2:]) / 1e9
    return rates


def chosen_layers(profile: Profile, fraction: float) -> list[str]:
    """The layers holding the least saved bytes that still make ``fraction`` of the stage's
    (every subset for up to 16 layers; otherwise the largest first)."""
    sizes = {layer.name: layer.saved_bytes for layer in profile.layers}
    need = fraction * sum(sizes.values())
    if len(sizes) <= 16:
        subsets = (
            list(combo)
            for count in range(1, len(sizes) + 1)
            for combo in itertools.combinations(sizes, count)
        )
        fitting = [combo for combo in subsets if sum(sizes[name] for name in combo) >= need]
        return min(fitting, key=lambda combo: (sum(sizes[name] for name in combo), len(combo)))
    chosen, held = [], 0
    for name in sorted(sizes, key=lambda name: -sizes[name]):
        if held >= need:
            break
        chosen.append(name)
        held += sizes[name]
    return chosen


def variants(profile: Profile, fraction: float) -> dict[str, dict[str, str]]:
    half = chosen_layers(profile, fraction)
    every = [layer.name for layer in profile.layers]
    return {
        "keep": {},
        "swap": dict.fromkeys(half, "swap"),
        "recompute": dict.fromkeys(half, "recompute"),
        "recompute-all": dict.fromkeys(every, "recompute"),
        "swap-all": dict.fromkeys(every, "swap"),
    }


def one_stage_plan(profile: Profile, policies: dict[str, str], num_microbatches: int) -> Plan:
    return Plan.model_validate(
        {
            "model": profile.model,
            "schedule": "gpipe",
            "num_microbatches": num_microbatches,
            "microbatch_size": profile.microbatch_size,
            "optimizer": "adam",
            "precision": profile.precision,
            "stages": [{"layers": [layer.name for layer in profile.layers]}],
            "policies": policies,
        }
    )


def shared_plan(profile: Profile, num_microbatches: int) -> Plan:
    """Two ``1f1b`` stages, both on device 0, split where the work halves."""
    names = [layer.name for layer in profile.layers]
    work = [layer.fwd_ms + layer.bwd_ms for layer in profile.layers]
    cut = min(range(1, len(names)), key=lambda k: abs(sum(work[:k]) - sum(work[k:])))
    return Plan.model_validate(
        {
            "model": profile.model,
            "schedule": "1f1b",
            "num_microbatches": num_microbatches,
            "microbatch_size": profile.microbatch_size,
            "optimizer": "adam",
            "precision": profile.precision,
            "stages": [
                {"layers": names[:cut], "devices": [0]},
                {"layers": names[cut:], "devices": [0]},
            ],
        }
    )


def train(
    plan: Plan, model: str, args: dict[str, str], warm_steps: int, num_steps: int, device: str
) -> dict[str, Any]:
    """Timed step times, peak bytes per timed step, and swap/recompute figures."""
    swap_ms: list[float] = []
    recompute_ms: list[float] = []
    peaks: list[int] = []
    swap_bytes: list[int] = []

    def sink(event: dict[str, Any]) -> None:
        if event.get("step", -1) < warm_steps:
            return
        if event["type"] == "memory":
            peaks.append(event["peak_bytes"])
        elif event["type"] == "op" and event["op"] in ("swap_out", "swap_in"):
            swap_ms.append(event["end_ms"] - event["start_ms"])
            swap_bytes.append(event["bytes"] if event["op"] == "swap_out" else 0)
        elif event["type"] == "op" and event["op"] == "recompute":
            recompute_ms.append(event["end_ms"] - event["start_ms"])

    config = EngineConfig(
        plan=plan,
        model=model,
        model_args=args,
        steps=warm_steps + num_steps,
        device=device,
        timeout_s=TIMEOUT_S,
    )
    result = launch(config, sink)
    if not result.ok or result.summary is None:
        raise RuntimeError(f"the engine failed: {result.message}")
    return {
        "step_ms": list(result.summary["step_times_ms"][warm_steps:]),
        "peak_bytes": peaks,
        "swap_gib_per_step": sum(swap_bytes) / GIB / num_steps,
        "swap_ms_per_step": sum(swap_ms) / num_steps,
        "recompute_ms_per_step": sum(recompute_ms) / num_steps,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gpt")
    parser.add_argument(
        "--model-arg",
        action="append",
        default=[],
        help="KEY=VALUE over the default model arguments",
    )
    parser.add_argument("--microbatch-size", type=int, default=MICROBATCH_SIZE)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--variants", default="keep,swap,recompute,swap-all,recompute-all")
    parser.add_argument("--warm-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS)
    parser.add_argument(
        "--shared", action="store_true", help="also train two 1f1b stages sharing the GPU (step 6)"
    )
    parser.add_argument(
        "--plain", action="store_true", help="also train in one process without PipeStudio (step 7)"
    )
    parser.add_argument("--out", default=".pipestudio/bench/gpu")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    if options.device == "cuda" and not torch.cuda.is_available():
        print("skipped: needs a CUDA device (--device cpu checks the script only)")
        return 0
    args = dict(MODEL_ARGS) if options.model == "gpt" else {}
    args.update(item.split("=", 1) for item in options.model_arg)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name() if options.device == "cuda" else "cpu"
    print(
        f"device: {device_name}, torch {torch.__version__}; "
        f"{options.model} {args}, micro-batch size {options.microbatch_size}, "
        f"{options.microbatches} micro-batches, gpipe, one stage, "
        f"{options.precision}",
        flush=True,
    )
    started = time.perf_counter()
    profile = profile_model(
        load_model(options.model, args),
        options.microbatch_size,
        options.device,
        warmup=2,
        repeats=5,
        precision=options.precision,
    )
    (out / "profile.json").write_text(profile.to_json())
    print(
        f"profiled in {time.perf_counter() - started:.1f} s: "
        f"{profile.device}, timer {profile.metadata.get('timer')}"
    )
    for layer in profile.layers:
        print(
            f"  {layer.name:8s} fwd {layer.fwd_ms:8.2f} ms  bwd {layer.bwd_ms:8.2f} ms"
            f"  saved {layer.saved_bytes / GIB:6.2f} GiB  params "
            f"{layer.param_bytes / GIB:6.2f} GiB"
        )
    link = host_link_gbps() if options.device == "cuda" else {"d2h": 100.0, "h2d": 100.0}
    print(
        f"host link: device->host {link['d2h']:.0f} Gbit/s, host->device {link['h2d']:.0f} Gbit/s",
        flush=True,
    )
    cluster = cluster_template([1], [None], host_bandwidth_gbps=min(link.values()), name="one GPU")
    if options.device == "cuda":
        torch.cuda.empty_cache()

    wanted = options.variants.split(",")
    plans = {
        name: one_stage_plan(profile, policies, options.microbatches)
        for name, policies in variants(profile, options.fraction).items()
        if name in wanted
    }
    half = list(plans["swap"].policies) if "swap" in plans else []
    share = sum(layer.saved_bytes for layer in profile.layers if layer.name in half) / sum(
        layer.saved_bytes for layer in profile.layers
    )
    print(f"chosen layers {half}: {share:.0%} of the stage's saved bytes")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in plans}
    names = list(plans)
    for round_idx in range(options.rounds):
        order = names[round_idx % len(names) :] + names[: round_idx % len(names)]
        for name in order:
            run = train(
                plans[name], options.model, args, options.warm_steps, options.steps, options.device
            )
            runs[name].append(run)
            print(
                f"  round {round_idx} {name:14s} step {statistics.median(run['step_ms']):9.1f}"
                f" ms  peak {max(run['peak_bytes']) / GIB:6.2f} GiB",
                flush=True,
            )

    rows = []
    for name, plan in plans.items():
        step_ms = statistics.median(t for run in runs[name] for t in run["step_ms"])
        peak = max(p for run in runs[name] for p in run["peak_bytes"])
        predicted = simulate(profile, plan, cluster, num_steps=1, with_timeline=False)
        rows.append(
            {
                "variant": name,
                "policies": plan.policies,
                "step_ms": step_ms,
                "peak_bytes": peak,
                "spread_ms": [
                    min(t for run in runs[name] for t in run["step_ms"]),
                    max(t for run in runs[name] for t in run["step_ms"]),
                ],
                "swap_gib_per_step": statistics.median(r["swap_gib_per_step"] for r in runs[name]),
                "swap_ms_per_step": statistics.median(r["swap_ms_per_step"] for r in runs[name]),
                "recompute_ms_per_step": statistics.median(
                    r["recompute_ms_per_step"] for r in runs[name]
                ),
                "predicted_step_ms": predicted.step_time_ms,
                "predicted_peak_bytes": predicted.stages[0].peak_bytes,
                "tflops": predicted.model_flops / step_ms / 1e9,
            }
        )
    keep = next(row for row in rows if row["variant"] == "keep")
    for row in rows:
        row["time_ratio"] = row["step_ms"] / keep["step_ms"]
        row["peak_ratio"] = row["peak_bytes"] / keep["peak_bytes"]
        row["predicted_error"] = row["step_ms"] / row["predicted_step_ms"] - 1
    peak = peak_tflops(profile.device, profile.precision)
    shared = shared_run(profile, options, args, cluster) if options.shared else None
    plain = plain_run(options, args) if options.plain else None
    (out / "results.json").write_text(
        json.dumps(
            {
                "device": device_name,
                "torch": torch.__version__,
                "precision": options.precision,
                "model": options.model,
                "model_args": args,
                "host_link_gbps": link,
                "peak_tflops": peak,
                "chosen": half,
                "chosen_share": share,
                "rows": rows,
                "shared": shared,
                "plain": plain,
            },
            indent=1,
        )
    )

    print(
        f"\n{'variant':14s} {'step ms':>9s} {'x keep':>7s} {'peak GiB':>9s} {'x keep':>7s}"
        f" {'swap GiB':>9s} {'swap ms':>8s} {'recomp ms':>9s} {'pred ms':>8s} {'error':>7s}"
        f" {'pred GiB':>8s} {'TFLOP/s':>8s} {'MFU':>6s}"
    )
    for row in rows:
        mfu = "-" if not peak else f"{row['tflops'] / peak:.1%}"
        print(
            f"{row['variant']:14s} {row['step_ms']:9.1f} {row['time_ratio']:7.3f}"
            f" {row['peak_bytes'] / GIB:9.2f} {row['peak_ratio']:7.3f}"
            f" {row['swap_gib_per_step']:9.2f} {row['swap_ms_per_step']:8.1f}"
            f" {row['recompute_ms_per_step']:9.1f} {row['predicted_step_ms']:8.1f}"
            f" {row['predicted_error']:+7.1%} {row['predicted_peak_bytes'] / GIB:8.2f}"
            f" {row['tflops']:8.1f} {mfu:>6s}"
        )
    if shared is not None:
        print(
            f"two 1f1b stages sharing the GPU {shared['layers']} (gloo between them "
            f"{shared['staging_gbps']:.1f} Gbit/s at {shared['boundary_bytes']} B): measured "
            f"{shared['step_ms']:.1f} ms, predicted {shared['predicted_step_ms']:.1f} ms "
            f"({shared['predicted_error']:+.1%}); as two devices "
            f"{shared['apart_step_ms']:.1f} ms"
        )
    if plain is not None:
        tflops = keep["tflops"] * keep["step_ms"] / plain["step_ms"]
        print(
            f"one process without PipeStudio: {plain['step_ms']:.1f} ms per step, "
            f"{tflops:.1f} TFLOP/s"
            + ("" if not peak else f" (MFU {tflops / peak:.1%})")
            + f"; PipeStudio's one stage (keep) takes x{keep['step_ms'] / plain['step_ms']:.3f}"
            " its time"
        )
    shares = {"swap": share, "swap-all": 1.0}
    verdicts = []
    for row in rows:
        if row["variant"] not in shares:
            continue
        ok = row["peak_ratio"] <= 0.60 and row["time_ratio"] <= 1.10
        verdicts.append(ok)
        print(
            f"{row['variant']} ({shares[row['variant']]:.0%} of the saved bytes): peak "
            f"x{row['peak_ratio']:.3f} (target <= 0.60), step time x{row['time_ratio']:.3f} "
            f"(target <= 1.10): {'PASS' if ok else 'FAIL'}"
        )
    return 0 if any(verdicts) or not verdicts else 1


def shared_run(
    profile: Profile, options: argparse.Namespace, args: dict[str, str], cluster: Any
) -> dict[str, Any]:
    """Step 6 of the module docstring: measured and predicted step of two stages on the
    GPU, and what the simulator says of the same plan on two devices."""
    plan = shared_plan(profile, options.microbatches)
    # the hop between the two processes: gloo on the host at the boundary tensor's size
    boundary = profile.layers[len(plan.stages[0].layers) - 1].output_bytes
    staging = measure_gloo_gbps(boundary)
    cluster = cluster.model_copy(
        update={
            "devices": [
                device.model_copy(update={"staging_gbps": staging}) for device in cluster.devices
            ]
        }
    )
    runs = [
        train(plan, options.model, args, options.warm_steps, options.steps, options.device)
        for _ in range(options.rounds)
    ]
    step_ms = statistics.median(t for run in runs for t in run["step_ms"])
    predicted = simulate(profile, plan, cluster, num_steps=2, with_timeline=False)
    apart = plan.model_copy(
        update={
            "stages": [
                stage.model_copy(update={"devices": [idx]}) for idx, stage in enumerate(plan.stages)
            ]
        }
    )
    two = cluster_template([2], [None], host_bandwidth_gbps=cluster.devices[0].host_to_device_gbps)
    return {
        "layers": [stage.layers for stage in plan.stages],
        "step_ms": step_ms,
        "boundary_bytes": boundary,
        "staging_gbps": staging,
        "predicted_step_ms": predicted.step_time_ms,
        "predicted_error": step_ms / predicted.step_time_ms - 1,
        "apart_step_ms": simulate(
            profile, apart, two, num_steps=2, with_timeline=False
        ).step_time_ms,
    }


def plain_run(options: argparse.Namespace, args: dict[str, str]) -> dict[str, Any]:
    """Step 7 of the module docstring: median step time of plain training."""
    from pipestudio.runtime.precision import autocast_dtype, matmuls

    spec = load_model(options.model, args)
    device = torch.device(options.device)
    model = spec.as_module().to(device)
    optimizer = torch.optim.Adam(model.parameters())
    dtype = autocast_dtype(options.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=options.precision == "fp16")
    size, num_mb = options.microbatch_size, options.microbatches
    batches = [tuple(t.to(device) for t in spec.sample(size, k)) for k in range(num_mb)]
    times = []
    with matmuls(options.precision):
        for step in range(options.warm_steps + options.steps * options.rounds):
            started = time.perf_counter()
            for data, targets in batches:
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    loss = spec.loss(model(data), targets) / num_mb
                scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step >= options.warm_steps:
                times.append((time.perf_counter() - started) * 1e3)
    return {"step_ms": statistics.median(times), "steps_ms": times}


if __name__ == "__main__":
    sys.exit(main())
