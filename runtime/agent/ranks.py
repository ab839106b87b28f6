"""The engine processes of one run on this worker: one per assigned rank.

Each process runs ``engine.rank.run_rank`` against the run's TCPStore and streams its
events back over its own pipe (as the local launcher does). A reader thread passes them on
and, when every process has ended, reports how: ``finished``, ``failed`` (with the first
error) or ``stopped``, and whether another attempt could succeed. The first error is the
first that names a ``cause`` (a non-finite loss: the rank that computed it reports the
reason, and the others' reports of their failed waits on it can reach the reader first),
else the first to arrive; ``retry`` is false when an error event said so. Processes die
with the agent (``PR_SET_PDEATHSIG``), so a killed worker leaves no rank behind holding
its peers.
"""

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, cast

import torch.distributed as dist

from pipestudio.planner import Plan
from pipestudio.runtime.engine import EngineConfig, check_config
from pipestudio.runtime.engine.migration.commands import Controller
from pipestudio.runtime.engine.migration.settings import MigrationSettings
from pipestudio.runtime.engine.network import INTERFACE_VARIABLE
from pipestudio.runtime.engine.rank import exit_now, run_rank_reporting
from pipestudio.runtime.engine.rendezvous import StoreAddress, join_timeout_s

Event = dict[str, Any]
_CONFIG_KEYS = (
    "model",
    "model_args",
    "steps",
    "lr",
    "seed",
    "device",
    "threads_per_rank",
    "timeout_s",
    "checkpoint_dir",
    "checkpoint_every",
    "resume",
    "on_nonfinite_loss",
)


def engine_config(config: dict[str, Any], control_dir: str | None = None) -> EngineConfig:
    """The EngineConfig an ``assign`` message describes; ``check_config`` vets it. With
    ``control_dir`` (plans without replicated stages) the job takes live repartition
    commands there (``engine/commands.py``)."""
    plan = Plan.model_validate(config["plan"])
    engine = EngineConfig(
        plan=plan,
        **{key: config[key] for key in _CONFIG_KEYS if key in config and config[key] is not None},
    )
    if control_dir is not None and all(stage.replicas == 1 for stage in plan.stages):
        engine.migration = MigrationSettings(control_dir=control_dir)
    check_config(engine)
    return engine


def open_store(world_size: int, timeout_s: float, host: str = "127.0.0.1") -> dist.TCPStore:
    """The run's store, on a port the OS picks, listening on every interface; its own
    client connects through ``host`` (the worker's advertised address, which the peers
    dial). Ranks wait for each other longer than an op (``rendezvous.join_timeout_s``), so
    the store's operations do too. It lives as long as this object."""
    return dist.TCPStore(
        host,
        0,
        world_size,
        True,
        wait_for_workers=False,
        timeout=timedelta(seconds=join_timeout_s(timeout_s)),
    )


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _rank_main(
    config: EngineConfig,
    rank: int,
    address: StoreAddress,
    conn: Connection,
    ranks_here: int,
    interface: str | None,
) -> None:
    _die_with_parent()
    if interface:
        os.environ[INTERFACE_VARIABLE] = interface
    ended_well = run_rank_reporting(config, rank, address, conn.send, ranks_here=ranks_here)
    conn.close()
    exit_now(0 if ended_well else 1)


class RankGroup:
    """This worker's ranks of one run (module docstring)."""

    def __init__(
        self,
        run_id: int,
        config: EngineConfig,
        ranks: list[int],
        address: StoreAddress,
        on_event: Callable[[Event], None],
        on_end: Callable[[str, str | None, bool], None],
        host_ranks: int | None = None,
        interface: str | None = None,
    ) -> None:
        self.run_id, self.config, self.ranks, self.address = run_id, config, ranks, address
        #: The run's ranks on this host, this worker's and others' (they share its cores).
        self.host_ranks = max(host_ranks or 0, len(ranks))
        self.on_event, self.on_end = on_event, on_end
        #: The network interface the worker was told to use (None: its address's).
        self.interface = interface
        self.processes: list[Any] = []
        self.stopping = False
        self.errors: list[str] = []  # those naming a cause first (module docstring)
        self._num_causes = 0
        self.retry = True

    def start(self) -> None:
        context = mp.get_context("spawn")
        readers = []
        for rank in self.ranks:
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_rank_main,
                name=f"pipestudio-run{self.run_id}-rank{rank}",
                args=(self.config, rank, self.address, writer, self.host_ranks, self.interface),
                daemon=True,
            )
            process.start()
            writer.close()
            readers.append(reader)
            self.processes.append(process)
        threading.Thread(
            target=self._relay,
            args=(readers,),
            daemon=True,
            name=f"pipestudio-run{self.run_id}-relay",
        ).start()

    def _relay(self, readers: list[Connection]) -> None:
        while readers:
            for conn in cast(list[Connection], wait(readers, timeout=0.5)):
                try:
                    event = conn.recv()
                except (EOFError, OSError):
                    readers.remove(conn)
                    continue
                if event.get("type") == "error":
                    self.note_error(event)
                self.on_event(event)
        for process in self.processes:
            process.join()
        self.end([process.exitcode for process in self.processes])

    def note_error(self, event: Event) -> None:
        """Keep an error event's message and whether it allows a retry (module docstring)."""
        message = str(event.get("message"))
        if event.get("cause") is not None:
            self.errors.insert(self._num_causes, message)
            self._num_causes += 1
        else:
            self.errors.append(message)
        self.retry = self.retry and event.get("retry") is not False

    def end(self, codes: list[int | None]) -> None:
        """Report how the ranks ended, given their exit codes (module docstring)."""
        if self.stopping:
            self.on_end("stopped", "stopped on request", True)
        elif all(code == 0 for code in codes):
            self.on_end("finished", None, True)
        else:
            self.on_end(
                "failed",
                self.errors[0] if self.errors else f"rank processes exited with {codes}",
                self.retry,
            )

    def migrate(self, stages: list[list[str]], timeout_s: float = 60.0) -> tuple[bool, str]:
        """Ask the job (through rank 0's control directory) to take these stages."""
        repartition = self.config.migration
        if repartition is None or repartition.control_dir is None or 0 not in self.ranks:
            return False, "this worker does not hold rank 0 of a job that can repartition"
        controller = Controller(repartition.control_dir)
        try:
            status = controller.wait_status(controller.migrate(stages=stages), timeout_s)
        except TimeoutError as exc:
            return False, str(exc)
        if not status.get("accepted"):
            return False, f"the engine refused: {status.get('reason')}"
        return True, (
            f"migration {status.get('migration')} takes effect at step {status.get('step')}"
        )

    def stop(self, grace_s: float = 5.0) -> None:
        """Terminate the ranks (SIGTERM, then SIGKILL after ``grace_s``)."""
        self.stopping = True
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(grace_s)
            if process.is_alive():
                process.kill()
