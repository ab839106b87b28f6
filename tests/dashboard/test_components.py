"""Figure builders (``dashboard/components``), called directly."""

import itertools
import json
import re
from dataclasses import replace

import pytest

from pipestudio.dashboard import monitor, planning
from pipestudio.dashboard.components import (
    compare,
    gantt,
    memory_charts,
    profile_charts,
    run_charts,
    stage_charts,
)
from pipestudio.dashboard.components.style import OP_COLORS, byte_unit, format_bytes
from pipestudio.dashboard.pages import planner_callbacks
from pipestudio.planner import cluster_template, plan_template, simulate
from pipestudio.planner.algorithms.optimal.planner import step_claim
from tests.dashboard.conftest import big_profile


@pytest.fixture(scope="module")
def tight_result():
    """1F1B on 4 stages where stage 0 holds too many activations for its device."""
    profile = big_profile(40)
    plan = plan_template(profile, 4, 8, "1f1b")
    return simulate(profile, plan, cluster_template([4], [10.0], device_memory_bytes=80 * 2**20))


def names(figure):
    return [trace["name"] for trace in figure["data"]]


def test_byte_units_follow_the_size():
    assert byte_unit(3 * 2**30) == ("GiB", 2**30)
    assert byte_unit(500) == ("bytes", 1.0)
    assert format_bytes(1.5 * 2**20) == "1.50 MiB"
    assert format_bytes(None) == "—"


def test_layer_charts_have_one_trace_per_quantity_with_units():
    profile = big_profile(30)
    times = profile_charts.layer_time_figure(profile)
    assert names(times) == ["forward", "backward"]
    assert times["data"][0]["y"][3] == profile.layers[3].fwd_ms
    assert "(ms" in times["layout"]["yaxis"]["title"]["text"]
    sizes = profile_charts.layer_bytes_figure(profile)
    assert names(sizes) == ["parameters", "saved for backward", "output (sent on)"]
    assert sizes["data"][0]["y"][0] == 1.0  # 1 MiB of parameters, drawn in MiB
    assert "MiB" in sizes["layout"]["yaxis"]["title"]["text"]


def test_empty_states_say_what_to_do():
    for figure in (
        profile_charts.layer_time_figure(None),
        stage_charts.stage_memory_figure(None),
        gantt.schedule_gantt(None),
        memory_charts.memory_timeline_figure(None),
        compare.compare_figure([]),
        run_charts.loss_figure([]),
    ):
        assert figure["data"] == []
        assert figure["layout"]["annotations"][0]["text"]


def test_stage_bars_name_the_bottleneck_and_the_memory_limit(tight_result):
    compute = stage_charts.stage_compute_figure(tight_result)
    busiest = max(range(4), key=lambda s: tight_result.stages[s].busy_ms)
    assert compute["layout"]["annotations"][0]["x"] == f"stage {busiest}"
    idle = next(t for t in compute["data"] if t["name"] == "idle (bubble)")
    assert idle["y"][busiest] == pytest.approx(
        tight_result.step_time_ms - tight_result.stages[busiest].busy_ms
    )
    memory = stage_charts.stage_memory_figure(tight_result)
    limit = next(t for t in memory["data"] if t["name"] == "device memory limit")
    assert limit["y"] == [80.0] * 4  # MiB
    assert not tight_result.stages[0].fits
    assert any("over by" in a["text"] for a in memory["layout"]["annotations"])
    assert "does NOT fit" in memory["layout"]["title"]["text"]


def drawn_bars(shape):
    """(row, start ms, end ms) of each bar (a horizontal stroke) of a Gantt shape's path."""
    found = re.findall(r"M([-\d.e+]+),([-\d.]+)H([-\d.e+]+)", shape["path"])
    return [(round(float(y)), float(start), float(end)) for start, y, end in found]


def test_gantt_has_a_row_per_stage_a_shape_per_op_kind_and_visible_bubbles(tight_result):
    figure = gantt.schedule_gantt(tight_result)
    kinds = {op.op for op in tight_result.timeline}
    shapes = figure["layout"]["shapes"]
    assert len(shapes) == len(figure["data"]) == len(kinds) + 1  # + idle
    assert [s["name"] for s in shapes] == [t["legendgroup"] for t in figure["data"]]
    assert all(s["showlegend"] for s in shapes)
    assert not any(t["showlegend"] for t in figure["data"])
    assert figure["layout"]["yaxis"]["ticktext"] == [f"stage {s}" for s in range(4)]
    assert figure["layout"]["yaxis"]["tickvals"] == [0, 1, 2, 3]
    colors = {s["name"]: s["line"]["color"] for s in shapes}
    assert colors["forward"] == OP_COLORS["forward"] != colors["backward"]
    forward = next(s for s in shapes if s["name"] == "forward")
    assert len(drawn_bars(forward)) == sum(1 for op in tight_result.timeline if op.op == "forward")
    idle = drawn_bars(shapes[0])
    assert shapes[0]["name"] == "idle (bubble)"
    # 1F1B with 4 stages and 8 micro-batches: the bubble is (p-1)/(m+p-1) of each row at
    # uniform cost; here the bars must add up to the idle time the stage bars report.
    for stage in tight_result.stages:
        drawn = sum(end - start for row, start, end in idle if row == stage.index)
        assert drawn == pytest.approx(tight_result.step_time_ms - stage.busy_ms, abs=1e-3)


def test_gantt_hover_names_the_op_anywhere_along_its_bar():
    shape, trace = gantt.kind_layers(
        "forward",
        "#000",
        "compute",
        [(2, 10.0, 110.0, "stage 2: forward of micro-batch 0")],
        row_px=34.0,
        hover_step_ms=30.0,
    )
    assert drawn_bars(shape) == [(2, 10.0, 110.0)]
    assert shape["line"]["width"] == 17.0  # the compute lane is half a row
    # every place on the bar is within half a step of one of its hover points
    points = [10.0, *trace["x"], 110.0]
    assert trace["x"][0] - 10.0 <= 15.0 and 110.0 - trace["x"][-1] <= 15.0
    assert max(b - a for a, b in itertools.pairwise(points)) <= 30.0
    assert set(trace["text"]) == {"stage 2: forward of micro-batch 0"}
    assert gantt.kind_layers("backward", "#000", "compute", [(0, 1.0, 2.0, "b")], 34.0, 30.0)[1][
        "x"
    ] == [1.5]  # one point, in the middle
    assert trace["mode"] == "none" and trace["legendgroup"] == shape["legendgroup"]


def test_measured_gantt_rows_of_replicas_and_migrations():
    ops = [
        {
            "stage": s,
            "replica": r,
            "op": "forward",
            "microbatch": 0,
            "start_ms": 1.0 + s,
            "end_ms": 2.0 + s,
        }
        for s, r in ((0, 0), (1, 0), (1, 1))
    ]
    figure = gantt.ops_gantt(ops, "measured", migrations=[(1.5, "migrated: b1 0→1")])
    assert figure["layout"]["yaxis"]["ticktext"] == ["stage 0", "stage 1.0", "stage 1.1"]
    forward = next(s for s in figure["layout"]["shapes"] if s.get("name") == "forward")
    assert [row for row, _, _ in drawn_bars(forward)] == [0, 1, 2]
    assert "migrated: b1 0→1" in [a["text"] for a in figure["layout"]["annotations"]]


def test_interleaved_gantt_has_a_row_per_device_with_its_chunks():
    profile = big_profile(8)
    result = simulate(profile, plan_template(profile, 2, 4, "interleaved-1f1b", virtual_stages=2))
    figure = gantt.schedule_gantt(result)
    assert figure["layout"]["yaxis"]["ticktext"] == [
        "device 0 (chunks 0, 2)",
        "device 1 (chunks 1, 3)",
    ]
    forward = next(s for s in figure["layout"]["shapes"] if s["name"] == "forward")
    rows = [row for row, _, _ in drawn_bars(forward)]
    assert rows.count(0) == rows.count(1) == 2 * 4  # each device: 2 chunks x 4 micro-batches
    hovers = next(t for t in figure["data"] if t["name"] == "forward")["text"]
    assert any(text.startswith("device 1, chunk 3: forward of micro-batch") for text in hovers)
    # the bubble is the device's: its two chunks share one compute stream
    idle = next(s for s in figure["layout"]["shapes"] if s["name"] == "idle (bubble)")
    for device in (0, 1):
        busy = sum(stage.busy_ms for stage in result.stages if stage.devices[0] == device)
        drawn = sum(end - start for row, start, end in drawn_bars(idle) if row == device)
        assert drawn == pytest.approx(result.step_time_ms - busy, abs=1e-3)
    # the bars and the memory lines are the devices' too, not the chunks'
    compute = stage_charts.stage_compute_figure(result)
    assert compute["data"][0]["x"] == ["device 0", "device 1"]
    busy = [sum(s.busy_ms for s in result.stages if s.devices[0] == d) for d in (0, 1)]
    drawn = zip(compute["data"][0]["y"], compute["data"][1]["y"], strict=True)
    assert [work + recompute for work, recompute in drawn] == pytest.approx(busy)
    memory = memory_charts.memory_timeline_figure(result)
    assert [t["name"] for t in memory["data"]] == ["device 0", "device 1"]
    tracks = memory_charts.device_tracks(result)
    for device, track in enumerate(tracks):
        chunks = [t for t in result.memory_timeline if t.stage % 2 == device]
        # at every time a chunk's memory changes the device holds the chunks' sum
        for chunk in chunks:
            for time, value in zip(chunk.times_ms, chunk.bytes, strict=True):
                other = next(t for t in chunks if t is not chunk)
                before = [b for t, b in zip(other.times_ms, other.bytes, strict=True) if t <= time]
                at = track.bytes[track.times_ms.index(time)]
                assert at == value + (before[-1] if before else 0)


def test_zero_bubble_gantt_names_the_two_halves_of_the_backward():
    profile = big_profile(8)
    result = simulate(profile, plan_template(profile, 2, 4, "zero-bubble"))
    figure = gantt.schedule_gantt(result)
    legend = [shape["name"] for shape in figure["layout"]["shapes"]]
    assert "input gradient" in legend and "weight gradient" in legend
    assert "backward" not in legend
    assert figure["layout"]["yaxis"]["ticktext"] == ["stage 0", "stage 1"]
    plain = gantt.schedule_gantt(simulate(profile, plan_template(profile, 2, 4, "1f1b")))
    assert "backward" in [shape["name"] for shape in plain["layout"]["shapes"]]


def test_measured_interleaved_run_is_drawn_by_device():
    profile = big_profile(6)
    document = plan_template(profile, 3, 6, "interleaved-1f1b", virtual_stages=2)
    assert monitor.chunk_devices(document.model_dump(mode="json")) == {
        0: 0,
        1: 1,
        2: 2,
        3: 0,
        4: 1,
        5: 2,
    }
    assert monitor.chunk_devices({"schedule": "1f1b", "stages": [{}] * 2}) is None


def test_idle_spans_are_the_gaps_between_compute_ops():
    ops = [
        {"stage": 0, "replica": 0, "op": "forward", "start_ms": 1.0, "end_ms": 2.0},
        {"stage": 0, "replica": 0, "op": "send_activation", "start_ms": 2.0, "end_ms": 9.0},
        {"stage": 0, "replica": 0, "op": "backward", "start_ms": 4.0, "end_ms": 6.0},
    ]
    assert gantt.idle_spans(ops, (0.0, 10.0)) == {(0, 0): [(0.0, 1.0), (2.0, 4.0), (6.0, 10.0)]}


def test_memory_over_time_marks_when_a_stage_runs_out(tight_result):
    figure = memory_charts.memory_timeline_figure(tight_result)
    over = next(t for t in figure["data"] if t["name"] == "first over the limit")
    assert any(text.startswith("stage 0 runs out of memory at") for text in over["text"])
    assert any(shape["y0"] == 80.0 for shape in figure["layout"]["shapes"])
    assert all(trace.get("showlegend", True) for trace in figure["data"])  # 4 stages


def test_compare_rows_and_chart_show_every_candidate(tight_result):
    candidates = [
        compare.Candidate.of("uniform", tight_result, 3.0),
        compare.Candidate("optimal", None, "no plan fits in 80 MiB"),
    ]
    rows = compare.compare_rows(candidates)
    assert rows[0]["fits"] == "NO" and rows[0]["device limit"] == "80.00 MiB"
    assert rows[1]["fits"] == "no plan: no plan fits in 80 MiB"
    figure = compare.compare_figure(candidates)
    assert figure["data"][0]["x"] == ["uniform"]
    assert rows[0]["proven"] == "—"


def test_compare_rows_say_what_optimal_proved(tight_result):
    claims = [
        step_claim({"planner": "optimal", "step_optimal": True, "step_gap": 0.0}),
        step_claim({"planner": "optimal", "step_optimal": False, "step_gap": 0.042}),
        step_claim({"planner": "optimal", "step_optimal": False, "step_gap": None}),
        step_claim({"planner": "vpipe"}),
    ]
    assert claims == [
        "proven optimal",
        "within 4.2% of optimal (proven bound)",
        "not proven optimal",
        None,
    ]
    candidate = replace(compare.Candidate.of("optimal", tight_result), claim=claims[1])
    assert compare.compare_rows([candidate])[0]["proven"] == claims[1]


def test_compare_counts_plans_that_do_not_fit_apart_and_shows_replicas(tight_result):
    """A plan that does not fit is not a plan found; a planner that trades stages for
    replicas says so in the stages and replicas columns."""
    rows = [
        {
            "algorithm": "uniform",
            "summary": {
                "step_time_ms": 9.0,
                "samples_per_s": 1.0,
                "bubble_fraction": 0.1,
                "fits": False,
                "stage_peak_bytes": [9],
                "stage_device_memory_bytes": [8],
            },
            "plan": {"stages": [{"replicas": 1}, {"replicas": 1}]},
        },
        {
            "algorithm": "optimal",
            "summary": {
                "step_time_ms": 5.0,
                "samples_per_s": 2.0,
                "bubble_fraction": 0.0,
                "fits": True,
                "stage_peak_bytes": [7],
                "stage_device_memory_bytes": [8],
            },
            "plan": {"stages": [{"replicas": 4}], "provenance": {}},
        },
        {"algorithm": "vpipe", "summary": None, "plan": None, "error": "none fits"},
    ]
    notice = planner_callbacks.compare_notice(rows)
    assert notice.children == (
        "1 of 3 planners found a plan that fits; 1 found one that does NOT fit; 1 found none."
    )
    assert "ps-ok" in notice.className
    table_rows = compare.compare_rows([planning.candidate(row) for row in rows])
    assert [(r["stages"], r["replicas"]) for r in table_rows] == [
        ("2", "1 each"),
        ("1", "4"),
        ("—", "—"),
    ]
    assert "ps-error" in planner_callbacks.compare_notice(rows[:1]).className


def step_event(stage, step, busy, start, end, **extra):
    return {
        "stage": stage,
        "replica": 0,
        "step": step,
        "busy_ms": busy,
        "start_ms": start,
        "end_ms": end,
        "samples_per_s": 8 / (end - start) * 1e3,
        **extra,
    }


def test_run_charts_measure_throughput_and_mark_migrations():
    steps = [
        step_event(0, 0, 5, 0, 10),
        step_event(1, 0, 6, 2, 20, loss=2.0),
        step_event(0, 1, 5, 20, 30),
        step_event(1, 1, 6, 22, 40, loss=1.5),
    ]
    step_idx, rates = run_charts.step_throughput(steps)
    assert step_idx == [0, 1] and rates == pytest.approx([400.0, 400.0])  # 8 samples / 20 ms
    markers = [run_charts.Marker(1.5, "migrated: layer3 0→1")]
    figure = run_charts.throughput_figure(steps, markers, predicted_samples_per_s=500)
    texts = [a["text"] for a in figure["layout"]["annotations"]]
    assert "migrated: layer3 0→1" in texts and "predicted 500.0 samples/s" in texts
    assert run_charts.loss_figure(steps, markers)["data"][0]["y"] == [2.0, 1.5]
    assert names(run_charts.stage_busy_figure(steps)) == ["stage 0", "stage 1"]
    swap = run_charts.swap_recompute_figure(steps, markers)
    assert len(swap["layout"]["shapes"]) == 2  # the marker on both panels
    memory = run_charts.run_memory_figure(
        [{"stage": 0, "replica": 0, "step": 0, "peak_bytes": 2**30}], {0: 2 * 2**30}, markers
    )
    assert memory["data"][0]["y"] == [1.0]
    assert any(a["text"] == "device limit 2.00 GiB" for a in memory["layout"]["annotations"])


def test_plan_view_of_1000_layers_on_16_stages_stays_a_few_traces():
    # its build time is bench/bench_dashboard.py's to measure, not a unit test's
    profile = big_profile(1000)
    plan = plan_template(profile, 16, 32, "1f1b")
    result = simulate(profile, plan, cluster_template([16], [100.0], device_memory_bytes=2**30))
    figures = [
        stage_charts.stage_compute_figure(result),
        stage_charts.stage_memory_figure(result),
        gantt.schedule_gantt(result),
        memory_charts.memory_timeline_figure(result),
    ]
    encoded = json.dumps(figures)
    # a shape and a hover trace per op kind, not an element per op
    assert len(figures[2]["data"]) == len(figures[2]["layout"]["shapes"]) <= 10
    assert len(encoded) < 2_000_000
    # 16 lines share 10 colours: hovering names a line's stage, no legend to wrap
    lines = [trace for trace in figures[3]["data"] if trace["name"].startswith("stage")]
    assert len(lines) == 16 and not any(trace["showlegend"] for trace in lines)
    assert "hover a line for its stage" in figures[3]["layout"]["title"]["text"]


def test_interleaved_peaks_are_the_devices_not_the_chunks():
    profile = big_profile(8)
    result = simulate(profile, plan_template(profile, 2, 4, "interleaved-1f1b", virtual_stages=2))
    chunk = max(stage.peak_bytes for stage in result.stages)
    tracks = memory_charts.device_tracks(result)
    # a device's peak is its chunks' sum at its highest, more than any chunk's own
    assert result.device_peak_bytes == [max(track.bytes) for track in tracks]
    assert result.largest_peak_bytes == max(result.device_peak_bytes) > chunk
    assert compare.Candidate.of("x", result, 1.0).peak_bytes == result.largest_peak_bytes
    assert format_bytes(result.largest_peak_bytes) in planning.prediction_text(result)
    straight = simulate(profile, plan_template(profile, 2, 4, "1f1b"))
    assert straight.device_peak_bytes == [stage.peak_bytes for stage in straight.stages]


def test_a_gantt_counts_time_from_the_start_of_its_step():
    ops = [
        {"stage": s, "replica": 0, "op": "forward", "microbatch": 0, "start_ms": t, "end_ms": t + 5}
        for s, t in ((0, 122_350.0), (1, 122_356.0))
    ]
    figure = gantt.ops_gantt(ops, "measured", migrations=[(122_352.0, "migrated")])
    assert figure["layout"]["xaxis"]["range"] == [0.0, 11.0]
    forward = next(s for s in figure["layout"]["shapes"] if s.get("name") == "forward")
    assert sorted(start for _, start, _ in drawn_bars(forward)) == [0.0, 6.0]
    assert any(a["text"] == "migrated" and a["x"] == 2.0 for a in figure["layout"]["annotations"])


@pytest.mark.parametrize("schedule", ["zero-bubble", "interleaved-1f1b"])
def test_schedules_with_a_warm_up_step_are_drawn_from_the_step_they_time(schedule):
    profile = big_profile(8)
    plan = plan_template(profile, 4 if schedule == "interleaved-1f1b" else 2, 4, "1f1b")
    if schedule == "interleaved-1f1b":
        plan = plan.model_copy(update={"schedule": schedule, "virtual_stages": 2})
    else:
        plan = plan.model_copy(update={"schedule": schedule})
    result = simulate(profile, plan, cluster_template([2], [10.0]))
    assert result.window_start_ms > 0  # the step timed follows a warm-up step
    for figure in (gantt.schedule_gantt(result), memory_charts.memory_timeline_figure(result)):
        low, high = figure["layout"]["xaxis"]["range"]
        assert low == 0.0
        assert high == pytest.approx(result.window_end_ms - result.window_start_ms)


def test_a_limit_far_above_the_peaks_is_named_not_drawn():
    profile = big_profile(8)
    plan = plan_template(profile, 2, 4, "1f1b")
    result = simulate(profile, plan, cluster_template([2], [10.0], device_memory_bytes=2**36))
    stages, over_time = (
        stage_charts.stage_memory_figure(result),
        memory_charts.memory_timeline_figure(result),
    )
    for figure in (stages, over_time):
        title = figure["layout"]["title"]["text"]
        assert "device limit 64.00 GiB" in title and "% used" in title, title
        assert "GiB;" not in title.split("(")[1][:4]  # the unit follows the peaks, not the limit
    assert "device memory limit" not in names(stages)
    assert not over_time["layout"].get("shapes")
    measured = [{"stage": 0, "replica": 0, "step": 0, "peak_bytes": 30 * 2**20}]
    peaks = run_charts.run_memory_figure(measured, {0: 4 * 2**30})
    assert peaks["data"][0]["y"] == [30.0]  # MiB
    title = peaks["layout"]["title"]["text"]
    assert "device limit 4.00 GiB, 0.7% used" in title and "RSS" not in title
    on_cpu = [{**measured[0], "rss_bytes": 29 * 2**20}]
    layout = run_charts.run_memory_figure(on_cpu, {})["layout"]
    assert layout["title"]["text"] == "Peak memory per stage (MiB; CPU: whole-process RSS)"
    assert layout["yaxis"]["title"]["text"] == "peak RSS, Python and torch included (MiB)"
