"""The store: runs, segments, main line and branches, events, spike-preserving downsampling."""

from __future__ import annotations

import math

import pytest

from runwatch.data.record import metrics_table, segment_cuts
from runwatch.data.storage import StagedWrite
from runwatch.data.store import Store


def _segment(root, run, segment, steps, loss=lambda s: 3.0, rank=0):
    rows = [{"step": s, "time": 1e9 + s, "loss": loss(s), "tokens": 1000 * s} for s in steps]
    with StagedWrite(root) as staged:
        staged.add_metrics(run, segment, rank, metrics_table(rows))


@pytest.fixture
def rolled_back(tmp_path):
    """Segment 0 runs 0..1999, segment 1 resumes at 1400 and runs to 2999, segment 2 resumes at 2500."""
    _segment(tmp_path, "r", 0, range(0, 2000))
    _segment(tmp_path, "r", 1, range(1400, 3000))
    _segment(tmp_path, "r", 2, range(2500, 3500))
    return tmp_path


def test_segments_report_where_each_was_abandoned(rolled_back):
    with Store(rolled_back) as store:
        segs = store.segments("r").to_pylist()
    assert [(s["segment"], s["first_step"], s["last_step"], s["abandoned_from"]) for s in segs] == [
        (0, 0, 1999, 1400), (1, 1400, 2999, 2500), (2, 2500, 3499, None)]


def test_main_line_takes_the_latest_segment_for_every_step(rolled_back):
    with Store(rolled_back) as store:
        main = store.main_line("r")
        branches = store.branches("r")
    steps = main["step"].to_pylist()
    assert steps == sorted(steps) == list(range(3500))
    owner = dict(zip(steps, main["segment"].to_pylist()))
    assert owner[1399] == 0 and owner[1400] == 1 and owner[2499] == 1 and owner[2500] == 2
    assert branches.num_rows == 600 + 500  # nothing deleted: dead branches stay queryable


def test_runs_lists_each_run(rolled_back):
    _segment(rolled_back, "other", 0, range(10), rank=3)
    with Store(rolled_back) as store:
        runs = {r["run"]: r for r in store.runs().to_pylist()}
    assert runs["r"]["last_step"] == 3499 and runs["r"]["num_segments"] == 3
    assert runs["other"]["num_ranks"] == 1 and runs["other"]["tokens"] == 9000
    assert runs["r"]["last_update"] > 0


def test_downsample_never_hides_a_spike_or_a_nan(tmp_path):
    n = 200_000
    spike, nan_at = 123_457, 77_777
    _segment(tmp_path, "r", 0, range(n),
             loss=lambda s: 50.0 if s == spike else (math.nan if s == nan_at else 2.0 + (s % 7) * 0.01))
    with Store(tmp_path) as store:
        ds = store.downsample("r", "loss", num_buckets=1000)
    assert ds.num_rows <= 1000
    rows = ds.to_pylist()
    peak = max(rows, key=lambda r: r["max"])
    assert peak["max"] == 50.0 and peak["x_max"] == spike
    assert sum(r["num_nonfinite"] for r in rows) == 1
    assert sum(r["num_rows"] for r in rows) == n


def test_downsample_of_a_small_range_is_full_resolution(tmp_path):
    _segment(tmp_path, "r", 0, range(10_000), loss=lambda s: float(s))
    with Store(tmp_path) as store:
        ds = store.downsample("r", "loss", num_buckets=2000, lo=5000, hi=5099)
    assert ds["num_rows"].to_pylist() == [1] * 100
    assert ds["first"].to_pylist() == [float(s) for s in range(5000, 5100)]


def test_unknown_run_and_column_are_clear_errors(tmp_path):
    _segment(tmp_path, "r", 0, range(10))
    with Store(tmp_path) as store:
        with pytest.raises(ValueError, match="no metrics"):
            store.segments("missing")
        with pytest.raises(ValueError, match="no column"):
            store.downsample("r", "loss; DROP TABLE x")
    with pytest.raises(ValueError, match="no such directory"):
        Store(tmp_path / "nope")


@pytest.mark.parametrize("first, last, resumes, expected", [
    # no resume events: a later segment replaces from its own first step
    ({0: 0, 1: 1400}, {0: 1999, 1: 2999}, {}, {0: 1400, 1: None}),
    # resumed from checkpoint 300, first logged step 501 (skipped batches): 301..500 are abandoned too
    ({0: 0, 1: 501}, {0: 600, 1: 900}, {1: 300}, {0: 301, 1: None}),
    # resumed from the last checkpoint at the segment's very end: nothing abandoned
    ({0: 0, 1: 601}, {0: 600, 1: 900}, {1: 600}, {0: None, 1: None}),
    # an older writer's resume event at the first step itself still cuts there, never later
    ({0: 0, 1: 300}, {0: 600, 1: 900}, {1: 300}, {0: 300, 1: None}),
    # the earliest later restart decides, across several segments
    ({0: 0, 1: 401, 2: 201}, {0: 600, 1: 700, 2: 900}, {1: 400, 2: 200}, {0: 201, 1: 401, 2: None}),
])
def test_segment_cuts_is_the_one_main_line_rule(first, last, resumes, expected):
    assert segment_cuts(first, last, resumes) == expected


def test_resume_event_cuts_the_branch_at_the_checkpoint_step(tmp_path):
    """Resume from checkpoint 300 whose first logged step is 501: steps 301-500 of segment 0 are abandoned."""
    _segment(tmp_path, "r", 0, range(0, 600), loss=lambda s: 9.0 if s > 300 else 3.0)
    _segment(tmp_path, "r", 1, range(501, 900))
    with StagedWrite(tmp_path) as staged:
        staged.add_events("r", 1, 0, [{"event": "resume", "step": 300, "checkpoint": "ck/300.pt"}])
    with Store(tmp_path) as store:
        segs = store.segments("r").to_pylist()
        main, branches = store.main_line("r"), store.branches("r")
        chart = store.downsample_columns("r", ["loss"], num_buckets=10_000)["loss"]
    assert [(s["segment"], s["abandoned_from"]) for s in segs] == [(0, 301), (1, None)]
    assert max(main["loss"].to_pylist()) == 3.0  # nothing of the bad branch on the main line
    assert branches["step"].to_pylist() == list(range(301, 600))
    main_chart = chart.filter(chart["main"])
    assert max(main_chart["max"].to_pylist()) == 3.0
