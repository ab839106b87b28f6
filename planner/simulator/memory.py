"""Memory of each worker over a simulated timeline, and its peak by kind.

Static memory is constant: weights, gradients, optimizer state and, for ``pipedream``,
the stashed weight versions (one per micro-batch in flight besides the live weights,
PipeDream §3.3). Workspace is held while an op runs; the activations an op makes exist from
its end (a forward's saved tensors, a recompute's rematerialized ones) and go when the
backward of their micro-batch ends, or for swapped ones when their swap-out ends; a fetched
swap occupies memory from the start of its transfer. At the end of an op its workspace and
its new activations count together for a moment. Changes apply in the order the simulation
produced them, so an op that ends releases its memory before the op it lets start
allocates.
"""

from dataclasses import dataclass

from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.result import MemoryBreakdown, MemoryTrack
from pipestudio.planner.simulator.costs import StageCosts

# (event sequence number, time, activation delta, workspace delta, in-flight delta)
_Event = tuple[int, float, int, int, int]


@dataclass(frozen=True)
class WorkerPeak:
    memory: MemoryBreakdown
    max_inflight: int
    weight_versions: int


class MemoryLedger:
    """Collects memory changes per worker, then answers peaks and tracks."""

    def __init__(self, workers: list[tuple[int, int]], costs: list[StageCosts], plan: Plan):
        self._workers = workers
        self._costs = costs
        self._stashes_weights = plan.schedule == "pipedream"
        self._events: list[list[_Event]] = [[] for _ in workers]
        self._peaks: list[WorkerPeak] | None = None

    def record(
        self,
        worker: int,
        seq: int,
        time_ms: float,
        delta: tuple[int, int],
        kind: str,
        *,
        at_end: bool,
    ) -> None:
        inflight = 0
        if kind == "forward" and not at_end:
            inflight = 1
        elif kind == "backward" and at_end:
            inflight = -1
        if delta != (0, 0) or inflight:
            act, ws = delta
            if act * ws < 0:  # allocate before freeing: the op's end holds both a moment
                self._events[worker].append((2 * seq, time_ms, max(act, 0), max(ws, 0), 0))
                self._events[worker].append(
                    (2 * seq + 1, time_ms, min(act, 0), min(ws, 0), inflight)
                )
            else:
                self._events[worker].append((2 * seq, time_ms, act, ws, inflight))

    def peaks(self) -> list[WorkerPeak]:
        if self._peaks is None:
            self._peaks = [self._peak(worker) for worker in range(len(self._workers))]
        return self._peaks

    def _static(self, worker: int, weight_versions: int) -> dict[str, int]:
        costs = self._costs[self._workers[worker][0]]
        return {
            "weights_bytes": costs.param_bytes,
            "weight_versions_bytes": (weight_versions - 1) * costs.param_bytes,
            "gradients_bytes": costs.param_bytes,
            "optimizer_bytes": costs.optimizer_bytes,
        }

    def _peak(self, worker: int) -> WorkerPeak:
        events = sorted(self._events[worker])
        inflight = max_inflight = activations = workspace = 0
        best = (0, 0)
        for _, _, act_delta, ws_delta, inflight_delta in events:
            activations += act_delta
            workspace += ws_delta
            inflight += inflight_delta
            assert activations >= 0 and workspace >= 0 and inflight >= 0, (worker, activations)
            max_inflight = max(max_inflight, inflight)
            if activations + workspace > sum(best):
                best = (activations, workspace)
        versions = max(max_inflight, 1) if self._stashes_weights else 1
        static = self._static(worker, versions)
        total = sum(static.values()) + sum(best)
        memory = MemoryBreakdown(
            **static, activations_bytes=best[0], workspace_bytes=best[1], total_bytes=total
        )
        return WorkerPeak(memory, max_inflight, versions)

    def static_bytes(self, worker: int) -> int:
        peak = self.peaks()[worker].memory
        return peak.total_bytes - peak.activations_bytes - peak.workspace_bytes

    def device_fits(self, device: int, limit: int | None, devices: list[list[int]]) -> bool:
        """Whether all workers placed on ``device`` fit in ``limit`` bytes together."""
        return limit is None or self.device_peak(device, devices) <= limit

    def device_peak(self, device: int, devices: list[list[int]]) -> int:
        """The most bytes the workers placed on ``device`` hold at once, together (0: no
        worker there)."""
        on_device = [w for w, (s, r) in enumerate(self._workers) if devices[s][r] == device]
        if len(on_device) <= 1:
            return self.peaks()[on_device[0]].memory.total_bytes if on_device else 0
        events = sorted(e for w in on_device for e in self._events[w])
        level = peak = sum(self.static_bytes(w) for w in on_device)
        for _, _, act_delta, ws_delta, _ in events:
            level += act_delta + ws_delta
            peak = max(peak, level)
        return peak

    def tracks(
        self, workers: list[tuple[int, int]], window: tuple[float, float]
    ) -> list[MemoryTrack]:
        """Each worker's total bytes over ``window``, starting with the level at its start.

        At an instant where memory rises and falls again (an op of zero duration), the track
        holds two points: the highest level of that instant, then the level after it.
        """
        result = []
        for worker, (stage_idx, replica) in enumerate(workers):
            level = self.static_bytes(worker)
            times: list[float] = [window[0]]
            values: list[int] = [level]
            instant_peak = level
            for _, time_ms, act_delta, ws_delta, _ in sorted(self._events[worker]):
                level += act_delta + ws_delta
                if time_ms > window[1]:
                    break
                if time_ms <= times[-1]:
                    if time_ms < window[0]:
                        values[-1] = instant_peak = level
                    elif level >= instant_peak:
                        instant_peak = level
                        if len(values) > 1 and times[-2] == time_ms:
                            del times[-1], values[-1]
                        values[-1] = level
                    elif len(times) > 1 and times[-2] == time_ms:
                        values[-1] = level
                    else:
                        times.append(time_ms)
                        values.append(level)
                else:
                    times.append(time_ms)
                    values.append(level)
                    instant_peak = level
            result.append(
                MemoryTrack(stage=stage_idx, replica=replica, times_ms=times, bytes=values)
            )
        return result
