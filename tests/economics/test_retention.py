"""The retention ladder: sized by the run's measured detection lag so the advisor still finds a clean checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from runwatch.app.advise import checkpoint_advice
from runwatch.collectors.importers import import_logs
from runwatch.data.store import Store
from runwatch.detectors.finding import Finding, Rollback
from runwatch.economics.measure import Checkpoint
from runwatch.economics.retention import Depth, Ladder, ladder, milestones
from tests.detectors.synth import grad_curve, loss_curve
from tests.economics.ladder_check import all_clean, dense_only, replay


def _ckpts(steps: list[int], **kw: object) -> list[Checkpoint]:
    return [Checkpoint(step=s, segment=0, seconds=1.0, measured=True, bytes=10, main=True, followed=True,
                       deleted=bool(kw.get("deleted") and s in kw["deleted"])) for s in steps]


@pytest.mark.parametrize(("detected", "clean_before", "interval", "keep"), [
    (716, 700, 10, 3),    # 17 steps back at 10 per checkpoint: ceil(1.7) + 1
    (716, 700, 100, 2),   # the newest and the one before it
    (700, 699, 100, 2),   # caught at once: the checkpoint at the last healthy step may hold the damage
    (1500, 700, 100, 10),  # noticed 800 steps late
])
def test_keep_last_from_the_deepest_rollback(detected: int, clean_before: int, interval: int, keep: int) -> None:
    depth = Depth(kind="spike", segment=0, onset_step=clean_before + 1, detected_step=detected,
                  clean_before=clean_before)
    result = ladder([depth], float(interval), _ckpts(list(range(interval, 2000, interval))), [], 2000)
    assert result.keep_last == keep and result.every_nth == keep
    assert f"ceil({depth.depth_steps}/{interval})" in result.reason


def test_keeps_dense_sparse_and_milestones() -> None:
    lad = Ladder(keep_last=2, every_nth=3, milestones=[40], reason="")
    steps = list(range(10, 110, 10))  # 10 .. 100
    assert lad.keeps(steps, 100) == {90, 100} | {10, 40, 70, 100} | {40}
    assert lad.keeps(steps, 55) == {40, 50} | {10, 40}
    assert Ladder(keep_last=None, every_nth=None, milestones=[40], reason="").keeps(steps, 100) is None


def test_milestones_skip_deleted_and_unhealthy_checkpoints() -> None:
    spike = Finding(kind="spike", onset_step=301, end_step=330, peak_step=305, segment=0, severity="warning",
                    self_recovered=True, needs_action=False)
    marks = milestones(_ckpts(list(range(100, 1001, 100)), deleted={200}), [spike], 1000)
    assert marks == [100, 400, 500, 600, 700, 800, 900]  # 200 deleted; 300 at the spike's last healthy step
    assert milestones([], [], 1000) is None


def _jump_run(root: Path, run: str, onset: int, every: int) -> None:
    n = 1000
    loss, grad = loss_curve(n), grad_curve(n)
    loss[onset:] += 1.2  # a loss jump that stays: needs a rollback
    lines = []
    for s in range(n):
        lines.append({"step": s, "time": 1.7e9 + s, "loss": float(loss[s]), "grad_norm": float(grad[s])})
        if s and s % every == 0:
            lines.append({"event": "checkpoint", "step": s, "path": f"ckpt/{s}.pt", "write_seconds": 0.1})
    path = root.parent / f"{run}.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    import_logs("jsonl", [path], root, run)


def test_the_ladder_holds_a_clean_checkpoint_wherever_the_onset_falls(tmp_path: Path) -> None:
    """Onsets at every phase of a 10-step checkpoint interval; detection ~15 steps late: the advised dense tier
    alone always leaves the advisor a clean checkpoint at the detection step, one fewer does not."""
    root = tmp_path / "store"
    needed_all = []
    for onset in (701, 703, 706, 709, 710):
        _jump_run(root, f"onset{onset}", onset, every=10)
    with Store(root) as store:
        for onset in (701, 703, 706, 709, 710):
            run = f"onset{onset}"
            keep = checkpoint_advice(store, run).retention.keep_last
            assert keep == 3  # lag 15, clean before the last healthy step: 17 steps at 10 per checkpoint
            assert all_clean(replay(store, run, dense_only(keep)))
            needed_all.append(all_clean(replay(store, run, dense_only(keep - 1))))
    assert not all(needed_all)  # fewer would have lost the clean checkpoint for some onsets


@pytest.mark.parametrize(("newest", "verdict"), [
    (300, "This ladder keeps it."),  # wanted soon after: the dense tier (the last 2) holds it
    (1000, "This ladder would not have kept it either"),  # still open 800 steps later: beyond the measured lag
])
def test_checkpoint_missing_shows_in_the_retention_reason(newest: int, verdict: str) -> None:
    rollback = Rollback(checkpoint_step=100, checkpoint_path="ckpt/100.pt", skip_batches=[201, 300], actions=[],
                        reason="", evidence={"missing_checkpoint": {"step": 200, "path": "ckpt/200.pt"}},
                        checkpoint_missing=True)
    depth = Depth(kind="spike", segment=0, onset_step=201, detected_step=216, clean_before=200)
    result = ladder([depth], 100.0, _ckpts(list(range(100, newest + 1, 100)), deleted={200}), [], newest, rollback)
    assert result.keep_last == 2
    assert "checkpoint 200 (ckpt/200.pt), already deleted (checkpoint_missing)" in result.reason
    assert verdict in result.reason


def test_a_run_without_findings_or_checkpoints_cannot_size_it() -> None:
    assert ladder([], 100.0, _ckpts([100, 200]), [], 200).keep_last is None
    depth = Depth(kind="nan", segment=0, onset_step=50, detected_step=50, clean_before=49)
    unsized = ladder([depth], None, _ckpts([100]), [], 200)
    assert unsized.keep_last is None and "Fewer than two checkpoints" in unsized.reason
    assert np.isclose(depth.lag_steps, 0)
