"""Planner page: ask the planners, compare their plans, drag stage boundaries, set layer
policies, and save and approve the plan, with the prediction redrawn at every change."""

from typing import Any

from dash import Dash, Input, Output, State, dcc, html

from pipestudio.dashboard.context import Context, serving_context
from pipestudio.dashboard.pages import planner_callbacks
from pipestudio.dashboard.widgets import chart_box, field, section
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.formats.plan import SCHEDULES

#: The schedule choices: each schedule a plan can have, and ``auto``, which asks the
#: planners to choose (``planner/algorithms/schedules.py``).
SCHEDULE_CHOICES = [
    {"label": "auto (planners choose)", "value": "auto"},
    *({"label": name, "value": name} for name in SCHEDULES),
]

PATH = "/planner"
NAME = "Planner"


def _button(label: str, component_id: str, secondary: bool = False) -> html.Button:
    return html.Button(
        label, id=component_id, className="ps-button ps-secondary" if secondary else "ps-button"
    )


def _request_controls(choices: dict[str, Any], form: dict[str, Any]) -> html.Div:
    def number(component_id: str, value: int | None, minimum: int = 1) -> dcc.Input:
        return dcc.Input(
            id=component_id,
            type="number",
            min=minimum,
            step=1,
            value=value,
            className="ps-input",
            style={"width": "110px"},
        )

    return html.Div(
        [
            field(
                "Profile",
                dcc.Dropdown(
                    id="planner-profile",
                    placeholder="pick a profile",
                    options=choices["profiles"],
                    value=form["profile"],
                    style={"minWidth": "260px"},
                ),
            ),
            field(
                "Cluster",
                dcc.Dropdown(
                    id="planner-cluster",
                    style={"minWidth": "220px"},
                    options=choices["clusters"],
                    value=form["cluster"],
                    placeholder="none: free links",
                ),
                "none: links are free; memory below",
            ),
            field(
                "Memory per device",
                dcc.Input(
                    id="planner-memory",
                    value=form["memory"],
                    debounce=True,
                    className="ps-input",
                    placeholder="e.g. 16GiB",
                    style={"width": "120px"},
                ),
                "empty: unlimited (with a cluster, its devices' own)",
            ),
            field("Stages", number("planner-stages", form["stages"])),
            field("Micro-batches per step", number("planner-microbatches", form["microbatches"])),
            field(
                "Micro-batch size",
                number("planner-microbatch-size", form["microbatch-size"]),
                "samples; empty: the profile's",
            ),
            field(
                "Schedule",
                dcc.Dropdown(
                    id="planner-schedule",
                    options=SCHEDULE_CHOICES,
                    value=form["schedule"],
                    clearable=False,
                    style={"width": "250px"},
                ),
                "auto: the planners pick the fastest that fits",
            ),
            field(
                "Chunks per device",
                number("planner-virtual-stages", form["virtual-stages"]),
                "interleaved-1f1b only",
            ),
            field(
                "Optimizer",
                dcc.Dropdown(
                    id="planner-optimizer",
                    value=form["optimizer"],
                    clearable=False,
                    options=["sgd", "momentum", "adam"],
                    style={"width": "130px"},
                ),
            ),
        ],
        className="ps-row",
    )


def _make_controls(form: dict[str, Any]) -> html.Div:
    return html.Div(
        [
            _button("Equal layers per stage", "planner-template", secondary=True),
            field(
                "Planner",
                dcc.Dropdown(
                    id="planner-algorithm",
                    options=list(PLANNERS),
                    value=form["algorithm"],
                    clearable=False,
                    style={"width": "170px"},
                ),
            ),
            _button("Run this planner", "planner-run"),
            _button("Run all planners and compare", "planner-run-all", secondary=True),
            dcc.Checklist(
                id="planner-straight",
                className="ps-check",
                options=[
                    {"label": " one device per stage (no replicated stages)", "value": "straight"}
                ],
                value=form["straight"],
            ),
        ],
        className="ps-row",
    )


def _editor_controls(first: dict[str, Any]) -> html.Div:
    shape = first.get("slider") or {"min": 1, "max": 2, "value": [], "marks": None}
    slider = dcc.RangeSlider(
        id="planner-boundaries",
        min=shape["min"],
        max=shape["max"],
        marks=shape["marks"],
        step=1,
        value=shape["value"],
        pushable=1,
        allowCross=False,
        updatemode="mouseup",
        tooltip={"placement": "bottom", "always_visible": False},
    )
    policy = html.Div(
        [
            field(
                "Layers",
                dcc.Dropdown(
                    id="planner-policy-layers",
                    multi=True,
                    placeholder="pick layers",
                    style={"minWidth": "320px"},
                ),
            ),
            field(
                "Memory policy",
                dcc.RadioItems(
                    id="planner-policy-choice",
                    value="recompute",
                    inline=True,
                    options=["keep", "recompute", "swap"],
                ),
            ),
            _button("Apply to these layers", "planner-policy-apply", secondary=True),
            html.Div(first.get("policies"), id="planner-policy-summary", className="ps-hint"),
        ],
        className="ps-row",
    )
    return html.Div(
        [
            html.Div(
                "Drag the handles to move stage boundaries (layer index where each stage "
                "after the first begins); the prediction follows.",
                className="ps-hint",
            ),
            html.Div(slider, className="ps-slider"),
            html.Div(id="planner-boundaries-live", className="ps-hint"),
            policy,
        ]
    )


def _save_controls() -> html.Div:
    return html.Div(
        [
            field(
                "Plan name",
                dcc.Input(
                    id="planner-name",
                    className="ps-input",
                    placeholder="default: model, planner, stages",
                ),
            ),
            _button("Save as draft", "planner-save", secondary=True),
            _button("Approve", "planner-approve"),
            _button("Export plan JSON", "planner-export-plan", secondary=True),
            _button("Export Chrome trace (predicted)", "planner-export-trace", secondary=True),
            html.Span("PNG: the camera icon above each chart.", className="ps-hint"),
            dcc.Download(id="planner-download"),
            # approving a plan that would not run as planned asks first (``planning.save_plan``)
            dcc.ConfirmDialog(id="planner-approve-confirm"),
        ],
        className="ps-row",
    )


def layout(plan: str | None = None, **_: Any) -> html.Div:
    """The page, its profile and cluster choices filled in (the profile of the plan that
    ``?plan=ID`` opens, else the newest) and its first plan and prediction drawn
    (``planner_callbacks.first_view``): the charts are then one round trip away."""
    context = serving_context()
    search = f"?plan={plan}" if plan else None
    choices = (
        planner_callbacks.choices(context, search)
        if context is not None
        else planner_callbacks.NO_CHOICES
    )
    first: dict[str, Any] = (
        planner_callbacks.first_view(context, choices["profile"], search)
        if context is not None
        else {"form": planner_callbacks.FORM_DEFAULTS}
    )
    shown, _figure, _openable = planner_callbacks.compare_view([])  # nothing compared yet
    compare = html.Div(
        [
            html.Div(shown, id="planner-compare-table"),
            chart_box("planner-compare-graph"),
            html.Div(
                [
                    field(
                        "Open in the editor",
                        dcc.Dropdown(id="planner-compare-pick", style={"minWidth": "200px"}),
                    ),
                    _button("Open", "planner-compare-open", secondary=True),
                    field(
                        "Side by side: left",
                        dcc.Dropdown(id="planner-side-a", style={"minWidth": "200px"}),
                    ),
                    field("right", dcc.Dropdown(id="planner-side-b", style={"minWidth": "200px"})),
                ],
                className="ps-row",
            ),
            html.Div(
                [
                    html.Div(chart_box("planner-side-a-graph"), className="ps-col"),
                    html.Div(chart_box("planner-side-b-graph"), className="ps-col"),
                ],
                className="ps-row",
            ),
        ]
    )
    return html.Div(
        [
            section(
                "What to plan",
                _request_controls(choices, first["form"]),
                _make_controls(first["form"]),
                dcc.Loading(html.Div(first.get("notice"), id="planner-status"), type="dot"),
            ),
            section(
                "Plan",
                html.Div(
                    first.get("prediction"),
                    id="planner-prediction",
                    className=first.get("prediction_class", "ps-prediction"),
                ),
                _editor_controls(first),
                _save_controls(),
                html.Div(id="planner-save-status"),
                html.Div(
                    [
                        html.Div(chart_box("planner-compute-graph"), className="ps-col"),
                        html.Div(chart_box("planner-memory-graph"), className="ps-col"),
                    ],
                    className="ps-row",
                ),
                chart_box("planner-gantt-graph"),
                chart_box("planner-memory-time-graph"),
            ),
            section("Compare plans", compare),
            dcc.Store(id="planner-editor", data=first.get("editor")),
            dcc.Store(id="planner-candidates", data=[]),
            dcc.Store(id="planner-drawn", data=first.get("drawn")),
        ]
    )


def register_callbacks(app: Dash, context: Context) -> None:
    planner_callbacks.register(app, context)
    app.clientside_callback(
        """function(value, max) {
            if (!value || !value.length) { return ""; }
            const cuts = [0].concat(value, [max + 1]);
            const sizes = cuts.slice(1).map((c, i) => c - cuts[i]);
            return "Layers per stage: " + sizes.join(" | ");
        }""",
        Output("planner-boundaries-live", "children"),
        Input("planner-boundaries", "drag_value"),
        State("planner-boundaries", "max"),
    )
