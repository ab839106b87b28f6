"""The runs page's callbacks as plain functions: launch, the live tick, decisions."""

from typing import Any

from dash import html, no_update

from pipestudio.dashboard import monitor
from pipestudio.dashboard.api import ApiError
from pipestudio.dashboard.components.run_charts import WAITING
from pipestudio.dashboard.components.style import empty_figure, format_bytes
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.widgets import message

ENDED = ("finished", "failed", "stopped")
_TITLES = ("Measured schedule", "Throughput", "Compute per stage", "Peak memory per stage",
           "Recompute and swap per stage", "Training loss")


def options(context: Context, selected: int | None
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None]:
    """Approved plans to launch, runs to watch (newest first), and the run to show."""
    try:
        plans, runs = context.client.plans(), context.client.runs()
    except ApiError:
        return [], [], None
    plan_options = [{"label": f"{p['id']}: {p['name']}", "value": p["id"]}
                    for p in plans if p["state"] == "approved"]
    runs = sorted(runs, key=lambda r: r["id"], reverse=True)
    run_options = [{"label": run_label(r), "value": r["id"]} for r in runs]
    ids = [r["id"] for r in runs]
    return plan_options, run_options, selected if selected in ids else (ids[0] if ids else None)


def run_label(run: dict[str, Any]) -> str:
    return f"run {run['id']}: plan {run['plan_id']}, {run['model']}, {run['state']}"


def relabel(run_options: list[dict[str, Any]] | None, run: dict[str, Any]
            ) -> list[dict[str, Any]] | None:
    """The run picker's options with ``run``'s label in its current state, or None when
    the label is current already (so the picker is not redrawn every second)."""
    options = list(run_options or [])
    for idx, option in enumerate(options):
        if option["value"] == run["id"] and option["label"] != run_label(run):
            options[idx] = {**option, "label": run_label(run)}
            return options
    return None


def launch_defaults(context: Context, plan_id: int | None) -> tuple[str, str]:
    """The model and arguments a plan's profile was measured with (``config.*`` metadata)."""
    if plan_id is None:
        return "", ""
    try:
        plan = context.client.plan(plan_id)
        profile = context.profile(plan["profile_id"])
    except ApiError:
        return "", ""
    args = " ".join(f"{key.removeprefix('config.')}={value}"
                    for key, value in profile.metadata.items() if key.startswith("config."))
    return profile.model, args


def parse_model_args(text: str | None) -> dict[str, str]:
    """``layers=4 width=64`` as a dict; ``ValueError`` naming a word without ``=``."""
    args = {}
    for word in (text or "").split():
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ValueError(f"model argument {word!r} is not KEY=VALUE")
        args[key] = value
    return args


def launch(context: Context, plan_id: int | None, model: str | None, args: str | None,
           steps: int | None) -> tuple[html.Div, int | None]:
    if plan_id is None:
        return message("Pick an approved plan (approve one on the Planner page)."), None
    if not model:
        return message("Name the model the workers should build, e.g. gpt.", "error"), None
    try:
        run = context.client.launch({"plan_id": plan_id, "model": model,
                                     "model_args": parse_model_args(args),
                                     "steps": steps or 1, "author": "dashboard"})
    except (ValueError, ApiError) as exc:
        return message(f"Not launched:\n{exc}", "error"), None
    return message(f"Launched run {run['id']} on {len(run['ranks'])} ranks.", "ok"), run["id"]


def proposal_card(proposal: dict[str, Any]) -> html.Div:
    doc = proposal["document"]
    moves = doc.get("moves") or []
    lines = [f"{m['layer']}: stage {m['from_stage']} → stage {m['to_stage']}" for m in moves]
    lines += [f"{c['layer']}: {c['from_policy']} → {c['to_policy']}"
              for c in doc.get("policy_changes") or []]
    head = (f"Proposal {proposal['id']} ({doc.get('algorithm')}) · {proposal['state']} · "
            f"predicted step {doc['step_time_now_ms']:.2f} → {doc['step_time_after_ms']:.2f} "
            f"ms (gain {doc['gain_ms']:.2f} ms, {doc['gain_fraction']:.1%}) · migration "
            f"{format_bytes(doc['migration_bytes'])}, {doc['migration_ms']:.2f} ms")
    children: list[Any] = [html.B(head), html.Div(doc.get("reason", ""), className="ps-hint"),
                           html.Ul([html.Li(line) for line in lines] or [html.Li("no moves")])]
    if proposal.get("outcome"):
        children.append(html.Div(f"Outcome: {proposal['outcome']}", className="ps-hint"))
    if proposal["state"] == "pending":
        children.append(html.Div([
            html.Button("Approve", id={"type": "runs-proposal-approve",
                                       "index": proposal["id"]}, className="ps-button"),
            html.Button("Reject", id={"type": "runs-proposal-reject", "index": proposal["id"]},
                        className="ps-button ps-secondary")], className="ps-row"))
    return html.Div(children, className="ps-proposal", id=f"runs-proposal-{proposal['id']}")


def tick(context: Context, run_id: int | None,
         run_options: list[dict[str, Any]] | None = None) -> list[Any]:
    """The live monitor's figures, the run's status, its proposals, whether to stop
    polling (the run has ended), and the run picker's options when the run's state in
    them is out of date (else ``no_update``)."""
    if run_id is None:
        blank = [empty_figure("Launch a run, or pick one above.", t) for t in _TITLES]
        return [*blank, "No run selected.", html.Div("No proposals.", className="ps-empty"),
                False, no_update]
    try:
        view = monitor.fetch_view(context.client, run_id)
    except ApiError as exc:
        blank = [empty_figure(WAITING, t) for t in _TITLES]
        return [*blank, message(f"Cannot read run {run_id}: {exc}", "error"), [], False,
                no_update]
    cards = [proposal_card(p) for p in sorted(view.proposals, key=lambda p: -p["id"])]
    shown = cards or html.Div("No proposals for this run yet.", className="ps-empty")
    relabelled = relabel(run_options, view.run)
    return [*monitor.figures(view), monitor.status_text(view), shown,
            view.run["state"] in ENDED, no_update if relabelled is None else relabelled]


def decide(context: Context, proposal_id: int, approve: bool) -> html.Div:
    try:
        row = context.client.decide(proposal_id, approve)
    except ApiError as exc:
        return message(f"Proposal {proposal_id}: {exc}", "error")
    return message(f"Proposal {proposal_id} is {row['state']}.", "ok")


def stop(context: Context, run_id: int | None) -> html.Div:
    if run_id is None:
        return message("Pick a run to stop.")
    try:
        run = context.client.stop_run(run_id)
    except ApiError as exc:
        return message(f"Run {run_id} was not stopped: {exc}", "error")
    return message(f"Run {run_id} is {run['state']}.", "ok")
