"""The worker agent's behaviour: what it does with each message from the backend."""

import asyncio
import logging
import os
import shutil
import socket
import tempfile
from typing import Any

from pipestudio.runtime.agent.connection import AgentConnection
from pipestudio.runtime.agent.devices import local_devices, reachable_address
from pipestudio.runtime.agent.ranks import RankGroup, engine_config, open_store
from pipestudio.runtime.engine.rendezvous import StoreAddress

log = logging.getLogger("pipestudio.worker")


class Agent:
    """Registers, starts the ranks it is assigned, relays events and commands."""

    def __init__(self, server: str, token: str, *, name: str | None = None,
                 slots: int | None = None, device: str = "auto",
                 advertise_host: str | None = None) -> None:
        self.devices = local_devices(device)
        self.slots = slots if slots is not None else len(self.devices)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.host = advertise_host or reachable_address(server)
        self.connection = AgentConnection(server, token, self._hello, self._handle)
        self.assignments: dict[int, dict[str, Any]] = {}
        self.groups: dict[int, RankGroup] = {}
        self.stores: dict[int, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def _hello(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "devices": self.devices,
                "slots": self.slots,
                "runs": [{"run_id": run_id, "ranks": [r["rank"] for r in a["ranks"]]}
                         for run_id, a in self.assignments.items()]}

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.connection.serve_forever()

    async def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "assign":
            await asyncio.to_thread(self._assign, message)
        elif kind == "rendezvous":
            await asyncio.to_thread(self._rendezvous, message)
        elif kind == "command":
            await asyncio.to_thread(self._command, message)

    def _state(self, run_id: int, state: str, text: str | None = None) -> None:
        self._post({"type": "run_state", "run_id": run_id, "state": state, "message": text})

    def _post(self, message: dict[str, Any]) -> None:
        assert self._loop is not None, "the agent is not running"
        self._loop.call_soon_threadsafe(self.connection.send, message)

    def _assign(self, message: dict[str, Any]) -> None:
        run_id = int(message["run_id"])
        self.assignments[run_id] = message
        try:
            engine_config(message["config"])
        except ValueError as exc:
            self._end(run_id, "failed", f"worker {self.name}: {exc}")
            return
        if message.get("open_store"):
            store = open_store(int(message["world_size"]),
                               float(message["config"].get("timeout_s", 20.0)))
            self.stores[run_id] = store
            self._post({"type": "store", "run_id": run_id, "host": self.host,
                        "port": store.port})

    def _rendezvous(self, message: dict[str, Any]) -> None:
        run_id = int(message["run_id"])
        assignment = self.assignments.get(run_id)
        if assignment is None or run_id in self.groups:
            return
        control_dir = tempfile.mkdtemp(prefix=f"pipestudio-run{run_id}-")
        config = engine_config(assignment["config"], control_dir)
        ranks = [int(r["rank"]) for r in assignment["ranks"]]
        address = StoreAddress(str(message["host"]), int(message["port"]))
        loop = self._loop
        group = RankGroup(
            run_id, config, ranks, address,
            on_event=lambda event: loop.call_soon_threadsafe(
                self.connection.add_event, run_id, event),
            on_end=lambda state, text: self._end(run_id, state, text))
        self.groups[run_id] = group
        group.start()
        self._state(run_id, "running", f"ranks {ranks} started on {self.name}")

    def _end(self, run_id: int, state: str, text: str | None) -> None:
        self._state(run_id, state, text)
        self.assignments.pop(run_id, None)
        group = self.groups.pop(run_id, None)
        self.stores.pop(run_id, None)
        if group is not None and group.config.repartition is not None:
            shutil.rmtree(str(group.config.repartition.control_dir), ignore_errors=True)

    def _command(self, message: dict[str, Any]) -> None:
        run_id, name = message.get("run_id"), message.get("command")
        result = {"type": "command_result", "run_id": run_id, "command": name,
                  "command_id": message.get("command_id"),
                  "payload": message.get("payload", {})}
        group = self.groups.get(run_id) if isinstance(run_id, int) else None
        if name == "stop":
            if group is not None:
                group.stop()
            elif isinstance(run_id, int) and run_id in self.assignments:
                self._end(run_id, "stopped", "stopped before the ranks started")
            self._post({**result, "ok": True, "message": "stopped"})
        elif name == "migrate":
            ok, text = migrate(group, message.get("payload", {}))
            self._post({**result, "ok": ok, "message": f"{self.name}: {text}"})
        else:
            self._post({**result, "ok": False, "message": f"unknown command {name!r}"})


def migrate(group: RankGroup | None, payload: dict[str, Any]) -> tuple[bool, str]:
    """Hand an approved proposal's new stages to the running job."""
    if group is None:
        return False, "this worker runs no rank of the run"
    try:
        stages = [list(stage["layers"]) for stage in payload["new_plan"]["stages"]]
    except (KeyError, TypeError):
        return False, "the migrate command carries no new_plan with stages"
    return group.migrate(stages)
