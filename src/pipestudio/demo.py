"""``make demo``: the whole system on this machine, seeded and ready in the browser.

It starts ``pipestudio serve`` (backend and dashboard in one process, SQLite under
``--state-dir``) and two CPU ``pipestudio worker`` agents, then seeds through the REST API,
as any client would: a profile of the built-in ``gpt`` model measured here, the PipeDream
profiles, a cluster of two CPU devices, and two approved ``gpt`` plans, one balanced and
one deliberately unbalanced (to watch the online planner propose a repartition). Seeding is
idempotent: a second start reuses what the database already holds.

Every process it starts runs in one process group of its own; Ctrl-C (SIGINT) or SIGTERM
stops the whole group, engine processes included.
"""

import argparse
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from pipestudio.planner import Profile, load_document
from pipestudio.planner.formats.cluster import cluster_template

#: The checkout (or the image's /app): profiles/ lies beside src/.
ROOT = Path(__file__).resolve().parents[2]
PIPEDREAM_DIR = ROOT / "profiles" / "pipedream"
DEFAULT_PORT = 8000
NUM_WORKERS = 2
#: Small enough to profile in seconds on a laptop CPU and to train a step in well under one.
GPT_ARGS = {"layers": "8", "width": "128", "heads": "4", "seq_len": "64", "vocab": "512"}
GPT_MICROBATCH_SIZE = 4
GPT_PROFILE_NAME = "gpt (measured on this machine)"
CLUSTER_NAME = "demo: 2 CPU workers"
#: Minibatch size each PipeDream file was profiled at (profiles/pipedream/SOURCE.md).
PIPEDREAM_BATCH_SIZES = {
    "alexnet": 256,
    "densenet121": 64,
    "gnmt": 32,
    "gnmt_large": 128,
    "inception_v3": 128,
    "nasnetalarge": 16,
    "nasnetamobile": 128,
    "resnet101": 64,
    "resnet18": 256,
    "resnet50": 128,
    "resnext101": 64,
    "resnext50": 128,
    "squeezenet1_0": 256,
    "vgg16": 128,
}
STARTUP_TIMEOUT_S = 120.0


class DemoError(ValueError):
    """The demo cannot start as asked (port taken, a process that exits, a refused call)."""


class Stop(Exception):
    """SIGTERM arrived: unwind as Ctrl-C does."""


class ProcessGroup:
    """Child processes in one process group (the first child's), stopped together."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir, self.env = log_dir, env
        self.pgid: int | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        pgid = self.pgid or 0
        with (self.log_dir / f"{name}.log").open("wb") as log:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=lambda: os.setpgid(0, pgid),
            )
        self.pgid = self.pgid or child.pid
        self.children[name] = child
        return child

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def check(self, name: str) -> None:
        code = self.children[name].poll()
        if code is not None:
            tail = "\n".join(self.log(name).splitlines()[-15:])
            raise DemoError(
                f"{name} exited with status {code}; the end of {self.log_dir / name}.log:\n{tail}"
            )

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the group, then SIGKILL to whatever is left after ``grace_s``."""
        if self.pgid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        for child in self.children.values():
            child.wait()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipestudio.demo",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port of the backend and dashboard; 0 picks a free one (default {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--no-workers",
        action="store_true",
        help="start no worker agents (runs cannot be launched until some register)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".pipestudio"),
        help="where the SQLite database, logs and the measured profile go (default .pipestudio)",
    )
    return parser.parse_args(argv)


def check_port(host: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise DemoError(f"--port must be 0..65535, got {port}")
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise DemoError(
                f"port {port} on {host} is not free ({exc.strerror}); pick "
                'another with --port N (make demo ARGS="--port 8080") or '
                "--port 0 for any free port"
            ) from None


def wait_for_backend(group: ProcessGroup) -> str:
    """The backend's URL once ``/api/health`` answers (its log names the port it got)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        group.check("serve")
        found = re.findall(r"backend on (http://\S+:\d+)", group.log("serve"))
        if found:
            url = re.sub(r"//(0\.0\.0\.0|\[?::\]?):", "//127.0.0.1:", found[-1])
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/health", timeout=2).status_code == 200:
                    return url
        time.sleep(0.2)
    raise DemoError(
        f"the backend did not answer within {STARTUP_TIMEOUT_S:.0f} s; see "
        f"{group.log_dir / 'serve.log'}"
    )


def wait_for_workers(group: ProcessGroup, url: str, count: int) -> int:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        for idx in range(count):
            group.check(f"worker{idx}")
        online = int(httpx.get(f"{url}/api/health", timeout=5).json()["workers_online"])
        if online >= count or time.monotonic() > deadline:
            return online
        time.sleep(0.5)


def measure_gpt(group: ProcessGroup, path: Path) -> list[subprocess.Popen[bytes]]:
    """Profile ``gpt`` as the seeded plans' ranks will run it, unless an earlier start
    already did: one profiler per rank at once (they share this host's caches and memory
    bandwidth as the ranks do), each with the threads a rank will get; ``merge_gpt`` takes
    each layer's median."""
    if path.exists():
        return []
    model_args = [
        arg for key, value in GPT_ARGS.items() for arg in ("--model-arg", f"{key}={value}")
    ]
    return [
        group.start(
            f"profile{idx}",
            [
                sys.executable,
                "-m",
                "pipestudio",
                "profile",
                "--model",
                "gpt",
                *model_args,
                "--microbatch-size",
                str(GPT_MICROBATCH_SIZE),
                "--repeats",
                "7",
                "--warmup",
                "2",
                "--ranks-per-host",
                str(NUM_WORKERS),
                "-o",
                str(_part(path, idx)),
            ],
        )
        for idx in range(NUM_WORKERS)
    ]


def merge_gpt(group: ProcessGroup, profilers: list[subprocess.Popen[bytes]], path: Path) -> None:
    """Wait for the profilers, then write their median profile to ``path``."""
    from pipestudio.runtime.profiler import median_profile  # torch: only when profiling

    for idx, profiler in enumerate(profilers):
        if profiler.wait() != 0:
            group.check(f"profile{idx}")
    parts = [_part(path, idx) for idx in range(len(profilers))]
    merged = median_profile([load_document(Profile, part) for part in parts])
    path.write_text(merged.to_json())
    for part in parts:
        part.unlink()


def _part(path: Path, idx: int) -> Path:
    return path.with_name(f"{path.stem}.part{idx}.json")


class Seeder:
    """Creates the demo's documents through the REST API, reusing those already there."""

    def __init__(self, url: str, token: str) -> None:
        self.client = httpx.Client(
            base_url=f"{url}/api", timeout=120, headers={"Authorization": f"Bearer {token}"}
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.client.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise DemoError(
                f"{method} /api{path} answered {response.status_code}: {response.text[:500]}"
            )
        return response.json()

    def names(self, resource: str) -> dict[str, dict[str, Any]]:
        rows = self.call("GET", f"/{resource}", params={"limit": 1000})["data"]
        return {row["name"]: row for row in rows}

    def profile(self, name: str, body: dict[str, Any], known: dict[str, Any]) -> int:
        if name not in known:
            known[name] = self.call("POST", "/profiles", json={"name": name, **body})
        return int(known[name]["id"])

    def pipedream(self) -> int:
        known = self.names("profiles")
        for model, batch_size in PIPEDREAM_BATCH_SIZES.items():
            graph = PIPEDREAM_DIR / model / "graph.txt"
            if graph.exists():
                self.profile(
                    f"{model} (PipeDream)",
                    {
                        "format": "pipedream",
                        "graph": graph.read_text(),
                        "model": model,
                        "batch_size": batch_size,
                    },
                    known,
                )
        return sum(name.endswith("(PipeDream)") for name in known)

    def cluster(self) -> int:
        known = self.names("clusters")
        if CLUSTER_NAME not in known:
            document = cluster_template(
                [NUM_WORKERS], [10.0], device_memory_bytes=4 * 2**30, name=CLUSTER_NAME
            )
            known[CLUSTER_NAME] = self.call(
                "POST",
                "/clusters",
                json={"name": CLUSTER_NAME, "cluster": document.model_dump(mode="json")},
            )
        return int(known[CLUSTER_NAME]["id"])

    def approved_plan(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """The approved (or launched) plan called ``name``; made and approved when there is
        none. Approved with ``force``: the demo's workers may not have registered yet, and
        the plans are made for the demo's own cluster, which they fit."""
        plans = self.call("GET", "/plans", params={"limit": 1000})
        for plan in plans["data"]:
            if plan["name"] == name and plan["state"] in ("approved", "launched"):
                return dict(plan)
        plan = self.call("POST", "/plans", json={"name": name, "author": "demo", **body})
        return dict(self.call("POST", f"/plans/{plan['id']}/approve", params={"force": "true"}))

    def gpt_plans(self, profile_id: int, cluster_id: int, num_layers: int) -> list[dict[str, Any]]:
        common = {"profile_id": profile_id, "cluster_id": cluster_id}
        shape = {"num_microbatches": 4, "schedule": "1f1b"}
        balanced = self.approved_plan(
            "gpt: 2 stages balanced by time",
            {**common, "planner": {"algorithm": "balance-time", "num_stages": 2, **shape}},
        )
        unbalanced = self.approved_plan(
            "gpt: 2 stages, unbalanced (try a repartition)",
            {**common, "manual": {"boundaries": [num_layers - 2], **shape}},
        )
        return [balanced, unbalanced]


def seed_gpt(seeder: Seeder, profile_path: Path, cluster_id: int) -> list[str]:
    """The measured gpt profile and its two approved plans; one line per thing seeded."""
    document = json.loads(profile_path.read_text())
    gpt_id = seeder.profile(GPT_PROFILE_NAME, {"profile": document}, seeder.names("profiles"))
    lines = [f"profile {gpt_id}: {GPT_PROFILE_NAME}, {len(document['layers'])} layers"]
    for plan in seeder.gpt_plans(gpt_id, cluster_id, len(document["layers"])):
        summary = plan.get("summary") or {}
        lines.append(
            f"plan {plan['id']}: {plan['name']} ({plan['state']}, predicted "
            f"{summary.get('step_time_ms', float('nan')):.1f} ms/step)"
        )
    return lines


def dashboard_served(url: str) -> bool:
    """Whether ``url`` serves the dashboard: its pages, or (signed out, as the demo is)
    the dashboard's sign-in page that ``/`` sends a newcomer to."""
    with contextlib.suppress(httpx.HTTPError):
        page = httpx.get(f"{url}/", timeout=10, follow_redirects=True)
        return page.status_code == 200 and (
            "_dash-config" in page.text or "PipeStudio · Sign in" in page.text
        )
    return False


def start(args: argparse.Namespace, group: ProcessGroup, token: str) -> tuple[str, list[str]]:
    """Start the backend, the profiler and the workers; seed; answer the URL and a summary."""
    group.start(
        "serve",
        [
            sys.executable,
            "-m",
            "pipestudio",
            "serve",
            "--host",
            args.host,
            "--port",
            str(args.port),
        ],
    )
    profile_path = args.state_dir / "demo" / "gpt.profile.json"
    url = wait_for_backend(group)
    # measured alone: the workers and the backend starting up beside it slowed its layers
    # by several times, unevenly, and the predictions with them
    profilers = measure_gpt(group, profile_path)
    if profilers:
        print("measuring the gpt model on this machine...", flush=True)
        merge_gpt(group, profilers, profile_path)
    num_workers = 0 if args.no_workers else NUM_WORKERS
    for idx in range(num_workers):
        group.start(
            f"worker{idx}",
            [
                sys.executable,
                "-m",
                "pipestudio",
                "worker",
                "--server",
                url,
                "--slots",
                "1",
                "--device",
                "cpu",
                "--name",
                f"demo-cpu-{idx}",
                "--state-dir",
                str(args.state_dir / "workers"),
            ],
        )
    seeder = Seeder(url, token)
    lines = [f"{seeder.pipedream()} PipeDream profiles"]
    cluster_id = seeder.cluster()
    lines.append(f"cluster {cluster_id}: {CLUSTER_NAME}")
    lines[:0] = seed_gpt(seeder, profile_path, cluster_id)
    online = wait_for_workers(group, url, num_workers) if num_workers else 0
    lines.append(f"{online} of {num_workers} CPU workers online")
    if not dashboard_served(url):
        lines.append(
            f"WARNING: {url}/ serves no dashboard; install the `dashboard` extra "
            f"(see {group.log_dir / 'serve.log'})"
        )
    return url, lines


@contextlib.contextmanager
def sigterm_as_stop() -> Iterator[None]:
    def handler(_signum: int, _frame: Any) -> None:
        raise Stop

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def banner(url: str, token: str, lines: list[str], log_dir: Path) -> str:
    seeded = "\n".join(f"  - {line}" for line in lines)
    return (
        f"\nPipeStudio is running.\n\n  dashboard   {url}/\n  REST API    {url}/api/ "
        f"(OpenAPI {url}/docs)\n  API token   {token}\n  logs        {log_dir}/\n\n"
        f"Seeded:\n{seeded}\n\nOpen the dashboard and sign in: leave Name empty and paste "
        f"the API token\nas the password ({url}/login). Then go to Runs, pick a gpt plan "
        "and press Launch.\nPress Ctrl-C to stop every process the demo started.\n"
    )


def demo_token(path: Path) -> str:
    """The demo's API token, kept in ``path`` (readable by its owner only), so that a
    signed-in browser and the scripts written against one start still work after the
    next; a file that holds no token (edited, truncated) gets a new one."""
    try:
        kept = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        kept = ""
    if re.fullmatch(r"[A-Za-z0-9_-]{24,128}", kept):
        path.chmod(0o600)  # whoever loosened it, only its owner reads it
        return kept
    token = secrets.token_urlsafe(18)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as file:
        file.write(token + "\n")
    return token


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_dir = args.state_dir / "demo"
    log_dir.mkdir(parents=True, exist_ok=True)
    token = os.environ.get("PIPESTUDIO_API_TOKEN") or demo_token(log_dir / "api-token")
    database = (args.state_dir / "pipestudio.db").resolve()
    env = {
        **os.environ,
        "PIPESTUDIO_API_TOKEN": token,
        "PYTHONUNBUFFERED": "1",
        "PIPESTUDIO_DATABASE_URL": f"sqlite:///{database}",
        "PIPESTUDIO_CHECKPOINT_DIR": str((args.state_dir / "checkpoints").resolve()),
    }
    env.setdefault("PIPESTUDIO_WORKER_TOKEN", token)
    group = ProcessGroup(log_dir, env)
    with sigterm_as_stop():
        try:
            check_port(args.host, args.port)
            url, lines = start(args, group, token)
            print(banner(url, token, lines, log_dir), flush=True)
            while True:
                for name in group.children:
                    if not name.startswith("profile"):
                        group.check(name)
                time.sleep(1)
        except DemoError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, Stop):
            print("\nstopping...", flush=True)
            return 0
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut it short
            group.stop()


if __name__ == "__main__":
    sys.exit(main())
