"""Finding the rank at the root of a failure: heartbeats and failure records in the store.

Every wait of the engine has a timeout, so a rank whose peer died or hung stops waiting
within seconds. What it then reports must name the rank that caused it, not merely the
neighbour it was waiting for, which may itself be waiting for the culprit. So each rank
keeps a ``Watchdog``:

- a thread writes a heartbeat to the store every ``heartbeat_s`` seconds, with what the
  rank is doing (``doing``) and, when it waits, for which rank;
- a rank that fails writes a failure record naming the root it found, before it exits,
  and a rank that ends well marks itself done; the record says whether another attempt
  would meet the failure again (``retry``: false after a non-finite loss), so every rank
  reports that, not just the root;
- ``diagnose`` (on a failed wait) polls these for a few seconds: a record that names a root
  gives that root; a rank whose heartbeat stopped (killed, crashed, frozen) is the root;
  failing both, the wait's peer is followed along the ranks it waits for to one that is
  busy with something else for too long: that rank hung.

The store belongs to the launcher (or torchrun's agent), so it outlives any rank.
"""

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from pipestudio.runtime.engine.errors import WorkerFailure
from pipestudio.runtime.engine.rendezvous import StoreAddress, connect


class Watchdog:
    """One rank's heartbeat, failure record and diagnosis (see the module docstring)."""

    def __init__(
        self,
        address: StoreAddress,
        rank: int,
        world_size: int,
        describe: Callable[[int], str],
        timeout_s: float,
        *,
        heartbeat_s: float = 0.5,
        stale_s: float = 3.0,
        grace_s: float = 5.0,
    ) -> None:
        self.store = connect(
            StoreAddress(address.host, address.port, False, address.prefix), world_size, timeout_s
        )
        self.rank, self.world_size, self.describe = rank, world_size, describe
        self.heartbeat_s, self.stale_s, self.grace_s = heartbeat_s, stale_s, grace_s
        self.activity, self.since = "starting", time.time()
        self.waiting_on: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="pipestudio-heartbeat", daemon=True)
        self._thread.start()

    def doing(self, activity: str, waiting_on: int | None = None) -> None:
        self.activity, self.waiting_on, self.since = activity, waiting_on, time.time()

    def _beat(self) -> None:
        beat = {
            "time": time.time(),
            "activity": self.activity,
            "waiting_on": self.waiting_on,
            "since": self.since,
        }
        with self._lock:
            self.store.set(f"heartbeat/{self.rank}", json.dumps(beat))

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self._beat()
            except Exception:  # the store is gone: the job is ending
                return

    def finish(self) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            self.store.set(f"done/{self.rank}", "1")

    def record_failure(self, root: int | None, reason: str, *, retry: bool = True) -> None:
        """Tell the others this rank is failing, because of ``root`` (``reason``); ``retry``
        false: another attempt would fail the same way."""
        self._stop.set()
        try:
            with self._lock:
                self.store.set(
                    f"failed/{self.rank}",
                    json.dumps({"root": root, "reason": reason, "retry": retry}),
                )
        except Exception:
            pass

    def _read(self, key: str) -> Any:
        if not self.store.check([key]):
            return None
        return json.loads(self.store.get(key).decode())

    def root_failure(self, *, heartbeats: bool = True) -> tuple[int, str, bool] | None:
        """The root another rank recorded or (with ``heartbeats``) a rank whose heartbeat
        stopped, with the reason and whether another attempt could succeed; None when
        neither is known yet."""
        now = time.time()
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            record = self._read(f"failed/{rank}")
            if record is not None and record["root"] is not None:
                return record["root"], record["reason"], record.get("retry", True)
            if heartbeats and record is None and not self.store.check([f"done/{rank}"]):
                beat = self._read(f"heartbeat/{rank}")
                if beat is not None and now - beat["time"] > self.stale_s:
                    return (
                        rank,
                        (
                            f"{self.describe(rank)} is dead or frozen: no heartbeat for "
                            f"{now - beat['time']:.1f} s (last: {beat['activity']})"
                        ),
                        True,
                    )
        return None

    def diagnose(self, peer: int | None) -> tuple[int | None, str, bool]:
        """The root rank of a failed wait on ``peer``, why, and whether another attempt could
        succeed (see the module docstring)."""
        deadline = time.time() + self.grace_s
        while True:
            try:
                found = self.root_failure()
            except Exception as exc:
                return peer, f"the store is unreachable ({exc}); {self._peer_text(peer)}", True
            if found is not None:
                return found
            if time.time() > deadline:
                break
            time.sleep(0.2)
        return (*self._hung(peer), True)

    def _peer_text(self, peer: int | None) -> str:
        return "no peer is known" if peer is None else f"waiting for {self.describe(peer)}"

    def _hung(self, peer: int | None) -> tuple[int | None, str]:
        """Follow who waits for whom from ``peer`` to a rank busy with something else."""
        path = [self.rank]
        while peer is not None and peer not in path:
            path.append(peer)
            beat = self._read(f"heartbeat/{peer}")
            if beat is None:
                break
            if beat["waiting_on"] is None:
                return peer, (
                    f"{self.describe(peer)} hung: busy with {beat['activity']} for "
                    f"{time.time() - beat['since']:.1f} s"
                )
            peer = beat["waiting_on"]
        if peer is not None and peer in path:
            cycle = " -> ".join(f"rank {rank}" for rank in [*path[path.index(peer) :], peer])
            return peer, f"ranks wait for each other in a cycle (a deadlock): {cycle}"
        return peer, f"no rank reported a failure; {self._peer_text(peer)}"

    def failure(self, what: str, peer: int | None, exc: BaseException) -> WorkerFailure:
        """The error to raise after ``what`` (a wait on ``peer``) failed with ``exc``."""
        root, reason, retry = self.diagnose(peer)
        self.record_failure(root, reason, retry=retry)
        failure = WorkerFailure(
            f"{self.describe(self.rank)} stopped while {what}: {reason}", root, retry=retry
        )
        failure.__cause__ = exc
        return failure
