"""A backend served by uvicorn in a thread of the test process, on a port the OS picks."""

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from pipestudio.backend.app import create_app
from pipestudio.backend.settings import Settings
from pipestudio.dashboard.app import create_dashboard
from tests.backend.conftest import AUTH


def read(url: str, **kwargs: Any) -> httpx.Response:
    """GET ``url`` with the API token (reads are not public by default)."""
    return httpx.get(url, headers=AUTH, **{"timeout": 30, **kwargs})


@contextmanager
def live_backend(
    settings: Settings, app: FastAPI | None = None, *, dashboard: bool = False
) -> Iterator[str]:
    """Serve the backend (``app``, else one made from ``settings``, with the dashboard at /
    when ``dashboard``, as ``pipestudio serve`` does) until the block ends; yields its base
    URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if app is None:
        wsgi = create_dashboard(f"http://127.0.0.1:{port}").server if dashboard else None
        app = create_app(settings, dashboard=wsgi)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the backend did not start"
        time.sleep(0.05)
    assert httpx.get(f"{url}/api/health").status_code == 200
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def dash_request(
    dependencies: list[dict[str, Any]],
    input_id: str,
    prop: str,
    value: Any,
    states: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The body a browser posts to ``/_dash-update-component`` when ``input_id.prop``
    changes (``dependencies``: the dashboard's ``/_dash-dependencies``)."""
    callback = next(c for c in dependencies if {"id": input_id, "property": prop} in c["inputs"])
    output = callback["output"]
    multi = output.startswith("..")
    outputs = [
        dict(zip(("id", "property"), part.split(".", 1), strict=True))
        for part in (output.strip(".").split("...") if multi else [output])
    ]
    states = states or {}
    body = {
        "output": output,
        "outputs": outputs if multi else outputs[0],
        "inputs": [{"id": input_id, "property": prop, "value": value}],
        "changedPropIds": [f"{input_id}.{prop}"],
        "state": [
            {**s, "value": states.get(f"{s['id']}.{s['property']}")} for s in callback["state"]
        ],
    }
    return body


def dash_call(
    browser: httpx.Client,
    input_id: str,
    prop: str,
    value: Any,
    states: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fire the dashboard callback that ``input_id.prop`` triggers, as a signed-in browser
    does (``processes.dashboard_session``); its outputs by component id."""
    body = dash_request(browser.get("/_dash-dependencies").json(), input_id, prop, value, states)
    response = browser.post("/_dash-update-component", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json()["response"])
