"""``optimal``'s second phase: of the plans it considers, the one the simulator finds fastest.

The program (``optimal.py``) returns P*, a plan of least bottleneck; the simulated step is
not a function of the bottleneck alone (``optimal_bound``), so another plan may be faster.
The candidates are every layout of replicas the program considers (stages on consecutive
devices, replica counts dividing the micro-batches) with every partition of the chain, each
stage with its fastest keep/recompute/swap choice that fits (``StageChoices``); P* with
the program's own choices is the incumbent. A branch and bound over stages, first device to
last, extends a prefix only while ``optimal_bound``'s bound of it, and of any way to finish
it, is below the fastest step simulated so far, tries the cheapest-looking stages first and
simulates each complete plan that gets through. A plan replaces the incumbent only if it is
strictly faster and fits as simulated, so ties keep P*.

When the candidates number at most ``EXHAUSTIVE_MAX_PLANS`` (every chain of up to 12
layers on up to 4 devices) the search runs to the end: the answer is the fastest simulated
candidate (``exhaustive``). Otherwise it stops after ``WORK_BUDGET`` units of work (a
stage bound 1, a stage's memory subproblem its layer count x ``_SOLVE_UNITS``, a simulation
its micro-batch passes x ``_SIMULATE_UNITS``; about 0.3 s of one core), deterministic
whatever the machine, and says it did not finish.
"""

import math
from collections.abc import Iterator
from dataclasses import dataclass

from pipestudio.planner.chain_model import Solver, StageEvaluator
from pipestudio.planner.memopt import KEEP, RECOMPUTE, StageChoice, StageProblem, solve_exact
from pipestudio.planner.memopt_bounded import solve_bounded
from pipestudio.planner.plan import Plan
from pipestudio.planner.planners.optimal_band import Band
from pipestudio.planner.planners.optimal_bound import Prefix, StepBound
from pipestudio.planner.planners.optimal_program import EXACT_MAX_LAYERS, DeviceLayout
from pipestudio.planner.request import PlanRequest
from pipestudio.planner.simulate import simulate

#: Searches over at most this many candidate plans are never cut short.
EXHAUSTIVE_MAX_PLANS = 2000
#: Work allowed beyond that (module docstring); units are roughly microseconds.
WORK_BUDGET = 300_000
_SOLVE_UNITS = 20
_SIMULATE_UNITS = 100
#: A candidate must be faster than the incumbent by more than this (relative) to replace it.
_TIE = 1e-12


@dataclass(frozen=True)
class PlannedStage:
    start: int
    end: int
    first_device: int
    replicas: int


@dataclass
class Candidate:
    """A plan of the search: its stages and their choices."""

    stages: list[PlannedStage]
    choices: list[StageChoice]


class StageChoices:
    """The fastest fitting keep/recompute/swap choice of each stage (None: none fits), once
    per problem: exact for stages of up to ``EXACT_MAX_LAYERS`` layers, else ``large``'s
    (``optimal`` passes the program's: ``memopt_bounded`` with the other planners'
    heuristics where its choice may be poor)."""

    def __init__(self, stages: StageEvaluator, large: Solver = solve_bounded) -> None:
        self.stages, self.large = stages, large
        self.known: dict[tuple[object, ...], StageChoice | None] = {}

    def get(self, i: int, j: int, c: int) -> StageChoice | None:
        key = (i, j, *self.stages.context_key(c))
        if key not in self.known:
            self.known[key] = self._solve(i, j, c)
        return self.known[key]

    def _solve(self, i: int, j: int, c: int) -> StageChoice | None:
        solver = _solve_exact if j - i <= EXACT_MAX_LAYERS else self.large
        return self.stages.solve(i, j, c, solver)[1]

    def recompute_ms(self, i: int, choice: StageChoice) -> float:
        layer_fwd = self.stages.chain.layer_fwd
        return sum(layer_fwd[i + k] for k, p in enumerate(choice.policies) if p == RECOMPUTE)


def _solve_exact(problem: StageProblem) -> StageChoice | None:
    return solve_exact(problem, max_states=1 << 16)


def count_plans(layout: DeviceLayout, num_layers: int) -> int:
    """How many candidates there are: layouts of k stages times the C(n-1, k-1) partitions."""
    by_stages = [[0] * (layout.num_devices + 1) for _ in range(layout.num_devices + 1)]
    by_stages[0][0] = 1  # by_stages[k][d]: layouts of k stages on d devices
    for k in range(1, layout.num_devices + 1):
        for d in range(1, layout.num_devices + 1):
            by_stages[k][d] = sum(by_stages[k - 1][d - r] for r in layout.replica_counts
                                  if r <= d)
    return sum(by_stages[k][-1] * math.comb(num_layers - 1, k - 1)
               for k in range(1, min(layout.num_devices, num_layers) + 1))


@dataclass
class Outcome:
    """The search's answer: the plan, its simulated step, whether the search finished."""

    best: Candidate
    step_ms: float
    exhaustive: bool
    num_simulated: int
    subproblems_solved: int  # by the program and the search


class Refinement:
    """The branch and bound of the module docstring for one request."""

    def __init__(self, request: PlanRequest, stages: StageEvaluator, layout: DeviceLayout,
                 band: Band, large: Solver = solve_bounded) -> None:
        self.request, self.stages, self.layout, self.band = request, stages, layout, band
        self.chain = stages.chain
        self.choices = StageChoices(stages, large)
        self.bound = StepBound(request, self.chain, layout)
        self.budget = math.inf if count_plans(
            layout, self.chain.num_layers) <= EXHAUSTIVE_MAX_PLANS else WORK_BUDGET
        self.work = 0
        self.num_simulated = 0

    def run(self, incumbent: Candidate) -> Outcome:
        self.best, self.best_ms = incumbent, self.simulate(incumbent)
        finished = self._search(Prefix(), 0, 0, [], [])
        return Outcome(self.best, self.best_ms, finished, self.num_simulated,
                       self.stages.solved)

    def simulate(self, candidate: Candidate) -> float:
        """The candidate's simulated step time; inf when it does not fit as simulated."""
        request = self.request
        self.num_simulated += 1
        steps = 1 if self.bound.sync else 2 * math.ceil(
            self.layout.num_devices / request.num_microbatches) + 2
        self.work += _SIMULATE_UNITS * request.num_microbatches * self.layout.num_devices * steps
        result = simulate(request.scaled, build(request, candidate), request.cluster,
                          with_timeline=False)
        return result.step_time_ms if result.fits else math.inf

    def _search(self, prefix: Prefix, d: int, j: int, stages: list[PlannedStage],
                choices: list[StageChoice]) -> bool:
        """Every candidate that starts with ``stages``; False once the budget ran out."""
        if d == self.layout.num_devices:
            if prefix.bound_ms < self.best_ms * (1 + 1e-9):
                candidate = Candidate(list(stages), list(choices))
                step = self.simulate(candidate)
                if step < self.best_ms * (1 - _TIE):
                    self.best, self.best_ms = candidate, step
            return self.work <= self.budget
        children = sorted(self._children(prefix, d, j))
        for low, i_end, r in children:
            if self.work > self.budget:
                return False
            if low >= self.best_ms * (1 + 1e-9):
                break
            c = self.layout.context(d, r)
            self.work += _SOLVE_UNITS * (i_end - j)
            choice = self.choices.get(j, i_end, c)
            if choice is None:
                continue
            ctx = self.stages.contexts[c]
            after = self.bound.extend(prefix, j, i_end, d, ctx,
                                      self.choices.recompute_ms(j, choice))
            if self._hopeless(after, d + r, i_end):
                continue
            stages.append(PlannedStage(j, i_end, d, r))
            choices.append(choice)
            finished = self._search(after, d + r, i_end, stages, choices)
            stages.pop()
            choices.pop()
            if not finished:
                return False
        return True

    def _hopeless(self, prefix: Prefix, d: int, j: int) -> bool:
        left = self.layout.num_devices - d
        low = prefix.bound_ms if not left else self.bound.completion_ms(prefix, j, left)
        return low >= self.best_ms * (1 + 1e-9)

    def _children(self, prefix: Prefix, d: int, j: int) -> Iterator[tuple[float, int, int]]:
        """(bound without recompute, end, replicas) of each next stage that may win."""
        layout, count, limit = self.layout, self.chain.num_layers, self.best_ms * (1 + 1e-9)
        for r in layout.replica_counts:
            left = layout.num_devices - d - r
            if left < 0:
                break
            c = layout.context(d, r)
            ctx = self.stages.contexts[c]
            last = count - layout.min_stages[left] if left else count
            for end in range(j + 1 if left else count, last + 1):
                self.work += 1
                if j < self.band.first_start(c, end):
                    break  # the stage cannot fit, nor can longer ones
                term = self.bound.term_ms(prefix, j, end, ctx, 0.0, d == 0)
                if term >= limit:
                    break  # longer stages only add
                after = self.bound.extend(prefix, j, end, d, ctx, 0.0)
                low = after.bound_ms if not left else self.bound.completion_ms(after, end, left)
                if low < limit:
                    yield low, end, r


def build(request: PlanRequest, candidate: Candidate,
          settings: dict[str, object] | None = None) -> Plan:
    """The Plan of a candidate, ``settings`` in its provenance."""
    policies: dict[int, str] = {}
    for stage, choice in zip(candidate.stages, candidate.choices, strict=True):
        policies.update({stage.start + k: p for k, p in enumerate(choice.policies) if p != KEEP})
    return request.build_plan(
        [list(range(s.start, s.end)) for s in candidate.stages], policies,
        replicas=[s.replicas for s in candidate.stages], planner="optimal",
        settings=settings)
