"""Backend load: 16 simulated workers each send 100 metric events/s for 60 s.

The workers speak the real protocol through the worker agent's own connection code
(``runtime/agent/connection.py``: numbered batches, acks); the backend is
``pipestudio serve`` in its own process, on SQLite and on PostgreSQL. Measured: events
lost (sent minus stored, and minus streamed to a dashboard on /ws/runs/{id}), p99
ingest-to-dashboard latency (event creation on the worker to arrival at the dashboard;
target < 250 ms), and REST p99 at 50 requests/s during the load (target < 100 ms).

    python bench/bench_backend_load.py [--seconds 60] [--workers 16] [--rate 100]
                                       [--databases sqlite,postgresql]
"""

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipestudio.runtime.agent.connection import AgentConnection  # noqa: E402
from tests.backend.conftest import (  # noqa: E402
    AUTH,
    BUILTIN_MODELS,
    WORKER_TOKEN,
    small_profile,
)
from tests.backend.processes import start_backend, stop  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


class SimulatedWorker:
    """Registers one slot; on rendezvous emits ``rate`` step events per second."""

    def __init__(self, url: str, name: str, rate: int, seconds: float) -> None:
        self.name, self.rate, self.seconds = name, rate, seconds
        self.connection = AgentConnection(url, WORKER_TOKEN, self._hello, self._handle)
        self.sent = 0
        self.stage = 0
        self.go = asyncio.Event()

    def _hello(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "host": "127.0.0.1",
            "slots": 1,
            "devices": [{"kind": "cpu", "index": 0}],
            "runs": [],
            "models": [*BUILTIN_MODELS, "simulated"],
        }  # what it "runs"

    async def _handle(self, message: dict[str, Any]) -> None:
        if message["type"] == "assign":
            self.run_id, self.stage = message["run_id"], message["ranks"][0]["stage"]
            if message["open_store"]:
                self.connection.send(
                    {"type": "store", "run_id": self.run_id, "host": "127.0.0.1", "port": 1}
                )
        elif message["type"] == "rendezvous":
            self.go.set()

    async def emit(self, t0: float) -> None:
        await self.go.wait()
        interval_s = 1.0 / self.rate
        start = time.monotonic()
        for idx in itertools.count():
            target = start + idx * interval_s
            if target - start >= self.seconds:
                break
            await asyncio.sleep(max(0.0, target - time.monotonic()))
            now_ms = (time.time() - t0) * 1e3
            self.connection.add_event(
                self.run_id,
                {
                    "type": "step",
                    "stage": self.stage,
                    "replica": 0,
                    "step": idx,
                    "start_ms": now_ms - 1,
                    "end_ms": now_ms,
                    "busy_ms": 1.0,
                    "samples_per_s": 1.0,
                    "id": f"{self.name}/{idx}",
                    "sent_at": time.time(),
                },
            )
            self.sent += 1


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _dashboard(
    url: str,
    run_id: int,
    latencies: list[float],
    seen: set[str],
    stop_at: asyncio.Event,
    watching: asyncio.Event,
) -> None:
    async with connect(
        url.replace("http", "ws") + f"/ws/runs/{run_id}",
        additional_headers=AUTH,
        max_size=2**26,
        compression=None,
    ) as socket:
        assert json.loads(await socket.recv())["type"] == "run"  # subscribed from here on
        watching.set()
        while not stop_at.is_set():
            try:
                message = json.loads(await asyncio.wait_for(socket.recv(), 1.0))
            except TimeoutError:
                continue
            if message["type"] == "metrics":
                now = time.time()
                for event in message["events"]:
                    latencies.append((now - event["sent_at"]) * 1e3)
                    seen.add(event["id"])


async def _rest_load(
    url: str,
    run_id: int,
    rate: int,
    stop_at: asyncio.Event,
    latencies: dict[str, list[float]],
    t0: float,
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=AUTH) as client:
        paths = itertools.cycle(
            [
                lambda: (f"/api/runs/{run_id}", None),
                lambda: ("/api/workers", None),
                lambda: (
                    f"/api/runs/{run_id}/metrics",
                    {"start_ms": (time.time() - t0) * 1e3 - 5000, "max_points": 500},
                ),
                lambda: ("/api/health", None),
                lambda: ("/api/plans", {"limit": 20}),
            ]
        )

        async def one(path: str, params: Any) -> None:
            started = time.perf_counter()
            response = await client.get(path, params=params)
            response.raise_for_status()
            latencies.setdefault(
                path.rsplit("/", 1)[-1] if path.endswith("metrics") else path, []
            ).append((time.perf_counter() - started) * 1e3)

        tasks = []
        while not stop_at.is_set():
            tasks.append(asyncio.create_task(one(*next(paths)())))
            await asyncio.sleep(1.0 / rate)
        await asyncio.gather(*tasks)


def _setup(url: str, num_workers: int) -> int:
    profile = httpx.post(
        f"{url}/api/profiles", headers=AUTH, json={"profile": small_profile(num_workers)}
    ).json()
    plan = httpx.post(
        f"{url}/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile["id"],
            "manual": {
                "boundaries": list(range(1, num_workers)),
                "num_microbatches": 4,
                "schedule": "gpipe",
            },
        },
    ).json()
    httpx.post(f"{url}/api/plans/{plan['id']}/approve", headers=AUTH).raise_for_status()
    run = httpx.post(
        f"{url}/api/runs",
        headers=AUTH,
        json={"plan_id": plan["id"], "model": "simulated", "steps": 1},
    )
    run.raise_for_status()
    return int(run.json()["id"])


async def _measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    workers = [
        SimulatedWorker(url, f"sim{i}", args.rate, args.seconds) for i in range(args.workers)
    ]
    serving = [asyncio.create_task(w.connection.serve_forever()) for w in workers]
    while sum(w.connection.connected.is_set() for w in workers) < args.workers:
        await asyncio.sleep(0.05)
    run_id = await asyncio.to_thread(_setup, url, args.workers)
    t0 = time.time()
    stop_at = asyncio.Event()
    dash_ms: list[float] = []
    rest_by_path: dict[str, list[float]] = {}
    seen: set[str] = set()
    watching = asyncio.Event()
    dashboard = asyncio.create_task(_dashboard(url, run_id, dash_ms, seen, stop_at, watching))
    await watching.wait()  # the load starts once the dashboard watches the run
    rest = asyncio.create_task(_rest_load(url, run_id, args.rest_rate, stop_at, rest_by_path, t0))
    await asyncio.gather(*(w.emit(t0) for w in workers))
    deadline = time.monotonic() + 30
    while any(w.connection.outbox.unacked or w.connection.outbox.num_events for w in workers):
        assert time.monotonic() < deadline, "the backend did not ack everything within 30 s"
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    stop_at.set()
    await asyncio.gather(dashboard, rest)
    for w in workers:
        await w.connection.close()
    for task in serving:
        task.cancel()
    async with httpx.AsyncClient(base_url=url, headers=AUTH) as client:
        stored = (await client.get(f"/api/runs/{run_id}/metrics", params={"max_points": 1})).json()[
            "total"
        ]
    sent = sum(w.sent for w in workers)
    rest_ms = [ms for values in rest_by_path.values() for ms in values]
    return {
        "sent": sent,
        "stored": stored,
        "lost_in_store": sent - stored,
        "lost_on_stream": sent - len(seen),
        "dashboard_p50_ms": _percentile(dash_ms, 0.5),
        "dashboard_p99_ms": _percentile(dash_ms, 0.99),
        "rest_requests": len(rest_ms),
        "rest_p50_ms": _percentile(rest_ms, 0.5),
        "rest_p99_ms": _percentile(rest_ms, 0.99),
        "rate_per_s": sent / args.seconds,
        "rest_mean_ms": statistics.fmean(rest_ms) if rest_ms else float("nan"),
        "rest_p99_by_path_ms": {
            path: round(_percentile(values, 0.99), 1)
            for path, values in sorted(rest_by_path.items())
        },
    }


def _database(kind: str, folder: Path) -> tuple[str, str | None]:
    if kind == "sqlite":
        return f"sqlite:///{folder / 'bench.db'}", None
    name = f"pipestudio_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql://postgres@127.0.0.1:5432/{name}", name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rate", type=int, default=100, help="events/s per worker")
    parser.add_argument("--rest-rate", type=int, default=50, help="REST requests/s")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--url", help="measure a backend already running there instead")
    args = parser.parse_args()
    if args.url:
        print(json.dumps(asyncio.run(_measure(args.url, args))))
        return 0
    failed = False
    for kind in args.databases.split(","):
        with tempfile.TemporaryDirectory() as folder:
            database_url, pg_name = _database(kind, Path(folder))
            backend, url = start_backend(database_url, Path(folder) / "backend.log")
            try:
                figures = asyncio.run(_measure(url, args))
            finally:
                stop(backend)
                if pg_name:
                    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                        admin.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
        ok = (
            figures["lost_in_store"] == 0
            and figures["lost_on_stream"] == 0
            and figures["dashboard_p99_ms"] < 250
            and figures["rest_p99_ms"] < 100
        )
        failed |= not ok
        print(
            f"{kind}: {args.workers} workers x {args.rate} events/s for {args.seconds:g} s: "
            f"sent {figures['sent']} ({figures['rate_per_s']:.0f}/s), stored "
            f"{figures['stored']}, lost {figures['lost_in_store']} in the store and "
            f"{figures['lost_on_stream']} on the stream; ingest->dashboard p50 "
            f"{figures['dashboard_p50_ms']:.1f} ms p99 {figures['dashboard_p99_ms']:.1f} ms "
            f"(target < 250); REST {figures['rest_requests']} requests p50 "
            f"{figures['rest_p50_ms']:.1f} ms p99 {figures['rest_p99_ms']:.1f} ms "
            f"(target < 100): {'ok' if ok else 'MISSED'}; REST p99 ms by path "
            f"{figures['rest_p99_by_path_ms']}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
