"""Runs page callbacks (``pages/runs_actions.py``, ``monitor.py``, ``observed.py``)."""

import json

import pytest
from dash import no_update

from pipestudio.dashboard import monitor
from pipestudio.dashboard.components.fidelity import fidelity_view, headline
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.pages import runs_actions as actions
from tests.dashboard.conftest import big_profile


def approved_plan(context, vgg_id):
    plan = context.client.create_plan(
        {
            "profile_id": vgg_id,
            "manual": {"boundaries": [20], "num_microbatches": 2, "schedule": "1f1b"},
        }
    )
    return context.client.update_plan(plan["id"], {"state": "approved", "force": True})


def test_options_offer_approved_plans_only(context, vgg_id):
    draft = context.client.create_plan(
        {
            "profile_id": vgg_id,
            "manual": {"boundaries": [10], "num_microbatches": 2, "schedule": "gpipe"},
        }
    )
    approved = approved_plan(context, vgg_id)
    plans, runs, selected = actions.options(context, None)
    assert [p["value"] for p in plans] == [approved["id"]] != [draft["id"]]
    assert (runs, selected) == ([], None)


def test_launch_defaults_come_from_the_profile(context):
    profile = big_profile(4).model_copy(
        update={
            "model": "mlp",
            "metadata": {"config.layers": 3, "config.width": 64, "torch": "2.13"},
        }
    )
    created = context.client.create_profile({"profile": profile.model_dump(mode="json")})
    plan = context.client.create_plan(
        {
            "profile_id": created["id"],
            "manual": {"boundaries": [2], "num_microbatches": 2, "schedule": "1f1b"},
        }
    )
    assert actions.launch_defaults(context, plan["id"]) == ("mlp", "layers=3 width=64")


def test_launch_without_workers_explains_why(context, vgg_id):
    plan = approved_plan(context, vgg_id)
    notice, run_id = actions.launch(context, plan["id"], "vgg16", "", 5)
    assert run_id is None and "ps-error" in notice.className
    assert "needs 2 ranks" in notice.children and "free slot" in notice.children
    notice, run_id = actions.launch(context, plan["id"], "vgg16", "width", 5)
    assert "model argument 'width' is not KEY=VALUE" in notice.children
    notice, _ = actions.launch(context, None, "vgg16", "", 5)
    assert "Pick an approved plan" in notice.children


def test_no_run_selected_shows_empty_charts(context):
    *figures, status, _fidelity, _proposals, stop_polling, run_options = actions.tick(context, None)
    assert len(figures) == 6 and all(f["data"] == [] for f in figures)
    assert status == "No run selected." and not stop_polling
    assert run_options is no_update


def metric(kind, stage, step, received_at, **data):
    return {
        "kind": kind,
        "stage": stage,
        "replica": 0,
        "step": step,
        "time_ms": 0.0,
        "received_at": received_at,
        "data": {"type": kind, "stage": stage, "step": step, **data},
    }


class RecordedBackend:
    """The read side of the API for one run, answering what a 2-stage run stored."""

    def __init__(self) -> None:
        self.steps = [
            metric(
                "step",
                s,
                k,
                f"2026-01-01T00:00:0{k}",
                start_ms=100.0 * k + s,
                end_ms=100.0 * k + 50 + s,
                busy_ms=40.0 + s,
                recompute_ms=0.0,
                swap_bytes=0,
                samples_per_s=160.0,
                **({"loss": 2.0 - k / 10} if s == 1 else {}),
            )
            for k in range(4)
            for s in range(2)
        ]
        self.memory = [
            metric("memory", s, k, "x", peak_bytes=2**28) for k in range(4) for s in range(2)
        ]
        self.ops = [
            metric(
                "op", s, 3, "x", op=op, microbatch=0, start_ms=300.0 + i * 10, end_ms=305.0 + i * 10
            )
            for s in range(2)
            for i, op in enumerate(("forward", "backward"))
        ]

    def run(self, run_id):
        return {
            "id": run_id,
            "plan_id": 7,
            "state": "running",
            "model": "mlp",
            "steps": 10,
            "last_step": 3,
            "ranks": [{}, {}],
            "message": None,
        }

    def plan(self, plan_id):
        return {
            "id": plan_id,
            "summary": {"samples_per_s": 200.0, "stage_device_memory_bytes": [2**30, 2**30]},
            "document": {"num_microbatches": 4, "microbatch_size": 2},
        }

    def calibrated_profile(self, run_id, window=20):
        def compared(measured, predicted, calibrated, **extra):
            return {
                **extra,
                "measured": measured,
                "predicted": predicted,
                "calibrated": calibrated,
                "predicted_error": measured / predicted - 1,
                "calibrated_error": measured / calibrated - 1,
            }

        return {
            "steps": [1, 3],
            "step_ms": compared(50.0, 40.0, 48.0),
            "stage_busy_ms": [compared(40.0 + s, 30.0, 40.0, stage=s) for s in range(2)],
        }

    def metrics(self, run_id, kinds, **_):
        return {"step": self.steps, "memory": self.memory, "op": self.ops}[kinds[0]]

    def events(self, run_id, after_id=0):
        return [
            {
                "kind": "migration",
                "step": None,
                "created_at": "2026-01-01T00:00:02.5",
                "message": "moved",
                "data": {
                    "ok": True,
                    "payload": {"moves": [{"layer": "block1", "from_stage": 0, "to_stage": 1}]},
                },
            }
        ]

    def proposals(self, run_id):
        return [
            {
                "id": 3,
                "state": "pending",
                "outcome": None,
                "document": {
                    "algorithm": "relieve",
                    "moves": [{"layer": "block1", "from_stage": 0, "to_stage": 1}],
                    "policy_changes": [],
                    "step_time_now_ms": 50.0,
                    "step_time_after_ms": 40.0,
                    "gain_ms": 10.0,
                    "gain_fraction": 0.2,
                    "migration_bytes": 2**20,
                    "migration_ms": 1.0,
                    "reason": "repays in 1 step",
                },
            }
        ]


def test_live_view_draws_measurements_and_the_migration():
    view = monitor.fetch_view(RecordedBackend(), 5)
    assert view.markers == [
        monitor.Marker(2.5, "migration scheduled: block1 0→1", "⇄ scheduled (step 2)")
    ]
    assert {op["step"] for op in view.ops} == {3}
    gantt, throughput, _busy, memory, _swap, loss = monitor.figures(view)
    assert gantt["layout"]["title"]["text"] == "Measured schedule of step 3"
    label = next(
        a for a in throughput["layout"]["annotations"] if a["text"] == "⇄ scheduled (step 2)"
    )
    assert label["hovertext"] == "migration scheduled: block1 0→1"  # the whole text on hover
    assert throughput["layout"]["xaxis"]["rangemode"] == "nonnegative"
    assert loss["data"][0]["y"] == pytest.approx([2.0, 1.9, 1.8, 1.7])
    assert memory["data"][0]["y"] == [0.25] * 4  # GiB, the unit of the 1 GiB limit
    assert monitor.status_text(view).startswith(
        "Run 5 of plan 7 (mlp): running, 4 of 10 steps (40%)"
    )
    card = actions.proposal_card(view.proposals[0])
    assert "gain 10.00 ms, 20.0%" in card.children[0].children
    assert card.children[-1].children[0].id == {"type": "runs-proposal-approve", "index": 3}
    trace = json.loads(monitor.measured_trace(view.ops, 5))
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X") == 4
    # 8 samples a step: 160 measured, 200 predicted, 166.7 calibrated
    texts = [a["text"] for a in throughput["layout"]["annotations"]]
    assert "calibrated 166.7 samples/s" in texts and "predicted 200.0 samples/s" in texts
    shown = fidelity_view(view.calibration, view.samples_per_step, "waiting")
    assert shown.children[0].children == (
        "Measured 160.0 samples/s · predicted 200.0 (measured -20.0%) · calibrated 166.7 "
        "(measured -4.0%) · steps 1..3"
    )
    counted = {
        **view.calibration,
        "model_flops": 2 * 10**11,
        "num_devices": 2,
        "peak_tflops": 10.0,
    }  # 2e11 FLOP in a 50 ms step: 4 TFLOP/s of 20
    assert headline(counted, view.samples_per_step).endswith(
        " · steps 1..3 · 4 TFLOP/s (MFU 20.0%)"
    )
    assert headline({**counted, "peak_tflops": None}, view.samples_per_step).endswith(
        " · 4 TFLOP/s"
    )
    rows = shown.children[1].children.children[1].children
    assert [[cell.children for cell in row.children] for row in rows] == [
        ["step", "50.00", "40.00", "+25.0%", "48.00", "+4.2%"],
        ["stage 0 compute", "40.00", "30.00", "+33.3%", "40.00", "+0.0%"],
        ["stage 1 compute", "41.00", "30.00", "+36.7%", "40.00", "+2.5%"],
    ]
    assert len(shown.children) == 2  # no time between ops measured: no line for it
    engine = {**view.calibration, "op_overhead_ms": 0.214, "core_wait": 1.3}
    line = fidelity_view(engine, view.samples_per_step, "waiting").children[2]
    assert line.id == "runs-fidelity-engine"
    assert line.children == (
        "Between two ops the engine spent 0.21 ms; the calibrated prediction adds it to "
        "every forward, backward and weight-gradient op. Ranks waited for a core between "
        "ops: calibrated compute x1.30."
    )


class ResumedBackend(RecordedBackend):
    """A run whose first attempt reached step 3 and failed; the second resumed from the
    checkpoint of step 2 with its clock at 0 again, and is at step 4."""

    def __init__(self) -> None:
        super().__init__()

        def step(stage, k, attempt, start_ms):
            return metric(
                "step",
                stage,
                k,
                f"2026-01-01T00:0{attempt}:0{k}",
                attempt=attempt,
                start_ms=start_ms + stage,
                end_ms=start_ms + 50 + stage,
                busy_ms=40.0 + attempt,
                recompute_ms=0.0,
                swap_bytes=0,
                samples_per_s=160.0,
                **({"loss": 2.0 - k / 10 - attempt} if stage == 1 else {}),
            )

        first = [step(s, k, 0, 100.0 * k) for k in range(4) for s in range(2)]
        second = [step(s, k, 1, 100.0 * (k - 2)) for k in range(2, 5) for s in range(2)]
        self.steps = sorted(first + second, key=lambda m: m["data"]["start_ms"])  # time order
        self.memory = [
            metric("memory", s, k, "x", attempt=a, peak_bytes=2**28 * (1 + a))
            for a, ks in ((0, range(4)), (1, range(2, 5)))
            for k in ks
            for s in range(2)
        ]
        self.ops = [
            metric(
                "op",
                s,
                k,
                "x",
                attempt=a,
                op="forward",
                microbatch=0,
                start_ms=float(k),
                end_ms=k + 5.0,
            )
            for a, k in ((0, 3), (1, 3), (1, 4))
            for s in range(2)
        ]


def test_a_resumed_run_shows_each_step_once_from_its_latest_attempt():
    view = monitor.fetch_view(ResumedBackend(), 5)
    assert [(e["step"], e["stage"], e["attempt"]) for e in view.steps] == [
        (0, 0, 0),
        (0, 1, 0),
        (1, 0, 0),
        (1, 1, 0),
        (2, 0, 1),
        (2, 1, 1),
        (3, 0, 1),
        (3, 1, 1),
        (4, 0, 1),
        (4, 1, 1),
    ]
    assert {(e["step"], e["attempt"]) for e in view.memory if e["step"] >= 2} == {
        (2, 1),
        (3, 1),
        (4, 1),
    }
    assert {(op["step"], op["attempt"]) for op in view.ops} == {(4, 1)}
    _gantt, throughput, busy, _memory, _swap, loss = monitor.figures(view)
    # one point per step, each over a span on one attempt's clock (50 ms + 1 ms offset)
    assert throughput["data"][0]["x"] == [0, 1, 2, 3, 4]
    assert throughput["data"][0]["y"] == pytest.approx([160.0 * 50 / 51] * 5)
    assert busy["data"][0]["y"] == [40.0, 40.0, 41.0, 41.0, 41.0]
    assert loss["data"][0]["y"] == pytest.approx([2.0, 1.9, 0.8, 0.7, 0.6])


def test_the_run_picker_follows_the_watched_runs_state():
    picked = [
        {"label": "run 5: plan 7, mlp, starting", "value": 5},
        {"label": "run 4: plan 7, mlp, finished", "value": 4},
    ]
    *_, stop_polling, run_options = actions.tick(Context(RecordedBackend()), 5, picked)
    assert not stop_polling
    assert run_options == [{"label": "run 5: plan 7, mlp, running", "value": 5}, picked[1]]
    # once the label is current the picker is left alone, not redrawn every second
    assert actions.tick(Context(RecordedBackend()), 5, run_options)[-1] is no_update


def test_migrations_on_one_step_share_a_marker():
    steps = [{"step": 4, "received_at": "2026-01-01T00:00:04"}]
    events = [
        {
            "kind": kind,
            "step": None,
            "created_at": "2026-01-01T00:00:05",
            "message": "no live migration",
            "data": {
                "ok": False,
                "payload": {"moves": [{"layer": "b1", "from_stage": 0, "to_stage": 1}]},
            },
        }
        for kind in ("migration_requested", "migration", "migration")
    ]
    events[0]["data"] = {"moves": events[1]["data"]["payload"]["moves"]}
    assert monitor.migration_markers(events, steps) == [
        monitor.Marker(
            4.5,
            "migration requested: b1 0→1<br>migration failed: b1 0→1",
            "⇄ requested (step 4), ⇄ failed (step 4)",
        )
    ]
    # the engine's report of a migration at a step not measured yet waits for that step
    later = {
        "kind": "migration",
        "step": 9,
        "created_at": "2026-01-01T00:00:05",
        "data": {"moves": [{"layer": "b1", "from_stage": 0, "to_stage": 1}]},
    }
    assert [m.step for m in monitor.migration_markers([later], steps)] == []
    reached = monitor.migration_markers(
        [later], [*steps, {"step": 9, "received_at": "2026-01-01T00:00:09"}]
    )
    assert reached == [monitor.Marker(9.5, "migrated: b1 0→1", "⇄ migrated (step 9)")]


def test_progress_counts_steps_done_and_the_time_left():
    """Steps count from 0: a run whose last step is 49 of 50 has done all 50; a running
    one says its pace over its latest steps and the time left at that pace."""
    steps = [{"step": k, "stage": 0, "end_ms": 500.0 * (k + 1)} for k in range(20)]
    running = monitor.RunView(
        run={"state": "running", "last_step": 19, "steps": 100}, plan={}, steps=steps
    )
    assert monitor.progress(running) == (20, pytest.approx(2.0))
    assert monitor.progress_text(running) == "20 of 100 steps (20%) · 2 steps/s · about 40 s left"
    done = monitor.RunView(run={"state": "finished", "last_step": 49, "steps": 50}, plan={})
    assert monitor.progress_text(done) == "50 of 50 steps (100%)"


class DivergedBackend(RecordedBackend):
    """A run whose loss became NaN at step 2 and infinite at step 3 (stored as names), that
    failed saying so, and whose backend rejected a stranger's message."""

    def __init__(self) -> None:
        super().__init__()
        for m in self.steps:
            if m["stage"] == 1 and m["step"] >= 2:
                m["data"]["loss"] = "NaN" if m["step"] == 2 else "Infinity"

    def run(self, run_id):
        return {
            **super().run(run_id),
            "state": "failed",
            "message": "loss is NaN at step 2 (stage 1)",
        }

    def events(self, run_id, after_id=0):
        return [
            *super().events(run_id),
            {
                "kind": "rejected",
                "created_at": "2026-01-01T00:00:03",
                "step": None,
                "message": "message 9 (run_state) of worker x was rejected: worker x holds no "
                "rank of run 5",
                "data": {},
            },
        ]


def test_a_diverged_loss_is_a_gap_and_the_reason_is_shown():
    view = monitor.fetch_view(DivergedBackend(), 5)
    loss = monitor.figures(view)[-1]
    assert loss["data"][0]["y"] == [2.0, 1.9, None, None]  # gaps, not points at 0
    assert loss["layout"]["title"]["text"] == "Training loss (NaN from step 2)"
    status = monitor.status_text(view)
    assert "failed, 4 of 10 steps (40%)" in status and "loss is NaN at step 2 (stage 1)" in status
    assert "1 worker message(s) rejected, the latest: message 9 (run_state)" in status


def test_an_applied_proposal_shows_its_measured_gain_beside_the_predicted_one():
    """Steps take 50 ms until the migration done at step 5 and 40 ms after it: the card of
    the applied proposal says so, next to its predicted gain."""
    backend = RecordedBackend()
    view = monitor.RunView(backend.run(5), backend.plan(7))
    view.steps = [
        {
            "step": k,
            "stage": s,
            "replica": 0,
            "start_ms": 100.0 * k,
            "end_ms": 100.0 * k + (50.0 if k < 5 else 40.0),
            "busy_ms": 30.0,
            "samples_per_s": 8 / (50.0 if k < 5 else 40.0) * 1e3,
        }
        for k in range(12)
        for s in range(2)
    ]
    view.events = [{"kind": "migration", "data": {"phase": "done", "step": 5, "moves": []}}]
    view.proposals = [{**backend.proposals(5)[0], "state": "applied"}]
    gains = actions.measured_gains(view)
    assert gains == {3: pytest.approx((50.0, 40.0))}
    card = actions.proposal_card(view.proposals[0], gains[3])
    assert card.children[-1].children == (
        "Measured step 50.00 → 40.00 ms (gain 10.00 ms, 20.0%) against the predicted 10.00 ms"
    )
    view.proposals = [{**backend.proposals(5)[0], "state": "pending"}]
    assert actions.measured_gains(view) == {}


def test_the_first_view_is_what_the_first_calls_would_draw(context):
    """The layout draws the lists and the newest run's monitor itself (no run yet here):
    what the options and tick callbacks would have drawn first."""
    from pipestudio.dashboard.pages import runs

    first = runs.first_view(context)
    plans, run_options, selected = actions.options(context, None)
    assert (first["plans"], first["runs"], first["selected"]) == (plans, run_options, selected)
    ticked = actions.tick(context, selected, run_options)
    assert list(first["figures"].values()) == ticked[: len(runs.GRAPHS)]
    assert first["status"] == "No run selected." and first["ended"] is False
    assert first["proposals_key"] == runs.proposals_key(ticked[len(runs.GRAPHS) + 2])
    assert runs.first_view(None)["status"] == "No run selected."


def test_the_measured_gantt_draws_the_newest_step_every_stage_finished():
    steps = [
        {"stage": stage, "replica": 0, "step": step}
        for stage, step in ((0, 0), (1, 0), (0, 1), (1, 1), (1, 2))
    ]
    assert monitor.complete_step(steps) == 1
    assert monitor.complete_step([]) is None
    ops = [
        {"stage": 0, "replica": 0, "step": 1, "attempt": 0, "op": "forward"},
        {"stage": 1, "replica": 0, "step": 1, "attempt": 1, "op": "forward"},
        {"stage": 1, "replica": 0, "step": 2, "attempt": 1, "op": "forward"},
    ]
    assert monitor.last_step_ops(ops, 1) == [ops[1]]
