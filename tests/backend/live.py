"""A backend served by uvicorn in a thread of the test process, on a port the OS picks."""

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fastapi import FastAPI

from pipestudio.backend.app import create_app
from pipestudio.backend.settings import Settings


@contextmanager
def live_backend(settings: Settings, app: FastAPI | None = None) -> Iterator[str]:
    """Serve the backend (``app``, else one made from ``settings``) until the block ends;
    yields its base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app or create_app(settings), log_level="warning"))
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
