"""``optimal_bound``'s step bound against the simulator, and ``optimal_refine``'s plan count."""

import itertools
import math
import random

from pipestudio.planner import simulate
from pipestudio.planner.algorithms.optimal.bound import Prefix, StepBound
from pipestudio.planner.algorithms.optimal.program import DeviceLayout
from pipestudio.planner.algorithms.optimal.refine import (
    Candidate,
    PlannedStage,
    StageChoices,
    build,
    count_plans,
)
from pipestudio.planner.cost_model.chain import ChainCosts, StageEvaluator
from tests.planner.algorithms.optimal.test_optimal import random_request
from tests.planner.bruteforce import compositions


def test_simulated_step_is_at_least_the_bound() -> None:
    """Random replications and partitions of random requests (every schedule, capped or
    not, slow links and host links): the simulated step is never below the bound, and the
    bound is the step itself in many (a straight 1F1B or pipedream pipeline whose
    slowest stage sets the pace), so it is not trivially low."""
    rng = random.Random(61)
    total = tight = 0
    for _ in range(500):
        request = random_request(rng, capped=rng.random() < 0.5, single_replica=False)
        chain = ChainCosts.of(request)
        layout = DeviceLayout.of(request, request.num_stages or 1)
        evaluator = StageEvaluator(chain, layout.contexts)
        choices, bound = StageChoices(evaluator), StepBound(request, chain, layout)
        replicas = rng.choice(list(compositions(layout.num_devices, list(layout.replica_counts))))
        if len(replicas) > chain.num_layers:
            continue
        cuts = sorted(rng.sample(range(1, chain.num_layers), len(replicas) - 1))
        prefix, first, stages, chosen = Prefix(), 0, [], []
        for (start, end), count in zip(
            itertools.pairwise([0, *cuts, chain.num_layers]), replicas, strict=True
        ):
            c = layout.context(first, count)
            choice = choices.get(start, end, c)
            if choice is None:
                break
            prefix = bound.extend(
                prefix,
                start,
                end,
                first,
                evaluator.contexts[c],
                choices.recompute_ms(start, choice),
            )
            stages.append(PlannedStage(start, end, first, count))
            chosen.append(choice)
            first += count
        else:
            plan = build(request, Candidate(stages, chosen))
            step = simulate(request.scaled, plan, request.cluster, with_timeline=False)
            total += 1
            assert step.step_time_ms >= prefix.bound_ms * (1 - 1e-9), (request, plan)
            tight += math.isclose(step.step_time_ms, prefix.bound_ms, rel_tol=1e-9)
    assert total >= 250 and tight >= 150, (total, tight)


def test_count_plans_counts_every_replication_and_partition() -> None:
    rng = random.Random(62)
    for _ in range(40):
        request = random_request(rng, capped=False)
        layout = DeviceLayout.of(request, request.num_stages or 1)
        num_layers = request.profile.num_layers
        expected = sum(
            math.comb(num_layers - 1, len(replicas) - 1)
            for replicas in compositions(layout.num_devices, list(layout.replica_counts))
            if len(replicas) <= num_layers
        )
        assert count_plans(layout, num_layers) == expected
