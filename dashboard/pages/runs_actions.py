"""The runs page's callbacks as plain functions: launch, the live tick, decisions."""

from typing import Any

from dash import html, no_update

from pipestudio.dashboard import monitor
from pipestudio.dashboard.api import ApiError
from pipestudio.dashboard.components.fidelity import fidelity_view
from pipestudio.dashboard.components.run_charts import WAITING, step_throughput
from pipestudio.dashboard.components.style import empty_figure, format_bytes
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.widgets import message

ENDED = ("finished", "failed", "stopped")
_TITLES = (
    "Measured schedule",
    "Throughput",
    "Compute per stage",
    "Peak memory per stage",
    "Recompute and swap per stage",
    "Training loss",
)


def options(
    context: Context, selected: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None]:
    """Plans to launch (approved, or launched before: a plan runs any number of times),
    runs to watch (newest first), and the run to show."""
    try:
        plans, runs = context.client.plans(), context.client.runs()
    except ApiError:
        return [], [], None
    ran = {r["plan_id"] for r in runs}
    plan_options = [
        {
            "label": f"{p['id']}: {p['name']}" + (" (launched before)" if p["id"] in ran else ""),
            "value": p["id"],
        }
        for p in plans
        if p["state"] in ("approved", "launched")
    ]
    runs = sorted(runs, key=lambda r: r["id"], reverse=True)
    run_options = [{"label": run_label(r), "value": r["id"]} for r in runs]
    ids = [r["id"] for r in runs]
    return plan_options, run_options, selected if selected in ids else (ids[0] if ids else None)


def run_label(run: dict[str, Any]) -> str:
    return f"run {run['id']}: plan {run['plan_id']}, {run['model']}, {run['state']}"


def relabel(
    run_options: list[dict[str, Any]] | None, run: dict[str, Any]
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
    args = " ".join(
        f"{key.removeprefix('config.')}={value}"
        for key, value in profile.metadata.items()
        if key.startswith("config.")
    )
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


def launch(
    context: Context, plan_id: int | None, model: str | None, args: str | None, steps: int | None
) -> tuple[html.Div, int | None]:
    if plan_id is None:
        return message("Pick an approved plan (approve one on the Planner page)."), None
    # a blank model builds the one the plan's profile measured, with its arguments
    request: dict[str, object] = {"plan_id": plan_id, "steps": steps or 1, "author": "dashboard"}
    try:
        if model:
            request.update(model=model, model_args=parse_model_args(args))
        run = context.client.launch(request)
    except (ValueError, ApiError) as exc:
        return message(f"Not launched:\n{exc}", "error"), None
    return message(f"Launched run {run['id']} on {len(run['ranks'])} ranks.", "ok"), run["id"]


#: Steps on each side of a migration whose measured times are compared.
GAIN_STEPS = 10


def measured_gains(view: monitor.RunView) -> dict[int, tuple[float, float]]:
    """Measured mean step time (ms) before and after each applied proposal's migration:
    the ``GAIN_STEPS`` steps before the step it took effect in (the first step, which warms
    up, left out) against the ``GAIN_STEPS`` after it. Applied proposals are matched in
    order with the engine's reports of migrations done, one each."""
    done = sorted(
        {
            e["data"]["step"]
            for e in view.events
            if e["kind"] == "migration"
            and isinstance(e.get("data"), dict)
            and e["data"].get("phase") == "done"
            and isinstance(e["data"].get("step"), int)
        }
    )
    applied = sorted(p["id"] for p in view.proposals if p["state"] == "applied")
    steps, rates = step_throughput(view.steps)
    step_ms = {
        k: view.samples_per_step / rate * 1e3 for k, rate in zip(steps, rates, strict=True) if rate
    }
    gains = {}
    for proposal_id, at in zip(applied, done, strict=False):
        before = [ms for k, ms in step_ms.items() if max(1, at - GAIN_STEPS) <= k < at]
        after = [ms for k, ms in step_ms.items() if at < k <= at + GAIN_STEPS]
        if before and after:
            gains[proposal_id] = (sum(before) / len(before), sum(after) / len(after))
    return gains


def proposal_card(
    proposal: dict[str, Any], measured: tuple[float, float] | None = None
) -> html.Div:
    """A proposal: its moves, predicted gain and, once applied, the measured one."""
    doc = proposal["document"]
    moves = doc.get("moves") or []
    lines = [f"{m['layer']}: stage {m['from_stage']} → stage {m['to_stage']}" for m in moves]
    lines += [
        f"{c['layer']}: {c['from_policy']} → {c['to_policy']}"
        for c in doc.get("policy_changes") or []
    ]
    head = (
        f"Proposal {proposal['id']} ({doc.get('algorithm')}) · {proposal['state']} · "
        f"predicted step {doc['step_time_now_ms']:.2f} → {doc['step_time_after_ms']:.2f} "
        f"ms (gain {doc['gain_ms']:.2f} ms, {doc['gain_fraction']:.1%}) · migration "
        f"{format_bytes(doc['migration_bytes'])}, {doc['migration_ms']:.2f} ms"
    )
    origin = (
        "came by itself: the measured step drifted from the prediction · "
        if proposal.get("created_by") == "auto"
        else ""
    )
    children: list[Any] = [
        html.B(head),
        html.Div(origin + doc.get("reason", ""), className="ps-hint"),
        html.Ul([html.Li(line) for line in lines] or [html.Li("no moves")]),
    ]
    if proposal.get("outcome"):
        children.append(html.Div(f"Outcome: {proposal['outcome']}", className="ps-hint"))
    if measured is not None:
        before, after = measured
        children.append(
            html.Div(
                f"Measured step {before:.2f} → {after:.2f} ms (gain {before - after:.2f} ms, "
                f"{(before - after) / before:.1%}) against the predicted {doc['gain_ms']:.2f} ms",
                className="ps-prediction",
                id=f"runs-proposal-{proposal['id']}-measured",
            )
        )
    if proposal["state"] == "pending":
        children.append(
            html.Div(
                [
                    html.Button(
                        "Approve",
                        id={"type": "runs-proposal-approve", "index": proposal["id"]},
                        className="ps-button",
                    ),
                    html.Button(
                        "Reject",
                        id={"type": "runs-proposal-reject", "index": proposal["id"]},
                        className="ps-button ps-secondary",
                    ),
                ],
                className="ps-row",
            )
        )
    return html.Div(children, className="ps-proposal", id=f"runs-proposal-{proposal['id']}")


def no_run_figures() -> list[dict[str, Any]]:
    """The live monitor's charts while no run is picked (the page's layout draws them)."""
    return [empty_figure("Launch a run, or pick one above.", t) for t in _TITLES]


def tick(
    context: Context, run_id: int | None, run_options: list[dict[str, Any]] | None = None
) -> list[Any]:
    """The live monitor's figures, the run's status, its proposals, whether to stop
    polling (the run has ended), and the run picker's options when the run's state in
    them is out of date (else ``no_update``)."""
    if run_id is None:
        return [
            *no_run_figures(),
            "No run selected.",
            html.Div(),
            html.Div("No proposals.", className="ps-empty"),
            False,
            no_update,
        ]
    try:
        view = monitor.fetch_view(context.client, run_id)
    except ApiError as exc:
        blank = [empty_figure(WAITING, t) for t in _TITLES]
        return [
            *blank,
            message(f"Cannot read run {run_id}: {exc}", "error"),
            html.Div(),
            [],
            False,
            no_update,
        ]
    gains = measured_gains(view)
    cards = [
        proposal_card(p, gains.get(p["id"])) for p in sorted(view.proposals, key=lambda p: -p["id"])
    ]
    shown = cards or html.Div("No proposals for this run yet.", className="ps-empty")
    relabelled = relabel(run_options, view.run)
    fidelity = fidelity_view(
        view.calibration,
        view.samples_per_step,
        "Predictions are compared with the run once it has measured a step past its first.",
    )
    return [
        *monitor.figures(view),
        status_view(view),
        fidelity,
        shown,
        view.run["state"] in ENDED,
        no_update if relabelled is None else relabelled,
    ]


def status_view(view: monitor.RunView) -> list[Any]:
    """The run's status line over a bar of its steps done."""
    done, _ = monitor.progress(view)
    return [
        html.Div(monitor.status_text(view), id="runs-status-text"),
        html.Progress(
            id="runs-progress", value=str(done), max=str(view.run["steps"]), className="ps-progress"
        ),
    ]


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
