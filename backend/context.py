"""What one running backend holds: settings, database, credentials, hub, ingest and the
watchdog task."""

import asyncio
import logging
import time
from dataclasses import dataclass, field

from anyio import to_thread

from pipestudio.backend.auth import Credentials
from pipestudio.backend.db import Database
from pipestudio.backend.hub import Hub
from pipestudio.backend.ingest import Ingestor
from pipestudio.backend.repositories import Runs
from pipestudio.backend.services import proposals, runs, workers
from pipestudio.backend.services.messages import Actions
from pipestudio.backend.settings import Settings
from pipestudio.backend.users import parse_users

log = logging.getLogger("pipestudio.backend")


@dataclass
class AppContext:
    settings: Settings
    db: Database
    credentials: Credentials = field(init=False)
    hub: Hub = field(default_factory=Hub)
    ingestor: Ingestor | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    #: Runs in ``resuming``: since when (monotonic) they wait for free slots.
    resuming_since: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.credentials = Credentials(
            self.settings.api_token, parse_users(self.settings.users), self.db
        )

    async def start(self) -> None:
        self.hub.loop = asyncio.get_running_loop()
        self.hub.started = time.monotonic()
        self.ingestor = Ingestor(self.db, self.hub)
        self.ingestor.start()
        self.tasks.append(asyncio.create_task(self._watch(), name="pipestudio-watchdog"))
        if self.settings.auto_propose_every_s > 0:
            self.tasks.append(asyncio.create_task(self._propose(), name="pipestudio-auto-propose"))

    async def stop(self) -> None:
        if self.ingestor is not None:
            await self.ingestor.stop()
        for task in self.tasks:
            task.cancel()
        for link in list(self.hub.links.values()):
            try:
                await link.socket.close(code=1012)
            except Exception as exc:
                log.info("closing worker %s: %s", link.worker_id, exc)
        self.db.dispose()

    async def perform(self, actions: Actions) -> None:
        for run_id, message in actions.to_watchers:
            self.hub.publish(run_id, message)
        for worker_id, message in actions.to_workers:
            await self.hub.send(worker_id, message)
        for worker_id, reason in actions.to_disconnect:
            await self.hub.disconnect(worker_id, reason)

    async def _watch(self) -> None:
        """Every second: persist heartbeats, mark silent workers offline, fail their runs."""
        timeout_s = self.settings.worker_timeout_s
        while True:
            await asyncio.sleep(min(1.0, timeout_s / 4))
            seen = {w: link.last_seen for w, link in self.hub.links.items()}
            try:
                actions = await to_thread.run_sync(self._check, seen, timeout_s)
            except Exception:
                log.exception("the worker watchdog failed; retrying")
                continue
            await self.perform(actions)

    async def _propose(self) -> None:
        """Every ``auto_propose_every_s``: proposals that come by themselves
        (``proposals.auto_propose``), told to each run's dashboards."""
        while True:
            await asyncio.sleep(self.settings.auto_propose_every_s)
            try:
                actions = await to_thread.run_sync(self._auto_propose)
            except Exception:
                log.exception("proposing repartitions failed; retrying")
                continue
            await self.perform(actions)

    def _auto_propose(self) -> Actions:
        actions = Actions()
        with self.db.session() as session:
            for run in Runs(session).in_states(("running",)):
                made = proposals.auto_propose(
                    session, run, self.settings.auto_propose_drift, self.settings.max_simulated_ops
                )
                if made is not None:
                    session.commit()
                    log.info("proposed repartition %d for run %d by itself", made.id, run.id)
                    actions.to_watchers.append(
                        (
                            run.id,
                            {
                                "type": "proposal",
                                "run_id": run.id,
                                "proposal_id": made.id,
                                "state": made.state,
                                "outcome": None,
                            },
                        )
                    )
        return actions

    def _check(self, seen: dict[str, float], timeout_s: float) -> Actions:
        with self.db.session() as session:
            online = workers.touch(session, seen)
            actions = workers.check_silence(session, online, self.hub, timeout_s)
        actions.extend(self._relaunch(set(seen)))
        return actions

    def _relaunch(self, connected: set[str]) -> Actions:
        """Start the next attempt of every run waiting in ``resuming`` (``runs.relaunch``)."""
        actions = Actions()
        now = time.monotonic()
        with self.db.session() as session:
            waiting = Runs(session).in_states(("resuming",))
            for gone in set(self.resuming_since) - {run.id for run in waiting}:
                del self.resuming_since[gone]
            for run in waiting:
                since = self.resuming_since.setdefault(run.id, now)
                done = runs.relaunch(
                    session,
                    run,
                    connected,
                    self.hub.send_from_thread,
                    now - since,
                    self.settings.resume_wait_s,
                )
                if done is not None:
                    actions.extend(done)
        return actions
