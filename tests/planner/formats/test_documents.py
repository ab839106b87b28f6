"""The limits on every field of the documents (``formats/documents.py``): each is accepted at its
limit and refused one past it, with a message that names the field and the limit."""

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from pipestudio.planner import (
    Cluster,
    ClusterError,
    DocumentError,
    Plan,
    Profile,
    cluster_template,
    parse_document,
    plan_template,
)
from pipestudio.planner.formats.documents import (
    MAX_BYTES,
    MAX_DEVICE_IDX,
    MAX_DEVICES,
    MAX_EDGES,
    MAX_GBPS,
    MAX_LAYERS,
    MAX_LEVELS,
    MAX_MICROBATCH_SIZE,
    MAX_MICROBATCHES,
    MAX_OP_MS,
    MAX_REPLICAS,
    MAX_STAGES,
    Document,
)
from pipestudio.planner.formats.proposal import LayerMove, Transfer
from tests.planner.helpers import chain_profile

Edit = Callable[[dict[str, Any], Any], None]


def profile_data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(chain_profile(3).to_json())
    return data


def plan_data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(plan_template(chain_profile(3), 1, 4, "gpipe").to_json())
    return data


def cluster_data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cluster_template([2], [10.0]).to_json())
    return data


def _layer(field: str) -> Edit:
    return lambda data, value: data["layers"][0].update({field: value})


def _top(field: str) -> Edit:
    return lambda data, value: data.update({field: value})


def _stage(field: str) -> Edit:
    return lambda data, value: data["stages"][0].update({field: value})


def _metadata(count: int) -> dict[str, int]:
    return {f"key{idx}": idx for idx in range(count)}


def _set_replicas(data: dict[str, Any], replicas: int) -> None:
    data.update(num_microbatches=replicas)
    data["stages"][0].update(replicas=replicas)


def _set_layers(data: dict[str, Any], count: int) -> None:
    data["layers"] = [{**data["layers"][0], "name": f"l{idx}"} for idx in range(count)]


def _set_stages(data: dict[str, Any], count: int) -> None:
    data["stages"] = [{"layers": [f"l{idx}"]} for idx in range(count)]


def _set_levels(data: dict[str, Any], count: int) -> None:
    data["levels"] = [{"size": 1, "bandwidth_gbps": None}] * count
    data["devices"] = data["devices"][:1]


# (document, its data, the edit, the value at the limit, one past it, the field's path)
LIMITS: list[tuple[type[Document], Callable[[], dict[str, Any]], Edit, Any, Any, str]] = [
    (Profile, profile_data, _top("model"), "m" * 200, "m" * 201, "model"),
    (
        Profile,
        profile_data,
        _top("microbatch_size"),
        MAX_MICROBATCH_SIZE,
        MAX_MICROBATCH_SIZE + 1,
        "microbatch_size",
    ),
    (Profile, profile_data, _top("dtype"), "d" * 100, "d" * 101, "dtype"),
    (Profile, profile_data, _top("input_bytes"), MAX_BYTES, MAX_BYTES + 1, "input_bytes"),
    (Profile, profile_data, _layer("name"), "n" * 200, "n" * 201, "layers[0]"),
    (Profile, profile_data, _layer("kind"), "k" * 100, "k" * 101, "layers[0] ('layer0').kind"),
    (
        Profile,
        profile_data,
        _layer("description"),
        "d" * 2000,
        "d" * 2001,
        "layers[0] ('layer0').description",
    ),
    (
        Profile,
        profile_data,
        _layer("param_bytes"),
        MAX_BYTES,
        MAX_BYTES + 1,
        "layers[0] ('layer0').param_bytes",
    ),
    (
        Profile,
        profile_data,
        _layer("fwd_ms"),
        MAX_OP_MS,
        MAX_OP_MS + 1,
        "layers[0] ('layer0').fwd_ms",
    ),
    (Profile, profile_data, _set_layers, MAX_LAYERS, MAX_LAYERS + 1, "layers"),
    (Profile, profile_data, _top("metadata"), _metadata(100), _metadata(101), "metadata"),
    (Profile, profile_data, _top("metadata"), {"k" * 200: 1}, {"k" * 201: 1}, "metadata.kkk"),
    (
        Profile,
        profile_data,
        _top("metadata"),
        {"note": "v" * 2000},
        {"note": "v" * 2001},
        "metadata.note",
    ),
    (
        Profile,
        profile_data,
        _top("metadata"),
        {"seed": MAX_BYTES},
        {"seed": float("inf")},
        "metadata.seed",
    ),
    (Plan, plan_data, _top("model"), "m" * 200, "m" * 201, "model"),
    (
        Plan,
        plan_data,
        _top("num_microbatches"),
        MAX_MICROBATCHES,
        MAX_MICROBATCHES + 1,
        "num_microbatches",
    ),
    (
        Plan,
        plan_data,
        _top("microbatch_size"),
        MAX_MICROBATCH_SIZE,
        MAX_MICROBATCH_SIZE + 1,
        "microbatch_size",
    ),
    (Plan, plan_data, _set_replicas, MAX_REPLICAS, MAX_REPLICAS + 1, "stages[0].replicas"),
    (
        Plan,
        plan_data,
        _stage("devices"),
        [MAX_DEVICE_IDX],
        [MAX_DEVICE_IDX + 1],
        "stages[0].devices[0]",
    ),
    (Plan, plan_data, _stage("layers"), ["n" * 200], ["n" * 201], "stages[0].layers[0]"),
    (Plan, plan_data, _set_stages, MAX_STAGES, MAX_STAGES + 1, "stages"),
    (Plan, plan_data, _top("policies"), {"p" * 200: "keep"}, {"p" * 201: "keep"}, "policies"),
    (Plan, plan_data, _top("provenance"), _metadata(100), _metadata(101), "provenance"),
    (
        Plan,
        plan_data,
        _top("provenance"),
        {"planner": "p" * 2000},
        {"planner": "p" * 2001},
        "provenance.planner",
    ),
    (Cluster, cluster_data, _top("name"), "c" * 200, "c" * 201, "name"),
    (
        Cluster,
        cluster_data,
        lambda d, v: d["devices"][0].update(memory_bytes=v),
        MAX_BYTES,
        MAX_BYTES + 1,
        "devices[0] ('device0').memory_bytes",
    ),
    (
        Cluster,
        cluster_data,
        lambda d, v: d["devices"][0].update(host_to_device_gbps=v),
        MAX_GBPS,
        MAX_GBPS + 1,
        "devices[0] ('device0').host_to_device_gbps",
    ),
    (
        Cluster,
        cluster_data,
        lambda d, v: d["levels"][0].update(bandwidth_gbps=v),
        MAX_GBPS,
        MAX_GBPS + 1,
        "levels[0] ('level0').bandwidth_gbps",
    ),
    (Cluster, cluster_data, _set_levels, MAX_LEVELS, MAX_LEVELS + 1, "levels"),
]


@pytest.mark.parametrize(
    ("model", "data", "edit", "at_limit", "past_limit", "path"),
    LIMITS,
    ids=[f"{case[0].__name__}.{case[5]}" for case in LIMITS],
)
def test_each_limit_is_accepted_and_one_past_it_refused(
    model: type[Document],
    data: Callable[[], dict[str, Any]],
    edit: Edit,
    at_limit: Any,
    past_limit: Any,
    path: str,
) -> None:
    document = data()
    edit(document, at_limit)
    parse_document(model, document)
    document = data()
    edit(document, past_limit)
    with pytest.raises(DocumentError, match=re.escape(path)):
        parse_document(model, document)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "m" * 201,
            "model = 'mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm'... (201 characters): "
            "String should have at most 200 characters",
        ),
        (None, "model = None: Input should be a valid string"),
    ],
)
def test_a_long_name_is_shown_shortened_with_the_limit(value: Any, message: str) -> None:
    with pytest.raises(DocumentError, match=re.escape(message)):
        parse_document(Profile, {**profile_data(), "model": value})


def test_too_large_numbers_name_the_field_and_the_limit() -> None:
    with pytest.raises(
        DocumentError,
        match=re.escape(
            "microbatch_size = 16777217: Input should be less than or equal to 16777216"
        ),
    ):
        parse_document(Profile, {**profile_data(), "microbatch_size": 2**24 + 1})
    document = profile_data()
    document["layers"][1]["saved_bytes"] = 2**53 + 1
    with pytest.raises(
        DocumentError,
        match=re.escape(
            "layers[1] ('layer1').saved_bytes = 9007199254740993: Input should be less than "
            "or equal to 9007199254740992"
        ),
    ):
        parse_document(Profile, document)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_infinite_milliseconds_are_refused(value: float) -> None:
    for field in ("fwd_ms", "bwd_ms", "update_ms"):
        document = profile_data()
        document["layers"][0][field] = value
        with pytest.raises(DocumentError, match=re.escape(f"('layer0').{field}")):
            parse_document(Profile, document)


def test_a_list_past_its_limit_is_not_repeated_in_the_message() -> None:
    document = plan_data()
    _set_stages(document, MAX_STAGES + 1)
    with pytest.raises(DocumentError) as info:
        parse_document(Plan, document)
    assert "stages = <list of 20001 items>: List should have at most 20000 items" in str(info.value)
    assert len(str(info.value)) < 300


def test_thousands_of_bad_fields_are_summed_up() -> None:
    document = profile_data()
    _set_layers(document, 1000)
    for layer in document["layers"]:
        layer["fwd_ms"] = -1.0
    with pytest.raises(DocumentError, match=r"\.\.\. and 980 more problems$"):
        parse_document(Profile, document)


def test_cluster_template_checks_the_limits_before_building_devices() -> None:
    with pytest.raises(ClusterError, match="hold 1000000 devices, more than the limit of 100000"):
        cluster_template([1000, 1000], [10.0, 1.0])
    with pytest.raises(ClusterError, match="between 1 and 9007199254740992 bytes, got"):
        cluster_template([2], [10.0], device_memory_bytes=MAX_BYTES + 1)
    with pytest.raises(ClusterError, match="up to 1e\\+09, got inf"):
        cluster_template([2], [float("inf")])
    with pytest.raises(ClusterError, match="1 to 16 levels, got 17"):
        cluster_template([1] * 17, [None] * 17)
    with pytest.raises(ClusterError, match="at most 200 characters, got 201"):
        cluster_template([2], [10.0], name="c" * 201)
    assert cluster_template([2], [MAX_GBPS], device_memory_bytes=MAX_BYTES).num_devices == 2


def test_proposal_stage_and_device_indices() -> None:
    LayerMove(layer="a", from_stage=MAX_STAGES - 1, to_stage=0)
    with pytest.raises(ValueError, match="less than 20000"):
        LayerMove(layer="a", from_stage=MAX_STAGES, to_stage=0)
    transfer = {
        "from_stage": 0,
        "to_stage": 1,
        "from_device": MAX_DEVICE_IDX,
        "to_device": 0,
        "layers": ["a"],
        "transfer_bytes": MAX_BYTES,
        "transfer_ms": 1.0,
    }
    Transfer.model_validate(transfer)
    with pytest.raises(ValueError, match="less than or equal to 2147483647"):
        Transfer.model_validate({**transfer, "from_device": MAX_DEVICE_IDX + 1})


def test_proposal_text_and_names() -> None:
    from pipestudio.planner.formats.proposal import Proposal
    from tests.planner.replan.test_replan import proposal_json

    data = proposal_json()
    for field, at_limit, past_limit in (
        ("reason", "r" * 2000, "r" * 2001),
        ("algorithm", "a" * 200, "a" * 201),
    ):
        parse_document(Proposal, {**data, field: at_limit})
        with pytest.raises(DocumentError, match=f"{field} = '{past_limit[:3]}"):
            parse_document(Proposal, {**data, field: past_limit})


@pytest.mark.slow
def test_the_largest_edge_and_device_lists() -> None:
    document = profile_data()
    _set_layers(document, 2)
    document["edges"] = [{"src": "l0", "dst": "l1"}] * MAX_EDGES
    parse_document(Profile, document)
    document["edges"].append({"src": "l0", "dst": "l1"})
    with pytest.raises(DocumentError, match="edges = <list of 200001 items>"):
        parse_document(Profile, document)
    cluster = json.loads(cluster_template([MAX_DEVICES], [10.0]).to_json())
    parse_document(Cluster, copy.deepcopy(cluster))
    cluster["levels"][0]["size"] += 1
    cluster["devices"].append({"name": "one more"})
    with pytest.raises(DocumentError, match="devices = <list of 100001 items>"):
        parse_document(Cluster, cluster)
