"""The bounded memory subproblem: its lower bound holds and its choices are valid."""

import math
import random

from pipestudio.planner.cost_model.memopt.bounded import lower_bound_ms, solve_bounded
from pipestudio.planner.cost_model.memopt.exact import RECOMPUTE, SWAP, StageProblem, solve_exact
from pipestudio.planner.cost_model.memopt.greedy import solve_capuchin, solve_greedy


def random_problem(rng: random.Random, num_layers: int) -> StageProblem:
    fwd = tuple(rng.choice([0.0, rng.uniform(0.05, 4)]) for _ in range(num_layers))
    bwd = sum(fwd) * rng.uniform(1, 3) + 0.1
    saved = tuple(rng.randrange(1, 10**6) for _ in range(num_layers))
    inputs = tuple(rng.randrange(1, 2 * 10**5) for _ in range(num_layers))
    inflight = rng.randint(1, 8)
    keep_all = inflight * sum(saved)
    return StageProblem(
        fwd_ms=fwd,
        saved_bytes=saved,
        input_bytes=inputs,
        forward_ms=sum(fwd),
        backward_ms=bwd,
        inflight=inflight,
        swap_buffers=2 if inflight >= 2 else 1,
        need_bytes=int(keep_all * rng.uniform(-0.1, 0.9)),
        swap_mode=rng.choice(["warm", "gpipe", "last"]),
        host_in_bytes_per_ms=rng.choice([None, rng.uniform(1e3, 1e6)]),
        host_out_bytes_per_ms=rng.choice([None, rng.uniform(1e3, 1e6)]),
    )


def check_choice(problem: StageProblem, policies: tuple[str, ...], time_ms: float) -> None:
    recompute_ms = sum(f for f, p in zip(problem.fwd_ms, policies, strict=True) if p == RECOMPUTE)
    swap_bytes = sum(s for s, p in zip(problem.saved_bytes, policies, strict=True) if p == SWAP)
    assert problem.freed_bytes(list(policies)) >= problem.need_bytes
    assert swap_bytes <= problem.swap_limit_bytes
    assert math.isclose(time_ms, problem.time_ms(recompute_ms, swap_bytes), rel_tol=1e-12)


def test_lower_bound_never_exceeds_the_exact_optimum() -> None:
    rng = random.Random(7)
    compared = 0
    for _ in range(600):
        problem = random_problem(rng, rng.randint(1, 9))
        exact = solve_exact(problem, max_states=1 << 20)
        bound = lower_bound_ms(problem)
        if exact is None:
            continue  # infeasible: the bound may be finite (it relaxes checkpoints)
        assert bound <= exact.time_ms * (1 + 1e-9), (problem, bound, exact)
        compared += 1
    assert compared > 300


def test_infeasible_bound_means_no_choice_exists() -> None:
    rng = random.Random(8)
    for _ in range(400):
        problem = random_problem(rng, rng.randint(1, 8))
        if math.isinf(lower_bound_ms(problem)):
            assert solve_exact(problem, max_states=1 << 20) is None


def test_every_solver_returns_a_valid_choice_within_its_bound() -> None:
    rng = random.Random(9)
    solved = 0
    for _ in range(400):
        problem = random_problem(rng, rng.randint(1, 40))
        bound = lower_bound_ms(problem)
        for choice in (solve_bounded(problem), solve_greedy(problem), solve_capuchin(problem)):
            if choice is None:
                continue
            check_choice(problem, choice.policies, choice.time_ms)
            assert choice.time_ms >= bound * (1 - 1e-9)
            solved += 1
        bounded = solve_bounded(problem)
        if bounded is not None:
            assert bounded.lower_bound_ms == bound
    assert solved > 600


def test_bounded_choice_is_close_to_exact_on_small_stages() -> None:
    rng = random.Random(10)
    worst = 0.0
    for _ in range(300):
        problem = random_problem(rng, rng.randint(2, 9))
        exact = solve_exact(problem, max_states=1 << 20)
        bounded = solve_bounded(problem)
        if exact is None or bounded is None:
            continue
        assert bounded.time_ms >= exact.time_ms * (1 - 1e-9)
        worst = max(worst, bounded.time_ms / exact.time_ms - 1)
    assert worst < 0.5, worst
