"""Every service of docker-compose.yml runs outside Docker with the same command and
environment: the migration, then the backend (migrations off, as in Compose) and its health
check, then the CPU workers registering with it, and the GPU worker registering where a
GPU is usable and refusing to start where none is.

Only what cannot be the same on a test machine changes: the database URL (a temporary
SQLite file, or a fresh PostgreSQL database), the backend's address (127.0.0.1 and a port
the OS picks) and the address the workers dial.
"""

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, inspect

from pipestudio.backend.db import normalize_url
from pipestudio.planner.formats.cluster import cluster_template
from tests.backend.conftest import database_url, postgres_database
from tests.conftest import ROOT
from tests.deploy.compose import TOKENS, load

__all__ = ["database_url", "postgres_database"]  # fixtures, used by name
BIN = str(Path(sys.executable).parent)
COMPOSE_URL = "http://backend:8000"


def service(name: str, database_url: str) -> tuple[list[str], dict[str, str]]:
    """The service's command and environment as this machine runs them."""
    spec = load(TOKENS)["services"][name]
    env = {key: value for key, value in spec.get("environment", {}).items() if value is not None}
    if "PIPESTUDIO_DATABASE_URL" in env:
        env["PIPESTUDIO_DATABASE_URL"] = database_url
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIPESTUDIO_")}
    return list(spec["command"]), {
        **clean,
        **env,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
    }


def replace_option(argv: list[str], option: str, value: str) -> list[str]:
    idx = argv.index(option)
    return [*argv[: idx + 1], value, *argv[idx + 2 :]]


@pytest.fixture
def backend(database_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The migrate service, then the backend service; yields its URL and log."""
    argv, env = service("migrate", database_url)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stderr}"
    assert "upgraded from empty to revision" in done.stdout, done.stdout
    argv, env = service("backend", database_url)
    argv = replace_option(replace_option(argv, "--host", "127.0.0.1"), "--port", "0")
    log = tmp_path / "backend.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield {"url": wait_for_url(process, log), "log": log, "database_url": database_url}
    finally:
        stop(process)


def wait_for_url(process: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the backend exited:\n{log.read_text()}"
        found = re.findall(r"backend on (http://127\.0\.0\.1:\d+)", log.read_text())
        if found:
            return found[-1]
        time.sleep(0.2)
    raise AssertionError(f"the backend printed no URL within 60 s:\n{log.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_migrate_then_serve(backend: dict[str, Any]) -> None:
    engine = create_engine(normalize_url(backend["database_url"]))
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"alembic_version", "profiles", "plans", "runs", "metrics", "workers"} <= tables
    url = backend["url"]
    health = wait_health(url)
    dialect = "sqlite" if backend["database_url"].startswith("sqlite") else "postgresql"
    assert health["database"] == dialect
    # the API token from the environment guards writes; the schema the migration made works
    body = {"cluster": cluster_template([2], [10.0]).model_dump(mode="json")}
    assert httpx.post(f"{url}/api/clusters", json=body, timeout=10).status_code == 401
    created = httpx.post(
        f"{url}/api/clusters",
        json=body,
        timeout=10,
        headers={"Authorization": f"Bearer {TOKENS['PIPESTUDIO_API_TOKEN']}"},
    )
    assert created.status_code == 201, created.text
    assert "API token:" not in backend["log"].read_text(), "the token came from the env"
    page = httpx.get(f"{url}/", timeout=30)
    assert page.status_code == 302 and page.headers["location"].startswith("/login"), (
        "the dashboard is at /, behind its sign-in page"
    )
    assert "Sign in" in httpx.get(f"{url}/login", timeout=30).text


def wait_health(url: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        try:
            response = httpx.get(f"{url}/api/health", timeout=5)
            if response.status_code == 200:
                return dict(response.json())
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url}/api/health did not answer"
        time.sleep(0.2)


def start_service(name: str, url: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A worker service, dialing ``url`` instead of the Compose network's backend."""
    argv, env = service(name, "")
    argv = [url if part == COMPOSE_URL else part for part in argv]
    env = {**env, "PIPESTUDIO_WORKER_STATE_DIR": str(tmp_path / "worker-state")}
    with (tmp_path / f"{name}.log").open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_healthcheck_and_workers(backend: dict[str, Any], tmp_path: Path) -> None:
    """The CPU workers register; the GPU worker registers its GPUs where torch sees one and
    otherwise refuses to start (it must not advertise the CPU as a GPU worker)."""
    url = backend["url"]
    spec = load(TOKENS)["services"]["backend"]["healthcheck"]["test"]
    check = [part.replace("http://127.0.0.1:8000", url) for part in spec[1:]]
    assert subprocess.run(check, timeout=30).returncode == 0, "the backend's health check"
    names = ["worker-cpu-0", "worker-cpu-1", "worker-gpu"]
    if not gpu_here():
        gpu = start_service("worker-gpu", url, tmp_path)
        assert gpu.wait(120) == 2, (tmp_path / "worker-gpu.log").read_text()
        assert (
            "error: --device cuda: no usable CUDA device"
            in (tmp_path / "worker-gpu.log").read_text()
        )
        names.remove("worker-gpu")
    workers = {name: start_service(name, url, tmp_path) for name in names}
    try:
        deadline = time.monotonic() + 120
        while (online := wait_health(url)["workers_online"]) < len(workers):
            for name, worker in workers.items():
                assert worker.poll() is None, (tmp_path / f"{name}.log").read_text()
            assert time.monotonic() < deadline, f"{online} of {len(workers)} workers registered"
            time.sleep(0.5)
        listed = httpx.get(
            f"{url}/api/workers",
            timeout=10,
            headers={"Authorization": f"Bearer {TOKENS['PIPESTUDIO_API_TOKEN']}"},
        ).json()["data"]
        expected = {"cpu-0", "cpu-1", "gpu-0"} if "worker-gpu" in workers else {"cpu-0", "cpu-1"}
        assert {w["name"] for w in listed} == expected
        kinds = {w["name"]: {d["kind"] for d in w["devices"]} for w in listed}
        assert kinds.get("gpu-0", {"cuda"}) == {"cuda"} and kinds["cpu-0"] == {"cpu"}
    finally:
        for worker in workers.values():
            stop(worker)


def gpu_here() -> bool:
    """Whether torch sees a CUDA device here (asked in a child: the tests import no torch)."""
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout.strip() == "True"
