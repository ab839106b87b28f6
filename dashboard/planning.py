"""What the planner page does besides editing: ask the backend's planners, compare their
plans, predict and draw the edited plan, save and approve it, export it."""

import json
from typing import Any

from pipestudio.dashboard.api import ApiError
from pipestudio.dashboard.components.compare import Candidate, summary_peaks
from pipestudio.dashboard.components.gantt import schedule_gantt
from pipestudio.dashboard.components.memory_charts import memory_timeline_figure
from pipestudio.dashboard.components.stage_charts import stage_compute_figure, stage_memory_figure
from pipestudio.dashboard.components.style import NO_PLAN, Figure, format_bytes
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.editor import Editor, build_plan, editor_cluster, predict
from pipestudio.planner import Cluster, PlannerError, Profile, SimResult
from pipestudio.planner.algorithms.optimal.planner import step_claim
from pipestudio.planner.formats.documents import parse_document
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.simulator.trace import chrome_trace


def planner_body(
    editor: Editor, num_stages: int | None, algorithms: list[str] | None
) -> dict[str, Any]:
    """The ``POST /api/plans/compare`` body for the editor's shape."""
    return {
        "profile_id": editor["profile_id"],
        "cluster_id": editor["cluster_id"],
        "num_stages": num_stages,
        "num_microbatches": editor["num_microbatches"],
        "schedule": "auto" if editor.get("auto") else editor["schedule"],
        "microbatch_size": editor["microbatch_size"],
        "optimizer": editor.get("optimizer", "adam"),
        "device_memory_bytes": (
            None if editor["cluster_id"] is not None else editor["device_memory_bytes"]
        ),
        "straight": bool(editor.get("straight")),
        "algorithms": algorithms,
        "save": False,
    }


def run_planners(
    context: Context, editor: Editor, num_stages: int | None, algorithms: list[str] | None
) -> list[dict[str, Any]]:
    """The backend's planners on the editor's request: one row per planner."""
    rows = context.client.compare(planner_body(editor, num_stages, algorithms))
    return [
        {
            "algorithm": row["algorithm"],
            "plan": row["plan"],
            "summary": row["summary"],
            "error": row["error"],
            "planner_ms": row["planner_ms"],
            "min_memory_bytes": row["min_memory_bytes"],
        }
        for row in rows
    ]


def candidate(row: dict[str, Any]) -> Candidate:
    summary = row.get("summary")
    error = row.get("error")
    if row.get("min_memory_bytes"):
        error = f"{error} (fits from {format_bytes(row['min_memory_bytes'])} per device)"
    stages = (row.get("plan") or {}).get("stages") or []
    replicas = tuple(int(stage.get("replicas", 1)) for stage in stages)
    if summary is None:
        return Candidate(row["algorithm"], None, error, row.get("planner_ms"), replicas=replicas)
    limits = [m for m in summary["stage_device_memory_bytes"] if m]
    return Candidate(
        row["algorithm"],
        summary["step_time_ms"],
        error,
        row.get("planner_ms"),
        samples_per_s=summary["samples_per_s"],
        bubble_fraction=summary["bubble_fraction"],
        fits=summary["fits"],
        peak_bytes=max(summary_peaks(summary)),
        device_memory_bytes=min(limits) if limits else None,
        claim=step_claim((row.get("plan") or {}).get("provenance") or {}),
        replicas=replicas,
    )


def editor_documents(
    context: Context, editor: Editor, boundaries: list[int]
) -> tuple[Plan, Cluster | None, SimResult]:
    """The edited plan, the cluster it is simulated on, and its prediction."""
    profile = context.profile(editor["profile_id"])
    plan = build_plan(profile, editor, boundaries)
    cluster = None if editor["cluster_id"] is None else context.cluster(editor["cluster_id"])
    cluster = editor_cluster(editor, cluster, plan)
    return plan, cluster, predict(editor["profile_id"], profile, plan, cluster)


def prediction_text(result: SimResult) -> str:
    peak = result.largest_peak_bytes
    verdict = "fits in device memory" if result.fits else "does NOT fit in device memory"
    return (
        f"Predicted step {result.step_time_ms:.2f} ms ({result.schedule}) · "
        f"{result.samples_per_s:.1f} "
        f"samples/s · bubble {result.bubble_fraction:.1%} · largest peak "
        f"{format_bytes(peak)} · {verdict}"
    )


def plan_view(
    context: Context, editor: Editor | None, boundaries: list[int] | None
) -> tuple[str, bool, list[Figure]]:
    """(prediction text, whether it is an error, [compute bars, memory bars]): what must
    follow a drag at once; ``timeline_view`` draws the rest from the same prediction."""
    return (
        *prediction_view(context, editor, boundaries),
        stage_figures(context, editor, boundaries),
    )


def prediction_view(
    context: Context, editor: Editor | None, boundaries: list[int] | None
) -> tuple[str, bool]:
    """The prediction's text and whether it is an error (no figures built)."""
    if not editor or boundaries is None:
        return "No plan yet: pick a profile and press 'Equal layers' or run a planner.", False
    try:
        _, _, result = editor_documents(context, editor, boundaries)
    except (PlannerError, ApiError) as exc:
        return f"This plan cannot be simulated:\n{exc}", True
    text = prediction_text(result)
    if result.schedule == "zero-bubble":
        text += split_backward_note(context.profile(editor["profile_id"]))
    return text, False


def split_backward_note(profile: Profile) -> str:
    """What zero-bubble's split backward costs in the profile: the input and weight halves
    of the layers that measured them, against their fused backward ("" within 5%). A
    split that costs more can make zero-bubble slower than 1F1B on the same stages."""
    split = [
        layer
        for layer in profile.layers
        if layer.bwd_input_ms is not None and layer.bwd_weight_ms is not None
    ]
    fused = sum(layer.bwd_ms for layer in split)
    if fused <= 0:
        return ""
    halves = sum((layer.bwd_input_ms or 0.0) + (layer.bwd_weight_ms or 0.0) for layer in split)
    extra = halves / fused - 1
    if abs(extra) < 0.05:
        return ""
    return f" · the profile times the split backward {extra:+.0%} against the fused one"


def stage_figures(
    context: Context, editor: Editor | None, boundaries: list[int] | None
) -> list[Figure]:
    """[compute bars, memory bars] of the edited plan (its prediction is remembered)."""
    result, empty = _prediction(context, editor, boundaries)
    return [stage_compute_figure(result, empty), stage_memory_figure(result, empty)]


def timeline_view(
    context: Context, editor: Editor | None, boundaries: list[int] | None
) -> list[Figure]:
    """[Gantt, memory over time] of the edited plan (its prediction is remembered)."""
    result, empty = _prediction(context, editor, boundaries)
    return [schedule_gantt(result, empty), memory_timeline_figure(result, empty)]


def _prediction(
    context: Context, editor: Editor | None, boundaries: list[int] | None
) -> tuple[SimResult | None, str]:
    """The edited plan's remembered prediction, or None and what the charts say instead."""
    if not editor or boundaries is None:
        return None, NO_PLAN
    try:
        return editor_documents(context, editor, boundaries)[2], NO_PLAN
    except (PlannerError, ApiError):
        return None, "This plan cannot be simulated: the reason is above the charts."


def candidate_gantt(context: Context, editor: Editor, row: dict[str, Any] | None) -> Figure:
    """A compared plan's predicted schedule, simulated here."""
    if row is None or row.get("plan") is None:
        return schedule_gantt(None)
    profile = context.profile(editor["profile_id"])
    plan = parse_document(Plan, row["plan"], source=row["algorithm"])
    cluster = None if editor["cluster_id"] is None else context.cluster(editor["cluster_id"])
    figure = schedule_gantt(
        predict(editor["profile_id"], profile, plan, editor_cluster(editor, cluster, plan))
    )
    figure["layout"]["title"]["text"] = f"{row['algorithm']}: " + figure["layout"]["title"]["text"]
    return figure


def _memory_cluster(context: Context, editor: Editor, plan: Plan) -> int | None:
    """The cluster id to store with the plan: the chosen one, or a new one that records
    the memory per device (free links) so the stored plan is judged against it."""
    if editor["cluster_id"] is not None or editor.get("device_memory_bytes") is None:
        return editor["cluster_id"]
    cluster = editor_cluster(editor, None, plan)
    assert cluster is not None
    name = f"{cluster.num_devices} devices × {format_bytes(editor['device_memory_bytes'])}"
    created = context.client.create_cluster(cluster.model_dump(mode="json"), name)
    return int(created["id"])


class NeedsConfirmation(Exception):
    """The backend approves the plan only when told to anyway: ``problems`` says why (it
    does not fit its cluster, or needs more ranks than there are devices or slots)."""

    def __init__(self, editor: Editor, problems: str) -> None:
        super().__init__(problems)
        self.editor, self.problems = editor, problems


def fingerprint(document: dict[str, Any]) -> str:
    """What makes two plans the same plan to store (not their provenance or name)."""
    stages = [
        {"layers": list(s["layers"]), "replicas": s.get("replicas", 1), "devices": s.get("devices")}
        for s in document["stages"]
    ]
    policies = {k: v for k, v in (document.get("policies") or {}).items() if v != "keep"}
    return json.dumps(
        [
            stages,
            policies,
            document["schedule"],
            document["num_microbatches"],
            document["microbatch_size"],
        ],
        sort_keys=True,
    )


def save_plan(
    context: Context, editor: Editor, boundaries: list[int], name: str | None, approve: bool
) -> tuple[Editor, str]:
    """Store the edited plan as a draft (and approve it): the new editor state and a notice.

    An unchanged plan that was saved already is approved as it is, not stored twice. A
    plan the backend approves only with ``force`` stays a draft and ``NeedsConfirmation``
    carries why (``approve_anyway`` then approves it).
    """
    plan, _, _ = editor_documents(context, editor, boundaries)
    document = plan.model_dump(mode="json")
    saved_as = fingerprint(document)
    plan_id = editor.get("plan_id")
    made = ""
    if plan_id is None or editor.get("saved") != saved_as:
        cluster_id = _memory_cluster(context, editor, plan)
        if cluster_id is not None and editor["cluster_id"] is None:
            made = (
                f" It is judged on cluster {cluster_id}, made for its memory per device "
                "(listed on the Workers & clusters page)."
            )
        created = context.client.create_plan(
            {
                "profile_id": editor["profile_id"],
                "cluster_id": cluster_id,
                "name": name or None,
                "author": "dashboard",
                "plan": document,
            }
        )
        plan_id = created["id"]
        editor = {**editor, "plan_id": plan_id, "plan_state": "draft", "saved": saved_as}
    if approve:
        try:
            context.client.update_plan(plan_id, {"state": "approved", "author": "dashboard"})
        except ApiError as exc:
            reason = str(exc)
            if exc.status == 422 and reason.startswith("force: "):
                problems = reason.removeprefix("force: ").split(": approve with force")[0]
                raise NeedsConfirmation(editor, problems) from None
            raise
        editor = {**editor, "plan_state": "approved"}
    return editor, f"Plan {plan_id} is {editor['plan_state']}.{made}"


def approve_anyway(context: Context, editor: Editor) -> tuple[Editor, str]:
    """Approve the editor's saved plan though the backend named problems (confirmed)."""
    plan_id = editor["plan_id"]
    context.client.update_plan(plan_id, {"state": "approved", "force": True, "author": "dashboard"})
    return {**editor, "plan_state": "approved"}, f"Plan {plan_id} is approved."


def export_plan(context: Context, editor: Editor, boundaries: list[int]) -> tuple[str, str]:
    """(file name, Plan JSON) of the edited plan."""
    plan, _, _ = editor_documents(context, editor, boundaries)
    return f"{plan.model}-{plan.schedule}-{plan.num_stages}stages.plan.json", plan.to_json()


def export_trace(context: Context, editor: Editor, boundaries: list[int]) -> tuple[str, str]:
    """(file name, Chrome trace JSON) of the edited plan's predicted timeline."""
    plan, _, result = editor_documents(context, editor, boundaries)
    name = f"{plan.model}-{plan.schedule}-{plan.num_stages}stages.predicted.trace.json"
    return name, json.dumps(chrome_trace(result))
