"""Real processes for end-to-end tests: ``pipestudio serve`` and ``pipestudio worker``."""

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.backend.conftest import API_TOKEN, WORKER_TOKEN

ROOT = Path(__file__).resolve().parents[2]
TINY_MLP = {"layers": "2", "width": "32", "in_features": "16", "out_features": "5"}


def _env(database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PIPESTUDIO_DATABASE_URL": database_url,
        "PIPESTUDIO_API_TOKEN": API_TOKEN,
        "PIPESTUDIO_WORKER_TOKEN": WORKER_TOKEN,
        "PIPESTUDIO_WORKER_TIMEOUT_S": "6",
        "PYTHONUNBUFFERED": "1",
    }


def start_backend(
    database_url: str, log: Path, port: int = 0, host: str = "127.0.0.1"
) -> tuple[subprocess.Popen[bytes], str]:
    """``pipestudio serve`` on ``host``:``port`` (0: any free one); its process and URL."""
    handle = log.open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "pipestudio", "serve", "--host", host, "--port", str(port)],
        cwd=ROOT,
        env={**_env(database_url), "PIPESTUDIO_CHECKPOINT_DIR": str(log.parent / "checkpoints")},
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        found = re.findall(rf"on (http://{re.escape(host)}:\d+)", log.read_text())
        if found:
            url = found[-1]
            try:
                if httpx.get(f"{url}/api/health", timeout=2).status_code == 200:
                    return process, url
            except httpx.TransportError:
                pass
        assert process.poll() is None, f"the backend exited:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"the backend did not start:\n{log.read_text()}"
        time.sleep(0.2)


def start_worker(url: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        worker_command(url, name, log.parent / "worker-state"),
        cwd=ROOT,
        env=_env(""),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def worker_command(url: str, name: str, state_dir: Path) -> list[str]:
    """``pipestudio worker`` on the CPU with one slot, serving ``url``."""
    return [
        sys.executable,
        "-m",
        "pipestudio",
        "worker",
        "--server",
        url,
        "--token",
        WORKER_TOKEN,
        "--name",
        name,
        "--slots",
        "1",
        "--device",
        "cpu",
        "--state-dir",
        str(state_dir),
    ]


def worker_env() -> dict[str, str]:
    """The environment of a worker process: the test's, with the worker token."""
    return _env("")


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(interval_s)


def _parents() -> dict[int, int]:
    """Every live process's parent, from ``/proc`` (zombies left out: they are dead)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            parents[int(entry.name)] = int(ppid)
    return parents


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid``: its children, theirs, and so on."""
    parents = _parents()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run."""
    return pids & set(_parents())


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def dashboard_session(
    url: str, password: str = API_TOKEN, user: str = ""
) -> Iterator[httpx.Client]:
    """A client signed in to the dashboard at ``url`` as a browser is: its cookies, and the
    CSRF header Dash's renderer copies from the ``_csrf_token`` cookie."""
    with httpx.Client(base_url=url, timeout=60) as client:
        response = client.post("/login", data={"user": user, "password": password})
        assert response.status_code == 302, response.text
        client.headers["X-CSRFToken"] = client.cookies["_csrf_token"]
        yield client
