"""``python -m pipestudio.demo`` as a user starts it, on a port the OS picks and a state
directory of the test's own; its banner read back, and a check that stopping it leaves no
process of its group behind."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT


class Demo:
    def __init__(self, state_dir: Path, *options: str) -> None:
        self.state_dir = state_dir
        self.output = state_dir / "demo-output.txt"
        state_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIPESTUDIO_")}
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipestudio.demo",
                    "--port",
                    "0",
                    "--state-dir",
                    str(state_dir),
                    *options,
                ],
                cwd=ROOT,
                env={**env, "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.url = self.token = ""
        self.pgid: int | None = None

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_until_running(self, timeout_s: float) -> str:
        """The banner, once the demo printed it; fails with the demo's output otherwise."""
        deadline = time.monotonic() + timeout_s
        while "Press Ctrl-C" not in self.text():
            assert self.process.poll() is None, f"the demo exited:\n{self.text()}\n{self.logs()}"
            assert time.monotonic() < deadline, (
                f"the demo was not up within {timeout_s:.0f} s:\n{self.text()}\n{self.logs()}"
            )
            time.sleep(0.3)
        text = self.text()
        self.url = re.search(r"dashboard\s+(http://\S+)/", text)[1]
        self.token = re.search(r"API token\s+(\S+)", text)[1]
        serve_pid = int(
            subprocess.check_output(
                ["pgrep", "-f", "-P", str(self.process.pid), "pipestudio serve"]
            ).split()[0]
        )
        self.pgid = os.getpgid(serve_pid)
        return text

    def logs(self) -> str:
        logs = sorted((self.state_dir / "demo").glob("*.log"))
        return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs)

    def group(self) -> list[str]:
        """The processes (not zombies) still in the demo's process group."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                text = stat.read_text()
                state, _ppid, pgrp = text[text.rindex(")") + 2 :].split()[:3]
                if int(pgrp) == self.pgid and state != "Z":
                    found.append(text[: text.rindex(")") + 1])
        return found

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 30) -> tuple[int, list[str]]:
        """Send ``sig`` to the demo alone; its status once it has ended, and what of its
        process group outlived it (killed here, so that no test leaves processes behind)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            status = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = self.process.wait()
        left = self.group() if self.pgid is not None else []
        if left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
        return status, left
