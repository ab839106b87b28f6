"""Shared fixtures: where the real PipeDream profiles live."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIPEDREAM_DIR = ROOT / "profiles" / "pipedream"
PIPEDREAM_MODELS = sorted(p.name for p in PIPEDREAM_DIR.iterdir() if p.is_dir())


@pytest.fixture
def pipedream_graph() -> Path:
    return PIPEDREAM_DIR / "vgg16" / "graph.txt"
