"""Plans page callbacks (``pages/plans.py``) and the Planner opening a stored plan, against
the real backend in-process."""

from pipestudio.dashboard import planning
from pipestudio.dashboard.pages import planner_callbacks as callbacks
from pipestudio.dashboard.pages import plans
from tests.dashboard.test_planner_page import act, form


def _saved(context, vgg_id, boundaries=(5, 21, 31)):
    editor, _, _ = act(context, "planner-profile", form(vgg_id))
    saved, _ = planning.save_plan(context, editor, list(boundaries), "by hand", approve=False)
    return saved["plan_id"]


def test_the_list_shows_every_plan_with_its_prediction_state_and_runs(context, vgg_id):
    plan_id = _saved(context, vgg_id)
    listed, options, selected = plans.list_plans(context, None)
    assert selected == plan_id and options[0]["label"] == f"{plan_id}: by hand (draft)"
    [row] = plans.plan_rows(
        context.client.plans(),
        {vgg_id: "vgg16"},
        [{"id": 7, "plan_id": plan_id}, {"id": 9, "plan_id": plan_id}],
    )
    assert (row["profile"], row["stages"], row["replicas"], row["state"], row["runs"]) == (
        "vgg16",
        "4",
        "1 each",
        "draft",
        "run 7, run 9",
    )
    assert float(row["predicted step (ms)"]) > 0 and row["fits"] == "yes"
    assert listed.id == "plans-table"


def test_duplicate_rename_back_to_draft_and_delete(context, vgg_id):
    plan_id = _saved(context, vgg_id)
    notice, changed = plans.act(context, "plans-duplicate", plan_id, None)
    assert changed and "draft copy of plan" in notice.children
    copy_id = max(p["id"] for p in context.client.plans())
    copy = context.client.plan(copy_id)
    original = context.client.plan(plan_id)
    assert copy["name"] == "by hand (copy)" and copy["state"] == "draft"
    assert planning.fingerprint(copy["document"]) == planning.fingerprint(original["document"])
    notice, changed = plans.act(context, "plans-rename", copy_id, "  second try ")
    assert changed and context.client.plan(copy_id)["name"] == "second try"
    assert not plans.act(context, "plans-rename", copy_id, " ")[1]  # no name, no change
    context.client.update_plan(copy_id, {"state": "approved", "force": True})
    notice, changed = plans.act(context, "plans-draft", copy_id, None)
    assert changed and context.client.plan(copy_id)["state"] == "draft"
    notice, changed = plans.act(context, "plans-delete", copy_id, None)
    assert changed and copy_id not in {p["id"] for p in context.client.plans()}
    notice, changed = plans.act(context, "plans-delete", copy_id, None)
    assert not changed and "ps-error" in notice.className  # gone: said so, no 500
    assert plans.act(context, "plans-delete", None, None)[0].children == "Pick a plan first."


def test_the_planner_opens_a_stored_plan_as_it_was_saved(context, vgg_id):
    plan_id = _saved(context, vgg_id)
    assert callbacks.opened_plan(f"?plan={plan_id}") == plan_id
    assert callbacks.opened_plan("?plan=x") is None and callbacks.opened_plan(None) is None
    for hostile in ("²", "١٢", "9" * 5000, "-1", "1e9", "%00", "1 OR 1=1"):
        assert callbacks.opened_plan(f"?plan={hostile}") is None, hostile
        assert callbacks.choices(context, f"?plan={hostile}")["profile"] is not None
        first = callbacks.first_view(context, vgg_id, f"?plan={hostile}")
        assert first["editor"]["plan_id"] is None and first["prediction"], hostile
    gone = callbacks.first_view(context, vgg_id, "?plan=99999")
    assert gone["editor"] is None and "99999" in gone["notice"].children
    editor, slider, notice = callbacks.editor_action(
        context,
        None,
        form(vgg_id, stages=2),
        None,
        None,
        [],
        None,
        None,
        "keep",
        f"?plan={plan_id}",
    )
    assert slider["value"] == [5, 21, 31] and editor["plan_id"] == plan_id
    assert editor["plan_state"] == "draft" and f"Opened plan {plan_id}" in notice.children
    # the form then shows the plan's profile: picking it does not reset what was opened
    kept, slider, _ = act(context, "planner-profile", form(vgg_id, stages=2), editor)
    assert kept == editor and slider is None
    # saving it unchanged stores nothing new
    again, _ = planning.save_plan(context, editor, [5, 21, 31], None, approve=False)
    assert again["plan_id"] == plan_id and len(context.client.plans()) == 1
