"""The command channel of a running job, and the Python API to drive it.

Interface for the worker agent and other controllers. A job started with a control
directory (``pipestudio train --control-dir DIR``, or ``EngineConfig.migration.
control_dir``) reads commands from it and writes back what became of them; everything is
a JSON file written atomically (temporary name, then rename):

``DIR/commands/NNNNNN.json``   posted by a controller, numbered from 1 (``post``):
    ``{"command": "migrate", "moves": [[layer, stage], ...]}`` or
    ``{"command": "migrate", "stages": [[layers of stage 0], ...]}``, optionally with
    ``"step": S`` (not before step S); ``{"command": "approve", "proposal": ID}``;
    ``{"command": "reject", "proposal": ID}``.
``DIR/status/NNNNNN.json``     written by the job for each command: ``{"accepted": bool,
    "reason": str, "migration": ID, "step": S}``; ``step`` is the step whose micro-batches
    are the first to run on the new partition.
``DIR/proposals/ID.json``      written by the job's online planner: ``{"id", "status":
    "held"|"applied"|"rejected", "step", "proposal": <Proposal document>}``.

The same facts stream as events to the job's sink (``proposal``, ``migration``), which is
what the agent forwards to the backend. Rank 0 of the job reads the directory once per
step, so a controller needs only a file system shared with rank 0's machine.

``Controller(DIR)`` wraps the files (``migrate``, ``propose``, ``approve``, ``reject``,
``status``, ``proposals``); ``job.Job(config)`` runs a job in a background thread of this
process with a fresh control directory and its controller.
"""

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipestudio.runtime.engine.errors import EngineError


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    tmp.replace(path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def post(control_dir: str, command: dict[str, Any]) -> int:
    """Post ``command``; its number (the name of its status file)."""
    folder = Path(control_dir) / "commands"
    folder.mkdir(parents=True, exist_ok=True)
    seq = 1 + max((int(p.stem) for p in folder.glob("[0-9]*.json")), default=0)
    while True:
        try:
            fd = os.open(folder / f"{seq:06d}.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            seq += 1
            continue
        os.close(fd)
        write_json(folder / f"{seq:06d}.json", command)
        return seq


def pending_commands(control_dir: str, after_seq: int) -> list[tuple[int, dict[str, Any]]]:
    """Commands numbered above ``after_seq``, in order (read by rank 0)."""
    folder = Path(control_dir) / "commands"
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("[0-9]*.json")):
        seq = int(path.stem)
        payload = read_json(path) if seq > after_seq else None
        if payload is not None:
            found.append((seq, payload))
    return found


class Controller:
    """Post commands to a job's control directory and read what became of them."""

    def __init__(self, control_dir: str) -> None:
        self.control_dir = control_dir

    def migrate(
        self,
        moves: Sequence[tuple[str, int]] | None = None,
        stages: Sequence[Sequence[str]] | None = None,
        step: int | None = None,
    ) -> int:
        """Apply a repartition as soon as possible (or not before ``step``)."""
        if (moves is None) == (stages is None):
            raise EngineError("give either moves [(layer, stage), ...] or stages")
        command: dict[str, Any] = {"command": "migrate"}
        if moves is not None:
            command["moves"] = [[layer, stage] for layer, stage in moves]
        else:
            command["stages"] = [list(names) for names in stages or []]
        if step is not None:
            command["step"] = step
        return post(self.control_dir, command)

    def propose(self, moves: Sequence[tuple[str, int]]) -> int:
        """Hold a repartition as a proposal of the job, to approve later."""
        return post(
            self.control_dir,
            {"command": "propose", "moves": [[layer, stage] for layer, stage in moves]},
        )

    def approve(self, proposal_id: int) -> int:
        return post(self.control_dir, {"command": "approve", "proposal": proposal_id})

    def reject(self, proposal_id: int) -> int:
        return post(self.control_dir, {"command": "reject", "proposal": proposal_id})

    def status(self, seq: int) -> dict[str, Any] | None:
        result: dict[str, Any] | None = read_json(
            Path(self.control_dir) / "status" / f"{seq:06d}.json"
        )
        return result

    def wait_status(self, seq: int, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (status := self.status(seq)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"command {seq} got no answer within {timeout_s} s")
            time.sleep(0.05)
        return status

    def proposals(self) -> list[dict[str, Any]]:
        folder = Path(self.control_dir) / "proposals"
        found = (read_json(path) for path in sorted(folder.glob("*.json")))
        return [p for p in found if p is not None]
