"""``python -m pipestudio.demo`` (what ``make demo`` runs): it refuses a taken port, seeds
the backend through the REST API, seeds nothing twice, and SIGTERM or Ctrl-C stops every
process it started. The browser walk through it is test_demo_browser.py."""

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from pipestudio.demo import GPT_ARGS, PIPEDREAM_BATCH_SIZES, demo_token
from tests.conftest import ROOT
from tests.deploy.demo_process import Demo


def test_a_taken_port_is_refused_clearly() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "pipestudio.demo", "--port", str(port), "--no-workers"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert f"error: port {port} on 127.0.0.1 is not free" in done.stderr
    assert "--port" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "pipestudio.demo", "--port", "70000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--port must be 0..65535, got 70000" in done.stderr


def seeded(url: str, token: str) -> tuple[list[dict], list[dict], list[dict]]:  # type: ignore[type-arg]
    def get(path: str) -> list[dict]:  # type: ignore[type-arg]
        response = httpx.get(
            f"{url}/api/{path}?limit=1000", timeout=30, headers={"Authorization": f"Bearer {token}"}
        )
        return response.json()["data"]  # type: ignore[no-any-return]

    return get("profiles"), get("clusters"), get("plans")


def test_demo_seeds_once_and_stops_everything(tmp_path: Path) -> None:
    demo = Demo(tmp_path / "state", "--no-workers")
    try:
        banner = demo.wait_until_running(timeout_s=240)
        assert httpx.get(f"{demo.url}/api/profiles", timeout=30).status_code == 401
        profiles, clusters, plans = seeded(demo.url, demo.token)
        gpt_id = next(p["id"] for p in profiles if p["model"] == "gpt")
        measured = httpx.get(
            f"{demo.url}/api/profiles/{gpt_id}",
            timeout=30,
            headers={"Authorization": f"Bearer {demo.token}"},
        ).json()
    finally:
        status, left = demo.stop(signal.SIGTERM)
    assert status == 0 and not left, f"status {status}; left behind: {left}"
    assert "0 of 0 CPU workers online" in banner
    assert "WARNING" not in banner, banner  # the dashboard is served
    assert "sign in: leave Name empty and paste the API token" in banner, banner
    assert f"({demo.url}/login)" in banner
    by_name = {p["name"]: p for p in profiles}
    gpt = by_name["gpt (measured on this machine)"]
    assert gpt["id"] == gpt_id and gpt["source"] == "json"
    # measured here by the runtime's profiler, with the arguments the workers will build
    metadata = measured["document"]["metadata"]
    assert measured["document"]["device"].startswith("cpu") and metadata["profiler"].startswith(
        "pipestudio.runtime"
    )
    assert {k: str(metadata[f"config.{k}"]) for k in GPT_ARGS} == GPT_ARGS
    assert gpt["num_layers"] == int(GPT_ARGS["layers"]) + 2  # embed, blocks, head
    assert {f"{m} (PipeDream)" for m in PIPEDREAM_BATCH_SIZES} <= set(by_name)
    assert len(profiles) == len(PIPEDREAM_BATCH_SIZES) + 1
    assert [c["name"] for c in clusters] == ["demo: 2 CPU workers"]
    assert clusters[0]["num_devices"] == 2
    assert sorted(p["name"] for p in plans) == [
        "gpt: 2 stages balanced by time",
        "gpt: 2 stages, unbalanced (try a repartition)",
    ]
    for plan in plans:
        assert plan["state"] == "approved" and plan["profile_id"] == gpt["id"]
        assert plan["cluster_id"] == clusters[0]["id"] and plan["summary"]["fits"]
        assert len(plan["document"]["stages"]) == 2
        assert str(plan["id"]) in banner

    again = Demo(tmp_path / "state", "--no-workers")
    try:
        again.wait_until_running(timeout_s=120)
        assert "measuring the gpt model" not in again.text()
        assert seeded(again.url, again.token) == (profiles, clusters, plans)
        assert again.token == demo.token  # kept in the state directory
        kept = tmp_path / "state" / "demo" / "api-token"
        assert kept.read_text().strip() == demo.token and kept.stat().st_mode & 0o077 == 0
    finally:
        status, left = again.stop(signal.SIGINT)
    assert status == 0 and not left, f"status {status}; left behind: {left}"


def test_the_demo_token_is_kept_private_and_remade_when_spoiled(tmp_path: Path) -> None:
    path = tmp_path / "api-token"
    first = demo_token(path)
    assert demo_token(path) == first and path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    assert demo_token(path) == first and path.stat().st_mode & 0o777 == 0o600
    for spoiled in ("", "short", "has spaces in it and more than 24 chars", "\xff\xfe"):
        path.write_bytes(spoiled.encode("latin-1"))
        made = demo_token(path)
        assert made != first and re.fullmatch(r"[A-Za-z0-9_-]{24}", made)
        assert path.stat().st_mode & 0o777 == 0o600
