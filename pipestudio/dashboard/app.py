"""The dashboard's shell: the Dash app, its navigation, and the three pages.

``create_dashboard(api_url, api_token)`` returns a Dash app that talks to the backend at
``api_url`` over HTTP. Its Flask server (``app.server``) is a WSGI application, so the
backend can mount it in its own process (``pipestudio serve``) or it can run apart:
``python -m pipestudio.dashboard --api-url http://host:8000``.
"""

import dash
from dash import Dash, Input, Output, dcc, html

from pipestudio.dashboard.api import ApiClient, ApiError
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.pages import planner, profiles, runs

PAGES = (profiles, planner, runs)


def create_dashboard(api_url: str, api_token: str | None = None, *,
                     client: ApiClient | None = None,
                     url_base_pathname: str = "/") -> Dash:
    """The dashboard for the backend at ``api_url``; ``client`` replaces the HTTP client
    (tests pass one bound to an in-process backend)."""
    context = Context(client or ApiClient(api_url, api_token))
    app = Dash(__name__, use_pages=True, pages_folder="", title="PipeStudio",
               url_base_pathname=url_base_pathname, suppress_callback_exceptions=True)
    for order, page in enumerate(PAGES):
        dash.register_page(page.__name__, path=page.PATH, name=page.NAME, order=order,
                           title=f"PipeStudio · {page.NAME}", layout=page.layout)
        page.register_callbacks(app, context)
    # The start page is the profiles page: everything begins with a profile.
    dash.register_page(f"{profiles.__name__}.start", path="/", name="Start",
                       title="PipeStudio", layout=profiles.layout, order=len(PAGES))
    app.layout = shell()
    _register_health(app, context)
    app.server.config["PIPESTUDIO_CONTEXT"] = context
    return app


def shell() -> html.Div:
    links = [dcc.Link(page.NAME, href=dash.get_relative_path(page.PATH), id=f"nav-{page.PATH[1:]}")
             for page in PAGES]
    return html.Div([
        dcc.Location(id="url"),
        html.Header([html.Span("PipeStudio", className="ps-brand"), *links,
                     html.Span(id="nav-health", className="ps-health")],
                    className="ps-header"),
        html.Main(dash.page_container, className="ps-page"),
        dcc.Interval(id="nav-health-interval", interval=5000),
    ])


def health_text(context: Context) -> str:
    try:
        health = context.client.health()
    except ApiError as exc:
        return f"backend unreachable: {exc}"
    return (f"backend {health.get('version', '?')} · {health.get('database', '?')} · "
            f"{health.get('workers_online', 0)} worker(s) online")


def _register_health(app: Dash, context: Context) -> None:
    @app.callback(Output("nav-health", "children"), Input("nav-health-interval", "n_intervals"))
    def _health(_: int | None) -> str:
        return health_text(context)
