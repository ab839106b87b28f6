"""The worker agent's behaviour: what it does with each message from the backend.

It runs only the models it allows (``allowlist.py``): its built-in models, and the
factories that match the patterns it was started with. It checks an ``assign`` itself
before importing anything, whatever the backend decided: holding the API token is not a
shell on the workers.

A run can come back in a later attempt (resumed from its checkpoint after a failure), and
the stop of the earlier attempt may still be under way: what the agent holds is keyed by
(run, attempt), its ``store`` and ``run_state`` messages name the attempt, and ``stop``
ends the attempts up to the one it names."""

import asyncio
import logging
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from pipestudio.allowlist import model_allowed
from pipestudio.runtime.agent.connection import AgentConnection
from pipestudio.runtime.agent.devices import local_devices, reachable_address
from pipestudio.runtime.agent.identity import Identity
from pipestudio.runtime.agent.links import LinkProbe, measure_link
from pipestudio.runtime.agent.ranks import RankGroup, engine_config, open_store
from pipestudio.runtime.engine.network import address_of_interface, check_interface
from pipestudio.runtime.engine.rendezvous import StoreAddress
from pipestudio.runtime.models import MODELS

log = logging.getLogger("pipestudio.worker")
Key = tuple[int, int]  # (run_id, attempt)


class Agent:
    """Registers, starts the ranks it is assigned, relays events and commands."""

    def __init__(
        self,
        server: str,
        token: str,
        *,
        name: str | None = None,
        slots: int | None = None,
        device: str = "auto",
        advertise_host: str | None = None,
        interface: str | None = None,
        allowed_models: list[str] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.devices = local_devices(device)
        self.slots = slots if slots is not None else len(self.devices)
        self.name = name or socket.gethostname()
        self.allowed_models = list(allowed_models or [])
        #: The interface of this worker's ranks (``engine/network.py``); None: the one that
        #: holds ``host``.
        self.interface = check_interface(interface) if interface else None
        self.host = advertise_host or (
            address_of_interface(interface) if interface else reachable_address(server)
        )
        self.connection = AgentConnection(
            server,
            token,
            self._hello,
            self._handle,
            identity=Identity(state_dir, self.name, server),
        )
        self.assignments: dict[Key, dict[str, Any]] = {}
        self.groups: dict[Key, RankGroup] = {}
        self.stores: dict[Key, Any] = {}
        #: Where other workers measure their link to this one (``links.py``).
        self.probe = LinkProbe()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _hello(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "host": self.host,
            "devices": self.devices,
            "slots": self.slots,
            "models": sorted(MODELS),
            "allowed_models": self.allowed_models,
            "probe_port": self.probe.port,
            "runs": [
                {"run_id": run_id, "attempt": attempt, "ranks": [r["rank"] for r in a["ranks"]]}
                for (run_id, attempt), a in self.assignments.items()
            ],
        }

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.probe.start(self.host)
        try:
            await self.connection.serve_forever()
        finally:
            await self.probe.close()

    async def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "assign":
            await asyncio.to_thread(self._assign, message)
        elif kind == "rendezvous":
            await asyncio.to_thread(self._rendezvous, message)
        elif kind == "command":
            await asyncio.to_thread(self._command, message)
        elif kind in ("probe_expect", "measure_link"):
            # a measurement takes seconds: the connection goes on receiving meanwhile
            task = asyncio.create_task(self._link_request(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _link_request(self, message: dict[str, Any]) -> None:
        self.connection.reply(await self._link_answer(message))

    async def _link_answer(self, message: dict[str, Any]) -> dict[str, Any]:
        """Expect a peer's probe, or measure the link to one (``links.py``); the reply says
        what happened, a failure included."""
        reply: dict[str, Any] = {"request_id": message.get("request_id"), "ok": True}
        try:
            if message["type"] == "probe_expect":
                self.probe.expect(str(message["key"]))
                return reply
            seconds = min(max(float(message.get("seconds", 1.0)), 0.05), 30.0)
            measured = await asyncio.to_thread(
                measure_link,
                str(message["host"]),
                int(message["port"]),
                str(message["key"]),
                seconds,
            )
        except (KeyError, TypeError, ValueError, OSError) as exc:
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return {**reply, "ok": False, "message": f"worker {self.name}: {text}"[:2000]}
        return {
            **reply,
            "gbps": measured.gbps,
            "latency_ms": measured.latency_ms,
            "bytes": measured.bytes,
            "seconds": measured.seconds,
        }

    def _state(self, key: Key, state: str, text: str | None = None, *, retry: bool = True) -> None:
        """Report the ranks' state; ``retry`` false: this worker refused the assignment
        (its configuration, or a model that cannot be built here), which another attempt
        would most likely meet again."""
        self._post(
            {
                "type": "run_state",
                "run_id": key[0],
                "attempt": key[1],
                "state": state,
                "message": text,
                **({} if retry else {"retry": False}),
            }
        )

    def _post(self, message: dict[str, Any]) -> None:
        assert self._loop is not None, "the agent is not running"
        self._loop.call_soon_threadsafe(self.connection.send, message)

    def _assign(self, message: dict[str, Any]) -> None:
        key = _key(message)
        self.assignments[key] = message
        model = str(message["config"].get("model"))
        if not model_allowed(model, MODELS, self.allowed_models):
            self._end(
                key,
                "failed",
                f"worker {self.name} does not allow model {model!r}: "
                "it runs its built-in models and the factories matching its "
                "--allow-model patterns",
                retry=False,
            )
            return
        try:
            engine_config(message["config"])
        except ValueError as exc:
            self._end(key, "failed", f"worker {self.name}: {exc}", retry=False)
            return
        if message.get("open_store"):
            try:
                store = open_store(
                    int(message["world_size"]),
                    float(message["config"].get("timeout_s", 20.0)),
                    self.host,
                )
            except (RuntimeError, OSError) as exc:  # torch's DistNetworkError among them
                self._end(
                    key,
                    "failed",
                    f"worker {self.name} could not open the run's store on {self.host}: {exc}",
                )
                return
            self.stores[key] = store
            self._post(
                {
                    "type": "store",
                    "run_id": key[0],
                    "attempt": key[1],
                    "host": self.host,
                    "port": store.port,
                }
            )

    def _rendezvous(self, message: dict[str, Any]) -> None:
        key = _key(message)
        assignment = self.assignments.get(key)
        if assignment is None or key in self.groups:
            return
        run_id, attempt = key
        control_dir = tempfile.mkdtemp(prefix=f"pipestudio-run{run_id}-{attempt}-")
        config = engine_config(assignment["config"], control_dir)
        ranks = [int(r["rank"]) for r in assignment["ranks"]]
        address = StoreAddress(str(message["host"]), int(message["port"]), own_address=self.host)
        loop = self._loop
        assert loop is not None, "ranks start from inside the agent's event loop"

        def on_event(event: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(
                self.connection.add_event, run_id, {**event, "attempt": attempt}
            )

        group = RankGroup(
            run_id,
            config,
            ranks,
            address,
            on_event=on_event,
            on_end=lambda state, text, retry: self._end(key, state, text, retry=retry),
            host_ranks=_host_ranks(assignment),
            interface=self.interface,
        )
        self.groups[key] = group
        group.start()
        self._state(key, "running", f"ranks {ranks} started on {self.name}")

    def _end(self, key: Key, state: str, text: str | None, *, retry: bool = True) -> None:
        self._state(key, state, text, retry=retry)
        self.assignments.pop(key, None)
        group = self.groups.pop(key, None)
        self.stores.pop(key, None)
        if group is not None and group.config.migration is not None:
            shutil.rmtree(str(group.config.migration.control_dir), ignore_errors=True)

    def _keys(self, run_id: object, up_to: object = None) -> list[Key]:
        """This worker's attempts of the run (up to attempt ``up_to`` when it is given)."""
        return sorted(
            key
            for key in {*self.assignments, *self.groups}
            if key[0] == run_id and (not isinstance(up_to, int) or key[1] <= up_to)
        )

    def _command(self, message: dict[str, Any]) -> None:
        run_id, name = message.get("run_id"), message.get("command")
        payload = message.get("payload") or {}
        result = {
            "type": "command_result",
            "run_id": run_id,
            "command": name,
            "command_id": message.get("command_id"),
            "payload": payload,
        }
        keys = self._keys(run_id)
        group = self.groups.get(keys[-1]) if keys else None
        if name == "stop":
            for key in self._keys(run_id, payload.get("attempt")):
                if key in self.groups:
                    self.groups[key].stop()
                else:
                    self._end(key, "stopped", "stopped before the ranks started")
            self._post({**result, "ok": True, "message": "stopped"})
        elif name == "migrate":
            ok, text = migrate(group, payload)
            self._post({**result, "ok": ok, "message": f"{self.name}: {text}"})
        else:
            self._post({**result, "ok": False, "message": f"unknown command {name!r}"})


def _key(message: dict[str, Any]) -> Key:
    """The (run, attempt) an ``assign`` or ``rendezvous`` is about."""
    return int(message["run_id"]), int(message.get("attempt", 0))


def _host_ranks(assignment: dict[str, Any]) -> int | None:
    """How many of the run's ranks the server placed on this host (None: it did not say,
    or said something that is no count of ranks; the worker then counts its own)."""
    value = assignment.get("host_ranks")
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 4096:
        return value
    return None


def migrate(group: RankGroup | None, payload: dict[str, Any]) -> tuple[bool, str]:
    """Hand an approved proposal's new stages to the running job."""
    if group is None:
        return False, "this worker runs no rank of the run"
    try:
        stages = [list(stage["layers"]) for stage in payload["new_plan"]["stages"]]
    except (KeyError, TypeError):
        return False, "the migrate command carries no new_plan with stages"
    return group.migrate(stages)
