"""Plans page: every stored plan with its prediction, state and runs; open one in the
Planner, duplicate, rename, move back to draft, delete."""

from typing import Any

import dash
from dash import Dash, Input, Output, State, dcc, html, no_update

from pipestudio.dashboard.api import ApiError
from pipestudio.dashboard.components.compare import replicas_text, summary_peaks
from pipestudio.dashboard.components.style import format_bytes
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.widgets import bump, field, message, section, table

PATH = "/plans"
NAME = "Plans"
COLUMNS = (
    "id",
    "name",
    "profile",
    "planner",
    "precision",
    "schedule",
    "stages",
    "replicas",
    "predicted step (ms)",
    "largest peak",
    "fits",
    "state",
    "runs",
)


def layout(**_: Any) -> html.Div:
    actions = html.Div(
        [
            field(
                "Plan",
                dcc.Dropdown(
                    id="plans-select", placeholder="pick a plan", style={"minWidth": "320px"}
                ),
            ),
            html.Div(
                dcc.Link(
                    "Open in the Planner",
                    id="plans-open",
                    href="",
                    className="ps-button ps-link-button",
                ),
                className="ps-field",
            ),
            html.Button("Duplicate", id="plans-duplicate", className="ps-button ps-secondary"),
            field(
                "New name",
                dcc.Input(id="plans-name", className="ps-input", placeholder="a new name"),
            ),
            html.Button("Rename", id="plans-rename", className="ps-button ps-secondary"),
            html.Button("Back to draft", id="plans-draft", className="ps-button ps-secondary"),
            html.Button("Delete", id="plans-delete", className="ps-button ps-secondary"),
        ],
        className="ps-row",
    )
    return html.Div(
        [
            section("Plans", html.Div(id="plans-list"), actions, html.Div(id="plans-status")),
            dcc.Store(id="plans-changed", data=0),
        ]
    )


def plan_rows(
    plans: list[dict[str, Any]], profiles: dict[int, str], runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row of text per plan, keyed by ``COLUMNS``."""
    ran: dict[int, list[int]] = {}
    for run in runs:
        ran.setdefault(run["plan_id"], []).append(run["id"])
    rows = []
    for plan in sorted(plans, key=lambda p: p["id"]):
        document, summary = plan["document"], plan.get("summary") or {}
        replicas = [stage.get("replicas", 1) for stage in document["stages"]]
        peaks = summary_peaks(summary)
        rows.append(
            {
                "id": str(plan["id"]),
                "name": plan["name"],
                "profile": profiles.get(plan["profile_id"], str(plan["profile_id"])),
                "planner": plan["planner"],
                "precision": plan.get("precision", "fp32"),
                "schedule": document["schedule"],
                "stages": str(len(replicas)),
                "replicas": replicas_text(replicas),
                "predicted step (ms)": (
                    f"{summary['step_time_ms']:.2f}" if "step_time_ms" in summary else "—"
                ),
                "largest peak": format_bytes(max(peaks)) if peaks else "—",
                "fits": "—" if "fits" not in summary else ("yes" if summary["fits"] else "NO"),
                "state": plan["state"],
                "runs": ", ".join(f"run {r}" for r in sorted(ran.get(plan["id"], []))) or "—",
            }
        )
    return rows


def list_plans(
    context: Context, selected: int | None
) -> tuple[Any, list[dict[str, Any]], int | None]:
    """The table, the picker's options and the plan picked (kept when it still exists)."""
    try:
        plans = context.client.plans()
        profiles = {p["id"]: p["name"] for p in context.client.profiles()}
        runs = context.client.runs()
    except ApiError as exc:
        return message(f"Cannot read the plans: {exc}", "error"), [], None
    options = [
        {"label": f"{p['id']}: {p['name']} ({p['state']})", "value": p["id"]}
        for p in sorted(plans, key=lambda p: p["id"])
    ]
    ids = [p["id"] for p in plans]
    rows = plan_rows(plans, profiles, runs)
    return (
        table(COLUMNS, rows, "No plans yet: make one on the Planner page.", "plans-table"),
        options,
        selected if selected in ids else (max(ids) if ids else None),
    )


def act(
    context: Context, action: str | None, plan_id: int | None, name: str | None
) -> tuple[Any, bool]:
    """A button's action on plan ``plan_id``: (the notice, whether the list changed)."""
    if plan_id is None:
        return message("Pick a plan first."), False
    try:
        if action == "plans-duplicate":
            plan = context.client.plan(plan_id)
            copy = context.client.create_plan(
                {
                    "profile_id": plan["profile_id"],
                    "cluster_id": plan["cluster_id"],
                    "name": f"{plan['name']} (copy)"[:200],
                    "author": "dashboard",
                    "plan": plan["document"],
                }
            )
            return message(f"Plan {copy['id']} is a draft copy of plan {plan_id}.", "ok"), True
        if action == "plans-rename":
            new_name = (name or "").strip()
            if not new_name:
                return message("Type the new name first."), False
            context.client.update_plan(plan_id, {"name": new_name, "author": "dashboard"})
            return message(f"Plan {plan_id} is now called {new_name!r}.", "ok"), True
        if action == "plans-draft":
            context.client.update_plan(plan_id, {"state": "draft", "author": "dashboard"})
            return message(f"Plan {plan_id} is a draft: edit it in the Planner.", "ok"), True
        if action == "plans-delete":
            context.client.delete_plan(plan_id)
            return message(f"Deleted plan {plan_id}.", "ok"), True
    except ApiError as exc:
        said = str(exc)  # the backend's reason often names the plan itself
        named = said.lower().startswith(f"plan {plan_id} ")
        return message(said if named else f"Plan {plan_id}: {said}", "error"), False
    return no_update, False


def register_callbacks(app: Dash, context: Context) -> None:
    @app.callback(
        Output("plans-list", "children"),
        Output("plans-select", "options"),
        Output("plans-select", "value"),
        Input("plans-changed", "data"),
        State("plans-select", "value"),
    )
    def _list(_: int, selected: int | None) -> Any:
        return list_plans(context, selected)

    @app.callback(Output("plans-open", "href"), Input("plans-select", "value"))
    def _open(plan_id: int | None) -> str:
        return "" if plan_id is None else dash.get_relative_path(f"/planner?plan={plan_id}")

    @app.callback(
        Output("plans-status", "children"),
        Output("plans-changed", "data", allow_duplicate=True),
        Input("plans-duplicate", "n_clicks"),
        Input("plans-rename", "n_clicks"),
        Input("plans-draft", "n_clicks"),
        Input("plans-delete", "n_clicks"),
        State("plans-select", "value"),
        State("plans-name", "value"),
        State("plans-changed", "data"),
        prevent_initial_call=True,
    )
    def _act(
        _: int, __: int, ___: int, ____: int, plan_id: int | None, name: str | None, changed: int
    ) -> Any:
        notice, moved = act(context, dash.ctx.triggered_id, plan_id, name)
        return notice, bump(changed) if moved else no_update
