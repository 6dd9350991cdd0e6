"""Rollback walk-back: a checkpoint rejected for an activation-norm climb from step X leaves only checkpoints before X.

The climb here (steps 1400-2200) ends before the spike at 2500, so the onset alone
does not reveal it; only the health check of the checkpoint at 2150 does. The
checkpoint at 1430 is inside the climb but too early to show it, and must be
rejected by the walk-back, not by its own health check (the control proves that).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from runwatch.detectors.analysis import analyze
from tests.detectors.synth import events_table, grad_curve, loss_curve, rows_table

N = 3000
CLIMB_FROM, CLIMB_TO, SPIKE_AT = 1400, 2200, 2500


def _rows() -> pa.Table:
    steps = np.arange(N)
    loss, grad = loss_curve(N), grad_curve(N)
    rng = np.random.default_rng(0)
    act = 20.0 + rng.normal(0, 0.1, N)
    act[CLIMB_FROM:CLIMB_TO] *= np.linspace(1.0, 2.0, CLIMB_TO - CLIMB_FROM)  # climbs to 2x, then resets flat
    loss[SPIKE_AT:] += 1.2  # an unrecovered spike: needs a rollback
    grad[SPIKE_AT:SPIKE_AT + 10] *= 20
    return rows_table(steps, loss=loss, grad_norm=grad, act_norm=act)


def _ckpts(steps: list[int]) -> pa.Table:
    return events_table([{"event": "checkpoint", "step": s, "payload": {"path": f"/ckpt/step{s}"}} for s in steps])


def test_checkpoint_early_in_the_climb_is_healthy_on_its_own() -> None:
    rb = analyze(_rows(), _ckpts([1000, 1300, 1430])).rollback
    assert rb is not None and rb.checkpoint_step == 1430, rb and rb.reason
    # Checkpoints strictly before the last healthy logged step (2499) qualify.
    assert "act_norm_growth_from" not in rb.evidence and rb.evidence["cutoff_step"] == SPIKE_AT - 1


def test_rejected_climb_moves_the_cutoff_before_it() -> None:
    report = analyze(_rows(), _ckpts([1000, 1300, 1430, 2150]))
    [target] = [f for f in report.findings if f.needs_action and f.open]
    assert target.onset_step == SPIKE_AT
    rb = report.rollback
    assert rb.checkpoint_step == 1300 and rb.checkpoint_path == "/ckpt/step1300", rb.reason
    cutoff = rb.evidence["cutoff_step"]
    assert CLIMB_FROM - 20 <= cutoff <= CLIMB_FROM + 30 and rb.evidence["act_norm_growth_from"] == cutoff
    assert f"activation-norm growth from step {cutoff}" in rb.reason
    rejected = {r["step"]: r["why"] for r in rb.evidence["rejected_checkpoints"]}
    assert set(rejected) == {2150, 1430}
    assert rejected[2150] == f"activation norm climbing since step {cutoff}"
    assert rejected[1430] == f"after the activation-norm climb from step {cutoff}"
    assert not rb.checkpoint_missing
