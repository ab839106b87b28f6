"""Planner page callbacks (``pages/planner_callbacks.py``, ``planning.py``, ``editor.py``)
against the real backend in-process."""

import json
from pathlib import Path

import pytest

from pipestudio.dashboard import planning
from pipestudio.dashboard.editor import equal_boundaries, stage_sizes
from pipestudio.dashboard.pages import planner_callbacks as callbacks
from pipestudio.planner import Plan, PlannerError, Profile
from tests.dashboard.conftest import big_profile

BUILTIN_PROFILES = Path(__file__).resolve().parents[2] / "profiles" / "builtin"


def form(profile_id, **changes):
    base = {
        "profile": profile_id,
        "cluster": None,
        "memory": "48GiB",
        "stages": 4,
        "microbatches": 8,
        "microbatch-size": None,
        "schedule": "1f1b",
        "optimizer": "adam",
        "algorithm": "balance-time",
    }
    return {**base, **changes}


def act(
    context,
    trigger,
    values,
    editor=None,
    boundaries=None,
    candidates=(),
    pick=None,
    layers=None,
    policy="keep",
):
    return callbacks.editor_action(
        context, trigger, values, editor, boundaries, list(candidates), pick, layers, policy
    )


def test_picking_a_profile_gives_equal_stages_and_a_prediction(context, vgg_id):
    editor, slider, _ = act(context, "planner-profile", form(vgg_id))
    assert slider["value"] == equal_boundaries(41, 4) == [11, 21, 31]
    assert slider["max"] == 40
    text, failed, figures = planning.plan_view(context, editor, slider["value"])
    assert not failed and text.startswith("Predicted step ")
    assert [f["layout"]["title"]["text"].split(" (")[0] for f in figures] == [
        "Compute per stage and step",
        "Peak memory per stage",
    ]
    gantt, memory = planning.timeline_view(context, editor, slider["value"])
    assert gantt["layout"]["title"]["text"].startswith("Predicted schedule: step")
    assert memory["data"][0]["name"] == "stage 0"


def test_moving_a_boundary_changes_the_prediction(context, vgg_id):
    editor, _slider, _ = act(context, "planner-profile", form(vgg_id))
    before, _, _ = planning.plan_view(context, editor, [11, 21, 31])
    after, _, figures = planning.plan_view(context, editor, [5, 21, 31])
    assert before != after
    assert figures[0]["data"][0]["x"] == ["stage 0", "stage 1", "stage 2", "stage 3"]
    assert stage_sizes([5, 21, 31], 41) == [5, 16, 10, 10]


def test_reshaping_keeps_the_boundaries_and_no_profile_is_a_hint(context, vgg_id):
    editor, _, _ = act(context, "planner-profile", form(vgg_id))
    reshaped, slider, _ = act(
        context, "planner-schedule", form(vgg_id, schedule="gpipe"), editor, [5, 21, 31]
    )
    assert slider is None and reshaped["schedule"] == "gpipe"
    nothing, slider, notice = act(context, None, form(None))
    assert nothing is None and slider is None and "Pick a profile" in notice.children


def test_a_reshape_after_a_missed_stage_change_cuts_the_asked_stages(context, vgg_id):
    """Typing 2 stages and then another micro-batch count quickly can leave the stage
    change's own call superseded: the micro-batch call must still cut 2 stages, not keep
    the 4 on screen (an approved plan then asked for 4 ranks that were not there)."""
    editor, _, _ = act(context, "planner-profile", form(vgg_id))
    asked = form(vgg_id, stages=2, microbatches=4)
    cut, slider, _ = act(context, "planner-microbatches", asked, editor, [11, 21, 31])
    assert slider["value"] == equal_boundaries(41, 2) and cut["num_microbatches"] == 4
    kept, slider, _ = act(context, "planner-microbatches", {**asked, "microbatches": 8}, cut, [7])
    assert slider is None and kept["num_microbatches"] == 8  # the same stages: cuts stay


def test_bad_memory_is_named(context, vgg_id):
    editor, slider, notice = act(context, "planner-memory", form(vgg_id, memory="lots"))
    assert editor is None and slider is None
    assert "size 'lots' is not understood" in notice.children


def test_run_one_planner_loads_its_plan(context, vgg_id):
    editor, slider, notice = act(context, "planner-run", form(vgg_id, algorithm="optimal"))
    assert editor["source"] == "optimal"
    stages = len(slider["value"]) + 1
    assert sum(editor["replicas"]) == 4 and len(editor["replicas"]) == stages
    assert f"optimal planned {stages} stage(s) on 4 device(s)" in notice.children
    _, failed, _ = planning.plan_view(context, editor, slider["value"])
    assert not failed


def test_interleaved_cuts_devices_times_chunks_and_draws_devices(context, vgg_id):
    values = form(vgg_id, stages=2, schedule="interleaved-1f1b", **{"virtual-stages": 2})
    editor, slider, notice = act(context, "planner-schedule", values)
    assert slider["value"] == equal_boundaries(41, 4)  # 2 devices x 2 chunks
    assert "4 chunks of equal layer counts: 2 device(s) x 2 chunks each" in notice.children
    text, failed, _ = planning.plan_view(context, editor, slider["value"])
    assert not failed and "(interleaved-1f1b)" in text
    gantt, _ = planning.timeline_view(context, editor, slider["value"])
    assert gantt["layout"]["yaxis"]["ticktext"] == [
        "device 0 (chunks 0, 2)",
        "device 1 (chunks 1, 3)",
    ]
    # more micro-batches keep the cuts; more chunks per device cut the layers again
    kept, slider_kept, _ = act(
        context, "planner-microbatches", {**values, "microbatches": 16}, editor, slider["value"]
    )
    assert slider_kept is None and kept["num_microbatches"] == 16
    three = {**values, "virtual-stages": 3}
    recut, slider3, _ = act(context, "planner-virtual-stages", three, kept, slider["value"])
    assert len(slider3["value"]) + 1 == 6 and recut["virtual_stages"] == 3
    back, slider1, _ = act(
        context, "planner-schedule", {**values, "schedule": "1f1b"}, recut, slider3["value"]
    )
    assert len(slider1["value"]) + 1 == 2 and back["schedule"] == "1f1b"
    # a count the schedule cannot run is named, and a chunk count that is no count too
    odd = {**values, "microbatches": 3}
    shaped, _, _ = act(context, "planner-microbatches", odd, editor, slider["value"])
    text, failed, _ = planning.plan_view(context, shaped, slider["value"])
    assert failed and "num_microbatches a multiple of 2" in text
    _, _, notice = act(context, "planner-virtual-stages", {**values, "virtual-stages": 0})
    assert "'chunks per device' must be a whole number of at least 1, got 0" in notice.children


def test_an_opened_plan_sets_the_form(context, vgg_id):
    values = form(vgg_id, stages=2, schedule="interleaved-1f1b", **{"virtual-stages": 2})
    editor, slider, _ = act(context, "planner-schedule", values)
    saved, _ = planning.save_plan(context, editor, slider["value"], "chunks", approve=False)
    opened, _, _ = callbacks.open_stored(context, saved["plan_id"])
    assert callbacks.form_of(opened) == {
        "schedule": "interleaved-1f1b",
        "virtual-stages": 2,
        "microbatches": 8,
        "microbatch-size": opened["microbatch_size"],
        "optimizer": "adam",
        "stages": 2,
        "cluster": opened["cluster_id"],  # the cluster that records its 48 GiB per device
    }
    plain = callbacks.form_of({**opened, "schedule": "1f1b", "virtual_stages": 1})
    assert plain["schedule"] == "1f1b" and plain["stages"] == 4
    # a plan saved with a memory per device is stored on a cluster that records it: the
    # reopened form picks that cluster, so that its next reshape keeps the limit
    capped = form(vgg_id, memory="40GiB")
    editor, slider, _ = act(context, "planner-profile", capped)
    saved, _ = planning.save_plan(context, editor, slider["value"], "capped", approve=False)
    cluster_id = context.client.plan(saved["plan_id"])["cluster_id"]
    assert cluster_id is not None
    first = callbacks.first_view(context, vgg_id, f"?plan={saved['plan_id']}")
    assert first["form"]["cluster"] == cluster_id
    reshaped, _, _ = act(
        context,
        "planner-microbatches",
        {**capped, **first["form"], "memory": "", "microbatches": 4},
        first["editor"],
        slider["value"],
    )
    assert reshaped["cluster_id"] == cluster_id
    text, _ = planning.prediction_view(context, reshaped, slider["value"])
    assert "fits in device memory" in text or "does not fit" in text, text


def test_the_first_view_is_what_the_first_calls_would_draw(context, vgg_id):
    """The layout draws the page's first plan and prediction itself; they must be what
    the editor and prediction callbacks would have drawn from the same form."""
    first = callbacks.first_view(context, vgg_id, None)
    editor, slider, _ = act(
        context, "planner-profile", {**callbacks.FORM_DEFAULTS, "profile": vgg_id}
    )
    assert first["slider"] == slider and first["slider"]["value"] == equal_boundaries(41, 4)
    assert first["editor"] == {**editor, "cuts": slider["value"]}
    text, failed = planning.prediction_view(context, first["editor"], slider["value"])
    assert first["prediction"] == text and text.startswith("Predicted step") and not failed
    assert first["drawn"] == callbacks.drawn_key(first["editor"], slider["value"])
    # an opened plan sets the form; no profile leaves the drawing to the callbacks
    values = form(vgg_id, stages=2, schedule="interleaved-1f1b", **{"virtual-stages": 2})
    editor, slider, _ = act(context, "planner-schedule", values)
    saved, _ = planning.save_plan(context, editor, slider["value"], "first", approve=False)
    opened = callbacks.first_view(context, vgg_id, f"?plan={saved['plan_id']}")
    assert opened["editor"]["plan_id"] == saved["plan_id"]
    assert "Opened plan" in opened["notice"].children
    assert {k: opened["form"][k] for k in ("schedule", "virtual-stages", "stages")} == {
        "schedule": "interleaved-1f1b",
        "virtual-stages": 2,
        "stages": 2,
    }
    nothing = callbacks.first_view(context, None, None)
    assert nothing["form"] == {**callbacks.FORM_DEFAULTS, "profile": None}
    assert nothing["editor"] is None and "Pick a profile" in nothing["notice"].children
    assert "prediction" not in nothing


def test_auto_asks_the_planners_for_the_schedule(context, vgg_id):
    values = form(vgg_id, schedule="auto", algorithm="optimal", straight=["straight"])
    editor, slider, notice = act(context, "planner-run", values)
    assert editor["auto"] and editor["source"] == "optimal"
    assert planning.planner_body(editor, 4, None)["schedule"] == "auto"
    chosen = callbacks.schedule_name(
        {"schedule": editor["schedule"], "virtual_stages": editor["virtual_stages"]}
    )
    assert f"with {chosen} (chosen by auto)" in notice.children
    text, failed, _ = planning.plan_view(context, editor, slider["value"])
    assert not failed and f"({editor['schedule']})" in text
    # by hand, auto starts from 1f1b; asked for a schedule they do not plan, planners say so
    manual, _, _ = act(context, "planner-schedule", {**values, "algorithm": "uniform"})
    assert manual["schedule"] == "1f1b"
    _, slider, notice = act(context, "planner-run", form(vgg_id, schedule="zero-bubble"))
    assert slider is None and "ps-error" in notice.className
    assert "the planners plan gpipe, 1f1b, pipedream (or choose with auto)" in notice.children


def test_infeasible_planner_says_so(context, vgg_id):
    _editor, slider, notice = act(
        context, "planner-run", form(vgg_id, memory="1GiB", algorithm="optimal")
    )
    assert slider is None and "ps-error" in notice.className
    assert "optimal found no plan" in notice.children
    # with a plan in the editor, the notice says that the plan shown is the earlier one
    editor, _, _ = act(context, "planner-profile", form(vgg_id))
    kept, slider, notice = act(
        context, "planner-run", form(vgg_id, memory="1GiB", algorithm="optimal"), editor
    )
    assert kept == editor and slider is None
    assert "The plan below is the one you had before" in notice.children
    assert "not optimal's" in notice.children


def test_policies_apply_and_change_memory(context, vgg_id):
    editor, slider, _ = act(context, "planner-profile", form(vgg_id))
    names = [layer.name for layer in context.profile(vgg_id).layers[:11]]
    _, _, kept = planning.editor_documents(context, editor, slider["value"])
    recomputed, _, notice = act(
        context,
        "planner-policy-apply",
        form(vgg_id),
        editor,
        slider["value"],
        layers=names,
        policy="recompute",
    )
    assert "11 layer(s) set to recompute" in notice.children
    assert callbacks.policy_summary(recomputed).startswith("11 layer(s) recompute, 0 swap")
    _, _, result = planning.editor_documents(context, recomputed, slider["value"])
    assert result.stages[0].peak_bytes < kept.stages[0].peak_bytes
    assert result.stages[0].recompute_ms > 0
    back, _, _ = act(
        context,
        "planner-policy-apply",
        form(vgg_id),
        recomputed,
        slider["value"],
        layers=names,
        policy="keep",
    )
    assert back["policies"] == {}


def test_compare_all_then_open_and_side_by_side(context, vgg_id):
    editor, _, _ = act(context, "planner-profile", form(vgg_id))
    rows = planning.run_planners(context, editor, 4, None)
    _table, figure, openable = callbacks.compare_view(rows)
    assert {"uniform", "optimal", "pipedream"} <= set(openable)
    assert len(figure["data"][0]["x"]) == len(openable)
    loaded, slider, _notice = act(
        context, "planner-compare-open", form(vgg_id), editor, candidates=rows, pick="uniform"
    )
    assert slider["value"] == equal_boundaries(41, 4) and loaded["source"] == "uniform"
    side = planning.candidate_gantt(context, editor, rows[0])
    assert side["layout"]["title"]["text"].startswith("uniform: Predicted schedule")


def test_save_and_approve_store_the_edited_plan(context, vgg_id):
    editor, _, _ = act(context, "planner-profile", form(vgg_id))
    saved, notice = planning.save_plan(context, editor, [5, 21, 31], "edited", approve=False)
    assert notice.startswith(f"Plan {saved['plan_id']} is draft. It is judged on cluster ")
    stored = context.client.plan(saved["plan_id"])
    assert [len(s["layers"]) for s in stored["document"]["stages"]] == [5, 16, 10, 10]
    # the memory per device went with it, as a cluster of free links
    cluster = context.client.cluster(stored["cluster_id"])
    assert cluster["document"]["devices"][0]["memory_bytes"] == 48 * 2**30
    # no worker is online: the backend asks for a confirmation naming why, and the plan
    # stays a draft until it is given
    with pytest.raises(planning.NeedsConfirmation) as asked:
        planning.save_plan(context, saved, [5, 21, 31], None, approve=True)
    assert "needs 4 ranks but the online workers offer 0 slots" in asked.value.problems
    assert context.client.plan(saved["plan_id"])["state"] == "draft"
    approved, notice = planning.approve_anyway(context, asked.value.editor)
    assert approved["plan_id"] == saved["plan_id"] and notice.endswith("is approved.")
    assert context.client.plan(saved["plan_id"])["state"] == "approved"
    moved, _ = planning.save_plan(context, approved, [6, 21, 31], None, approve=False)
    assert moved["plan_id"] != saved["plan_id"]


def test_exports_are_a_plan_and_a_chrome_trace(context, vgg_id):
    editor, slider, _ = act(context, "planner-profile", form(vgg_id))
    name, text = planning.export_plan(context, editor, slider["value"])
    assert name == "vgg16-1f1b-4stages.plan.json"
    assert Plan.model_validate_json(text).num_stages == 4
    name, text = planning.export_trace(context, editor, slider["value"])
    events = json.loads(text)["traceEvents"]
    assert {e["cat"] for e in events if e["ph"] == "X"} >= {"forward", "backward"}


@pytest.mark.parametrize("stages", [1, 41])
def test_extreme_stage_counts(context, vgg_id, stages):
    editor, slider, _ = act(context, "planner-stages", form(vgg_id, stages=stages))
    assert len(slider["value"]) == stages - 1
    _, failed, _ = planning.plan_view(context, editor, slider["value"])
    assert not failed


def test_policy_picker_lists_the_profiles_layers(context, vgg_id):
    names = callbacks.layer_names(context, vgg_id)
    assert len(names) == 41 and names[0] == context.profile(vgg_id).layers[0].name
    assert callbacks.layer_names(context, None) == []
    assert callbacks.layer_names(context, 999) == []  # not stored: nothing to pick


def test_a_drag_says_the_plan_is_edited_by_hand(context, vgg_id):
    editor, slider, notice = act(context, "planner-run", form(vgg_id))  # balance-time
    editor = {**editor, "cuts": slider["value"]}  # what the page keeps beside the editor
    assert callbacks.drag_notice(slider["value"], editor) is callbacks.no_update
    moved = [slider["value"][0] + 1, *slider["value"][1:]]
    notice = callbacks.drag_notice(moved, editor)
    assert notice.children.startswith("Edited by hand from balance-time's plan: stages begin at")


def test_one_device_per_stage_keeps_optimal_from_replicating(context, vgg_id):
    """Asked for 4 stages, optimal may answer with replicated stages; with the switch on
    every stage has one device, and the compare table says how many stages each plan has."""
    editor = callbacks.form_editor(form(vgg_id, straight=["straight"]))
    assert planning.planner_body(editor, 4, None)["straight"] is True
    rows = planning.run_planners(context, editor, 4, ["optimal", "pipedream"])
    for row in rows:
        assert all(stage.get("replicas", 1) == 1 for stage in row["plan"]["stages"])
    assert planning.planner_body(callbacks.form_editor(form(vgg_id)), 4, None)["straight"] is False


def test_a_save_or_approval_leaves_the_drawn_prediction_alone(context, vgg_id):
    """The prediction and its charts are drawn again when the plan changes, not when it is
    only stored or approved (which changes the editor's plan id and state)."""
    editor, slider, _ = act(context, "planner-profile", form(vgg_id))
    key = callbacks.drawn_key(editor, slider["value"])
    saved, _ = planning.save_plan(context, editor, slider["value"], None, approve=False)
    assert saved["plan_id"] is not None
    assert callbacks.drawn_key(saved, slider["value"]) == key
    assert callbacks.drawn_key({**saved, "plan_state": "approved"}, slider["value"]) == key
    assert callbacks.drawn_key(editor, [5, 21, 31]) != key
    assert callbacks.drawn_key({**editor, "policies": {"layer3": "swap"}}, slider["value"]) != key
    assert callbacks.drawn_key({**editor, "num_microbatches": 16}, slider["value"]) != key
    assert callbacks.drawn_key(None, slider["value"]) is None


def test_the_page_starts_on_the_opened_plans_profile_or_the_newest(context, vgg_id):
    """The layout fills the profile and cluster choices itself (one round trip fewer
    before the first prediction): the profile of ``?plan=ID``'s plan, else the newest."""
    first = callbacks.choices(context, None)
    assert first["profile"] == vgg_id and [o["value"] for o in first["profiles"]] == [vgg_id]
    editor, slider, _ = act(context, "planner-profile", form(vgg_id))
    saved, _ = planning.save_plan(context, editor, slider["value"], None, approve=False)
    newer = context.client.post(
        "/api/profiles", {"profile": json.loads((BUILTIN_PROFILES / "gpt24.json").read_text())}
    )["id"]
    assert callbacks.choices(context, None)["profile"] == newer
    assert callbacks.choices(context, f"?plan={saved['plan_id']}")["profile"] == vgg_id
    assert callbacks.choices(context, "?plan=99999")["profile"] == newer  # a plan gone


@pytest.mark.parametrize("field", ["virtual-stages", "stages", "microbatches", "profile"])
@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "\x00",
        pytest.param("²", id="superscript-2"),  # a digit to str.isdigit, not to int
        pytest.param("9" * 5000, id="5000-digits"),  # over what int() takes from a string
        float("inf"),
        float("nan"),
        2.5,
        True,
        -3,
    ],
)
def test_a_hostile_form_value_is_named_not_raised(context, vgg_id, field, value):
    """Any value may be posted to the callback, not only what the number inputs allow:
    each is refused in words naming the field, and the edited plan stays."""
    values = form(vgg_id, stages=2, schedule="interleaved-1f1b", **{"virtual-stages": 2})
    before, slider, _ = act(context, "planner-schedule", values)
    label = {"virtual-stages": "chunks per device"}.get(field, field)
    for trigger in (f"planner-{field}", "planner-template", "planner-run"):
        kept, moved, notice = act(
            context, trigger, {**values, field: value}, before, slider["value"]
        )
        assert kept == before and moved is None, trigger
        assert f"'{label}' must be a whole number of at least 1, got {value!r}" in (notice.children)


def _with_halves(profile: Profile, input_share: float, weight_share: float) -> Profile:
    """``profile`` whose layers' backward halves take these shares of their fused backward."""
    layers = [
        layer.model_copy(
            update={
                "bwd_input_ms": layer.bwd_ms * input_share,
                "bwd_weight_ms": layer.bwd_ms * weight_share,
            }
        )
        for layer in profile.layers
    ]
    return profile.model_copy(update={"layers": layers})


def test_zero_bubble_says_what_the_split_backward_costs_in_the_profile():
    profile = big_profile(4)
    assert planning.split_backward_note(profile) == ""  # no halves measured
    assert planning.split_backward_note(_with_halves(profile, 0.75, 0.6)) == (
        " · the profile times the split backward +35% against the fused one"
    )
    assert planning.split_backward_note(_with_halves(profile, 0.5, 0.52)) == ""


def test_a_plan_that_cannot_be_simulated_is_not_called_missing(monkeypatch):
    def refuse(*_args):
        raise PlannerError("device 2 does not exist")

    monkeypatch.setattr(planning, "editor_documents", refuse)
    editor = {"profile_id": 1}
    prediction, failed = planning.prediction_view(None, editor, [3])
    assert failed and "device 2 does not exist" in prediction
    for figure in [
        *planning.stage_figures(None, editor, [3]),
        *planning.timeline_view(None, editor, [3]),
    ]:
        said = figure["layout"]["annotations"][0]["text"]
        assert said.startswith("This plan cannot be simulated"), said
