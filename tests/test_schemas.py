"""The published JSON Schemas match the code, and documents validate against them."""

import json
from pathlib import Path

import jsonschema
import pytest

from pipestudio.planner import cluster_template, import_pipedream, plan_template, simulate
from pipestudio.planner.formats.schemas import DOCUMENTS, json_schema
from tests.conftest import PIPEDREAM_DIR

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "docs" / "schemas"


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_committed_schema_is_current(name: str) -> None:
    committed = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    assert committed == json_schema(name), f"run `make schemas` to refresh {name}.schema.json"


def test_documents_validate_against_published_schemas() -> None:
    profile = import_pipedream(PIPEDREAM_DIR / "resnet18" / "graph.txt", batch_size=256)
    plan = plan_template(profile, 4, 8, "pipedream")
    cluster = cluster_template(
        [2, 2], [100.0, 10.0], device_memory_bytes=2**34, host_bandwidth_gbps=64.0
    )
    result = simulate(profile, plan, cluster)
    for name, document in (
        ("profile", profile),
        ("plan", plan),
        ("cluster", cluster),
        ("simresult", result),
    ):
        schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
        jsonschema.validate(json.loads(document.to_json()), schema)
    broken = json.loads(plan.to_json())
    broken["schedule"] = "zigzag"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json.loads((SCHEMA_DIR / "plan.schema.json").read_text()))
