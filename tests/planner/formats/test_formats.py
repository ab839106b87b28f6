"""Validation of the Profile, Cluster and Plan documents: clear errors naming the value."""

import json
import re

import pytest

from pipestudio.planner import (
    Cluster,
    ClusterError,
    DocumentError,
    Plan,
    PlanError,
    Profile,
    cluster_template,
    parse_document,
    plan_template,
    resolve_plan,
)
from pipestudio.planner.units import parse_size
from tests.planner.helpers import chain_profile


def profile_dict(**changes: object) -> dict[str, object]:
    data = json.loads(chain_profile(3).to_json())
    data.update(changes)
    return data


def test_round_trip_through_json() -> None:
    profile = chain_profile(3)
    assert parse_document(Profile, profile.to_json()) == profile


@pytest.mark.parametrize(
    "mutate,message",
    [
        (
            lambda d: d["layers"][1].update(fwd_ms=-1.0),
            "layers[1] ('layer1').fwd_ms = -1.0: Input should be greater than or equal to 0",
        ),
        (lambda d: d["layers"][2].update(saved_bytes=-5), "layers[2] ('layer2').saved_bytes = -5"),
        (lambda d: d["layers"][2].update(name="layer0"), "duplicate layer name 'layer0'"),
        (
            lambda d: d.update(edges=[{"src": "layer0", "dst": "nope"}]),
            "names unknown layer 'nope'",
        ),
        (
            lambda d: d.update(
                edges=[{"src": "layer0", "dst": "layer1"}, {"src": "layer1", "dst": "layer0"}]
            ),
            "cycle: layer0 -> layer1 -> layer0",
        ),
        (
            lambda d: d.update(edges=[{"src": "layer2", "dst": "layer1"}]),
            "not in topological order: 'layer1' (layer 1) is listed before its input 'layer2'",
        ),
        (lambda d: d.update(microbatch_size=0), "microbatch_size = 0"),
        (lambda d: d.update(version=2), "version = 2"),
        (lambda d: d.update(colour="red"), "colour: Extra inputs are not permitted"),
        (lambda d: d["layers"][0].pop("fwd_ms"), "layers[0] ('layer0').fwd_ms: Field required"),
    ],
)
def test_profile_errors_name_the_bad_value(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = profile_dict()
    mutate(data)
    with pytest.raises(DocumentError, match=re.escape(message)):
        parse_document(Profile, data, source="p.json")


def test_nan_and_infinite_times_are_refused() -> None:
    data = profile_dict()
    data["layers"][0]["bwd_ms"] = float("inf")  # type: ignore[index]
    with pytest.raises(DocumentError, match="bwd_ms"):
        parse_document(Profile, data)


def plan_dict(profile: Profile, **changes: object) -> dict[str, object]:
    data = json.loads(plan_template(profile, 2, 4, "1f1b").to_json())
    data.update(changes)
    return data


@pytest.mark.parametrize(
    "stages,message",
    [
        (
            [["layer0", "layer1"], ["layer1", "layer2"]],
            "overlapping stages: layer 'layer1' is in stage 0 and in stage 1",
        ),
        (
            [["layer0", "ghost"], ["layer1", "layer2"]],
            "stage 0 names layer 'ghost', which the profile of 'uniform' does not have",
        ),
        ([["layer0"], ["layer1"]], "1 layers are in no stage: 'layer2'"),
        (
            [["layer1"], ["layer0", "layer2"]],
            "layer 'layer1' in stage 0 takes input from 'layer0' in the later stage 1",
        ),
    ],
)
def test_plan_against_profile_errors(stages: list[list[str]], message: str) -> None:
    profile = chain_profile(3)
    plan = parse_document(Plan, plan_dict(profile, stages=[{"layers": s} for s in stages]))
    with pytest.raises(PlanError, match=re.escape(message)):
        resolve_plan(plan, profile)


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            {"schedule": "zigzag"},
            "schedule = 'zigzag': Input should be 'gpipe', '1f1b', 'pipedream', "
            "'interleaved-1f1b' or",
        ),
        ({"vertical_sync": True}, "vertical_sync applies to the pipedream schedule only"),
        (
            {
                "num_microbatches": 3,
                "stages": [{"layers": ["layer0"], "replicas": 2}, {"layers": ["layer1", "layer2"]}],
            },
            "stage 0 has 2 replicas, which do not divide num_microbatches=3",
        ),
        ({"policies": {"layer0": "forget"}}, "policies.layer0 = 'forget'"),
        ({"stages": []}, "stages = []: List should have at least 1 item"),
        ({"virtual_stages": 2}, "virtual_stages=2 applies to interleaved-1f1b only, not '1f1b'"),
        ({"virtual_stages": 0}, "virtual_stages = 0: Input should be greater than or equal to 1"),
        (
            {
                "schedule": "interleaved-1f1b",
                "virtual_stages": 2,
                "stages": [{"layers": ["layer0"]}, {"layers": ["layer1"]}, {"layers": ["layer2"]}],
            },
            "interleaved-1f1b with virtual_stages=2 needs a multiple of 2 stages "
            "(devices x chunks), got 3",
        ),
        (
            {
                "schedule": "interleaved-1f1b",
                "virtual_stages": 2,
                "num_microbatches": 6,
                "stages": [{"layers": [name]} for name in ("a", "b", "c", "d", "e", "f", "g", "h")],
            },
            "interleaved-1f1b on 4 devices needs num_microbatches a multiple of 4 (micro-batches "
            "go round in groups of the devices), got 6",
        ),
        (
            {
                "schedule": "interleaved-1f1b",
                "virtual_stages": 1,
                "num_microbatches": 3,
                "stages": [{"layers": ["layer0"]}, {"layers": ["layer1", "layer2"]}],
            },
            "interleaved-1f1b on 2 devices needs num_microbatches a multiple of 2",
        ),
        (
            {
                "schedule": "zero-bubble",
                "stages": [{"layers": ["layer0"], "replicas": 2}, {"layers": ["layer1", "layer2"]}],
            },
            "zero-bubble runs one replica per stage; stage 0 has 2",
        ),
        (
            {
                "schedule": "interleaved-1f1b",
                "virtual_stages": 2,
                "stages": [
                    {"layers": ["layer0"], "devices": [0]},
                    {"layers": ["layer1"], "devices": [1]},
                    {"layers": ["layer2"], "devices": [0]},
                    {"layers": ["layer3"], "devices": [0]},
                ],
            },
            "stage 3 is a chunk of device rank 1, as stage 1 is, but names devices [0], not [1]",
        ),
    ],
)
def test_plan_document_errors(changes: dict[str, object], message: str) -> None:
    with pytest.raises(DocumentError, match=re.escape(message)):
        parse_document(Plan, plan_dict(chain_profile(3), **changes))


def test_an_interleaved_plan_runs_its_chunks_on_their_devices() -> None:
    plan = plan_template(chain_profile(8), 4, 8, "interleaved-1f1b", virtual_stages=2)
    assert plan.num_stages == 8 and plan.num_workers == 4
    assert plan.worker_devices() == [[0], [1], [2], [3], [0], [1], [2], [3]]
    assert [plan.rank_of_stage(chunk) for chunk in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_policy_for_unknown_layer() -> None:
    profile = chain_profile(3)
    plan = parse_document(Plan, plan_dict(profile, policies={"ghost": "swap"}))
    with pytest.raises(PlanError, match="policy is given for layer 'ghost'"):
        resolve_plan(plan, profile)


def test_plan_for_another_model() -> None:
    plan = plan_template(chain_profile(3, model="a"), 1, 1, "gpipe")
    with pytest.raises(PlanError, match="for model 'a' but the profile is of 'b'"):
        resolve_plan(plan, chain_profile(3, model="b"))


def test_plan_template_splits_evenly() -> None:
    plan = plan_template(chain_profile(10), 4, 8, "gpipe")
    assert [len(stage.layers) for stage in plan.stages] == [3, 3, 2, 2]
    assert set(plan.policies.values()) == {"keep"}
    with pytest.raises(PlanError, match="--stages 11 is not between 1 and"):
        plan_template(chain_profile(10), 11, 8, "gpipe")
    with pytest.raises(DocumentError, match="num_microbatches = 0"):
        plan_template(chain_profile(10), 2, 0, "gpipe")


def test_cluster_template_and_errors() -> None:
    cluster = cluster_template(
        [8, 2], [400.0, 100.0], device_memory_bytes=parse_size("16GiB"), host_bandwidth_gbps=200.0
    )
    assert cluster.num_devices == 16
    assert cluster.devices[5].memory_bytes == 16 * 2**30
    assert cluster.bandwidth_gbps(0, 7) == 400.0
    assert cluster.bandwidth_gbps(7, 8) == 100.0
    with pytest.raises(ClusterError, match=r"2 level sizes .* but 1 bandwidths"):
        cluster_template([8, 2], [400.0])
    with pytest.raises(ClusterError, match="bandwidth must be a positive number"):
        cluster_template([4], [0.0])
    with pytest.raises(DocumentError, match="the levels \\(2 x 2\\) hold 4 devices but 3"):
        data = json.loads(cluster_template([2, 2], [1.0, 1.0]).to_json())
        data["devices"].pop()
        parse_document(Cluster, data)


def test_plan_on_too_small_cluster() -> None:
    from pipestudio.planner import simulate

    profile = chain_profile(4)
    with pytest.raises(ClusterError, match="device 2 does not exist: the cluster has 2"):
        simulate(profile, plan_template(profile, 4, 4, "gpipe"), cluster_template([2], [10.0]))
