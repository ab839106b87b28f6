"""Credentials before bodies (backend/gate.py): without the credential a route needs, a
request is refused before its body is read, so no body of a stranger's costs the server
parsing or checking; and a large body of someone the route serves is checked off the event
loop (backend/inputs.py)."""

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pipestudio.backend import inputs
from pipestudio.backend.app import create_app
from pipestudio.backend.deps import WRITER_NEEDED
from pipestudio.backend.gate import ANONYMOUS_BODY_BYTES, LARGE_AT_ONCE, LARGE_BODY_BYTES
from pipestudio.backend.users import hash_password
from tests.backend.conftest import ANONYMOUS, add_profile, make_settings, small_profile
from tests.backend.conftest import AUTH as AUTH_HEADERS

JSON = {"content-type": "application/json"}
#: A body whose check walks every value (a NaN at its end), and one that does not parse.
NAN_BODY = "[" + "1," * 5000 + "NaN]"
BROKEN_BODY = '{"name": '
WRITES = [
    ("POST", "/api/clusters"),
    ("PUT", "/api/clusters/1"),
    ("POST", "/api/profiles"),
    ("POST", "/api/plans"),
    ("PATCH", "/api/plans/1"),
    ("POST", "/api/plans/compare"),
    ("POST", "/api/runs"),
    ("POST", "/api/proposals"),
]


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The bodies the input check read."""
    seen: list[bytes] = []
    check = inputs._body_problem

    def counting(body: bytes) -> Any:
        seen.append(body)
        return check(body)

    monkeypatch.setattr(inputs, "_body_problem", counting)
    yield seen


@pytest.mark.parametrize("body", [NAN_BODY, BROKEN_BODY], ids=["nan", "broken"])
@pytest.mark.parametrize("credential", ["", "Bearer not-a-token", "Basic dGVzdA=="])
def test_a_write_without_a_valid_credential_is_refused_before_its_body_is_read(
    client: TestClient, checked: list[bytes], body: str, credential: str
) -> None:
    # what a route answers for the same credential with no body at all
    expected = client.get("/api/profiles", headers={"Authorization": credential}).json()["detail"]
    expected = None if "sign in first" in expected else expected
    for method, path in WRITES:
        response = client.request(
            method, path, content=body, headers={**JSON, "Authorization": credential}
        )
        assert response.status_code == 401, (method, path, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["detail"] == (expected or WRITER_NEEDED), response.text
    assert checked == []


def test_a_viewer_s_write_is_refused_before_its_body_is_read(
    database_url: str, checked: list[bytes]
) -> None:
    settings = make_settings(database_url, users=[f"bob:viewer:{hash_password('builder')}"])
    with TestClient(create_app(settings)) as client:
        session = client.post("/api/auth/session", json={"user": "bob", "password": "builder"})
        assert session.status_code == 201, session.text
        token = session.json()["token"]
        checked.clear()  # the sign-in's own body
        response = client.post(
            "/api/clusters", content=NAN_BODY, headers={**JSON, "Authorization": f"Bearer {token}"}
        )
    assert response.status_code == 403 and "viewer" in response.text, response.text
    assert checked == []


def test_bodies_the_route_takes_from_anyone_are_still_checked(
    database_url: str, checked: list[bytes]
) -> None:
    with TestClient(create_app(make_settings(database_url, public_reads=True))) as client:
        signin = client.post("/api/auth/session", content='{"password": NaN}', headers=JSON)
        assert signin.status_code == 422 and "password" in signin.text, signin.text
        simulate = client.post("/api/plans/simulate", content='{"plan": NaN}', headers=JSON)
        assert simulate.status_code == 422 and "plan" in simulate.text, simulate.text
        write = client.post("/api/profiles", content='{"profile": NaN}', headers=JSON)
        assert write.status_code == 401, write.text
    assert len(checked) == 2


def test_reads_that_are_not_public_need_a_credential_before_the_body(
    client: TestClient, checked: list[bytes]
) -> None:
    response = client.post("/api/plans/simulate", content=NAN_BODY, headers={**JSON, **ANONYMOUS})
    assert response.status_code == 401 and "sign in first" in response.text, response.text
    assert checked == []


def test_a_large_body_is_checked_off_the_event_loop(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    where: list[bool] = []
    check = inputs._body_problem

    def on_loop(body: bytes) -> Any:
        try:
            asyncio.get_running_loop()
            where.append(True)
        except RuntimeError:
            where.append(False)
        return check(body)

    monkeypatch.setattr(inputs, "_body_problem", on_loop)
    profile = small_profile()
    profile["metadata"] = {"values": [1.0] * (inputs.OFF_LOOP_BYTES // 4), "last": float("nan")}
    large = json.dumps({"profile": profile})
    small = json.dumps({"profile": {**small_profile(), "metadata": {"last": float("nan")}}})
    assert len(large) > inputs.OFF_LOOP_BYTES > len(small)
    for body in (large, small):
        response = client.post("/api/profiles", content=body, headers=JSON)
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == ["body", "profile", "metadata", "last"]
    assert where == [False, True]


def test_numbers_python_cannot_hold_are_named(client: TestClient) -> None:
    add_profile(client)
    huge = json.dumps({"profile": small_profile()}).replace('"fwd_ms": 1.0', '"fwd_ms": 1e999')
    response = client.post("/api/profiles", content=huge, headers=JSON)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "profile", "layers", 0, "fwd_ms"]
    assert "too large" in response.text
    digits = '{"plan_id": 1, "steps": 1' + "0" * 5000 + "}"
    response = client.post("/api/runs", content=digits, headers=JSON)
    assert response.status_code == 422 and "more than 4300 digits" in response.text, response.text
    assert client.get("/api/profiles").json()["count"] == 1


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/clusters/"),
        ("POST", "/api//clusters"),
        ("PUT", "/api/clusters"),
        ("PATCH", "/api/clusters"),
        ("GET", "/api/clusters"),
        ("OPTIONS", "/api/clusters"),
        ("POST", "/api/nonexistent"),
        ("POST", "/api/health"),
        ("GET", "/api/health"),
    ],
)
def test_a_body_no_route_takes_is_never_read(
    client: TestClient, checked: list[bytes], method: str, path: str
) -> None:
    response = client.request(method, path, content=NAN_BODY, headers={**JSON, **ANONYMOUS})
    assert response.status_code in (200, 307, 401, 404, 405), response.text
    assert "nan" not in response.text.lower(), response.text
    assert checked == []


def test_a_stranger_s_body_is_small_even_where_strangers_may_send_one(
    database_url: str, checked: list[bytes]
) -> None:
    big = '{"password": "' + "x" * (ANONYMOUS_BODY_BYTES + 1) + '"}'
    with TestClient(create_app(make_settings(database_url, public_reads=True))) as client:
        for path in ("/api/auth/session", "/api/plans/simulate"):
            response = client.post(path, content=big, headers=JSON)
            assert response.status_code == 413, response.text
            assert "from someone not signed in" in response.text

            def chunks() -> Iterator[bytes]:
                yield big.encode()

            chunked = client.post(path, content=chunks(), headers=JSON)
            assert chunked.status_code == 413, chunked.text
        # the API token may send the upload limit's worth
        signed = client.post("/api/plans/simulate", content=big, headers={**JSON, **AUTH_HEADERS})
        assert signed.status_code == 422, signed.text
    assert len(checked) == 1


def test_a_repeated_header_counts_once_its_first_as_for_the_routes(
    client: TestClient, checked: list[bytes]
) -> None:
    named = [("content-type", "application/json"), ("content-type", "text/plain")]
    response = client.post(
        "/api/clusters",
        content=json.dumps({"name": "a\u0000b", "cluster": {}}),
        headers=named,
    )
    assert response.status_code == 422 and "NUL" in response.text, response.text
    assert client.get("/api/clusters").json()["count"] == 0
    twice = [
        ("authorization", "Bearer not-a-token"),
        ("authorization", AUTH_HEADERS["Authorization"]),
    ]
    response = client.post("/api/clusters", content=NAN_BODY, headers=[*twice, *JSON.items()])
    assert response.status_code == 401, response.text
    assert len(checked) == 1


@pytest.mark.settings(max_upload_bytes=4 * 2**20)
def test_large_bodies_are_taken_a_few_at_a_time(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each large body's check holds a moment, while six are sent at once: no more than
    LARGE_AT_ONCE are ever inside."""
    inside, most, lock = [0], [0], threading.Lock()
    check = inputs._body_problem

    def holding(body: bytes) -> Any:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.3)
        with lock:
            inside[0] -= 1
        return check(body)

    monkeypatch.setattr(inputs, "_body_problem", holding)
    large = "[" + "1," * (LARGE_BODY_BYTES // 2) + "NaN]"
    with ThreadPoolExecutor(6) as pool:
        answers = list(
            pool.map(lambda _: client.post("/api/clusters", content=large, headers=JSON), range(6))
        )
    assert [a.status_code for a in answers] == [422] * 6
    assert most[0] == LARGE_AT_ONCE, most
