"""Every service of docker-compose.yml runs outside Docker with the same command and
environment: the migration, then the backend (migrations off, as in Compose) and its health
check, then the CPU and GPU workers registering with it.

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
from pipestudio.planner.cluster import cluster_template
from tests.backend.conftest import empty_postgres, postgres_database
from tests.conftest import ROOT
from tests.deploy.compose import TOKENS, load

__all__ = ["postgres_database"]  # a fixture, used by name
BIN = str(Path(sys.executable).parent)
COMPOSE_URL = "http://backend:8000"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'pipestudio.db'}"
    url: str = request.getfixturevalue("postgres_database")
    empty_postgres(url)
    return url


def service(name: str, database_url: str) -> tuple[list[str], dict[str, str]]:
    """The service's command and environment as this machine runs them."""
    spec = load(TOKENS)["services"][name]
    env = {key: value for key, value in spec.get("environment", {}).items()
           if value is not None}
    if "PIPESTUDIO_DATABASE_URL" in env:
        env["PIPESTUDIO_DATABASE_URL"] = database_url
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIPESTUDIO_")}
    return list(spec["command"]), {**clean, **env, "PATH": f"{BIN}:{os.environ['PATH']}",
                                   "PYTHONUNBUFFERED": "1"}


def replace_option(argv: list[str], option: str, value: str) -> list[str]:
    idx = argv.index(option)
    return [*argv[:idx + 1], value, *argv[idx + 2:]]


@pytest.fixture
def backend(database_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The migrate service, then the backend service; yields its URL and log."""
    argv, env = service("migrate", database_url)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stderr}"
    argv, env = service("backend", database_url)
    argv = replace_option(replace_option(argv, "--host", "127.0.0.1"), "--port", "0")
    log = tmp_path / "backend.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
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
    created = httpx.post(f"{url}/api/clusters", json=body, timeout=10, headers={
        "Authorization": f"Bearer {TOKENS['PIPESTUDIO_API_TOKEN']}"})
    assert created.status_code == 201, created.text
    assert "API token:" not in backend["log"].read_text(), "the token came from the env"


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


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_healthcheck_and_workers(backend: dict[str, Any], tmp_path: Path) -> None:
    url = backend["url"]
    spec = load(TOKENS)["services"]["backend"]["healthcheck"]["test"]
    check = [part.replace("http://127.0.0.1:8000", url) for part in spec[1:]]
    assert subprocess.run(check, timeout=30).returncode == 0, "the backend's health check"
    workers = []
    for name in ("worker-cpu-0", "worker-cpu-1", "worker-gpu"):
        argv, env = service(name, backend["database_url"])
        argv = [url if part == COMPOSE_URL else part for part in argv]
        with (tmp_path / f"{name}.log").open("wb") as out:
            workers.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out,
                                            stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 120
        while (online := wait_health(url)["workers_online"]) < 3:
            for name, worker in zip(("cpu-0", "cpu-1", "gpu"), workers, strict=True):
                assert worker.poll() is None, (tmp_path / f"worker-{name}.log").read_text()
            assert time.monotonic() < deadline, f"{online} of 3 workers registered"
            time.sleep(0.5)
        listed = httpx.get(f"{url}/api/workers", timeout=10).json()["data"]
        assert {w["name"] for w in listed} == {"cpu-0", "cpu-1", "gpu-0"}
    finally:
        for worker in workers:
            stop(worker)
