"""A document is committed before the answer that created it is sent (backend/
deps.py): a client that reads right after a 201 finds it, over a real HTTP server (the
test client would wait for the whole request, commit included, and hide the race)."""

import time
from typing import Any

import httpx
from sqlalchemy import event
from sqlalchemy.orm import Session

from pipestudio.backend.app import create_app
from pipestudio.backend.settings import Settings
from pipestudio.planner.formats.cluster import cluster_template
from tests.backend.conftest import AUTH, small_profile
from tests.backend.live import live_backend

CLUSTER = {"cluster": cluster_template([2], [10.0]).model_dump(mode="json")}


def create_then_read(client: httpx.Client, resource: str, body: dict[str, Any]) -> int:
    """Create, then read at once; the read's status."""
    created = client.post(f"/api/{resource}", json=body, headers=AUTH)
    assert created.status_code == 201, created.text
    return client.get(f"/api/{resource}/{created.json()['id']}").status_code


def test_many_creates_are_readable_at_once(settings: Settings) -> None:
    with (
        live_backend(settings) as url,
        httpx.Client(base_url=url, timeout=30, headers=AUTH) as client,
    ):
        statuses = [create_then_read(client, "clusters", CLUSTER) for _ in range(150)]
        statuses += [
            create_then_read(client, "profiles", {"profile": small_profile()}) for _ in range(50)
        ]
    assert statuses.count(200) == len(statuses), f"{statuses.count(404)} reads answered 404"


def test_a_slow_commit_still_comes_before_the_answer(settings: Settings) -> None:
    """Every commit made slow: answering before committing would lose every race."""
    app = create_app(settings)

    def slow_commit(_session: Session) -> None:
        time.sleep(0.05)

    event.listen(app.state.context.db.factory, "before_commit", slow_commit)
    with (
        live_backend(settings, app) as url,
        httpx.Client(base_url=url, timeout=30, headers=AUTH) as client,
    ):
        statuses = [create_then_read(client, "clusters", CLUSTER) for _ in range(10)]
        plan = client.post(
            "/api/plans",
            headers=AUTH,
            json={
                "profile_id": client.post(
                    "/api/profiles", json={"profile": small_profile()}, headers=AUTH
                ).json()["id"],
                "manual": {"boundaries": [2], "num_microbatches": 2, "schedule": "1f1b"},
            },
        ).json()
        approved = client.post(f"/api/plans/{plan['id']}/approve?force=true", headers=AUTH)
        read = client.get(f"/api/plans/{plan['id']}").json()
    assert statuses == [200] * 10
    assert approved.status_code == 200 and read["state"] == "approved", "an update too"
