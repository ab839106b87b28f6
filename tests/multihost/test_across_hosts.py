"""Runs across hosts made of network namespaces (``hosts.py``), each with its own address
and a host name that resolves to loopback, as on many Debian hosts and containers: no
variable is set by hand, and the ranks still reach each other; the result equals
single-process training; a live migration moves a layer between hosts; a host cut off
mid-run fails the run, naming it, and nothing stored is lost; the workers measure shaped
links between their hosts."""

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from pipestudio.planner import Plan
from pipestudio.runtime.engine import EngineConfig, build_model
from pipestudio.runtime.engine import checkpoint as ckpt
from tests.backend.conftest import mlp_profile
from tests.backend.processes import ROOT, TINY_MLP, wait_for
from tests.multihost.conftest import NETWORK_VARIABLES, STRAY_ADDRESS, System
from tests.runtime.engine.helpers import (
    final_params,
    make_plan,
    max_relative_difference,
    model_args,
)
from tests.runtime.engine.reference import train_single

pytestmark = pytest.mark.slow
SEED = 0
ENDED = ("finished", "failed", "stopped")


def _launch(
    system: System,
    boundaries: list[int],
    steps: int,
    schedule: str = "1f1b",
    model_args: dict[str, str] = TINY_MLP,
    **run: Any,
) -> tuple[int, Plan]:
    profile = system.post("/api/profiles", {"profile": mlp_profile(int(model_args["layers"]))})
    plan = system.post(
        "/api/plans",
        {
            "profile_id": profile["id"],
            "manual": {"boundaries": boundaries, "num_microbatches": 4, "schedule": schedule},
        },
    )
    system.post(f"/api/plans/{plan['id']}/approve", force="true")
    started = system.post(
        "/api/runs",
        {
            "plan_id": plan["id"],
            "model": "mlp",
            "model_args": model_args,
            "steps": steps,
            "device": "cpu",
            "threads_per_rank": 1,
            "seed": SEED,
            **run,
        },
    )
    return int(started["id"]), Plan.model_validate(plan["document"])


def _ended(system: System, run_id: int, timeout_s: float) -> dict[str, Any]:
    run: dict[str, Any] = wait_for(
        lambda: (r := system.get(f"/api/runs/{run_id}"))["state"] in ENDED and r,
        timeout_s,
        f"run {run_id} to end",
        interval_s=0.5,
    )
    return run


def _reference(
    plan: Plan, steps: int, model_args: dict[str, str] = TINY_MLP
) -> dict[str, torch.Tensor]:
    config = EngineConfig(plan=plan, model="mlp", model_args=model_args, seed=SEED, steps=steps)
    return train_single(lambda: build_model(config), plan, steps)


def _trained(
    system: System, run_id: int, plan: Plan, model_args: dict[str, str] = TINY_MLP
) -> tuple[int, dict[str, torch.Tensor]]:
    """The step of the run's latest checkpoint and its parameters (on the partition it was
    saved with, which a live migration changes)."""
    folder = system.checkpoints / f"run-{run_id}"
    meta = ckpt.read_latest(str(folder))
    assert meta is not None, f"no checkpoint in {folder}"
    names = build_model(EngineConfig(plan=plan, model="mlp", model_args=model_args)).layer_names
    return int(meta["step"]), final_params(Path(folder), ckpt.resume_plan(str(folder), plan), names)


def _hosts_of(system: System, run: dict[str, Any]) -> list[str]:
    """The address of the worker that ran each rank, in rank order."""
    ranks = sorted(run["ranks"], key=lambda r: r["rank"])
    return [system.get(f"/api/workers/{r['worker_id']}")["host"] for r in ranks]


def test_a_two_stage_run_spans_two_hosts_with_no_variable_set(four_hosts: System) -> None:
    system, hosts = four_hosts, four_hosts.hosts
    run_id, plan = _launch(
        system, [2], steps=6, checkpoint_every=3, worker_ids=system.worker_ids(0, 1)
    )
    run = _ended(system, run_id, 180)
    assert run["state"] == "finished", f"{run['message']}\n{system.logs()}"
    assert sorted(_hosts_of(system, run)) == sorted([hosts[0].address, hosts[1].address])
    step, got = _trained(system, run_id, plan)
    assert step == 6
    assert max_relative_difference(got, _reference(plan, 6)) <= 1e-6


def test_a_rank_that_cannot_reach_its_peer_fails_the_run_naming_both_addresses(
    four_hosts: System,
) -> None:
    """Host 3's ranks are bound by hand to an interface no other host can reach (a
    variable set by hand wins over the worker's choice): the run fails within its timeout
    naming both ranks' addresses and interfaces."""
    system, hosts = four_hosts, four_hosts.hosts
    run_id, _ = _launch(system, [2], steps=6, timeout_s=5, worker_ids=system.worker_ids(3, 0))
    started = time.monotonic()
    run = _ended(system, run_id, 90)
    assert run["state"] == "failed", run
    assert time.monotonic() - started < 45, run
    message = run["message"]
    assert "could not reach rank" in message and "within 5 s" in message, message
    assert f"{hosts[0].address} (eth0)" in message and f"{STRAY_ADDRESS} (stray)" in message


def _last_step(system: System, run_id: int) -> int:
    return int(system.get(f"/api/runs/{run_id}")["last_step"] or 0)


def test_a_three_stage_run_on_three_hosts_moves_a_layer_between_hosts_live(
    four_hosts: System,
) -> None:
    """A 1f1b run of 3 stages, one per host; an approved proposal moves layers between the
    hosts' stages while it trains; the checkpoint after the move
    equals single-process training of as many steps."""
    system, hosts = four_hosts, four_hosts.hosts
    args = {**TINY_MLP, "layers": "5"}
    run_id, plan = _launch(
        system,
        [2, 4],
        steps=100_000,
        model_args=args,
        checkpoint_every=5,
        worker_ids=system.worker_ids(0, 1, 2),
    )
    wait_for(lambda: _last_step(system, run_id) >= 2, 120, "three steps", interval_s=0.5)
    run = system.get(f"/api/runs/{run_id}")
    assert sorted(_hosts_of(system, run)) == sorted(h.address for h in hosts.hosts[:3])
    observed = mlp_profile(5)
    for layer in observed["layers"][:2]:
        layer.update(fwd_ms=50.0, bwd_ms=100.0)
    proposal = system.post("/api/proposals", {"run_id": run_id, "observed_profile": observed})
    assert proposal["worthwhile"], proposal["document"]["reason"]
    moves = proposal["document"]["moves"]
    assert moves and all(m["from_stage"] != m["to_stage"] for m in moves), moves
    system.post(f"/api/proposals/{proposal['id']}/approve")
    done = wait_for(
        lambda: (p := system.get(f"/api/proposals/{proposal['id']}"))["state"] != "approved" and p,
        90,
        "the migration's outcome",
        interval_s=0.5,
    )
    assert done["state"] == "applied", f"{done['outcome']}\n{system.logs()}"

    def migrated_step() -> int | None:
        events = system.get(f"/api/runs/{run_id}/events", kind="migration")["data"]
        steps = {e["data"]["step"] for e in events if e["data"].get("phase") == "done"}
        return max(steps) if steps else None

    moved_at = wait_for(migrated_step, 60, "the migration to be done")
    wait_for(
        lambda: (
            (ckpt.read_latest(str(system.checkpoints / f"run-{run_id}")) or {}).get("step", 0)
            > moved_at
        ),
        120,
        "a checkpoint after the migration",
        interval_s=0.5,
    )
    system.post(f"/api/runs/{run_id}/stop")
    _ended(system, run_id, 60)
    step, got = _trained(system, run_id, plan, args)
    assert step > moved_at
    saved = ckpt.resume_plan(str(system.checkpoints / f"run-{run_id}"), plan)
    wanted = [stage["layers"] for stage in proposal["document"]["new_plan"]["stages"]]
    assert [stage.layers for stage in saved.stages] == wanted  # saved where it was moved
    assert max_relative_difference(got, _reference(plan, step, args)) <= 1e-6


def test_a_host_cut_off_mid_run_fails_the_run_naming_it_and_loses_nothing(
    four_hosts: System,
) -> None:
    """Host 1's link goes down mid-run: within 30 s the run fails, its message naming the
    host's worker and address; what was stored before stays; the worker comes back when
    the link does."""
    system, hosts = four_hosts, four_hosts.hosts
    run_id, _ = _launch(system, [2], steps=100_000, worker_ids=system.worker_ids(0, 1))
    wait_for(lambda: _last_step(system, run_id) >= 3, 120, "four steps", interval_s=0.5)
    run = system.get(f"/api/runs/{run_id}")
    host1 = next(
        r for r in run["ranks"] if system.get(f"/api/workers/{r['worker_id']}")["name"] == "host1"
    )
    before = system.get(f"/api/runs/{run_id}/metrics", kind="step")["data"]
    hosts.cut(1)
    cut_at = time.monotonic()
    run = _ended(system, run_id, 60)
    took = time.monotonic() - cut_at
    assert run["state"] == "failed", run
    assert took < 30, f"the run took {took:.0f} s to fail"
    assert f"worker host1 ({host1['worker_id']}) on {hosts[1].address}" in run["message"], run[
        "message"
    ]
    after = system.get(f"/api/runs/{run_id}/metrics", kind="step")["data"]
    assert {m["id"] for m in before} <= {m["id"] for m in after}
    hosts.restore(1)
    wait_for(
        lambda: system.get(f"/api/workers/{host1['worker_id']}")["state"] == "online",
        60,
        "host1's worker to come back",
        interval_s=0.5,
    )
    print(f"the run failed {took:.1f} s after host 1 was cut off: {run['message']}")


def test_torchrun_on_two_hosts_trains_a_plan_across_them(make_hosts: Any, tmp_path: Path) -> None:
    """``torchrun --nnodes 2`` with its rendezvous on host 0 and one rank per host, as
    docs/deployment.md says, with no network variable set: the run equals single-process
    training."""
    hosts = make_hosts(2)
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b")
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    args = model_args("mlp")
    port = hosts.free_port(0)
    env = {k: v for k, v in os.environ.items() if k not in NETWORK_VARIABLES}
    train = [
        "--plan", str(tmp_path / "plan.json"), "--model", "mlp",
        *(f"--model-arg={k}={v}" for k, v in args.items()),
        "--steps", "6", "--seed", str(SEED), "--device", "cpu", "--threads-per-rank", "1",
        "--checkpoint-dir", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    processes = [
        hosts.start(
            idx,
            hosts.torchrun(idx, port, train),
            tmp_path / f"node{idx}.log",
            cwd=ROOT,
            env=env,
        )
        for idx in range(2)
    ]
    codes = [process.wait(180) for process in processes]
    logs = "\n".join((tmp_path / f"node{idx}.log").read_text()[-2000:] for idx in range(2))
    assert codes == [0, 0], logs
    config = EngineConfig(plan=plan, model="mlp", model_args=args, seed=SEED, steps=6)
    names = build_model(config).layer_names
    got = final_params(tmp_path / "ckpt", plan, names)
    expected = train_single(lambda: build_model(config), plan, 6)
    assert max_relative_difference(got, expected) <= 1e-6


def test_a_run_that_may_resume_goes_on_once_the_cut_off_host_is_back(
    make_hosts: Any, tmp_path: Path
) -> None:
    """With ``on_failure: resume`` and only two hosts, a run whose second host is cut off
    waits in ``resuming``; once the link is back, the worker says hello again and the run
    starts its next attempt from its last checkpoint and trains on within 30 s; what was
    stored stays."""
    hosts = make_hosts(2)
    system = System(hosts, f"sqlite:///{tmp_path / 'pipestudio.db'}", tmp_path)
    try:
        run_id, _ = _launch(
            system, [2], steps=100_000, checkpoint_every=2, on_failure="resume", max_resumes=2
        )
        wait_for(lambda: _last_step(system, run_id) >= 3, 120, "four steps", interval_s=0.5)
        before = system.get(f"/api/runs/{run_id}/metrics", kind="step")["data"]
        hosts.cut(1)
        wait_for(
            lambda: system.get(f"/api/runs/{run_id}")["state"] == "resuming",
            30,
            "the run to wait for its host",
            interval_s=0.5,
        )
        hosts.restore(1)
        back = time.monotonic()
        run = wait_for(
            lambda: (
                (r := system.get(f"/api/runs/{run_id}"))["attempt"] >= 1
                and r["state"] == "running"
                and r
            ),
            60,
            "the next attempt",
            interval_s=0.5,
        )
        resumed_at = _last_step(system, run_id)
        wait_for(lambda: _last_step(system, run_id) >= resumed_at + 2, 60, "two more steps")
        took = time.monotonic() - back
        assert took < 30, f"the run trained again {took:.0f} s after the link came back"
        after = system.get(f"/api/runs/{run_id}/metrics", kind="step")["data"]
        assert {m["id"] for m in before} <= {m["id"] for m in after}
        print(f"attempt {run['attempt']} trained on {took:.1f} s after the link came back")
        system.post(f"/api/runs/{run_id}/stop")
    finally:
        system.close()


def test_the_workers_measure_their_links_and_the_cluster_takes_the_slowest(
    four_hosts: System,
) -> None:
    """Host 1's link capped at 1 Gbit/s and host 2's at 200 Mbit/s: the workers of hosts
    0 to 2 measure every pair, and the cluster made of them links its hosts at what the
    slowest pair measured."""
    system, hosts = four_hosts, four_hosts.hosts
    hosts.shape(1, 1000)
    hosts.shape(2, 200)
    try:
        cluster = system.post(
            "/api/clusters/from-workers",
            {"worker_ids": system.worker_ids(0, 1, 2), "measure_links": True},
        )
    finally:
        hosts.unshape(1)
        hosts.unshape(2)
    measured = {
        frozenset((link["from_host"], link["to_host"])): link["gbps"] for link in cluster["links"]
    }
    print(f"measured: {cluster['links']}")
    address = [hosts[idx].address for idx in range(3)]
    assert len(measured) == 3
    assert 0.6 <= measured[frozenset(address[:2])] <= 1.05, measured
    for pair in ((0, 2), (1, 2)):
        assert 0.12 <= measured[frozenset(address[idx] for idx in pair)] <= 0.21, measured
    network = cluster["document"]["levels"][1]
    assert network["size"] == 3 and network["bandwidth_gbps"] == min(measured.values())
