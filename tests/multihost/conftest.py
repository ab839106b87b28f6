"""Fixtures of runs across hosts: namespace hosts (``hosts.py``), a backend on the root side
and one worker per host.

Where namespaces cannot be made (not root, no ``ip``) the tests are skipped with the
reason, except under CI=true: CI runs as root, and there they must run.
"""

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.backend.conftest import AUTH
from tests.backend.processes import (
    ROOT,
    start_backend,
    stop,
    wait_for,
    worker_command,
    worker_env,
)
from tests.multihost.hosts import Hosts, why_unavailable

#: What a test of several hosts must not inherit: it shows that no variable is needed.
NETWORK_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "PIPESTUDIO_NETWORK_INTERFACE")


@pytest.fixture
def make_hosts() -> Iterator[Callable[..., Hosts]]:
    """Makes ``Hosts(count, rates_mbit)``; removes them all afterwards."""
    reason = why_unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs as root and must make network namespaces: {reason}")
        pytest.skip(reason)
    made: list[Hosts] = []

    def make(count: int, rates_mbit: list[float | None] | None = None) -> Hosts:
        made.append(Hosts(count, rates_mbit))
        return made[-1]

    yield make
    for hosts in made:
        hosts.close()


class System:
    """A backend on the root side of ``hosts`` and a worker named ``host{i}`` in each
    (with the variables ``env[i]`` besides the test's own)."""

    def __init__(
        self,
        hosts: Hosts,
        database_url: str,
        tmp: Path,
        env: dict[int, dict[str, str]] | None = None,
    ) -> None:
        self.hosts, self.tmp = hosts, tmp
        self.log = tmp / "backend.log"
        self.backend, self.url = start_backend(database_url, self.log, host=hosts.gateway)
        self.checkpoints = tmp / "checkpoints"
        plain = {k: v for k, v in worker_env().items() if k not in NETWORK_VARIABLES}
        self.workers = [
            hosts.start(
                idx,
                worker_command(self.url, f"host{idx}", tmp / f"state{idx}"),
                tmp / f"host{idx}.log",
                cwd=ROOT,
                env={**plain, **(env or {}).get(idx, {})},
            )
            for idx in range(len(hosts))
        ]
        wait_for(
            lambda: self.get("/api/health")["workers_online"] == len(hosts),
            90,
            f"{len(hosts)} workers",
        )

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, headers=AUTH, timeout=30)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: Any = None, **params: Any) -> Any:
        response = httpx.post(
            f"{self.url}{path}", json=body, params=params, headers=AUTH, timeout=30
        )
        assert response.status_code < 300, response.text
        return response.json()

    def logs(self) -> str:
        """The backend's and every worker's output, for a failed test's message."""
        paths = [self.log, *sorted(self.tmp.glob("host*.log"))]
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in paths if p.exists())

    def close(self) -> None:
        for process in self.workers:
            stop(process)
        stop(self.backend)


@pytest.fixture
def make_system(tmp_path: Path) -> Iterator[Callable[..., System]]:
    """Starts a ``System`` on hosts (on SQLite: the database is not what is tested)."""
    made: list[System] = []

    def make(hosts: Hosts, env: dict[int, dict[str, str]] | None = None) -> System:
        made.append(System(hosts, f"sqlite:///{tmp_path / 'pipestudio.db'}", tmp_path, env))
        return made[-1]

    yield make
    for system in made:
        system.close()
