"""``optimal``'s second phase: the fastest plan as the simulator scores it.

The program (``planner.py``) returns P*, a plan of least bottleneck; the simulated step is
not a function of the bottleneck alone (``optimal_bound``), so another plan may be faster.
The splits are every layout of replicas the program considers (stages on consecutive
devices, replica counts dividing the micro-batches) with every partition of the chain; P*
with the program's own choices is the incumbent when the program found one. A branch and
bound over stages, first device to last, extends a prefix only while ``optimal_bound``'s
bound of it, and of any way to finish it, is below the fastest step simulated so far, tries
the cheapest-looking stages first, and searches each complete split that gets through. A
plan replaces the incumbent only if it fits as simulated and is strictly faster, so ties
keep P*.

Two phases search the splits this way:

1. the stage-model phase (every schedule): each stage gets its fastest fitting choice under
   the stage model (``StageChoices``), and a complete split is simulated once;
2. the exact phase (gpipe, 1f1b; only when some split has no stage of more than
   ``POLICY_MAX_LAYERS`` layers): a stage's bound takes the least recompute of any of its
   choices whose memory floor fits (``optimal_policies``), and a complete split is searched
   over every keep/recompute/swap choice of every stage (``PolicySearch``), each node judged
   by simulating it, starting from the first phase's best. A stage with more layers is not
   searched; the bound of the prefix it would extend is kept as unexplored. When the phase
   ends within its budget having left out no stage, the answer is proven the fastest fitting
   plan over every split and every policy (``Outcome.optimal``), or that no plan fits.

One split's policy search gets ``_SPLIT_SHARE`` of the budget; a split that needs more is
deferred and finished, least bound first, after every other split, so one hard split does
not starve the others.

The search stops after a deterministic work budget (a stage bound 1 unit, a stage's memory
subproblem its layer count x ``_SOLVE_UNITS``, a simulation its micro-batch passes x
``_SIMULATE_UNITS``; units are roughly microseconds of one core): ``WORK_BUDGET`` for the
first phase (none when there are at most ``EXHAUSTIVE_MAX_PLANS`` splits),
``EXACT_WORK_BUDGET`` for the second. Where nothing is proven for a synchronous schedule,
``Outcome.lower_ms`` is a proven lower bound on the step of every fitting plan: the least
bound of what the exact phase left unexplored, or without an exact phase the bound of the
whole chain (``StepBound.completion_ms`` from nothing). pipedream: the step bound is tested
rather than proven there, so nothing is claimed.
"""

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from pipestudio.planner.algorithms.optimal.band import Band
from pipestudio.planner.algorithms.optimal.bound import Prefix, StepBound
from pipestudio.planner.algorithms.optimal.policies import (
    POLICY_MAX_LAYERS,
    Option,
    PolicySearch,
    keep_all,
    stage_options,
)
from pipestudio.planner.algorithms.optimal.program import EXACT_MAX_LAYERS, DeviceLayout
from pipestudio.planner.algorithms.request import PlanRequest
from pipestudio.planner.cost_model.chain import Solver, StageEvaluator
from pipestudio.planner.cost_model.memopt.bounded import solve_bounded
from pipestudio.planner.cost_model.memopt.exact import (
    KEEP,
    RECOMPUTE,
    SWAP,
    StageChoice,
    StageProblem,
    solve_exact,
)
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.result import SimResult
from pipestudio.planner.simulator.simulate import simulate

#: pipedream searches over at most this many candidate plans are never cut short.
EXHAUSTIVE_MAX_PLANS = 2000
#: Work allowed (module docstring); units are roughly microseconds.
WORK_BUDGET = 300_000
EXACT_WORK_BUDGET = 2_000_000
#: The share of the budget one split's policy search gets before the other splits are tried.
_SPLIT_SHARE = 0.1
_SOLVE_UNITS = 20
_ENUMERATE_UNITS = 2  # a step of ``stage_options``
_SIMULATE_UNITS = 100
#: A candidate must be faster than the incumbent by more than this (relative) to replace it.
_TIE = 1e-12


@dataclass(frozen=True)
class PlannedStage:
    start: int
    end: int
    first_device: int
    replicas: int


class Pick(NamedTuple):
    """A stage's choices in the search, the one that bounds them, and their least
    recompute time (what the step bound of a prefix may assume)."""

    options: list[Option]
    relaxed: Option
    least_recompute_ms: float


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
            by_stages[k][d] = sum(by_stages[k - 1][d - r] for r in layout.replica_counts if r <= d)
    return sum(
        by_stages[k][-1] * math.comb(num_layers - 1, k - 1)
        for k in range(1, min(layout.num_devices, num_layers) + 1)
    )


@dataclass
class Outcome:
    """The search's answer: the plan (None when none fits as simulated), its simulated step
    (inf then), whether the search finished (``exhaustive``), whether the plan is proven the
    fastest fitting one over every split and policy (``optimal``; with no plan: proven that
    none fits), and a proven lower bound on every fitting plan's step (``lower_ms``, None
    where nothing is proven: pipedream)."""

    best: Candidate | None
    step_ms: float
    exhaustive: bool
    optimal: bool
    lower_ms: float | None
    num_simulated: int
    subproblems_solved: int  # by the program and the search


class Refinement:
    """The branch and bound of the module docstring for one request."""

    def __init__(
        self,
        request: PlanRequest,
        stages: StageEvaluator,
        layout: DeviceLayout,
        band: Band,
        large: Solver = solve_bounded,
    ) -> None:
        self.request, self.stages, self.layout, self.band = request, stages, layout, band
        self.chain = stages.chain
        self.choices = StageChoices(stages, large)
        self.bound = StepBound(request, self.chain, layout)
        #: The phase: each stage's stage-model choice (False), or every policy (True).
        self.exact = False
        self.budget = (
            math.inf
            if count_plans(layout, self.chain.num_layers) <= EXHAUSTIVE_MAX_PLANS
            else WORK_BUDGET
        )
        self.work = 0
        self.num_simulated = 0
        self.picks: dict[tuple[object, ...], Pick] = {}
        self.best: Candidate | None = None
        self.best_ms = math.inf
        self.unexplored_ms = math.inf
        self.skipped = False  # a split with a stage too large to enumerate was left out
        #: Splits whose policy search outgrew its share: (least bound left, stages, picks).
        self.deferred: list[tuple[float, list[PlannedStage], list[Pick]]] = []

    def run(self, incumbents: list[Candidate]) -> Outcome:
        """The search, starting from the fastest fitting of ``incumbents`` as simulated."""
        for incumbent in incumbents:
            step, fits = self.simulate(incumbent)
            if self.best is None or (fits and step < self.best_ms):
                self.best, self.best_ms = incumbent, step if fits else math.inf
        finished = self._phase()
        provable = self.bound.sync and (
            self.chain.num_layers <= POLICY_MAX_LAYERS * self.layout.num_devices
        )
        proven = False
        if provable:  # some split has no stage too large to enumerate
            self.exact, self.work, self.budget = True, 0, EXACT_WORK_BUDGET
            self.unexplored_ms, self.deferred = math.inf, []
            proven = finished = self._phase() and not self.skipped
        if proven:
            lower: float | None = self.best_ms
        elif provable:
            lower = min(self.best_ms, self.unexplored_ms)
        elif self.bound.sync:
            lower = min(
                self.best_ms, self.bound.completion_ms(Prefix(), 0, self.layout.num_devices)
            )
        else:
            lower = None
        best = None if proven and math.isinf(self.best_ms) else self.best
        return Outcome(
            best, self.best_ms, finished, proven, lower, self.num_simulated, self.stages.solved
        )

    def _phase(self) -> bool:
        """Search every split (and the deferred ones); False when the budget ran out."""
        if self._search(Prefix(), 0, 0, [], []):
            return self._finish_deferred()
        self.unexplored_ms = min([self.unexplored_ms, *(low for low, _, _ in self.deferred)])
        return False

    def simulate(self, candidate: Candidate) -> tuple[float, bool]:
        """The candidate's simulated step time and whether it fits."""
        result = self._simulate(candidate)
        return result.step_time_ms, result.fits

    def _simulate(self, candidate: Candidate) -> SimResult:
        request = self.request
        self.num_simulated += 1
        steps = (
            1
            if self.bound.sync
            else 2 * math.ceil(self.layout.num_devices / request.num_microbatches) + 2
        )
        self.work += _SIMULATE_UNITS * request.num_microbatches * self.layout.num_devices * steps
        return simulate(
            request.scaled, build(request, candidate), request.cluster, with_timeline=False
        )

    def _offer(self, candidate: Candidate, step: float, fits: bool) -> None:
        if fits and step < self.best_ms * (1 - _TIE):
            self.best, self.best_ms = candidate, step

    def _beaten(self, step: float) -> bool:
        return step >= self.best_ms * (1 - _TIE)

    def _spent(self) -> bool:
        return self.work > self.budget

    def _search(
        self, prefix: Prefix, d: int, j: int, stages: list[PlannedStage], picks: list[Pick]
    ) -> bool:
        """Every split that starts with ``stages``; False once the budget ran out."""
        if d == self.layout.num_devices:
            if self._beaten(prefix.bound_ms):
                return True
            return self._complete(stages, picks)
        children = sorted(self._children(prefix, d, j))
        for index, (low, i_end, r) in enumerate(children):
            if self._spent():
                self.unexplored_ms = min(self.unexplored_ms, low)
                return False
            if self._beaten(low):
                break
            if self.exact and i_end - j > POLICY_MAX_LAYERS:
                self.skipped = True  # too many policies: the stage-model phase covered it
                self.unexplored_ms = min(self.unexplored_ms, low)
                continue
            c = self.layout.context(d, r)
            pick = self._pick(j, i_end, c)
            if pick is None:
                continue
            ctx = self.stages.contexts[c]
            after = self.bound.extend(prefix, j, i_end, d, ctx, pick.least_recompute_ms)
            if self._hopeless(after, d + r, i_end):
                continue
            stages.append(PlannedStage(j, i_end, d, r))
            picks.append(pick)
            finished = self._search(after, d + r, i_end, stages, picks)
            stages.pop()
            picks.pop()
            if not finished:
                if index + 1 < len(children):
                    self.unexplored_ms = min(self.unexplored_ms, children[index + 1][0])
                return False
        return True

    def _pick(self, i: int, j: int, c: int) -> Pick | None:
        """The choices a stage is searched over and the one that bounds them; None when none
        can fit. The first phase gives each stage its fastest fitting choice under the stage
        model alone; the exact phase every choice (``stage_options``), bounded by keeping
        every layer."""
        self.work += _SOLVE_UNITS * (j - i)
        if not self.exact:
            choice = self.choices.get(i, j, c)
            if choice is None:
                return None
            option = _option_of(
                self.stages.problem(i, j, c), choice, self.choices.recompute_ms(i, choice)
            )
            return Pick([option], option, option.recompute_ms)
        key = (i, j, *self.stages.context_key(c))
        if key not in self.picks:
            problem = self.stages.problem(i, j, c)
            options, steps = stage_options(self.chain, i, j, self.stages.contexts[c], problem)
            self.work += _ENUMERATE_UNITS * steps
            least = min((option.recompute_ms for option in options), default=0.0)
            self.picks[key] = Pick(options, keep_all(problem), least)
        pick = self.picks[key]
        return pick if pick.options else None

    def _complete(self, stages: list[PlannedStage], picks: list[Pick]) -> bool:
        """Search a complete split's choices (``PolicySearch``) within ``_SPLIT_SHARE`` of
        the budget; a split that needs more waits in ``deferred`` for what the others leave."""
        share = self.work + self.budget * _SPLIT_SHARE
        search = self._policy_search(
            list(stages), picks, lambda: self._spent() or self.work > share
        )
        if search.run():
            return True
        if self._spent():
            self.unexplored_ms = min(self.unexplored_ms, search.unexplored_ms)
            return False
        self.deferred.append((search.unexplored_ms, list(stages), list(picks)))
        return True

    def _finish_deferred(self) -> bool:
        """Search the deferred splits, least bound first, with the rest of the budget."""
        self.deferred.sort(key=lambda item: item[0])
        for index, (low, stages, picks) in enumerate(self.deferred):
            if self._beaten(low):
                continue
            search = self._policy_search(stages, picks, self._spent)
            if not search.run():
                rest = [item[0] for item in self.deferred[index + 1 :]]
                self.unexplored_ms = min([self.unexplored_ms, search.unexplored_ms, *rest])
                return False
        return True

    def _policy_search(
        self, stages: list[PlannedStage], picks: list[Pick], spent: Callable[[], bool]
    ) -> PolicySearch:
        def evaluate(options: list[Option]) -> tuple[float, list[bool]]:
            candidate = Candidate(
                stages, [StageChoice(o.model_ms, o.policies, True) for o in options]
            )
            result = self._simulate(candidate)
            self._offer(candidate, result.step_time_ms, result.fits)
            return result.step_time_ms, [stage.fits for stage in result.stages]

        return PolicySearch(
            [pick.options for pick in picks],
            [pick.relaxed for pick in picks],
            evaluate,
            self._beaten,
            spent,
        )

    def _hopeless(self, prefix: Prefix, d: int, j: int) -> bool:
        left = self.layout.num_devices - d
        low = prefix.bound_ms if not left else self.bound.completion_ms(prefix, j, left)
        return self._beaten(low)

    def _children(self, prefix: Prefix, d: int, j: int) -> Iterator[tuple[float, int, int]]:
        """(bound without recompute, end, replicas) of each next stage that may win."""
        layout, count = self.layout, self.chain.num_layers
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
                if self._beaten(term):
                    break  # longer stages only add
                after = self.bound.extend(prefix, j, end, d, ctx, 0.0)
                low = after.bound_ms if not left else self.bound.completion_ms(after, end, left)
                if not self._beaten(low):
                    yield low, end, r


def _option_of(problem: StageProblem, choice: StageChoice, recompute_ms: float) -> Option:
    """A stage-model choice, whose recompute takes ``recompute_ms``, as a ``PolicySearch``
    option."""
    swap = sum(b for b, p in zip(problem.saved_bytes, choice.policies, strict=True) if p == SWAP)
    recomputes = any(p == RECOMPUTE for p in choice.policies)
    kept = recomputed = 0
    for k, policy in enumerate(choice.policies):
        if policy == KEEP:
            kept += problem.saved_bytes[k]
        elif policy == RECOMPUTE:
            recomputed += problem.saved_bytes[k]
            if k == 0 or choice.policies[k - 1] != RECOMPUTE:
                kept += problem.input_bytes[k]
    return Option(choice.policies, recompute_ms, swap, recomputes, choice.time_ms, kept, recomputed)


def build(
    request: PlanRequest, candidate: Candidate, settings: dict[str, object] | None = None
) -> Plan:
    """The Plan of a candidate, ``settings`` in its provenance."""
    policies: dict[int, str] = {}
    for stage, choice in zip(candidate.stages, candidate.choices, strict=True):
        policies.update({stage.start + k: p for k, p in enumerate(choice.policies) if p != KEEP})
    return request.build_plan(
        [list(range(s.start, s.end)) for s in candidate.stages],
        policies,
        replicas=[s.replicas for s in candidate.stages],
        planner="optimal",
        settings=settings,
    )
