"""Online replanning: hand-computed moves, migration bytes, hysteresis, the Proposal format."""

import json
import random
from pathlib import Path

import jsonschema
import pytest

from pipestudio.planner import (
    DocumentError,
    Plan,
    PlannerError,
    Profile,
    cluster_template,
    import_pipedream,
    parse_document,
    plan_template,
    resolve_plan,
    simulate,
)
from pipestudio.planner.algorithms.request import plan_cost
from pipestudio.planner.formats.proposal import Proposal
from pipestudio.planner.formats.schemas import json_schema
from pipestudio.planner.replan.candidates import PlacedPartitionCosts, cut_points, plan_request
from pipestudio.planner.replan.online import ReplanError, evaluate_replan, replan
from tests.conftest import PIPEDREAM_DIR
from tests.planner.helpers import chain_profile, even_plan, single_level_cluster

SCHEMA = Path(__file__).resolve().parents[3] / "docs" / "schemas" / "proposal.schema.json"
PARAM_BYTES = 10_000  # chain_profile's parameters per layer
ADAM_STATE = 1 + 1 + 2  # weights, gradients, Adam's two moments, per parameter byte


def scaled(profile: Profile, factors: dict[int, float]) -> Profile:
    """``profile`` with the forward and backward times of some layers multiplied."""
    layers = [
        layer.model_copy(
            update={
                "fwd_ms": layer.fwd_ms * factors.get(idx, 1.0),
                "bwd_ms": layer.bwd_ms * factors.get(idx, 1.0),
            }
        )
        for idx, layer in enumerate(profile.layers)
    ]
    return profile.model_copy(update={"layers": layers})


def hand_case(schedule: str = "gpipe") -> tuple[Plan, Profile]:
    """4 layers of F = 1, B = 2 ms on 2 stages (layers 0-1 | 2-3), 4 micro-batches; then
    layer 0 takes 3x as long. No activations cross stages, so links cost nothing."""
    profile = chain_profile(4, output_bytes=0, input_bytes=0)
    return even_plan(profile, 2, 4, schedule), scaled(profile, {0: 3.0})


def stage_names(plan: Plan) -> list[list[str]]:
    return [stage.layers for stage in plan.stages]


def test_grown_layer_pushes_exactly_the_boundary_layer_over() -> None:
    plan, observed = hand_case("gpipe")
    proposal = replan(plan, observed)
    assert proposal is not None and proposal.worthwhile
    # GPipe, 2 stages of F_s, B_s ms, m micro-batches, F_0 >= F_1 and B_0 >= B_1: stage 0's
    # last backward starts after all m forwards, stage 1's first forward and backward, so
    # the step is m (F_0 + B_0) + F_1 + B_1. Now: stage 0 = layers 0-1 (F 4, B 8), stage 1
    # (F 2, B 4): 4 x 12 + 6 = 54 ms. Moving layer 1 gives F 3, B 6 on both: 4 x 9 + 9 = 45.
    assert [(m.layer, m.from_stage, m.to_stage) for m in proposal.moves] == [("layer1", 0, 1)]
    assert stage_names(proposal.new_plan) == [["layer0"], ["layer1", "layer2", "layer3"]]
    assert proposal.step_time_now_ms == pytest.approx(54.0)
    assert proposal.step_time_after_ms == pytest.approx(45.0)
    assert proposal.gain_ms == pytest.approx(9.0)
    assert proposal.gain_fraction == pytest.approx(9 / 54)
    assert proposal.migration_bytes == ADAM_STATE * PARAM_BYTES == 40_000
    breakdown = proposal.migration_breakdown
    assert (
        breakdown.parameter_bytes,
        breakdown.gradient_bytes,
        breakdown.optimizer_bytes,
        breakdown.weight_version_bytes,
    ) == (10_000, 10_000, 20_000, 0)
    assert proposal.migration_ms == 0.0 and proposal.payback_steps == 0.0  # no cluster
    assert proposal.policy_changes == []


def test_migration_time_is_bytes_over_the_link_between_the_stages() -> None:
    plan, observed = hand_case("gpipe")
    proposal = evaluate_replan(plan, observed, single_level_cluster(2, bandwidth_gbps=100.0))
    # 40,000 bytes at 100 Gbit/s = 12,500,000 bytes/ms
    assert proposal.migration_ms == pytest.approx(40_000 / 12.5e6)
    assert [(t.from_device, t.to_device, t.transfer_bytes) for t in proposal.transfers] == [
        (0, 1, 40_000)
    ]
    assert proposal.payback_steps == pytest.approx(40_000 / 12.5e6 / 9.0)
    assert proposal.worthwhile


def test_a_slow_link_makes_the_same_move_not_pay_back() -> None:
    plan, observed = hand_case("gpipe")
    slow = single_level_cluster(2, bandwidth_gbps=1e-4)  # 12.5 bytes/ms: 3,200 ms to migrate
    refused = evaluate_replan(plan, observed, slow)
    assert refused.step_time_now_ms == pytest.approx(54.0)  # no activations on the link
    assert refused.migration_ms == pytest.approx(3200.0)
    assert refused.payback_steps == pytest.approx(3200.0 / 9.0)
    assert not refused.worthwhile and "pays back only after 355.6 steps" in refused.reason
    assert [m.layer for m in refused.moves] == ["layer1"]  # still shows what it weighed
    assert replan(plan, observed, slow) is None
    accepted = evaluate_replan(plan, observed, slow, payback_steps=400)
    assert accepted.worthwhile and accepted.hysteresis.max_payback_steps == 400


def test_a_tiny_drift_is_not_worth_a_move() -> None:
    profile = chain_profile(100, output_bytes=0, input_bytes=0)
    plan = even_plan(profile, 2, 4, "gpipe")
    observed = scaled(profile, {10: 2.5})  # stage 0: F 51.5, B 103 ms; stage 1: F 50, B 100
    proposal = evaluate_replan(plan, observed)
    # As in the hand case, m (F_0 + B_0) + F_1 + B_1 = 768 ms now; moving layer 49 makes
    # stage 1 the slower one: F_0 + m (F_1 + B_1) + B_0 = 50.5 + 4 x 153 + 101 = 763.5 ms.
    assert [(m.layer, m.from_stage) for m in proposal.moves] == [("layer49", 0)]
    assert proposal.gain_ms == pytest.approx(4.5)
    assert proposal.gain_fraction == pytest.approx(4.5 / 768)
    assert not proposal.worthwhile and "less than the minimum gain of 2.00%" in proposal.reason
    assert replan(plan, observed) is None
    assert replan(plan, observed, min_gain_fraction=0.001) is not None


def test_no_faster_partition_means_no_move() -> None:
    plan, _ = hand_case("1f1b")
    observed = scaled(chain_profile(4, output_bytes=0, input_bytes=0), {3: 1.01})
    proposal = evaluate_replan(plan, observed)
    assert not proposal.worthwhile and proposal.moves == [] and proposal.gain_ms == 0.0
    assert proposal.reason.startswith("no candidate is faster")
    assert stage_names(proposal.new_plan) == stage_names(plan)


def test_after_a_move_noise_does_not_move_it_back() -> None:
    profile = chain_profile(200, output_bytes=0, input_bytes=0)
    plan = even_plan(profile, 2, 4, "gpipe")
    observed = scaled(profile, {3: 30.0})
    proposal = replan(plan, observed)
    assert proposal is not None
    rng = random.Random(3)
    tempted = 0
    for _ in range(10):  # each layer measured within +-10% of the truth
        noisy = scaled(observed, {i: rng.uniform(0.9, 1.1) for i in range(200)})
        assert replan(proposal.new_plan, noisy) is None
        tempted += replan(proposal.new_plan, noisy, min_gain_fraction=0.0) is not None
    assert tempted  # without the threshold, noise alone would move layers


def test_moves_in_both_directions_at_two_boundaries() -> None:
    profile = chain_profile(12, output_bytes=0, input_bytes=0)
    plan = even_plan(profile, 3, 6, "1f1b")  # layers 0-3 | 4-7 | 8-11
    # Layers 5 and 6 triple: stage 1 takes 8 units, the others 4. The only split with a
    # bottleneck of 6 is 0-4 | 5-6 | 7-11: layer 4 goes back, layer 7 forward.
    proposal = replan(plan, scaled(profile, {5: 3.0, 6: 3.0}))
    assert proposal is not None
    assert [(m.layer, m.from_stage, m.to_stage) for m in proposal.moves] == [
        ("layer4", 1, 0),
        ("layer7", 1, 2),
    ]
    assert proposal.migration_bytes == 2 * ADAM_STATE * PARAM_BYTES
    assert sorted((t.from_stage, t.to_stage) for t in proposal.transfers) == [(1, 0), (1, 2)]


def test_transfers_between_different_pairs_run_in_parallel() -> None:
    profile = chain_profile(12, output_bytes=0, input_bytes=0)
    plan = even_plan(profile, 3, 6, "1f1b")
    proposal = evaluate_replan(
        plan, scaled(profile, {5: 3.0, 6: 3.0}), single_level_cluster(3, bandwidth_gbps=1.0)
    )
    one_layer_ms = ADAM_STATE * PARAM_BYTES / 125_000  # 1 Gbit/s = 125,000 bytes/ms
    assert [t.transfer_ms for t in proposal.transfers] == pytest.approx([one_layer_ms] * 2)
    assert proposal.migration_ms == pytest.approx(one_layer_ms)


def test_pipedream_moves_the_source_stages_stashed_weight_versions() -> None:
    plan, observed = hand_case("pipedream")
    proposal = replan(plan, observed)
    assert proposal is not None and [m.layer for m in proposal.moves] == ["layer1"]
    # Stage 0 of 2 keeps 2 micro-batches in flight under PipeDream's 1F1B, so one stashed
    # version besides the live weights: 5 bytes per parameter byte move.
    versions = simulate(observed, plan).stages[0].num_weight_versions
    assert versions == 2
    assert proposal.migration_breakdown.weight_version_bytes == (versions - 1) * PARAM_BYTES
    assert proposal.migration_bytes == (ADAM_STATE + 1) * PARAM_BYTES
    # From the last stage (no warm-up, one version) nothing is stashed.
    profile = chain_profile(4, output_bytes=0, input_bytes=0)
    back = replan(plan, scaled(profile, {3: 3.0}))
    assert back is not None and [(m.layer, m.from_stage) for m in back.moves] == [("layer2", 1)]
    assert back.migration_breakdown.weight_version_bytes == 0
    assert back.migration_bytes == ADAM_STATE * PARAM_BYTES


def test_policy_changes_are_listed_apart_from_moves() -> None:
    profile = chain_profile(4, output_bytes=0, input_bytes=0)
    plan = even_plan(profile, 2, 4, "gpipe", policy="recompute", optimizer="sgd")
    proposal = replan(plan, scaled(profile, {0: 3.0}))
    assert proposal is not None
    assert [m.layer for m in proposal.moves] == ["layer1"]
    assert proposal.migration_bytes == 2 * PARAM_BYTES  # sgd: weights and gradients only
    assert {(c.layer, c.from_policy, c.to_policy) for c in proposal.policy_changes} == {
        (f"layer{i}", "recompute", "keep") for i in range(4)
    }  # unlimited memory: keep all


def pipedream_case(model: str = "resnet50") -> tuple[Plan, Profile, Profile]:
    profile = import_pipedream(PIPEDREAM_DIR / model / "graph.txt", batch_size=128)
    plan = plan_template(profile, 4, 8, "1f1b")
    # Triple the three slowest layers of stage 1.
    names = set(
        sorted(
            plan.stages[1].layers,
            key=lambda name: -(profile.layers[profile.layer_index[name]].fwd_ms),
        )[:3]
    )
    factors = {idx: 3.0 for idx, layer in enumerate(profile.layers) if layer.name in names}
    return plan, profile, scaled(profile, factors)


def test_real_graph_profile_new_plan_runs_and_its_prediction_is_simulate() -> None:
    plan, _, observed = pipedream_case()
    cluster = cluster_template([2, 2], [400.0, 100.0], device_memory_bytes=16 * 2**30)
    proposal = evaluate_replan(plan, observed, cluster, min_gain_fraction=0.0)
    assert proposal.worthwhile and proposal.moves
    new_plan = parse_document(Plan, proposal.new_plan.to_json())  # executable as is
    resolve_plan(new_plan, observed)
    assert cut_points(new_plan, observed) is not None  # cuts of the topological order
    assert proposal.step_time_after_ms == simulate(observed, new_plan, cluster).step_time_ms
    assert proposal.step_time_now_ms == simulate(observed, plan, cluster).step_time_ms
    assert (
        new_plan.schedule,
        new_plan.num_microbatches,
        new_plan.microbatch_size,
        new_plan.optimizer,
    ) == (plan.schedule, plan.num_microbatches, plan.microbatch_size, plan.optimizer)
    assert {c.name for c in proposal.candidates} == {"relieve", "kernighan-lin", "optimal"}


def test_replicated_plans_are_refined_with_their_replicas() -> None:
    profile = chain_profile(12, output_bytes=0, input_bytes=0)
    base = even_plan(profile, 3, 6, "1f1b", replicas=[2, 1, 1])
    plan = Plan.model_validate(
        {
            **base.model_dump(),
            "stages": [
                {**stage.model_dump(), "devices": devices}
                for stage, devices in zip(base.stages, [[3, 2], [1], [0]], strict=True)
            ],
        }
    )
    observed = scaled(profile, {8: 4.0, 9: 4.0})
    proposal = evaluate_replan(plan, observed, single_level_cluster(4), min_gain_fraction=0.0)
    assert proposal.worthwhile and proposal.algorithm in ("relieve", "kernighan-lin")
    assert proposal.new_plan.stages[0].replicas == 2
    assert [s.devices for s in proposal.new_plan.stages] == [[3, 2], [1], [0]]
    assert {c.name: c.note for c in proposal.candidates}["optimal"] == (
        "the plan has replicated stages"
    )
    with pytest.raises(ReplanError, match="'optimal' plans one replica per stage"):
        evaluate_replan(plan, observed, algorithm="optimal")


def test_placed_partition_costs_time_stages_as_the_stage_model() -> None:
    profile = chain_profile(12, output_bytes=400, update_ms=0.5)
    plan = even_plan(profile, 3, 6, "pipedream", replicas=[2, 1, 1])
    cluster = single_level_cluster(4, bandwidth_gbps=0.01)
    request = plan_request(plan, profile, cluster)
    costs = PlacedPartitionCosts(request, plan)
    bounds = cut_points(plan, profile)
    assert bounds == [0, 4, 8, 12]
    expected = plan_cost(request, plan)
    links = [0.0, *expected.link_ms]
    assert costs.values(bounds) == pytest.approx(
        [max(stage, link) for stage, link in zip(expected.stage_ms, links, strict=True)]
    )


def test_refinement_needs_contiguous_stages() -> None:
    layers = [{"name": name, "fwd_ms": 1.0, "bwd_ms": 1.0} for name in "abcd"]
    edges = [
        {"src": "a", "dst": "b"},
        {"src": "a", "dst": "c"},
        {"src": "b", "dst": "d"},
        {"src": "c", "dst": "d"},
    ]
    profile = Profile.model_validate(
        {"model": "diamond", "microbatch_size": 1, "layers": layers, "edges": edges}
    )
    plan = Plan.model_validate(
        {
            "model": "diamond",
            "schedule": "1f1b",
            "num_microbatches": 2,
            "microbatch_size": 1,
            "stages": [{"layers": ["a", "c"]}, {"layers": ["b", "d"]}],
        }
    )
    proposal = evaluate_replan(plan, profile)
    notes = {c.name: c.note for c in proposal.candidates}
    assert "not contiguous" in notes["relieve"]
    with pytest.raises(ReplanError, match="'refine' cannot start from this plan"):
        evaluate_replan(plan, profile, algorithm="refine")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": "other"}, "observed profile is of model 'other' but the plan is for 'uniform'"),
        ({"drop": "layer2"}, "lacks 1 layer ('layer2') that the plan places"),
        ({"add": "extra"}, "has 1 layer ('extra') that no stage of the plan holds"),
    ],
)
def test_mismatched_profiles_are_refused(change: dict[str, str], message: str) -> None:
    plan, observed = hand_case()
    layers = [layer for layer in observed.layers if layer.name != change.get("drop")]
    if "add" in change:
        layers.append(layers[-1].model_copy(update={"name": change["add"]}))
    observed = observed.model_copy(
        update={"layers": layers, "model": change.get("model", observed.model)}
    )
    with pytest.raises(ReplanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        replan(plan, observed)
    assert issubclass(ReplanError, PlannerError)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"payback_steps": 0}, "payback steps must be a positive number, got 0"),
        ({"min_gain_fraction": 1.5}, r"minimum gain must be a fraction in \[0, 1\), got 1.5"),
        ({"algorithm": "magic"}, "replan algorithm 'magic' is unknown"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, object], message: str) -> None:
    plan, observed = hand_case()
    with pytest.raises(ReplanError, match=message):
        evaluate_replan(plan, observed, **settings)  # type: ignore[arg-type]


def proposal_json() -> dict[str, object]:
    plan, observed = hand_case()
    data: dict[str, object] = json.loads(
        evaluate_replan(plan, observed, single_level_cluster(2)).to_json()
    )
    return data


def test_proposal_round_trips_and_matches_its_published_schema() -> None:
    data = proposal_json()
    assert parse_document(Proposal, data).model_dump(mode="json") == data
    schema = json.loads(SCHEMA.read_text())
    assert schema == json_schema("proposal"), "run `make schemas` to refresh it"
    jsonschema.validate(data, schema)
    for field, bad in (("worthwhile", "yes"), ("migration_bytes", -1), ("gain_ms", None)):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**data, field: bad}, schema)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(moves=[]), "moves must list exactly the layers whose stage changes"),
        (lambda d: d.update(migration_bytes=1), "migration_bytes = 1 but its breakdown sums"),
        (lambda d: d.update(gain_ms=1.0), "gain_ms = 1.0 but step_time_now_ms - step_time_after"),
        (
            lambda d: d["new_plan"]["stages"][0].update(replicas=2, devices=[0, 2]),
            "stage 0 runs 1 replicas on None now but 2 on \\[0, 2\\] in new_plan",
        ),
        (lambda d: d["new_plan"].update(schedule="1f1b"), "new_plan is for 'uniform' under '1f1b'"),
    ],
)
def test_inconsistent_proposals_get_clear_errors(edit: object, message: str) -> None:
    data = json.loads(json.dumps(proposal_json()))
    edit(data)  # type: ignore[operator]
    with pytest.raises(DocumentError, match=message):
        parse_document(Proposal, data, source="p.json")


def test_stages_sharing_a_device_are_weighed() -> None:
    profile = chain_profile(8, output_bytes=0, input_bytes=0)
    base = even_plan(profile, 4, 4, "1f1b")
    plan = Plan.model_validate(
        {
            **base.model_dump(),
            "stages": [
                {**stage.model_dump(), "devices": [idx // 2]}
                for idx, stage in enumerate(base.stages)
            ],
        }
    )
    proposal = evaluate_replan(plan, scaled(profile, {0: 3.0}), single_level_cluster(2))
    candidates = {c.name: c for c in proposal.candidates}
    assert "needs 4 devices but the cluster has 2" in candidates["optimal"].note
    # relieve moves layer 1 from stage 0 to stage 1, both on device 0: no transfer time,
    # and no gain either, since the two stages share the device's compute.
    relieve = candidates["relieve"]
    assert (relieve.num_moves, relieve.migration_ms, relieve.gain_ms) == (1, 0.0, 0.0)
    assert not proposal.worthwhile
    assert [s.devices for s in proposal.new_plan.stages] == [[0], [0], [1], [1]]
