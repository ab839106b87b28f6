"""The dashboard needs a signed-in person (dashboard/signin.py): without a session no
callback runs and no page data is served; with one, callbacks act with that person's
rights (never the server's), must come from the dashboard's own pages, and end with
sign-out."""

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pipestudio.backend.settings import Settings
from pipestudio.backend.users import hash_password
from pipestudio.dashboard.signin import FORM_MAX_BYTES
from tests.backend.conftest import API_TOKEN, AUTH, make_settings, small_profile
from tests.backend.live import dash_request, live_backend
from tests.backend.processes import dashboard_session

VIEWER = f"bob:viewer:{hash_password('builder')}"


@pytest.fixture
def stack(database_url: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The backend with the dashboard at /, a stored profile, and the callbacks' list."""
    with live_backend(make_settings(database_url, users=[VIEWER]), dashboard=True) as url:
        httpx.post(
            f"{url}/api/profiles", headers=AUTH, json={"profile": small_profile()}
        ).raise_for_status()
        with dashboard_session(url) as browser:
            dependencies = browser.get("/_dash-dependencies").json()
        yield url, dependencies


def _delete_profile(dependencies: list[dict[str, Any]]) -> dict[str, Any]:
    return dash_request(
        dependencies,
        "profiles-delete",
        "n_clicks",
        1,
        {"profiles-select.value": 1, "profiles-changed.data": 0},
    )


def _launch_getoutput(dependencies: list[dict[str, Any]]) -> dict[str, Any]:
    return dash_request(
        dependencies,
        "runs-launch",
        "n_clicks",
        1,
        {
            "runs-plan.value": 1,
            "runs-model.value": "subprocess:getoutput",
            "runs-model-args.value": "cmd=touch${IFS}/tmp/pwned",
            "runs-steps.value": 1,
            "runs-changed.data": 0,
        },
    )


def _profiles(url: str) -> int:
    return int(httpx.get(f"{url}/api/profiles", headers=AUTH).json()["count"])


def test_without_a_session_nothing_runs(stack: tuple[str, list[dict[str, Any]]]) -> None:
    url, dependencies = stack
    anyone = httpx.Client(base_url=url, timeout=30)
    assert anyone.get("/").status_code == 302
    assert anyone.get("/runs").headers["location"].startswith("/login?next=/runs")
    for path in ("/_dash-layout", "/_dash-dependencies"):
        assert anyone.get(path).status_code == 401, path
    for body in (_delete_profile(dependencies), _launch_getoutput(dependencies)):
        refused = anyone.post("/_dash-update-component", json=body)
        assert refused.status_code == 401, refused.text
    assert _profiles(url) == 1
    assert httpx.get(f"{url}/api/runs", headers=AUTH).json()["count"] == 0
    assert anyone.get("/login").status_code == 200
    assert anyone.get("/assets/pipestudio.css").status_code == 200


def test_a_callback_must_come_from_the_dashboard(stack: tuple[str, list[dict[str, Any]]]) -> None:
    url, dependencies = stack
    with dashboard_session(url) as browser:
        del browser.headers["X-CSRFToken"]  # what a page on another site would send
        refused = browser.post("/_dash-update-component", json=_delete_profile(dependencies))
        assert refused.status_code == 403, refused.text
        browser.headers["X-CSRFToken"] = "guessed"
        refused = browser.post("/_dash-update-component", json=_delete_profile(dependencies))
        assert refused.status_code == 403, refused.text
    assert _profiles(url) == 1
    evil = httpx.post(
        f"{url}/login", data={"password": API_TOKEN}, headers={"Origin": "http://evil.example"}
    )
    assert evil.status_code == 403 and "pipestudio_session" not in evil.headers.get(
        "set-cookie", ""
    )


def test_a_viewer_reads_but_cannot_delete(stack: tuple[str, list[dict[str, Any]]]) -> None:
    url, dependencies = stack
    with dashboard_session(url, "builder", user="bob") as browser:
        assert browser.get("/profiles").status_code == 200
        answer = browser.post("/_dash-update-component", json=_delete_profile(dependencies))
        assert answer.status_code == 200
        assert "viewers may read but not change" in answer.text
    assert _profiles(url) == 1


def _upload(
    browser: httpx.Client,
    dependencies: list[dict[str, Any]],
    contents: Any,
    filename: str,
    changed: Any,
) -> httpx.Response:
    """The Profiles page's upload callback, as a browser would send it."""
    return browser.post(
        "/_dash-update-component",
        json=dash_request(
            dependencies,
            "profiles-upload",
            "contents",
            contents,
            {"profiles-upload.filename": filename, "profiles-changed.data": changed},
        ),
    )


def test_signing_in_acts_as_that_person_until_signing_out(
    stack: tuple[str, list[dict[str, Any]]],
) -> None:
    url, dependencies = stack
    with dashboard_session(url) as browser:
        contents = (
            "data:application/json;base64,"
            + base64.b64encode(json.dumps(small_profile(3)).encode()).decode()
        )
        uploaded = _upload(browser, dependencies, contents, "toy.json", 0)
        assert "Uploaded toy.json" in uploaded.text, uploaded.text
        assert _profiles(url) == 2
        cookies = dict(browser.cookies)
        out = browser.post("/logout", data={"csrf": browser.cookies["_csrf_token"]})
        assert out.status_code == 302 and out.headers["location"] == "/login"
    stolen = httpx.Client(
        base_url=url, cookies=cookies, timeout=30, headers={"X-CSRFToken": cookies["_csrf_token"]}
    )
    assert (
        stolen.post("/_dash-update-component", json=_delete_profile(dependencies)).status_code
        == 401
    )
    assert _profiles(url) == 2


def test_callback_values_no_page_sends_are_answered_in_words(
    stack: tuple[str, list[dict[str, Any]]],
) -> None:
    url, dependencies = stack

    def upload(browser: httpx.Client, contents: Any, changed: Any) -> Any:
        answer = _upload(browser, dependencies, contents, "x.json", changed)
        assert answer.status_code == 200, answer.text
        return answer.json()["response"]

    deep = (
        "data:application/json;base64,"
        + base64.b64encode(b'{"a":' * 5000 + b"1" + b"}" * 5000).decode()
    )
    with dashboard_session(url) as browser:
        answer = upload(browser, deep, 0)
        assert "nests its JSON too deeply" in json.dumps(answer), answer
        for contents in (7, [1, 2]):
            assert "is not a text file" in json.dumps(upload(browser, contents, 0))
        assert _profiles(url) == 1
        # the counter a page keeps comes back as null: the upload is made, and said to be
        good = (
            "data:application/json;base64,"
            + base64.b64encode(json.dumps(small_profile(3)).encode()).decode()
        )
        answer = upload(browser, good, None)
        assert "Uploaded x.json" in json.dumps(answer), answer
        assert answer["profiles-changed"]["data"] == 1
    assert _profiles(url) == 2


def test_a_sign_in_form_is_small(stack: tuple[str, list[dict[str, Any]]]) -> None:
    url, _ = stack
    padded = {"password": API_TOKEN, "user": "", "pad": "x" * (FORM_MAX_BYTES + 1)}
    refused = httpx.post(f"{url}/login", data=padded)
    assert refused.status_code == 413 and "at most" in refused.text, refused.text
    assert "pipestudio_session" not in refused.headers.get("set-cookie", "")
    many = "&".join(["a=b"] * 10_000)  # 40 KB of fields
    refused = httpx.post(
        f"{url}/login",
        content=many,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert refused.status_code == 413, refused.text
    signed = httpx.post(f"{url}/login", data={"password": API_TOKEN})
    assert signed.status_code == 302 and "pipestudio_session" in signed.headers["set-cookie"]


def test_public_reads_never_lend_the_server_token(database_url: str) -> None:
    settings: Settings = make_settings(database_url, public_reads=True)
    with live_backend(settings, dashboard=True) as url:
        httpx.post(
            f"{url}/api/profiles", headers=AUTH, json={"profile": small_profile()}
        ).raise_for_status()
        anyone = httpx.Client(base_url=url, timeout=30)
        assert anyone.get("/profiles").status_code == 200  # pages are public now
        dependencies = anyone.get("/_dash-dependencies").json()
        answer = anyone.post("/_dash-update-component", json=_delete_profile(dependencies))
        assert answer.status_code == 200 and "API token is required" in answer.text
        answer = anyone.post("/_dash-update-component", json=_launch_getoutput(dependencies))
        assert "API token is required" in answer.text or "approve" in answer.text, answer.text
        assert _profiles(url) == 1


def test_crafted_callback_values_answer_400_not_500(
    stack: tuple[str, list[dict[str, Any]]],
) -> None:
    url, dependencies = stack
    with dashboard_session(url) as browser:
        for value in ("abc", -1, 10**30, {}):
            body = dash_request(dependencies, "profiles-select", "value", value)
            answer = browser.post("/_dash-update-component", json=body)
            assert answer.status_code == 400, (value, answer.text)
    assert httpx.get(f"{url}/loginx").status_code == 302, "only /login itself is open"


def test_one_browsers_bad_guesses_do_not_lock_out_another(
    stack: tuple[str, list[dict[str, Any]]],
) -> None:
    """The dashboard signs people in from the server's own address: it forwards each
    browser's, so the brake on guessing holds one browser back, not everyone."""
    url, _ = stack
    guesser = {"X-Forwarded-For": "203.0.113.5"}
    statuses = [
        httpx.post(f"{url}/login", data={"password": f"guess{i}"}, headers=guesser).status_code
        for i in range(11)
    ]
    assert statuses == [401] * 10 + [429]
    other = httpx.post(
        f"{url}/login", data={"password": API_TOKEN}, headers={"X-Forwarded-For": "198.51.100.7"}
    )
    assert other.status_code == 302, other.text


@pytest.mark.parametrize(
    "target", ["/%5Cevil.example", "https://evil.example", "//evil.example", "/%0d%0aLocation:%20x"]
)
def test_signing_in_never_leads_to_another_site(
    stack: tuple[str, list[dict[str, Any]]], target: str
) -> None:
    url, _ = stack
    answer = httpx.post(f"{url}/login?next={target}", data={"password": API_TOKEN})
    assert answer.status_code == 302 and answer.headers["location"] == "/", target
