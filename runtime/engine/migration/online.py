"""Rank 0's online planner: every ``every`` steps each rank publishes its window of
measurements (``telemetry/observe.py``); once every rank's window is in, the observed
profile is built and ``pipestudio.planner.replan.online.evaluate_replan`` runs in a thread,
so training does not wait for it. A worthwhile proposal is applied (``auto``) or held for
approval; each evaluation is a ``proposal`` event.
"""

import json
import threading
from collections.abc import Callable
from typing import Any

from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.documents import load_document
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.proposal import Proposal
from pipestudio.planner.replan.online import evaluate_replan
from pipestudio.runtime.engine.config import EngineConfig
from pipestudio.runtime.engine.migration.intake import CommandIntake, Request
from pipestudio.runtime.engine.telemetry.metrics import EventSink
from pipestudio.runtime.engine.telemetry.observe import observed_profile
from pipestudio.runtime.models import ModelSpec

#: Where the engine's migration keys live in the job's store.
STORE_PREFIX = "repartition"


def window_key(last_step: int, rank: int) -> str:
    """The store key of ``rank``'s window of measurements ending at ``last_step``."""
    return f"{STORE_PREFIX}/measure/{last_step}/{rank}"


class OnlinePlanner:
    """Evaluations of the newest complete windows, one at a time (module docstring)."""

    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        store: Any,
        sink: EventSink,
        intake: CommandIntake,
        queue: Callable[[Request], None],
    ) -> None:
        assert config.migration is not None
        self.settings = config.migration
        self.spec, self.store, self.sink = spec, store, sink
        self.intake, self.queue = intake, queue
        self.world_size = config.plan.num_workers
        self.every = self.settings.every
        self.next_window = self.every - 1  # the last step of the next window to evaluate
        self.cluster = (
            load_document(Cluster, self.settings.cluster_path)
            if self.settings.cluster_path
            else None
        )
        self._thread: threading.Thread | None = None
        self._result: tuple[int, Proposal | Exception] | None = None

    def start(self, start_step: int) -> None:
        """The first window of measurements wholly in a run that starts at ``start_step``."""
        self.next_window = self.every * (-(-start_step // self.every) + 1) - 1

    def step(self, step: int, plan: Plan, last_effective: int, busy: bool) -> None:
        """At ``step``: collect a finished evaluation; start one on the newest complete
        window, unless a migration took effect inside it or requests wait (``busy``)."""
        if self._result is not None:
            finished, outcome = self._result
            self._result = None
            self._conclude(finished, outcome, plan)
        if self._thread is not None and self._thread.is_alive():
            return
        window: int | None = None
        while self.next_window < step:
            keys = [window_key(self.next_window, r) for r in range(self.world_size)]
            if not self.store.check(keys):
                break
            window, self.next_window = self.next_window, self.next_window + self.every
        if window is None or window - self.every + 1 <= last_effective or busy:
            return
        reports = [
            json.loads(self.store.get(window_key(window, r)).decode())
            for r in range(self.world_size)
        ]
        self._thread = threading.Thread(
            target=self._evaluate,
            args=(window, reports, plan),
            name="pipestudio-replan",
            daemon=True,
        )
        self._thread.start()

    def _evaluate(self, window: int, reports: list[dict[str, Any]], plan: Plan) -> None:
        try:
            profile = observed_profile(
                self.spec.name,
                plan.microbatch_size,
                self.spec.layer_names,
                self.spec.edges(),
                reports,
            )
            outcome: Proposal | Exception = evaluate_replan(
                plan,
                profile,
                self.cluster,
                payback_steps=self.settings.payback_steps,
                min_gain_fraction=self.settings.min_gain_fraction,
            )
        except Exception as exc:  # reported as an event; training goes on
            outcome = exc
        self._result = (window, outcome)

    def _conclude(self, window: int, outcome: Proposal | Exception, plan: Plan) -> None:
        event: dict[str, Any] = {"type": "proposal", "window_step": window}
        if isinstance(outcome, Exception):
            self.sink({**event, "error": f"{type(outcome).__name__}: {outcome}"})
            return
        stale = [s.layers for s in outcome.current_stages] != [s.layers for s in plan.stages]
        event.update(
            worthwhile=outcome.worthwhile and not stale,
            reason=outcome.reason,
            step_time_now_ms=outcome.step_time_now_ms,
            step_time_after_ms=outcome.step_time_after_ms,
            gain_ms=outcome.gain_ms,
            gain_fraction=outcome.gain_fraction,
            migration_bytes=outcome.migration_bytes,
            moves=[m.model_dump() for m in outcome.moves],
            candidates=[c.model_dump() for c in outcome.candidates],
        )
        if outcome.worthwhile and not stale:
            pid = self.intake.hold(outcome.new_plan, outcome)
            event.update(id=pid, status="applied" if self.settings.auto else "held")
            if self.settings.auto:
                held = self.intake.release(pid)
                self.queue({**held, "proposal": pid, "source": "auto"})
        self.sink(event)
