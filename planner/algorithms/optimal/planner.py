"""``optimal``: the smallest bottleneck over every partition, replication and memory policy.

For a chain of layers on D devices (``request.num_stages`` counts devices here), a plan is
a sequence of stages, stage t holding r_t replicas on consecutive devices, sum r_t = D
(every device is used), each r_t dividing the micro-batches (the Plan format needs it);
``request.single_replica`` allows r_t = 1 only, which gives D stages. A dynamic program over
devices used and chain prefixes (PipeDream §3.1 does the same over its cost model) finds

    best(d, j) = min over r, i of max(best(d - r, i), link(d - r, i), stage(i, j, d - r, r))

where stage(i, j, d0, r) is the time per micro-batch of layers i..j-1 as a stage whose r
replicas start at device d0, with their fastest keep/recompute/swap choice that fits the
device memory, and link(d0, i) the transfer of layer i-1's output from device d0 - 1 (the
previous stage's last) to d0. Under the stage model (``cost_model/stage.py``) a stage takes its
replica's compute over r plus its update and all-reduce's share; its micro-batches in flight
(through the 1F1B warm-up, (D - d0 - 1) // r forwards), memory, swap stall and all-reduce
depend on d0 and r, so the program keeps them (``optimal_program.DeviceLayout``). A link is
not divided among replicas: several replica pairs could send at once, so this overstates it.

The stage subproblem is solved exactly (``memopt.solve_exact``) for stages of up to
``EXACT_MAX_LAYERS`` layers, and otherwise by ``memopt_bounded.solve_bounded``: a choice
together with a proven lower bound on the best one. When any stage of the search was not
solved exactly, the program runs again on those lower bounds, which bounds the optimum
itself from below: the objective is then proven within ``gap`` of the best possible
(``details``; a gap of 0 means optimal). The large stages of the plan that bound comes from
are then solved exactly where their Pareto sets stay small, and the program on bounds runs
again (``_tighten``), which closes most gaps.

The program is fast because most candidates are settled without solving their memory
subproblem:

- a limit comes first: no plan is faster than the chain's compute over D devices, so the
  program runs within a limit just above that, doubling the excess until it finds a plan,
  never above the bottleneck of time-balanced straight stages with greedy memory choices
  (``memopt_greedy.solve_greedy``); a program within a limit finds every plan within it;
- stage(i, j, d0, r) is at least its time keeping every layer, which grows as i moves back,
  so for each j only the starts within the best so far are tried; a stage on r devices
  computes at most r x the limit, so only the ends j that leave the devices before and
  after within the limit are tried;
- inside the window a stage is settled in O(1) when keeping every layer fits, or when
  swapping within the free transfer time frees enough, or when a lower bound (every byte
  freed at the best rate the stage offers) already loses; otherwise the subproblem runs
  with the best value so far as its cutoff and the head max(best(d0, i), link(d0, i)) as
  its floor, both turned into replica compute time;
- a stage that cannot fit even recomputing every layer (its parameters, workspace and one
  micro-batch of saved bytes exceed the memory) ends the scan of starts for its j, since
  earlier starts only add to each of those;
- for stages too large for the exact subproblem the first program gallops (a binary search
  that assumes a stage gets no faster with more layers, ``optimal_program._Scan.gallop``);
  the program on lower bounds assumes nothing of the kind, so the certificate holds
  whatever the stages do.

The bottleneck is a proxy of the simulated step (fill and drain, GPipe's phases, round
trips over slow links, swaps the simulator overlaps differently), so a second phase
(``refine.py``) chooses the plan by simulating: every split with each stage's
stage-model choice, then, under gpipe and 1f1b, every split with every keep/recompute/swap
choice (``policies.py``), pruned by proven lower bounds on the step
(``bound.py``). ``details["step_optimal"]`` says whether the plan is proven the
fastest that fits as simulated over every split and policy; otherwise ``step_gap`` is its
distance to a proven lower bound (None under pipedream, where nothing is proven).
``objective_ms`` is the returned plan's bottleneck; ``details`` keep the program's
(``bottleneck_ms``, ``gap``, ``exact``) and add the simulated ``step_ms``.

Profiles with edges are planned on their sequential backbone (``cost_model/coarsen.py``).
"""

import bisect
import math
from typing import Any

from pipestudio.planner.algorithms.optimal.band import Band
from pipestudio.planner.algorithms.optimal.program import (
    EXACT_MAX_LAYERS,
    DeviceLayout,
    Program,
    Table,
)
from pipestudio.planner.algorithms.optimal.refine import (
    Candidate,
    Outcome,
    PlannedStage,
    Refinement,
    build,
)
from pipestudio.planner.algorithms.request import InfeasibleError, PlannerOutput, PlanRequest
from pipestudio.planner.cost_model.chain import ChainCosts, StageEvaluator, link_costs
from pipestudio.planner.cost_model.coarsen import plan_on_backbone
from pipestudio.planner.cost_model.memopt.bounded import lower_bound_ms, solve_bounded
from pipestudio.planner.cost_model.memopt.exact import (
    StageChoice,
    StageProblem,
    solve_exact,
    solve_if_small,
)
from pipestudio.planner.cost_model.memopt.greedy import solve_capuchin, solve_greedy

#: The first program's limits: from 1% above the compute bound, doubling the excess; past
#: 2^10 the limit is the upper bound itself.
_FIRST_EXCESS, _LAST_EXCESS = 0.01, 1024.0
#: How far (relative) above its lower bound a bounded choice, or the cutoff when it
#: finds none, has to be for the other heuristics to be tried.
_FALLBACK_GAP = 0.01
#: ``_tighten`` solves a stage of more than ``EXACT_MAX_LAYERS`` layers exactly while its
#: Pareto sets hold at most this many states (most do: a few dozen), at a cost of at most
#: its layers x this many states.
LARGE_MAX_STATES = 256
#: What ``_Search.tighten`` may spend in all, in layers x states: a stage costs at most its
#: layers x ``LARGE_MAX_STATES`` to solve (and as much again for a truncated choice).
TIGHTEN_WORK = 100_000
#: A stage whose Pareto sets outgrow ``LARGE_MAX_STATES`` gets the program's states cut to
#: the fastest as a choice only up to this many layers: on larger ones it costs more than
#: the whole search and seldom beats the bounded choice.
_TRUNCATED_MAX_LAYERS = 64
#: How often the lower bound's program runs again after solving its plan's large stages.
_TIGHTEN_ROUNDS = 8
#: Capuchin's choice costs a scan of every layer per layer it changes: larger stages skip it.
_CAPUCHIN_MAX_LAYERS = 64
#: The lower bound is lowered by this relative amount, far more than the rounding of the
#: sums its program compares (its pruning holds in exact arithmetic).
_ROUNDING = 1e-9


def solve_stage(
    problem: StageProblem, cutoff_ms: float = math.inf, floor_ms: float = -math.inf
) -> StageChoice | None:
    """The stage subproblem: exact for small stages, bounded for large ones."""
    if len(problem.fwd_ms) <= EXACT_MAX_LAYERS:
        return solve_exact(problem, cutoff_ms, max_states=1 << 16, floor_ms=floor_ms)
    return solve_bounded(problem, cutoff_ms, floor_ms)


class _Search:
    """The stage values the programs ask for, in context c: chosen ones (kept for the plan)
    and proven lower bounds of them. Values are stage times; subproblems see replica
    compute time (``StageEvaluator.compute_ms``)."""

    def __init__(self, stages: StageEvaluator) -> None:
        self.stages = stages
        self.choices: dict[tuple[int, int, int], StageChoice] = {}
        self.bounds: dict[tuple[object, ...], float] = {}
        # large stages tried exactly: the fastest choice (None: too large to solve), and
        # whether none fits at all
        self.proven: dict[tuple[int, int, int], StageChoice | None] = {}
        self.infeasible: dict[tuple[int, int, int], bool] = {}
        self.truncated: dict[tuple[int, int, int], StageChoice | None] = {}
        self.tighten_left = TIGHTEN_WORK  # layers x states ``tighten`` may still search

    def lower_bound(self, i: int, j: int, c: int) -> float:
        """The bounded subproblem's lower bound in compute time, once per problem."""
        key = (i, j, *self.stages.context_key(c))
        bound = self.bounds.get(key)
        if bound is None:
            bound = self.bounds[key] = lower_bound_ms(self.stages.problem(i, j, c))
        return bound

    def _solve(
        self, i: int, j: int, c: int, head: float, current: float
    ) -> tuple[float, StageChoice | None]:
        stages = self.stages
        cutoff, floor = stages.compute_ms(current, i, j, c), stages.compute_ms(head, i, j, c)
        if j - i <= EXACT_MAX_LAYERS:
            stages.solved += 1
            choice = solve_exact(
                stages.problem(i, j, c), cutoff, max_states=1 << 16, floor_ms=floor
            )
        else:
            lower = self.lower_bound(i, j, c)
            if lower > cutoff:
                return math.inf, None
            stages.solved += 1
            choice = _bounded_choice(stages.problem(i, j, c), cutoff, floor, lower)
            if choice is None:  # the heuristics gave up: some choice may still fit
                stages.proven = False
        if choice is None:
            return math.inf, None
        stages.proven = stages.proven and choice.exact
        return stages.stage_ms(choice.time_ms, i, j, c), choice

    def tighten(self, i: int, j: int, c: int) -> bool:
        """Solve large stage (i, j, c) exactly if its Pareto sets stay within
        ``LARGE_MAX_STATES`` (once); whether it is now known exactly."""
        key = (i, j, c)
        cost = (j - i) * LARGE_MAX_STATES
        if key not in self.proven and cost <= self.tighten_left:
            self.tighten_left -= cost
            problem = self.stages.problem(i, j, c)
            complete, choice = solve_if_small(problem, math.inf, LARGE_MAX_STATES)
            self.proven[key] = choice if complete else None
            self.infeasible[key] = complete and choice is None
            if not complete and j - i <= _TRUNCATED_MAX_LAYERS and cost <= self.tighten_left:
                self.tighten_left -= cost  # the program's states cut to the fastest
                self.truncated[key] = solve_exact(problem, max_states=LARGE_MAX_STATES)
        return self.proven.get(key) is not None or self.infeasible.get(key, False)

    def chosen(self, i: int, j: int, c: int, head: float, current: float) -> float:
        value, choice = self._solve(i, j, c, head, current)
        if choice is not None:
            self.choices[(i, j, c)] = choice
        return value

    def lower(self, i: int, j: int, c: int, head: float, current: float) -> float:
        """stage(i, j, c) where it is known exactly (small stages, and large ones
        ``tighten`` solved), else its proven lower bound; a small stage's may be inf above
        the cutoff ``current`` and anything within the floor ``head``, as for ``chosen``."""
        if j - i <= EXACT_MAX_LAYERS:
            return self._solve(i, j, c, head, current)[0]
        if self.infeasible.get((i, j, c)):
            return math.inf
        proven = self.proven.get((i, j, c))
        time_ms = self.lower_bound(i, j, c) if proven is None else proven.time_ms
        return self.stages.stage_ms(time_ms, i, j, c)

    def choice(self, i: int, j: int, c: int, value: float) -> StageChoice:
        """The choice behind stage(i, j, c) = ``value`` in the program's answer."""
        known = self.choices.get((i, j, c))
        if known is None:  # settled by its bounds: keep all, or swap within free time
            floor = self.stages.compute_ms(value, i, j, c)
            known = solve_stage(self.stages.problem(i, j, c), floor_ms=floor)
        assert known is not None
        return known


def _large_choice(problem: StageProblem) -> StageChoice | None:
    """The fastest choice ``_bounded_choice`` finds for a large stage, with no cutoff."""
    return _bounded_choice(problem, math.inf, -math.inf, lower_bound_ms(problem))


def _bounded_choice(
    problem: StageProblem, cutoff_ms: float, floor_ms: float, lower_ms: float
) -> StageChoice | None:
    """``solve_bounded``'s choice, or the fastest of it and the other planners' heuristics
    (vPipe's ranking both ways, DawnPiper's Capuchin-style model) where it may be poor: it
    found none although its lower bound is more than ``_FALLBACK_GAP`` below the cutoff,
    or one that far above the lower bound and the floor. Each heuristic gives a valid
    choice and none is always best; trying the others only there keeps the common case
    fast."""
    choice = solve_bounded(problem, cutoff_ms, floor_ms, lower_ms)
    room = lower_ms * (1 + _FALLBACK_GAP)
    if choice is None and room >= cutoff_ms:
        return None
    if choice is not None and (choice.time_ms <= floor_ms or choice.time_ms <= room):
        return choice
    others = [solve_greedy(problem), solve_greedy(problem, swap_first=False)]
    if len(problem.fwd_ms) <= _CAPUCHIN_MAX_LAYERS:
        others.append(solve_capuchin(problem))
    for other in others:
        if (
            other is not None
            and other.time_ms <= cutoff_ms
            and (choice is None or other.time_ms < choice.time_ms)
        ):
            exact = other.time_ms <= lower_ms * (1 + 1e-12)
            choice = StageChoice(other.time_ms, other.policies, exact, lower_ms)
    return choice


def optimal(request: PlanRequest) -> PlannerOutput:
    num_devices = request.stages_required("optimal")
    if not request.scaled.is_chain:
        return plan_on_backbone(request, optimal)
    chain = ChainCosts.of(request)
    layout = DeviceLayout.of(request, num_devices)
    stages = StageEvaluator(chain, layout.contexts)
    links = link_costs(request, chain, num_devices)
    search = _Search(stages)
    band = Band.of(stages, layout)
    program = Program(chain, stages, links, layout, band)
    kind = "straight pipeline" if request.single_replica else "pipeline"
    if not band.feasible:
        raise InfeasibleError(
            f"no {kind} on {num_devices} devices fits the device memory, even recomputing or "
            f"swapping layers"
        )
    best, back = _first_pass(program, search, _upper_bound(chain, stages, links, layout))
    refinement = Refinement(request, stages, layout, band, _large_choice)
    incumbents: list[Candidate] = []
    bottleneck = _NO_BOTTLENECK
    if not math.isinf(best[-1][-1]):
        plan_stages = _stages(back)
        incumbent = Candidate(
            plan_stages,
            [
                search.choice(
                    s.start, s.end, layout.context(s.first_device, s.replicas), best[-1][-1]
                )
                for s in plan_stages
            ],
        )
        value = _bottleneck(stages, links, layout, incumbent)
        proven = stages.proven and not program.assumed
        lower = value
        if not proven:
            tightened, value, lower = _tighten(program, search, incumbent, value)
            if tightened is not incumbent:  # the simulator judges which of the two is faster
                incumbents.append(tightened)
        incumbents.append(incumbent)
        bottleneck = {
            "exact": proven,
            "lower_bound_ms": lower,
            "bottleneck_ms": value,
            "gap": value / lower - 1 if lower > 0 else 0.0,
        }
    elif not refinement.exact:
        raise InfeasibleError(
            f"no {kind} on {num_devices} devices fits the device memory, even recomputing or "
            f"swapping layers"
        )
    outcome = refinement.run(incumbents)
    if outcome.best is None:
        raise InfeasibleError(
            f"no {kind} on {num_devices} devices fits the device memory as simulated, with "
            f"any split and any keep, recompute or swap choice of its layers"
        )
    return _output(request, outcome, _bottleneck(stages, links, layout, outcome.best), bottleneck)


#: What the program proved when it found no plan under the stage model.
_NO_BOTTLENECK: dict[str, Any] = {
    "exact": False,
    "lower_bound_ms": None,
    "bottleneck_ms": None,
    "gap": None,
}


def _output(
    request: PlanRequest, outcome: Outcome, objective_ms: float, bottleneck: dict[str, Any]
) -> PlannerOutput:
    """The plan the refinement chose; ``objective_ms`` is its bottleneck, ``bottleneck``
    what the program proved of the least bottleneck, ``step_*`` what the search proved of
    the simulated step."""
    assert outcome.best is not None
    num_devices = request.stages_required("optimal")
    replicas = [stage.replicas for stage in outcome.best.stages]
    lower = outcome.lower_ms
    gap = (
        None
        if lower is None or math.isinf(outcome.step_ms)
        else (outcome.step_ms / lower - 1 if lower > 0 else 0.0)
    )
    if outcome.optimal:
        gap = 0.0
    step = {
        "step_ms": outcome.step_ms,
        "step_optimal": outcome.optimal,
        "step_lower_bound_ms": lower,
        "step_gap": gap,
        "step_exhaustive": outcome.exhaustive,
    }
    details = {
        **bottleneck,
        **step,
        "plans_simulated": outcome.num_simulated,
        "subproblems_solved": outcome.subproblems_solved,
        "num_devices": num_devices,
        "replicas": replicas,
        "straight": request.single_replica,
    }
    plan = build(
        request,
        outcome.best,
        {
            "step_optimal": outcome.optimal,
            "step_gap": gap,
            "bottleneck_exact": bottleneck["exact"],
            "bottleneck_gap": bottleneck["gap"],
            "num_devices": num_devices,
            "straight": request.single_replica,
        },
    )
    return PlannerOutput(plan, objective_ms, details)


def step_claim(provenance: dict[str, Any]) -> str | None:
    """What ``optimal`` proved of a plan's simulated step, from the plan's provenance, in
    words; None for a plan it did not make."""
    if provenance.get("planner") != "optimal" or "step_optimal" not in provenance:
        return None
    if provenance["step_optimal"]:
        return "proven optimal"
    gap = provenance.get("step_gap")
    if gap is None:
        return "not proven optimal"
    percent = f"{100 * gap:.2g}" if gap >= 1e-4 else "0.01"  # an upper bound either way
    return f"within {percent}% of optimal (proven bound)"


def _first_pass(program: Program, search: _Search, upper: float) -> Table:
    """The program on chosen stage values, within limits that grow towards ``upper``.

    Every plan's bottleneck is at least the chain's compute over the devices (a stage on r
    devices takes at least its compute over r), so the first limit is just above that and
    its excess doubles until the program finds a plan. When the greedy upper bound is far
    off, or no time-balanced split fits (upper is inf), this saves most of the work.
    """
    floor = program.base[-1] / program.layout.num_devices
    excess = _FIRST_EXCESS
    while True:
        limit = (
            upper if excess > _LAST_EXCESS or not floor > 0 else min(upper, floor * (1 + excess))
        )
        search.choices.clear()
        best, back = program.run(limit, search.chosen, gallop=True)
        if best[-1][-1] < math.inf or limit >= upper:
            return best, back
        excess *= 2


def _tighten(
    program: Program, search: _Search, incumbent: Candidate, value: float
) -> tuple[Candidate, float, float]:
    """The incumbent, its bottleneck ``value`` and a proven lower bound on the optimum.

    The bound is the program on each stage's exact value (small stages) or proven lower
    bound (large ones), without the first program's gallop, so it assumes nothing of how
    stages grow. Where the bound's plan has large stages, those are solved exactly if
    they can be (``_Search.tighten``) and the program runs again, at most
    ``_TIGHTEN_ROUNDS`` times: only the few stages that decide the bound are solved. Each
    round's plan, with the best choices known for its stages, becomes the incumbent when
    its bottleneck is smaller (once every stage is known exactly it reaches the bound)."""
    lower = value
    for _ in range(_TIGHTEN_ROUNDS):
        best, back = program.run(value, search.lower, gallop=False)
        lower = min(value, best[-1][-1])
        if math.isinf(best[-1][-1]):
            break
        split = _stages(back)
        keys = [(s.start, s.end, program.layout.context(s.first_device, s.replicas)) for s in split]
        large = [
            key
            for key in keys
            if key[1] - key[0] > EXACT_MAX_LAYERS and search.proven.get(key) is None
        ]
        tightened = [search.tighten(*key) for key in large]
        candidate = _known_plan(search, split, keys, best[-1][-1])
        if candidate is not None:
            found = _bottleneck(search.stages, program.links, program.layout, candidate)
            if found < value:
                incumbent, value = candidate, found
        if not any(tightened):
            break
    return incumbent, value, min(value, lower) * (1 - _ROUNDING)


def _known_plan(
    search: _Search, split: list[PlannedStage], keys: list[tuple[int, int, int]], value: float
) -> Candidate | None:
    """The plan of the bound's program with the best choices known: large stages'
    from ``_Search.tighten`` or else ``_large_choice``, small ones solved again within
    ``value``; None when some stage has none that fits."""
    choices = []
    for i, j, c in keys:
        problem = search.stages.problem(i, j, c)
        choice = search.proven.get((i, j, c))
        if choice is None and j - i > EXACT_MAX_LAYERS:
            found = [search.truncated.get((i, j, c)), _large_choice(problem)]
            choice = min((f for f in found if f is not None), default=None, key=lambda f: f.time_ms)
        elif choice is None:
            choice = solve_stage(problem, floor_ms=search.stages.compute_ms(value, i, j, c))
        if choice is None:
            return None
        choices.append(choice)
    return Candidate(split, choices)


def _upper_bound(
    chain: ChainCosts, stages: StageEvaluator, links: list[list[float]], layout: DeviceLayout
) -> float:
    """The bottleneck of time-balanced straight stages with greedy memory choices (inf if
    one does not fit): any value above it cannot be part of the optimum."""
    value, start = 0.0, 0
    for d, end in enumerate(_time_balanced(chain, layout.num_devices)):
        c = layout.context(d, 1)
        low, settled = stages.bounds(start, end, c)
        if not settled:
            choice = solve_greedy(stages.problem(start, end, c))
            if choice is None:
                return math.inf
            low = stages.stage_ms(choice.time_ms, start, end, c)
        value = max(value, low, links[d][start])
        start = end
    return value


def _time_balanced(chain: ChainCosts, num_stages: int) -> list[int]:
    """Ends of ``num_stages`` stages whose largest forward and backward time is the least
    possible (to a relative 1e-9): stages filled greedily within a limit, found by
    bisection (each stage takes as many layers as fit, leaving one for each later one)."""
    base = [f + b for f, b in zip(chain.fwd, chain.bwd, strict=True)]
    count = len(base) - 1

    def fill(limit: float) -> list[int] | None:
        ends, start = [], 0
        for s in range(num_stages):
            end = min(
                bisect.bisect_right(base, base[start] + limit) - 1, count - (num_stages - s - 1)
            )
            if end <= start:
                return None
            ends.append(end)
            start = end
        return ends if start == count else None

    low, high = 0.0, base[count]
    while high - low > 1e-9 * high:
        middle = (low + high) / 2
        if fill(middle) is None:
            low = middle
        else:
            high = middle
    ends = fill(high)
    assert ends is not None
    return ends


def _bottleneck(
    stages: StageEvaluator, links: list[list[float]], layout: DeviceLayout, candidate: Candidate
) -> float:
    """A candidate's bottleneck under the stage model, links included."""
    value = 0.0
    for stage, choice in zip(candidate.stages, candidate.choices, strict=True):
        c = layout.context(stage.first_device, stage.replicas)
        value = max(
            value,
            stages.stage_ms(choice.time_ms, stage.start, stage.end, c),
            links[stage.first_device][stage.start],
        )
    return value


def _stages(back: list[list[tuple[int, int]]]) -> list[PlannedStage]:
    """The stages of the program's answer, from its back-pointers (start, replicas)."""
    result: list[PlannedStage] = []
    d, j = len(back) - 1, len(back[0]) - 1
    while d > 0:
        i, r = back[d][j]
        result.append(PlannedStage(i, j, d - r, r))
        d, j = d - r, i
    assert j == 0
    result.reverse()
    return result
