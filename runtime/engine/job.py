"""A training job in a background thread of this process, driven through its controller."""

import tempfile
import threading
from typing import Any

from pipestudio.runtime.engine.config import EngineConfig
from pipestudio.runtime.engine.launcher import TrainResult, launch
from pipestudio.runtime.engine.migration.commands import Controller
from pipestudio.runtime.engine.migration.settings import MigrationSettings
from pipestudio.runtime.engine.telemetry.metrics import Event, EventSink


class Job:
    """A job in a background thread of this process, with its ``controller``."""

    def __init__(
        self, config: EngineConfig, sink: EventSink | None = None, **launch_args: Any
    ) -> None:
        repartition = config.migration or MigrationSettings()
        if repartition.control_dir is None:
            repartition.control_dir = tempfile.mkdtemp(prefix="pipestudio-control-")
        config.migration = repartition
        self.config, self.controller = config, Controller(repartition.control_dir)
        self.events: list[Event] = []
        self.result: TrainResult | None = None
        self._lock = threading.Lock()

        def record(event: Event) -> None:
            with self._lock:
                self.events.append(event)
            if sink is not None:
                sink(event)

        self._thread = threading.Thread(
            target=self._run, args=(record, launch_args), name="pipestudio-job", daemon=True
        )

    def _run(self, sink: EventSink, launch_args: dict[str, Any]) -> None:
        self.result = launch(self.config, sink, **launch_args)

    def start(self) -> "Job":
        self._thread.start()
        return self

    def wait(self, timeout_s: float | None = None) -> TrainResult:
        self._thread.join(timeout_s)
        if self.result is None:
            raise TimeoutError("the job has not finished")
        return self.result

    def last_step(self) -> int:
        """The last step that the last stage has finished (-1 before the first)."""
        with self._lock:
            steps = [e["step"] for e in self.events if e["type"] == "step"]
        return max(steps, default=-1)
