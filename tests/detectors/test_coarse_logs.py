"""Logs written every k steps: stalls judged per step, slowdowns not mistaken for stalls, rollback before the last healthy row."""

from __future__ import annotations

import numpy as np

from runwatch.detectors.analysis import analyze
from runwatch.detectors.stall import detect_stalls
from tests.detectors.synth import events_table, grad_curve, loss_curve, rows_table


def _coarse_times(num_rows: int, every: int, per_step: float = 2.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.arange(num_rows) * every
    times = np.cumsum(rng.normal(per_step * every, 0.02 * per_step * every, num_rows))
    return steps, times


def test_pause_inside_a_25_step_interval_is_a_stall() -> None:
    # 25 steps of 2 s = 50 s per interval; a 120 s pause (60 steps' time) raises the interval only 2.4x,
    # and it comes at the 12th row, long before a 16-row block baseline would exist.
    steps, times = _coarse_times(40, 25)
    times[12:] += 120.0
    [f] = detect_stalls(steps, times)
    assert (f.onset_step, f.end_step) == (275, 300) and f.evidence["num_steps"] == 25


def test_interval_jitter_in_coarse_logs_is_not_a_stall() -> None:
    steps, times = _coarse_times(400, 100, seed=1)  # every 100 steps, 2% jitter per interval
    assert detect_stalls(steps, times) == []


def test_a_short_pause_in_a_coarse_log_is_not_a_stall() -> None:
    steps, times = _coarse_times(40, 25)
    times[20:] += 12.0  # 6 steps' time: under STALL_RATIO - 1 = 9 steps
    assert detect_stalls(steps, times) == []


def test_slowdown_in_a_10_step_log_is_a_slowdown_not_a_row_of_stalls() -> None:
    steps, times = _coarse_times(200, 10)
    per = np.diff(times, prepend=0.0)
    per[100:160] *= 3.0  # three times slower for 600 steps: each interval holds 20 extra steps' time
    times = np.cumsum(per)
    n = len(steps)
    rows = rows_table(steps, loss=loss_curve(n), grad_norm=grad_curve(n), time=times)
    kinds = [f.kind for f in analyze(rows, events_table([])).findings]
    assert kinds == ["slowdown"]


def test_a_small_slowdown_of_few_coarse_rows_is_judged_by_the_steps_it_lasts() -> None:
    """A slowdown under ``warn_rise`` must outlast a host's jitter, which is a few steps: on a log every 25 steps
    five rows are 125 steps, each row the mean of 25 steps' time (fresh seed 390085's run 080: 22% slower for 5
    rows, 14 sigmas, dropped as 'a few observations'). An info slowdown now; the same five rows of a per-step log
    are still jitter."""
    for every, found in ((25, True), (1, False)):
        steps, times = _coarse_times(120, every, seed=3)
        per = np.diff(times, prepend=0.0)
        per[60:65] *= 1.22
        times = np.cumsum(per)
        n = len(steps)
        rows = rows_table(steps, loss=loss_curve(n), grad_norm=grad_curve(n), time=times)
        slow = [f for f in analyze(rows, events_table([])).findings if f.kind == "slowdown"]
        assert [(f.onset_step, f.severity) for f in slow] == ([(60 * every, "info")] if found else []), slow


def test_pause_inside_a_slowdown_still_stands_out() -> None:
    steps, times = _coarse_times(200, 10)
    per = np.diff(times, prepend=0.0)
    per[100:160] *= 3.0
    per[130] += 900.0  # 150 steps at the slow pace of 6 s
    times = np.cumsum(per)
    n = len(steps)
    rows = rows_table(steps, loss=loss_curve(n), grad_norm=grad_curve(n), time=times)
    stalls = [f for f in analyze(rows, events_table([])).findings if f.kind == "stall"]
    assert [(f.onset_step, f.end_step) for f in stalls] == [(1290, 1300)]


def _ckpt_run(write_seconds: float | None) -> list[str]:
    steps, times = _coarse_times(40, 10, per_step=1.1)
    times[20:] += 34.0  # nanoGPT issue 215: eval + save at step 200 took 34 s more than 10 steps of 1.1 s
    n = len(steps)
    rows = rows_table(steps, loss=loss_curve(n), grad_norm=grad_curve(n), time=times)
    payload = {"path": "out/ckpt.pt"} if write_seconds is None else {"path": "out/ckpt.pt", "write_seconds": write_seconds}
    events = events_table([{"event": "checkpoint", "step": 200, "payload": payload}])
    return [f.kind for f in analyze(rows, events).findings]


def test_checkpoint_of_unknown_write_time_keeps_the_interval_ratio_rule() -> None:
    assert _ckpt_run(None) == []  # 4x the interval: a save and an eval may explain it
    assert _ckpt_run(2.0) == ["stall"]  # a 2 s save leaves 32 s (29 steps) unexplained


def test_rollback_is_strictly_before_the_last_logged_healthy_row() -> None:
    # Logged every 25 steps, checkpoints every 10: the fault shows first at row 2025 and began somewhere
    # after row 2000, the last row known healthy. Checkpoint 2000 holds update 2000, which may have made
    # the bad loss of step 2001: only a checkpoint before the last healthy row is known clean.
    steps = np.arange(0, 3000, 25)
    n = len(steps)
    loss, grad = loss_curve(n, noise=0.01), grad_curve(n)
    loss[steps >= 2025] += 1.2
    grad[(steps >= 2025) & (steps < 2275)] *= 20
    rows = rows_table(steps, loss=loss, grad_norm=grad)
    events = [{"event": "checkpoint", "step": s, "payload": {"path": f"/ckpt/{s}"}} for s in range(1000, 3000, 10)]
    report = analyze(rows, events_table(events))
    assert report.rollback is not None and report.rollback.checkpoint_step == 1990


def test_act_norm_rising_since_the_first_observations_is_early_training_not_a_precursor() -> None:
    from runwatch.detectors.divergence import act_growth_start

    steps = np.arange(200)
    rising = 1.0 + steps * 0.05  # activations grow from step 0 (warm-up): no flat stretch to depart from
    assert act_growth_start(steps, rising, 150) is None
    flat_then_rising = np.where(steps < 80, 1.0, 1.0 + (steps - 80) * 0.05)
    start = act_growth_start(steps, flat_then_rising, 150)
    assert start is not None and 60 <= start <= 100


def _nan_after_act_rise(lr: np.ndarray, learning: bool = False) -> int | None:
    """A NaN at 114 after the activation norm climbed 4x from step 30; the loss flat through the climb (OPT's
    precursor: growth that buys nothing) or, with ``learning``, falling through it as training goes on."""
    n = 134
    steps = np.arange(n)
    loss, grad = loss_curve(n, noise=0.01), grad_curve(n)
    if not learning:
        loss = np.where(steps < 30, loss, 3.0 + 2.0 * np.exp(-30 / 300) + (loss - loss_curve(n, noise=0.0)))
    act = np.where(steps < 30, 1.0, 1.0 + (steps - 30) * 0.04)  # activations climbing from step 30
    loss[114:], grad[114:], act[114:] = np.nan, np.nan, np.nan
    rows = rows_table(steps, loss=loss, grad_norm=grad, act_norm=act, lr=lr)
    events = [{"event": "checkpoint", "step": s, "payload": {"path": f"/ckpt/{s}"}} for s in (50, 100)]
    rb = analyze(rows, events_table(events)).rollback
    assert rb is not None
    return rb.checkpoint_step


def test_act_norm_climb_inside_the_lr_warmup_is_not_walked_back_over() -> None:
    steps = np.arange(134)
    assert _nan_after_act_rise(3e-3 * np.minimum(steps + 1, 150) / 150) == 100  # nanoGPT-style 150-step warm-up
    assert _nan_after_act_rise(np.full(134, 3e-3)) is None  # same climb at a constant LR: a precursor from step ~30


def test_an_act_norm_climb_the_loss_fell_through_is_learning_not_a_precursor() -> None:
    """Seed 260854's run 087: after the warm-up the activation norm grew 1.7 -> 5.1 while the loss fell 4.0 ->
    3.07, and every checkpoint before a later fault was refused as inside OPT's precursor."""
    lr = np.full(134, 3e-3)
    assert _nan_after_act_rise(lr) is None  # the loss flat through the climb: walked back before it
    assert _nan_after_act_rise(lr, learning=True) == 100  # the loss falling through it: the checkpoint before the NaN


def test_scaler_chain_gap_counts_steps_on_a_coarse_log() -> None:
    from runwatch.detectors.scaler_collapse import detect_scaler_collapse

    steps = np.arange(0, 400, 5)  # logged every 5 steps, growth interval longer than the run: no regrowth
    scale = np.full(len(steps), 65536.0)
    for at in (165, 175, 200):  # ordinary single backoffs
        scale[steps >= at] /= 2
    for at in (240, 245, 250, 255):  # the collapse: 4-5 halvings per row
        scale[steps >= at] /= 32
    [f] = detect_scaler_collapse(steps, scale)
    assert f.onset_step == 240  # 200 -> 240 is 8 rows but 40 steps: not one chain with the backoffs before


def test_scaler_halving_on_every_row_of_a_100_step_log_is_still_one_chain() -> None:
    from runwatch.detectors.scaler_collapse import detect_scaler_collapse

    steps = np.arange(0, 30000, 100)
    scale = np.full(len(steps), 65536.0)
    scale[150:] = 32768.0
    scale[151:] = 131072.0  # grew: start-up calibration is over
    for i in range(200, 206):
        scale[i:] /= 2  # one halving per logged row, 100 steps apart
    [f] = detect_scaler_collapse(steps, scale)
    assert f.onset_step == 20000 and f.evidence["halvings"] == 6


def test_a_collapse_begins_at_the_flagged_skip_whose_halving_the_next_row_shows() -> None:
    """Seed 260854's run 062 (logged every 10 steps): row 840 is flagged skipped at the scale it ran with, the
    next row shows 10 halvings. The first skipped step is 840 (the onset the rollback counts back from), not the
    row where the scale first looks lower; per-step logs alike."""
    from runwatch.detectors.scaler_collapse import detect_scaler_collapse

    for every in (10, 1):
        steps = np.arange(0, 1000, every)
        scale = np.full(len(steps), 16384.0)
        flag = np.zeros(len(steps), bool)
        at = int(np.searchsorted(steps, 840))
        flag[at:] = True  # every step from 840 on skipped...
        scale[at + 1:] = 16384.0 / 2.0 ** np.minimum(np.arange(1, len(steps) - at) * every, 14)  # ...halving each
        scale = np.maximum(scale, 1.0)  # pinned at the minimum of 1
        [f] = detect_scaler_collapse(steps, scale, found_inf=flag, meta={"scaler": {"growth_interval": 100}})
        assert f.onset_step == 840, (every, f.onset_step)
        assert f.needs_action
