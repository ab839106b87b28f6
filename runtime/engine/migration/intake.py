"""Rank 0's intake of commands: what the control directory asks (``commands.py``), and the
proposals held there until a person approves or rejects them.

A ``migrate`` command is queued for the coordinator; a ``propose`` command is checked at
once and held; ``approve`` queues a held proposal and ``reject`` drops it. Each command gets
a status file (accepted or not, and why), each proposal a file saying whether it is held,
applied or rejected.
"""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.proposal import Proposal
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.migration.commands import pending_commands, write_json
from pipestudio.runtime.engine.migration.settings import MigrationSettings

#: A request for a migration: its ``moves`` or its ``stages`` (and ``policies``), its
#: ``source`` (scripted, command, approved, auto), and the ``seq`` of the command or the
#: ``proposal`` it answers.
Request = dict[str, Any]


class CommandIntake:
    """The commands read and the proposals held (module docstring). ``target`` checks a
    request against the job's plan; ``queue`` hands an accepted one to the coordinator."""

    def __init__(
        self,
        settings: MigrationSettings,
        target: Callable[[Request, Plan], Plan],
        plan: Plan,
        queue: Callable[[Request], None],
    ) -> None:
        self.control_dir = settings.control_dir
        self.target, self.plan, self.queue = target, plan, queue
        self.seen_seq = 0  # the last command read
        self.next_proposal = 1
        self.held: dict[int, dict[str, Any]] = {}  # id -> stages, policies, proposal

    def where(self) -> str | None:
        """The control directory, resolved: a resumed run with the same one goes on from
        the commands and proposals its checkpoint records."""
        return os.path.realpath(self.control_dir) if self.control_dir else None

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the intake."""
        return {
            "control_dir": self.where(),
            "seen": self.seen_seq,
            "next_proposal": self.next_proposal,
            "held": {str(pid): held for pid, held in self.held.items()},
        }

    def restore(self, record: dict[str, Any]) -> None:
        self.seen_seq, self.next_proposal = record["seen"], record["next_proposal"]
        self.held = {int(pid): held for pid, held in record["held"].items()}

    def read(self) -> None:
        """Take the commands written since the last read."""
        if not self.control_dir:
            return
        for seq, command in pending_commands(self.control_dir, self.seen_seq):
            self.seen_seq = max(self.seen_seq, seq)
            kind = command.get("command")
            if kind in ("migrate", "propose"):
                request = {**command, "seq": seq, "source": "command"}
                if kind == "migrate":
                    self.queue(request)
                else:
                    self._hold_command(request)
            elif kind in ("approve", "reject") and command.get("proposal") in self.held:
                held = self.held.pop(command["proposal"])
                if kind == "approve":
                    self.queue(
                        {
                            "stages": held["stages"],
                            "policies": held["policies"],
                            "seq": seq,
                            "proposal": command["proposal"],
                            "source": "approved",
                        }
                    )
                else:
                    self._proposal_file(command["proposal"], "rejected", None)
                    self._status(seq, {"accepted": True, "reason": "rejected"})
            else:
                self._status(
                    seq, {"accepted": False, "reason": f"unknown command or proposal: {command}"}
                )

    def hold(self, target: Plan, proposal: Proposal | None) -> int:
        """Hold ``target`` for approval; its proposal's id."""
        pid = self.next_proposal
        self.next_proposal += 1
        self.held[pid] = {
            "stages": [s.layers for s in target.stages],
            "policies": dict(target.policies),
            "proposal": None if proposal is None else proposal.model_dump(mode="json"),
        }
        self._proposal_file(pid, "held", None)
        return pid

    def release(self, pid: int) -> dict[str, Any]:
        """A held proposal, no longer held (applied without asking)."""
        return self.held.pop(pid)

    def answer(self, request: Request, status: dict[str, Any]) -> None:
        """Tell the command, or the proposal, that ``request`` came from what became of it."""
        if request.get("seq"):
            self._status(request["seq"], status)
        if request.get("proposal"):
            self._proposal_file(
                request["proposal"],
                "applied" if status["accepted"] else "rejected",
                status.get("step"),
            )

    def _hold_command(self, request: Request) -> None:
        """A migration posted as a proposal: checked now, held until approved."""
        try:
            target = self.target(request, self.plan)
        except (EngineError, ValueError) as exc:
            self._status(request["seq"], {"accepted": False, "reason": str(exc)})
            return
        pid = self.hold(target, None)
        self._status(request["seq"], {"accepted": True, "reason": "held", "proposal": pid})

    def _status(self, seq: int, status: dict[str, Any]) -> None:
        if self.control_dir:
            write_json(_path(self.control_dir, "status", seq), status)

    def _proposal_file(self, pid: int, status: str, step: int | None) -> None:
        if self.control_dir is None:
            return
        path = _path(self.control_dir, "proposals", pid)
        held = self.held.get(pid)
        previous = (
            held["proposal"]
            if held
            else (json.loads(path.read_text()).get("proposal") if path.exists() else None)
        )
        write_json(path, {"id": pid, "status": status, "step": step, "proposal": previous})


def _path(control_dir: str, kind: str, number: int) -> Path:
    return Path(control_dir) / kind / f"{number:06d}.json"
