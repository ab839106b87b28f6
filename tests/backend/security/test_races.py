"""Concurrent edits and deletes of one item answer 404 or 409, never 500
(repositories.py's row locks, errors.py's mapping of what still collides)."""

import threading
from collections import Counter

import httpx

from pipestudio.backend.settings import Settings
from tests.backend.conftest import AUTH, small_profile
from tests.backend.live import live_backend

RACES = 50


def _race(client: httpx.Client, plan_id: int) -> tuple[int, int]:
    """PATCH and DELETE the plan at once; their statuses."""
    barrier = threading.Barrier(2)
    statuses: dict[str, int] = {}

    def patch() -> None:
        barrier.wait()
        statuses["patch"] = client.patch(
            f"/api/plans/{plan_id}", json={"boundaries": [1], "name": "edited"}
        ).status_code

    def delete() -> None:
        barrier.wait()
        statuses["delete"] = client.delete(f"/api/plans/{plan_id}").status_code

    threads = [threading.Thread(target=patch), threading.Thread(target=delete)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return statuses["patch"], statuses["delete"]


def test_patch_racing_delete_never_answers_500(settings: Settings) -> None:
    with (
        live_backend(settings) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=60) as client,
    ):
        profile_id = client.post("/api/profiles", json={"profile": small_profile()}).json()["id"]
        outcomes: Counter[tuple[int, int]] = Counter()
        for _ in range(RACES):
            plan = client.post(
                "/api/plans",
                json={
                    "profile_id": profile_id,
                    "manual": {"boundaries": [2], "num_microbatches": 2, "schedule": "gpipe"},
                },
            ).json()
            patched, deleted = _race(client, plan["id"])
            outcomes[(patched, deleted)] += 1
            assert deleted in (204, 404, 409), outcomes
            assert patched in (200, 404, 409), outcomes
            gone = client.get(f"/api/plans/{plan['id']}").status_code
            assert gone == (404 if deleted == 204 else 200), outcomes
        assert sum(outcomes.values()) == RACES
        # a delete of a profile that a plan being created uses: 409, never 500
        for _ in range(10):
            fresh = client.post("/api/profiles", json={"profile": small_profile()}).json()
            created: list[int] = []
            thread = threading.Thread(target=_plan_of, args=(client, fresh["id"], created))
            thread.start()
            deleted = client.delete(f"/api/profiles/{fresh['id']}").status_code
            thread.join(60)
            assert deleted in (204, 409) and created[0] in (201, 404, 409), (deleted, created)


def _plan_of(client: httpx.Client, profile_id: int, statuses: list[int]) -> None:
    statuses.append(
        client.post(
            "/api/plans",
            json={
                "profile_id": profile_id,
                "manual": {"boundaries": [2], "num_microbatches": 2, "schedule": "gpipe"},
            },
        ).status_code
    )
