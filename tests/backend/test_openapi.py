"""schemathesis with ``--checks all`` against the live OpenAPI document: no 5xx, every
answer documented and matching its schema, the methods a path does not take answered 405
with the right ``Allow``, invalid requests refused, schema-valid ones accepted (but for the
rules JSON Schema cannot state: ``schemathesis.toml``), and no operation that needs a
credential answering without one.

The backend is served by uvicorn on each database, seeded with a profile and a plan, and
schemathesis runs every phase (examples, coverage, fuzzing, stateful) with a fixed seed
and ``MAX_EXAMPLES`` cases per operation, so that it stays within a minute or two.
"""

import subprocess
import sys
from pathlib import Path

import httpx

from pipestudio.backend.settings import Settings
from tests.backend.conftest import API_TOKEN, AUTH, small_profile
from tests.backend.live import live_backend

MAX_EXAMPLES = 6
CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


def _seed(url: str) -> None:
    profile = httpx.post(
        f"{url}/api/profiles", headers=AUTH, json={"profile": small_profile()}
    ).json()
    httpx.post(
        f"{url}/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile["id"],
            "manual": {"boundaries": [2], "num_microbatches": 2, "schedule": "gpipe"},
        },
    ).raise_for_status()


def test_every_check_of_schemathesis_passes(settings: Settings, tmp_path: Path) -> None:
    with live_backend(settings) as url:
        _seed(url)
        done = subprocess.run(
            [
                str(SCHEMATHESIS),
                "--config-file",
                str(CONFIG),
                "run",
                f"{url}/openapi.json",
                "--checks",
                "all",
                "--header",
                f"Authorization: Bearer {API_TOKEN}",
                "--max-examples",
                str(MAX_EXAMPLES),
                "--seed",
                "20261127",
                "--workers",
                "1",
                "--generation-database",
                "none",
                "--no-color",
                "--request-timeout",
                "30",
                "--report",
                "junit",
                "--report-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    assert done.returncode == 0, _failures(done.stdout) + done.stderr[-3000:]


def _failures(output: str) -> str:
    """schemathesis's report, each failure in a few lines: the operation, the check, the
    answer (request bodies can be megabytes)."""
    kept = [
        line[:400]
        for line in output.splitlines()
        if line.startswith(("___", "- ST", "[", "    `", "    curl", "=", "❌"))
        or "failures" in line
    ]
    return "\n".join(kept[-200:])
