"""Figure builders, tested directly on real stores: spikes survive downsampling, branches dim, log axes."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from runwatch.app import figures
from runwatch.data.store import Store
from tests.app.conftest import spike_lines, write_jsonl_run


@pytest.fixture(scope="module")
def spike_store(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("spike") / "root"
    root.mkdir()
    write_jsonl_run(root, "spiky", spike_lines(50_000, spike_at=31_337, nan_at=40_000))
    return Store(root)


def test_one_step_spike_survives_downsampling(spike_store: Store) -> None:
    series = spike_store.downsample_columns("spiky", ["loss"], num_buckets=500)
    ds = series["loss"]
    assert ds.num_rows <= 500  # 100x fewer points than rows ...
    xs, ys = figures.envelope(ds)
    assert ys.max() == pytest.approx(32.0 + math.exp(-31_337 / 12_500), rel=1e-9)  # ... and the spike is still there
    assert xs[np.argmax(ys)] == 31_337
    assert np.all(np.diff(xs) >= 0)  # drawn in x order, so the line goes up to the spike and back


def test_every_bucket_draws_its_min_and_max(spike_store: Store) -> None:
    ds = spike_store.downsample_columns("spiky", ["loss"], num_buckets=300)["loss"]
    xs, ys = figures.envelope(ds)
    for row in ds.to_pylist():
        if row["min"] is None:
            continue
        inside = (xs >= row["x_first"]) & (xs <= row["x_last"])
        assert ys[inside].min() == row["min"] and ys[inside].max() == row["max"]


def test_nan_is_marked_not_dropped(spike_store: Store) -> None:
    series = spike_store.downsample_columns("spiky", ["loss"], num_buckets=500)
    fig = figures.run_figure(series)
    marks = [t for t in fig.data if t.name == "NaN/Inf"]
    assert len(marks) == 1 and abs(marks[0].x[0] - 40_000) <= 50_000 / 500
    _, ys = figures.envelope(series["loss"])
    assert np.isfinite(ys).all()  # the line itself never bends through a NaN


def test_zoom_requery_reaches_full_resolution(spike_store: Store) -> None:
    ds = spike_store.downsample_columns("spiky", ["loss"], num_buckets=2000, lo=31_000, hi=31_500)["loss"]
    assert ds["num_rows"].to_pylist() == [1] * 501  # fewer rows than buckets: every raw value


def test_only_panels_with_data_are_drawn(spike_store: Store) -> None:
    series = spike_store.downsample_columns("spiky", list(figures.PANELS_COLUMNS), num_buckets=200)
    fig = figures.run_figure(series)
    titles = [a.text for a in fig.layout.annotations]
    assert "loss" in titles and "grad norm" in titles and "step time (s)" in titles
    assert "final-layer act norm" not in titles  # the run never recorded it


def test_loss_scale_axis_is_logarithmic(spike_store: Store) -> None:
    series = spike_store.downsample_columns("spiky", ["loss", "grad_norm", "loss_scale"], num_buckets=100)
    fig = figures.run_figure(series)
    titles = [a.text for a in fig.layout.annotations]  # subplot titles, top to bottom
    assert titles[:3] == ["loss", "grad norm", "loss scale (log)"]
    assert fig.layout.yaxis3.type == "log"
    assert fig.layout.yaxis.type != "log" and fig.layout.yaxis2.type != "log"


def test_abandoned_branch_is_dimmed_and_labelled(tmp_path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    lines = spike_lines(300, spike_at=-1)
    lines.append({"event": "resume", "step": 200, "checkpoint": "ckpt/200.pt"})
    lines += [dict(line, time=line["time"] + 100) for line in spike_lines(300, spike_at=-1)[200:]]
    write_jsonl_run(root, "branchy", lines)
    with Store(root) as store:
        series = store.downsample_columns("branchy", ["loss"], num_buckets=100)
        segments = store.segments("branchy").to_pylist()
    fig = figures.run_figure(series, abandoned_from={s["segment"]: s["abandoned_from"] for s in segments
                                                     if s["abandoned_from"] is not None})
    branch = [t for t in fig.data if "abandoned" in (t.name or "")]
    main = [t for t in fig.data if t.name == "main line"]
    assert len(branch) == 1 and branch[0].name == "seg 0 abandoned @ 200"
    assert branch[0].opacity < 1 and branch[0].line.dash == "dot"
    assert main and all(t.line.dash is None and t.opacity is None for t in main)
    assert min(branch[0].x) == 200  # the branch starts where the resume cut it off


def test_bands_and_event_ticks() -> None:
    ds = pa.table({"segment": [0, 0], "main": [True, True], "bucket": [0, 1], "x_first": [0, 10], "x_last": [9, 19],
                   "first": [1.0, 1.0], "last": [1.0, 1.0], "min": [1.0, 1.0], "max": [1.0, 1.0],
                   "x_min": [0, 10], "x_max": [0, 10], "num_nonfinite": [0, 0], "num_rows": [10, 10]})
    series = {"loss": ds, "step_time": ds}
    bands = [{"x0": 5, "x1": 8, "severity": "critical", "label": "spike", "open": True},
             {"x0": 12, "x1": 14, "severity": "warning", "label": "slowdown", "panels": ("step_time",)}]
    fig = figures.run_figure(series, bands=bands, checkpoints=[{"x": 10, "text": "ckpt"}])
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == 3  # the spike on both panels, the slowdown on step time only
    assert {r.fillcolor for r in rects} == {figures.SEVERITY_COLORS["critical"], figures.SEVERITY_COLORS["warning"]}
    assert any(t.name == "checkpoint" and list(t.x) == [10] for t in fig.data)


def test_compare_overlays_runs(spike_store: Store) -> None:
    series = spike_store.downsample_columns("spiky", ["loss"], x="tokens", num_buckets=100)
    fig = figures.compare_figure({"a": series, "b": series}, ["loss", "act_norm"], x_title="tokens")
    assert [t.name for t in fig.data] == ["a", "b"]
    assert fig.layout.xaxis.title.text == "tokens"


def test_step_mapper_interpolates() -> None:
    to_x = figures.step_mapper(np.array([0, 10, 20]), np.array([0, 1000, 3000]))
    assert to_x(5) == 500 and to_x(15) == 2000
