"""Who may do what (backend/auth.py, deps.py, routes/auth.py): reads need a credential
unless reads are public, changes need the API token or an editor's session, a viewer
reads only, a session ends when signed out or expired, and guessing passwords is braked."""

import io
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

from pipestudio.backend.app import create_app
from pipestudio.backend.settings import SettingsError, load_settings
from pipestudio.backend.users import check_password, hash_password, parse_users
from pipestudio.cli import main
from tests.backend.conftest import ANONYMOUS, API_TOKEN, add_plan, add_profile, make_settings
from tests.backend.live import live_backend

#: Made once: scrypt is slow by design.
USERS = [f"ada:editor:{hash_password('lovelace')}", f"bob:viewer:{hash_password('builder')}"]


@pytest.fixture
def server(database_url: str) -> Iterator[TestClient]:
    settings = make_settings(database_url, users=USERS, session_ttl_s=60)
    with TestClient(create_app(settings)) as client:  # no credential unless given
        yield client


def _sign_in(client: TestClient, user: str | None, password: str) -> dict[str, str]:
    response = client.post("/api/auth/session", json={"user": user, "password": password})
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['token']}"}


def test_reads_need_a_credential(server: TestClient) -> None:
    for path in (
        "/api/profiles",
        "/api/plans",
        "/api/runs",
        "/api/workers",
        "/api/clusters",
        "/api/proposals",
        "/api/runs/1/metrics",
    ):
        assert server.get(path).status_code == 401, path
    assert server.get("/api/profiles", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert server.get("/api/health").status_code == 200  # liveness stays public
    assert server.get("/api/auth/me").json() == {"user": None, "role": None, "public_reads": False}


def test_people_act_with_their_own_rights(server: TestClient) -> None:
    ada = _sign_in(server, "ada", "lovelace")
    bob = _sign_in(server, "bob", "builder")
    assert server.get("/api/auth/me", headers=ada).json()["role"] == "editor"
    profile = server.post(
        "/api/profiles",
        headers=ada,
        json={
            "profile": {
                "model": "toy",
                "microbatch_size": 1,
                "layers": [
                    {"name": "a", "fwd_ms": 1, "bwd_ms": 2},
                    {"name": "b", "fwd_ms": 1, "bwd_ms": 2},
                ],
            }
        },
    )
    assert profile.status_code == 201, profile.text
    plan = server.post(
        "/api/plans",
        headers=ada,
        json={
            "profile_id": profile.json()["id"],
            "author": "someone else",
            "manual": {"boundaries": [1], "num_microbatches": 2, "schedule": "gpipe"},
        },
    )
    assert plan.json()["created_by"] == "ada", "a person is recorded as who they are"
    assert server.get("/api/plans", headers=bob).status_code == 200
    refused = server.delete(f"/api/plans/{plan.json()['id']}", headers=bob)
    assert refused.status_code == 403 and "viewer" in refused.json()["detail"]
    assert server.get(f"/api/plans/{plan.json()['id']}", headers=bob).status_code == 200
    token = {"Authorization": f"Bearer {API_TOKEN}"}
    scripted = server.post(
        "/api/plans",
        headers=token,
        json={
            "profile_id": profile.json()["id"],
            "author": "nightly-job",
            "manual": {"boundaries": [1], "num_microbatches": 2, "schedule": "gpipe"},
        },
    )
    assert scripted.json()["created_by"] == "nightly-job", "the API token may name itself"


def test_signing_out_ends_the_session(server: TestClient) -> None:
    ada = _sign_in(server, "ada", "lovelace")
    assert server.get("/api/profiles", headers=ada).status_code == 200
    assert server.delete("/api/auth/session", headers=ada).status_code == 204
    assert server.get("/api/profiles", headers=ada).status_code == 401
    assert server.delete("/api/auth/session", headers=ada).status_code == 401


def test_a_session_expires(database_url: str) -> None:
    settings = make_settings(database_url, users=USERS, session_ttl_s=0.5)
    with TestClient(create_app(settings)) as client:
        ada = _sign_in(client, "ada", "lovelace")
        assert client.get("/api/profiles", headers=ada).status_code == 200
        time.sleep(1.0)
        assert client.get("/api/profiles", headers=ada).status_code == 401


def test_wrong_passwords_are_braked(server: TestClient) -> None:
    statuses = [
        server.post("/api/auth/session", json={"user": "ada", "password": f"guess{i}"}).status_code
        for i in range(12)
    ]
    assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429]
    braked = server.post("/api/auth/session", json={"user": "ada", "password": "lovelace"})
    assert braked.status_code == 429 and int(braked.headers["Retry-After"]) > 0
    assert server.post("/api/auth/session", json={"password": "not the token"}).status_code == 429


def test_public_reads_let_anyone_read_but_not_change(database_url: str) -> None:
    with TestClient(create_app(make_settings(database_url, public_reads=True))) as client:
        assert client.get("/api/profiles").status_code == 200
        assert client.get("/api/auth/me").json()["public_reads"] is True
        assert client.post("/api/clusters", json={}).status_code in (401, 422)
        assert client.post(
            "/api/profiles", json={"profile": {}}, headers=ANONYMOUS
        ).status_code in (401, 422)
        assert client.delete("/api/profiles/1").status_code == 401


def test_the_api_token_signs_in_as_admin(server: TestClient) -> None:
    token = _sign_in(server, None, API_TOKEN)
    plan = add_plan(_Authed(server, token), add_profile(_Authed(server, token)), [2])
    assert plan["state"] == "draft"


class _Authed:
    """``server`` with ``headers`` on every call (for the helpers of conftest)."""

    def __init__(self, client: TestClient, headers: dict[str, str]) -> None:
        self.client, self.headers = client, headers

    def post(self, url: str, **kwargs: object) -> object:
        return self.client.post(url, **{**kwargs, "headers": self.headers})


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("ada", "role '' is unknown"),
        ("a d a:editor:x", "followed by :ROLE:HASH"),
        ("ada:boss:scrypt$1$1$1$AAAAAAAAAAA=$AAAAAAAAAAAAAAAAAAAAAA==", "role 'boss' is unknown"),
        ("ada:editor:plain-text-password", "scrypt$N$r$p$SALT$KEY"),
        ("api-token:editor:" + "x", "reserved"),
    ],
)
def test_a_bad_user_entry_is_refused_naming_it(
    entry: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPESTUDIO_USERS", entry)
    with pytest.raises(SettingsError, match="PIPESTUDIO_USERS") as refused:
        load_settings()
    assert reason in str(refused.value)
    assert "scrypt$1" not in str(refused.value), "the entries (password hashes) are not echoed"


def test_hash_password_prints_an_entry_that_signs_in(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("correct horse\n"))
    assert main(["hash-password", "ada", "--role", "viewer"]) == 0
    entry = capsys.readouterr().out.strip()
    assert entry.startswith("ada:viewer:scrypt$") and "correct horse" not in entry
    user = parse_users([entry])["ada"]
    assert check_password("correct horse", user.password_hash)
    assert not check_password("correct horses", user.password_hash)
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert main(["hash-password", "ada"]) == 2
    assert "8 to 1024 characters" in capsys.readouterr().err


def test_a_burst_of_guesses_gets_no_more_than_a_series(database_url: str) -> None:
    settings = make_settings(database_url, users=USERS)
    with live_backend(settings) as url:

        def guess(i: int) -> int:
            return httpx.post(
                f"{url}/api/auth/session", timeout=60, json={"user": "ada", "password": f"guess{i}"}
            ).status_code

        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(guess, range(60)))
    assert statuses.count(401) == 10 and statuses.count(429) == 50, statuses


def test_an_unknown_name_takes_as_long_as_a_wrong_password(server: TestClient) -> None:
    def timed(user: str) -> float:
        started = time.perf_counter()
        assert (
            server.post("/api/auth/session", json={"user": user, "password": "x"}).status_code
            == 401
        )
        return time.perf_counter() - started

    timed("nobody")  # the first unknown name makes the decoy hash once
    known = min(timed("ada") for _ in range(3))
    unknown = min(timed(f"nobody{i}") for i in range(3))
    assert unknown > known / 3, (known, unknown)


def test_sessions_end_with_the_credential_they_were_made_with(database_url: str) -> None:
    """Removing a person, changing their role or password, or rotating the API token ends
    the sessions made with the old credential at once (not when they expire)."""
    before = make_settings(database_url, users=USERS)
    with TestClient(create_app(before)) as client:
        ada = _sign_in(client, "ada", "lovelace")
        bob = _sign_in(client, "bob", "builder")
        token = _sign_in(client, None, API_TOKEN)
    after = make_settings(
        database_url, users=[USERS[1].replace("bob:viewer", "bob:editor")], migrate_on_start=False
    ).model_copy(update={"api_token": "a-new-api-token"})
    with TestClient(create_app(after)) as client:
        assert client.get("/api/profiles", headers=ada).status_code == 401  # removed
        assert client.get("/api/profiles", headers=token).status_code == 401  # rotated
        assert client.get("/api/auth/me", headers=bob).json()["role"] == "editor"
    changed = make_settings(
        database_url, users=[f"bob:viewer:{hash_password('other')}"], migrate_on_start=False
    )
    with TestClient(create_app(changed)) as client:
        assert client.get("/api/profiles", headers=bob).status_code == 401  # new password
