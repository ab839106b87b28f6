"""Runs across shaped links: the simulator's step time against a run on two hosts, and the
split a planner picks when the link between hosts is slow.

Needs root (it makes network namespaces, ``tests/multihost/hosts.py``). For each link rate
(``--rates``, Mbit/s; ``tc`` token bucket on both ends of each host's link) it

1. makes two namespace hosts with their links capped at the rate;
2. has the workers measure the link: a backend on the root side and a worker per host
   (``tests/multihost/conftest.System``), ``POST /api/clusters/from-workers`` with
   ``measure_links`` (``runtime/agent/links.py``: one TCP transfer sized to take about half
   a second), then stops them;
3. profiles the model here (one thread, as each rank has), describes the two hosts as a
   cluster of two hosts of one device linked at the measured bandwidth, plans with
   ``balance-time`` and predicts the step time (``pipestudio.planner.simulate``);
4. trains the plan with ``torchrun --nnodes 2`` (rendezvous on host 0, one rank per host,
   no network variable set), and compares the mean of the timed steps with the prediction;
5. calibrates on the first half of the timed steps (``pipestudio calibrate``'s
   ``calibrate``) and judges on the second half: the compute as the run measured it on the
   link as the workers measured it (the target: within 15%), and everything calibrated,
   the links included (the run's own transfers, gloo's overheads in them).

Then, for a real profile (PipeDream's vgg16, ``profiles/pipedream``), it plans 4 stages on
four hosts with ``optimal`` on free links and on links at each rate, and prints the splits:
a slow link moves the boundaries to where less crosses it.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipestudio.planner import Plan, Profile, cluster_template, simulate  # noqa: E402
from pipestudio.planner.algorithms import PLANNERS  # noqa: E402
from pipestudio.planner.algorithms.request import PlanRequest  # noqa: E402
from pipestudio.planner.formats.pipedream import import_pipedream  # noqa: E402
from pipestudio.planner.simulator.calibrate import calibrate  # noqa: E402
from pipestudio.runtime.models import load_model  # noqa: E402
from pipestudio.runtime.profiler import median_profile, profile_model  # noqa: E402
from tests.multihost.conftest import System  # noqa: E402
from tests.multihost.hosts import NETWORK_VARIABLES, Hosts, why_unavailable  # noqa: E402

MODEL = "mlp"
ARGS = {"layers": "5", "width": "1024", "in_features": "1024", "out_features": "1024"}
MICROBATCH = 64
TARGET = 0.15


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in NETWORK_VARIABLES}


def _profile(repeats: int, conn: Any) -> None:
    model = load_model(MODEL, ARGS)
    conn.send(
        profile_model(model, MICROBATCH, "cpu", warmup=3, repeats=repeats, threads=1).to_json()
    )
    conn.close()


def profile_together(repeats: int) -> Profile:
    """The model profiled by two processes at once, one thread each, as the two ranks
    compute on this machine's cores (``runtime_fidelity.profile_together``)."""
    context = mp.get_context("spawn")
    pipes = [context.Pipe(duplex=False) for _ in range(2)]
    processes = [context.Process(target=_profile, args=(repeats, w)) for _, w in pipes]
    for process in processes:
        process.start()
    profiles = [Profile.model_validate_json(reader.recv()) for reader, _ in pipes]
    for process in processes:
        process.join(60)
    return median_profile(profiles)


def workers_measure(hosts: Hosts, folder: Path) -> tuple[float, list[dict[str, Any]]]:
    """The link between the hosts as their workers measure it: a backend on the root side,
    a worker per host, ``POST /api/clusters/from-workers`` with ``measure_links``; returns
    the cluster's bandwidth between hosts and the links measured. The system is stopped
    before the run, so that it takes no core from the ranks."""
    system = System(hosts, f"sqlite:///{folder / 'pipestudio.db'}", folder)
    try:
        cluster = system.post(
            "/api/clusters/from-workers", {"measure_links": True, "measure_seconds": 2.0}
        )
    finally:
        system.close()
    return float(cluster["document"]["levels"][1]["bandwidth_gbps"]), cluster["links"]


def torchrun_steps(
    hosts: Hosts, plan: Plan, steps: int, warm: int, folder: Path
) -> tuple[list[float], list[dict[str, Any]]]:
    """The step times (ms) of ``plan`` trained by torchrun on the two hosts, warm-up cut,
    and the run's events."""
    (folder / "plan.json").write_text(plan.to_json())
    port = hosts.free_port(0)
    processes = []
    for idx in range(2):
        argv = hosts.torchrun(idx, port, [
            "--plan", str(folder / "plan.json"),
            "--model", MODEL, *(f"--model-arg={k}={v}" for k, v in ARGS.items()),
            "--steps", str(warm + steps), "--device", "cpu", "--threads-per-rank", "1",
            "--metrics", str(folder / "metrics.jsonl"), "--timeout", "120",
        ])  # fmt: skip
        log = (folder / f"node{idx}.log").open("w")
        processes.append(
            subprocess.Popen(hosts[idx].command(argv), cwd=ROOT, env=_env(), stdout=log, stderr=log)
        )
    if [process.wait(900) for process in processes] != [0, 0]:
        raise RuntimeError(f"the run failed: see {folder}/node*.log")
    events = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for event in events:
        if event.get("type") == "summary":
            return [float(t) for t in event["step_times_ms"][warm:]], events
    raise RuntimeError(f"no summary in {folder}/metrics.jsonl")


def fidelity(rate_mbit: float, options: argparse.Namespace, out: Path) -> dict:
    profile = profile_together(options.repeats)
    output_bytes = int(statistics.median(layer.output_bytes for layer in profile.layers))
    hosts = Hosts(2, [rate_mbit, rate_mbit])
    folder = out / f"rate-{rate_mbit:g}"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        gbps, links = workers_measure(hosts, folder)
        cluster = cluster_template([1, 2], [None, gbps], name=f"2 hosts at {rate_mbit:g} Mbit/s")
        request = PlanRequest(
            profile=profile,
            num_microbatches=options.microbatches,
            schedule="1f1b",
            num_stages=2,
            cluster=cluster,
        )
        plan = PLANNERS["balance-time"](request).plan
        predicted = simulate(profile, plan, cluster, with_timeline=False).step_time_ms
        (folder / "profile.json").write_text(profile.to_json())
        (folder / "cluster.json").write_text(cluster.to_json())
        steps_ms, events = torchrun_steps(hosts, plan, options.steps, options.warm_steps, folder)
    finally:
        hosts.close()
    measured = statistics.mean(steps_ms)
    # calibrated on the first half of the timed steps (as ``pipestudio calibrate`` does from
    # a run's metrics), judged on the second half
    half = len(steps_ms) // 2
    first_half = range(options.warm_steps, options.warm_steps + half)
    calibration = calibrate(profile, plan, events, cluster, first_half)
    # the compute as the run's first half measured it, the link as the workers did
    on_measured_link = simulate(calibration.profile, plan, cluster, with_timeline=False)
    calibrated = simulate(
        calibration.profile, plan, calibration.cluster or cluster, with_timeline=False
    ).step_time_ms
    judged = statistics.mean(steps_ms[half:])
    return {
        "rate_mbit": rate_mbit,
        "measured_link_gbps": gbps,
        "links": links,
        "activation_bytes": output_bytes,
        "stage_layers": [len(stage.layers) for stage in plan.stages],
        "predicted_ms": predicted,
        "measured_ms": measured,
        "error": measured / predicted - 1,
        "judged_ms": judged,
        "calibrated_ms": calibrated,
        "error_before": judged / predicted - 1,
        "compute_calibrated_ms": on_measured_link.step_time_ms,
        "error_measured_link": judged / on_measured_link.step_time_ms - 1,
        "error_after": judged / calibrated - 1,
    }


def splits(rates_mbit: list[float], measured_gbps: dict[float, float]) -> list[dict]:
    """optimal's 4-stage split of vgg16 on four hosts, free links against each rate (as the
    workers measured it, where they did)."""
    profile = import_pipedream(ROOT / "profiles" / "pipedream" / "vgg16" / "graph.txt")
    rows = []
    for rate in [None, *rates_mbit]:
        gbps = None if rate is None else measured_gbps.get(rate, rate / 1000)
        cluster = cluster_template([1, 4], [None, gbps], name="4 hosts")
        request = PlanRequest(
            profile=profile, num_microbatches=8, schedule="1f1b", num_stages=4, cluster=cluster
        )
        result = PLANNERS["optimal"](request)
        boundaries, total = [], 0
        for stage in result.plan.stages[:-1]:
            total += len(stage.layers)
            boundaries.append(total)
        shape = [f"{len(stage.layers)}x{stage.replicas}" for stage in result.plan.stages]
        crossing = [
            next(layer.output_bytes for layer in profile.layers if layer.name == stage.layers[-1])
            for stage in result.plan.stages[:-1]
        ]
        rows.append(
            {
                "rate_mbit": rate,
                "gbps": gbps,
                "boundaries": boundaries,
                "stages": shape,
                "bytes_crossing": crossing,
                "step_ms": simulate(
                    profile, result.plan, cluster, with_timeline=False
                ).step_time_ms,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1000,200", help="link rates, Mbit/s")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warm-steps", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=None, help="where the runs' files go")
    options = parser.parse_args(argv)
    reason = why_unavailable()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    rates = [float(rate) for rate in options.rates.split(",")]
    out = Path(options.out or tempfile.mkdtemp(prefix="pipestudio-multihost-"))
    print(
        f"{'rate':>6} {'link Gbit/s':>11} {'split':>6} {'measured':>9} {'predicted':>9} "
        f"{'error':>7} {'2nd half':>8} {'compute cal.':>12} {'error':>7} "
        f"{'all cal.':>8} {'error':>7}"
    )
    worst = 0.0
    measured: dict[float, float] = {}
    for rate in rates:
        row = fidelity(rate, options, out)
        worst = max(worst, abs(row["error_measured_link"]))
        measured[rate] = row["measured_link_gbps"]
        print(
            f"{rate:>6g} {row['measured_link_gbps']:>11.3f} "
            f"{'+'.join(map(str, row['stage_layers'])):>6} {row['measured_ms']:>9.1f} "
            f"{row['predicted_ms']:>9.1f} {row['error']:>+7.1%} {row['judged_ms']:>8.1f} "
            f"{row['compute_calibrated_ms']:>12.1f} {row['error_measured_link']:>+7.1%} "
            f"{row['calibrated_ms']:>8.1f} {row['error_after']:>+7.1%}",
            flush=True,
        )
        (out / f"rate-{rate:g}" / "results.json").write_text(json.dumps(row, indent=1))
    print(
        f"worst error on the workers' measured link, compute calibrated on the first half: "
        f"{worst:.1%} (target {TARGET:.0%}); runs in {out}"
    )
    print("optimal's split of vgg16 on 4 hosts:")
    for row in splits(rates, measured):
        rate = "free" if row["rate_mbit"] is None else f"{row['gbps']:.3g} Gbit/s"
        print(
            f"  {rate:>12}: stages (layers x replicas) {' '.join(row['stages'])}, "
            f"boundaries {row['boundaries']}, bytes crossing "
            f"{row['bytes_crossing']}, step {row['step_ms']:.1f} ms"
        )
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
