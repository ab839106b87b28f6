"""``optimal``'s exact search: every keep/recompute/swap policy of a split, judged by the simulator.

Why a cheap plan bounds dear ones. Under the synchronous schedules (gpipe, 1f1b), with every
worker on a device of its own (as in every plan ``optimal`` forms), the simulator
(``simulator/simulate.py``, ``simulator/events.py``) serves each resource in an order the
plan fixes: a device's compute stream runs its worker's ops one after another; its host
link carries the worker's
swap-outs in forward order and its fetches in backward order (a fetch waits for the start
of the pass before its backward, which comes after the previous backward and so after the
previous fetch); a link between two devices carries one worker's sends in the order of its
passes; a stage's all-reduces come one per step. First come, first served then serves the
ops of each resource in that order whatever their durations, so each op starts at the latest
end (or start) of what it waits for: a max-plus system, in which no end time decreases when
a duration grows or when an op or a dependency is added. A stage's policies reach the
simulated time only through its recompute time R (the recompute op exists when R or its
recomputed bytes are non-zero) and its swapped bytes S (the swap transfers exist when
S > 0). Hence:

    (*) when a stage's R and S grow and it loses no op, no plan's step gets shorter.

Keeping a layer costs nothing, so a split whose stages keep every layer simulates a step no
policy of that split beats, and a plan whose later stages keep every layer bounds every way
of choosing their policies. Memory is another matter (when a swap's bytes leave depends on
timing), so whether a plan fits is read off its simulation, and only a floor that no
simulation goes below filters a stage's choices: when a replica starts the backward of a
micro-batch it holds its static bytes (weights, gradients, optimizer state), the backward's
workspace, the kept bytes (saved bytes kept, checkpoints) of the k micro-batches in flight
(``StageContext.inflight``, what the schedule's order gives) and that micro-batch's fetched
and recomputed bytes. A stage that swaps nothing is exact besides: its memory changes only
at the start and end of its own passes, which run in a fixed order, so its simulated peak
is the same in every plan, and a node whose such stage does not fit has no plan below it
that fits.

The search of a split: its stages in order, each stage's choices that pass the floor tried
cheapest first under the stage model; a node (the first t stages chosen) is simulated with
the later stages keeping every layer. Its step bounds every plan below it (*), and it is
itself a plan, a candidate when it fits. A node no faster than the best plan found so far is
pruned with everything below it (as is one whose last chosen stage swaps nothing and does
not fit), and so is each later sibling whose R and S are at least a
pruned one's and that has every op it has (*). So the search finds the fastest fitting
policy of the split, or proves that none beats the best plan found before it.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

from pipestudio.planner.cost_model.chain import ChainCosts
from pipestudio.planner.cost_model.memopt.exact import KEEP, RECOMPUTE, SWAP, StageProblem
from pipestudio.planner.cost_model.stage import StageContext

#: Stages of up to this many layers have their 3^n choices enumerated.
POLICY_MAX_LAYERS = 8


@dataclass(frozen=True)
class Option:
    """One choice of a stage's policies, with what the simulated time depends on."""

    policies: tuple[str, ...]
    recompute_ms: float
    swap_bytes: int
    recomputes: bool  # the stage has a recompute op
    model_ms: float  # the stage model's compute time (memopt's T), the order of the search
    kept_bytes: int  # per micro-batch: saved bytes kept and checkpoints
    recomputed_bytes: int

    @property
    def timed_alike(self) -> tuple[float, int, bool]:
        """What the simulated times depend on: equal for two choices, equal times."""
        return self.recompute_ms, self.swap_bytes, self.recomputes

    def holds_at_most(self, other: "Option") -> bool:
        """Whether, timed alike or swapping nothing, this choice never holds more bytes."""
        return (
            self.kept_bytes <= other.kept_bytes and self.recomputed_bytes <= other.recomputed_bytes
        )

    def costs_at_least(self, other: "Option") -> bool:
        """Whether (*) of the module docstring makes this choice no faster than ``other``."""
        return (
            self.recompute_ms >= other.recompute_ms
            and self.swap_bytes >= other.swap_bytes
            and (self.recomputes or not other.recomputes)
        )


def keep_all(problem: StageProblem) -> Option:
    return Option(
        (KEEP,) * len(problem.fwd_ms), 0.0, 0, False, problem.base_ms, sum(problem.saved_bytes), 0
    )


def stage_options(
    chain: ChainCosts, i: int, j: int, ctx: StageContext, problem: StageProblem
) -> tuple[list[Option], int]:
    """Every choice for layers i..j-1 in context ``ctx`` whose floor (module docstring) fits
    and that no other choice dominates, cheapest first under the stage model; and the
    steps the enumeration took (partial choices visited and pairs compared), its cost.

    Every term of the floor is a sum over the layers chosen so far, so a prefix whose floor
    already exceeds the memory ends its branch. Where one micro-batch is in flight a swapped
    layer never leaves (``StageContext.swaps_out``): swapping is keeping, and only keep and
    recompute are tried. Choice A dominates B when A is timed as B is or faster (equal
    ``timed_alike``, or neither swaps and A's R is at most B's with no recompute op B lacks)
    and holds at most what B holds: A's simulated memory is then never above B's (the same
    op times, or with nothing swapped the bytes held change only at the worker's own ops,
    in an order the plan fixes) and by (*) no plan with B is faster than the same plan
    with A."""
    memory = ctx.memory_bytes
    static = (chain.params[j] - chain.params[i]) * (
        2 + ctx.optimizer_factor + ctx.weight_versions - 1
    )
    base = static + chain.workspace(i, j)
    limit = math.inf if memory is None else memory - base
    k = ctx.inflight
    tried = (KEEP, SWAP, RECOMPUTE) if ctx.swaps_out else (KEEP, RECOMPUTE)
    found: dict[tuple[float, int, int, int, bool], Option] = {}
    policies: list[str] = []
    visits = [0]

    # kept: kept and checkpointed bytes; fetched: swapped plus recomputed bytes
    def visit(pos: int, kept: int, swap: int, recomputed: int, recompute_ms: float) -> None:
        visits[0] += 1
        if k * kept + swap + recomputed > limit:
            return
        if pos == j:
            recomputes = recompute_ms > 0 or recomputed > 0
            key = (recompute_ms, swap, recomputed, kept, recomputes)
            if key not in found:
                found[key] = Option(
                    tuple(policies),
                    recompute_ms,
                    swap,
                    recomputes,
                    problem.time_ms(recompute_ms, swap),
                    kept,
                    recomputed,
                )
            return
        saved = chain.layer_saved[pos]
        for policy in tried:
            policies.append(policy)
            if policy == KEEP:
                visit(pos + 1, kept + saved, swap, recomputed, recompute_ms)
            elif policy == SWAP:
                visit(pos + 1, kept, swap + saved, recomputed, recompute_ms)
            else:
                starts_run = pos == i or policies[-2] != RECOMPUTE
                checkpoint = chain.layer_input[pos] if starts_run else 0
                visit(
                    pos + 1,
                    kept + checkpoint,
                    swap,
                    recomputed + saved,
                    recompute_ms + chain.layer_fwd[pos],
                )
            policies.pop()

    visit(i, 0, 0, 0, 0.0)
    options = list(found.values())
    unswapped = sum(1 for option in options if not option.swap_bytes)
    steps = visits[0] + unswapped * unswapped + len(options)
    return sorted(
        _undominated(options), key=lambda o: (o.model_ms, o.recompute_ms, o.swap_bytes)
    ), steps


def _undominated(options: list[Option]) -> list[Option]:
    """The options no other dominates (``stage_options``): those that swap nothing against
    each other, the others within their groups timed alike."""
    groups: dict[tuple[float, int, bool], list[Option]] = {}
    unswapped: list[Option] = []
    for option in options:
        if option.swap_bytes:
            groups.setdefault(option.timed_alike, []).append(option)
        else:
            unswapped.append(option)
    # options differ in their cost keys, so no two dominate each other
    kept = [
        a
        for a in unswapped
        if not any(b is not a and a.costs_at_least(b) and b.holds_at_most(a) for b in unswapped)
    ]
    for group in groups.values():
        kept += [a for a in group if not any(b is not a and b.holds_at_most(a) for b in group)]
    return kept


# (choices of the first stages, the rest keep every layer) -> simulated step and whether
# each stage fits; the callback also offers the plan as a candidate when it fits
Evaluate = Callable[[list[Option]], tuple[float, list[bool]]]


class PolicySearch:
    """The search of the module docstring over one split's ``options`` (one list per stage);
    ``evaluate`` simulates a node, ``beaten`` says whether a step cannot beat the best plan
    found so far, ``spent`` whether the work budget ran out."""

    def __init__(
        self,
        options: list[list[Option]],
        relaxed: list[Option],
        evaluate: Evaluate,
        beaten: Callable[[float], bool],
        spent: Callable[[], bool],
    ) -> None:
        self.options, self.relaxed = options, relaxed
        self.evaluate, self.beaten, self.spent = evaluate, beaten, spent
        #: The least step of the nodes the budget left unexplored (inf: none).
        self.unexplored_ms = math.inf

    def run(self) -> bool:
        """Search the split; False when the budget ran out first."""
        step, _ = self.evaluate(self.relaxed)
        return self.beaten(step) or self._visit([], step)

    def _visit(self, chosen: list[Option], step: float) -> bool:
        t = len(chosen)
        if t == len(self.options):
            return True
        pruned: list[Option] = []
        for option in self.options[t]:
            if self.spent():
                self.unexplored_ms = min(self.unexplored_ms, step)
                return False
            if any(option.costs_at_least(other) for other in pruned):
                continue
            below = [*chosen, option]
            if option.policies == self.relaxed[t].policies:
                child, fits = step, True  # the same plan as this node
            else:
                child, fitting = self.evaluate(below + self.relaxed[t + 1 :])
                fits = option.swap_bytes > 0 or fitting[t]
            if not fits:
                continue
            if self.beaten(child):
                pruned = [other for other in pruned if not other.costs_at_least(option)]
                pruned.append(option)
                continue
            if not self._visit(below, child):
                # this node's step bounds its siblings below it not yet searched
                self.unexplored_ms = min(self.unexplored_ms, step)
                return False
        return True
