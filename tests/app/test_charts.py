"""The run page's chart options, built from real stores: the cause on screen, branches drawn honestly."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from runwatch.app import charts, series, views
from runwatch.data.record import METRIC_COLUMNS
from runwatch.data.store import Store
from tests.app.conftest import spike_lines, write_jsonl_run


@pytest.fixture(scope="module")
def spike_store(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("spike") / "root"
    root.mkdir()
    write_jsonl_run(root, "spiky", spike_lines(50_000, spike_at=31_337, nan_at=40_000))
    with Store(root) as store:
        yield store


def _series_on(option: dict, grid: int, name: str | None = None) -> list[dict]:
    return [s for s in option["series"] if s.get("xAxisIndex") == grid and (name is None or s["name"] == name)]


def _titles(option: dict) -> list[str]:
    return [t["text"] for t in option["title"]]


def test_one_step_spike_survives_downsampling(spike_store: Store) -> None:
    ds = spike_store.downsample_columns("spiky", ["loss"], num_buckets=500)["loss"]
    assert ds.num_rows <= 500  # 100x fewer points than rows ...
    xs, ys = series.envelope(ds)
    assert ys.max() == pytest.approx(32.0 + math.exp(-31_337 / 12_500), rel=1e-9)  # ... and the spike is still there
    assert xs[np.argmax(ys)] == 31_337
    assert np.all(np.diff(xs) >= 0)  # drawn in x order, so the line goes up to the spike and back


def test_every_bucket_draws_its_min_and_max(spike_store: Store) -> None:
    ds = spike_store.downsample_columns("spiky", ["loss"], num_buckets=300)["loss"]
    xs, ys = series.envelope(ds)
    for row in ds.to_pylist():
        if row["min"] is None:
            continue
        inside = (xs >= row["x_first"]) & (xs <= row["x_last"])
        assert ys[inside].min() == row["min"] and ys[inside].max() == row["max"]


def test_the_cause_is_on_screen_lr_loss_scale_and_nan(spike_store: Store) -> None:
    tables = spike_store.downsample_columns("spiky", list(charts.PANEL_COLUMNS), num_buckets=500)
    option = charts.run_chart(tables, charts.panels_for(spike_store.columns("spiky"))).option
    assert _titles(option)[:5] == ["loss", "grad norm", "learning rate", "loss scale (log)", "step time (s)"]
    assert "final-layer act norm" not in _titles(option)  # the run never recorded it
    assert [a["type"] for a in option["yAxis"][:5]] == ["value", "value", "value", "log", "value"]
    [nan] = _series_on(option, 0, "NaN/Inf")
    assert len(nan["data"]) == 1 and abs(nan["data"][0]["value"][0] - 40_000) <= 50_000 / 500
    [main] = _series_on(option, 0, "main line")
    assert max(p[1] for p in main["data"] if p[1] is not None) > 32  # the one-step spike is drawn


def test_log_toggle_per_chart_with_whole_tick_labels(spike_store: Store) -> None:
    tables = spike_store.downsample_columns("spiky", ["loss", "grad_norm"], num_buckets=100)
    view = charts.View(log=frozenset({"grad_norm"}))
    option = charts.run_chart(tables, charts.panels_for(["loss", "grad_norm"]), view=view).option
    assert option["yAxis"][0]["type"] == "value" and option["yAxis"][1]["type"] == "log"
    assert _titles(option)[:2] == ["loss", "grad norm (log)"]
    ticks = option["yAxis"][1]["axisLabel"]["customValues"]  # labelled with whole values, not ECharts' own
    assert len(ticks) >= 2 and ticks == option["yAxis"][1]["axisTick"]["customValues"]
    assert all(option["yAxis"][1]["min"] <= t <= option["yAxis"][1]["max"] for t in ticks)


@pytest.mark.parametrize("lo, hi", [(2.0, 5e6), (1e-5, 3e-4), (0.9, 4.1), (60_000, 70_000), (1.0, 1e12)])
def test_log_ticks_are_whole_values_in_range(lo: float, hi: float) -> None:
    ticks = series.log_ticks(lo, hi)
    assert len(ticks) >= 2 and ticks == sorted(set(ticks))
    assert all(lo <= t <= hi for t in ticks)
    for t in ticks:  # m x 10^k: a value a reader reads whole, not a bare "2" or "5" between decades
        mantissa = t / 10 ** math.floor(math.log10(t) + 1e-12)
        assert round(mantissa, 9) in {1, 2, 3, 4, 5, 6, 7, 8, 9}


@pytest.mark.parametrize("lo, hi", [(2.1, 2.9), (11, 19), (0.031, 0.038), (1.001, 1.009), (2.1, 2.2)])
def test_a_narrow_log_range_still_gets_labelled_ticks(lo: float, hi: float) -> None:
    """A loss panel between 2.1 and 2.9 reaches no two 1..9 x 10^k values; its axis had no labels at all."""
    ticks = series.log_ticks(lo, hi)
    assert len(ticks) >= 2 and ticks == sorted(set(ticks)) and all(lo <= t <= hi for t in ticks), ticks
    unit = min(b - a for a, b in zip(ticks, ticks[1:]))  # evenly spaced by 1, 2 or 5 x 10^k: labels read whole
    mantissa = unit / 10 ** math.floor(math.log10(unit) + 1e-12)
    assert round(mantissa, 9) in {1, 2, 5} and all(round(t / unit, 6).is_integer() for t in ticks), ticks


def test_x_axis_of_tokens(spike_store: Store) -> None:
    """An x axis of tokens: the spike at step 31,337 is drawn at its 1024 x 31,338 tokens."""
    tables = spike_store.downsample_columns("spiky", ["loss"], x="tokens", num_buckets=500)
    option = charts.run_chart(tables, charts.panels_for(["loss"]), view=charts.View(x="tokens")).option
    assert option["xAxis"][-1]["name"] == "tokens"
    [main] = _series_on(option, 0, "main line")
    peak = max((p for p in main["data"] if p[1] is not None), key=lambda p: p[1])
    assert abs(peak[0] - 1024 * 31_338) <= 1024 * 50_000 / 500 and peak[1] > 32


def test_x_axis_of_wall_clock_time(spike_store: Store) -> None:
    tables = spike_store.downsample_columns("spiky", ["loss"], x="time", num_buckets=100)
    option = charts.run_chart(tables, charts.panels_for(["loss"]), view=charts.View(x="time")).option
    assert option["xAxis"][0]["type"] == "time"
    [main] = _series_on(option, 0, "main line")
    assert main["data"][0][0] == pytest.approx(1.7e9 * 1000, rel=1e-6)  # milliseconds, as ECharts takes them
    assert option["xAxis"][-1]["name"] == "wall-clock time (UTC)"


@pytest.fixture(scope="module")
def branch_store(tmp_path_factory: pytest.TempPathFactory):
    """Resumed from the checkpoint of step 300 with batches 301-500 skipped; the abandoned branch blew up."""
    root = tmp_path_factory.mktemp("branch") / "root"
    root.mkdir()
    lines = spike_lines(600, spike_at=-1)
    for line in lines[420:]:
        line["loss"] = 1e4  # the branch diverged
    lines.append({"event": "resume", "step": 300, "checkpoint": "ckpt/300.pt", "skip_batches": [301, 500]})
    lines += [dict(line, time=line["time"] + 100) for line in spike_lines(800, spike_at=-1)[501:]]
    write_jsonl_run(root, "branchy", lines)
    with Store(root) as store:
        yield store


def test_branch_is_dimmed_labelled_from_the_resume_and_kept_off_the_y_range(branch_store: Store) -> None:
    tables = branch_store.downsample_columns("branchy", ["loss"], num_buckets=200)
    segments = branch_store.segments("branchy").to_pylist()
    abandoned = {s["segment"]: s["abandoned_from"] for s in segments if s["abandoned_from"] is not None}
    assert abandoned == {0: 301}  # segment_cuts: the rows after the resume step s, from s + 1
    option = charts.run_chart(tables, charts.panels_for(["loss"]), abandoned_from=abandoned).option
    [branch] = [s for s in option["series"] if s["name"].startswith("seg ")]
    assert branch["name"] == "seg 0 abandoned (resume @ 300)"
    assert branch["lineStyle"]["opacity"] < 1 and branch["lineStyle"]["type"] == "dashed"
    assert min(p[0] for p in branch["data"]) == 301  # everything after the resume step is the branch
    y = option["yAxis"][0]
    assert y["max"] < 10  # the healthy main line fills the panel; the blow-up does not flatten it ...
    assert any("peaks at 1e+04" in t and "step 420" in t for t in _titles(option))  # ... and is stated


def test_closed_findings_of_every_kind_are_shaded_alike_and_the_advised_checkpoint_stands_out() -> None:
    ds = pa.table({"segment": pa.array([0, 0], pa.int32()), "main": [True, True], "bucket": [0, 1],
                   "x_first": [0, 10], "x_last": [9, 19], "first": [1.0, 1.0], "last": [1.0, 1.0],
                   "min": [1.0, 1.0], "max": [1.0, 1.0], "x_min": [0, 10], "x_max": [0, 10],
                   "num_nonfinite": [0, 0], "num_rows": [10, 10]})
    tables = {"loss": ds, "step_time": ds}
    bands = [{"x0": 2, "x1": 4, "severity": "critical", "label": "spike", "open": False, "panels": None},
             {"x0": 12, "x1": 14, "severity": "warning", "label": "slowdown", "open": False, "panels": ("step_time",)},
             {"x0": 15, "x1": 16, "severity": "critical", "label": "nan", "open": True, "panels": None}]
    advised = {"x": 8, "text": "roll back here: checkpoint @ step 8"}
    option = charts.run_chart(tables, charts.panels_for(["loss"]), bands=bands, advised=advised,
                              marks=[{"x": 8, "kind": "checkpoint", "text": "checkpoint @ step 8: ck/8.pt"}]).option
    areas = {i: [a[0] for s in _series_on(option, i) for a in s.get("markArea", {}).get("data", [])] for i in (0, 1)}
    closed = [a for i in (0, 1) for a in areas[i] if a["name"] in ("spike", "slowdown")]
    assert len(closed) == 3 and {a["itemStyle"]["color"] for a in closed} == {charts.CLOSED_COLOR}
    assert [a["name"] for a in areas[1]] == ["spike", "slowdown", "nan"]  # speed findings: the step-time panel
    assert [a["itemStyle"]["color"] for a in areas[0] if a["name"] == "nan"] == [charts.SEVERITY_COLORS["critical"]]
    lines = {i: [m for s in _series_on(option, i) for m in s.get("markLine", {}).get("data", [])
                 if m.get("name", "").startswith("roll back here")] for i in (0, 1)}
    assert len(lines[0]) == len(lines[1]) == 1 and lines[0][0]["label"]["show"] and not lines[1][0]["label"]["show"]
    [pin] = [s for s in option["series"] if s["name"] == "advised"]
    assert pin["data"][0]["value"][0] == 8 and pin["symbolSize"] > 10


def test_validation_loss_is_drawn_beside_the_training_loss(tmp_path) -> None:
    lines = spike_lines(400, spike_at=-1)
    for line in lines[::50]:
        line["val_loss"] = line["loss"] + 0.3
        line["my_metric"] = 0.5
    root = tmp_path / "root"
    root.mkdir()
    write_jsonl_run(root, "val", lines)
    with Store(root) as store:
        columns = store.columns("val")
        tables = store.downsample_columns("val", ["loss", "val_loss", "my_metric"], num_buckets=100)
    assert charts.extra_columns(columns, METRIC_COLUMNS) == ["my_metric"]  # the run's own metric is selectable; validation loss goes on the loss panel
    view = charts.View(overlays={"loss": ("val_loss",)})
    option = charts.run_chart(tables, charts.panels_for(columns, ["my_metric"]), view=view).option
    [val] = _series_on(option, 0, "val loss")
    assert len(val["data"]) == 8 and val["showSymbol"]
    assert "my_metric" in _titles(option)


def test_compare_never_draws_two_picked_runs_alike_when_the_root_has_more_runs_than_colours() -> None:
    """Twelve runs and a palette of ten: run-00 and run-10 share a place modulo ten, and picked together they
    were drawn in one colour. The later takes the first colour no picked run has; picked alone (or with runs
    it does not collide with) each keeps its own."""
    names = [f"run-{i:02d}" for i in range(12)]
    own = charts.run_colors(names)
    assert own["run-00"] == own["run-10"]  # the palette wraps: the collision is real
    both = charts.run_colors(names, ["run-10", "run-00"])
    assert both["run-00"] == own["run-00"] and both["run-10"] not in {both["run-00"]}
    assert both["run-10"] == next(c for c in charts.RUN_COLORS if c != own["run-00"])
    assert charts.run_colors(names, ["run-10", "run-03"])["run-10"] == own["run-10"]
    ten = names[:5] + names[7:12]  # ten picked, two collisions (00/10, 01/11)
    picked = charts.run_colors(names, ten)
    assert len({picked[r] for r in ten}) == len(ten) == len(charts.RUN_COLORS)
    assert all(picked[r] == own[r] for r in names[:5])


def test_compare_keeps_each_runs_colour_whatever_the_selection(spike_store: Store) -> None:
    tables = spike_store.downsample_columns("spiky", ["loss"], x="tokens", num_buckets=50)
    colors = charts.run_colors(["a", "b", "c"])
    both = charts.compare_chart({"a": tables, "b": tables}, ["loss"], colors=colors).option
    alone = charts.compare_chart({"b": tables}, ["loss"], colors=colors,
                                 bands_by_run={"b": [{"x0": 1, "x1": 2, "label": "spike", "open": True}]}).option
    color_of = {s["name"]: s["lineStyle"]["color"] for s in both["series"] if s["type"] == "line" and s["data"]}
    assert color_of["b"] == [s for s in alone["series"] if s["name"] == "b"][0]["lineStyle"]["color"] == colors["b"]
    assert color_of["a"] != color_of["b"]
    [band] = [a[0] for s in alone["series"] for a in s.get("markArea", {}).get("data", [])]
    assert band["itemStyle"]["color"] == colors["b"] and band["name"] == "b: spike"
    # Two runs' findings at the same steps: each run's label on a line of its own (they were drawn over each other).
    same = {"x0": 1, "x1": 2, "label": "spike", "open": True}
    two = charts.compare_chart({"a": tables, "b": tables}, ["loss"], colors=colors,
                               bands_by_run={"a": [same], "b": [same]}).option
    offsets = {a[0]["name"]: a[0]["label"]["offset"] for s in two["series"] for a in s.get("markArea", {}).get("data", [])}
    assert offsets["a: spike"] != offsets["b: spike"], offsets


def test_untrusted_names_reach_the_option_as_one_line_of_text() -> None:
    ds = pa.table({"segment": pa.array([0], pa.int32()), "main": [True], "bucket": [0], "x_first": [0], "x_last": [0],
                   "first": [1.0], "last": [1.0], "min": [1.0], "max": [1.0], "x_min": [0], "x_max": [0],
                   "num_nonfinite": [0], "num_rows": [1]})
    option = charts.run_chart({"loss": ds}, charts.panels_for(["loss"]),
                              marks=[{"x": 0, "kind": "checkpoint", "text": "ck/<b>x</b>\nforged line\x1b[2K"}]).option
    [mark] = [s for s in option["series"] if s["name"] == "checkpoint"]
    assert mark["data"][0]["name"] == "ck/<b>x</b> forged line [2K"  # ECharts shows it as text; tooltips escape it
    assert "formatter" not in str(mark)


def test_finding_bands_mark_acknowledged_findings() -> None:
    from runwatch.detectors.finding import Finding

    f = Finding(kind="spike", onset_step=10, end_step=12, peak_step=11, segment=0, severity="warning",
                self_recovered=None, needs_action=True, open=True, evidence={}, message="m")
    [band] = views.finding_bands([f], last_step=20, ack_of=lambda _: type("A", (), {"by": "alice"})())
    assert band["label"] == "spike ✓ alice"


def test_a_segment_of_only_non_finite_values_draws_markers_not_a_crash() -> None:
    ds = pa.table({"x_first": [5.0], "first": [None], "x_min": [None], "min": [None], "x_max": [None],
                   "max": [None], "x_last": [5.0], "last": [None], "segment": pa.array([1], pa.int32()),
                   "main": [True], "num_nonfinite": [3]}, schema=None)
    xs, ys = series.envelope(ds)
    assert xs.size == ys.size == 0 and series.nonfinite_points(ds)[1].tolist() == [3]
