"""PipeDream's graph.txt files import whole: every node, edge, time and size."""

import re
from pathlib import Path

import pytest

from pipestudio.planner import ImportFormatError, import_pipedream, parse_pipedream
from tests.conftest import PIPEDREAM_DIR, PIPEDREAM_MODELS

# Batch sizes the files were profiled at (SOURCE.md).
BATCH = {
    "alexnet": 256,
    "densenet121": 64,
    "gnmt": 32,
    "gnmt_large": 128,
    "inception_v3": 128,
    "nasnetalarge": 16,
    "nasnetamobile": 128,
    "resnet101": 64,
    "resnet18": 256,
    "resnet50": 128,
    "resnext101": 64,
    "resnext50": 128,
    "squeezenet1_0": 256,
    "vgg16": 128,
}


def file_totals(path: Path) -> dict[str, float]:
    """Sums straight from the text, independent of the importer."""
    totals = {"nodes": 0, "edges": 0, "fwd": 0.0, "bwd": 0.0, "params": 0.0, "acts": 0.0}
    for line in path.read_text().splitlines():
        if line.startswith("\t"):
            totals["edges"] += 1
            continue
        if not line.strip():
            continue
        totals["nodes"] += 1
        is_input = line.split(" -- ")[1].startswith("Input")
        fields = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[^,\s]+)", line.split(" -- ")[2]))
        acts = fields["activation_size"].strip("[]").split(";")
        totals["acts"] += sum(float(a) for a in acts)
        totals["params"] += float(fields["parameter_size"])
        if not is_input:
            totals["fwd"] += float(fields["forward_compute_time"])
            totals["bwd"] += float(fields["backward_compute_time"])
    return totals


def test_all_fourteen_profiles_are_here() -> None:
    assert sorted(BATCH) == PIPEDREAM_MODELS


@pytest.mark.parametrize("model", PIPEDREAM_MODELS)
def test_import_keeps_every_node_edge_time_and_size(model: str) -> None:
    path = PIPEDREAM_DIR / model / "graph.txt"
    profile = import_pipedream(path, batch_size=BATCH[model])
    totals = file_totals(path)
    assert profile.model == model
    assert profile.microbatch_size == BATCH[model]
    assert profile.num_layers == totals["nodes"]
    assert profile.edges is not None and len(profile.edges) == totals["edges"]
    assert sum(layer.fwd_ms for layer in profile.layers) == pytest.approx(totals["fwd"], 1e-12)
    assert sum(layer.bwd_ms for layer in profile.layers) == pytest.approx(totals["bwd"], 1e-12)
    assert sum(layer.param_bytes for layer in profile.layers) == pytest.approx(
        totals["params"], abs=profile.num_layers
    )
    assert sum(layer.output_bytes for layer in profile.layers) == pytest.approx(
        totals["acts"], abs=profile.num_layers
    )
    # Topological order: every edge points forward in the layer list.
    index = profile.layer_index
    assert all(index[e.src] < index[e.dst] for e in profile.edges)


def test_source_md_sums_match() -> None:
    """SOURCE.md's table: VGG-16 sums to 233.9 ms forward, 438.6 ms backward, 553.4 MB."""
    profile = import_pipedream(PIPEDREAM_DIR / "vgg16" / "graph.txt", batch_size=128)
    assert round(sum(layer.fwd_ms for layer in profile.layers), 1) == 233.9
    assert round(sum(layer.bwd_ms for layer in profile.layers), 1) == 438.6
    assert round(sum(layer.param_bytes for layer in profile.layers) / 1e6, 1) == 553.4


def test_input_nodes_cost_nothing_and_keep_their_load_time() -> None:
    profile = import_pipedream(PIPEDREAM_DIR / "vgg16" / "graph.txt", batch_size=128)
    first = profile.layers[0]
    assert (first.kind, first.fwd_ms, first.bwd_ms) == ("Input", 0.0, 0.0)
    assert first.output_bytes == 4 * 3 * 224 * 224 * 128
    assert profile.metadata["input_load_ms"] > 0


def test_multi_output_nodes_sum_their_activations() -> None:
    profile = import_pipedream(PIPEDREAM_DIR / "gnmt" / "graph.txt", batch_size=32)
    lstm = next(layer for layer in profile.layers if layer.kind == "LSTM")
    assert lstm.output_bytes == 6291456 + 131072 + 131072


def test_rescaling_to_another_batch() -> None:
    profile = import_pipedream(PIPEDREAM_DIR / "resnet18" / "graph.txt", batch_size=256)
    half = profile.rescaled(128)
    for big, small in zip(profile.layers, half.layers, strict=True):
        assert small.fwd_ms == pytest.approx(big.fwd_ms / 2)
        assert small.bwd_ms == pytest.approx(big.bwd_ms / 2)
        assert abs(small.output_bytes - big.output_bytes / 2) <= 0.5
        assert small.param_bytes == big.param_bytes


GOOD = (
    "node1 -- Input -- forward_compute_time=5.0, backward_compute_time=0.0, "
    "activation_size=8.0, parameter_size=0.0\n"
    "node3 -- ReLU() -- forward_compute_time=1.0, backward_compute_time=1.0, "
    "activation_size=8.0, parameter_size=0.0\n"
    "node2 -- Linear(2, 2) -- forward_compute_time=1.0, backward_compute_time=2.0, "
    "activation_size=8.0, parameter_size=24.0\n"
    "\tnode1 -- node2\n\tnode2 -- node3\n"
)


def test_nodes_are_sorted_topologically() -> None:
    profile = parse_pipedream(GOOD, model="tiny")
    assert [layer.name for layer in profile.layers] == ["node1", "node2", "node3"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "no node lines"),
        (GOOD + "\tnode3 -- node1\n", "cycle: node"),
        (GOOD + "\tnode3 -- node9\n", "unknown node 'node9'"),
        (
            GOOD.replace("activation_size=8.0, parameter_size=24.0", "activation_size=8.0"),
            "lacks parameter_size",
        ),
        (
            GOOD.replace(
                "forward_compute_time=1.0, backward_compute_time=2.0",
                "forward_compute_time=-1.0, backward_compute_time=2.0",
            ),
            "negative forward_compute_time=-1.0",
        ),
        (GOOD.replace("parameter_size=24.0", "parameter_size=abc"), "not a number"),
        ("just some text\n", "a node line must read"),
        (
            GOOD.replace(
                "forward_compute_time=1.0, backward_compute_time=2.0",
                "forward_compute_time=inf, backward_compute_time=2.0",
            ),
            "node node2 has forward_compute_time=inf; expected a finite number",
        ),
        (
            GOOD.replace(
                "forward_compute_time=1.0, backward_compute_time=2.0",
                "forward_compute_time=2e9, backward_compute_time=2.0",
            ),
            "layers[1] ('node2').fwd_ms = 2000000000.0: Input should be less than or equal to "
            "1000000000",
        ),
        (
            GOOD.replace("node3", "n" * 201),
            "name = 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn'... (201 characters): String should "
            "have at most 200 characters",
        ),
    ],
)
def test_bad_files_get_clear_errors(text: str, message: str) -> None:
    with pytest.raises(ImportFormatError, match=re.escape(message)):
        parse_pipedream(text, model="tiny")


def test_a_batch_size_past_the_profile_limit_is_refused_by_name() -> None:
    with pytest.raises(
        ImportFormatError,
        match=re.escape(
            "--batch-size must be <= 16777216 (a profile's largest microbatch_size), got 16777217"
        ),
    ):
        parse_pipedream(GOOD, model="tiny", batch_size=2**24 + 1)
    assert parse_pipedream(GOOD, model="tiny", batch_size=2**24).microbatch_size == 2**24
