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
from tests.multihost.hosts import NETWORK_VARIABLES, Hosts, why_unavailable


def _require_namespaces() -> None:
    reason = why_unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs as root and must make network namespaces: {reason}")
        pytest.skip(reason)


@pytest.fixture
def make_hosts() -> Iterator[Callable[..., Hosts]]:
    """Makes ``Hosts(count, rates_mbit)``; removes them all afterwards."""
    _require_namespaces()
    made: list[Hosts] = []

    def make(count: int, rates_mbit: list[float | None] | None = None) -> Hosts:
        made.append(Hosts(count, rates_mbit))
        return made[-1]

    yield make
    for hosts in made:
        hosts.close()


#: The address of the interface host 3 binds its ranks to, which no other host can reach.
STRAY_ADDRESS = "10.213.1.1"


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator["System"]:
    """One backend and four hosts, shared by a module's tests (starting them is most of
    a test's time): hosts 0 to 2 as they come, host 3 with its ranks bound by hand to an
    interface no other host reaches (``GLOO_SOCKET_IFNAME``, ``STRAY_ADDRESS``). A test
    picks its hosts with ``worker_ids`` (``System.worker_ids``)."""
    _require_namespaces()
    hosts = Hosts(4)
    system = None
    try:
        hosts.add_stray_interface(3, "stray", STRAY_ADDRESS)
        tmp = tmp_path_factory.mktemp("four-hosts")
        system = System(
            hosts, f"sqlite:///{tmp / 'pipestudio.db'}", tmp, {3: {"GLOO_SOCKET_IFNAME": "stray"}}
        )
        yield system
    finally:
        if system is not None:
            system.close()
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

    def worker_ids(self, *hosts: int) -> list[str]:
        """The ids of the workers of these hosts, in that order."""
        by_name = {w["name"]: w["id"] for w in self.get("/api/workers")["data"]}
        return [by_name[f"host{idx}"] for idx in hosts]

    def logs(self) -> str:
        """The backend's and every worker's output, for a failed test's message."""
        paths = [self.log, *sorted(self.tmp.glob("host*.log"))]
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in paths if p.exists())

    def close(self) -> None:
        for process in self.workers:
            stop(process)
        stop(self.backend)
