"""Workers and clusters page (``pages/machines.py``) against the real backend in-process."""

from datetime import datetime, timedelta, timezone

import pytest

from pipestudio.dashboard import planning
from pipestudio.dashboard.pages import machines
from tests.dashboard.test_planner_page import act, form


def test_workers_show_their_devices_state_and_the_run_they_hold() -> None:
    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=timezone.utc)
    workers = [
        {
            "id": "w1",
            "name": "gpu-box",
            "host": "10.0.0.5",
            "slots": 2,
            "state": "online",
            "last_seen_at": (now - timedelta(seconds=3)).isoformat(),
            "devices": [{"kind": "cuda", "index": 0, "name": "H100", "memory_bytes": 80 * 2**30}],
            "builtin_models": ["gpt"],
            "allowed_models": ["mine:build"],
        },
        {
            "id": "w2",
            "name": "cpu-box",
            "host": "10.0.0.6",
            "slots": 1,
            "state": "offline",
            "last_seen_at": (now - timedelta(minutes=10)).isoformat(),
            "devices": [{"kind": "cpu", "cores": 16}],
            "builtin_models": [],
            "allowed_models": [],
        },
    ]
    runs = [
        {"id": 4, "state": "running", "ranks": [{"worker_id": "w1"}, {"worker_id": "w1"}]},
        {"id": 3, "state": "finished", "ranks": [{"worker_id": "w2"}]},
    ]
    rows = machines.worker_rows(workers, runs, now)
    assert [r["name"] for r in rows] == ["cpu-box", "gpu-box"]
    assert rows[1]["devices"] == "cuda:0 H100 (80.00 GiB)" and rows[1]["running"] == "run 4"
    assert rows[1]["last heard"] == "3 s ago" and rows[1]["models"] == "gpt, mine:build"
    assert (rows[0]["devices"], rows[0]["running"], rows[0]["last heard"]) == (
        "cpu (16 cores)",
        "—",
        "10 min ago",
    )


def test_a_cluster_made_on_the_page_is_listed_and_bad_input_is_named(context) -> None:
    notice, made = machines.create_cluster(context, "two hosts", "4,2", "300,100", "80GiB", "200")
    assert made and "Created cluster" in notice.children
    [row] = machines.cluster_rows(context.client.clusters(), [])
    assert (row["name"], row["devices"], row["levels (size @ Gbit/s)"]) == (
        "two hosts",
        "8",
        "4 @ 300.0 · 2 @ 100.0",
    )
    assert (row["memory per device"], row["host link"]) == ("80.00 GiB", "200 Gbit/s")
    for args, words in (
        (("x", "", "", None, None), "give at least one level"),
        (("x", "4,2", "300", None, None), "one bandwidth per level"),
        (("x", "four", "1", None, None), "is not a comma-separated list"),
        (("x", "4", "1", "lots", None), "lots"),
    ):
        notice, made = machines.create_cluster(context, *args)
        assert not made and words in notice.children, notice.children
    assert len(context.client.clusters()) == 1


def test_the_cluster_a_save_makes_is_named_in_its_notice(context, vgg_id) -> None:
    editor, _, _ = act(context, "planner-profile", form(vgg_id))
    saved, notice = planning.save_plan(context, editor, [5, 21, 31], None, approve=False)
    cluster_id = context.client.plan(saved["plan_id"])["cluster_id"]
    assert f"judged on cluster {cluster_id}, made for its memory per device" in notice
    [row] = machines.cluster_rows(context.client.clusters(), context.client.plans())
    assert row["plans"] == f"plan {saved['plan_id']}"


def test_a_cluster_is_edited_on_the_page_until_a_plan_uses_it(context, vgg_id) -> None:
    notice, made = machines.create_cluster(
        context, "two hosts", "4,2", "300,free", "1536MiB", "200"
    )
    assert made, notice.children
    [stored] = context.client.clusters()
    # the form shows the stored cluster exactly, and saving it unchanged changes nothing
    assert machines.form_values(stored) == ("two hosts", "4,2", "300,free", "1536MiB", "200")
    notice, saved = machines.save_cluster(
        context, stored["id"], "two hosts", "4,2", "300,free", "1536MiB", "200"
    )
    assert saved and context.client.cluster(stored["id"])["document"] == stored["document"]
    notice, saved = machines.save_cluster(context, stored["id"], "wide", "8", "50", "", "")
    assert saved and f"Saved cluster {stored['id']} (8 devices)" in notice.children
    assert machines.form_values(context.client.cluster(stored["id"])) == ("wide", "8", "50", "", "")
    notice, saved = machines.save_cluster(context, None, "x", "2", "1", "", "")
    assert not saved and "Pick the cluster" in notice.children
    notice, saved = machines.save_cluster(context, stored["id"], "x", "2,2", "1", "", "")
    assert not saved and "one bandwidth per level" in notice.children
    # a plan predicted on it holds it: the page names the plan and keeps the cluster
    editor, _, _ = act(context, "planner-profile", form(vgg_id))
    planned, _ = planning.save_plan(context, editor, [5, 21, 31], None, approve=False)
    cluster_id = context.client.plan(planned["plan_id"])["cluster_id"]
    notice, saved = machines.save_cluster(context, cluster_id, "x", "2", "1", "", "")
    assert not saved and f"plan(s) {planned['plan_id']}" in notice.children
    notice, deleted = machines.delete_cluster(context, cluster_id)
    assert not deleted and f"plan(s) {planned['plan_id']}" in notice.children
    notice, deleted = machines.delete_cluster(context, stored["id"])
    assert deleted and stored["id"] not in [c["id"] for c in context.client.clusters()]


def test_clusters_the_form_cannot_describe_are_said_so() -> None:
    cluster = {
        "id": 7,
        "name": "mixed",
        "document": {
            "levels": [{"name": "l0", "size": 2, "bandwidth_gbps": 1.0}],
            "devices": [{"name": "a", "memory_bytes": 2**30}, {"name": "b", "memory_bytes": 2**31}],
        },
    }
    with pytest.raises(ValueError, match=r"cluster 7's devices differ.*PUT /api/clusters"):
        machines.form_values(cluster)
