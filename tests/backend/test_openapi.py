"""schemathesis against the live OpenAPI: no 5xx, and answers match their schemas.

Every operation of /openapi.json gets ``MAX_EXAMPLES`` generated requests per database
(bounded for CI), sent with the API token to a backend served by uvicorn, and every
answer goes through schemathesis's checks (no server error, documented status code,
content type and body schema). ``positive_data_acceptance`` is left out: a request can match
the schema and still be refused with a 422 that names the field, because the planner's
rules (every layer in one stage, a profile's edges acyclic...) go beyond what JSON Schema
expresses.
"""

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from pipestudio.backend.settings import Settings
from tests.backend.conftest import AUTH, small_profile
from tests.backend.live import live_backend

MAX_EXAMPLES = 10


def _seed(url: str) -> None:
    profile = httpx.post(f"{url}/api/profiles", headers=AUTH,
                         json={"profile": small_profile()}).json()
    httpx.post(f"{url}/api/plans", headers=AUTH, json={
        "profile_id": profile["id"], "manual": {"boundaries": [2], "num_microbatches": 2,
                                                "schedule": "gpipe"}})


def test_every_operation_conforms(settings: Settings) -> None:
    failures: dict[str, str] = {}
    with live_backend(settings) as url:
        _seed(url)
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 25
        for operation in operations:

            @settings_for_ci
            @given(case=operation.as_strategy())
            def check(case: schemathesis.Case) -> None:
                case.call_and_validate(headers=AUTH, excluded_checks=[positive_data_acceptance])

            try:
                check()
            except Exception as exc:
                failures[operation.label] = f"{type(exc).__name__}: {exc}"[:2000]
    assert not failures, "\n\n".join(f"{k}: {v}" for k, v in failures.items())


settings_for_ci = settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                           suppress_health_check=list(HealthCheck), derandomize=True)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
