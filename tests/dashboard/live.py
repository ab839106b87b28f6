"""A live stack for browser tests: backend and dashboard in one uvicorn server on a free
port (in a thread of the test process), and worker agents as subprocesses."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from pipestudio.backend.app import create_app
from pipestudio.backend.settings import Settings
from pipestudio.dashboard.app import create_dashboard

TOKEN = "browser-test-token"


class LiveStack:
    """``pipestudio serve`` with the dashboard mounted at /, as the demo runs it."""

    def __init__(self, database_path: Path) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        dashboard = create_dashboard(self.url)
        # proposals come by themselves at any drift, checked every 2 s: an unbalanced plan
        # gets one within seconds of its first measured steps
        app = create_app(
            Settings(
                database_url=f"sqlite:///{database_path}",
                api_token=TOKEN,
                auto_propose_drift=0.0,
                auto_propose_every_s=2.0,
            ),
            dashboard=dashboard.server,
        )
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.workers: list[subprocess.Popen[bytes]] = []

    def start(self) -> "LiveStack":
        self.thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"the backend at {self.url} did not start within 30 s")

    def start_workers(self, count: int, log_dir: Path) -> None:
        for idx in range(count):
            log = (log_dir / f"worker{idx}.log").open("wb")
            self.workers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "pipestudio",
                        "worker",
                        "--server",
                        self.url,
                        "--token",
                        TOKEN,
                        "--slots",
                        "1",
                        "--device",
                        "cpu",
                        "--name",
                        f"w{idx}",
                        "--state-dir",
                        str(log_dir / "worker-state"),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def wait_for_workers(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            online = httpx.get(f"{self.url}/api/health", timeout=5).json()["workers_online"]
            if online >= count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"{count} workers did not register within {timeout_s} s")

    def stop(self) -> None:
        for worker in self.workers:
            worker.terminate()
        for worker in self.workers:
            try:
                worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.kill()
        self.server.should_exit = True
        self.thread.join(timeout=10)
