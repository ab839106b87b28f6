"""Fixtures: the real backend in-process (FastAPI's TestClient on a temporary SQLite file)
behind the dashboard's API client, and a large synthetic profile."""

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pipestudio.backend.app import create_app
from pipestudio.backend.settings import Settings
from pipestudio.dashboard.api import ApiClient
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.pages import profiles
from pipestudio.planner import Layer, Profile
from tests.conftest import PIPEDREAM_DIR

TOKEN = "dashboard-test-token"


@pytest.fixture
def context(tmp_path: Path) -> Iterator[Context]:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'db.sqlite'}", api_token=TOKEN)
    with TestClient(create_app(settings)) as http:
        yield Context(ApiClient("http://testserver", TOKEN, http=http))


def upload_contents(path: Path) -> str:
    return "data:text/plain;base64," + base64.b64encode(path.read_bytes()).decode()


@pytest.fixture
def vgg_id(context: Context) -> int:
    notice, profile_id = profiles.upload_profile(
        context,
        upload_contents(PIPEDREAM_DIR / "vgg16" / "graph.txt"),
        "graph.txt",
        None,
        128,
        "vgg16",
    )
    assert profile_id is not None, notice.children
    return profile_id


def big_profile(num_layers: int = 1000) -> Profile:
    """A chain of uneven layers, each with parameters, activations and an optimizer update."""
    return Profile(
        model="big",
        microbatch_size=4,
        layers=[
            Layer(
                name=f"layer{i}",
                kind="Linear",
                fwd_ms=0.5 + (i % 7) * 0.1,
                bwd_ms=1.0 + (i % 5) * 0.2,
                param_bytes=2**20,
                saved_bytes=2**21,
                output_bytes=2**18,
                update_ms=0.01,
            )
            for i in range(num_layers)
        ],
    )
