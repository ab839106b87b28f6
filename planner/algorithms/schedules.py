"""``--schedule auto``: the synchronous schedule (and virtual stages) that runs a planner's
split fastest within the memory cap.

``gpipe``, ``1f1b``, ``zero-bubble`` and ``interleaved-1f1b`` train the same parameters
(one update per step on the same micro-batches: the engine's numerics tests), so choosing
among them is about time and memory alone; ``pipedream``, whose weights lag, is not among
them. For one planner and a request, the candidates are:

- the planner's plan for ``gpipe`` and its plan for ``1f1b`` (its own split, replicas,
  recompute and swap);
- that ``1f1b`` plan run as ``zero-bubble`` (the same stages and policies, each backward's
  weight half deferred), when every stage has one replica;
- for each v of ``VIRTUAL_STAGES`` that the layers and micro-batches allow (p x v layers at
  least, m a multiple of p), the planner's plan of p x v one-device stages as
  ``interleaved-1f1b`` with v chunks per device: planned on p x v devices of a v-th of the
  device memory each (a device holds v chunks) with the cluster's swap bandwidth, links
  free, then simulated on the request's cluster, chunk c on device c mod p.

A derived plan (zero-bubble, interleaved) was split for another schedule, so it is then
improved under its own with the simulator as the judge (``refine``): a hill climb that
moves one stage boundary by one layer or changes one layer's policy, keeps a move that
makes the plan fit or faster while fitting, and stops when no move helps or after
``REFINE_SIMULATIONS`` simulations.

Every candidate is simulated; the fastest that fits wins (when none fits, the one that
needs the least memory beyond the cap is not offered: the answer is the planner's own
infeasibility). A derived plan carries no optimality claim: ``optimal`` proves its bound
for the schedule it planned for, not for the derived ones, and the hill climb finds a
local best, not a proven one (tests/planner/algorithms/test_auto_exhaustive.py measures
the gap to exhaustive search).
"""

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from pipestudio.planner.errors import InfeasibleError, PlannerError
from pipestudio.planner.formats.documents import MAX_BYTES
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.result import SimResult
from pipestudio.planner.simulator.simulate import simulate

#: Chunks per device that ``auto`` tries for ``interleaved-1f1b``.
VIRTUAL_STAGES = (2, 4)
#: Most simulations the hill climb of one derived candidate spends (``refine``).
REFINE_SIMULATIONS = 60
_POLICIES = ("keep", "recompute", "swap")
AUTO = "auto"
_CLAIMS = ("step_optimal", "step_gap")


@dataclasses.dataclass
class Candidate:
    """One schedule's plan for the request, simulated (or why there is none)."""

    label: str
    plan: Plan | None = None
    result: SimResult | None = None
    error: str | None = None


def auto_candidates(
    planner: Callable[[Any], Any], request: Any, memory_only_cluster: Callable[..., Any]
) -> list[Candidate]:
    """Every candidate of the module docstring for ``planner`` on ``request`` (a
    ``PlanRequest``; ``memory_only_cluster`` is ``request.memory_only_cluster``, passed to
    keep this module free of the request's)."""
    candidates: list[Candidate] = []
    base: Plan | None = None
    for schedule in ("gpipe", "1f1b"):
        candidate = _planned(planner, dataclasses.replace(request, schedule=schedule), schedule)
        candidates.append(_simulated(candidate, request))
        if schedule == "1f1b":
            base = candidate.plan
    if base is not None and all(stage.replicas == 1 for stage in base.stages):
        as_zb = derived(base, "zero-bubble", 1)
        candidates.append(refine(_simulated(Candidate("zero-bubble", as_zb), request), request))
    devices = request.num_stages or (request.cluster.num_devices if request.cluster else 0)
    for chunks in VIRTUAL_STAGES:
        label = f"interleaved-1f1b x{chunks}"
        if devices < 2 or devices * chunks > request.profile.num_layers:
            continue
        if request.num_microbatches % devices:
            candidates.append(
                Candidate(label, error=f"needs micro-batches a multiple of {devices}")
            )
            continue
        memory, host_gbps = _device_limits(request)
        chunked = dataclasses.replace(
            request,
            schedule="1f1b",
            num_stages=devices * chunks,
            cluster=memory_only_cluster(
                devices * chunks, None if memory is None else max(memory // chunks, 1), host_gbps
            ),
            single_replica=True,
        )
        candidate = _planned(planner, chunked, label)
        if candidate.plan is not None:
            candidate.plan = derived(candidate.plan, "interleaved-1f1b", chunks)
        candidates.append(refine(_simulated(candidate, request), request))
    return candidates


def _score(result: SimResult) -> tuple[int, float, float]:
    """What the hill climb lowers: a plan that fits before one that does not, then the
    bytes its devices are over their memory, then the step."""
    return (
        (0, 0.0, result.step_time_ms)
        if result.fits
        else (1, float(over_memory_bytes(result)), result.step_time_ms)
    )


def over_memory_bytes(result: SimResult) -> int:
    """Bytes over memory, summed over the devices: each device's peak, its workers together
    (an interleaved device's chunks; ``SimResult.device_peak_bytes``), past its memory."""
    limits: dict[int, int] = {}
    for stage in result.stages:
        if stage.device_memory_bytes is not None:
            for device in stage.devices:
                limits[device] = min(limits.get(device, MAX_BYTES), stage.device_memory_bytes)
    peaks = result.device_peak_bytes  # every simulated result names them
    return sum(max(0, peaks[device] - limit) for device, limit in limits.items())


def _better(tried: SimResult, result: SimResult) -> bool:
    """Whether ``tried`` scores lower than ``result`` by more than rounding."""
    new, old = _score(tried), _score(result)
    if new[:2] != old[:2]:
        return new[:2] < old[:2]
    return new[2] < old[2] * (1 - 1e-6)


def _moves(plan: Plan, fits: bool) -> list[dict[str, Any]]:
    """The plans one move from ``plan`` (stage documents and policies): each boundary
    earlier or later by 2^k layers, the longest jumps first (no stage left empty); then
    each layer's policy changed, toward ``keep`` or between recompute and swap while the
    plan fits (keeping is what fitting allows to buy), away from ``keep`` while it does
    not."""
    stages = [list(stage.layers) for stage in plan.stages]
    moved: list[dict[str, Any]] = []
    for cut in range(1, len(stages)):
        before, after = stages[cut - 1], stages[cut]
        jump = 1 << max(0, (max(len(before), len(after)) - 1).bit_length() - 1)
        while jump >= 1:
            if len(before) > jump:  # the boundary ``jump`` layers earlier
                moved.append({"cut": cut, "layers": (before[:-jump], before[-jump:] + after)})
            if len(after) > jump:
                moved.append({"cut": cut, "layers": (before + after[:jump], after[jump:])})
            jump //= 2
    for stage in stages:
        for layer in stage:
            current = plan.policies.get(layer, "keep")
            if fits:
                choices = [p for p in _POLICIES if p != current]
                if current == "keep":
                    choices = []
            else:
                choices = [p for p in _POLICIES if p != current and p != "keep"]
            moved += [{"layer": layer, "policy": p} for p in choices]
    return moved


def _apply(plan: Plan, move: dict[str, Any]) -> Plan:
    """``plan`` with one move made (a copy: a move keeps every stage non-empty and every
    policy one of the three, so the plan stays valid)."""
    if "cut" in move:
        cut, (before, after) = move["cut"], move["layers"]
        stages = list(plan.stages)
        stages[cut - 1] = stages[cut - 1].model_copy(update={"layers": before})
        stages[cut] = stages[cut].model_copy(update={"layers": after})
        return plan.model_copy(update={"stages": stages})
    policies = dict(plan.policies)
    policies[move["layer"]] = move["policy"]
    kept = {layer: policy for layer, policy in policies.items() if policy != "keep"}
    return plan.model_copy(update={"policies": kept})


def refine(candidate: Candidate, request: Any, budget: int = REFINE_SIMULATIONS) -> Candidate:
    """``candidate`` improved by the hill climb of the module docstring (first improving
    move, then the moves of the new plan), within ``budget`` simulations."""
    if candidate.plan is None or candidate.result is None:
        return candidate
    plan, result, spent, improved = candidate.plan, candidate.result, 0, True
    while improved and spent < budget:
        improved = False
        for move in _moves(plan, result.fits):
            if spent >= budget:
                break
            trial = _apply(plan, move)
            spent += 1
            tried = simulate(request.scaled, trial, request.cluster, with_timeline=False)
            if _better(tried, result):
                plan, result, improved = trial, tried, True
                break
    if plan is not candidate.plan:
        provenance = dict(plan.provenance)
        start = "" if candidate.result.fits else " (did not fit)"
        provenance["refined"] = (
            f"hill climb under {plan.schedule}: "
            f"{candidate.result.step_time_ms:.3f} ms{start} -> {result.step_time_ms:.3f} ms"
            f"{'' if result.fits else ', does not fit'} ({spent} simulations)"
        )
        plan = plan.model_copy(update={"provenance": provenance})
    return Candidate(candidate.label, plan, result, candidate.error)


def best(candidates: list[Candidate]) -> Candidate | None:
    """The fastest candidate that fits, or None."""
    fitting = [c for c in candidates if c.result is not None and c.result.fits]
    return min(fitting, key=lambda c: c.result.step_time_ms if c.result else 0.0, default=None)


def summary(candidates: list[Candidate]) -> dict[str, str]:
    """Each candidate's simulated step, or why it lost (``auto <label>`` keys, for the
    chosen plan's provenance)."""
    rows = {}
    for candidate in candidates:
        if candidate.result is None:
            text = candidate.error or "no plan"
        else:
            fits = "" if candidate.result.fits else ", does not fit"
            text = f"{candidate.result.step_time_ms:.3f} ms{fits}"
        rows[f"auto {candidate.label}"] = text[:2000]
    return rows


def timed(
    planner: Callable[[Any], Any], request: Any, memory_only_cluster: Callable[..., Any]
) -> tuple[list[Candidate], float]:
    started = time.perf_counter()
    candidates = auto_candidates(planner, request, memory_only_cluster)
    return candidates, (time.perf_counter() - started) * 1e3


def _planned(planner: Callable[[Any], Any], request: Any, label: str) -> Candidate:
    try:
        return Candidate(label, planner(request).plan)
    except InfeasibleError as exc:
        return Candidate(label, error=f"no plan fits: {exc}")
    except PlannerError as exc:
        return Candidate(label, error=str(exc))


def _simulated(candidate: Candidate, request: Any) -> Candidate:
    if candidate.plan is not None:
        candidate.result = simulate(
            request.scaled, candidate.plan, request.cluster, with_timeline=False
        )
    return candidate


def derived(plan: Plan, schedule: str, chunks: int) -> Plan:
    """``plan`` run with another schedule: devices left to the schedule's placement, and no
    claim that was made for the plan's own schedule."""
    provenance = {k: v for k, v in plan.provenance.items() if k not in _CLAIMS}
    provenance["derived_from"] = f"{plan.schedule} plan of {plan.provenance.get('planner')}"
    document = plan.model_dump(mode="json") | {
        "schedule": schedule,
        "virtual_stages": chunks,
        "provenance": provenance,
    }
    if schedule == "interleaved-1f1b":  # chunk c goes to device c mod p
        document["stages"] = [{**stage, "devices": None} for stage in document["stages"]]
    return Plan.model_validate(document)


def _device_limits(request: Any) -> tuple[int | None, float | None]:
    """The smallest device memory of the request's cluster (None: unlimited) and its
    slowest host link for swap (None: free)."""
    if request.cluster is None:
        return None, None
    devices = request.cluster.devices
    memories = [d.memory_bytes for d in devices]
    links = [
        g for d in devices for g in (d.host_to_device_gbps, d.device_to_host_gbps) if g is not None
    ]
    memory = None if None in memories else min(m for m in memories if m is not None)
    return memory, (min(links) if links else None)
