"""The planner page's callbacks: plain functions that tests call, and their Dash wiring."""

import json
import math
from typing import Any
from urllib.parse import parse_qs

from dash import Dash, Input, Output, State, ctx, dcc, no_update
from dash.exceptions import PreventUpdate

from pipestudio.dashboard import planning
from pipestudio.dashboard.api import ApiError
from pipestudio.dashboard.components.compare import (
    COMPARE_COLUMNS,
    compare_figure,
    compare_rows,
    outcome_counts,
)
from pipestudio.dashboard.components.gantt import schedule_gantt
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.editor import Editor, editor_from_plan, equal_boundaries, new_editor
from pipestudio.dashboard.widgets import chart, chart_output, message, table
from pipestudio.planner import PlannerError
from pipestudio.planner.units import parse_size

FORM = (
    "profile",
    "cluster",
    "memory",
    "stages",
    "microbatches",
    "microbatch-size",
    "schedule",
    "virtual-stages",
    "optimizer",
    "algorithm",
    "straight",
)
#: Form fields that reshape the plan being edited without replacing it (a schedule or a
#: chunk count that changes how many chunks the layers are cut into cuts them again).
RESHAPE = (
    "cluster",
    "memory",
    "microbatches",
    "microbatch-size",
    "schedule",
    "virtual-stages",
    "optimizer",
)
AUTO = "auto"
#: What "Chunks per device" says until an interleaved plan sets it.
DEFAULT_CHUNKS_PER_DEVICE = 2
#: The form as the page opens (``profile``: the one ``choices`` starts on).
FORM_DEFAULTS: dict[str, Any] = {
    "profile": None,
    "cluster": None,
    "memory": "",
    "stages": 4,
    "microbatches": 8,
    "microbatch-size": None,
    "schedule": "1f1b",
    "virtual-stages": DEFAULT_CHUNKS_PER_DEVICE,
    "optimizer": "adam",
    "algorithm": "balance-time",
    "straight": [],
}


def whole_number(label: str, value: Any) -> int:
    """``value`` (a form field's, from the browser or from anyone who posts to the
    callback) as a whole number of at least 1; for anything else (text, a fraction, NaN,
    infinity, true or false) a ``ValueError`` that names ``label`` and the value."""
    text = value.strip() if isinstance(value, str) else ""
    if text.isascii() and text.isdigit() and len(text) <= 18:  # "²" is a digit to isdigit
        value = int(text)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"'{label}' must be a whole number of at least 1, got {value!r}")
    return value


def chunks_per_device(form: dict[str, Any]) -> int:
    """The form's chunks per device: its value under ``interleaved-1f1b``, else 1."""
    if form.get("schedule") != "interleaved-1f1b":
        return 1
    return whole_number("chunks per device", form.get("virtual-stages"))


def schedule_name(plan: dict[str, Any]) -> str:
    """A plan's schedule as people say it: ``interleaved-1f1b x2`` for two chunks each."""
    chunks = int(plan.get("virtual_stages") or 1)
    return plan["schedule"] + (f" x{chunks}" if plan["schedule"] == "interleaved-1f1b" else "")


def form_editor(form: dict[str, Any]) -> Editor:
    """A fresh editor from the request form; ``ValueError`` names a bad field."""
    if form.get("profile") is None:
        raise ValueError("Pick a profile first (upload one on the Profiles page).")
    memory = (form.get("memory") or "").strip()
    for name in ("stages", "microbatches"):
        whole_number(name, form.get(name))
    auto = form["schedule"] == AUTO
    editor = new_editor(
        whole_number("profile", form["profile"]),
        form.get("cluster"),
        # ``auto`` asks the planners; a plan made here by hand starts as 1f1b
        schedule="1f1b" if auto else form["schedule"],
        num_microbatches=whole_number("microbatches", form["microbatches"]),
        microbatch_size=form.get("microbatch-size") or None,
        device_memory_bytes=parse_size(memory) if memory else None,
        optimizer=form.get("optimizer") or "adam",
        virtual_stages=chunks_per_device(form),
    )
    if auto:
        editor["auto"] = True
    # the stage count these cuts are for: a reshape keeps the cuts only while the form still
    # asks for it (a stage change whose own call a quicker edit superseded still cuts again)
    editor["stages_asked"] = whole_number("stages", form["stages"])
    # "one device per stage": the planners that replicate stages (optimal, pipedream) may not
    if form.get("straight"):
        editor["straight"] = True
    return editor


def slider_props(num_layers: int, boundaries: list[int]) -> dict[str, Any]:
    """The boundary slider: about 8 labelled marks, none so close to the last (or the
    first) that their labels would print over each other."""
    step = max(1, num_layers // 8)
    last = num_layers - 1
    inner = [t for t in range(step, last, step) if min(t - 1, last - t) >= step / 2]
    ticks = sorted({1, *inner, last})
    return {
        "min": 1,
        "max": max(1, num_layers - 1),
        "value": boundaries,
        "marks": {str(t): f"layer {t}" for t in ticks},
    }


NO_CHOICES: dict[str, Any] = {"profiles": [], "clusters": [], "profile": None}


def choices(context: Context, search: str | None) -> dict[str, Any]:
    """The profile and cluster options of the page and the profile it starts on: that of
    the plan ``search`` opens (``?plan=ID``), else the newest; none when the backend
    cannot be read (the page then says to pick a profile)."""
    try:
        profiles, clusters = context.client.profiles(), context.client.clusters()
    except ApiError:
        return NO_CHOICES
    stored = opened_plan(search)
    try:
        profile_id = None if stored is None else context.client.plan(stored)["profile_id"]
    except ApiError:  # a plan that is gone: the editor says so when it tries to open it
        profile_id = None
    ids = [p["id"] for p in profiles]
    return {
        "profiles": [
            {
                "label": f"{p['id']}: {p['name']} ({p['num_layers']} layers) · {p['precision']}",
                "value": p["id"],
            }
            for p in profiles
        ],
        "clusters": [
            {"label": f"{c['id']}: {c['name']} ({c['num_devices']} devices)", "value": c["id"]}
            for c in clusters
        ],
        "profile": profile_id if profile_id in ids else (max(ids) if ids else None),
    }


def first_view(context: Context, profile: int | None, search: str | None) -> dict[str, Any]:
    """What the page's first call of the editor (and of the prediction) would draw, for
    its layout to draw at once (each call is a round trip and a render after the page's,
    0.1-0.15 s on a small machine, and the status line shows a spinner, not the notice,
    while a call that may change it runs): the form (an opened plan sets its ``SYNCED``
    fields), the editor with its slider and notice, and the prediction with its
    ``drawn_key``. Without a slider (no profile, or it failed) there is no prediction."""
    form = {**FORM_DEFAULTS, "profile": profile}
    editor, slider, notice = editor_action(
        context, None, form, None, None, [], None, None, "keep", search
    )
    if editor is None or slider is None:
        return {"form": form, "editor": editor, "notice": notice}
    editor = {**editor, "cuts": list(slider["value"])}
    if editor.get("plan_id") is not None:
        form.update((k, v) for k, v in form_of(editor).items() if v is not no_update)
    text, failed = planning.prediction_view(context, editor, slider["value"])
    return {
        "form": form,
        "editor": editor,
        "slider": slider,
        "notice": notice,
        "prediction": text,
        "prediction_class": prediction_class(failed),
        "policies": policy_summary(editor),
        "drawn": drawn_key(editor, slider["value"]),
    }


def prediction_class(failed: bool) -> str:
    return "ps-prediction ps-message ps-error" if failed else "ps-prediction"


def opened_plan(search: str | None) -> int | None:
    """The stored plan a link asks the Planner to open (``/planner?plan=ID``); None for
    anything but up to 18 ASCII digits (``"²".isdigit()``, and ``int`` refuses a string
    of over 4,300 digits: either raised out of the page's layout)."""
    values = parse_qs((search or "").lstrip("?")).get("plan") or []
    text = values[0] if values else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def open_stored(context: Context, plan_id: int) -> tuple[Editor, dict[str, Any], Any]:
    """A stored plan in the editor, as it was saved: its profile, cluster, shape, cuts,
    replicas and policies, still tied to its id and state (saving it unchanged stores
    nothing new)."""
    row = context.client.plan(plan_id)
    document = row["document"]
    profile = context.profile(row["profile_id"])
    fresh = new_editor(
        row["profile_id"],
        row["cluster_id"],
        schedule=document["schedule"],
        num_microbatches=document["num_microbatches"],
        microbatch_size=document["microbatch_size"],
        device_memory_bytes=None,
        optimizer=document.get("optimizer", "adam"),
    )
    loaded, cuts = editor_from_plan(fresh, profile, document, f"plan {plan_id}")
    loaded = {
        **loaded,
        "plan_id": plan_id,
        "plan_state": row["state"],
        "saved": planning.fingerprint(document),
    }
    loaded["stages_asked"] = form_of(loaded)["stages"]  # what the opened plan sets the form to
    return (
        loaded,
        slider_props(profile.num_layers, cuts),
        message(
            f"Opened plan {plan_id} ({row['name']}, {row['state']}). Edits make a new draft.", "ok"
        ),
    )


def editor_action(
    context: Context,
    trigger: str | None,
    form: dict[str, Any],
    editor: Editor | None,
    boundaries: list[int] | None,
    candidates: list[dict[str, Any]],
    pick: str | None,
    policy_layers: list[str] | None,
    policy: str,
    search: str | None = None,
) -> tuple[Editor | None, dict[str, Any] | None, Any]:
    """What a button or a form change does to the edited plan:
    (the new editor state, the slider's props or None, the notice). On the page's first
    draw (no editor yet: the page's first call, or the one after its profile options came),
    ``search`` may ask for a stored plan (``?plan=ID``), which is opened."""
    try:
        stored = opened_plan(search)
        if stored is not None and editor is None and trigger in (None, "planner-profile"):
            return open_stored(context, stored)
        if (
            trigger == "planner-profile"
            and editor
            and form.get("profile") is not None
            and editor["profile_id"] == whole_number("profile", form["profile"])
        ):
            return editor, None, no_update  # the same profile again: keep what is edited
        if trigger == "planner-policy-apply":
            if not editor or not policy_layers:
                return editor, None, message("Pick one or more layers, then a policy.")
            policies = dict(editor.get("policies") or {})
            for name in policy_layers:
                if policy == "keep":
                    policies.pop(name, None)
                else:
                    policies[name] = policy
            return (
                {**editor, "policies": policies, "plan_id": None},
                None,
                message(f"{len(policy_layers)} layer(s) set to {policy}.", "ok"),
            )
        if form.get("profile") is None:
            return None, None, message("Pick a profile to plan (upload one on the Profiles page).")
        fresh = form_editor(form)
        profile = context.profile(fresh["profile_id"])
        if trigger == "planner-compare-open":
            row = next((r for r in candidates if r["algorithm"] == pick), None)
            if row is None or row.get("plan") is None:
                return editor, None, message("Pick a compared plan that has one.")
            loaded, cuts = editor_from_plan(fresh, profile, row["plan"], row["algorithm"])
            return (
                loaded,
                slider_props(profile.num_layers, cuts),
                message(f"Opened the {pick} plan in the editor.", "ok"),
            )
        if trigger == "planner-run":
            rows = planning.run_planners(
                context, fresh, whole_number("stages", form["stages"]), [form["algorithm"]]
            )
            if rows[0]["plan"] is None:
                shown = (
                    ""
                    if not editor
                    else "\nThe plan below is the one you had before "
                    f"(from {editor.get('source') or 'the editor'}), not "
                    f"{form['algorithm']}'s."
                )
                return (
                    editor,
                    None,
                    message(
                        f"{form['algorithm']} found no plan:\n"
                        f"{planning.candidate(rows[0]).error}{shown}",
                        "error",
                    ),
                )
            plan = rows[0]["plan"]
            loaded, cuts = editor_from_plan(fresh, profile, plan, form["algorithm"])
            devices = sum(loaded["replicas"]) // int(plan.get("virtual_stages") or 1)
            chosen = f" with {schedule_name(plan)} (chosen by auto)" if fresh.get("auto") else ""
            return (
                loaded,
                slider_props(profile.num_layers, cuts),
                message(
                    f"{form['algorithm']} planned {len(cuts) + 1} stage(s) on "
                    f"{devices} device(s){chosen} "
                    f"in {rows[0]['planner_ms']:.0f} ms.",
                    "ok",
                ),
            )
        reshape = trigger in {f"planner-{name}" for name in RESHAPE}
        if (
            reshape
            and editor
            and editor["profile_id"] == fresh["profile_id"]
            and editor.get("stages_asked") == fresh["stages_asked"]
            and not _rechunked(editor, fresh)
        ):
            kept = {key: editor[key] for key in ("replicas", "devices", "policies", "source")}
            if fresh.get("auto"):  # the plan on screen keeps its schedule
                kept.update(schedule=editor["schedule"], virtual_stages=editor["virtual_stages"])
            return {**fresh, **kept}, None, ""
        chunks = min(
            whole_number("stages", form["stages"]) * fresh["virtual_stages"], profile.num_layers
        )
        return (
            fresh,
            slider_props(profile.num_layers, equal_boundaries(profile.num_layers, chunks)),
            ""
            if fresh["virtual_stages"] == 1
            else message(
                f"{chunks} chunks of equal layer counts: {form['stages']} device(s) x "
                f"{fresh['virtual_stages']} chunks each, chunk c on device c mod "
                f"{form['stages']}.",
                "ok",
            ),
        )
    except (ValueError, ApiError) as exc:
        return editor, None, message(str(exc), "error")


def _rechunked(editor: Editor, fresh: Editor) -> bool:
    """Whether the form asks for another chunk count per device than the editor's: a
    change to or from ``interleaved-1f1b``, or of its chunks per device; the layers are
    then cut again. (``auto`` keeps what is on screen: the planners choose when asked.)"""
    if fresh.get("auto"):
        return False
    was = (editor.get("virtual_stages") or 1) if editor["schedule"] == "interleaved-1f1b" else 1
    return bool(was != fresh["virtual_stages"])


#: The form fields an opened plan sets, so that the form says what is in the editor.
SYNCED = (
    "schedule",
    "virtual-stages",
    "microbatches",
    "microbatch-size",
    "optimizer",
    "stages",
    "cluster",
)


def form_of(editor: Editor) -> dict[str, Any]:
    """The values of ``SYNCED`` that describe ``editor``'s plan."""
    chunks = int(editor.get("virtual_stages") or 1)
    replicas = editor.get("replicas") or []
    return {
        "schedule": editor["schedule"],
        "virtual-stages": chunks
        if editor["schedule"] == "interleaved-1f1b"
        else DEFAULT_CHUNKS_PER_DEVICE,
        "microbatches": editor["num_microbatches"],
        "microbatch-size": editor["microbatch_size"],
        "optimizer": editor.get("optimizer", "adam"),
        "stages": max(1, len(replicas) // chunks) if replicas else no_update,
        # its memory limit is its cluster's: a reshape of the opened plan keeps it
        "cluster": editor.get("cluster_id"),
    }


def drag_notice(boundaries: list[int] | None, editor: Editor | None) -> Any:
    """After a drag the status says the plan is edited by hand, not what a planner made."""
    if not editor or boundaries is None or list(boundaries) == editor.get("cuts"):
        return no_update
    source = editor.get("source") or "manual"
    origin = "" if source == "manual" else f" from {source}'s plan"
    return message(
        f"Edited by hand{origin}: stages begin at layers {', '.join(map(str, boundaries))}."
    )


def policy_summary(editor: Editor | None) -> str:
    policies = (editor or {}).get("policies") or {}
    counts = {
        kind: sum(1 for p in policies.values() if p == kind) for kind in ("recompute", "swap")
    }
    return (
        f"{counts['recompute']} layer(s) recompute, {counts['swap']} swap; "
        "the rest keep their activations."
    )


def layer_names(context: Context, profile_id: int | None) -> list[str]:
    """The profile's layer names, for picking layers to set a policy on."""
    if profile_id is None:
        return []
    try:
        return [layer.name for layer in context.profile(profile_id).layers]
    except ApiError:
        return []


def compare_view(candidates: list[dict[str, Any]]) -> tuple[Any, dict[str, Any], list[str]]:
    """The comparison table, its chart, and the names of plans that can be opened."""
    shown = [planning.candidate(row) for row in candidates]
    empty = "Nothing compared yet: press 'Run all planners and compare'."
    names = [row["algorithm"] for row in candidates if row.get("plan") is not None]
    return (table(COMPARE_COLUMNS, compare_rows(shown), empty), compare_figure(shown), names)


#: Editor entries that say where the plan is stored, not what it is: a save or an approval
#: changes them and leaves the prediction and its charts as they are.
_NOT_DRAWN = frozenset({"plan_id", "plan_state", "saved", "source", "cuts"})


def drawn_key(editor: Editor | None, boundaries: list[int] | None) -> str | None:
    """What the prediction and the charts on screen were drawn from (None: nothing to
    draw); the prediction callbacks leave the screen alone while it stays the same."""
    if not editor or boundaries is None:
        return None
    shown = {key: value for key, value in editor.items() if key not in _NOT_DRAWN}
    return json.dumps([shown, list(boundaries)], sort_keys=True, default=str)


def register(app: Dash, context: Context) -> None:
    form_states = [State(f"planner-{name}", "value") for name in FORM]

    triggers = ["planner-template", "planner-run", "planner-compare-open", "planner-policy-apply"]

    @app.callback(
        Output("planner-editor", "data"),
        Output("planner-boundaries", "min"),
        Output("planner-boundaries", "max"),
        Output("planner-boundaries", "value"),
        Output("planner-boundaries", "marks"),
        Output("planner-status", "children"),
        # an opened plan sets the form (the same callback reads it: Dash allows the cycle)
        *[Output(f"planner-{name}", "value") for name in SYNCED],
        [Input(name, "n_clicks") for name in triggers],
        [Input(f"planner-{name}", "value") for name in ("profile", "stages", *RESHAPE)],
        *form_states,
        State("planner-editor", "data"),
        State("planner-boundaries", "value"),
        State("planner-candidates", "data"),
        State("planner-compare-pick", "value"),
        State("planner-policy-layers", "value"),
        State("planner-policy-choice", "value"),
        State("url", "search"),
        prevent_initial_call=True,  # the layout draws the first call's (``first_view``)
    )
    def _edit(*args: Any) -> Any:
        first = len(triggers) + 2 + len(RESHAPE)
        form = dict(zip(FORM, args[first : first + len(FORM)], strict=True))
        editor, boundaries, candidates, pick, layers, policy, search = args[first + len(FORM) :]
        new, slider, notice = editor_action(
            context,
            ctx.triggered_id,
            form,
            editor,
            boundaries,
            candidates or [],
            pick,
            layers,
            policy,
            search,
        )
        unchanged = [no_update] * len(SYNCED)
        if slider is None:
            return new, no_update, no_update, no_update, no_update, notice, *unchanged
        synced = (
            [form_of(new)[name] for name in SYNCED]
            if new is not None and new.get("plan_id") is not None
            else unchanged
        )
        if new is not None:  # the cuts it drew, to tell a drag from them (``_dragged``)
            new = {**new, "cuts": list(slider["value"])}
        return new, slider["min"], slider["max"], slider["value"], slider["marks"], notice, *synced

    @app.callback(
        Output("planner-memory", "disabled"),
        Output("planner-memory", "title"),
        Input("planner-cluster", "value"),
    )
    def _memory_from_cluster(cluster: int | None) -> Any:
        # a cluster's devices say their own memory: the field would be ignored
        if cluster is None:
            return False, ""
        return True, "the cluster's devices give the memory; clear the cluster to set it here"

    @app.callback(
        Output("planner-status", "children", allow_duplicate=True),
        Input("planner-boundaries", "value"),
        State("planner-editor", "data"),
        prevent_initial_call=True,
    )
    def _dragged(boundaries: list[int] | None, editor: Editor | None) -> Any:
        return drag_notice(boundaries, editor)

    # The numbers come back on their own, so that they show while the charts are drawn.
    @app.callback(
        Output("planner-prediction", "children"),
        Output("planner-prediction", "className"),
        Output("planner-policy-summary", "children"),
        Output("planner-drawn", "data"),
        Input("planner-boundaries", "value"),
        Input("planner-editor", "data"),
        State("planner-drawn", "data"),
        # the layout draws the first (and a first call that changed nothing would hold
        # back the charts, which Dash asks for only after their inputs' callbacks ran)
        prevent_initial_call=True,
    )
    def _predict(boundaries: list[int] | None, editor: Editor | None, drawn: str | None) -> Any:
        key = drawn_key(editor, boundaries)
        if key is not None and key == drawn:
            raise PreventUpdate  # saved or approved: the same plan, drawn already
        text, failed = planning.prediction_view(context, editor, boundaries)
        return text, prediction_class(failed), policy_summary(editor), key

    # The charts follow the numbers: asked for once the numbers are on screen (a new
    # ``planner-drawn``), so that drawing them does not hold the numbers back.
    @app.callback(
        chart_output("planner-compute-graph"),
        chart_output("planner-memory-graph"),
        Input("planner-drawn", "data"),
        State("planner-boundaries", "value"),
        State("planner-editor", "data"),
    )
    def _stage_charts(_: str | None, boundaries: list[int] | None, editor: Editor | None) -> Any:
        compute, memory = planning.stage_figures(context, editor, boundaries)
        return chart("planner-compute-graph", compute), chart("planner-memory-graph", memory)

    @app.callback(
        chart_output("planner-gantt-graph"),
        chart_output("planner-memory-time-graph"),
        Input("planner-drawn", "data"),
        State("planner-boundaries", "value"),
        State("planner-editor", "data"),
    )
    def _timeline(_: str | None, boundaries: list[int] | None, editor: Editor | None) -> Any:
        gantt, memory = planning.timeline_view(context, editor, boundaries)
        return chart("planner-gantt-graph", gantt), chart("planner-memory-time-graph", memory)

    # The layer names change with the profile only, not at every edit of the plan.
    @app.callback(Output("planner-policy-layers", "options"), Input("planner-profile", "value"))
    def _layers(profile_id: int | None) -> Any:
        return layer_names(context, profile_id)

    _register_compare(app, context, form_states)
    _register_save(app, context)


def compare_notice(rows: list[dict[str, Any]]) -> Any:
    """What the comparison found, the plans that fit counted apart from those that do not
    and from the planners that found none; green only when some plan fits."""
    fitting, unfit, none = outcome_counts([planning.candidate(row) for row in rows])
    parts = [f"{fitting} of {len(rows)} planners found a plan that fits"]
    if unfit:
        parts.append(f"{unfit} found one that does NOT fit")
    if none:
        parts.append(f"{none} found none")
    return message("; ".join(parts) + ".", "ok" if fitting else "error")


def _register_compare(app: Dash, context: Context, form_states: list[State]) -> None:
    @app.callback(
        Output("planner-candidates", "data"),
        Output("planner-status", "children", allow_duplicate=True),
        Input("planner-run-all", "n_clicks"),
        *form_states,
        prevent_initial_call=True,
    )
    def _run_all(_: int, *values: Any) -> Any:
        form = dict(zip(FORM, values, strict=True))
        try:
            rows = planning.run_planners(
                context, form_editor(form), whole_number("stages", form["stages"]), None
            )
        except (ValueError, ApiError) as exc:
            return no_update, message(str(exc), "error")
        return rows, compare_notice(rows)

    @app.callback(
        Output("planner-compare-table", "children"),
        chart_output("planner-compare-graph"),
        Output("planner-compare-pick", "options"),
        Output("planner-side-a", "options"),
        Output("planner-side-b", "options"),
        Input("planner-candidates", "data"),
        prevent_initial_call=True,
    )  # the layout says that nothing is compared yet
    def _compare(candidates: list[dict[str, Any]] | None) -> Any:
        shown, figure, names = compare_view(candidates or [])
        return shown, chart("planner-compare-graph", figure), names, names, names

    @app.callback(
        chart_output("planner-side-a-graph"),
        chart_output("planner-side-b-graph"),
        Input("planner-side-a", "value"),
        Input("planner-side-b", "value"),
        State("planner-candidates", "data"),
        State("planner-editor", "data"),
        prevent_initial_call=True,
    )
    def _side(
        a: str | None, b: str | None, candidates: list[dict[str, Any]] | None, editor: Editor | None
    ) -> Any:
        rows = {row["algorithm"]: row for row in candidates or []}

        def drawn(side: str, pick: str | None) -> Any:
            figure = (
                planning.candidate_gantt(context, editor, rows.get(pick or ""))
                if editor
                else schedule_gantt(None)
            )
            return chart(f"planner-side-{side}-graph", figure)

        return drawn("a", a), drawn("b", b)


def _register_save(app: Dash, context: Context) -> None:
    @app.callback(
        Output("planner-editor", "data", allow_duplicate=True),
        Output("planner-save-status", "children"),
        Output("planner-approve-confirm", "message"),
        Output("planner-approve-confirm", "displayed"),
        Input("planner-save", "n_clicks"),
        Input("planner-approve", "n_clicks"),
        State("planner-editor", "data"),
        State("planner-boundaries", "value"),
        State("planner-name", "value"),
        prevent_initial_call=True,
    )
    def _save(
        _: int, __: int, editor: Editor | None, boundaries: list[int] | None, name: str | None
    ) -> Any:
        if not editor or boundaries is None:
            return no_update, message("Make a plan first."), no_update, False
        try:
            saved, notice = planning.save_plan(
                context, editor, boundaries, name, approve=ctx.triggered_id == "planner-approve"
            )
        except planning.NeedsConfirmation as asked:
            plan_id = asked.editor["plan_id"]
            return (
                asked.editor,
                message(
                    f"Plan {plan_id} is saved as a draft, not approved:\n{asked.problems}", "error"
                ),
                f"{asked.problems}.\n\nApprove plan {plan_id} anyway?",
                True,
            )
        except (PlannerError, ApiError) as exc:
            return no_update, message(f"Not saved:\n{exc}", "error"), no_update, False
        return (
            saved,
            message(
                notice
                + (" Launch it on the Runs page." if saved["plan_state"] == "approved" else ""),
                "ok",
            ),
            no_update,
            False,
        )

    @app.callback(
        Output("planner-save-status", "children", allow_duplicate=True),
        Input("planner-editor", "data"),
        prevent_initial_call=True,
    )
    def _edited(editor: Editor | None) -> Any:
        # what was said of a saved plan, once the editor holds another
        return "" if not editor or editor.get("plan_id") is None else no_update

    @app.callback(
        Output("planner-editor", "data", allow_duplicate=True),
        Output("planner-save-status", "children", allow_duplicate=True),
        Input("planner-approve-confirm", "submit_n_clicks"),
        State("planner-editor", "data"),
        prevent_initial_call=True,
    )
    def _approve_anyway(_: int, editor: Editor | None) -> Any:
        if not editor or editor.get("plan_id") is None:
            return no_update, no_update
        try:
            approved, notice = planning.approve_anyway(context, editor)
        except ApiError as exc:
            return no_update, message(f"Not approved:\n{exc}", "error")
        return approved, message(notice + " Launch it on the Runs page.", "ok")

    @app.callback(
        Output("planner-download", "data"),
        Input("planner-export-plan", "n_clicks"),
        Input("planner-export-trace", "n_clicks"),
        State("planner-editor", "data"),
        State("planner-boundaries", "value"),
        prevent_initial_call=True,
    )
    def _export(_: int, __: int, editor: Editor | None, boundaries: list[int] | None) -> Any:
        if not editor or boundaries is None:
            return no_update
        export = (
            planning.export_trace
            if ctx.triggered_id == "planner-export-trace"
            else planning.export_plan
        )
        filename, text = export(context, editor, boundaries)
        return dcc.send_string(text, filename)
