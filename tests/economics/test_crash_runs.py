"""`runwatch advise` on real Monitor runs with injected crashes and resumes, against the harness's own truth."""

from __future__ import annotations

import itertools
import math
import statistics
from pathlib import Path

import pytest

from runwatch.app.advise import checkpoint_advice
from runwatch.data.store import Store
from tests.economics.crashrun import CrashPlan, Truth, train_with_crashes

TOL_S = 0.08
"""Seconds: the harness reads the clock right after ``mon.step`` returns, Monitor just before, so the two differ by
``mon.step``'s own time, tens of milliseconds when a loaded machine preempts it; still under half of the smallest
quantity judged (a save's 0.2 s pause)."""


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    root = tmp_path_factory.mktemp("crashes")
    return root, train_with_crashes(root, "crashy")


def _advise(root: Path, run: str, **kw: object) -> object:
    with Store(root) as store:
        return checkpoint_advice(store, run, **kw)


def _expected_restarts(t: Truth) -> list[tuple[int, float, float]]:
    """(lost steps, seconds on the lost steps, downtime) of the plan's two restarts, from the harness's clock."""
    out = []
    for (seg, crash, resume) in ((0, 67, 40), (1, 95, 80)):
        branch = t.row_time[(seg, crash)] - t.row_time[(seg, resume)] - t.write_seconds[(seg, resume)]
        down = t.row_time[(seg + 1, resume + 1)] - t.row_time[(seg, crash)] - t.seconds_per_step(seg + 1)
        out.append((crash - resume, branch, down))
    return out


def test_measured_cost_interruptions_and_lost_work(crashed: tuple[Path, Truth]) -> None:
    root, truth = crashed
    advice = _advise(root, "crashy")
    m, d = advice.measured, advice.to_dict()
    assert d["checkpoint_seconds"] == statistics.median(truth.write_seconds.values())
    assert d["checkpoint_seconds"] >= CrashPlan().save_pause
    assert d["checkpoint_bytes"] == round(statistics.median(truth.sizes.values()))
    # Two crashes; the stall detector may also catch a pause of this shared machine (then it counts too).
    assert len(m.restarts) == 2 and d["interruptions"] == 2 + len(m.stalls)
    expected = _expected_restarts(truth)
    assert d["lost_steps"] == 27 + 15 == sum(e[0] for e in expected)
    for restart, (steps, branch, down) in zip(m.restarts, expected):
        assert restart.lost_steps == steps
        assert restart.branch_seconds == pytest.approx(branch, abs=TOL_S)
        assert restart.downtime_seconds == pytest.approx(down, abs=TOL_S)
        assert restart.downtime_seconds >= CrashPlan().downtime
    stall_seconds = sum(s.seconds for s in m.stalls if s.main)
    lost = sum(e[1] + e[2] for e in expected) + stall_seconds
    assert d["lost_hours"] == pytest.approx(lost / 3600, abs=4 * TOL_S / 3600)
    wall = truth.row_time[(2, 119)] - truth.row_time[(0, 0)]
    assert m.wall_seconds == pytest.approx(wall, abs=TOL_S)
    assert d["mtbf_hours"] == pytest.approx(wall / d["interruptions"] / 3600, rel=1e-3)
    kept_ckpts = sum(truth.write_seconds[k] for k in ((0, 20), (0, 40), (1, 60), (1, 80), (2, 100)))
    assert d["goodput"] == pytest.approx((wall - lost - kept_ckpts) / wall, abs=0.01)
    assert 0 < d["goodput"] < 1


def test_cadence_from_the_measured_figures(crashed: tuple[Path, Truth]) -> None:
    root, truth = crashed
    d = _advise(root, "crashy").to_dict()
    delta, mtbf = d["checkpoint_seconds"], d["mtbf_hours"] * 3600
    assert d["cadence"]["young_minutes"] == pytest.approx(math.sqrt(2 * delta * mtbf) / 60, rel=1e-9)
    ratio = delta / (2 * mtbf)
    daly = math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - delta
    assert d["cadence"]["daly_minutes"] == pytest.approx(daly / 60, rel=1e-9)
    # Every 20 steps on the main line, at its median step time.
    main = [t for (seg, step), t in sorted(truth.row_time.items(), key=lambda kv: kv[0][1])
            if (seg, step) in {(0, s) for s in range(41)} | {(1, s) for s in range(41, 81)}
            | {(2, s) for s in range(81, 120)}]
    per_step = statistics.median(b - a for a, b in itertools.pairwise(main) if b > a)
    assert d["cadence"]["current_minutes"] == pytest.approx(20 * per_step / 60, rel=0.15)


def test_given_mtbf_overrides_the_measured_one(crashed: tuple[Path, Truth]) -> None:
    root, _ = crashed
    d = _advise(root, "crashy", mtbf_hours=24.0).to_dict()
    assert d["mtbf_hours"] == 24.0
    assert d["cadence"]["young_minutes"] == pytest.approx(math.sqrt(2 * d["checkpoint_seconds"] * 86400) / 60)


def test_without_write_seconds_the_step_gap_is_the_estimate(tmp_path: Path) -> None:
    truth = train_with_crashes(tmp_path, "unmeasured", CrashPlan(pass_write_seconds=False, crashes=((47, 40),)))
    advice = _advise(tmp_path, "unmeasured")
    assert not any(c.measured for c in advice.measured.checkpoints)
    assert advice.to_dict()["checkpoint_seconds"] == pytest.approx(statistics.median(truth.write_seconds.values()),
                                                                   abs=TOL_S)
    assert advice.to_dict()["lost_steps"] == 7 and advice.to_dict()["goodput"] is not None
