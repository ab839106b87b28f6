"""Profiles page callbacks (``pages/profiles.py``) against the real backend in-process."""

import base64
import json

from pipestudio.dashboard.pages import profiles
from tests.conftest import PIPEDREAM_DIR
from tests.dashboard.conftest import big_profile, upload_contents


def encoded(data: bytes) -> str:
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode()


def test_upload_pipedream_lists_and_charts_it(context, vgg_id):
    _table, options, selected = profiles.list_profiles(context, None)
    assert selected == vgg_id
    assert options == [{"label": f"{vgg_id}: vgg16 (41 layers)", "value": vgg_id}]
    times, _sizes = profiles.layer_figures(context, vgg_id)
    assert len(times["data"][0]["x"]) == 41
    assert "128 samples" in times["layout"]["title"]["text"]


def test_upload_native_json(context):
    document = big_profile(12).model_dump(mode="json")
    notice, profile_id = profiles.upload_profile(
        context, encoded(json.dumps(document).encode()), "big.json", "mine", None, None
    )
    assert profile_id is not None
    assert "profile" in notice.children and "12 layers" in notice.children
    assert context.client.profile(profile_id)["name"] == "mine"


def test_bad_uploads_say_what_is_wrong(context):
    cases = {
        "photo.png": (b"\x89PNG\r\n\x1a\n\x00\xff", "is not a text file"),
        "broken.json": (b'{"model": "x",', "starts like JSON, which does not parse"),
        "list.json": (b"[1, 2]", "holds a JSON list, not a profile object"),
        "empty.json": (
            b'{"model": "x", "microbatch_size": 1, "layers": []}',
            "profile.layers: List should have at least 1 item",
        ),
        "notes.txt": (b"hello world", "a node line must read"),
    }
    for filename, (data, expected) in cases.items():
        notice, profile_id = profiles.upload_profile(
            context, encoded(data), filename, None, 1, None
        )
        assert profile_id is None
        assert "ps-error" in notice.className
        assert notice.children.startswith(f"Could not read {filename}")
        assert expected in notice.children, notice.children


def test_empty_list_and_no_selection(context):
    table, options, selected = profiles.list_profiles(context, None)
    assert (options, selected) == ([], None)
    assert "No profiles yet" in table.children
    times, _ = profiles.layer_figures(context, None)
    assert times["data"] == []


def test_delete_is_refused_while_a_plan_uses_the_profile(context, vgg_id):
    graph = upload_contents(PIPEDREAM_DIR / "alexnet" / "graph.txt")
    _, other = profiles.upload_profile(context, graph, "graph.txt", None, 1, "alexnet")
    context.client.create_plan(
        {
            "profile_id": vgg_id,
            "manual": {"boundaries": [20], "num_microbatches": 2, "schedule": "gpipe"},
        }
    )
    refused = profiles.delete_profile(context, vgg_id)
    assert "ps-error" in refused.className and "used by plan" in refused.children
    assert "Deleted profile" in profiles.delete_profile(context, other).children


def test_a_pipedream_graph_needs_its_batch_size_and_model(context):
    """graph.txt says neither the batch size it was profiled at nor its model: the page
    asks for both instead of taking one sample per micro-batch."""
    graph = upload_contents(PIPEDREAM_DIR / "alexnet" / "graph.txt")
    notice, made = profiles.upload_profile(context, graph, "graph.txt", None, None, "alexnet")
    assert made is None and 'fill in "PipeDream batch size"' in notice.children
    notice, made = profiles.upload_profile(context, graph, "graph.txt", None, 64, None)
    assert made is None and 'fill in "PipeDream model name"' in notice.children
    notice, made = profiles.upload_profile(context, graph, "alexnet.txt", None, 64, None)
    assert made is not None
    assert context.client.profile(made)["microbatch_size"] == 64
    assert context.client.profile(made)["model"] == "alexnet"
