"""Runs page: launch an approved plan, watch it live, and decide on repartition proposals."""

import hashlib
import json
from typing import Any

from dash import ALL, Dash, Input, Output, State, ctx, dcc, html, no_update
from plotly.utils import PlotlyJSONEncoder

from pipestudio.dashboard import monitor
from pipestudio.dashboard.api import ApiError
from pipestudio.dashboard.context import Context, serving_context
from pipestudio.dashboard.pages import runs_actions as actions
from pipestudio.dashboard.widgets import bump, field, graph, message, section

PATH = "/runs"
NAME = "Runs"
GRAPHS = (
    "runs-timeline-graph",
    "runs-throughput-graph",
    "runs-busy-graph",
    "runs-memory-graph",
    "runs-swap-graph",
    "runs-loss-graph",
)


def _button(label: str, component_id: str, secondary: bool = False) -> html.Button:
    return html.Button(
        label, id=component_id, className="ps-button ps-secondary" if secondary else "ps-button"
    )


def first_view(context: Context | None) -> dict[str, Any]:
    """What the page's first calls would draw (the plan and run lists, the newest run's
    monitor), for its layout to draw at once: each call is a round trip and a render after
    the page's on a small machine. With no context (Dash checking the layout), the
    monitor with no run picked."""
    plans: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    selected = None
    if context is not None:
        plans, runs, selected = actions.options(context, None)
    if context is None:
        result = [*actions.no_run_figures(), "No run selected.", html.Div(), None, False, no_update]
    else:
        result = actions.tick(context, selected, runs)
    count = len(GRAPHS)
    relabelled = result[count + 4]
    return {
        "plans": plans,
        "runs": runs if relabelled is no_update else relabelled,
        "selected": selected,
        "figures": dict(zip(GRAPHS, result[:count], strict=True)),
        "status": result[count],
        "fidelity": result[count + 1],
        "proposals": result[count + 2],
        "ended": result[count + 3],
        "proposals_key": proposals_key(result[count + 2]),
    }


def proposals_key(proposals: Any) -> str:
    """What the proposals on screen were drawn from: a tick draws them again only when
    it changes (module docstring of ``register_callbacks``' tick)."""
    return hashlib.blake2b(
        json.dumps(proposals, cls=PlotlyJSONEncoder).encode(), digest_size=16
    ).hexdigest()


def layout(**_: Any) -> html.Div:
    first = first_view(serving_context())
    launch = html.Div(
        [
            field(
                "Approved plan",
                dcc.Dropdown(
                    id="runs-plan",
                    options=first["plans"],
                    style={"minWidth": "300px"},
                    placeholder=(
                        "pick an approved plan"
                        if first["plans"]
                        else "none yet: approve a plan on the Planner page"
                    ),
                ),
            ),
            field(
                "Model",
                dcc.Input(
                    id="runs-model",
                    className="ps-input",
                    placeholder="built-in name or module:factory",
                ),
                "what the workers build; its layers must be the plan's",
            ),
            field(
                "Model arguments",
                dcc.Input(
                    id="runs-model-args",
                    className="ps-input",
                    style={"width": "320px"},
                    placeholder="layers=4 width=64",
                ),
            ),
            field(
                "Steps",
                dcc.Input(
                    id="runs-steps",
                    type="number",
                    min=1,
                    step=1,
                    value=50,
                    className="ps-input",
                    style={"width": "90px"},
                ),
            ),
            _button("Launch", "runs-launch"),
        ],
        className="ps-row",
    )
    watch = html.Div(
        [
            field(
                "Run",
                dcc.Dropdown(
                    id="runs-select",
                    options=first["runs"],
                    value=first["selected"],
                    style={"minWidth": "360px"},
                    placeholder="no runs yet",
                ),
            ),
            _button("Stop", "runs-stop", secondary=True),
            _button("Export Chrome trace (measured)", "runs-export-trace", secondary=True),
            html.Span("PNG: the camera icon above each chart.", className="ps-hint"),
            dcc.Download(id="runs-download"),
        ],
        className="ps-row",
    )
    figures = first["figures"]
    charts = [html.Div(graph(name, figures[name]), className="ps-col") for name in GRAPHS[1:]]
    return html.Div(
        [
            section("Launch", launch, html.Div(id="runs-launch-status")),
            section(
                "Live monitor",
                watch,
                html.Div(first["status"], id="runs-status", className="ps-prediction"),
                graph(GRAPHS[0], figures[GRAPHS[0]]),
                html.Div(charts, className="ps-row"),
            ),
            section(
                "Prediction against measurement", html.Div(first["fidelity"], id="runs-fidelity")
            ),
            section(
                "Repartition proposals",
                html.Div(
                    [
                        _button(
                            "Propose a repartition from the measurements",
                            "runs-propose",
                            secondary=True,
                        )
                    ],
                    className="ps-row",
                ),
                html.Div(id="runs-decision-status"),
                html.Div(first["proposals"], id="runs-proposals"),
            ),
            dcc.Interval(id="runs-interval", interval=2000, disabled=first["ended"]),
            dcc.Store(id="runs-changed", data=0),
            dcc.Store(id="runs-proposals-shown", data=first["proposals_key"]),
        ]
    )


def propose(context: Context, run_id: int | None) -> Any:
    """Send the online planner the run's calibrated profile and cluster: the plan's profile
    with each stage's op times as the run measured them, and the links as its transfers
    measured them (``GET /api/runs/{id}/calibrated-profile``)."""
    if run_id is None:
        return message("Pick a running run first.")
    try:
        calibrated = context.client.calibrated_profile(run_id)
        created = context.client.create_proposal(
            {
                "run_id": run_id,
                "observed_profile": calibrated["profile"],
                "cluster": calibrated.get("cluster"),
            }
        )
    except ApiError as exc:
        return message(f"No proposal:\n{exc}", "error")
    verdict = "worth it" if created["worthwhile"] else "not worth it"
    return message(
        f"Proposal {created['id']}: gain {created['gain_ms']:.2f} ms per step, "
        f"{verdict} (from steps {calibrated['steps'][0]}..{calibrated['steps'][1]}"
        " calibrated).",
        "ok",
    )


def register_callbacks(app: Dash, context: Context) -> None:
    @app.callback(
        Output("runs-plan", "options"),
        Output("runs-select", "options"),
        Output("runs-select", "value"),
        Input("runs-changed", "data"),
        State("runs-select", "value"),
        prevent_initial_call=True,  # the layout draws the first (``first_view``)
    )
    def _options(_: int, selected: int | None) -> Any:
        return actions.options(context, selected)

    @app.callback(
        Output("runs-model", "value"),
        Output("runs-model-args", "value"),
        Input("runs-plan", "value"),
        prevent_initial_call=True,
    )
    def _defaults(plan_id: int | None) -> Any:
        return actions.launch_defaults(context, plan_id)

    @app.callback(
        Output("runs-launch-status", "children"),
        Output("runs-changed", "data", allow_duplicate=True),
        Output("runs-select", "value", allow_duplicate=True),
        Input("runs-launch", "n_clicks"),
        State("runs-plan", "value"),
        State("runs-model", "value"),
        State("runs-model-args", "value"),
        State("runs-steps", "value"),
        State("runs-changed", "data"),
        prevent_initial_call=True,
    )
    def _launch(
        _: int,
        plan_id: int | None,
        model: str | None,
        args: str | None,
        steps: int | None,
        changed: int,
    ) -> Any:
        notice, run_id = actions.launch(context, plan_id, model, args, steps)
        return notice, (bump(changed) if run_id else no_update), run_id or no_update

    # The picker's label of the watched run follows its state (starting, running, ...).
    # The proposals are rendered again only when they change: a card rendered anew resets
    # its buttons, and a click that lands while a tick's answer is on its way is lost.
    @app.callback(
        [Output(name, "figure") for name in GRAPHS],
        Output("runs-status", "children"),
        Output("runs-fidelity", "children"),
        Output("runs-proposals", "children"),
        Output("runs-interval", "disabled"),
        Output("runs-select", "options", allow_duplicate=True),
        Output("runs-proposals-shown", "data"),
        Input("runs-interval", "n_intervals"),
        Input("runs-select", "value"),
        Input("runs-decision-status", "children"),
        State("runs-select", "options"),
        State("runs-proposals-shown", "data"),
        prevent_initial_call=True,  # the layout draws the first (``first_view``)
    )
    def _tick(
        _: int | None,
        run_id: int | None,
        __: Any,
        run_options: list[dict[str, Any]] | None,
        shown: str | None,
    ) -> Any:
        result = actions.tick(context, run_id, run_options)
        proposals = len(GRAPHS) + 2
        key = proposals_key(result[proposals])
        if key == shown:
            result[proposals] = no_update
        return [*result, key]

    @app.callback(
        Output("runs-decision-status", "children"),
        Input({"type": "runs-proposal-approve", "index": ALL}, "n_clicks"),
        Input({"type": "runs-proposal-reject", "index": ALL}, "n_clicks"),
        Input("runs-propose", "n_clicks"),
        Input("runs-stop", "n_clicks"),
        Input("runs-select", "value"),
        prevent_initial_call=True,
    )
    def _decide(
        approvals: list[int | None],
        rejections: list[int | None],
        _: int,
        __: int,
        run_id: int | None,
    ) -> Any:
        trigger = ctx.triggered_id
        if trigger == "runs-select":
            return ""  # what it said was about the run watched before
        if trigger == "runs-propose":
            return propose(context, run_id)
        if trigger == "runs-stop":
            return actions.stop(context, run_id)
        if not isinstance(trigger, dict) or not any(approvals + rejections):
            return no_update
        return actions.decide(context, trigger["index"], trigger["type"] == "runs-proposal-approve")

    @app.callback(
        Output("runs-download", "data"),
        Input("runs-export-trace", "n_clicks"),
        State("runs-select", "value"),
        prevent_initial_call=True,
    )
    def _export(_: int, run_id: int | None) -> Any:
        if run_id is None:
            return no_update
        view = monitor.fetch_view(context.client, run_id)
        return dcc.send_string(
            monitor.measured_trace(view.ops, run_id), f"run{run_id}.measured.trace.json"
        )
