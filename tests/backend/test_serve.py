"""``pipestudio serve`` and ``pipestudio db upgrade`` (src/pipestudio/cli/server.py): the
dashboard served at / in the backend's process, talking to that backend as whoever signed
in; bad settings refused in one line; the one-shot migration."""

import base64
import contextlib
import json
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, inspect

from pipestudio.backend.db import normalize_url
from pipestudio.cli import main
from tests.backend.conftest import small_profile
from tests.backend.live import dash_call, read
from tests.backend.processes import dashboard_session, start_backend, stop


def test_serve_port_0_serves_the_dashboard_wired_to_itself(tmp_path: Path) -> None:
    process, url = start_backend(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "serve.log")
    with contextlib.ExitStack() as stack:
        stack.callback(stop, process)
        assert httpx.get(f"{url}/", timeout=30).status_code == 302  # to the sign-in page
        browser = stack.enter_context(dashboard_session(url))
        page = browser.get("/")
        assert page.status_code == 200 and "_dash-config" in page.text
        assert browser.get("/runs").status_code == 200
        assert "dashboard at /" in (tmp_path / "serve.log").read_text()
        # the dashboard reads its backend: the URL has the port the OS picked
        health = dash_call(browser, "nav-health-interval", "n_intervals", 1)
        assert health["nav-health"]["children"].startswith("backend "), health
        assert "sqlite" in health["nav-health"]["children"]
        # ... and writes to it, as the person who signed in (here: with the API token)
        contents = (
            "data:application/json;base64,"
            + base64.b64encode(json.dumps(small_profile(3)).encode()).decode()
        )
        uploaded = dash_call(
            browser,
            "profiles-upload",
            "contents",
            contents,
            {"profiles-upload.filename": "toy.json", "profiles-changed.data": 0},
        )
        assert "Uploaded toy.json" in json.dumps(uploaded), uploaded
        stored = read(f"{url}/api/profiles", timeout=30).json()["data"]
        assert [p["num_layers"] for p in stored] == [3]


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("PIPESTUDIO_HEARTBEAT_S", "-1", "greater than 0"),
        ("PIPESTUDIO_MIGRATE_ON_START", "maybe", "valid boolean"),
        ("PIPESTUDIO_MAX_UPLOAD_BYTES", "lots", "valid integer"),
    ],
)
@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["db", "upgrade"]])
def test_a_bad_setting_is_one_line_naming_it(
    command: list[str],
    variable: str,
    value: str,
    reason: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PIPESTUDIO_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite'}")
    monkeypatch.setenv(variable, value)
    assert main(command) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {variable}='{value}': ") and reason in err, err
    assert not out and not (tmp_path / "db.sqlite").exists(), "it stopped before any work"


def test_serve_refuses_a_bad_port_and_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "70000"]) == 2
    assert capsys.readouterr().err == "error: --port must be 0..65535, got 70000\n"
    assert main(["serve", "--port", "0", "--database-url", "mysql://db/x"]) == 2
    assert "database URL 'mysql://db/x': expected sqlite" in capsys.readouterr().err


def tables(url: str) -> set[str]:
    engine = create_engine(normalize_url(url))
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_db_upgrade_migrates_once(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PIPESTUDIO_DATABASE_URL", raising=False)
    assert "plans" not in tables(database_url)
    assert main(["db", "upgrade", "--database-url", database_url]) == 0
    first = capsys.readouterr().out
    assert "upgraded from empty to revision" in first, first
    assert {"alembic_version", "profiles", "plans", "runs", "metrics"} <= tables(database_url)
    monkeypatch.setenv("PIPESTUDIO_DATABASE_URL", database_url)
    assert main(["db", "upgrade"]) == 0
    again = capsys.readouterr().out
    assert "already at revision" in again and first.split()[-1] == again.split()[-1]


def test_db_upgrade_says_why_it_cannot(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "--database-url", "mysql://db/x"]) == 2
    assert "expected sqlite:///FILE or postgresql://" in capsys.readouterr().err
    # nothing listens on port 1
    assert (
        main(["db", "upgrade", "--database-url", "postgresql://nobody:secret@127.0.0.1:1/x"]) == 1
    )
    err = capsys.readouterr().err
    assert err.startswith("error: cannot migrate postgresql+psycopg://nobody:***@127.0.0.1:1/x")
    assert "secret" not in err and err.count("\n") == 1
