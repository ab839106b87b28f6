"""Properties of every planner on random small profiles and requests (hypothesis).

Chains and graphs of 1-8 layers; one-level clusters with and without device memory, host
bandwidth and link bandwidth; every schedule; 1-4 stages. Each planner either raises a
PlannerError or returns a plan that places every layer once; memory-aware planners never
return one that does not fit; an infeasible answer names a memory that really fits, with one
at most its precision below it that does not.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipestudio.planner import cluster_template, resolve_plan
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.min_memory import attempt, with_device_memory
from pipestudio.planner.algorithms.request import PlanRequest, call_planner
from pipestudio.planner.errors import InfeasibleError, PlannerError
from pipestudio.planner.formats.plan import PLANNED_SCHEDULES
from tests.planner.strategies import profiles

MEMORY_AWARE = ("optimal", "vpipe", "dawnpiper")
#: Planners whose InfeasibleError is checked (pipedream raises it from its own memory check).
RAISE_INFEASIBLE = (*MEMORY_AWARE, "pipedream")
PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def requests(draw: st.DrawFn) -> PlanRequest:
    profile = draw(
        profiles(
            max_layers=8,
            times=st.floats(0.01, 10),
            workspaces=st.sampled_from([0, 0, 10**4, 10**5]),
            microbatch_sizes=st.sampled_from([1, 2]),
        )
    )
    num_layers = len(profile.layers)
    num_stages = draw(st.integers(1, min(4, num_layers)))
    cluster = cluster_template(
        [num_stages],
        [draw(st.one_of(st.none(), st.floats(1, 400)))],
        host_bandwidth_gbps=draw(st.one_of(st.none(), st.floats(0.5, 100))),
    )
    request = PlanRequest(
        profile=profile,
        num_microbatches=draw(st.sampled_from([1, 2, 3, 4, 6, 8])),
        schedule=draw(st.sampled_from(PLANNED_SCHEDULES)),
        num_stages=num_stages,
        microbatch_size=draw(st.one_of(st.none(), st.integers(1, 4))),
        optimizer=draw(st.sampled_from(["sgd", "momentum", "adam"])),
        cluster=cluster,
        single_replica=draw(st.booleans()),
    )
    # Memory around what keeping every layer of an equal split takes, where planners differ.
    fraction = draw(st.one_of(st.none(), st.floats(0.2, 1.3)))
    if fraction is None:
        return request
    keep_all = attempt(PLANNERS["uniform"], request).peak_bytes
    capped = with_device_memory(request, max(1, int((keep_all or 1) * fraction)))
    assert capped is not None
    return capped


@PROPERTY_SETTINGS
@given(requests())
def test_every_plan_is_valid_and_fits_means_fits(request: PlanRequest) -> None:
    scaled = request.scaled
    for name, planner in PLANNERS.items():
        answer = attempt(planner, request)
        if answer.output is None:
            continue  # a PlannerError: its message is the answer
        plan, result = answer.output.plan, answer.result
        assert result is not None
        layout = resolve_plan(plan, scaled)
        placed = sorted(idx for stage in layout.stage_layers for idx in stage)
        assert placed == list(range(scaled.num_layers)), name
        assert all(plan.num_microbatches % stage.replicas == 0 for stage in plan.stages), name
        assert plan.microbatch_size == scaled.microbatch_size, name
        by_stage = all(
            stage.device_memory_bytes is None or stage.peak_bytes <= stage.device_memory_bytes
            for stage in result.stages
        )
        assert result.fits == by_stage, name
        if name in MEMORY_AWARE:
            assert result.fits, f"{name} returned a plan that does not fit"


@PROPERTY_SETTINGS
@given(requests())
def test_infeasible_names_a_memory_that_fits(request: PlanRequest) -> None:
    for name in RAISE_INFEASIBLE:
        try:
            call_planner(PLANNERS[name], request)
        except InfeasibleError as exc:
            check_min_memory(name, request, exc)
        except PlannerError:
            pass  # another mistake of the request, named in its message


def check_min_memory(name: str, request: PlanRequest, exc: InfeasibleError) -> None:
    planner = PLANNERS[name]
    memory, precision = exc.min_memory_bytes, exc.precision_bytes
    if memory is None:
        unlimited = with_device_memory(request, None)
        assert unlimited is not None and attempt(planner, unlimited).output is None, name
        assert "no device memory is enough" in str(exc), name
        return
    assert precision is not None and f"({memory} bytes)" in str(exc), name
    at_memory = with_device_memory(request, memory)
    assert at_memory is not None and attempt(planner, at_memory).fits, name
    below = with_device_memory(request, memory - precision)
    assert below is not None and not attempt(planner, below).fits, name
