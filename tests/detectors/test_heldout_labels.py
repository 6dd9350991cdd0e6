"""Held-out labels (bench/evalruns/heldout.py): rollback labels only where a checkpoint exists, fixes applied on load."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from evalruns.heldout import CORRECTIONS, _knobs, current_labels, heldout_scenarios  # noqa: E402


def test_no_rollback_label_without_a_checkpoint_before_the_fault() -> None:
    runs = heldout_scenarios()
    for lr in runs:
        if lr.rollback_step is not None:
            assert 0 < lr.rollback_step < min(lab.onset for lab in lr.labels if lab.needs_action and lab.open)
            assert lr.rollback_step % lr.spec.ckpt_every == 0
    early = [lr for lr in runs if lr.needs_action and lr.rollback_step is None]
    assert early, "the set holds faults before the first checkpoint"


def test_cached_labels_are_refreshed_from_the_code_and_a_changed_spec_is_refused() -> None:
    runs = heldout_scenarios()
    stale = {"version": "x", "runs": [{**lr.to_dict(), "labels": [], "rollback_step": 7, "knobs": _knobs(lr.spec)}
                                      for lr in runs]}
    fresh = {r["run"]: r for r in current_labels(stale)["runs"]}
    assert set(CORRECTIONS) <= set(fresh)
    assert fresh["h-clean-07"]["labels"][0]["kind"] == "scaler_collapse" and fresh["h-clean-07"]["needs_action"]
    assert fresh["h-divergence-15"]["labels"][0]["kind"] == "spike"
    assert all(r["rollback_step"] != 7 for r in fresh.values())
    stale["runs"][0]["knobs"] = {**stale["runs"][0]["knobs"], "batch": -1}
    with pytest.raises(ValueError, match="no longer matches"):
        current_labels(stale)
