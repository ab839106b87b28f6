"""Signing in to the dashboard, and the gate every request passes.

A person signs in on ``login`` with a name and password (or the API token); the backend
gives a session token (``POST /api/auth/session``), which the dashboard keeps in an
HttpOnly, SameSite=Strict cookie and sends as ``Authorization: Bearer`` on every API call
it makes while serving that person (``ApiClient``'s credential), so each call acts with
their rights and the backend records them as its author. The dashboard holds no token of
its own.

The gate (``Flask.before_request``) lets static files and the sign-in page through; any
other request needs a live session unless the backend makes reads public: a page is
redirected to ``login``, a callback answers 401 (the page's script then goes to
``login``). Cross-site requests are refused twice over: the cookies are SameSite=Strict,
and a callback must echo the ``_csrf_token`` cookie in its ``X-CSRFToken`` header (which
Dash's renderer does by itself) — a page on another site can neither read that cookie
nor set that header. The sign-in and sign-out forms check the ``Origin`` header, and the
sign-out form carries the ``_csrf_token`` cookie's value too.
"""

import contextlib
import html
import secrets
import threading
import time
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlsplit

import flask
from dash import Dash
from werkzeug.wrappers import Response

from pipestudio.dashboard.api import ApiClient, ApiError

SESSION_COOKIE = "pipestudio_session"
#: The cookie Dash's renderer copies into the ``X-CSRFToken`` header of each callback.
CSRF_COOKIE = "_csrf_token"
CSRF_HEADER = "X-CSRFToken"
#: Paths (under the dashboard's base) anyone may fetch: code and styles, no data; and
#: the sign-in page itself (``_OPEN_PATHS``).
_OPEN_PREFIXES = ("_dash-component-suites/", "assets/")
_OPEN_PATHS = ("_favicon.ico", "login")
#: The most a sign-in or sign-out form may send: a name, a password, a token (the forms
#: are read before anyone is known, so their size is what a stranger can make us parse).
FORM_MAX_BYTES = 16 * 1024
_CACHE_S = 5.0
_CACHE_MAX = 1000


class Gate:
    """Who each request acts for, from its session cookie (module docstring)."""

    def __init__(self, client: ApiClient, base: str, *, secure: bool = False) -> None:
        self.client, self.base, self.secure = client, base, secure
        self._people: OrderedDict[str, tuple[dict[str, Any] | None, float]] = OrderedDict()
        self._lock = threading.Lock()

    # -- who ----------------------------------------------------------------------------
    def identify(self, token: str) -> dict[str, Any] | None:
        """The backend's ``/api/auth/me`` for ``token`` (None when it is not valid), kept
        for a few seconds; with an empty token, what anyone is allowed."""
        now = time.monotonic()
        with self._lock:
            hit = self._people.get(token)
            if hit is not None and hit[1] > now:
                return hit[0]
        try:
            found = self.client.me(token or None)
        except ApiError as exc:
            if exc.status != 401:
                raise
            found = None
        with self._lock:
            self._people[token] = (found, now + _CACHE_S)
            while len(self._people) > _CACHE_MAX:
                self._people.popitem(last=False)
        return found

    def forget(self, token: str) -> None:
        with self._lock:
            self._people.pop(token, None)

    # -- the gate -----------------------------------------------------------------------
    def check(self) -> Response | None:
        """``before_request``: None lets the request through (module docstring)."""
        request = flask.request
        relative = request.path[len(self.base) :] if request.path.startswith(self.base) else ""
        if relative.startswith(_OPEN_PREFIXES) or relative in _OPEN_PATHS:
            return None
        token = request.cookies.get(SESSION_COOKIE, "")
        try:
            person = self.identify(token) if token else None
            anyone = None if person else self.identify("")
        except ApiError as exc:
            return _json({"error": f"the backend cannot be reached: {exc}"}, 503)
        if person is None and not (anyone and anyone.get("public_reads")):
            if relative.startswith("_dash-"):
                return _json({"error": "sign in first"}, 401)
            return flask.redirect(f"{self.base}login?next={quote(request.full_path.rstrip('?'))}")
        if person is not None and request.method == "POST" and not self._csrf_ok():
            return _json({"error": "the request did not come from this dashboard's pages"}, 403)
        flask.g.session_token = token if person else None
        flask.g.person = person
        return None

    @staticmethod
    def _csrf_ok() -> bool:
        request = flask.request
        expected = request.cookies.get(CSRF_COOKIE, "")
        given = request.headers.get(CSRF_HEADER) or request.form.get("csrf", "")
        return bool(expected) and secrets.compare_digest(given.encode(), expected.encode())

    def _same_origin(self) -> bool:
        origin = flask.request.headers.get("Origin")
        return origin is None or urlsplit(origin).netloc == flask.request.host

    # -- pages --------------------------------------------------------------------------
    def login(self) -> Response | str:
        request = flask.request
        target = _safe_next(request.args.get("next", ""), self.base)
        if request.method == "GET":
            return _login_page(self.base, target, "")
        if not self._same_origin():
            return _json({"error": "sign-in from another site is refused"}, 403)
        if _oversized():
            return _json({"error": f"a sign-in form holds at most {FORM_MAX_BYTES} bytes"}, 413)
        user = request.form.get("user", "").strip() or None
        try:
            created = self.client.sign_in(
                user, request.form.get("password", ""), request.remote_addr
            )
        except ApiError as exc:
            return flask.make_response(
                _login_page(self.base, target, str(exc)), 429 if exc.status == 429 else 401
            )
        response = flask.redirect(target)
        expires = datetime.fromisoformat(created["expires_at"])
        max_age = max(0, int((expires - datetime.now(timezone.utc)).total_seconds()))
        for name, value, http_only in (
            (SESSION_COOKIE, created["token"], True),
            (CSRF_COOKIE, secrets.token_urlsafe(24), False),
        ):
            response.set_cookie(
                name,
                value,
                max_age=max_age,
                path=self.base,
                httponly=http_only,
                samesite="Strict",
                secure=self.secure,
            )
        return response

    def logout(self) -> Response:
        if _oversized():
            return _json({"error": f"a sign-out form holds at most {FORM_MAX_BYTES} bytes"}, 413)
        if not self._same_origin() or not self._csrf_ok():
            return _json({"error": "sign-out from another site is refused"}, 403)
        token = flask.request.cookies.get(SESSION_COOKIE, "")
        self.forget(token)
        if token:  # an ended session (expired, signed out elsewhere) has nothing to undo
            with contextlib.suppress(ApiError):
                self.client.sign_out(token)
        response = flask.redirect(f"{self.base}login")
        for name in (SESSION_COOKIE, CSRF_COOKIE):
            response.delete_cookie(name, path=self.base, samesite="Strict", secure=self.secure)
        return response


def _oversized() -> bool:
    """Whether the request's body is longer than a sign-in form may be, or of no stated
    length (a chunked body is read no further than that either)."""
    length = flask.request.content_length
    return length is None or length > FORM_MAX_BYTES


def install(app: Dash, gate: Gate) -> None:
    """The gate, the sign-in and sign-out routes, and the script that goes to the sign-in
    page when a callback is refused for want of a session."""
    server = app.server
    server.before_request(gate.check)
    server.add_url_rule(
        f"{gate.base}login", "pipestudio_login", gate.login, methods=["GET", "POST"]
    )
    server.add_url_rule(f"{gate.base}logout", "pipestudio_logout", gate.logout, methods=["POST"])
    app.index_string = app.index_string.replace(
        "{%scripts%}", "{%scripts%}" + _ON_401.replace("BASE", gate.base)
    )


def session_token() -> str | None:
    """The signed-in person's session token, inside a request the gate let through."""
    return flask.g.get("session_token") if flask.has_request_context() else None


def person() -> dict[str, Any] | None:
    """Who is signed in (the backend's ``/api/auth/me``), inside a request."""
    return flask.g.get("person") if flask.has_request_context() else None


def csrf_token() -> str:
    return flask.request.cookies.get(CSRF_COOKIE, "") if flask.has_request_context() else ""


def _safe_next(target: str, base: str) -> str:
    """Where to go after signing in: a path of this dashboard, never another site (a
    browser reads ``/\\evil`` as ``//evil``, so backslashes and control characters go)."""
    parts = urlsplit(target)
    if (
        parts.scheme
        or parts.netloc
        or not target.startswith(base)
        or target.startswith("//")
        or "\\" in target
        or any(ord(c) < 32 for c in target)
    ):
        return base
    return target


def _json(body: dict[str, Any], status: int) -> Response:
    response = flask.jsonify(body)
    response.status_code = status
    return response


_ON_401 = """<script>
(function () {
  var fetch0 = window.fetch;
  window.fetch = function () {
    return fetch0.apply(this, arguments).then(function (response) {
      if (response.status === 401 && String(response.url).indexOf("_dash-") >= 0) {
        window.location = "BASElogin?next=" + encodeURIComponent(
          window.location.pathname + window.location.search);
      }
      return response;
    });
  };
})();
</script>"""


def _login_page(base: str, target: str, error: str) -> str:
    notice = (
        f'<div class="ps-message ps-error" role="alert">{html.escape(error)}</div>' if error else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>PipeStudio · Sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{html.escape(base)}assets/pipestudio.css"></head>
<body><header class="ps-header"><span class="ps-brand">PipeStudio</span></header>
<main class="ps-page ps-signin"><h2>Sign in</h2>{notice}
<form method="post" action="{html.escape(base)}login?next={html.escape(quote(target))}"
      id="signin-form">
<div class="ps-field"><label class="ps-label" for="signin-user">Name</label>
<input class="ps-input" id="signin-user" name="user" autocomplete="username"
       placeholder="empty: sign in with the API token"></div>
<div class="ps-field"><label class="ps-label" for="signin-password">Password or API token
</label><input class="ps-input" id="signin-password" name="password" type="password"
       autocomplete="current-password" required autofocus></div>
<button class="ps-button" id="signin-submit" type="submit">Sign in</button>
</form></main></body></html>"""
