"""Divergence, scaler collapse, NaN, stall and slowdown on synthetic series: positives, onsets, negatives."""

from __future__ import annotations

import numpy as np

from runwatch.detectors.divergence import detect_divergence
from runwatch.detectors.nan import detect_nan, nonfinite_masks
from runwatch.detectors.scaler_collapse import detect_scaler_collapse
from runwatch.detectors.slowdown import detect_slowdowns
from runwatch.detectors.stall import detect_stalls, live_stall
from tests.detectors.synth import grad_curve, loss_curve

N = 2000


def test_divergence_onset_and_evidence() -> None:
    steps = np.arange(N)
    loss, grad, act = loss_curve(N), grad_curve(N), np.full(N, 10.0)
    loss[1200:] += np.linspace(0, 3, N - 1200)
    grad[1200:] *= np.linspace(1, 4, N - 1200)
    act[1200:] *= np.linspace(1, 2, N - 1200)
    [f] = detect_divergence(steps, loss, grad, act, np.full(N, 3e-4))
    assert f.kind == "divergence" and f.needs_action and f.self_recovered is False
    assert abs(f.onset_step - 1200) <= 15
    assert f.evidence["grad_norm_ratio"] > 1.5 and f.evidence["act_norm_ratio"] > 1.2
    assert f.evidence["lr_at_onset"] == 3e-4


def test_no_divergence_on_clean_decay_or_lr_step_decay() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[1000:] -= 0.3
    nan = np.full(N, np.nan)
    assert detect_divergence(steps, loss, nan, nan, nan) == []


def test_noisy_flat_loss_is_not_divergence() -> None:
    rng = np.random.default_rng(7)
    loss = 3.0 + rng.standard_t(3, N) * 0.1
    nan = np.full(N, np.nan)
    assert detect_divergence(np.arange(N), loss, nan, nan, nan) == []


def _sawtooth(num_cycles: int) -> list[float]:
    # DeepSpeed SFT: calibration from 65536 down, then an overflow every ~100 steps at 65536 -> 32768 and regrowth.
    scale = [65536.0, 32768, 16384, 8192, 4096, 2048] + [2048.0] * 50 + [4096.0] * 100
    for _ in range(num_cycles):
        scale += [65536.0] * 90 + [32768.0] * 10
    return scale


def test_ordinary_backoffs_and_calibration_are_not_collapse() -> None:
    scale = np.array(_sawtooth(20))
    assert detect_scaler_collapse(np.arange(len(scale)), scale) == []


def test_halving_burst_below_floor_needs_action() -> None:
    scale = np.array(_sawtooth(5) + [2.0 ** k for k in range(15, -4, -1)] + [0.125] * 30)
    [f] = detect_scaler_collapse(np.arange(len(scale)), scale)
    assert f.kind == "scaler_collapse" and f.needs_action and f.severity == "critical"
    assert f.evidence["below_floor"] and f.evidence["scale_min"] == 0.125
    assert scale[np.searchsorted(np.arange(len(scale)), f.onset_step) - 1] >= scale[f.onset_step]


def test_burst_that_regrows_is_self_recovered() -> None:
    # DeepSpeed reward model: 512 -> 8 in a burst, then the scale grows back (to 16384, within three halvings of
    # the 65536 it overflowed at before, fewer than make a collapse: ``ScalerConfig.recovered_within``).
    regrow = [64.0] * 30 + [128.0] * 30 + [256.0] * 30 + [512.0] * 30 + [1024.0] * 30 + [2048.0] * 30 + [4096.0] * 30
    regrow += [8192.0] * 30 + [16384.0] * 30
    scale = np.array(_sawtooth(5) + [2.0 ** k for k in range(15, 5, -1)] + regrow)
    [f] = detect_scaler_collapse(np.arange(len(scale)), scale)
    assert f.self_recovered is True and not f.needs_action


def test_a_late_regrowth_is_a_recovery_that_says_when() -> None:
    # Fresh seed 537847's run 041: 4096 -> 256 in four skipped steps at 200, and a growth interval of ~900 steps, so
    # the scale sits 16x lower for 900 steps and is back within 8x of 4096 only at 1104. A recovery (late), whose
    # time is part of what the finding says: before, "the scaler is back to normal" named no step after 203.
    scale = np.array([4096.0] * 200 + [2048.0, 1024.0, 512.0, 256.0] + [256.0] * 900 + [512.0] * 900 + [1024.0] * 100)
    [f] = detect_scaler_collapse(np.arange(len(scale)), scale)
    assert f.self_recovered is True and not f.needs_action and f.evidence["recovery_steps"] == 904
    assert "regrown to 512 by step 1104, 904 steps after the onset" in f.message, f.message
    # Regrown at once (the DeepSpeed reward-model shape regrows a doubling every 30 steps): its time, no extra words.
    regrow = [float(2 ** k) for k in range(6, 15) for _ in range(30)]
    scale = np.array(_sawtooth(5) + [2.0 ** k for k in range(15, 5, -1)] + regrow)
    [f] = detect_scaler_collapse(np.arange(len(scale)), scale)
    assert f.self_recovered is True and f.evidence["recovery_steps"] > 0


def test_burst_that_stays_low_needs_action() -> None:
    # One regrowth (64 -> 128) after a 9-halving burst is not recovery; the window runs out.
    scale = np.array(_sawtooth(5) + [2.0 ** k for k in range(15, 5, -1)] + [64.0] * 100 + [128.0] * 150)
    [f] = detect_scaler_collapse(np.arange(len(scale)), scale)
    assert f.self_recovered is False and f.needs_action and f.evidence["scale_min"] == 64.0


def test_nan_reports_first_signal_and_skips_scaler_overflows() -> None:
    steps = np.arange(100)
    loss, grad, act = np.full(100, 2.0), np.full(100, 0.5), np.full(100, np.nan)
    grad[10] = np.inf  # an fp16 overflow the scaler skipped: not a NaN incident
    grad[60], loss[62:] = np.nan, np.nan
    skip = np.zeros(100, bool)
    skip[10] = True
    present = np.ones(100, bool)
    bad = nonfinite_masks(loss, grad, act, present, present, np.zeros(100, bool), skip)
    [f] = detect_nan(steps, bad, loss_finite_after=False)
    assert f.onset_step == 60 and f.evidence["first_signal"] == "grad_norm"
    assert f.evidence["first_step"]["loss"] == 62 and f.needs_action and f.severity == "critical"


def test_no_nan_finding_on_finite_run() -> None:
    present = np.ones(50, bool)
    bad = nonfinite_masks(np.ones(50), np.ones(50), np.ones(50), present, present, present, np.zeros(50, bool))
    assert detect_nan(np.arange(50), bad, True) == []


def test_stall_far_outside_step_time_distribution() -> None:
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.normal(1.0, 0.05, 500))
    times[300:] += 120.0
    [f] = detect_stalls(np.arange(500), times)
    assert (f.onset_step, f.end_step) == (299, 300) and f.self_recovered is True and not f.needs_action


def test_mild_gaps_and_checkpoint_writes_are_not_stalls() -> None:
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.normal(1.7, 0.05, 500))
    times[[120, 240, 360]] += 2.1  # modded-nanogpt: 3.8 s against a typical 1.7 s
    times[400:] += 90.0  # a checkpoint that took 90 s to write before step 400
    allowance = np.zeros(500)
    allowance[400] = 90.0
    assert detect_stalls(np.arange(500), times, allowance) == []


def test_live_stall_uses_now() -> None:
    times = np.arange(200, dtype=float) * 2.0
    assert live_stall(np.arange(200), times, now=times[-1] + 30, segment=0) is None
    f = live_stall(np.arange(200), times, now=times[-1] + 3600, segment=0)
    assert f is not None and f.needs_action and f.evidence["live"]


def test_slowdown_megatron_golden_shape() -> None:
    # iteration-time every 100 steps; 4x slower at 2100-2300, then back.
    rng = np.random.default_rng(1)
    st = rng.normal(1.44, 0.01, 500)
    st[21:24] = 6.1
    [f] = detect_slowdowns(np.arange(1, 501) * 100, st)
    assert (f.onset_step, f.end_step) == (2200, 2400)
    assert f.kind == "slowdown" and f.self_recovered is True and f.severity == "warning" and not f.needs_action
    assert f.message.startswith("steps taking 4.23x as long from step 2200"), f.message  # not "323% slower"


def test_sustained_five_percent_slowdown_is_info() -> None:
    rng = np.random.default_rng(2)
    st = rng.normal(105.0, 0.3, 300)
    st[200:] += 5.0
    [f] = detect_slowdowns(np.arange(300), st)
    assert f.onset_step == 200 and f.severity == "info" and f.self_recovered is None
    assert f.message.startswith("steps 5% slower from step 200"), f.message


def test_jittery_step_time_is_not_a_slowdown() -> None:
    rng = np.random.default_rng(3)
    st = rng.lognormal(np.log(0.6), 0.15, 3000)
    assert detect_slowdowns(np.arange(3000), st) == []


def test_a_few_slow_steps_are_a_hiccup_not_a_slowdown() -> None:
    rng = np.random.default_rng(3)
    st = 0.010 * (1 + 0.01 * rng.standard_normal(500))
    st[200:203] = 0.6  # three steps 60x slower (a GC pause, a noisy neighbour), then normal again
    assert detect_slowdowns(np.arange(500), st) == []
    st[300:340] = 0.02  # forty steps twice as slow: sustained
    [f] = detect_slowdowns(np.arange(500), st)
    assert (f.onset_step, f.end_step, f.severity) == (300, 339, "warning")
    # Back to normal at 340: the time it took is part of the finding, as a spike's is.
    assert f.evidence["recovery_steps"] == 40 and f.message.endswith("back to normal after 40 steps"), f.message


def test_every_kind_that_recovered_says_how_long_it_took() -> None:
    """``evidence.recovery_steps``, onset to the first row back to normal, on each kind that can come back by
    itself (DETECTION.md section 5: a late recovery is a recovery; record how long it took): a NaN finite again,
    a loss climb that came back down; None where it did not."""
    steps = np.arange(100)
    loss, grad, act = np.full(100, 2.0), np.full(100, 0.5), np.full(100, 3.0)
    grad[40:43] = np.nan  # three non-finite grad norms the scaler did not skip, then finite again
    present, no = np.ones(100, bool), np.zeros(100, bool)
    [f] = detect_nan(steps, nonfinite_masks(loss, grad, act, present, present, present, no), loss_finite_after=True)
    assert f.self_recovered and f.evidence["recovery_steps"] == 3 and "finite again after 3 steps" in f.message
    grad[60:] = np.nan
    [f] = detect_nan(steps, nonfinite_masks(loss, grad, act, present, present, present, no), loss_finite_after=True)
    assert not f.self_recovered and f.evidence["recovery_steps"] is None
    n = 1500
    climb = loss_curve(n) + np.where(np.arange(n) >= 800, np.minimum(np.arange(n) - 800, 1000 - np.arange(n)), 0) * 0.01
    climb[800:] = np.maximum(climb[800:], loss_curve(n)[800:])  # up 1.0 by 900 and back down by 1000
    found = [f for f in detect_divergence(np.arange(n), climb, grad_curve(n), np.full(n, 10.0), np.full(n, 3e-4))
             if f.self_recovered]
    assert found and all(f.evidence["recovery_steps"] > 0 and f"came back down after {f.evidence['recovery_steps']} steps"
                         in f.message for f in found), found
