"""The dashboard's shell: the Dash app, its navigation, sign-in, and its pages.

``create_dashboard(api_url)`` returns a Dash app that talks to the backend at ``api_url``
over HTTP, as the signed-in person (``signin.py``). Its Flask server (``app.server``) is a
WSGI application, so the backend mounts it in its own process (``pipestudio serve``), or
another WSGI server can serve it apart from the backend.
"""

import logging
from typing import Any

import dash
import flask
from dash import Dash, Input, Output, dcc, html
from dash.exceptions import DependencyException
from werkzeug.exceptions import HTTPException

from pipestudio.dashboard import signin
from pipestudio.dashboard.api import ApiClient, ApiError
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.pages import machines, planner, plans, profiles, runs

PAGES = (profiles, planner, plans, runs, machines)
log = logging.getLogger("pipestudio.dashboard")


def create_dashboard(
    api_url: str,
    *,
    client: ApiClient | None = None,
    url_base_pathname: str = "/",
    cookie_secure: bool = False,
) -> Dash:
    """The dashboard for the backend at ``api_url``; ``client`` replaces the HTTP client
    (tests pass one bound to an in-process backend). ``cookie_secure``: the dashboard is
    served over HTTPS, so its cookies may travel over HTTPS only."""
    client = client or ApiClient(api_url, credential=signin.session_token)
    context = Context(client)
    app = Dash(
        __name__,
        use_pages=True,
        pages_folder="",
        title="PipeStudio",
        url_base_pathname=url_base_pathname,
        suppress_callback_exceptions=True,
    )
    for order, page in enumerate(PAGES):
        dash.register_page(
            page.__name__,
            path=page.PATH,
            name=page.NAME,
            order=order,
            title=f"PipeStudio · {page.NAME}",
            layout=page.layout,
        )
        page.register_callbacks(app, context)
    # The start page is the profiles page: everything begins with a profile.
    dash.register_page(
        f"{profiles.__name__}.start",
        path="/",
        name="Start",
        title="PipeStudio",
        layout=profiles.layout,
        order=len(PAGES),
    )
    app.layout = shell()
    _register_health(app, context)
    _register_person(app)
    signin.install(app, signin.Gate(client, url_base_pathname, secure=cookie_secure))
    _answer_errors(app)
    app.server.config["PIPESTUDIO_CONTEXT"] = context
    return app


def shell() -> html.Div:
    links = [
        dcc.Link(page.NAME, href=dash.get_relative_path(page.PATH), id=f"nav-{page.PATH[1:]}")
        for page in PAGES
    ]
    return html.Div(
        [
            dcc.Location(id="url"),
            html.Header(
                [
                    html.Span("PipeStudio", className="ps-brand"),
                    *links,
                    html.Span(id="nav-health", className="ps-health"),
                    html.Span(id="nav-user", className="ps-user"),
                ],
                className="ps-header",
            ),
            html.Main(dash.page_container, className="ps-page"),
            dcc.Interval(id="nav-health-interval", interval=5000),
            # Plotly's 3.5 MB bundle loads with the first chart on screen; a hidden one in the
            # shell loads it with the first page, so the first page with charts opens at once.
            dcc.Graph(
                id="nav-charts-preload", style={"display": "none"}, config={"staticPlot": True}
            ),
        ]
    )


def health_text(context: Context) -> str:
    try:
        health = context.client.health()
    except ApiError as exc:
        return f"backend unreachable: {exc}"
    return (
        f"backend {health.get('version', '?')} · {health.get('database', '?')} · "
        f"{health.get('workers_online', 0)} worker(s) online"
    )


def _register_health(app: Dash, context: Context) -> None:
    @app.callback(Output("nav-health", "children"), Input("nav-health-interval", "n_intervals"))
    def _health(_: int | None) -> str:
        return health_text(context)


def person_badge(person: dict[str, Any] | None, csrf: str) -> list[Any]:
    """Who is signed in, and the sign-out button (a form posting to ``logout``)."""
    if not person or not person.get("user"):
        return [
            dcc.Link(
                "Sign in", href=dash.get_relative_path("/login"), refresh=True, id="nav-signin"
            )
        ]
    return [
        html.Span(f"{person['user']} ({person['role']})", id="nav-user-name"),
        html.Form(
            [
                dcc.Input(type="hidden", name="csrf", value=csrf),
                html.Button(
                    "Sign out", type="submit", id="nav-signout", className="ps-button ps-small"
                ),
            ],
            method="POST",
            action=dash.get_relative_path("/logout"),
            className="ps-signout",
        ),
    ]


def _answer_errors(app: Dash) -> None:
    """A request the pages never send (a callback given values of the wrong kind, an
    asset path that leads nowhere) answers 400 or 404 in one log line, not 500 with a
    traceback."""

    def refused(exc: Exception) -> Any:
        if isinstance(exc, HTTPException):
            return exc
        if isinstance(exc, DependencyException):
            return flask.jsonify({"error": str(exc)[:200]}), 404
        log.warning(
            "%s %s refused: %s: %s",
            flask.request.method,
            flask.request.path,
            type(exc).__name__,
            str(exc)[:200],
        )
        log.debug("where it was refused", exc_info=exc)  # for who debugs a callback
        return flask.jsonify(
            {"error": f"this request cannot be answered: {type(exc).__name__}: {str(exc)[:200]}"}
        ), 400

    app.server.register_error_handler(Exception, refused)


def _register_person(app: Dash) -> None:
    @app.callback(Output("nav-user", "children"), Input("url", "pathname"))
    def _person(_: str | None) -> list[Any]:
        return person_badge(signin.person(), signin.csrf_token())
