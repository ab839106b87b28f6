"""Backend fixtures: every test runs on SQLite and on PostgreSQL.

PostgreSQL: a fresh database per test session on 127.0.0.1:5432 (user postgres, trust
auth), dropped afterwards; each test starts from an empty schema. Without a server the
PostgreSQL half is skipped, except under CI=true, where it fails.
"""

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from pipestudio.backend.app import create_app
from pipestudio.backend.settings import Settings
from tests.conftest import PIPEDREAM_DIR

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
API_TOKEN = "test-api-token"
WORKER_TOKEN = "test-worker-token"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
#: Headers that take the fixtures' credential away from one request.
ANONYMOUS = {"Authorization": ""}
#: The built-in models of a real worker (``runtime.models.MODELS``), as fakes advertise.
BUILTIN_MODELS = ["dynamic", "gpt", "mlp", "resnet", "unet"]


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """The URL of a database created for this test session."""
    name = f"pipestudio_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs PostgreSQL on 127.0.0.1:5432: {exc}")
        pytest.skip(f"no PostgreSQL on 127.0.0.1:5432: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def empty_postgres(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DROP SCHEMA public CASCADE")
        connection.execute("CREATE SCHEMA public")


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'pipestudio.db'}"
    url: str = request.getfixturevalue("postgres_database")
    empty_postgres(url)
    return url


def make_settings(database_url: str, **changes: Any) -> Settings:
    return Settings(
        database_url=database_url, api_token=API_TOKEN, worker_token=WORKER_TOKEN, **changes
    )


@pytest.fixture
def settings(database_url: str, request: pytest.FixtureRequest) -> Settings:
    """Small uploads; workers fall silent only after a minute, since scripted workers send
    no heartbeats and a busy machine can take seconds between two requests. A test that
    needs other values marks itself ``@pytest.mark.settings(name=value, ...)``."""
    marker = request.node.get_closest_marker("settings")
    changes = {"max_upload_bytes": 2 * 2**20, "worker_timeout_s": 60.0}
    return make_settings(database_url, **(changes | (marker.kwargs if marker else {})))


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The backend in process; every request carries the API token unless it passes
    ``ANONYMOUS`` headers."""
    with TestClient(create_app(settings), headers=AUTH) as test_client:
        yield test_client


def small_profile(num_layers: int = 4, model: str = "toy") -> dict[str, Any]:
    return {
        "format": "pipestudio.profile",
        "version": 1,
        "model": model,
        "microbatch_size": 2,
        "layers": [
            {
                "name": f"layer{i}",
                "fwd_ms": 1.0 + i,
                "bwd_ms": 2.0 + i,
                "param_bytes": 1000 * (i + 1),
                "saved_bytes": 500,
                "output_bytes": 100,
            }
            for i in range(num_layers)
        ],
    }


def mlp_profile(blocks: int = 4) -> dict[str, Any]:
    """A small profile with the layers of the built-in ``mlp`` of ``blocks`` blocks (its
    default is 4): a launch of ``mlp`` must build the plan's layers."""
    profile = small_profile(blocks + 1, model="mlp")
    names = [*(f"block{idx}" for idx in range(blocks)), "head"]
    for layer, name in zip(profile["layers"], names, strict=True):
        layer["name"] = name
    return profile


def vgg_graph() -> str:
    return (PIPEDREAM_DIR / "vgg16" / "graph.txt").read_text()


def add_profile(client: TestClient, document: dict[str, Any] | None = None) -> int:
    response = client.post(
        "/api/profiles", json={"profile": document or small_profile()}, headers=AUTH
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def add_plan(
    client: TestClient,
    profile_id: int,
    boundaries: list[int],
    *,
    approve: bool = False,
    num_microbatches: int = 4,
    schedule: str = "1f1b",
    cluster_id: int | None = None,
    **manual: Any,
) -> dict[str, Any]:
    response = client.post(
        "/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "cluster_id": cluster_id,
            "manual": {
                "boundaries": boundaries,
                "num_microbatches": num_microbatches,
                "schedule": schedule,
                **manual,
            },
        },
    )
    assert response.status_code == 201, response.text
    plan: dict[str, Any] = response.json()
    if approve:
        # with force: tests of other things approve before their workers connect
        response = client.post(f"/api/plans/{plan['id']}/approve?force=true", headers=AUTH)
        assert response.status_code == 200, response.text
        plan = response.json()
    return plan


@pytest.fixture
def fake(client: TestClient) -> Iterator[Callable[..., Any]]:
    """Makes scripted workers (``fakes.FakeWorker``) on ``client``; closes them before the
    client stops."""
    from tests.backend.fakes import FakeWorker

    made: list[FakeWorker] = []

    def make(*args: Any, **kwargs: Any) -> FakeWorker:
        made.append(FakeWorker(client, *args, **kwargs))
        return made[-1]

    yield make
    for worker in made:
        with contextlib.suppress(Exception):  # the server or the test closed it already
            worker.close()
