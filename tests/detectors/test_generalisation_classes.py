"""Regression tests, one per failure class, for the detector fixes of the generalisation round.

Each test builds a small synthetic series in code and judges it through ``analyze`` (or
``StreamingAnalyzer`` against it). Each fails on the commit before its fix, named in its docstring
(``git log -- detectors`` on main); a part marked "guard" passes there too and keeps a naive fix honest.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from runwatch.detectors.analysis import Report, analyze
from runwatch.detectors.config import DEFAULT
from runwatch.detectors.divergence import lr_before, lr_rise_start, warmup_end, warmup_resumed_end
from runwatch.detectors.finding import Finding
from runwatch.detectors.spike import _lr_story
from runwatch.detectors.stall import detect_stalls
from runwatch.detectors.streaming import StreamingAnalyzer
from tests.detectors.synth import events_table, grad_curve, loss_curve, rows_table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _ckpts(steps: list[int], resume: tuple[int, int] | None = None) -> pa.Table:
    events = [{"event": "checkpoint", "step": s, "payload": {"path": f"/ckpt/{s}"}} for s in steps]
    if resume is not None:  # (segment, checkpoint step)
        events.append({"event": "resume", "segment": resume[0], "step": resume[1],
                       "payload": {"path": f"/ckpt/{resume[1]}"}})
    return events_table(events)


def _alarms(report: Report, kind: str | None = None) -> list[Finding]:
    """Warning-or-critical findings: what counts against the false-alarm budget (DETECTION.md section 4)."""
    return [f for f in report.findings if f.severity != "info" and (kind is None or f.kind == kind)]


def _trend(n: int) -> np.ndarray:
    steps = np.arange(n)
    return 3.0 + 2.0 * np.exp(-steps / 300)  # synth.loss_curve without its noise


# 1. The spike scale follows rising noise (257a1e9).

@pytest.mark.parametrize("seed", range(8))
def test_1_loss_noise_growing_block_after_block_is_not_a_stream_of_spikes(seed: int) -> None:
    """The loss noise grows x1.6 per 16-observation block for six blocks (x17, as early training's spread does),
    then stays there: no alarm. Fails on 257a1e9^ (a scale two blocks behind called it 10-sigma spikes)."""
    n, rng = 1200, np.random.default_rng(seed)
    steps = np.arange(n)
    sigma = 0.02 * 1.6 ** np.interp(steps, [0, 400, 496, n], [0, 0, 6, 6])
    loss = _trend(n) + rng.normal(0, 1, n) * sigma
    assert _alarms(analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10)))) == []
    # A real spike on the grown noise is still one: an alarm, or (seed 2, whose tail raised the single-observation
    # bar to 8.1 of its sigmas) a shift only the CUSUM bank saw, with nothing else moving: an annotation.
    loss[900:930] += 10 * sigma[-1] * np.exp(-np.arange(30) / 10)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10)))
    spikes = [f for f in report.findings if f.kind == "spike" and f.onset_step >= 600]
    assert [f.onset_step for f in spikes] == [900] and [f.onset_step for f in _alarms(report)] in ([900], [])
    assert spikes[0].severity == "warning" or spikes[0].evidence["uncorroborated"], spikes[0]


# 2. "The noise grew" is info, not a spike, when the far-out values fall below as often as above
#    (257a1e9 introduced it; 55773f0 made it a sign test).

@pytest.mark.parametrize("seed", range(6))
def test_2a_noise_that_jumps_tenfold_is_an_info_that_the_noise_grew(seed: int) -> None:
    """At step 800 the loss noise jumps x10, symmetric about the trend. Fails on 257a1e9^ (spike alarms, some
    critical, in most seeds)."""
    n, rng = 1500, np.random.default_rng(seed)
    steps = np.arange(n)
    loss = _trend(n) + rng.normal(0, 1, n) * np.where(steps < 800, 0.02, 0.2)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10)))
    assert _alarms(report) == []
    [f] = report.findings
    assert (f.kind, f.needs_action, f.evidence.get("noise_grew")) == ("spike", False, True)
    assert 800 <= f.onset_step <= 816 and "noise grew" in f.message


@pytest.mark.parametrize("seed", range(4))
def test_2b_a_spike_whose_recovery_dips_under_the_old_band_is_still_a_spike(seed: int) -> None:
    """A spike (+1.0, decaying) with two easy batches 15 sigma under the trend during its recovery: far more
    far-out values above than below, so no sign of symmetric noise. Fails on 55773f0^ (the second value far
    below called it 'the noise grew', info)."""
    n = 1500
    steps, trend = np.arange(n), _trend(n)
    loss = loss_curve(n, seed=seed, noise=0.02)
    loss[800:900] += np.exp(-np.arange(100) / 30)
    loss[[820, 830]] = trend[[820, 830]] - 0.3
    [f] = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10))).findings
    assert (f.kind, f.severity, f.onset_step, f.evidence.get("noise_grew")) == ("spike", "warning", 800, False)
    assert f.self_recovered is True


# 3. Streaming equals offline when an episode's end is decided at one observation (257a1e9).

@pytest.mark.parametrize("onset, length", [(805, 20), (800, 30), (800, 60)])
def test_3_streaming_equals_offline_when_a_grad_led_episode_outlasts_the_patience(onset: int, length: int) -> None:
    """The gradient norm x6 for 20-60 observations with the loss in its band: whether it ends as a recovery or as
    a trend (re-learn the baseline) must not depend on how rows arrive. Fails on 257a1e9^ (the trend check ran
    wherever a streaming flush stopped: offline kept an info blip from the onset, streaming dropped it or
    started it later)."""
    n = 1000
    steps = np.arange(n)
    grad = grad_curve(n)
    grad[onset:onset + length] *= 6.0
    rows = rows_table(steps, loss=loss_curve(n, noise=0.02), grad_norm=grad)
    _table_streams_alike(rows, None, analyze(rows).findings)


# 4. peak_loss is None, not NaN, when the episode saw no finite loss (257a1e9).

def test_4_a_spike_that_saw_no_finite_loss_has_strict_json_evidence() -> None:
    """Six non-finite losses under a x20 gradient norm: the gradient-norm blip's evidence says peak_loss None and
    dumps as strict JSON (the dashboard renders evidence with json.dumps). Fails on 257a1e9^ (NaN)."""
    n = 1200
    steps = np.arange(n)
    loss, grad = loss_curve(n), grad_curve(n)
    loss[800:806] = np.nan
    grad[800:806] *= 20
    from runwatch.detectors.spike import detect_spikes

    report = analyze(rows_table(steps, loss=loss, grad_norm=grad))
    # Assembled, the blip wholly inside the NaN episode is that episode (test 93); the scanner's own finding is
    # what must dump as strict JSON.
    assert {f.kind for f in report.findings} == {"nan"}
    [blip] = detect_spikes(steps, loss, grad)
    assert blip.evidence["peak_loss"] is None and blip.evidence["loss_rise"] is None
    json.dumps(blip.evidence, allow_nan=False)
    assert "not finite" in blip.message and "nan" not in blip.message


# 5. Cold start: before a noise model exists (a segment's first 32 observations) (1abf578).

def _cold_series(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A log's first 60 rows: the loss falling from 10, the gradient norm climbing x4 over the first 24 rows (a
    warm-up) and flat after."""
    n, rng = 60, np.random.default_rng(seed)
    steps = np.arange(n)
    loss = 10.0 - 3.0 * (1 - np.exp(-steps / 15)) + rng.normal(0, 0.03, n)
    grad = np.exp(np.interp(steps, [0, 24, n], [np.log(0.25), np.log(1.0), np.log(1.0)]) + rng.normal(0, 0.05, n))
    return steps, loss, grad


@pytest.mark.parametrize("seed", range(4))
def test_5_a_cold_onset_is_not_carried_back_through_a_warm_up_but_a_x20_grad_norm_leads(seed: int) -> None:
    """Part 1 (guard): a loss x2 jump at row 26 in the cold phase starts at 26, not back in the warm-up's norm climb
    (fails on 50d4843^, onset ~10). Part 2: a x20 gradient norm the row before the loss jump leads the onset (a
    Megatron excerpt). Fails on 1abf578^ (cold, nothing was out of band: the onset was the loss row, 27)."""
    steps, loss, grad = _cold_series(seed)
    loss[26:36] *= 2.0
    grad[26:36] *= 3.0
    [f] = analyze(rows_table(steps, loss=loss, grad_norm=grad)).findings
    assert (f.kind, f.onset_step, f.evidence["grad_norm_moved_first"]) == ("spike", 26, False)
    steps, loss, grad = _cold_series(seed)
    grad[26] *= 20.0
    loss[27:37] *= 2.0
    grad[27:37] *= 5.0
    [f] = analyze(rows_table(steps, loss=loss, grad_norm=grad)).findings
    assert (f.kind, f.onset_step, f.evidence["grad_norm_moved_first"]) == ("spike", 26, True)


# 6. A loss excursion under an LR still raised (not the schedule) is a divergence, recovered or not (e044303).

@pytest.mark.parametrize("held", [True, False])
def test_6_a_spike_under_an_lr_still_raised_is_a_divergence_even_if_the_loss_came_back(held: bool) -> None:
    """The LR x10 from step 1500 and held (held) or for two steps only; the loss jumps and is back on its trend
    within ~60 steps either way. Held: a critical divergence with a rollback before 1500. Fails on e044303^ (a
    recovered spike, no advice). The burst that is over stays a recovered spike (guard)."""
    n = 2400
    steps = np.arange(n)
    loss, grad = loss_curve(n), grad_curve(n)
    lr = np.full(n, 3e-4)
    if held:
        lr[1500:] = 3e-3
    else:
        lr[1499:1501] = 3e-3
    loss[1500:1560] += 1.5 * np.exp(-np.arange(60) / 12)
    grad[1500:1530] *= 6
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr), _ckpts([1000, 1400]))
    [f] = report.findings
    if held:
        assert (f.kind, f.severity, f.needs_action, f.onset_step) == ("divergence", "critical", True, 1500)
        assert f.evidence["lr_still_raised"] and report.rollback.checkpoint_step == 1400

    else:
        assert (f.kind, f.severity, f.self_recovered, f.needs_action) == ("spike", "warning", True, False)
        assert report.rollback is None


# 7. A divergence begins where the LR began rising into it; the opening warm-up is the schedule (c379eae, 8f0cd39).

def _warmup_lr(steps: np.ndarray, end: int) -> np.ndarray:
    return np.interp(steps, [0, end, steps[-1]], [3e-6, 3e-4, 3e-4])


def test_7a_after_a_slow_lr_ramp_the_rollback_precedes_the_ramp() -> None:
    """The LR ramps x10 over steps 1501-1560 and the loss climbs from 1580: the divergence starts at the first
    update under the raised LR and the advice is the checkpoint before it. Fails on c379eae^ (onset at the loss
    climb, ~1588, advising checkpoint 1560, taken under the raised LR)."""
    n = 2000
    steps = np.arange(n)
    lr = _warmup_lr(steps, 200)
    lr[1500:] = np.interp(steps[1500:], [1500, 1560], [3e-4, 3e-3])
    loss = loss_curve(n)
    loss[1580:] += np.linspace(0, 3, n - 1580) ** 1.5
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n), lr=lr),
                     _ckpts([1000, 1300, 1450, 1520, 1560]))
    [div] = report.findings
    # The first raised update is 1501's; the first observation it made is 1502's (the onset: DETECTION.md 7a).
    assert (div.kind, div.onset_step, div.evidence["lr_rise_step"]) == ("divergence", 1502, 1501)
    assert report.rollback.checkpoint_step == 1450, report.rollback.reason


def test_7c_a_ramp_longer_than_the_lr_lookback_is_found_from_its_start() -> None:
    """The LR ramps x10 over steps 1501-1700 and the loss climbs from 1720: the ramp began more than 128 rows
    before the climb, and the rise is still found from its first row (it was cut at the lookback window's edge,
    ~1592, advising a checkpoint taken under an LR already 4x higher)."""
    n = 2200
    steps = np.arange(n)
    lr = _warmup_lr(steps, 200)
    lr[1500:] = np.interp(steps[1500:], [1500, 1700], [3e-4, 3e-3])
    loss = loss_curve(n)
    loss[1720:] += np.linspace(0, 3, n - 1720) ** 1.5
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n), lr=lr),
                     _ckpts([1000, 1300, 1450, 1550, 1650]))
    div = next(f for f in report.findings if f.kind == "divergence")
    assert (div.onset_step, div.evidence["lr_rise_step"]) == (1502, 1501)  # the rise's first consequence
    assert report.rollback.checkpoint_step == 1450, report.rollback.reason


@pytest.mark.parametrize("grad_grows_in_warmup", [False, True])
def test_7b_the_opening_warm_up_is_not_a_ramp(grad_grows_in_warmup: bool) -> None:
    """A divergence soon after the opening LR warm-up (steps 0-300). Its onset stays after the warm-up: neither the
    warm-up's LR rise (guard: passes on c379eae^, where no LR rise moved an onset) nor a gradient norm that began
    growing inside the warm-up (the model answering the rising LR) carries it back. The latter fails on 8f0cd39^
    (onset ~100, advising checkpoint 50)."""
    n = 800
    steps = np.arange(n)
    grad = grad_curve(n)
    climb = 400 if grad_grows_in_warmup else 330
    if grad_grows_in_warmup:
        grad *= np.interp(steps, [0, 100, n], [1, 1, 1 + (n - 100) / 100])  # growing from 100 on, linearly
    loss = loss_curve(n)
    loss[climb:] += np.linspace(0, 3, n - climb) ** 1.5
    rows = rows_table(steps, loss=loss, grad_norm=grad, lr=_warmup_lr(steps, 300))
    report = analyze(rows, _ckpts([50, 150, 250, 320]))
    [div] = report.findings
    assert (div.kind, div.onset_step > 300, div.evidence["lr_rise_step"]) == ("divergence", True, None), div.onset_step
    assert report.rollback.checkpoint_step == 320, report.rollback.reason


# 8. The fp16 scaler (93fb755, a5c0c2e).

def _scaler_rows(steps: np.ndarray, scale: np.ndarray, **cols: np.ndarray) -> pa.Table:
    n = len(steps)
    return rows_table(steps, loss=loss_curve(n), grad_norm=grad_curve(n), loss_scale=scale, **cols)


def test_8a_a_coarse_log_with_a_skip_flag_counts_the_halvings_between_rows() -> None:
    """A log every 10 steps whose logged steps ran clean (found_inf False) while the scale halves three times and
    regrows, over and over, from step 4000: a skip burst with or without the flag column. Fails on 93fb755^ (with
    the flag logged, its False hid the halvings: no finding)."""
    n = 800
    steps = np.arange(n) * 10
    phase = (np.arange(n) - 400) % 6
    change = np.where(np.arange(n) < 400, 1.0, np.where(phase < 3, 0.5, 2.0))
    scale = 65536.0 * np.cumprod(change)
    flagged = analyze(_scaler_rows(steps, scale, found_inf=np.zeros(n, bool))).findings
    unflagged = analyze(_scaler_rows(steps, scale)).findings
    assert [(f.kind, f.onset_step, f.needs_action) for f in flagged] == [("scaler_collapse", 4000, True)]
    assert flagged == unflagged


def test_8b_a_flagged_step_and_its_halving_on_the_next_row_are_one_skip() -> None:
    """Guard (passes on 93fb755^ too): a per-step log flags six skipped steps, each one's halving showing on the next
    row; counting the flag and the halving both would double the skips."""
    n = 1800
    steps = np.arange(n)
    skipped = np.zeros(n, bool)
    skipped[1200:1206] = True
    scale = np.full(n, 4096.0)
    scale[1201:] = 4096.0 / 2.0 ** np.minimum(np.arange(1, n - 1200), 6)
    [f] = analyze(_scaler_rows(steps, scale, found_inf=skipped)).findings
    assert (f.kind, f.onset_step, f.evidence["num_skipped"]) == ("scaler_collapse", 1200, 6)


def test_8c_a_slide_long_after_calibration_is_a_collapse_though_the_scale_never_grew() -> None:
    """The scale calibrates 65536 -> 1024 in the first steps and never grows; from step 1000 it halves every 200
    steps (too slow for the skip-rate test) down to 8. Fails on a5c0c2e^ (the calibration chain never ended without
    a growth: the slide was excused as calibration). Calibration alone stays quiet (guard)."""
    n = 2400
    steps = np.arange(n)
    scale = np.full(n, 1024.0)
    scale[:7] = 65536.0 / 2.0 ** np.arange(7)
    meta = {"scaler": {"growth_interval": 2000}}
    assert analyze(_scaler_rows(steps, scale), meta=meta).findings == []
    for at in range(1000, n, 200):
        scale[at:] /= 2
    found = analyze(_scaler_rows(steps, scale), meta=meta).findings
    assert [(f.kind, f.needs_action) for f in found] == [("scaler_collapse", True)]
    assert 1000 <= found[0].onset_step <= 1600


# 9. A stall is judged against the host's long-run interval noise, never a calm window's (f6c6115).

@pytest.mark.parametrize("seed", range(4))
def test_9_an_ordinary_interval_after_a_calm_window_is_not_a_stall(seed: int) -> None:
    """A log every 1000 steps whose interval time varies 2% (sd); 40 intervals calm (0.5%), then one 3.75 sd long,
    under the rule's own 6 sd of the host's noise: no stall. A 10-minute pause there still is one. Fails on
    f6c6115^ (the calm window's low estimate made that interval a stall)."""
    n, k, rng = 700, 1000, np.random.default_rng(seed)
    steps = (np.arange(n) + 1) * k
    eps = rng.normal(0, 0.02, n)
    eps[424:464] = rng.normal(0, 0.005, 40)
    eps[464] = 3.75 * 0.02
    per_interval = k * 0.5 * (1 + eps)
    report = analyze(rows_table(steps, time=np.cumsum(per_interval), loss=loss_curve(n), grad_norm=grad_curve(n)))
    assert [f for f in report.findings if f.kind == "stall"] == []
    per_interval[464] += 600.0
    report = analyze(rows_table(steps, time=np.cumsum(per_interval), loss=loss_curve(n), grad_norm=grad_curve(n)))
    [stall] = [f for f in report.findings if f.kind == "stall"]
    assert (stall.onset_step, stall.severity) == (464 * k, "warning")


# 10. A resumed fp16 scaler re-calibrating is no bad resume; re-spiking losses are (242a2e5).

@pytest.mark.parametrize("inf_grads, loss_jump", [(True, False), (False, True), (True, True)])
def test_10_an_inf_grad_norm_alone_after_a_resume_is_not_a_bad_resume(inf_grads: bool, loss_jump: bool) -> None:
    """Segment 1 resumes from checkpoint 1400 of segment 0 (rows to 1799). Its first three steps log an infinite
    gradient norm, found_inf and a halving scale (GradScaler re-calibrating): healthy. Fails on 242a2e5^ (a
    critical bad_resume). Losses 1.5 above the parent's level are a bad resume, with or without them (guard)."""
    s0, s1 = np.arange(0, 1800), np.arange(1401, 2400)
    loss0, grad0 = loss_curve(2400)[:1800], grad_curve(2400)[:1800]
    loss1, grad1 = loss_curve(2400, seed=5)[1401:], grad_curve(2400, seed=6)[1401:]
    scale1, skipped1 = np.full(len(s1), 8192.0), np.zeros(len(s1), bool)
    if inf_grads:
        grad1[:3], skipped1[:3], scale1[:3] = np.inf, True, 65536.0 / 2.0 ** np.arange(3)
    if loss_jump:
        loss1[:20] += 1.5
    rows = rows_table(np.concatenate([s0, s1]), segment=np.concatenate([np.zeros(len(s0)), np.ones(len(s1))]),
                      loss=np.concatenate([loss0, loss1]), grad_norm=np.concatenate([grad0, grad1]),
                      loss_scale=np.concatenate([np.full(len(s0), 32768.0), scale1]),
                      found_inf=np.concatenate([np.zeros(len(s0), bool), skipped1]))
    report = analyze(rows, _ckpts([1000, 1400], resume=(1, 1400)))
    if loss_jump:
        [bad] = report.findings
        assert (bad.kind, bad.segment, bad.onset_step, bad.needs_action) == ("bad_resume", 1, 1401, True)
        assert report.rollback.checkpoint_step == 1000
    else:
        assert report.findings == [] and report.health == "healthy"


# 11. An activation-norm climb rejects checkpoints once it has grown the norm 1.5x, for any incident
#     (dfe7bc7 kept natural growth from walking a NaN's advice back; 1d0d17b restored a real climb for all kinds).

@pytest.mark.parametrize("start, growth, advised", [(600, 1.4, 2400), (1800, 2.0, 1700)])
def test_11_only_a_real_activation_norm_climb_walks_a_nans_rollback_back(start: int, growth: float,
                                                                         advised: int) -> None:
    """The loss and gradient norm turn NaN at step 2500; the activation norm grows from ``start`` to 2500 by
    ``growth``. A small model's natural x1.4 over 1900 steps leaves the advice at the last checkpoint, 2400: fails on
    dfe7bc7^ (walked back to 500). A x2 climb from 1800 rejects the checkpoints taken during it (1700): fails on
    1d0d17b^ (2400, after dfe7bc7 no climb rejected a NaN's checkpoints)."""
    n, rng = 2600, np.random.default_rng(0)
    steps = np.arange(n)
    loss, grad = loss_curve(n), grad_curve(n)
    act = 20.0 * np.interp(steps, [0, start, 2500, n], [1, 1, growth, growth]) * np.exp(rng.normal(0, 0.01, n))
    loss[2500:] = grad[2500:] = np.nan
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, act_norm=act),
                     _ckpts([500, 1000, 1500, 1700, 2000, 2200, 2400]))
    assert [(f.kind, f.onset_step) for f in report.findings] == [("nan", 2500)]
    rb = report.rollback
    assert rb.checkpoint_step == advised, rb.reason
    assert (rb.evidence.get("act_norm_growth_from") is None) is (growth < 1.5)


# 12. Step time varies by factors: the stall baseline is kept in log (bench/calibrate.py, 6 of 8 alarms).

@pytest.mark.parametrize("seed", range(3))
def test_12_a_wandering_hosts_long_interval_is_not_a_stall(seed: int) -> None:
    """A log every 100 steps on a host whose per-step time wanders (log AR(1), sd 0.25, correlation ~20 steps)
    has 100-step intervals up to ~1.8x their usual length now and then: a 3-4 sigma excursion of the log, but 6+
    "sigmas" of the raw interval. No stall warning; a 20-minute pause among them is one. Fails on f67e1be^
    for seeds 0 and 1 (the raw-interval baseline)."""
    k, n = 100, 3000
    interval = _wandering_intervals(0.25, seed)
    steps = (np.arange(n) + 1) * k
    report = analyze(rows_table(steps, time=np.cumsum(interval), loss=loss_curve(n), grad_norm=grad_curve(n)))
    assert _alarms(report, "stall") == []
    interval[2000] += 1200.0
    report = analyze(rows_table(steps, time=np.cumsum(interval), loss=loss_curve(n), grad_norm=grad_curve(n)))
    assert [f.onset_step for f in _alarms(report, "stall")] == [2000 * k]


# 13. A halving chain counts from the scale the scaler usually overflows at (bench/calibrate.py, 1 of 8 alarms).

def _sawtooth(peak_then_fall: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """A scale logged every 100 steps (growth interval 2000) sawing between 16384 and 32768 (halving at 32768,
    regrowing 2000 steps later) for 40,000 steps, then ``peak_then_fall`` one value per 500 steps, then
    regrowth to 16384 at one doubling per 2000 steps."""
    scale: list[float] = []
    for _ in range(10):
        scale += [16384.0] * 20 + [32768.0] * 20  # 2000 steps each side
    for value in peak_then_fall:
        scale += [value] * 5
    while scale[-1] < 16384.0:
        scale += [scale[-1]] * 20
        scale.append(scale[-1] * 2)
    scale += [16384.0] * 40
    return (np.arange(len(scale)) + 1) * 100, np.asarray(scale)


def test_13_a_regrowth_above_the_usual_ceiling_that_falls_back_is_not_a_collapse() -> None:
    """The sawtooth regrows once to 65536, one doubling above where it usually overflows, and halves four times
    without regrowing: 65536 -> 4096 is 2^4 from the peak but only 2^3 below the usual 32768: no collapse. Fails
    on dde19b2^ (a warning collapse counted from the peak). Falling 2^4 below the usual level (32768 -> 2048)
    still is one (guard)."""
    meta = {"scaler": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}}
    steps, scale = _sawtooth([65536.0, 32768.0, 16384.0, 8192.0, 4096.0])
    n = len(steps)
    report = analyze(rows_table(steps, loss=loss_curve(n), grad_norm=grad_curve(n), loss_scale=scale), meta=meta)
    assert _alarms(report, "scaler_collapse") == []
    steps, scale = _sawtooth([32768.0, 16384.0, 8192.0, 4096.0, 2048.0])
    n = len(steps)
    report = analyze(rows_table(steps, loss=loss_curve(n), grad_norm=grad_curve(n), loss_scale=scale), meta=meta)
    [collapse] = _alarms(report, "scaler_collapse")
    assert collapse.evidence["scale_min"] == 2048.0


# 14. The LR that caused an excursion is read up to its peak, not at its first row only.

@pytest.mark.parametrize("seed", range(4))
def test_14a_an_lr_jump_inside_an_excursion_opened_on_noise_is_its_onset(seed: int) -> None:
    """One noisy batch at step 1495 (12 sigma) opens an excursion; five rows later the LR jumps x10 and stays,
    and the loss lifts for good. The divergence starts at the jump (the first update under the raised LR) and
    the advice is the checkpoint saved after the noise but before the jump. Fails on the commit before this
    test (no divergence from 1500: the excursion kept its noisy first row or the climb fit's early knot, and the
    LR read there was not raised)."""
    n = 2200
    steps = np.arange(n)
    loss, grad = loss_curve(n, seed=seed), grad_curve(n, seed=seed + 10)
    lr = np.full(n, 3e-4)
    lr[1500:] = 3e-3
    loss[1495] += 0.36
    loss[1500:] += 0.6 + np.linspace(0, 1.0, n - 1500)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr), _ckpts([1000, 1400, 1497]))
    div = [f for f in report.findings if f.kind == "divergence"]
    assert [(f.onset_step, f.evidence["lr_rise_step"] if "lr_rise_step" in f.evidence else None) for f in div] \
        in ([(1501, 1500)], [(1501, None)]), report.findings
    assert report.rollback.checkpoint_step == 1497, report.rollback.reason


def test_14b_an_lr_ramp_that_reaches_x1_5_after_the_loss_moved_is_the_cause() -> None:
    """A coarse log (every 25 steps): from step 1500 the LR grows 0.6% a step (x1.16 by the next row, x1.5 two
    rows later) and the loss climbs from the first row under it, faster than the block-wise climb test can
    confirm before the log ends. A divergence from the ramp's first row, not an unrecovered spike. Fails on the
    commit before this test (the LR read at the excursion's first row only: x1.16, 'not raised')."""
    steps = np.arange(0, 2125, 25)
    n = len(steps)
    loss = 0.7 + 0.8 * np.exp(-steps / 400) + np.random.default_rng(3).normal(0, 0.05, n)
    lr = np.full(n, 1.25e-3)
    ramp = steps >= 1500
    lr[ramp] = 1.25e-3 * 1.006 ** (steps[ramp] - 1475)
    loss[ramp] += 0.4 * (np.arange(ramp.sum()) + 1) ** 1.3
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n), lr=lr), _ckpts([1000, 1250, 1450, 1475]))
    [f] = report.findings
    assert (f.kind, f.needs_action, f.onset_step) == ("divergence", True, 1500), f
    # The LR logged at 1475 is the old one, so update 1475 ran under no part of the ramp: checkpoint 1475 is clean,
    # though the loss is out at the ramp's first row (test 99).
    assert report.rollback.checkpoint_step == 1475 and "lower" in " ".join(report.rollback.actions).lower()


# 15. An LR raised off the schedule is a known change point: a small lasting lift after it is a divergence.

def _lift_after_raise(seed: int, lift: float, *, back_at: int | None = None, restart: bool = False) -> Report:
    n = 1200
    steps = np.arange(n)
    rng = np.random.default_rng(seed)
    loss = _trend(n) + rng.normal(0, 0.1, n) + np.repeat(rng.normal(0, 0.05, n // 8), 8)  # noise and wander
    lr = 3e-4 * (0.1 + 0.9 * (1 - steps / n))  # a linear decay to 10%
    lr[1000:] = 3e-4 if restart else 5 * lr[999]  # a warm restart back to the peak, or a raise x5 past it
    loss[1001:back_at] += lift  # from 1001: the loss logged at 1000 was computed before update 1000
    return analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10), lr=lr),
                   _ckpts([800, 990]))


@pytest.mark.parametrize("seed", range(4))
def test_15_a_small_lasting_lift_after_an_lr_raise_is_a_divergence(seed: int) -> None:
    """The LR is raised x5 at step 1000 (past any level it trained at) and stays; the loss sits 0.4 higher (13% of it, 4 per-step sigmas on a
    level that wanders, under the spike detector's bars while its baseline catches up). A divergence from 1001 (the raise's first
    consequence), advising checkpoint 990.
    Fails on the commit before this test for three of the four seeds (no finding: the CUSUM's baseline absorbed
    the lift before it reached its bar). The advice names the raise ("restore it"): fails before 01e1e6b (the
    change point's finding carried no LR story, so the advice only said to halve the LR)."""
    report = _lift_after_raise(seed, 0.4)
    div = [f for f in report.findings if f.kind == "divergence"]
    assert [(f.onset_step, f.needs_action) for f in div] == [(1001, True)], report.findings  # the raise's answer
    assert report.rollback.checkpoint_step == 990
    # The cause is in the advice: the raise, read from the data (x5 of the LR at step 999).
    assert div[0].evidence["lr_raised"] and div[0].evidence["lr_ratio"] == pytest.approx(5.0, rel=0.05)
    assert any(a.startswith("the learning rate rose x") and "restore it" in a for a in report.rollback.actions), \
        report.rollback.actions


@pytest.mark.parametrize("case", ["no lift", "came back", "warm restart"])
def test_15_guard_a_raise_that_moved_nothing_or_was_absorbed_or_scheduled_is_no_divergence(case: str) -> None:
    """Guards: the same raise with the loss unmoved, with the lift gone by step 1100, and a warm restart back to
    the peak LR with the same lift (the schedule's, judged as before): no divergence from the change point."""
    kwargs = {"no lift": {"lift": 0.0}, "came back": {"lift": 0.3, "back_at": 1100},
              "warm restart": {"lift": 0.3, "restart": True}}[case]
    for seed in range(4):
        report = _lift_after_raise(seed, **kwargs)
        assert not any(f.evidence.get("rule") == "lr_change_point" for f in report.findings), report.findings


def test_15_streaming_equals_offline_across_an_lr_raise() -> None:
    """Row by row, the change-point test gives the findings the offline analysis gives (it is a function of the
    rows so far; its detection step is the first row at which it would have spoken)."""
    n = 1200
    steps = np.arange(n)
    rng = np.random.default_rng(7)
    loss = _trend(n) + rng.normal(0, 0.1, n) + np.repeat(rng.normal(0, 0.05, n // 8), 8)
    lr = 3e-4 * (0.1 + 0.9 * (1 - steps / n))
    lr[1000:] = 5 * lr[999]
    loss[1001:] += 0.4  # the loss logged at step s is computed before update s: the raise's first is at 1001
    rows = rows_table(steps, loss=loss, grad_norm=grad_curve(n), lr=lr)
    live = StreamingAnalyzer(None)
    seen = []
    for row in rows.drop_columns(["main"]).to_pylist():
        live.update(row)
        if row["step"] % 50 == 49:
            seen += [f.evidence["detected_step"] for f in live.report().findings if f.kind == "divergence"]
    offline = analyze(rows).findings
    assert live.report().findings == offline
    [div] = offline
    assert div.onset_step == 1001 and seen and min(seen) >= div.evidence["detected_step"]


# 16. The CUSUM judges a rise against the level from before it (the guard): a lasting small lift is seen.

@pytest.mark.parametrize("seed", range(4))
def test_16_a_lasting_small_lift_is_not_absorbed_by_the_baseline(seed: int) -> None:
    """From step 1000 the loss sits 2.5 sigmas higher for good (no LR change: a data or hardware change). The
    level, a median of recent block medians, takes such a lift in within ~16 observations; judged against the
    level from 32 observations earlier, the CUSUM reaches its bar first: found from 1000. Fails on the commit
    before this test (no finding for any seed). A lift of 0.5 sigma stays unreported (guard). With nothing else
    moving (no observation far out, the LR and gradient norm steady) and the falling trend carrying the loss
    back under its projection (a lasting cost under ``lasting_sigmas``), it is an annotation
    (``SpikeConfig.corroborate_shifts``)."""
    n = 1600
    steps = np.arange(n)
    for lift, found in ((2.5, True), (0.5, False)):
        loss = loss_curve(n, seed=seed, noise=0.05)
        loss[1000:] += lift * 0.05
        report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10)))
        if found:
            assert [(f.kind, f.onset_step) for f in report.findings] == [("spike", 1000)], report.findings
            f = report.findings[0]
            assert f.evidence["rule"] == "cusum" and (f.severity != "info" or f.evidence["uncorroborated"]), f
        else:
            assert _alarms(report) == [], report.findings


def test_15_where_a_jump_under_the_raised_lr_is_found_the_change_point_gives_way() -> None:
    """The demo's diverged run: the LR logged x97 at step 130, the loss jumping from 131. The change point
    (onset 130) and the jump's divergence (onset 131, its LR story: restore the LR) are one incident; the
    jump's finding is kept, not the change point's, which has the earlier onset but less evidence. Fails on the
    commit before this test (merging kept the earliest onset's finding: the change point's)."""
    from runwatch.detectors.analysis import merge_overlaps

    def finding(onset: int, **evidence: object) -> Finding:
        return Finding(kind="divergence", onset_step=onset, end_step=344, peak_step=200, segment=0,
                       severity="critical", self_recovered=False, needs_action=True, evidence=evidence,
                       message=f"divergence from {onset}")

    point = finding(130, rule="lr_change_point", lr_rise_step=130)
    jump = finding(131, rule="shewhart", from_spike=True, lr_before=0.00247, lr_at_onset=0.241)
    assert merge_overlaps([point, jump]) == [jump]
    assert merge_overlaps([point]) == [point]  # alone, it is the finding


# 17. A slowdown's median is judged against the variability of a median over as long a stretch.

@pytest.mark.parametrize("seed", range(4))
def test_17_a_long_moderate_slowdown_on_a_noisy_host_is_not_taken_for_its_wander(seed: int) -> None:
    """A host whose step time wanders ~20% for tens of steps (an AR(1) wander, as in test 4 of
    test_failure_classes) runs 1.8x slower for 1000 steps. One observation of that is within 4 of the host's
    sigmas (the bar for one observation), but the wander averages down over 1000 steps, many times its
    correlation time: a slowdown. Fails on the commit before this test (no finding on any seed). Guard: the
    same host without it pages nothing."""
    from runwatch.detectors.slowdown import detect_slowdowns
    from tests.detectors.test_failure_classes import _noisy_host

    n = 20_000
    st = _noisy_host(n, np.random.default_rng(seed))
    assert [f for f in detect_slowdowns(np.arange(n), st) if f.severity != "info"] == []
    st[12_000:13_000] *= 1.8
    found = [f for f in detect_slowdowns(np.arange(n), st) if f.severity != "info"]
    assert found and abs(found[0].onset_step - 12_000) <= 50, found
    assert all(11_950 <= f.onset_step and f.end_step <= 13_050 for f in found), found  # nothing outside it


# 18. A blip's message says what was seen: one step, or one far-out observation among several out of band.

def test_18_a_blip_that_spans_several_observations_is_not_called_one_step() -> None:
    """One observation 10 sigmas out, then three at 4 (under the trigger, and their clipped sum under the
    CUSUM's bar): an 'info' blip, but not a "one-step" spike, which the message called it before this test
    (beside "back to its trend after 4 steps"). A lone 10-sigma observation is still one step (guard)."""
    n = 1600
    steps = np.arange(n)
    for tail, words in ((4.0, "loss spike, one observation far out"), (0.0, "one-step loss spike")):
        loss = loss_curve(n, seed=3, noise=0.05)
        loss[1000] += 10 * 0.05
        loss[1001:1004] += tail * 0.05
        [f] = [f for f in analyze(rows_table(steps, loss=loss)).findings if f.kind == "spike"]
        assert f.severity == "info" and f.onset_step == 1000 and f.message.startswith(f"{words} (a bad batch?)"), f


# 19. A loss that rises some rows after the schedule's warm restart and comes back is the schedule.

def _sgdr(peak: float, t: np.ndarray, period: int) -> np.ndarray:
    """Cosine annealing with warm restarts (SGDR, PyTorch's CosineAnnealingWarmRestarts) from ``peak`` down to
    eta_min = 0.05 ``peak`` over each ``period``, then straight back up: the fresh sets' ``cosine_restarts``."""
    return peak * (0.05 + 0.475 * (1 + np.cos(np.pi * (t % period) / period)))

def _after_restart(lr_case: str, shape: str, seed: int) -> Report:
    """Cosine with warm restarts (every 500 steps after a 100-step warm-up, back to the peak LR); 12 steps after
    the restart at 1100 the loss rises (a jump of 12 sigmas that decays, or a climb over 120 steps and back) and
    returns, as the fresh sets' clean twins do after their restarts. ``lr_case`` replaces that restart: 'burst' (x10
    for five steps, then back down), 'above' (3x past the peak the run trained at) or 'none' (the decay goes on)."""
    n, peak = 1600, 3e-3
    steps = np.arange(n)
    lr = np.where(steps < 100, peak * (steps + 1) / 100, _sgdr(peak, steps - 100, 500))
    if lr_case in ("burst", "none"):
        lr[1100:] = lr[1099] * np.linspace(1, 0.95, n - 1100)
    if lr_case == "burst":
        lr[1100:1105] *= 10
    elif lr_case == "above":
        lr[1100:] *= 3
    loss = loss_curve(n, seed=seed, noise=0.05)
    t = np.arange(n - 1112)
    loss[1112:] += 0.6 * np.exp(-t / 40) if shape == "jump" else 1.5 * np.interp(t, [0, 120, 240, n], [0, 1, 0, 0])
    return analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10), lr=lr))


@pytest.mark.parametrize("shape", ["jump", "climb"])
@pytest.mark.parametrize("seed", range(3))
def test_19_a_rise_some_rows_after_a_warm_restart_that_comes_back_is_the_schedule(shape: str, seed: int) -> None:
    """No alarm: an 'info' finding that names the restart. Fails on b895212 (five of the six a warning: the LR
    story read the restart as the cause only when it fell on the onset's own row; the loss answers a raised LR
    over tens of updates; on fresh seed 446183 both false alarms of its first 60 runs were this)."""
    report = _after_restart("restart", shape, seed)
    [f] = [f for f in report.findings if f.kind in ("spike", "divergence")]
    assert f.severity == "info" and f.evidence["lr_scheduled"], f
    assert f.evidence["lr_restart_step"] == 1100 or f.evidence["lr_raised"], f


@pytest.mark.parametrize("lr_case", ["burst", "above", "none"])
@pytest.mark.parametrize("shape", ["jump", "climb"])
def test_19_guard_the_same_rise_after_a_burst_a_raise_past_the_peak_or_no_raise_still_alarms(lr_case: str,
                                                                                              shape: str) -> None:
    """Guards: a burst that steps back down, a raise past any LR the run trained at, or no LR change at all:
    the same rise is an alarm, as before."""
    for seed in range(3):
        report = _after_restart(lr_case, shape, seed)
        assert _alarms(report) and not any(f.evidence.get("lr_restart_step") for f in report.findings), report.findings


# 20. An LR ramp late in a run is found from its first row: not hidden by the warm-up, not read as restarts.

@pytest.mark.parametrize("num_rows", [100, 400])
@pytest.mark.parametrize("seed", range(3))
def test_20_an_lr_ramp_from_a_decayed_lr_is_the_onset_on_a_coarse_log(num_rows: int, seed: int) -> None:
    """Logged every 25 steps: warm-up, cosine decay to ~0.1 of the peak, then from 15 rows before the end the LR
    grows x1.6 a row (a faulty multiplier) and the loss jumps and climbs once the LR passes 3x the peak. The
    divergence begins where the LR began rising, and the advice precedes it. Fails on b895212 both ways: with 100
    rows the 128-row LR lookback reaches the warm-up, whose first row is the lowest LR, so the rise was the
    warm-up's; with 400 rows the ramp's first rows pass through levels the run trained at and each was read as
    a warm restart (onset at the loss's jump, 6 and 4 rows late: fresh seed 446183's run 027 got this)."""
    every, peak, n = 25, 3e-3, num_rows
    steps = np.arange(n) * every
    ramp = n - 15
    lr = np.where(steps < 320, peak * (steps + every) / 345,
                  peak * (0.1 + 0.45 * (1 + np.cos(np.pi * steps / steps[-1]))))
    lr[ramp:] = lr[ramp - 1] * 1.6 ** np.arange(1, n - ramp + 1)
    loss = loss_curve(n, seed=seed, noise=0.05)
    hot = int(np.argmax(lr > 3 * peak))
    loss[hot:] += 2.0 + 0.5 * np.arange(n - hot)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10), lr=lr),
                     _ckpts([int(s) for s in steps if s and s % 100 == 0]))
    [div] = [f for f in report.findings if f.kind == "divergence"]
    assert div.onset_step == steps[ramp] and div.needs_action, report.findings
    assert report.rollback.checkpoint_step == steps[ramp] - 25  # at the last row of the old LR (test 99)
    assert f"the learning rate began rising at {steps[ramp]}" in div.message


# 21. A bad batch of a few steps under every single-observation bar is caught by the bank's burst CUSUM.

@pytest.mark.parametrize("seed", range(6))
def test_21_a_five_step_bad_batch_under_the_single_observation_bar_is_an_alarm(seed: int) -> None:
    """Five observations 6 per-step sigmas up (about 4 of the detector's robust sigmas each, under the 6-sigma
    trigger; their clipped sum above k = 0.5 ~17, under the CUSUM's 24): found from the first of them. Fails on
    01534a4 for four of the six (three unseen, one an 'info' blip; seeds 195624 and 446183 missed such
    batches). Where no observation passes the single-observation bar and nothing else moved (the LR and the
    gradient norm steady), the burst CUSUM's finding is an annotation (``SpikeConfig.corroborate_shifts``);
    where one does, a warning. Guard: the same run without the batch raises nothing."""
    n = 1600
    steps = np.arange(n)
    loss = loss_curve(n, seed=seed, noise=0.05)
    assert analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10))).findings == []
    loss[1000:1005] += 6 * 0.05
    spikes = [f for f in analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10))).findings
              if f.kind == "spike"]
    assert [(f.onset_step, f.self_recovered) for f in spikes] == [(1000, True)], spikes
    f = spikes[0]
    assert (f.severity, f.evidence["rule"]) == ("warning", "shewhart") or (
        (f.severity, f.evidence["rule"], f.evidence["uncorroborated"]) == ("info", "burst", True)), f


# 22. A level the run trained at is one it held: a burst's LR does not make a later jump "the schedule".

@pytest.mark.parametrize("seed", range(3))
def test_22_a_jump_to_under_an_earlier_bursts_lr_is_a_divergence_not_the_schedule(seed: int) -> None:
    """Constant LR; a x100 burst for three steps at 500 (a spike that recovers), then from 1200 the LR x15 for
    good and the loss up for good. The jump is a divergence from 1200 (the LR is the cause: advice before it,
    at checkpoint 1100). Fails on 9d44737: the burst's LR counted as a level the run had trained at, so the
    jump was a warm restart, "(the schedule)", and the advice the checkpoint at 1200, which holds the first
    update under the raised LR (fresh seed 781099's run 146 read so)."""
    n, lr0 = 1600, 3e-4
    steps = np.arange(n)
    lr = np.where(steps < 100, lr0 * (steps + 1) / 100, lr0)
    lr[500:503] *= 100
    lr[1200:] *= 15
    loss = loss_curve(n, seed=seed, noise=0.05)
    loss[500:560] += 3 * np.exp(-np.arange(60) / 15)
    loss[1203:] += 0.8
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10), lr=lr),
                     _ckpts(list(range(100, n, 100))))
    assert [(f.kind, f.onset_step) for f in _alarms(report)] == [("spike", 500), ("divergence", 1201)], report.findings
    assert report.rollback.checkpoint_step == 1100 and not report.findings[-1].evidence.get("lr_scheduled")


# 23. A norm's "growth" must stand out of its own block-to-block wander to move a divergence's onset.

def test_23_a_wandering_grad_norm_does_not_pull_an_lr_divergence_early() -> None:
    """The gradient norm wanders (an AR(1) of its 16-step block levels, phi 0.9: stretches of x1.5 up and down,
    as on a batch-of-3 log) and the LR jumps x8 at 1500 for good, the loss up with it. Over 40 draws the
    divergence begins at 1500 and the advice is checkpoint 1400. Fails on 7c71f6b for two of the 40 (a wander
    read as the norm's growth: onsets 1417 and 1370; fresh seed 781099's run 080 had its onset 190 steps early)."""
    n, lr0 = 2000, 3e-4
    steps = np.arange(n)
    lr = np.where(steps < 100, lr0 * (steps + 1) / 100, lr0 * (1 - 0.8 * steps / n))
    lr[1500:] *= 8
    events = _ckpts(list(range(100, n, 100)))
    got = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        level = np.zeros(n // 16 + 1)
        for i in range(1, len(level)):
            level[i] = 0.9 * level[i - 1] + rng.normal(0, 0.15)
        grad = 8 * np.exp(np.repeat(level, 16)[:n] + rng.normal(0, 0.3, n))
        loss = loss_curve(n, seed=seed, noise=0.05)
        loss[1503:] += 0.6
        report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr), events)
        got.append(([f.onset_step for f in report.findings if f.kind == "divergence"], report.rollback.checkpoint_step))
    assert got == [([1501], 1400)] * 40, [(seed, g) for seed, g in enumerate(got) if g != ([1501], 1400)]


# 24. An LR raise some rows before the loss answers it is the cause, and a schedule's decay of it keeps it raised.

@pytest.mark.parametrize("lag", [0, 12, 25])
def test_24_an_lr_jump_the_loss_answers_rows_later_is_a_divergence_from_the_jump(lag: int) -> None:
    """Step schedule (x0.1 at 200 and at 430), and from 235 the LR x22 for good; the loss jumps ``lag`` rows
    after 236 (the first row update 235 can show) and stays up. A divergence from 236 whose advice restores the LR. Fails on ef2a51e (a critical spike
    from the loss's jump: the LR story read the LR of the rows just before that jump, already raised, and
    called the x22 "not still raised" once the schedule's x0.1 brought it to 2.2x the LR before; fresh seed
    946133's run 111, looked at after that seed was scored)."""
    n, peak = 720, 9e-3
    steps = np.arange(n)
    lr = np.where(steps < 150, peak * (steps + 1) / 150, peak)
    lr[200:] *= 0.1
    lr[235:] *= 22
    lr[430:] *= 0.1
    for seed in range(3):
        loss = loss_curve(n, seed=seed, noise=0.05)
        loss[236 + lag:] += 3.0 * np.exp(-np.arange(n - 236 - lag) / 30) + 1.0
        report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10), lr=lr),
                         _ckpts(list(range(73, n, 73))))
        assert [(f.kind, f.onset_step) for f in _alarms(report)] == [("divergence", 236)], report.findings
        assert report.rollback.checkpoint_step == 219
        assert any("restore it" in a for a in report.rollback.actions), report.rollback.actions


# 25. A shift only the CUSUM bank sees, with nothing else moving, is noted, not paged.

@pytest.mark.parametrize("run", ["f247925-005", "f781099-144"])
def test_25_a_fault_free_runs_own_rebound_is_an_annotation_not_an_alarm(run: str) -> None:
    """Real fault-free CPU training (the fresh set's twins, ``tests/fixtures/fresh``): after a fast fall the loss
    rebounds ~3 of its sigmas for tens of steps and comes back, the LR and the gradient norm steady. The CUSUM
    sees a shift; with no observation past the single-observation bar and no second signal it is an 'info'
    annotation. Fails on 7a8f328 (a warning each: 11 of the 14 spike alarms outside every label on the
    looked-at fresh seeds were of this kind). The same rebound answering an LR raised just before it is an
    alarm: the LR is the second signal."""
    steps, cols = _fresh_run(f"{run}-twin")
    spikes = [f for f in analyze(rows_table(steps, **cols)).findings if f.kind == "spike"]
    assert spikes and all(f.severity == "info" and f.evidence["uncorroborated"] for f in spikes), spikes
    first = spikes[0]
    lr = cols["lr"].copy()
    at = int(np.searchsorted(steps, first.onset_step))
    lr[at - 4:at - 1] *= 4  # three updates at 4x the LR, ending two steps before the rebound
    raised = [f for f in analyze(rows_table(steps, **{**cols, "lr": lr})).findings
              if f.kind == "spike" and f.onset_step == first.onset_step]
    assert raised and raised[0].severity in ("warning", "critical") and not raised[0].evidence["uncorroborated"], raised


def _fresh_run(name: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Steps and columns of a run of the fresh set kept in ``tests/fixtures/fresh``."""
    with gzip.open(FIXTURES / "fresh" / f"{name}.csv.gz", "rt") as fh:
        rows = list(csv.DictReader(fh))
    steps = np.array([int(float(r["step"])) for r in rows])
    return steps, {k: np.array([r[k] == "True" for r in rows]) if k == "found_inf" else
                   np.array([float(r[k]) for r in rows]) for k in rows[0] if k != "step"}


def _fresh_report(name: str) -> Report:
    """``analyze`` of a fresh run kept in ``tests/fixtures/fresh`` with its checkpoints (``<name>-checkpoints.json``)."""
    return _fresh_report_of(name, *_fresh_run(name))


def _fresh_events(file: str) -> pa.Table:
    """The events kept beside a fresh run in ``tests/fixtures/fresh`` (``<name>-checkpoints.json`` or ``-events.json``)
    as a table."""
    return events_table(json.loads((FIXTURES / "fresh" / file).read_text()))


def _fresh_report_of(name: str, steps: np.ndarray, cols: dict[str, np.ndarray]) -> Report:
    """``analyze`` of ``steps``/``cols`` (a fresh run's, perhaps changed) with the checkpoints of run ``name``."""
    return analyze(rows_table(steps, **cols), _fresh_events(f"{name}-checkpoints.json"))


def _lr_story_of(steps: np.ndarray, lr: np.ndarray, onset: int, end: int, peak: int) -> dict:
    """The spike's LR story (``spike._lr_story``, shipped config) of an excursion at these steps of a segment's rows."""
    at, last, top = (int(np.searchsorted(steps, s)) for s in (onset, end, peak))
    return _lr_story(steps, lr, at, last, 0, DEFAULT.spike.patience_obs, DEFAULT.lr, peak=top)


def _streams_alike(name: str | None, steps: np.ndarray, cols: dict[str, np.ndarray], report: Report) -> None:
    """The same rows fed one at a time to ``StreamingAnalyzer`` (with run ``name``'s checkpoints, none for None) read
    ``report``."""
    events = None if name is None else _fresh_events(f"{name}-checkpoints.json")
    _table_streams_alike(rows_table(steps, **cols), events, report.findings)


def _table_streams_alike(rows: pa.Table, events: pa.Table | None, findings: list[Finding]) -> None:
    """``rows`` fed one at a time to ``StreamingAnalyzer`` (as a monitor writes them: without the store's ``main``
    column) with ``events`` read ``findings``."""
    live = StreamingAnalyzer(events)
    for row in (rows.drop_columns(["main"]) if "main" in rows.column_names else rows).to_pylist():
        live.update(row)
    assert live.report().findings == findings


# 26. The schedule's warm restart inside an excursion is not the LR jump that caused it.

def test_26_a_warm_restart_before_the_burst_is_not_the_divergences_onset() -> None:
    """Real CPU training (fresh seed 247925's run 27, ``tests/fixtures/fresh``): cosine with warm restarts; the
    restart at 396 takes the LR x20 back to the warm-up's peak, an injected burst x245 at 405-408 blows the loss
    up from 406 for good. The loss's hinge onset lands at 384 (batch 6), and the first LR row past 1.5x the LR
    before it is the restart's: the onset went to 396 and the advice to checkpoint 320. The restart is the
    schedule; the jump from its level is the cause, and the onset its first consequence: 406, advice checkpoint
    400 (the last before 405, the last logged step before the onset). Fails on 7a8f328 (onset 396, checkpoint
    320). The burst is over by 409 and the loss jumped and stayed up: an unrecovered spike (DETECTION.md section
    5), as the fresh set's labeller calls it, not a divergence (test 40)."""
    report = _fresh_report("f247925-027")
    [exc] = [f for f in report.findings if f.kind in ("spike", "divergence")]
    assert (exc.kind, exc.onset_step, exc.self_recovered) == ("spike", 406, False), exc
    assert report.rollback is not None and report.rollback.checkpoint_step == 400, report.rollback


# 27. An LR jump is the cause; its first consequence is the onset: the checkpoint just before the jump is healthy.

@pytest.mark.parametrize("seed", range(3))
def test_27_the_checkpoint_at_the_step_before_an_lr_jump_is_the_advice(seed: int) -> None:
    """The LR x8 from update 1000 for good, the loss up from 1001 (the first loss update 1000 can make), a
    checkpoint at 999 (the state after update 999: every update in it under the old LR). The onset is 1001 and
    the advice checkpoint 999. Fails on 7a8f328: the onset was the LR row (1000), so only checkpoints before 999
    counted (advice 900; fresh seed 247925's run 77: an LR jump at 397 and checkpoint 396, advised 360)."""
    n = 1400
    steps = np.arange(n)
    lr = _warmup_lr(steps, 200)
    lr[1000:] *= 8
    loss = loss_curve(n, seed=seed, noise=0.05)
    loss[1001:] += 1.0 + 0.002 * np.arange(n - 1001)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10), lr=lr),
                     _ckpts([800, 900, 999]))
    div = [f for f in _alarms(report) if f.kind == "divergence"]
    assert [f.onset_step for f in div] == [1001], report.findings
    assert report.rollback.checkpoint_step == 999, report.rollback.reason


# 28. An activation-norm climb that answers the schedule's warm restart is no precursor.

def test_28_a_norm_climb_after_a_warm_restart_does_not_walk_the_rollback_back() -> None:
    """Cosine with warm restarts every 300 steps (back to the peak LR); from the restart at 1000 the activation
    norm grows 1.8x over the next 100 steps, as a small model's does when the LR comes back up (fresh seed
    247925's run 77, its twin alike). Then the LR x40 at 1100 (past any level it trained at) and the loss up
    from 1101. The advice is the checkpoint before the jump (1090), not one before the climb (950). Fails on
    7a8f328 (advice 950: the climb read as OPT's precursor). Guard: the same climb under a smoothly decaying LR
    (no restart) still walks the advice back before it."""
    n, peak = 1400, 3e-3
    steps = np.arange(n)
    for restart, want in ((True, 1090), (False, 950)):
        lr = np.where(steps < 100, peak * (steps + 1) / 100, _sgdr(peak, steps - 100, 300))
        if not restart:
            lr[1000:] = lr[999] * np.linspace(1, 0.9, n - 1000)
        lr[1100:] *= 40
        act = 10.0 * np.interp(steps, [0, 1000, 1100, n], [1.0, 1.0, 1.8, 2.5])
        act *= np.exp(np.random.default_rng(5).normal(0, 0.02, n))
        loss = loss_curve(n, seed=2, noise=0.05)
        loss[1101:] += 1.5 + 0.003 * np.arange(n - 1101)
        report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=12), act_norm=act, lr=lr),
                         _ckpts([950, 1050, 1090]))
        assert report.rollback is not None and report.rollback.checkpoint_step == want, (restart, report.rollback.reason)


# 29. Stalls in consecutive logged intervals are one slow spell, not a string of pauses.

def test_29_a_slow_spell_on_a_short_coarse_log_is_one_slowdown_not_a_string_of_stalls() -> None:
    """Real CPU training (fresh seed 880457's run 111, ``tests/fixtures/fresh``): a noisy host logged every 10
    steps (93 rows), 2.8x slower over steps 410-580. Every slow interval passes the stall rule, while the slowdown
    rule sees the spell only from 470 (few rows: its correlation time is uncertain, so the spread it allows is one
    observation's; at ``min_sigmas`` 4, not at all): one slowdown from 410, a warning, and no stall. Fails on
    93d46ff (15 stalls, 14 of them warnings, and no slowdown); at ``min_sigmas`` 3.5 before ``join_spells``, two
    slowdowns, a stall spell at 410-460 and the slowdown rule's from 470. Guard: one long pause between two rows
    stays one stall."""
    steps, cols = _fresh_run("f880457-111")
    report = analyze(rows_table(steps, **cols))
    slow = [f for f in report.findings if f.kind == "slowdown"]
    assert [(f.severity, f.onset_step) for f in slow] == [("warning", 410)], slow
    assert slow[0].evidence.get("joined_stall_spell_from", 410) == 410, slow
    assert 1.5 <= slow[0].evidence["rise"] <= 2.2 and not [f for f in report.findings if f.kind == "stall"]
    mid = steps <= 540  # read while the spell goes on: still slow, not "back to normal"
    [live] = [f for f in analyze(rows_table(steps[mid], **{k: v[mid] for k, v in cols.items()})).findings
              if f.kind == "slowdown"]
    assert live.self_recovered is None and live.message.endswith("still slow at the last step"), live
    before = steps <= 400  # the run before the spell, with a 10-minute pause between rows 290 and 300
    paused = {k: v[before] for k, v in cols.items()}
    paused["time"] = np.where(steps[before] >= 300, paused["time"] + 600.0, paused["time"])
    found = analyze(rows_table(steps[before], **paused)).findings
    assert [(f.kind, f.onset_step) for f in found if f.kind in ("stall", "slowdown")] == [("stall", 290)], found


# 30. A shift only the CUSUM bank sees stays an annotation while still out (c71fbe3).

def test_30_a_quiet_shift_still_out_when_the_data_ends_is_an_annotation_not_critical() -> None:
    """The loss lifts 3.5 sigmas for the last 60 observations with the LR flat and the gradient norm quiet: the
    CUSUM sees it, nothing backs it, and it has not come back when the data ends. Such wanders come back after
    tens to hundreds of observations (seed 577916's runs 087 and 101 ended inside two that their fault-free twins
    made alike), so it is noted, open, not paged and not a reason to roll back. Fails on c71fbe3^ (critical after
    16 observations out, rollback advised). Guard: the same lift after four updates at 4x the LR is critical."""
    n, sigma = 3000, 0.05
    steps = np.arange(n)
    loss = _trend(n) + np.random.default_rng(3).normal(0, sigma, n)
    loss[-60:] += 3.5 * sigma
    assert (loss[-60:] - _trend(n)[-60:]).max() < 6 * sigma  # no single observation past the Shewhart bar
    ckpts = _ckpts([1000, 2000, 2900])
    lr = np.full(n, 3e-4)
    quiet = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n), lr=lr), ckpts)
    [shift] = [f for f in quiet.findings if f.kind == "spike" and f.onset_step >= n - 80]
    assert (shift.severity, shift.evidence["uncorroborated"], shift.self_recovered, shift.needs_action) == \
        ("info", True, False, False), shift
    assert "noted, not paged" in shift.message and quiet.rollback is None and _alarms(quiet) == []
    lr[n - 64:n - 60] *= 4  # the cause, logged: four updates at 4x the LR just before the lift
    raised = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n), lr=lr), ckpts)
    [paged] = [f for f in raised.findings if f.kind == "spike" and f.onset_step >= n - 80]
    assert (paged.severity, paged.evidence["uncorroborated"]) == ("critical", False), paged
    assert raised.rollback is not None and raised.rollback.checkpoint_step == 2900, raised.rollback


# 31. A blip that came straight back is over: the next one is an incident of its own.

@pytest.mark.parametrize("seed", range(4))
def test_31_two_bad_batches_close_together_are_two_spikes_but_a_slow_recovery_stays_one(seed: int) -> None:
    """Two one-observation bad batches (20 sigmas) 23 observations apart, the loss in its band between them:
    two annotations, each at its own step. Joining them (the second came within ``patience_obs`` of the first's
    recovery) made one episode 'the noise grew' from the first to past the second (seed 667186's run 047, a log
    every 5 steps: one finding for two labels). Fails on 99b96f7. Guard: an excursion that lasted (six
    observations at 12 sigmas) and goes out again as soon is still one incident, the tail of a slow recovery;
    and streaming gives the same findings."""
    n, sigma = 3000, 0.05
    steps = np.arange(n)
    loss = _trend(n) + np.random.default_rng(seed).normal(0, sigma, n)
    blips = loss.copy()
    blips[[2511, 2534]] += 20 * sigma
    report = analyze(rows_table(steps, loss=blips, grad_norm=grad_curve(n)))
    spikes = [(f.onset_step, f.end_step, f.severity) for f in report.findings if f.kind == "spike"]
    assert spikes == [(2511, 2511, "info"), (2534, 2534, "info")], spikes
    _table_streams_alike(rows_table(steps, loss=blips, grad_norm=grad_curve(n)), None, report.findings)
    slow = loss.copy()
    slow[2500:2506] += 12 * sigma
    slow[2518:2521] += 12 * sigma
    joined = [f for f in analyze(rows_table(steps, loss=slow, grad_norm=grad_curve(n))).findings if f.kind == "spike"]
    assert [(f.onset_step, f.end_step >= 2520) for f in joined] == [(2500, True)], joined


# 32. The level before an LR raise is read over the span after it, not over 1,600 steps of a falling loss.

@pytest.mark.parametrize("seed", range(5))
def test_32_a_lift_soon_after_an_lr_raise_on_a_still_falling_coarse_log_is_a_divergence(seed: int) -> None:
    """A log every 25 steps, the loss still falling (0.17 over the last 64 rows), the LR raised 5x at row 300
    and the loss 4 noise sigmas up since, 16 rows on when the data ends: a divergence from the raise. The
    change-point test compared the 16 rows after against the median of the 64 before, which a falling loss puts
    half its fall above the level the rise came from (seed 746292's run 120, a log every 25 steps: the median
    before was 1.17 where the loss had fallen to 0.87). Fails on 99b96f7 for seeds 0, 1, 3 and 4. Guard: the
    same raise that moved nothing, and the same lift with no raise, are no divergence."""
    n = 316
    rows = np.arange(n)
    loss = 2 + 3 * np.exp(-rows / 120) + np.random.default_rng(seed).normal(0, 0.05, n)
    lr = np.full(n, 3e-4)
    lr[300:] *= 5
    lifted = loss.copy()
    lifted[300:] += 0.2
    found = analyze(rows_table(25 * rows, loss=lifted, grad_norm=grad_curve(n), lr=lr)).findings
    assert [(f.kind, f.onset_step, f.needs_action) for f in found] == [("divergence", 7500, True)], found
    for what in (dict(loss=loss, lr=lr), dict(loss=lifted, lr=np.full(n, 3e-4))):
        quiet = analyze(rows_table(25 * rows, grad_norm=grad_curve(n), **what))
        assert [f for f in quiet.findings if f.kind == "divergence"] == [], quiet.findings


# 33. The opening warm-up's rise is the schedule's, also where a coarse log's lag window reaches back into it.

@pytest.mark.parametrize("seed", range(4))
def test_33_an_excursion_soon_after_the_warm_up_of_a_coarse_log_is_not_read_against_its_first_lr(seed: int) -> None:
    """A log every 10 steps, the LR warmed up over the first 5 rows and flat since; the loss and gradient norm up
    for three rows at row 19. The LR's last one-row step up within the 32-row lag is the warm-up's second row,
    and the excursion was read against the LR before it (the warm-up's first, 50x lower): a divergence "after
    the LR rose x50", advice to restore the LR to 0.0001 (seed 899445's run 062, no fault in it). Fails on
    ce76e93. Guard: a real 5x raise at row 15, after the warm-up, is still the cause of a divergence."""
    n = 80
    steps = 10 * np.arange(n)
    loss = 3.0 + np.random.default_rng(seed).normal(0, 0.05, n)
    grad = grad_curve(n)
    loss[19:22] *= 1.8
    grad[19:22] *= 3
    lr = np.minimum(1e-4 + (5e-3 - 1e-4) * steps / 50, 5e-3)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr))
    assert [(f.kind, f.onset_step, f.evidence["lr_raised"]) for f in report.findings] == [("spike", 190, False)]
    assert report.rollback is None
    lr[15:] *= 5
    raised = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr))
    assert [(f.kind, f.severity, f.evidence["lr_ratio"]) for f in raised.findings] == \
        [("divergence", "critical", pytest.approx(5.0))], raised.findings


# 34. A new incident inside an excursion that had come back is its own finding, not more of the first.

def _burst_then_bad_batch(seed: int, grad_held: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An excursion of 12 sigmas for 40 observations from 2000, then a ragged tail back at the trend (every
    fifth observation 5 sigmas up, so never ``recovery_obs`` in band in a row) and a bad batch of three
    observations at 40 sigmas at 2106."""
    n, sigma = 3000, 0.05
    steps = np.arange(n)
    loss = _trend(n) + np.random.default_rng(seed).normal(0, sigma, n)
    grad = grad_curve(n, seed=seed + 20)
    loss[2000:2040] += 12 * sigma
    grad[2000:2040] *= 3
    loss[2040:2106:3] += 6 * sigma
    if grad_held:
        grad[2040:2106] *= 3
    loss[2106:2109] += 40 * sigma
    grad[2106:2109] *= 3
    return steps, loss, grad


@pytest.mark.parametrize("seed", range(4))
def test_34_a_bad_batch_in_the_ragged_tail_of_an_excursion_is_a_spike_of_its_own(seed: int) -> None:
    """The tail of a long excursion never completes ``recovery_obs`` in band in a row, but its loss and gradient
    norm are back (their median in the band); then a bad batch at 40 sigmas. It was read as more of the first
    excursion, whose onset lies 100 steps before it, so the bad batch had no finding at its own step (seed
    975218's run 136: an LR burst from 647, a bad batch at 760; seed 843625's run 111). Fails on fc368b8. Now:
    two spikes, the second at the bad batch, and streaming agrees. Guard: with the gradient norm still up
    through the tail, the first incident is going on, and it stays one excursion; since test 68 the bad batch
    inside it is a second incident nested in it (its span, not a new excursion that ends the first)."""
    steps, loss, grad = _burst_then_bad_batch(seed, grad_held=False)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad))
    spikes = [(f.onset_step, f.severity) for f in report.findings if f.kind == "spike"]
    assert spikes == [(2000, "warning"), (2106, "warning")], spikes
    _table_streams_alike(rows_table(steps, loss=loss, grad_norm=grad), None, report.findings)
    steps, loss, grad = _burst_then_bad_batch(seed, grad_held=True)
    held = [f for f in analyze(rows_table(steps, loss=loss, grad_norm=grad)).findings if f.kind == "spike"]
    assert [(f.onset_step, f.end_step >= 2108, f.evidence["rule"]) for f in held] == [
        (2000, True, "shewhart"), (2106, True, "nested")], held
    assert held[1].end_step == held[0].end_step


# 35. A step back up from a decayed LR held flat is a raise, not the schedule's warm restart.

@pytest.mark.parametrize("seed", range(3))
def test_35_a_jump_back_up_from_a_step_schedules_held_lr_is_a_cause_not_a_restart(seed: int) -> None:
    """A step schedule (x0.1 at 1200, held), then at 1300 the LR x7.9, back to 0.79 of the peak the run trained
    at, and the loss lifted for good. A warm restart ends a decay (SGDR anneals the LR down, then restarts); a
    step up from a level held flat for ``lag_rows`` rows is a change. It was read as a restart, so the lift was
    an 'info' "(the schedule)" and no advice was given (seed 260854's run 141). Fails on 71736cd. Guard: the
    same jump at the end of an SGDR decay is the schedule (test 19)."""
    n, peak = 1600, 3e-3
    steps = np.arange(n)
    lr = np.where(steps < 100, peak * (steps + 1) / 100, peak)
    lr[1200:] *= 0.1
    lr[1300:] *= 7.9
    loss = loss_curve(n, seed=seed, noise=0.05)
    loss[1301:] += 0.5 * (1 - np.exp(-np.arange(n - 1301) / 10))
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10), lr=lr),
                     _ckpts(list(range(100, n, 100))))
    [f] = _alarms(report)
    assert f.kind == "divergence" and f.needs_action and not f.evidence.get("lr_scheduled"), f
    assert 1300 <= f.onset_step <= 1302, f
    assert report.rollback is not None and report.rollback.checkpoint_step == 1200, report.rollback


# 36. A lift after a short LR burst is a spike at a known change point, though no bar of the scan reaches it.

def _burst_lift(seed: int, burst: bool, lift: float = 3.0) -> Report:
    """Logged every 5 steps, a constant LR after a warm-up; with ``burst`` the LR logged at step 5000 is x40 (a burst
    between rows, back by the next). The loss is lifted by ``lift`` of its noise sigmas for 6 rows from that row,
    then comes back: under the single-observation bar and too short for either CUSUM of the bank."""
    n, peak, noise = 1600, 3e-3, 0.05
    steps = np.arange(n) * 5
    lr = np.where(steps < 500, peak * (steps + 5) / 500, peak)
    if burst:
        lr[1000] *= 40
    loss = loss_curve(n, seed=seed, noise=noise)
    loss[1000:1006] += lift * noise
    return analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=seed + 10), lr=lr),
                   _ckpts(list(range(500, 8000, 500))))


def test_36_a_lift_after_a_short_lr_burst_is_a_spike_at_a_known_change_point() -> None:
    """The LR column names the change point, so two medians (after the burst against before it, in standard errors
    of the block medians' spread) see a lift that the scan's bars do not: fresh seeds 368521, 866182 and
    709008 missed 11 of 49 LR-burst labels, nothing found at all (709008's run 052, logged every 2 steps: x38 for
    two steps, the loss up for 6 rows). A 3-sigma lift of 6 rows is at the edge of a 4-standard-error test, so
    this asks for power over 12 noise draws: at least 9 found (10 now; 83de108 found 2, by the CUSUM bank, and
    fails). Each is a warning from the burst's row, back, with no advice. Guards: the same lift with no burst is
    never an alarm (a healthy run has no burst to test, so the false-alarm budget is untouched), and neither is a
    burst that moved nothing."""
    found = 0
    for seed in range(12):
        report = _burst_lift(seed, burst=True)
        alarms = _alarms(report)
        assert len(alarms) <= 1 and report.rollback is None, alarms
        for f in alarms:
            assert f.kind == "spike" and f.onset_step == 5000 and not f.needs_action, f
            if f.evidence.get("rule") == "lr_burst_change_point":
                assert f.evidence["lr_rise_step"] == 5000 and f.evidence["lr_back_step"] == 5005, f
                assert f.severity == "warning" and f.self_recovered, f
        found += len(alarms)
        assert not _alarms(_burst_lift(seed, burst=False))
        assert not _alarms(_burst_lift(seed, burst=True, lift=0.0))
    assert found >= 9, found


# 37. A slow LR ramp that reaches the raise factor only as the norms climb is still the cause.

def _lr_ramp_climb(seed: int, n: int = 2000, start: int = 1500) -> Report:
    """A constant LR of 1e-3 for 1500 steps, then x1.004 per step (x7.4 by the last), the update of step 1500 the
    first under it; the activation and gradient norms follow it (x5 and x3.3 by the end), the loss does not
    move yet (OPT's precursor). Checkpoints every 50 steps."""
    steps = np.arange(n)
    ratio = 1.004 ** np.maximum(steps - start + 1, 0)
    act = 10.0 * ratio ** 0.8 * np.exp(np.random.default_rng(seed).normal(0, 0.05, n))
    grad = grad_curve(n, seed=seed + 10) * ratio ** 0.6
    rows = rows_table(steps, loss=loss_curve(n, seed=seed, noise=0.05), grad_norm=grad, act_norm=act, lr=1e-3 * ratio)
    return analyze(rows, _ckpts(list(range(50, n, 50))))


@pytest.mark.parametrize("seed", range(6))
def test_37_a_slow_lr_ramp_into_a_norm_climb_is_where_the_divergence_began(seed: int) -> None:
    """The precursor's onset is the first consequence of the LR ramp (1501) or the climb's own start when the
    fit puts it earlier, and the advice is checkpoint 1450 (checkpoint 1500 holds an update under the ramp).
    Fresh seed 372696's run 071: a ramp of x1.006 per step from 726, the climb estimated at 728, advice 726. Fails
    on 55352fb for seeds 0 and 4 (the rise was measured up to the climb's start only, x1.01 there; advice 1500)."""
    report = _lr_ramp_climb(seed)
    alarms = _alarms(report)
    assert [f.kind for f in alarms] == ["divergence"] and alarms[0].onset_step <= 1501, alarms
    assert report.rollback is not None and report.rollback.checkpoint_step == 1450, report.rollback


# 38. A checkpoint inside an excursion that came back by itself is a healthy one once the loss from it is back.

def _recovered_then_nan(seed: int, lasting: bool, checkpoint: int = 1025) -> Report:
    n = 1400
    loss = loss_curve(n, seed=seed, noise=0.05)
    loss[1000:1060] += 0.5 * np.exp(-np.arange(60) / 20)  # a 10-sigma spike that comes back by itself in ~30 steps
    if lasting:
        loss[1030:] += 0.3  # ...or does not
    loss[1100:] = np.nan
    return analyze(rows_table(np.arange(n), loss=loss, grad_norm=grad_curve(n, seed=seed + 10)),
                   _ckpts([900, checkpoint]))


@pytest.mark.parametrize("seed", range(6))
def test_38_a_checkpoint_late_in_a_recovered_spike_is_not_rejected(seed: int) -> None:
    """A spike at 1000 that recovered with no lasting cost (a warning, history; it ends at 1025-1036 on five of the
    six seeds), then the loss NaN from 1100: the advice for the NaN is checkpoint 1025, saved while the spike was
    still on but with the loss computed from it back in its band (the median of the next 8 within 3 of its sigmas):
    the run trained on from that state and came back (fresh seed 890695's run 025: a recovered rise pushed a NaN's
    rollback from 490 to 420). Fails on 55352fb (checkpoint 900, 1025 rejected "inside the spike"). Guards: a
    checkpoint in the thick of the same spike (1005, the loss ~8 sigmas up after it) is still refused, as the
    playbook restarts before a spike (fresh seed 468102's run 032); and when the loss stays up (the spike, or a
    divergence, never recovered), it is the incident the advice answers, and the advice precedes it."""
    report = _recovered_then_nan(seed, lasting=False)
    spike = next(f for f in report.findings if f.kind == "spike")
    assert spike.severity == "warning" and spike.self_recovered and not spike.needs_action, spike
    assert report.rollback is not None and report.rollback.checkpoint_step == 1025, report.rollback.reason
    assert report.rollback.evidence["rejected_checkpoints"] == []
    report = _recovered_then_nan(seed, lasting=False, checkpoint=1005)
    assert report.rollback is not None and report.rollback.checkpoint_step == 900, report.rollback.reason
    assert report.rollback.evidence["rejected_checkpoints"] == [
        {"step": 1005, "why": "inside the spike from step 1000"}]
    report = _recovered_then_nan(seed, lasting=True)
    assert report.rollback is not None and report.rollback.checkpoint_step == 900, report.rollback.reason


# 39. The rollback precedes every step a change point may have been at, not only the likeliest.

def _coarse_collapse(sawtooth: bool) -> Report:
    """Logged every 10 steps; the scale 2^17, with (``sawtooth``) a healthy sawtooth until step 940 (grown to 2^18
    every 50 steps, halved back by the next overflow). Then one halving in the row at 990, five more by 1000, one
    more by 1010, and no regrowth. Checkpoints every 21 steps (966, 987, 1008, ...)."""
    steps = np.arange(0, 2000, 10)
    n = len(steps)
    scale = np.full(n, 2.0 ** 17)
    if sawtooth:
        scale[(steps % 50 == 0) & (steps > 0) & (steps < 950)] = 2.0 ** 18
    i = int(np.searchsorted(steps, 990))
    scale[i], scale[i + 1], scale[i + 2:] = 2.0 ** 16, 2.0 ** 11, 2.0 ** 10
    rows = rows_table(steps, loss=loss_curve(n, seed=1), grad_norm=grad_curve(n, seed=11), loss_scale=scale,
                      found_inf=np.zeros(n, bool))
    return analyze(rows, _ckpts(list(range(21, 2000, 21))))


@pytest.mark.parametrize("sawtooth", [True, False])
def test_39_a_collapse_on_a_coarse_log_is_rolled_back_before_its_whole_confidence_set(sawtooth: bool) -> None:
    """With the sawtooth the healthy skip rate is learned high (one per ~50 steps), so the likeliest change point is
    the row at 1000 (five skips in ten steps) and the row at 990 (one halving, as an ordinary backoff makes) lies
    1.4 log-likelihood below it: inside the 95% set (1.92). The collapse may have begun in (980, 990], so the
    advice is checkpoint 966; 987 may hold its first skip (fresh seed 260854's run 128: the same rows, advice 987,
    the labelled onset 990). The finding's onset stays the likeliest row, with ``earliest_onset_step`` beside it.
    Fails on 55352fb (advice 987). Guard (no sawtooth): where 990 is itself the likeliest row, both agree."""
    report = _coarse_collapse(sawtooth)
    [f] = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert f.onset_step == (1000 if sawtooth else 990) and f.evidence["earliest_onset_step"] == 990, f
    assert report.rollback is not None and report.rollback.checkpoint_step == 966, report.rollback.reason


# 40. A jump that stays up is an unrecovered spike, not the start of a divergence found inside it later.

def _excursion(kind: str, onset: int, detected: int, rule: str | None = None, end: int = 2000,
               **evidence: object) -> Finding:
    """An unrecovered finding (out to ``end``), or a recovered one when ``end`` is given before 2000."""
    back = end < 2000
    return Finding(kind=kind, onset_step=onset, end_step=end, peak_step=onset + 10, segment=0,
                   severity="warning" if back else "critical", self_recovered=back, needs_action=not back,
                   evidence={"rule": rule, "detected_step": detected, **evidence}, message=f"{kind} from {onset}")


@pytest.mark.parametrize("spike, divergence, expected", [
    # Fresh seed 368521's run 041: a burst threw the loss 2.4 -> 120 at 119 (confirmed at 134); it decayed for
    # 700 steps, and the divergence scan confirmed a "climb" in that decay at 543, measured from the best level
    # before the jump, so its hinge put the climb's start on the jump. One incident: the spike.
    (("spike", 119, 134, "shewhart"), ("divergence", 119, 543), [("spike", 119)]),
    # Seed 866182's run 008: the jump at 368 was confirmed at 383; an LR ramp's climb began at 1074, a new
    # development inside the open spike. Both stay (both were labelled).
    (("spike", 368, 383, "shewhart"), ("divergence", 1074, 1215), [("spike", 368), ("divergence", 1074)]),
    # Seed 866182's run 113: a sustained rise (CUSUM) from 605, confirmed at 680, and the norm climb from 625: a
    # change in slope, the divergence's, from the earliest onset.
    (("spike", 605, 680, "cusum"), ("divergence", 625, 788), [("divergence", 605)]),
    # A divergence first: the spike is its high observations (unchanged).
    (("spike", 320, 330, "shewhart"), ("divergence", 300, 400), [("divergence", 300)]),
    # Seed 368521's run 094: a spike that came back, inside a divergence still climbing (766 on): part of it.
    (("spike", 969, 969, "shewhart", 982), ("divergence", 766, 900), [("divergence", 766)]),
])
def test_40_a_jump_that_stays_up_is_an_unrecovered_spike_not_a_divergences_start(
        spike: tuple, divergence: tuple, expected: list) -> None:
    """Fails on d55e333 (every pair merged into a divergence from the earliest onset: the first two runs' spike
    labels missed, their divergences false alarms)."""
    from runwatch.detectors.analysis import merge_overlaps

    found = merge_overlaps([_excursion(*spike), _excursion(*divergence)])
    assert sorted((f.kind, f.onset_step) for f in found) == sorted(expected), found


# 41. While the scaler skips updates, a slow rise of the loss against its trend is the collapse's doing.

@pytest.mark.parametrize("spike, separate", [
    # Fresh seeds 423978 (run 137), 497446 (137), 837336 (128), 890695 (014): a collapse skipping every other step
    # or every step, and a CUSUM rise against the loss's falling trend from inside it, paged as a second incident.
    (("spike", 1303, 1318, "cusum"), False),
    # A jump, or a rise the LR made (seed 837336's run 125: an LR burst x50 inside a collapse), is no skipped update's
    # doing: both stay.
    (("spike", 1303, 1318, "shewhart"), True),
    (("spike", 1303, 1318, "cusum", 2000, {"lr_raised": True}), True),
    (("spike", 1303, 1318, "cusum", 2000, {"lr_step_up_step": 1290}), True),
    # A rise that began before the collapse is its own.
    (("spike", 900, 915, "cusum"), True),
])
def test_41_a_slow_loss_rise_while_the_scaler_skips_is_the_collapse(spike: tuple, separate: bool) -> None:
    """Fails on d55e333 for the first case (two findings: the rise a false alarm)."""
    from runwatch.detectors.analysis import merge_overlaps

    evidence = spike[5] if len(spike) > 5 else {}
    rise = _excursion(*spike[:5], **evidence)
    collapse = _excursion("scaler_collapse", 991, 1000)
    found = merge_overlaps([collapse, rise])
    assert found == ([collapse, rise] if separate else [collapse]), found


# 42. An unrecovered excursion that is still climbing is a divergence: a change in slope, whatever opened it.

def test_42_an_unrecovered_excursion_still_climbing_is_a_divergence() -> None:
    """Real CPU training (fresh seed 423978's run 093, ``tests/fixtures/fresh``): an LR ramp on a linear decay holds
    the LR near 2.6e-4 while the loss climbs from ~740, first past the spike's bar at 805: 1.68 -> 6.3 by the last
    row, the later half of the excursion's losses 5.4 standard errors above the earlier. The labelled divergence
    (onset 740) was a critical spike, "not back to its trend", and the divergence missed. A climb is a change in
    slope (DETECTION.md section 5): the finding is a divergence, and says it is still climbing. Fails on d55e333
    (a spike). Guard: a jump that stays up and decays is a spike (test 26, test 40)."""
    steps, cols = _fresh_run("f423978-093")
    report = analyze(rows_table(steps, **cols))
    [exc] = [f for f in report.findings if f.kind in ("spike", "divergence")]
    assert (exc.kind, exc.self_recovered, exc.severity) == ("divergence", False, "critical"), exc
    assert exc.evidence["climbing"] and exc.evidence["climb_se"] >= 3, exc.evidence
    assert 740 <= exc.onset_step <= 805 and "still climbing" in exc.message, exc


# 43. A norm cannot begin growing before the LR rise that caused it: the rise's first consequence is the onset.

def test_43_a_divergence_begins_no_earlier_than_the_lr_rise_that_caused_it() -> None:
    """Real CPU training (fresh seed 372696's run 085): a slow LR ramp from 715 (x1.6 by the climb), the loss
    climbing from 716; checkpoints every 51 steps. The gradient and activation norms' hinge fits put their growth
    at 703, before the ramp: with the climb read as a divergence (test 42), that moved the onset to 703 and the
    advice to checkpoint 663, one interval early. The LR rise is the cause, so its first consequence bounds the
    onset: 716, advice 714, one incident. Fails without the bound in ``cause_start`` (onset 703, checkpoint 663)."""
    report = _fresh_report("f372696-085")
    [div] = [f for f in report.findings if f.kind in ("spike", "divergence")]
    assert (div.kind, div.onset_step) == ("divergence", 716), div
    assert report.rollback is not None and report.rollback.checkpoint_step == 714, report.rollback


# 44. A ratio of two short medians of a noisy activation norm is no climb: the checkpoint before a NaN is healthy.

def test_44_a_noisy_norms_drift_does_not_refuse_the_checkpoint_before_a_nan() -> None:
    """Real CPU training (fresh seed 837336's run 033): batch 1, checkpoints every 25, the weights poisoned at step
    373 (NaN from there). The activation norm drifts up 1.7 -> 4 over 300 steps as a small model's does, and its
    medians of 8 stray by 20% and more: 8 rows after 326 against 8 before read as x1.6, a "climb", and checkpoint
    350 was refused for 325. The climb must also stand 3 standard errors out of the two medians' noise
    (``AdviceConfig.act_climb_z``; here ~2): advice 350, the last checkpoint before 371. Fails on a551057 (325)."""
    report = _fresh_report("f837336-033")
    assert [(f.kind, f.onset_step) for f in report.findings if f.needs_action] == [("nan", 373)], report.findings
    assert report.rollback is not None and report.rollback.checkpoint_step == 350, report.rollback


# 45. A slowdown begins where the step time changed level, not where a host's ordinary slow stretch before it began.

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("wander_first", [True, False])
def test_45_a_slowdown_begins_at_its_change_point_not_at_the_wander_before_it(seed: int, wander_first: bool) -> None:
    """Fresh seed 890695's run 018: the host 40% slower from step 337 (its own wander, 4 of its sigmas), a slow
    node 3x from 354. The CUSUM begins summing at the first raised observation, so the slowdown was reported from
    337 (and the labelled one at 354 missed). Its onset is the maximum-likelihood change point of a step in the
    log step time between where the CUSUM began and where it fired (``slowdown.step_change``). Fails on 9ebd07a
    (onset 337-340) after the wander; guard: without it, the onset is 354 too."""
    from runwatch.detectors.slowdown import detect_slowdowns

    rng = np.random.default_rng(seed)
    n = 1000
    st = 0.47 * np.exp(rng.normal(0, 0.05, n))
    if wander_first:
        st[337:354] *= 1.12  # under every bar by itself, but the CUSUM begins summing there
    st[354:480] *= 3.0
    found = [f for f in detect_slowdowns(np.arange(n), st) if f.severity != "info"]
    assert [(f.kind, f.end_step >= 470) for f in found] == [("slowdown", True)], found
    assert abs(found[0].onset_step - 354) <= 1, found[0]


# 46. An LR ramp begins where the LR left its schedule's path, which on a decaying schedule is before its lowest point.

@pytest.mark.parametrize("name, onset, checkpoint", [("f709008-129", 782, 736), ("f837336-049", 1150, 1001)])
def test_46_an_lr_ramp_on_a_decaying_schedule_begins_where_it_left_the_schedule(
        name: str, onset: int, checkpoint: int) -> None:
    """Real CPU training. Fresh seed 709008's run 129: cosine with warm restarts, logged every 2 steps, checkpoints
    every 46; a ramp x1.002-1.008 per update from step 782 only slows the decay at first (the LR's lowest row is
    ~800), and the loss breaks at 790. The rise was read from the lowest LR before the onset, which was the onset
    itself: no LR cause, onset 790, checkpoint 782 (after the ramp's first update). Seed 837336's run 049: linear
    decay logged every 25 steps, a ramp from between 1125 and 1150; the LR's lowest row is 1150, so the rise was
    read from 1175 and the advice was 1144. A schedule bends log LR smoothly and a ramp steps its slope up
    (``LRConfig.kink``): the onset is the first row past that step, and the advice precedes it. Fails on efb33c0
    (onsets 790 and 1175, checkpoints 782 and 1144)."""
    steps, cols = _fresh_run(name)
    events = _fresh_events(f"{name}-checkpoints.json")
    report = analyze(rows_table(steps, **cols), events)
    [div] = [f for f in report.findings if f.needs_action]
    assert (div.kind, div.onset_step, div.evidence["lr_rise_step"]) == ("divergence", onset, onset), div
    assert report.rollback is not None and report.rollback.checkpoint_step == checkpoint, report.rollback


@pytest.mark.parametrize("every, ramp_at, first_row", [(1, 2400, 2400), (5, 2400, 2400), (25, 2390, 2400)])
def test_46_a_slow_ramp_near_a_cosines_floor_begins_at_its_kink_not_at_the_lows_row(
        every: int, ramp_at: int, first_row: int) -> None:
    """Synthetic schedule: after a 100-step warm-up a cosine from 1e-3 down to a floor of 1e-4 at step 3,000, and a
    ramp x1.001 per update from ``ramp_at``. Near the floor the cosine's decay slows, so the ramped LR keeps
    falling for ~370 steps more: its lowest row is ~2,770, while the loss answers within tens of steps. The rise
    (x1.5 over its low by the peak, 900 steps on) begins at the first logged row the ramp raised (a ramp that
    began between two rows of a coarse log shows from the later one). Read from the lowest row before the
    onset, the onset's own row, there was no rise (None on efb33c0). The schedule alone has no rise."""
    from runwatch.detectors.config import LRConfig

    t = np.arange(0, 3600, every)
    cosine = 1e-4 + 0.5 * 9e-4 * (1 + np.cos(np.pi * np.minimum(t, 3000) / 3000))
    sched = np.where(t < 100, 1e-3 * (t + 1) / 100, cosine)
    ramp = sched * 1.001 ** np.clip(t - ramp_at + 1, 0, None)
    onset, peak = int(np.searchsorted(t, ramp_at + 40)), int(np.searchsorted(t, ramp_at + 900))
    assert int(np.argmin(ramp[onset:peak])) > 300 // every  # the LR still falls long after the onset
    assert t[lr_rise_start(t, ramp, onset, LRConfig(), until=peak)] == first_row
    assert lr_rise_start(t, sched, onset, LRConfig(), until=peak) is None



# 47. A collapse is over when the scaler is back in its sawtooth's range; one that stops skipping still deeper did
#     not recover (unless it regrows later), and a burst after it is a collapse of its own.

def _grad_scaler(n: int, overflows: set[int], interval: int, scale: float = 2.0 ** 19,
                 cap: float | None = None) -> tuple[np.ndarray, ...]:
    """GradScaler's loss scale as a run logs it (the scale each step ran with) and its found_inf flag, per step
    1..n: an overflow halves the scale for the next step, ``interval`` clean steps in a row double it. Besides
    the forced ``overflows``, a step overflows whenever its scale is above ``cap`` (default the first one: the
    sawtooth)."""
    scales, flags, clean, cap = [], [], 0, scale if cap is None else cap
    for step in range(1, n + 1):
        scales.append(scale)
        flags.append(step in overflows or scale > cap)
        if flags[-1]:
            scale, clean = scale / 2, 0
        else:
            clean += 1
            if clean == interval:
                scale, clean = scale * 2, 0
    return np.arange(1, n + 1), np.asarray(scales), np.asarray(flags)


def _scaler_report(steps: np.ndarray, scale: np.ndarray, flags: np.ndarray, interval: int,
                   every: int = 100, init_scale: float = 2.0 ** 19) -> Report:
    n = len(steps)  # checkpoints every ``every`` steps, up to the last logged one (on any log interval)
    events = [{"event": "checkpoint", "step": s, "payload": {"path": f"ckpt/{s}"}}
              for s in range(every, int(steps[-1]), every)]
    return analyze(rows_table(steps, loss=loss_curve(n), grad_norm=grad_curve(n), loss_scale=scale, found_inf=flags),
                   events_table(events), meta={"scaler": {"init_scale": init_scale, "growth_interval": interval}})


@pytest.mark.parametrize("n, recovered", [(1700, False), (1750, True)])
def test_47_a_collapse_still_deeper_than_a_sawtooth_when_it_stops_skipping_did_not_recover(
        n: int, recovered: bool) -> None:
    """Fresh seed 368521's run 028 in GradScaler's terms: 11 overflows every other step from 900 take the scale
    2^19 -> 2^8; then nothing skips, and it regrows a doubling per 100 clean steps: 2^15 by 1621, 2^16 by 1721.
    With 2^4 as "regrown" (the very depth that makes a collapse) a scale 2^4 under where it was read "the scaler
    is back to normal". Back means within fewer halvings than make a collapse (three, ``recovered_within``; test
    105): still 2^4 below at the end (a run to 1700) it did not recover (critical, checkpoint 800 before the
    burst); regrown to 2^16 by 1721 (a run to 1750), it recovered late: a warning, no advice. Fails on efb33c0
    for n = 1700 (back to normal)."""
    steps, scale, flags = _grad_scaler(n, set(range(900, 921, 2)), 100)
    report = _scaler_report(steps, scale, flags, 100)
    [collapse] = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert (collapse.onset_step, collapse.self_recovered, collapse.needs_action) == (900, recovered, not recovered)
    assert ("did not recover" in collapse.message) is not recovered, collapse.message
    assert (report.rollback.checkpoint_step if report.rollback else None) == (None if recovered else 800)


def test_47_a_burst_long_after_a_collapse_that_never_regrew_is_a_collapse_of_its_own() -> None:
    """GradScaler with a growth interval of 400: a burst of 11 overflows at 900-920 (2^19 -> 2^8), regrown only to
    2^10 700 steps later, when every step starts overflowing (1620 to the end: the scale driven to its bottom).
    The first episode stayed open while the scale was low and swallowed the second: one finding from 900. Its
    skip CUSUM back at 0 and nothing skipped for ``patience_steps`` with the scale still low ends it (not
    recovered); the later burst is a second finding, still skipping at the last step. Fails on efb33c0 (one
    finding)."""
    steps, scale, flags = _grad_scaler(1800, set(range(900, 921, 2)) | set(range(1620, 1801)), 400)
    found = [f for f in _scaler_report(steps, scale, flags, 400).findings if f.kind == "scaler_collapse"]
    assert [(f.onset_step, f.self_recovered, f.needs_action) for f in found] == [(900, False, True),
                                                                                (1620, False, True)]
    assert found[1].evidence["still_skipping"], found[1].evidence


def test_47_a_halving_chain_begins_at_the_first_flagged_skip_of_its_burst() -> None:
    """Fresh seed 709008's run 002: consecutive overflows from 361 (flagged), 65536 -> 1024, with a learned growth
    interval of ~213. Here five, 2^17 -> 2^12, with an interval of 250 (each skip adds log(0.05 / 0.004) = 2.5 to
    the skip CUSUM: 12.6, under its 15), so the halving chain finds it, and the scale is still 2^4 low at 850. The
    scale a row logs is the one its step ran with: the first decrease shows at 362, and the chain began there, so
    the advice was checkpoint 360, the state the first overflow's gradients came from. The onset is the first
    flagged skip of the burst that runs into the decrease: 361, checkpoint 240 (checkpoints every 120). Fails on
    efb33c0 (362, checkpoint 360)."""
    steps, scale, flags = _grad_scaler(850, set(range(361, 366)), 250, scale=65536.0)
    report = _scaler_report(steps, scale, flags, 250, every=120)
    [collapse] = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert collapse.onset_step == 361, collapse
    assert report.rollback is not None and report.rollback.checkpoint_step == 240, report.rollback


# 48. Norms that grow while the loss falls fast are the model learning, not OPT's precursor.

def _early_growth(loss_falls: bool) -> Report:
    """A 22-step warm-up and a cosine decay; from step 36 the activation norm grows ~4x and the gradient norm
    ~2.5x over 160 steps, as a small model's do when it leaves its initialisation (fresh seed 396069's run 116,
    healthy: x3.5 and x2.3 over steps 36-201 while the loss fell 4.1 -> 3.1). The data ends while they climb."""
    n = 200
    steps = np.arange(n)
    lr = np.where(steps < 22, 1e-3 * (steps + 1) / 22, 1e-3 * (0.55 + 0.45 * np.cos(np.pi * steps / 400)))
    rng = np.random.default_rng(3)
    grow = np.clip((steps - 36) / 160, 0, None)
    act = 5.0 * (1 + 3.0 * grow ** 1.5) * np.exp(rng.normal(0, 0.03, n))
    grad = 0.5 * (1 + 1.5 * grow ** 1.5) * np.exp(rng.normal(0, 0.05, n))
    level = 3.0 + 1.1 * np.exp(-steps / 60) if loss_falls else np.full(n, 3.9)
    loss = level + rng.normal(0, 0.04, n)
    return analyze(rows_table(steps, loss=loss, grad_norm=grad, act_norm=act, lr=lr), _ckpts([50, 100, 150]))


def test_48_norms_growing_while_the_loss_falls_fast_are_learning_not_a_precursor() -> None:
    """No divergence, no advice. Fails on 4420b62 (a critical divergence from step 55, 'before the loss has
    moved'). Guard: the same growth with the loss flat is still OPT's precursor."""
    learning = _early_growth(loss_falls=True)
    assert not [f for f in learning.findings if f.kind == "divergence"], learning.findings
    assert learning.rollback is None
    stalled = _early_growth(loss_falls=False)
    [f] = [f for f in stalled.findings if f.kind == "divergence"]
    assert f.severity == "critical" and "precursor" in f.message, f


# 49. A step back to the peak the run trained at is a warm restart, however flat the cosine's tail before it.

def _restart_on_a_long_cycle(to: float) -> Report:
    """Cosine with warm restarts every 1500 steps after a 100-step warm-up, down to 0.05 of the peak: over its
    last 32 rows the LR moves under 2% (a cosine is flat at its low). At 1600 the LR steps up to ``to`` x the
    peak and decays again; 12 steps later the loss rises 0.6 (12 sigmas) and decays back, as a clean twin's
    does after its restart (fresh seed 396069's run 010, a warning at its restart at 1650)."""
    n, peak = 2100, 3e-3
    steps = np.arange(n)
    lr = np.where(steps < 100, peak * (steps + 1) / 100, _sgdr(peak, steps - 100, 1500))
    lr[1600:] *= to
    loss = loss_curve(n, seed=4, noise=0.05)
    t = np.arange(n - 1612)
    loss[1612:] += 0.6 * np.exp(-t / 40)
    return analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n, seed=14), lr=lr))


def test_49_a_restart_back_to_the_peak_after_a_flat_cosine_tail_is_the_schedule() -> None:
    """An 'info' finding naming the restart. Fails on 4420b62 (a critical: a restart had to follow a 10% fall
    within 32 rows, which a long cycle's flat tail never shows). Guard: a step up to 0.8 of the peak from the
    same flat tail (a level the run never held, from an LR that was not decaying) is still an alarm."""
    [f] = [f for f in _restart_on_a_long_cycle(1.0).findings if f.kind in ("spike", "divergence")]
    assert f.severity == "info" and f.evidence["lr_scheduled"], f
    assert f.evidence.get("lr_restart_step") == 1600 or f.evidence["lr_raised"], f
    guard = _restart_on_a_long_cycle(0.8)
    assert _alarms(guard) and not any(f.evidence.get("lr_restart_step") for f in guard.findings), guard.findings


# 50. A norm that blows up exponentially is a climb from where it began, not from its last two blocks.

def test_50_an_exponential_norm_climb_is_found_from_its_start() -> None:
    """Real CPU training (fresh seed 122814's run 120): batch 1, cosine with warm restarts, logged every 5 steps,
    checkpoints every 22. A slow LR ramp from 430 rides the cosine's restart at 431; the activation norm's block
    medians go 2.95, 4.31, 7.99, 19.5 and the gradient norm's 4.85, 6.41, 11.5, 30.5 to the last row, while the
    batch-1 loss (0.07 to 28 row to row) shows no shift a median can see. The walk back from the end compared raw
    slopes, and an exponential's grow so fast that it stopped after the last two blocks: no climb, no finding
    above 'info', no advice (the labelled divergence from 430 wants checkpoint 418). A norm grows by ratios, so
    the walk is on log values: a critical divergence (OPT's precursor) and checkpoint 418. Fails on 0aa249d."""
    report = _fresh_report("f122814-120")
    [div] = [f for f in report.findings if f.kind == "divergence"]
    assert div.severity == "critical" and "precursor" in div.message and 430 <= div.onset_step <= 460, div
    assert report.rollback is not None and report.rollback.checkpoint_step == 418, report.rollback


# 51. OPT's precursor is a divergence seen before the loss moves: once the loss has risen, the loss finding speaks.

def test_51_the_precursor_yields_once_the_loss_has_risen() -> None:
    """Real CPU training (fresh seed 118218's run 044, its first segment): an LR burst x93 at 144 throws the loss
    3.3 -> 22.6 and it stays up to the rollback at 183. The activation norm began climbing at 134 with the burst's
    approach, x3.9 by the end, the gradient norm x6.3: with the climb read on log values (test 50) the precursor
    fired, 'before the loss has moved', took the spike's place and named a divergence from 134. The loss rose
    through that climb by far more than ``growth_z`` standard errors of two medians, and the loss's own alarm
    covers it, so the incident is the spike the loss shows: critical, from 144. Fails with test 50's change alone
    (a divergence from 134). Guard: test 55 (a rise the loss detectors only note keeps the precursor)."""
    steps, cols = _fresh_run("f118218-044")
    report = analyze(rows_table(steps, **cols))
    [exc] = [f for f in report.findings if f.kind in ("spike", "divergence")]
    assert (exc.kind, exc.severity, exc.onset_step) == ("spike", "critical", 144), exc
    assert "precursor" not in exc.message and exc.evidence["lr_raised"], exc


# 52. An LR ramp still rising into an excursion is its cause from where the ramp began.

def test_52_a_spike_on_a_rising_lr_ramp_reads_the_lr_from_the_ramps_start() -> None:
    """Real CPU training (fresh seed 371818's run 139): batch 1, constant LR, checkpoints every 122. From 1072 the
    LR grows x1.027 a step; at 1187 (x22) the loss jumps 2.9 -> 30 and the log ends 7 rows later. The LR story read
    the LR of the rows just before the spike, already raised by the ramp: x1.3, no cause, a 'warning' spike and no
    advice (the labelled divergence from 1072 wants checkpoint 976). Read from where the ramp left the schedule's
    path, the LR is x22 and still raised: a critical divergence from the ramp's first loss, advice 976. Fails on
    539bd87."""
    report = _fresh_report("f371818-139")
    [div] = [f for f in report.findings if f.kind in ("spike", "divergence") and f.onset_step > 900]
    assert (div.kind, div.severity, div.onset_step) == ("divergence", "critical", 1072), div
    assert div.evidence["lr_ratio"] > 10 and "learning rate began rising at 1071" in div.message, div
    assert report.rollback is not None and report.rollback.checkpoint_step == 976, report.rollback


# 53. An excursion still open while the LR that threw it stays raised is no bad batch.

def test_53_an_open_excursion_under_a_still_raised_lr_is_not_a_blip() -> None:
    """Real CPU training (fresh seed 122814's run 123): batch 2, constant LR, logged every 10 steps, checkpoints
    every 120. From 760 the LR grows x1.027 a step; at 840 (x8.8) the loss goes 3.5 -> 24 and the log ends four rows
    later, the loss still above its band. Two far-out rows, not yet ``patience_obs`` old: 'a bad batch?', info, no
    advice. A bad batch is over at once; a raised LR goes on acting. Open under an LR still raised off the
    schedule, it is a divergence: critical, from the ramp's first loss (760), advice 720. Fails on 539bd87."""
    report = _fresh_report("f122814-123")
    [div] = [f for f in report.findings if f.kind in ("spike", "divergence") and f.onset_step > 700]
    assert (div.kind, div.severity, div.onset_step) == ("divergence", "critical", 760), div
    assert report.rollback is not None and report.rollback.checkpoint_step == 720, report.rollback


# 54. A far-out value corroborates a wandering loss's shift only past the bar of its variability with the wander.

def test_54_a_late_rebound_with_values_past_the_short_term_bar_is_an_annotation() -> None:
    """Real CPU training (fresh seed 396069's run 122): fp16, batch 85, step schedule, noisy host. An LR burst x32
    at 1843 makes a spike that comes back (a warning, its label). From 2037 the loss, at 0.11 late in training,
    rebounds to 0.5 and comes back after 169 steps: the CUSUM's sustained rise, with no LR move and the gradient
    norm under its bar, which the clean twin makes too. Three of its values passed 6.5 sigmas of the short-term
    noise, and each 'corroborated' it: a warning. Over 169 steps a shift of a few sigmas puts values there by
    chance; against the scale the CUSUM reads (the wander included) none is far out: an annotation. Fails on
    309f954. Guard: the LR burst's spike is still a warning. (Since test 106 the burst's episode takes in a rise
    at 1943 within its lasting window, and the rebound, judged after it, has no value past the short-term bar left:
    test 73 keeps the lone far values.)"""
    steps, cols = _fresh_run("f396069-122")
    report = analyze(rows_table(steps, **cols))
    [burst] = [f for f in report.findings if f.kind == "spike" and 1840 <= f.onset_step <= 1850]
    assert burst.severity == "warning" and burst.evidence["lr_raised"], burst
    [rebound] = [f for f in report.findings if f.kind == "spike" and 2030 <= f.onset_step <= 2045]
    assert (rebound.severity, rebound.evidence["rule"], rebound.evidence["uncorroborated"]) == ("info", "cusum", True), rebound


# 55. A precursor the loss rises with stays the finding where the loss's own rise is only noted.

def test_55_a_precursor_with_the_loss_rising_pages_where_the_loss_finding_is_only_an_annotation() -> None:
    """Real CPU training (the development set's divergence-05, ``tests/fixtures/fresh``): a slow LR ramp (x1.005 a
    step) and the final layer's weights growing from 192, checkpoints every 50. The activation and gradient norms
    climb x12; the loss rises 1.5 -> 4.4 slowly, a sustained rise the CUSUM finds and, with no value far out and
    the gradient norm under its own 4x bar, notes ('info', uncorroborated). Test 51's first form (no precursor once
    the loss rose through the climb) left the run with no alarm and no advice. The norms are the corroboration:
    a critical divergence from the climb, 'the loss rising with them', and checkpoint 150. Fails on 8c550cc."""
    steps, cols = _fresh_run("dev-divergence-05")
    events = _fresh_events("dev-divergence-05-checkpoints.json")
    report = analyze(rows_table(steps, **cols), events)
    [div] = [f for f in report.findings if f.kind in ("spike", "divergence")]
    assert (div.kind, div.severity) == ("divergence", "critical") and 185 <= div.onset_step <= 200, div
    assert "the loss rising with them" in div.message and div.evidence["loss_moved"], div
    assert report.rollback is not None and report.rollback.checkpoint_step == 150, report.rollback


# 56. A loss thrown both ways under an LR raised off the schedule is the raise's damage, not the noise growing.

def test_56_a_spread_under_an_lr_burst_is_damage_not_noise() -> None:
    """Real CPU training (fresh seed 198280's run 100): step schedule, a noisy host, checkpoints every 44. At 67
    the LR jumps x254; the loss goes 4.1 -> 82 and, in the wreck, far below its level as well as above, with the
    gradient norm x11 and no recovery to the log's end. The sign test read that as 'the noise grew' (info, no
    advice). It refutes a level shift on the assumption that nothing changed; an LR raised off the schedule at the
    onset is a change. Not refuted: a critical spike, not back, and checkpoint 44. Fails on d51485c."""
    report = _fresh_report("f198280-100")
    [spike] = [f for f in report.findings if f.kind == "spike"]  # the LR's later growth is its own (test 63)
    assert (spike.severity, spike.onset_step, spike.self_recovered) == ("critical", 68, False), spike
    assert not spike.evidence["noise_grew"] and spike.evidence["lr_ratio"] > 100, spike.evidence
    assert report.rollback is not None and report.rollback.checkpoint_step == 44, report.rollback


# 57. The warm-up's last row is the schedule, on a coarse log too; a burst just after it is not.

def test_57_a_coarse_logs_last_warm_up_row_is_no_lr_step_up() -> None:
    """Real CPU training (fresh seed 198280's run 113): a log every 25 steps, a 41-step warm-up. Its last row (50,
    the LR it reached) sat just outside the warm-up (``step < end``) and, 32 rows back from a noisy stretch at 425,
    read as an LR step up x41 'still raised'. It is the warm-up's; the noisy stretch (425-575) was 'the noise grew',
    with no LR cause. Fails on d51485c. Since test 121 that stretch, on the log's 18th row, is within the spread of the
    cold rows before it and opens nothing; its LR reading is asked directly, at the excursion's old onset, end and
    peak (the detector's own path to the story is covered by the tests whose excursions still open). Guard (fresh
    seed 118218's run 090, a log every 2): x49 two steps after an 88-step warm-up steepens the LR's rise per step
    many-fold, which a warm-up's never does: it ends the warm-up before it, and the burst stays the divergence's
    cause."""
    steps, cols = _fresh_run("f198280-113")
    assert [f for f in analyze(rows_table(steps, **cols)).findings if f.kind == "spike"] == []
    story = _lr_story_of(steps, cols["lr"], 425, 575, 425)
    assert story["lr_step_up_step"] is None and not story["lr_raised"], story
    steps, cols = _fresh_run("f118218-090")
    events = _fresh_events("f118218-090-checkpoints.json")
    [div] = [f for f in analyze(rows_table(steps, **cols), events).findings if f.kind == "divergence"]
    assert (div.severity, div.onset_step, div.evidence["lr_step_up_step"]) == ("critical", 90, 90), div


# 58. The LR before an excursion just past the warm-up is the LR the warm-up reached.

def test_58_the_lr_before_an_excursion_past_the_warm_up_is_where_it_ended() -> None:
    """Real CPU training (fresh seed 581459's run 049): a log every 10 steps, a 126-step warm-up. A natural loss
    excursion at 140 was read as 'after the LR rose x2.07': the median of the 16 rows before it was the warm-up's
    middle. The run trained at the LR the warm-up reached (its last row, 130): x1.0, no raise. Fails on
    d51485c. Since test 121 the excursion (140-290, its peak at 260), on the log's 15th row, is within the spread of
    the cold rows before it and opens nothing; its LR reading is asked directly, as in test 57."""
    steps, cols = _fresh_run("f581459-049")
    assert [f for f in analyze(rows_table(steps, **cols)).findings if f.kind == "spike"] == []
    story = _lr_story_of(steps, cols["lr"], 140, 290, 260)
    assert not story["lr_raised"] and story["lr_ratio"] == pytest.approx(1.0, abs=0.05), story


# 59. A burst that ended is over, where the warm-up goes on raising the LR past it.

def test_59_a_burst_back_on_the_warm_ups_path_is_no_longer_raised() -> None:
    """Real CPU training (the held-out set's spike-12): batch 32, a 150-step warm-up, the LR x100 for steps 72-73;
    the loss 3.1 -> 46, thrown both ways, back on its trend after ~300 steps (labelled: a spike needing no
    action). 'Still raised' compared the LR during the episode with the median of the 16 rows before it, which a
    rising warm-up lags: at once back on the warm-up's path, the LR never came within 10% of that median, and the
    spike, not back by the sign test's 'noise grew' any more (test 56), was a divergence 'still up'. Back at the LR
    of the row before the rise, the burst is over: a warning spike that came back. Fails on d51485c (where it was
    'the noise grew')."""
    steps, cols = _fresh_run("heldout-spike-12")
    [spike] = [f for f in analyze(rows_table(steps, **cols)).findings if f.kind in ("spike", "divergence")]
    assert (spike.kind, spike.severity, spike.onset_step, spike.self_recovered) == ("spike", "warning", 73, True), spike
    assert spike.evidence["lr_raised"] and not spike.evidence["lr_still_raised"], spike.evidence


# 60. Guards of 57 and 59 on the shapes they must not break: a ramp still rising, a ramp right after the warm-up.

def test_60_a_ramp_still_rising_stays_raised_and_one_right_after_the_warm_up_is_a_cause() -> None:
    """A ramp's rows are each within ``flat`` of the row before them, so 'back at the row before the rise' (test
    59) holds only after a one-row step up: an LR growing x1.05 a row from row 200 is still raised over an
    excursion from 206. And a ramp that starts on the warm-up's last row (a linear warm-up over 150 rows, x1.3 a
    row from row 100) is no warm-up rise (test 57 counts that row inside the warm-up): it begins at 100, and the
    LR before it is the warm-up's at 99."""
    lrc, steps = DEFAULT.lr, np.arange(300)
    lr = np.full(300, 1e-3)
    lr[200:] = 1e-3 * 1.05 ** np.arange(1, 101)
    story = _lr_story(steps, lr, 206, 260, 0, DEFAULT.spike.patience_obs, lrc, 240)
    assert story["lr_raised"] and story["lr_still_raised"], story
    lr = np.minimum(np.arange(1, 301) / 150, 1.0) * 1e-3
    lr[100:110] *= 1.3 ** np.arange(1, 11)
    assert lr_rise_start(steps, lr, 104, lrc, until=109) == 100
    assert lr_before(steps, lr, 100, lrc) == pytest.approx(lr[99])


# 61. An excursion inside the warm-up is read against the LR the warm-up reaches: the rise on to it is the schedule.

def test_61_an_excursion_inside_the_warm_up_is_read_against_the_lr_it_reaches() -> None:
    """Real CPU training (fresh seed 210507's run 060, drawn at the freeze 0d6c708 and scored before anyone looked):
    batch 1, a log every 10 steps, a 261-step linear warm-up. A natural loss jump at step 200 peaked after the
    warm-up ended; its LR story compared the LR up to the peak (the warm-up's end) with the median of the rows
    before the onset (the warm-up's middle): "LR x2.5, raised and still up", a critical divergence and advice to
    roll back to checkpoint 170, where the labeller wants none (and, later, checkpoint 1836 for a scaler collapse).
    Against the LR the warm-up reaches it is x1.0. Fails on 0d6c708. A burst inside a warm-up is still a raise (it
    steepens the warm-up, which ends before it: test 57), and inside a warm-up that rises to the log's end the rows
    before are all there is. Since test 121 the jump (200-430, its peak at 350), on the log's 21st row, is within the
    spread of the cold rows before it and opens nothing; its LR reading is asked directly, as in test 57."""
    report = _fresh_report("f210507-060")
    assert report.findings == [] and report.rollback is None, report.findings
    steps, cols = _fresh_run("f210507-060")
    story = _lr_story_of(steps, cols["lr"], 200, 430, 350)
    assert not story["lr_raised"] and story["lr_ratio"] == pytest.approx(1.0, abs=0.05), story
    lrc, rows = DEFAULT.lr, np.arange(300)
    lr = np.minimum(np.arange(1, 301) / 150, 1.0) * 1e-3
    lr[60:62] *= 50.0
    story = _lr_story(rows, lr, 61, 90, 0, DEFAULT.spike.patience_obs, lrc, 70)
    assert story["lr_before"] == pytest.approx(lr[59]) and story["lr_raised"], story
    rising = np.arange(1, 101) * 1e-5  # a warm-up still rising at the log's end
    assert lr_before(np.arange(100), rising, 60, lrc) == pytest.approx(np.median(rising[43:59]))


# 62. A spike's patience is training steps: on a coarse log it runs out before 16 rows.

@pytest.mark.parametrize("every", [10, 1])
def test_62_a_spike_still_out_is_not_recovered_after_its_patience_in_steps(every: int) -> None:
    """Fresh seed 402220's run 121 (drawn at the freeze 0d6c708): a log every 10 steps, an LR burst x231 at step 940,
    the loss 1.4 -> 470 and still far out at the log's end 135 steps (14 rows) later: "not back to trend yet", a
    warning with no advice, because the patience counted 16 rows (160 steps). A spike comes back within so many
    updates, not rows: out for 16 training steps over more than ``recovery_obs`` rows, it is not recovered, critical,
    with advice (the labeller wanted checkpoint 924). The same 14 rows on a per-step log (14 steps) are still "not
    back yet". Fails on ec3eb0e for every=10."""
    n = 120
    steps = np.arange(n) * every
    loss, grad = loss_curve(n), grad_curve(n)
    loss[106:] *= 100.0  # out from row 106 to the last (14 rows)
    grad[106:] *= 30.0
    ckpts = events_table([{"event": "checkpoint", "step": int(steps[r]), "payload": {}} for r in (50, 100)])
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad), ckpts)
    [spike] = [f for f in report.findings if f.kind == "spike"]
    assert spike.onset_step == steps[106], spike
    if every == 10:
        assert (spike.severity, spike.self_recovered, spike.needs_action) == ("critical", False, True), spike
        assert spike.evidence["detected_step"] == steps[114], spike.evidence  # 9 rows, 80 steps >= 16
        assert report.rollback is not None and report.rollback.checkpoint_step == steps[100], report.rollback
    else:
        assert (spike.severity, spike.self_recovered, spike.needs_action) == ("warning", None, False), spike
        assert report.rollback is None, report.rollback


# 63. An LR raised off the schedule inside an excursion that has not come back is a second cause, a divergence.

def test_63_an_lr_raised_inside_an_unrecovered_spike_is_a_divergence_of_its_own() -> None:
    """Real CPU training (fresh seed 402220's run 077): fp16, cosine, checkpoints every 46. An LR burst x271 at 322
    throws the loss 3.0 -> 84 and it never comes back; from 448 the LR grows off the schedule (x1.5 by 480). The
    labeller has both: the spike (right checkpoint 276) and a divergence from 449. runwatch reported the spike
    only: the LR change-point test measures the lift against the level before the raise, the excursion's own.
    The LR column shows the cause itself, and a run cannot come back under it: a divergence of its own from the
    raise's first consequence, beside the spike, never absorbed into it; the rollback still precedes the spike.
    Fails on 89b32f9."""
    steps, cols = _fresh_run("f402220-077")
    events = _fresh_events("f402220-077-checkpoints.json")
    report = analyze(rows_table(steps, **cols), events)
    loss = sorted((f for f in report.findings if f.kind in ("spike", "divergence") and f.severity != "info"),
                  key=lambda f: f.onset_step)
    assert [(f.kind, f.onset_step, f.self_recovered) for f in loss] == [("spike", 323, False), ("divergence", 449, False)]
    assert loss[1].evidence["rule"] == "lr_raise_inside" and loss[1].evidence["lr_rise_step"] == 448, loss[1].evidence
    assert "still out from step 323" in loss[1].message, loss[1].message
    assert report.rollback is not None and report.rollback.checkpoint_step == 276, report.rollback
    streamed = StreamingAnalyzer()
    streamed.update_many(rows_table(steps, **cols).to_pylist())
    assert [f.onset_step for f in streamed.report().findings if f.evidence.get("rule") == "lr_raise_inside"] == [449]


@pytest.mark.parametrize("case", ["raise_is_the_cause", "loss_came_back", "no_excursion"])
def test_63_guards_no_second_cause_without_an_unrecovered_excursion_and_a_later_raise(case: str) -> None:
    """The raise that threw the excursion is its cause, not a second one; after the loss came back the loss decides
    (``lr_level_shift``); a raise in a healthy run is no excursion's second cause."""
    n = 600
    steps, loss, grad, lr = np.arange(n), loss_curve(n), grad_curve(n), np.full(n, 1e-3)
    if case == "raise_is_the_cause":
        lr[300:] = 4e-3
        loss[301:] += 3.0
        grad[301:] *= 8.0
    elif case == "loss_came_back":
        loss[300:320] += 3.0
        grad[300:320] *= 8.0
        lr[450:] = 4e-3
    else:
        lr[450:] = 4e-3
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr))
    assert not [f for f in report.findings if f.evidence.get("rule") == "lr_raise_inside"], report.findings


# 64. An LR ramp still held at its raised level is still raised, though most of the excursion ran under less.

@pytest.mark.parametrize("name,onset,checkpoint", [("f501650-115", 1018, 1015), ("f501650-146", 1325, 1300)])
def test_64_an_lr_ramp_held_up_at_the_end_is_still_raised_and_a_divergence(name: str, onset: int,
                                                                          checkpoint: int) -> None:
    """Real CPU training (fresh seed 501650, ``tests/fixtures/fresh``). Run 115: constant LR, an LR ramp x1.0004 a
    step from 1017; the loss is out from 1019 and never back, the LR x1.68 at the log's last row. Run 146 (a log
    every 25 steps, step schedule): a ramp from 1325, the loss out from 1525. The labeller calls both divergences
    (the cause stays and the run cannot come back under it). runwatch called them unrecovered spikes: "still
    raised" asked for the median LR over the excursion at 1.5x the LR before, which a ramp reaches only in its
    later half (run 115: x1.3), and for no row back near it, which a ramp's first rows are. A ramp whose last
    ``held_steps`` updates are all at the factor, never back since it got there, is still raised: a divergence
    from where the LR left its path, advice before it (run 146 advised 1495 before, inside the ramp). Fails on
    HEAD~1. Run 146's checkpoint 1300 is the last row of the old LR, clean since test 99 (1235 before)."""
    steps, cols = _fresh_run(name)
    events = _fresh_events(f"{name}-checkpoints.json")
    report = analyze(rows_table(steps, **cols), events)
    loss = [f for f in report.findings if f.kind in ("spike", "divergence") and f.severity != "info"]
    assert [(f.kind, f.onset_step) for f in loss] == [("divergence", onset)], loss
    assert loss[0].evidence["lr_still_raised"] and "still up" in loss[0].message, loss[0].message
    assert report.rollback is not None and report.rollback.checkpoint_step == checkpoint, report.rollback


def test_64_guard_a_burst_over_before_the_end_is_not_still_raised() -> None:
    """A burst x4 for three updates throws the loss up for good: the LR came back, so the excursion is a spike
    that did not recover (its batches skipped on the rollback), not a divergence."""
    n = 600
    steps, loss, grad, lr = np.arange(n), loss_curve(n), grad_curve(n), np.full(n, 1e-3)
    lr[300:303] = 4e-3
    loss[301:] += 3.0
    grad[301:] *= 8.0
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr))
    loss_findings = [f for f in report.findings if f.kind in ("spike", "divergence") and f.severity != "info"]
    assert [(f.kind, f.evidence.get("lr_still_raised")) for f in loss_findings] == [("spike", False)], loss_findings


# 65. An excursion that never came back after a norm climbed into it is the divergence the climb announced.

def test_65_an_unrecovered_excursion_a_norm_climbed_into_is_a_divergence() -> None:
    """Real CPU training (fresh seed 448775's run 105): linear decay, an LR ramp from 914 that the decay hides (the
    LR never rises: x1.0 at the loss's onset), the final layer's weights creeping up with it. The activation norm
    climbs from 915; the loss leaves its band at 1016 and never comes back. The labeller: a divergence from 914,
    right checkpoint 912. runwatch advised 912 (before the norm's climb) but called it a spike from 1016: only an
    LR still raised or a climbing loss made an unrecovered excursion a divergence. A norm that had been climbing
    (x3, beyond its own block-to-block wander) before the loss moved is OPT's precursor, and the unrecovered
    excursion it ran into is the divergence it announced, from the climb's start. Fails on HEAD~1 (spike, 1016).
    Since test 82 the ramp itself is read off the decaying schedule's path: the onset is its first loss, 914, the
    labeller's."""
    report = _fresh_report("f448775-105")
    open_loss = [f for f in report.findings if f.kind in ("spike", "divergence") and f.severity == "critical"]
    assert [(f.kind, f.onset_step) for f in open_loss] == [("divergence", 914)], open_loss
    assert open_loss[0].evidence["act_norm_climb_step"] == 915 and open_loss[0].evidence["loss_climb_step"] == 1016
    assert open_loss[0].evidence["lr_rise_step"] == 913, open_loss[0].evidence
    assert report.rollback is not None and report.rollback.checkpoint_step == 912, report.rollback


def test_65_guard_an_unrecovered_jump_with_flat_norms_stays_a_spike() -> None:
    """No norm climbed before the loss jumped (a bad shard from which the run never recovers): a spike, its
    batches to skip on the rollback, not a divergence."""
    n = 600
    steps, loss, grad = np.arange(n), loss_curve(n), grad_curve(n)
    act = np.full(n, 5.0) + 0.05 * np.random.default_rng(1).standard_normal(n)
    loss[301:] += 3.0
    grad[301:] *= 8.0
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, act_norm=act, lr=np.full(n, 1e-3)))
    loss_findings = [f for f in report.findings if f.kind in ("spike", "divergence") and f.severity != "info"]
    assert [(f.kind, f.self_recovered) for f in loss_findings] == [("spike", False)], loss_findings


# 66. One bad batch does not blind the run's extreme-value tail to the next.

def test_66_a_second_bad_batch_is_seen_after_a_far_bigger_first() -> None:
    """Real CPU training (fresh seed 755048's run 084): fp16, cosine, a log every 2 steps; bad batches at 436 (loss
    1.08 -> 8.5, 51 sigmas) and 664 (0.91 -> 3.97, 21 sigmas). The first came straight back, a blip, and its block
    maximum entered the run's Gumbel tail, fitted by moments: one value of 51 among maxima of 2-3 put the bar past
    21 for the rest of the run, and the second bad batch went unseen. A blip enters the tail as high as the bar it
    passed: blips that recur still raise the bar (a heavy-tailed run), one cannot blind the run. Fails on HEAD~1
    (no finding at 664)."""
    steps, cols = _fresh_run("f755048-084")
    report = analyze(rows_table(steps, **cols))
    spikes = [f for f in report.findings if f.kind == "spike"]
    assert [f.onset_step for f in spikes] == [436, 664], spikes
    assert all(f.self_recovered and f.severity == "info" for f in spikes), spikes  # bad batches, back at once


def test_66_guard_a_heavy_tailed_run_still_raises_its_bar() -> None:
    """Blips that recur (a heavy-tailed loss: one observation at 9-10 sigmas every ~40) are the run's own tail:
    the bar rises past them and stops noting each one, as it did before the tail kept blips at the bar."""
    n = 3000
    steps, loss, grad = np.arange(n), loss_curve(n, noise=0.05), grad_curve(n)
    rng = np.random.default_rng(3)
    blips = np.arange(300, n, 40) + rng.integers(0, 8, len(range(300, n, 40)))
    loss[blips] += 0.05 * rng.uniform(9.0, 10.0, len(blips))
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=np.full(n, 1e-3)))
    noted = [f for f in report.findings if f.kind == "spike"]
    assert not [f for f in noted if f.severity != "info"], noted
    assert len(noted) < len(blips) / 4, (len(noted), len(blips))


# 67. The LR before a cause is the level in force since the LR's last step, not a median across a warm restart.

def test_67_a_burst_after_a_warm_restart_is_read_against_the_restarted_level() -> None:
    """Real CPU training (fresh seed 142542's run 144): fp16, cosine with warm restarts; the restart at 355 takes
    the LR x20 (6.6e-5 -> 1.3e-3), an LR burst x50 at 361-363 throws the loss 1.1 -> 10, back to its trend after
    145 steps; overflows pin the loss scale at 1 from 741. The labeller: a spike that comes back, then the
    collapse: the right checkpoint is 703. "The LR before" was the median of the 16 rows before the burst, 10 of
    them before the restart: the burst read as x956, and the restarted schedule after it as "still raised", a
    divergence advised back to 333. Fails on HEAD~1 (divergence from 362, checkpoint 333)."""
    report = _fresh_report("f142542-144")
    [burst] = [f for f in report.findings if f.onset_step == 362]
    assert (burst.kind, burst.self_recovered, burst.needs_action) == ("spike", True, False), burst
    assert burst.evidence["lr_before"] == pytest.approx(1.31e-3, rel=0.01) and not burst.evidence["lr_still_raised"]
    assert report.rollback is not None and report.rollback.checkpoint_step == 703, report.rollback


@pytest.mark.parametrize("case", ["restart", "drop", "burst_ended", "smooth"])
def test_67_guard_the_lr_before_is_the_level_in_force(case: str) -> None:
    """``lr_before`` over the 16 rows before an onset at row 400: after a step up (a warm restart x20) or down (a
    step schedule's x0.1) eight rows before, the level since the step; after a burst that ended, the level it came
    back to; on a smooth decay with no step, the median of the rows, as before."""
    n = 420
    steps = np.arange(n)
    lr = {"restart": np.where(steps < 392, 1e-4, 2e-3), "drop": np.where(steps < 392, 5e-3, 5e-4),
          "burst_ended": np.where((steps >= 388) & (steps < 391), 5e-2, 1e-3),
          "smooth": 1e-3 * (1.0 - steps / 1000.0)}[case]
    expected = {"restart": 2e-3, "drop": 5e-4, "burst_ended": 1e-3,
                "smooth": float(np.median(lr[383:399]))}[case]
    assert lr_before(steps, lr, 400, DEFAULT.lr) == pytest.approx(expected)


# 68. A second incident inside an excursion that came back is an incident of its own.

def test_68_a_bad_batch_in_an_lr_bursts_slow_tail_is_its_own_spike() -> None:
    """Real CPU training (fresh seed 930351's run 041): an LR burst x89 at 330 throws the loss 2.1 -> 609; it
    comes down over ~380 steps. At 510, on the way down, a bad batch: loss 21.5 -> 59.7, past everything the
    tail did in its last 16 observations by 6 of their own standard deviations. The labeller: a bad batch from
    510, 61 sigmas. Only a loss back in band before a new jump (``_fresh_excursion``) made a second incident;
    one still on its way down was the first one's. Fails on HEAD~1 (no finding from 510). Since test 118 it is an
    'info' annotation on the excursion already paged, as a lone bad batch is outside one."""
    steps, cols = _fresh_run("f930351-041")
    report = analyze(rows_table(steps, **cols))
    [outer] = [f for f in report.findings if f.onset_step == 331]
    nested = [f for f in report.findings if f.evidence.get("rule") == "nested"]
    assert outer.self_recovered and nested and nested[0].onset_step == 510, report.findings
    assert all(f.kind == "spike" and f.severity == "info" and not f.needs_action and
               outer.onset_step < f.onset_step <= outer.end_step for f in nested), nested
    assert "inside the excursion open since step 331" in nested[0].message
    _table_streams_alike(rows_table(steps, **cols), None, report.findings)


@pytest.mark.parametrize("shape", ["decay", "thrash"])
def test_68_guard_an_excursions_own_path_is_no_second_incident(shape: str) -> None:
    """An LR burst's loss coming down smoothly (noise growing with it) and one thrashing without coming back
    (test 26's real blow-up, 67 -> 189 at its worst) make no second incident: a jump must pass the excursion's
    own recent highest by 6 of its own swings, and inside an excursion that never came back everything is its."""
    n = 1200
    steps, loss, grad, lr = np.arange(n), loss_curve(n), grad_curve(n), np.full(n, 1e-3)
    lr[500:503] = 5e-2
    rng = np.random.default_rng(5)
    t = np.arange(n - 501)
    if shape == "decay":
        lift = 20.0 * np.exp(-t / 60.0)
        loss[501:] += lift * (1.0 + 0.2 * rng.standard_normal(len(t)))
    else:
        loss[501:] += np.exp(rng.normal(3.0, 0.6, len(t)))
    grad[501:] *= 5.0
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr))
    assert not [f for f in report.findings if f.evidence.get("rule") == "nested"], report.findings


# 69. A burst that ends straight into the schedule's warm restart is over: the restart is the schedule.

def test_69_a_burst_ending_into_a_warm_restart_is_not_still_raised() -> None:
    """Real CPU training (fresh seed 930351's run 082): cosine with warm restarts; an LR burst x1.2e3 at 292-295,
    whose last row is the cycle's low, and at 296 the restart back to the first cycle's peak (x19 the decayed LR
    before the burst). The loss 1.15 -> 15.8, back to its trend after 130 steps; NaN weights at 794. The
    labeller: a spike that comes back, then the NaN: the right checkpoint is 792. "Still raised" read the restarted
    schedule as the burst staying up: a divergence advised back to 264. A row stepped onto the highest level the
    run trained at before, not rising on, is the schedule's restart (``restart_slack``, as ``warm_restart``
    reads it). Fails on HEAD~1 (divergence from 293, checkpoint 264)."""
    report = _fresh_report("f930351-082")
    [burst] = [f for f in report.findings if f.onset_step == 293]
    assert (burst.kind, burst.self_recovered, burst.evidence["lr_still_raised"]) == ("spike", True, False), burst
    assert report.rollback is not None and report.rollback.checkpoint_step == 792, report.rollback


def test_69_guard_a_ramp_through_the_earlier_peak_stays_raised() -> None:
    """A ramp x1.02 a step from the cosine's decayed LR passes through the warm-up's peak on its way up: no step
    onto it, so no restart; still raised, a divergence."""
    n = 1100
    steps, loss, grad = np.arange(n), loss_curve(n), grad_curve(n)
    lr = np.interp(steps, [0, 200], [1e-5, 1e-3])
    lr[200:] = 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + np.cos(np.pi * np.clip((steps[200:] - 200) / 600, 0, 1)))
    lr[800:] = lr[799] * 1.02 ** np.arange(1, n - 799)
    loss[850:] += 0.02 * np.arange(n - 850)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr))
    [div] = [f for f in report.findings if f.kind in ("spike", "divergence") and f.severity != "info"]
    assert (div.kind, div.evidence["lr_still_raised"]) == ("divergence", True), div


# 70. A skip burst is over once its own rate is refuted: a later burst is a collapse of its own.

def test_70_a_second_skip_burst_after_the_first_is_over_is_a_collapse_of_its_own() -> None:
    """Real CPU training (fresh seed 537702's run 007): fp16, GradScaler (growth interval 713). An overflow every
    other step from 120 takes the scale 65536 -> 4096 in 4 skips; then 97 clean steps; from 224 every step
    overflows and the scale falls under 1. The labeller: two collapses. runwatch read one: the halving chain was
    kept open for ``patience_steps`` (200) after its last skip, and the skip-rate CUSUM, still holding about 9 of
    the first burst's 14 nats, dated the second burst's change point back to 120. 97 clean steps after a burst that
    skipped every other step would come with probability 0.5^97: that burst was over. Now it ends once
    (1 - its own rate)^m < 1e-3 (``burst_over_risk``), and no change point reaches back past a collapse already
    over. Fails on HEAD~1 (one collapse from 120)."""
    steps, cols = _fresh_run("f537702-007")
    report = analyze(rows_table(steps, **cols))
    collapses = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert [(f.onset_step, f.self_recovered) for f in collapses] == [(120, False), (224, False)], collapses
    assert collapses[1].evidence["below_floor"] and not collapses[0].evidence["below_floor"]
    _table_streams_alike(rows_table(steps, **cols), None, report.findings)


@pytest.mark.parametrize("skipped, first, last, now, over", [
    (4, 120, 127, 136, False),  # every other step (4 skips over 8 steps): 9 clean steps could still be its rate
    (4, 120, 127, 137, True),   # (0.5^9 = 2e-3); 10 cannot (9.8e-4)
    (10, 0, 199, 299, False),   # a sustained 1 in 20: 100 clean steps are 6e-3 likely at that rate
    (10, 0, 199, 335, True),    # ... 136 are under 1e-3
    (5, 10, 14, 15, True),      # every step skipped: one clean step ends it
    (5, 10, 14, 14, False),     # ... and none has come yet
])
def test_70_guard_a_burst_is_over_only_past_its_own_rate(skipped, first, last, now, over) -> None:
    from runwatch.detectors.scaler_collapse import burst_over
    assert burst_over(float(skipped), first, last, now, DEFAULT.scaler.burst_over_risk) is over


# 71. A spell within the host's own variability is the host's wander: the baseline learns it.

def test_71_a_wander_judged_normal_stays_in_the_slowdown_baseline() -> None:
    """Real CPU training on simulated noisy hosts (``tests/fixtures/fresh``), no fault in either run.
    Fresh seed 645321's run 002 wanders 4.4-6.2 s a step over the first 120 steps, then 7-8 s over 124-185. The
    slowdown baseline is ready after 8 observations (2% jitter), so the first wander opened an episode at step
    12, which was judged within the run's variability and reported as nothing; but its blocks were kept out of
    the baseline all the same, as were the next episode's, so the baseline never grew past those 8
    observations and the wander at 120 paged as 51% slower against 'normal variability 2%'. A spell judged
    within the run's own variability is in-control data (Phase I of a control chart drops only the points with
    an assignable cause): its blocks stay in the baseline. Seed 418024's run 113 opened a spell at step 9 over
    those same 2 blocks and followed it for 370 steps of ordinary wander: under 3 blocks the wander cannot be
    measured at all (no lag-1 pair), so nothing is judged beyond it. Fails on HEAD~1 (warnings at 120, and at
    9 and 389)."""
    for name in ("f645321-002", "f418024-113"):
        steps, cols = _fresh_run(name)
        assert not [f for f in _alarms(analyze(rows_table(steps, **cols))) if f.kind == "slowdown"], name
    # Guard: the host whose wander the baseline learned still pages on a real slowdown (x4 over 400-479). Its
    # bar is honest about what 400 steps show: a normal variability of 16% with a correlation time near 76
    # steps (block lag-1 ~0.9) is about 5 independent looks at the wander, so its sigma is known only to a
    # factor of ~1.9, and a spell of 80 steps must pass 4 of those sigmas: about x3.2 here.
    steps, cols = _fresh_run("f645321-002")
    dt = np.diff(cols["time"], prepend=cols["time"][0])
    dt[(steps >= 400) & (steps < 480)] *= 4.0
    slowed = {**cols, "time": cols["time"][0] + np.cumsum(dt)}
    report = analyze(rows_table(steps, **slowed))
    [slow] = [f for f in _alarms(report) if f.kind == "slowdown"]
    assert (slow.onset_step, slow.end_step) == (400, 479) and 1.8 <= slow.evidence["rise"] <= 3.0, slow
    _table_streams_alike(rows_table(steps, **slowed), None, report.findings)


# 72. A scaler at its ceiling with a short growth interval skips once an interval: its healthy rate.

def test_72_a_fast_sawtooth_at_the_ceiling_is_the_scalers_healthy_rate() -> None:
    """Real CPU training, the clean twin of fresh seed 608490's run 008 (``tests/fixtures/fresh``, no fault), its
    segment resumed from checkpoint 400 (steps 511-2497): fp16, GradScaler growth interval 20 (``run.json``),
    fp16's range above 65536, so the scale doubles to 131072, overflows and halves back once every 21 steps,
    for the whole run. The Bernoulli CUSUM's healthy rate p0 was capped at ``skip_rate`` / 2 (one skip in 40),
    under this sawtooth's one in 21, so the sum crept up a sixth of a nat a cycle and called the segment a
    collapse from step 529, 93 skips long and 'not recovered yet' (critical). A scaler at its ceiling holds its
    scale with one skip per growth interval: p0 = 1 / (interval + 1), and a collapse skips at least twice as often
    (the scale then falls a halving per interval, as fast as it would grow), where the run states its interval.
    Fails on HEAD~1 (a critical collapse from 529)."""
    steps, cols = _fresh_run("f608490-008-twin")
    meta = {"scaler": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 20}}
    assert not [f for f in analyze(rows_table(steps, **cols), meta=meta).findings if f.kind == "scaler_collapse"]
    # Guard: the same scaler skipping every 4th step from 700 on (over 5x its healthy rate), with the halving each
    # skip brings, collapses from 700 (or from the sawtooth's last skip before it, at 693).
    scale, flag = cols["loss_scale"].copy(), cols["found_inf"].copy()
    after = steps >= 700
    flag[after] = (steps[after] - 700) % 4 == 0
    scale[after] = scale[steps == 699][0] / 2.0 ** np.cumsum(flag[after])
    report = analyze(rows_table(steps, **{**cols, "loss_scale": scale, "found_inf": flag}), meta=meta)
    [collapse] = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert 690 <= collapse.onset_step <= 700 and collapse.needs_action, collapse  # or the sawtooth skip before it
    from runwatch.detectors.scaler_collapse import rates

    p0, p1 = rates(np.array([20.0, 999.0]), DEFAULT.scaler, known=True)
    assert np.allclose(p0, [1 / 21, 1e-3]) and np.allclose(p1, [2 / 21, DEFAULT.scaler.skip_rate])
    # A learned interval (the shortest regrowth seen) only bounds the real one: its p0 stays capped.
    p0, p1 = rates(np.array([20.0, 999.0]), DEFAULT.scaler, known=False)
    assert np.allclose(p0, [DEFAULT.scaler.skip_rate / 2, 1 / 999]) and np.allclose(p1, DEFAULT.scaler.skip_rate)


# 73. A shift with a lone far value in it is two pieces of noise, not a corroborated one.

def test_73_a_rebound_with_one_far_value_is_the_runs_wander() -> None:
    """Real CPU training, the clean twins of fresh seeds 448775's run 023 and 930351's run 015
    (``tests/fixtures/fresh``, no fault in either; batches of 15 and 19, so the loss is noisy). 448775's loss
    falls to ~0.7 by step 1900, rebounds to ~0.9-1.0 at 1926 and stays there for 250 steps; 930351's makes the
    same rebound at 1667 for ~200 steps. The CUSUM sees each shift (it is real), and a shift the CUSUM alone sees
    is training's own wander until something corroborates it: the LR raised, the gradient norm past its bar, or
    far-out values. Each rebound held one or two lone values past the single-observation bar, and one sufficed,
    so both paged as 'sustained loss rise'. A bar passed once in 10^4 observations is passed somewhere in a
    250-observation shift one time in 40, and a lone value past it is an 'info' blip on its own: far-out values
    corroborate as they would page alone, ``persist_obs`` in a row (or, once the shift has 16 rows of its own to be
    judged against, page alone: test 79). Fails on HEAD~1 (warnings at 1926, 1667)."""
    shifts = {}
    for name, onset in (("f448775-023-twin", 1926), ("f930351-015-twin", 1667)):
        steps, cols = _fresh_run(name)
        report = analyze(rows_table(steps, **cols))
        [shift] = [f for f in report.findings if f.kind == "spike" and f.onset_step == onset]
        assert (shift.severity, shift.evidence["rule"], shift.evidence["uncorroborated"]) == ("info", "cusum", True)
        assert shift.evidence["observations_far_out"] >= 1, shift  # the lone value(s) that used to corroborate it
        assert not [f for f in _alarms(report) if f.kind in ("spike", "divergence")], name
        shifts[name] = shift.evidence
    # Guard: two far values in a row inside the same rebound (a bad batch of two, 12 sigmas up) page, as they would
    # alone: an incident of their own, dated at the batch (test 79), the rebound before them still the run's wander.
    steps, cols = _fresh_run("f448775-023-twin")
    loss, ev = cols["loss"].copy(), shifts["f448775-023-twin"]
    loss[(steps == 1960) | (steps == 1961)] = ev["baseline_loss"] + 12 * ev["loss_sigma"]
    report = analyze(rows_table(steps, **{**cols, "loss": loss}))
    [paged] = [f for f in _alarms(report) if f.kind == "spike"]
    assert (paged.onset_step, paged.severity, paged.evidence["rule"]) == (1960, "warning", "shewhart"), paged
    [wander] = [f for f in report.findings if f.onset_step == 1926]
    assert wander.severity == "info" and wander.end_step < 1960, wander


# 74. The LR levels a resumed run trained at include its main line before the resume.

def test_74_a_warm_restart_after_a_resume_is_the_schedule() -> None:
    """Real CPU training, the clean twin of fresh seed 727123's run 143 (``tests/fixtures/fresh``, no fault):
    cosine with warm restarts from 0.00145, restarting at steps 398 and 707; segment 1 resumes from checkpoint 450.
    The restart at 707 takes the LR x19 back to the peak the run trained at after 398, and the loss rises with it
    as it does after every restart. The levels the run trained at were read from the segment's own rows only, which
    never held the peak, so the restart read as an LR raised off the schedule: 'loss diverged from step 708 ...
    learning rate x19 ... still up', critical. A resumed segment's detectors start from its parent's healthy
    history (the main line up to the resume step); the LR levels trained at are read from it too. Fails on
    HEAD~1 (that critical divergence)."""
    steps, cols = _fresh_run("f727123-143-twin")
    seg = cols.pop("segment").astype(int)
    events = _ckpts(list(range(45, 451, 45)), resume=(1, 450))
    report = analyze(rows_table(steps, seg, **cols), events)
    assert not [f for f in _alarms(report) if f.kind in ("spike", "divergence")], report.findings
    [rise] = [f for f in report.findings if f.kind == "spike" and f.onset_step == 708]
    assert rise.severity == "info" and rise.evidence["lr_scheduled"], rise
    # Guard: the same step up to 3x any level the run trained at is a raise, and the loss rise under it a divergence.
    lr = cols["lr"].copy()
    lr[(seg == 1) & (steps >= 707)] *= 3.0
    [div] = [f for f in _alarms(analyze(rows_table(steps, seg, **{**cols, "lr": lr}), events))
             if f.kind in ("spike", "divergence")]
    assert (div.kind, div.segment, div.onset_step, div.needs_action) == ("divergence", 1, 708, True), div


# 75. A norm's climb dated before an LR burst inside it began with the burst, unless it had risen before it.

@pytest.mark.parametrize("climb_from, rate", [(None, 1.0), (400, 1.004), (400, 1.006), (450, 1.008)])
def test_75_a_norm_climb_dated_before_the_burst_inside_it_begins_with_the_burst(climb_from, rate) -> None:
    """Real CPU training (fresh seed 142542's run 050, ``tests/fixtures/fresh``): logged every 10 steps, checkpoints
    every 47; an LR burst x150 at 690 throws the loss 1 -> 22 and it never comes back; an LR ramp from 920 blows it
    up to 74. The gradient norm is flat at 2-4 until 690. Its climb is found on blocks of 16 rows (160 steps here),
    and the walk back from the end passes a flat block beside a steep one, so the climb was dated at 490: a
    divergence from 490 and the advice checkpoint 470, 220 steps of healthy training thrown away (the right one is
    658). A norm "growing" before the LR event inside its climb is the fit's error, as with an LR rise: the climb
    begins with the burst's first consequence, unless the norm had already risen before the burst (its median over
    the 16 rows before it ``growth_z`` standard errors above its median before the dated start). Guard: the same
    run with both norms made to climb x1.004-1.008 a step from 400 or 450 up to the burst keeps that precursor as
    the onset, as before. Fails on HEAD~1 (onset 490, checkpoint 470). The ramp from 920, riding the cosine's decay,
    is a second cause inside the excursion, a divergence of its own (test 122)."""
    steps, cols = _fresh_run("f142542-050")
    events = _fresh_events("f142542-050-checkpoints.json")
    if climb_from is not None:
        lift = np.where(steps >= climb_from, rate ** (np.minimum(steps, 690) - climb_from), 1.0)
        cols = {**cols, "grad_norm": cols["grad_norm"] * lift, "act_norm": cols["act_norm"] * lift}
    report = analyze(rows_table(steps, **cols), events)
    div, *inside = sorted(_alarms(report), key=lambda f: f.onset_step)
    assert [(f.evidence["rule"], f.onset_step) for f in inside] == [("lr_raise_inside", 920)], report.findings
    assert (div.kind, div.severity) == ("divergence", "critical"), div
    if climb_from is None:
        assert div.onset_step == 690 and div.evidence["lr_rise_step"] == 690, div
        assert report.rollback is not None and report.rollback.checkpoint_step == 658, report.rollback
    else:  # the climb, dated within a block of 16 rows of where it began
        assert climb_from <= div.onset_step <= climb_from + 160 and div.onset_step < 690, div
        assert report.rollback is not None and report.rollback.checkpoint_step < div.onset_step, report.rollback


# 76. Only the main-line part of an incident can make a checkpoint unhealthy.

def test_76_an_incident_on_an_abandoned_branch_does_not_refuse_the_resumed_segments_checkpoint() -> None:
    """Real CPU training (fresh seed 418024's run 095, ``tests/fixtures/fresh``, both segments): fp16, checkpoints
    every 80. NaN weights from step 143; at 160 the run was rolled back to checkpoint 80, skipping batches, so the
    resumed segment's first step is 138; an LR jump x68 at 178 then makes it diverge from 179. The NaN lies on the
    abandoned branch (steps 81-160 of segment 0), and the resumed segment saved its own checkpoint 160, healthy:
    the right advice is 160. Each checkpoint was judged against every finding by step number alone, so the
    abandoned NaN's 143-160 held the resumed segment's 160 and the advice went back to 80, 80 steps of healthy
    training thrown away. Fails on HEAD~1 (checkpoint 80). Guard: the part of the NaN a resume keeps on the main line
    still refuses a checkpoint inside it."""
    steps, cols = _fresh_run("f418024-095")
    seg = cols.pop("segment").astype(int)
    events = json.loads((FIXTURES / "fresh" / "f418024-095-events.json").read_text())
    report = analyze(rows_table(steps, seg, **cols), events_table(events))
    [nan] = [f for f in report.findings if f.kind == "nan"]
    assert (nan.segment, nan.onset_step, nan.open) == (0, 143, False), nan
    [div] = [f for f in report.findings if f.needs_action and f.open]
    assert (div.kind, div.segment, div.onset_step) == ("divergence", 1, 179), div
    assert report.rollback is not None and report.rollback.checkpoint_step == 160, report.rollback
    # Guard: the part of an incident a resume keeps on the main line still holds a checkpoint. The same rows with
    # the rollback moved to a checkpoint at 150 (segment 1's rows from 151, without its checkpoint 160), and the NaN
    # rows made finite (the values before 143), so that what holds checkpoint 150 is the incident, the loss scale's
    # collapse from 143 (its halvings stay), not a non-finite row: its 143-150 are the main line's.
    moved = [e for e in events if e["event"] == "checkpoint" and e["step"] != 160] + [
        {"event": "checkpoint", "step": 150, "segment": 0, "payload": {"path": "/ckpt/150"}},
        {"event": "resume", "step": 150, "segment": 1, "payload": {"from_step": 150}}]
    keep = (seg == 0) | (steps > 150)
    bad = (seg == 0) & (steps >= 143)
    finite = {k: np.where(bad, np.nanmedian(v[(seg == 0) & (steps < 143)]), v) if k in ("loss", "grad_norm", "act_norm")
              else v for k, v in cols.items()}
    report = analyze(rows_table(steps[keep], seg[keep], **{k: v[keep] for k, v in finite.items()}), events_table(moved))
    assert report.rollback is not None and report.rollback.checkpoint_step == 80, report.rollback
    why = {r["step"]: r["why"] for r in report.rollback.evidence["rejected_checkpoints"]}
    assert why[150] == "inside the scaler_collapse from step 143", why


# 77. A halving chain is a collapse when its skips come faster than the scaler's healthy rate explains.

def _wandering_sawtooth(tooth: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """A healthy GradScaler logged every 100 steps, growth interval 1000: it lives at 8192 and 4096, regrows to
    16384 now and then and overflows there at once (so most of its halvings start from 16384), then ``tooth``."""
    cycle = [8192.0] * 10 + [16384.0] + [8192.0] * 10 + [16384.0] + [8192.0] * 6 + [4096.0] * 10
    scale = cycle * 12 + tooth + [2048.0] * 10 + [4096.0] * 10 + cycle * 4
    return np.arange(len(scale), dtype=np.int64) * 100, np.array(scale)


def test_77_a_deep_tooth_of_a_healthy_sawtooth_is_no_collapse() -> None:
    """bench/calibrate.py, draw 1 (seed 1), run sim-004: a healthy scaler logged every 100 steps, growth interval
    1000, its level wandering between 4096 and 16384. Three times in 10^7 steps a tooth went from its peak 16384 to
    1024 and regrew: four overflows ~500-700 steps apart, each before the scale could regrow. 'loss scale collapsed
    ... 16384 -> 1024, 4 steps skipped': three of draw 1's six false alarms (1.95 per 10^6 logged steps, over the
    budget). A chain of halvings with no growth in between counted as a collapse at 2^4 whatever its pace; four
    skips in ~1900 steps, where the healthy rate (one per growth interval) expects 1.9, is a 1-in-8 Poisson tail.
    A chain is now a collapse only if some run of its latest halvings came too fast for the healthy rate
    (``ScalerConfig.chain_risk``). Fails on HEAD~1 (a collapse from 48600). Guards: the same four halvings one logged
    row (100 steps) apart are a collapse; so is an ordinary overflow followed, before the scale regrew, by three
    halvings within one row (the run of the latest ones is what came too fast); and a slide at twice the healthy
    rate down to under 1 is one."""
    from runwatch.detectors.scaler_collapse import detect_scaler_collapse

    meta = {"scaler": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1000}}
    tooth = [8192.0] * 10 + [16384.0] + [8192.0] * 5 + [4096.0] * 7 + [2048.0] * 7 + [1024.0] * 10
    assert detect_scaler_collapse(*_wandering_sawtooth(tooth), meta=meta) == []
    fast = [8192.0] * 10 + [16384.0, 8192.0, 4096.0, 2048.0] + [1024.0] * 10
    [collapse] = detect_scaler_collapse(*_wandering_sawtooth(fast), meta=meta)
    assert (collapse.onset_step, collapse.evidence["halvings"]) == (46700, 4.0), collapse
    burst = [8192.0] * 10 + [16384.0] + [8192.0] * 5 + [1024.0] * 10
    [collapse] = detect_scaler_collapse(*_wandering_sawtooth(burst), meta=meta)
    # Dated at the burst, not at the ordinary overflow before it.
    assert (collapse.onset_step, collapse.evidence["scale_min"]) == (47200, 1024.0), collapse
    slide = [8192.0 / 2.0 ** (k // 5) for k in range(5 * 16)]  # a halving per 500 steps, down to 0.25
    found = detect_scaler_collapse(*_wandering_sawtooth(slide), meta=meta)
    assert found and found[0].onset_step == 46100 and any(f.evidence["below_floor"] for f in found), found


# 78. A loss climb is judged in the run's noise, not in the noise of the calm block it is measured from.

def test_78_a_batch_1_runs_return_from_a_calm_low_block_is_no_divergence() -> None:
    """Real CPU training, the clean twin of fresh seed 608490's run 003 (``tests/fixtures/fresh``, no fault): fp32,
    batch 1, linear decay, 1586 steps. A batch-1 loss is one sample's: its blocks of 16 have medians that wander 0.2-5
    and a per-step noise (1.4826 MAD) near 2. The climb rule measures a rise from the lowest block median seen (the best
    level), in that block's own noise, and the lowest block is also a calm one (a loss's spread shrinks with its level):
    one at 0.31 with a noise of 0.48, a fifth of the run's 2.3 in the blocks before it, made the loss's return to its
    usual level a 'divergence from 1329, 0.3058 -> 13.24' (a warning; three of the fresh seeds' clean twins had one, one
    of them critical). The best level's noise is now never under the run's noise in the blocks before it. Fails on
    HEAD~1 (a divergence from 1329). Guards: the same run with its loss made to climb x1.01 a step from step 1000 is
    still a critical divergence, dated within 32 steps of 1000, and so is a slow climb on a steady run."""
    steps, cols = _fresh_run("f608490-003-twin")
    cols.pop("time")
    assert not _alarms(analyze(rows_table(steps, **cols)))
    lift = np.where(steps >= 1000, 1.01 ** (steps - 1000), 1.0)
    [div] = _alarms(analyze(rows_table(steps, **{**cols, "loss": cols["loss"] * lift})))
    assert (div.kind, div.severity) == ("divergence", "critical") and 1000 <= div.onset_step <= 1032, div
    # And the floor is the run's noise, no more: on a steady run a slow climb of 10 of its sigmas over 600 steps is
    # still a critical divergence from 1000 (a floor of 3x the run's noise misses it).
    n = 1600
    steady = loss_curve(n) + np.where(np.arange(n) >= 1000, 0.3 * (np.arange(n) - 1000) / 600, 0.0)
    [div] = _alarms(analyze(rows_table(np.arange(n), loss=steady, grad_norm=grad_curve(n))))
    assert (div.kind, div.severity) == ("divergence", "critical") and 1000 <= div.onset_step <= 1032, div


# 79. A far-out observation soon after a slow rise's CUSUM alarm is an incident of its own.

def test_79_a_bad_batch_just_after_a_slow_rise_is_found_is_its_own_spike() -> None:
    """Real CPU training, fresh seed 475967's run 049 (``tests/fixtures/fresh``): fp32, batch 31, cosine with warm
    restarts, logged every 5 steps. After the restart the loss rises slowly from ~1285 (the clean twin's too); the
    slow CUSUM alarms at 1440, and nine rows later, at 1485, a bad batch throws the loss 1.0 -> 9.5 for one row
    (labelled 45 sigmas). A second incident inside an episode is tested against the episode's own last 16 rows,
    which were taken only from after its alarm: nine rows in, the bad batch had no window to be tested against and
    was the rise's peak, nothing of its own. The rows since the episode began are the episode's too. Fails on
    HEAD~1 (no finding from 1485)."""
    steps, cols = _fresh_run("f475967-049")
    loss_findings = [f for f in analyze(rows_table(steps, **cols)).findings if f.kind in ("spike", "divergence")]
    [rise] = [f for f in loss_findings if f.onset_step == 1285]
    [batch] = [f for f in loss_findings if f.onset_step == 1485]
    assert rise.end_step < 1485 and batch.evidence["rule"] == "shewhart" and batch.self_recovered, loss_findings


def test_79_guard_a_slow_rise_is_one_incident() -> None:
    """A smooth rise the CUSUM finds (a hump of 10 sigmas over 300 steps) has no second incident in it (its own
    rows climb, none jumps past them by the bar in their own spread) and is dated at its start."""
    n = 1200
    steps = np.arange(n)
    hump = np.where((steps >= 600) & (steps < 900), 0.3 * np.sin(np.pi * (steps - 600) / 300), 0.0)
    [rise] = analyze(rows_table(steps, loss=loss_curve(n) + hump, grad_norm=grad_curve(n))).findings
    assert rise.kind == "spike" and 600 <= rise.onset_step <= 605 and rise.end_step >= 800, rise


# 80. When two of the bank's CUSUMs alarm at once, the one whose change point explains the rows better dates it.

def test_80_a_short_bad_batch_after_a_drift_is_dated_at_the_batch() -> None:
    """Real CPU training, fresh seed 9881's run 107: fp16, batch 6. The loss drifts up about one sigma over
    354-400 (the clean twin's drift: the runs are identical until the fault), then a bad batch of five steps at
    401-405 lifts it 2x. Both CUSUMs of the bank alarm at 405; the slow one's last zero is 353, the burst's 400.
    The onset came from the slow one (listed first): 'sustained loss rise from step 354', 47 steps before the
    labelled bad batch. The generalised likelihood ratio of a shift from each zero (S^2 / 2m) picks the burst's.
    Fails on HEAD~1 (onset 354). Since the forty-fourth round the burst CUSUM alarms alone, at 404 (three rows near
    the clip, ``burst_h`` 5.9); at the interval of 8 both alarm at 405 and the burst's zero explains the rows better
    by far more than ``change_point_margin`` (GLR ~37 against ~26): the later zero still wins there."""
    steps, cols = _fresh_run("f9881-107")
    for burst_h in (DEFAULT.spike.burst_h, 8.0):
        config = replace(DEFAULT, spike=replace(DEFAULT.spike, burst_h=burst_h))
        report = analyze(rows_table(steps, **cols), config=config)
        [spike] = [f for f in report.findings if f.kind in ("spike", "divergence")]
        assert (spike.kind, spike.onset_step, spike.evidence["rule"]) == ("spike", 401, "burst"), (burst_h, spike)
    # The CUSUMs' sums and zeros carry over between passes: the same choice.
    _table_streams_alike(rows_table(steps, **cols), None, analyze(rows_table(steps, **cols)).findings)


@pytest.mark.parametrize("shift", [0.06, 0.09])
def test_80_guard_a_sustained_shift_keeps_its_start(shift: float) -> None:
    """A sustained shift of 2 or 3 sigmas from step 800 is dated at 800 whichever CUSUM dates it (where both alarm
    together, as on test 79's gradual rise, the two zeros explain the rows alike and the earlier dates it)."""
    n = 1200
    steps = np.arange(n)
    [found] = analyze(rows_table(steps, loss=loss_curve(n) + np.where(steps >= 800, shift, 0.0),
                                 grad_norm=grad_curve(n))).findings
    assert (found.kind, found.onset_step) == ("spike", 800), found


# 81. A norm climb the loss fell through is learning, judged with the power the climb's length gives.

def test_81_a_noisy_runs_learning_is_no_precursor_and_the_checkpoint_before_a_collapse_is_advised() -> None:
    """Real CPU training, fresh seed 795446's run 039: fp16, batch 3, a 41-step warm-up; the activation norm grows
    2.6 -> 6.6 over steps 42-247 as the model learns (the loss 3.9 -> 3.1, its step-to-step noise ~0.7), then the
    loss scale collapses from 248 (every other step skipped). The walk back asked whether the loss fell through
    the climb on 16 values at each end: 1.9 standard errors, not learning, so every checkpoint after 41 was
    refused ("activation-norm growth from step 42") and the advice threw away 200 steps of healthy training.
    On quarters of the climb the fall is 5.6 standard errors and 20% of the loss: the advice is checkpoint 246.
    Fails on HEAD~1 (checkpoint 41). Guards: a norm that doubles while the loss falls under 1% is still OPT's
    precursor, however significant the fall over a long climb (``test_advisor_walkback``'s climb over 750
    steps; test 37's LR ramp, whose seed 4 lost its alarm to quarters without the floor)."""
    report = _fresh_report("f795446-039")
    [collapse] = [f for f in report.findings if f.needs_action]
    assert (collapse.kind, collapse.onset_step) == ("scaler_collapse", 248), collapse
    assert report.rollback is not None and report.rollback.checkpoint_step == 246, report.rollback.reason
    assert "act_norm_growth_from" not in report.rollback.evidence, report.rollback.evidence


# 82. An LR ramp riding a decaying schedule is a rise against the schedule's path, though the LR never rises.

def test_82_a_ramp_on_a_decaying_cosine_is_the_cause_and_the_advice_precedes_it() -> None:
    """Real CPU training, fresh seed 495323's run 039: a cosine after a 224-step warm-up, a log every 5 steps,
    checkpoints every 39; from step 899 the LR is multiplied x1.005 a step. The cosine falls 0.35% a step, so the
    logged LR keeps falling (0.00112 at 895, 0.00110 at 905) and no row stands above an earlier one: the search
    for an LR rise over its lowest point found none, the divergence was dated at the norms' climb (925) and the
    advice was checkpoint 897, which holds updates made under the ramp. Log LR's slope steps up at the ramp's
    first row (-0.0035 -> -0.0010 a step, where the cosine bends it by 0.00007 a row), and carried forward from
    before that kink the schedule's path lies x2.5 below the LR by the last row: a rise, the cause. The onset is
    its first loss, 900, and the advice 858. Fails on HEAD~1 (checkpoint 897)."""
    report = _fresh_report("f495323-039")
    [div] = [f for f in report.findings if f.needs_action]
    assert (div.kind, div.onset_step) == ("divergence", 900), div
    assert report.rollback is not None and report.rollback.checkpoint_step == 858, report.rollback.reason


def _schedule(kind: str, n: int) -> np.ndarray:
    """A decaying schedule's LR per step, read back through float32 as a log stores it."""
    t = np.arange(n)
    lr = {"cosine": 1e-3 * 0.5 * (1 + np.cos(np.pi * t / n)),
          "cosine_floor": 1e-4 + 9e-4 * 0.5 * (1 + np.cos(np.pi * np.minimum(t, 0.75 * n) / (0.75 * n))),
          "linear": 1e-3 * (1 - t / (n + 1)), "exponential": 1e-3 * 0.999 ** t,
          "step": np.where(t < n // 2, 1e-3, 1e-4)}[kind]
    return lr.astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("kind", ["cosine", "cosine_floor", "linear", "exponential", "step"])
def test_82_guard_a_schedule_alone_is_no_rise(kind: str) -> None:
    """No schedule stands off its own path, wherever the onset asked about is: a cosine into its floor flattens
    its slope on every row and its LR rises above the path carried forward, but smoothly: no kink to start from."""
    n = 2000
    steps, lr = np.arange(n), _schedule(kind, n)
    assert [o for o in range(300, n - 1, 7) if lr_rise_start(steps, lr, o, DEFAULT.lr, until=n - 1) is not None] == []


@pytest.mark.parametrize("kind, rate", [("cosine", 1.002), ("cosine_floor", 1.001), ("linear", 1.0015),
                                        ("exponential", 1.0005)])
def test_82_a_slow_ramp_on_each_decaying_schedule_is_a_rise_from_its_first_row(kind: str, rate: float) -> None:
    """A ramp too slow to lift the LR 1.5x over its lowest point within the data, on each decaying schedule, is a
    rise from its first raised row (901), asked at its first consequences and later. Fails on HEAD~1 (no rise).
    (A ramp of x1.001 on the x0.999 decay, as this test had until test 122, holds the logged LR all but flat, 1e-6
    a step, at ``KINK_FLOOR``: the LR column reads that as the decay reaching a floor, which is the schedule.)"""
    n = 2000
    steps, lr = np.arange(n), _schedule(kind, n)
    ramp = lr * np.where(steps >= 900, rate ** (steps - 900), 1.0)
    assert [lr_rise_start(steps, ramp, o, DEFAULT.lr, until=n - 1) for o in (905, 950, 980)] == [901] * 3


# 83. An unrecovered spike's LR cause bounds the advice: no checkpoint holding an update under it.

def test_83_the_advice_precedes_the_first_consequence_of_an_unrecovered_spikes_lr_cause() -> None:
    """Real CPU training, fresh seed 160396's run 005: fp16, a multistep schedule, a log every 2 steps, checkpoints
    every 109; an LR burst x79 from step 545, first logged at 546, throws the loss out from 548 and it does not come
    back. The spike's cause analysis dated the trend's break at 546 (the burst's first logged row: on a coarse log
    the raise may be older than that row's step, so the loss there can carry it), but the advice was bounded by
    the loss's onset only: checkpoint 545, which holds an update made under the burst. The advice now precedes
    where the trend broke as well: 436, the labeller's. Fails on HEAD~1 (checkpoint 545)."""
    report = _fresh_report("f160396-005")
    [spike] = [f for f in report.findings if f.needs_action]
    assert (spike.kind, spike.onset_step, spike.evidence["trend_break_step"]) == ("spike", 548, 546), spike
    assert report.rollback is not None and report.rollback.checkpoint_step == 436, report.rollback.reason


def test_83_guard_on_a_per_step_log_the_checkpoint_before_the_raise_is_advised() -> None:
    """Logged every step, an LR burst x80 at 600-603 is first logged at 600 and first answered by the loss of 601:
    checkpoint 600 holds an update under it, 599 none. The advice is 599, as before."""
    n = 1000
    steps, loss, grad = np.arange(n), loss_curve(n), grad_curve(n)
    lr = np.where((steps >= 600) & (steps <= 603), 0.08, 1e-3)
    loss[601:] += 3.0
    grad[601:] *= 8.0
    ckpts = events_table([{"event": "checkpoint", "step": s, "payload": {"path": f"ckpt/{s}"}} for s in (550, 599, 600)])
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr), ckpts)
    [spike] = [f for f in report.findings if f.needs_action]
    assert (spike.onset_step, spike.evidence["trend_break_step"]) == (601, 601), spike
    assert report.rollback is not None and report.rollback.checkpoint_step == 599, report.rollback.reason


# 84. The loss at an LR step's own row was computed before the step's first update: no consequence of it.

def test_84_an_excursion_opened_at_the_lr_steps_own_row_begins_with_its_first_consequence() -> None:
    """Real CPU training, fresh seed 433315's run 138: batch 1, logged every step, checkpoints every 37; an LR
    burst x107 at 149-152. The loss at 149 is 9.2 (3.4 of the run's sigmas; the clean twin logs the same 9.2 there:
    a batch-1 loss), so the excursion the burst throws from 150 opened at 149, and the advice had to precede the
    last healthy row before it: checkpoint 111, where 148 holds no update under the burst. The record logs at step
    s the LR of update s and the loss computed before it, so on a per-step stretch the loss at the step's own row
    cannot carry it: the excursion begins with its first consequence, 150, and the advice is 148. Fails on HEAD~1
    (onset 149, checkpoint 111)."""
    report = _fresh_report("f433315-138")
    first = min((f for f in report.findings if f.needs_action), key=lambda f: f.onset_step)
    assert (first.kind, first.onset_step) == ("spike", 150), first
    assert report.rollback is not None and report.rollback.checkpoint_step == 148, report.rollback.reason


@pytest.mark.parametrize("log_every", [1, 2])
def test_84_the_steps_own_row_opens_the_excursion_only_where_it_can_carry_it(log_every: int) -> None:
    """A per-step log: the loss at the LR step's row (1000) happens to be far out, the loss is up from 1001; the
    onset is 1001 and checkpoint 999 is advised (it holds no update under the step; HEAD~1: onset 1000, checkpoint
    900). The guard, a log every 2 steps: the step is first logged at 1000, so update 999 may already have been
    under it and the loss at 1000 can carry it; that row stays the onset, and 999 is refused."""
    n = 1600
    steps = np.arange(0, n, log_every)
    loss, grad = loss_curve(n)[steps], grad_curve(n)[steps]
    lr = np.where(steps >= 1000, 5e-3, 1e-3)
    loss[steps == 1000] += 1.0
    loss[steps > 1000] += 3.0
    grad[steps > 1000] *= 8.0
    ckpts = events_table([{"event": "checkpoint", "step": s, "payload": {"path": f"ckpt/{s}"}} for s in (900, 999)])
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr), ckpts)
    first = min((f for f in report.findings if f.needs_action), key=lambda f: f.onset_step)
    assert first.onset_step == (1001 if log_every == 1 else 1000), first
    assert report.rollback is not None and report.rollback.checkpoint_step == (999 if log_every == 1 else 900)


# 85. A cold excursion's baseline is frozen at its onset, not at its trigger.

# BLOOM-176B's first loss spike (../shared/realruns, tr11-176B-ml chronicles, lines 202-213): an excerpt of 11
# rows, out at 31215-31222 and back at 31250-31251 (the log has a gap there), "recovered in ~30 iterations".
BLOOM_STEPS = np.array([31214, 31215, 31216, 31217, 31218, 31219, 31220, 31221, 31222, 31250, 31251])
BLOOM_LOSS = np.array([2.198845, 2.220424, 2.595213, 2.241558, 2.345279, 5.098124, 3.492029, 3.213059, 2.804948,
                       2.215699, 2.235667])
BLOOM_GRAD = np.array([0.242, 0.947, 2.390, 15.886, 145.119, 960.351, 353.201, 379.330, 650.246, 0.267, 0.205])


def test_85_a_cold_excursion_is_judged_against_the_rows_before_its_onset() -> None:
    """Before a noise model exists (the segment's first rows) a spike is judged against the median of the rows
    before it. The episode froze that cold baseline at its trigger (31219), the median of rows the excursion had
    already lifted: "loss 2.242 -> 5.098, grad norm 2.39 -> 960", and the gradient norm, 4x at 31215 while the
    loss had not moved, was not read as moving first. Frozen at the onset (31215): 2.199 and 0.242, grad norm
    first. Fails on HEAD~1."""
    [f] = analyze(rows_table(BLOOM_STEPS, loss=BLOOM_LOSS, grad_norm=BLOOM_GRAD)).findings
    assert (f.kind, f.onset_step) == ("spike", 31215), f
    assert f.evidence["baseline_loss"] == pytest.approx(2.198845), f.message
    assert f.evidence["baseline_grad_norm"] == pytest.approx(0.242), f.message
    assert f.evidence["grad_norm_moved_first"], f.message


# 86. The patience runs out only while the excursion is out of band.

@pytest.mark.parametrize("every,out_rows,back_rows,critical", [(1, 8, 2, False), (1, 20, 2, True), (25, 7, 5, True)])
def test_86_rows_back_in_band_at_the_end_are_a_recovery_under_way(every: int, out_rows: int, back_rows: int,
                                                                   critical: bool) -> None:
    """A per-step log: an excursion out for 8 rows (7 steps), a gap in the log, then 2 rows back in band where the
    data ends. The patience (16 rows, or 16 steps over more than ``recovery_obs`` rows) was counted to the last
    row, so the gap and the rows back in band made it critical, "not back to its trend", and the on-call engineer
    was told to restart (BLOOM's excerpt above, which came back by itself). Out is now up to the last row out of
    band: a warning, not back yet (``self_recovered`` None). Fails on HEAD~1. Guards: out for 20 rows, past the
    patience, before the 2 rows back; and a log every 25 steps, out for 7 rows (150 steps, past the patience in
    steps) and back for 5 when the data ends (more than ``recovery_obs`` rows since the onset): both critical."""
    n_out = 300 + out_rows
    rows = np.concatenate([np.arange(n_out), n_out + 28 // every + np.arange(back_rows)])
    steps = rows * every
    loss, grad = loss_curve(int(rows[-1]) + 1)[rows], grad_curve(int(rows[-1]) + 1)[rows]
    loss[300:n_out] += 3.0
    grad[300:n_out] *= 10.0
    [f] = analyze(rows_table(steps, loss=loss, grad_norm=grad)).findings
    assert f.kind == "spike" and f.onset_step == 300 * every, f
    expect = ("critical", False, True) if critical else ("warning", None, False)
    assert (f.severity, f.self_recovered, f.needs_action) == expect, f.message


# 87. A jump that both rules see at once is dated by the Shewhart rule, not by the CUSUM's last zero.

@pytest.mark.parametrize("seed", [0, 1])
def test_87_a_far_out_row_that_tips_a_cusum_over_is_a_spike_at_that_row(seed: int) -> None:
    """A lift of 2 noise sigmas for 30 rows that the CUSUM sums but never alarms on (the guard: no finding), then
    one row 50 sigmas out. The CUSUM crossed on that row (clipped at ``winsor``, it adds its most there) and was
    tested first, so its last zero dated the excursion 30 rows back and called it "a sustained loss rise ... a
    small shift alone: no observation far out" (fresh seed 719649's run 031: a bad batch 70 sigmas out at 1592
    dated 1543, and the labelled spike missed; the same reading made one of the clean twins' alarms, 341363's run
    070). The row passes the Shewhart bar: a one-step spike at that row. Fails on HEAD~1 (onset 610, cusum)."""
    n = 1000
    loss, grad = loss_curve(n, seed=seed), grad_curve(n, seed=seed + 10)
    loss[610:640] += 2.0 * 0.03
    assert analyze(rows_table(np.arange(n), loss=loss, grad_norm=grad)).findings == []
    loss[640] += 1.5
    [f] = analyze(rows_table(np.arange(n), loss=loss, grad_norm=grad)).findings
    assert (f.kind, f.onset_step, f.evidence["rule"], f.severity) == ("spike", 640, "shewhart", "info"), f.message


# 88. An excursion that alarmed only after an LR raise began is not dated before the raise, unless the rows before it
# were lifted already.

def test_88_an_excursion_that_alarmed_after_an_lr_raise_is_dated_at_its_first_consequence() -> None:
    """Real CPU training (fresh seed 158901's run 081, ``tests/fixtures/fresh``, the main line): fp16 on a noisy host,
    resumed from checkpoint 430, checkpoints every 86; the LR grows from 776 and the loss blows up (NaN at 1072). The
    CUSUM, alarming only after the raise, dated the change at its last zero: a divergence from 763, 13 steps before
    its cause, and checkpoint 688 advised. The rows 763-776 do not stand out from the level by themselves (under
    ``growth_z`` standard errors), so the raise's first consequence is the onset: 777, and checkpoint 774, the last
    whose every update ran under the old LR. Fails on 19f7601, before the rule (763, 688)."""
    steps, cols = _fresh_run("f158901-081")
    seg = cols.pop("segment").astype(int)
    events = _ckpts(list(range(86, 431, 86)) + list(range(516, 1291, 86)), resume=(1, 430))
    report = analyze(rows_table(steps, seg, **cols), events)
    [div] = [f for f in report.findings if f.kind == "divergence"]
    assert (div.segment, div.onset_step, div.needs_action) == (1, 777, True), div
    assert report.rollback is not None and report.rollback.checkpoint_step == 774, report.rollback


@pytest.mark.parametrize("seed", range(3))
def test_88_guard_rows_lifted_before_the_raise_keep_the_onset(seed: int) -> None:
    """A lift of 4 noise sigmas from row 600, a far rise on top from 606, and the LR doubled from 603: the alarm came
    after the raise, but the three rows before it stood 4 sigmas up, a lift of their own (a review's case: the
    first version of the rule dated it 604 and advised checkpoint 602, inside the lift). The onset stays with the
    lift and the advice before it: checkpoint 598. Fails on 430ce70, the rule's first version (every seed), and on
    7f7a1ad, before it (seed 0: another rule dated it 604)."""
    n = 1000
    loss, grad = loss_curve(n, seed=seed), grad_curve(n, seed=seed + 10)
    lr = np.full(n, 1e-3)
    lr[603:] *= 2.0
    loss[600:] += 0.12
    loss[606:] += 0.5
    report = analyze(rows_table(np.arange(n), loss=loss, grad_norm=grad, lr=lr), _ckpts([500, 590, 598, 602]))
    [f] = report.findings
    assert f.onset_step <= 602 and report.rollback.checkpoint_step == 598, (f, report.rollback)


@pytest.mark.parametrize("seed", range(3))
def test_88_guard_an_excursion_that_alarmed_before_the_raise_keeps_its_onset(seed: int) -> None:
    """A lift of 3 noise sigmas from row 600, which the CUSUM alarms on by itself by row 621, then the LR x3 from
    640: the lift began at 600 and the raise came after the alarm, so the onset stays 600. The baseline follows the
    lift and calls it back after 24-32 rows; a rise out again from the raise's first consequence on (641) is an
    incident of its own (a cause between, test 106), one that began before the raise the same one's tail. A CUSUM's
    zero dates the lift within a row of its start: its first row reads under the burst CUSUM's reference (2 sigmas)
    about one time in six, and where that CUSUM alarms first (from 3 rows at the clip, test 123) it dates it 601."""
    n = 1000
    loss, grad = loss_curve(n, seed=seed), grad_curve(n, seed=seed + 10)
    lr = np.full(n, 1e-3)
    lr[640:] *= 3.0
    loss[600:] += 0.09
    f, *later = analyze(rows_table(np.arange(n), loss=loss, grad_norm=grad, lr=lr)).findings
    assert abs(f.onset_step - 600) <= 1 and f.evidence["trigger_step"] < 640, f
    assert all(g.onset_step >= 641 and g.severity == "info" for g in later), later


# 89. A raise whose effect grows is judged over the latest rows too.

def test_89_a_raise_whose_effect_shows_in_the_latest_rows_is_a_divergence() -> None:
    """Real CPU training (fresh seed 444131's run 055, ``tests/fixtures/fresh``): fp32, batch 1, a step schedule,
    checkpoints every 75; the LR grows off the schedule from 1092, x70 by the last row (1230), and the loss,
    whose batch-1 noise spans 0.4-3.5, moves only over the last ~15 rows. The change-point test compared the
    median of the last 64 rows with the level before: 64 rows of which 50 are unmoved, nothing found, and no
    advice. The latest 8, 16 and 32 rows are looked at too (``DivergenceConfig.lr_shift_windows``): a divergence
    from 1093, the raise's first consequence, and checkpoint 1050. Fails on 82a8367 (no finding)."""
    report = _fresh_report("f444131-055")
    [div] = [f for f in report.findings if f.kind == "divergence"]
    assert (div.onset_step, div.needs_action, div.evidence["rule"]) == (1093, True, "lr_change_point"), div
    assert div.evidence["lr_ratio"] > 50, div.evidence
    assert report.rollback is not None and report.rollback.checkpoint_step == 1050, report.rollback


@pytest.mark.parametrize("live", [False, True])
def test_89_guard_a_harmless_step_raise_is_not_looked_at_again_with_every_row(live: bool) -> None:
    """A review's case: the loss 2 + exp(-t/300) with Gaussian noise of 0.3 (seed 76), the LR doubled at 900 and kept
    there, the loss untouched. Windows ending at the last row are new looks with every row; under an LR that stopped
    growing they are looks at one and the same change, and on e1f141f the last 8 rows of 1500 read 4.1 standard
    errors up (a spread estimated at half the truth): a critical divergence, and pages on 17 of the 75 live reports
    after the raise. Only the rows since the raise (64 at most) are looked at now, as before e1f141f: nothing, at
    the end or at any row watched live. Fails on e1f141f (both)."""
    n = 1500
    rng = np.random.default_rng(76)
    steps = np.arange(n)
    loss = 2.0 + np.exp(-steps / 300) + rng.normal(0, 0.3, n)
    lr = np.full(n, 3e-4)
    lr[900:] = 6e-4
    if not live:
        report = analyze(rows_table(steps, loss=loss, lr=lr))
        assert not any(f.evidence.get("rule") == "lr_change_point" for f in report.findings), report.findings
        return
    live_analyzer, pages = StreamingAnalyzer(None), []
    for i, row in enumerate(rows_table(steps, loss=loss, lr=lr).drop_columns(["main"]).to_pylist()):
        live_analyzer.update(row)
        if i >= 900 and i % 8 == 7:  # the report a watcher reads every 8 rows after the raise
            pages += [(i, f.onset_step) for f in live_analyzer.report().findings
                      if f.evidence.get("rule") == "lr_change_point"]
    assert pages == [], pages


# 91. A log's rounding of the LR is not the end of the warm-up.

def test_91_a_warm_up_printed_with_few_digits_is_one_warm_up() -> None:
    """llm.c prints the LR with six decimals: a linear warm-up to 6e-4 over 700 steps reads 1e-06, 2e-06, 3e-06,
    3e-06, 4e-06 ... The repeated 3e-06 read as the warm-up's end at step 2, so every later row of the warm-up was
    a rise off the schedule: a bad batch at 660 on the real 124M log said "after the LR rose x189". A value repeated
    over fewer than ``held_steps`` updates, the LR rising past it after, is the log's rounding. Fails on e613ad0.
    Guard: a warm-up that stops and holds its LR still ends where it stopped."""
    from runwatch.detectors.divergence import warmup_end

    n = 1200
    steps = np.arange(n)
    lr = np.round(6e-4 * np.minimum((steps + 1) / 700, 1.0), 6)
    assert list(lr[:5]) == [1e-06, 2e-06, 3e-06, 3e-06, 4e-06]
    assert warmup_end(steps, lr, DEFAULT.lr) == 699
    loss, grad = loss_curve(n), grad_curve(n)
    loss[660] += 3.0
    grad[660] *= 6
    [spike] = [f for f in analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr)).findings if f.kind == "spike"]
    assert spike.onset_step == 660 and not spike.evidence["lr_raised"] and "LR rose" not in spike.message, spike
    held = lr.copy()
    held[300:] = held[300]  # the warm-up stopped at 300 and the LR was held there
    assert warmup_end(steps, held, DEFAULT.lr) == 300


# 92. An LR that rose on the opening warm-up's path is the schedule, however few rows the log has.

def test_92_an_excerpt_that_ends_inside_its_warm_up_reads_no_lr_raise() -> None:
    """bigscience's perf-meg-ds-zero log has four iterations of a linear warm-up (1.875e-05 a step) and a loss that
    jumps 12.52 -> 40.75 at the third: the LR at the jump (x3 the first row's) read as a raise off the schedule,
    "restore it before resuming" and "skip batches 0-199". Every row of it lies on the warm-up's path (it rises by
    a steady step, never steepening), so the rise is the schedule's. Fails on 3a4887b. Guard: a burst on the same
    warm-up (x50 at the jump) steepens it, ends the warm-up the row before, and is a raise."""
    steps = np.arange(1, 5)
    lr = 1.875e-05 * steps
    loss = np.array([12.52221, 12.5177, 40.75232, 38.99556])
    [finding] = analyze(rows_table(steps, loss=loss, lr=lr)).findings
    assert finding.onset_step == 3 and not finding.evidence["lr_raised"], finding
    report = analyze(rows_table(steps, loss=loss, lr=lr))
    assert report.rollback is None or not any("restore it" in a for a in report.rollback.actions), report.rollback
    burst = lr.copy()
    burst[2] *= 50
    [finding] = analyze(rows_table(steps, loss=loss, lr=burst)).findings
    assert finding.evidence["lr_raised"] and finding.evidence["lr_ratio"] > 40, finding


# 93. A scaler collapse that outlives the NaN it began in is a collapse of its own.

def _overflow_run(nan_to_the_end: bool) -> pa.Table:
    """fp16 with GradScaler's defaults: 25 steps of infinite loss from 151 halve the scale 25 times (65536 ->
    0.002); the loss comes back finite after them, or (a weight gone NaN) stays non-finite to the end."""
    n = 300
    steps = np.arange(1, n + 1)
    loss, grad = loss_curve(n), grad_curve(n)
    bad = (steps >= 151) & ((steps <= 175) | nan_to_the_end)
    loss[bad] = np.inf if not nan_to_the_end else np.nan
    grad[bad] = np.inf
    scale = 65536.0 * 0.5 ** (np.cumsum(bad) - bad)  # the scale each step ran at: halved after each overflow
    return rows_table(steps, loss=loss, grad_norm=grad, loss_scale=scale, found_inf=bad)


def test_93_a_collapse_that_outlived_its_nan_needs_action() -> None:
    """A review's Lightning fp16 run: infinite loss for updates 151-175, the scale halved to 0.002 and never
    regrew, and ``check`` said WATCHING: a collapse that begins inside a NaN episode was dropped as the NaN's echo
    even when the values came back finite and the scale did not. Fails on fad0de9. Guard: a NaN that stays to the
    end keeps the collapse its echo."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an infinite loss is data: numpy's overflow warnings went to check's stderr
        report = analyze(_overflow_run(nan_to_the_end=False), meta={"scaler": {"growth_interval": 2000}})
    collapses = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert len(collapses) == 1 and collapses[0].needs_action and collapses[0].onset_step == 151, report.findings
    # The overflowed loss is the NaN episode, not a spike beside it ("loss 0.099 -> not finite"; fails on be43ea3).
    assert [f.kind for f in report.findings if f.kind in ("nan", "spike", "divergence")] == ["nan"], report.findings
    assert report.rollback is not None and report.rollback.checkpoint_step is None  # no checkpoints recorded
    report = analyze(_overflow_run(nan_to_the_end=True), meta={"scaler": {"growth_interval": 2000}})
    assert [f.kind for f in report.findings if f.kind in ("nan", "scaler_collapse")] == ["nan"], report.findings


# 94. Every loss detector dates an excursion the alarm came after an LR rise at the rise's first consequence (test 88's
# rule, once for the spike, the loss climb and the precursor: ``divergence.raise_after``).

def test_94_a_precursor_dated_by_blocks_before_the_ramp_that_caused_it_begins_with_the_ramp() -> None:
    """Real CPU training (fresh seed 102124's run 009, ``tests/fixtures/fresh``): fp16, batch 4, a constant LR, a slow
    LR ramp with the final layer's weights growing from 375 (first consequence 376); the activation and
    gradient norms x10 by the end while the loss has not moved: OPT's precursor. The climb is dated on blocks of
    16 rows and walked back to 362, before its cause; the rows 362-375 carry no lift of their own, so the ramp's
    first consequence is the onset. Fails on 5d78497 (onset 362, no ``lr_rise_step``)."""
    report = _fresh_report("f102124-009")
    [div] = [f for f in report.findings if f.kind == "divergence"]
    assert (div.onset_step, div.evidence["rule"], div.evidence["lr_rise_step"]) == (376, "precursor", 376), div


def test_94_an_lr_jump_the_alarm_came_after_is_the_cause_even_inside_the_warm_up() -> None:
    """Real CPU training (fresh seed 286252's run 034): fp32, batch 18, a 63-step warm-up, the LR jumped x24 at 51
    and held (a divergence labelled from 52). The excursion opened at the jump's own row, 51 (its loss computed
    before the first update under the new LR), and the sign test, reading the LR from there, found no raise at the
    onset and called the spread "the loss noise grew" (an info note, no action; the date moved to 52 only after,
    test 84's rule). Opened at the first consequence, the raise at the onset is its cause, still up: a divergence.
    Fails on 5d78497."""
    steps, cols = _fresh_run("f286252-034")
    [f] = analyze(rows_table(steps, **cols)).findings
    assert (f.kind, f.onset_step, f.needs_action, f.evidence["lr_raised"]) == ("divergence", 52, True, True), f


def test_a_blip_the_lr_threw_is_not_called_a_bad_batch() -> None:
    """A review's HF import read "one-step loss spike (a bad batch?) ... after the LR rose x47": two causes at once.
    With the LR raised into it the LR is the cause named; the batch guess stays for a blip with no LR cause."""
    from runwatch.detectors.spike import _message

    ev = {"observations_out_of_band": 1, "observations_far_out": 1, "blip": True, "rule": "shewhart",
          "baseline_loss": 2.0, "peak_loss": 9.0, "baseline_grad_norm": None, "peak_grad_norm": None,
          "grad_norm_moved_first": False, "lr_raised": True, "lr_ratio": 47.0, "lr_scheduled": False,
          "lr_restart_step": None, "recovery_steps": 1}
    thrown = _message(ev, 160, True, True, False)
    assert thrown.startswith("one-step loss spike from step 160") and "bad batch" not in thrown, thrown
    assert "(a bad batch?)" in _message({**ev, "lr_raised": False}, 160, True, True, False)


# 95. A lone slow interval is a stall only past the single-interval bar its false-alarm rate sets (stall.z_alone).

def _wandering_intervals(amp: float, seed: int = 0, n: int = 3000, k: int = 100) -> np.ndarray:
    """Intervals of k steps on a host whose log step time wanders (AR(1), sd ``amp``, correlation ~20 steps)."""
    rng = np.random.default_rng(seed)
    eps = rng.normal(0, amp * np.sqrt(1 - 0.95 ** 2), k * n)
    wander = np.empty(k * n)
    wander[0] = eps[0]
    for i in range(1, k * n):
        wander[i] = 0.95 * wander[i - 1] + eps[i]
    return (5.0 * np.exp(wander)).reshape(n, k).sum(axis=1)


def test_95_a_lone_interval_at_six_to_seven_sigmas_of_a_wandering_host_is_not_a_stall() -> None:
    """bench/calibrate.py, ten draws of 3M healthy steps: 9 of the 24 alarms were one interval of a noisy host
    logged every 10 or 100 steps at 6.0-6.7 sigmas of its log interval time (draw 1's sim-006: 754 s where 538 s
    was due, intervals varying by 6%), the most of any kind. One 100-step interval 55% longer than the wander
    made it: past the interval rule (6 sigmas), under the single-interval bar (7), no stall. Fails on 09ef114 (a
    stall warning). Guards: 60% longer (7.3 sigmas) is one; a spell of such intervals is a slowdown (test 29)."""
    k, n = 100, 3000
    steps = (np.arange(n) + 1) * k
    for factor, expected in ((1.55, []), (1.60, [("stall", 2000 * k, "warning")])):
        interval = _wandering_intervals(0.1)
        interval[2000] *= factor
        [raw] = detect_stalls(steps, np.cumsum(interval))  # the interval rule alone
        assert raw.onset_step == 2000 * k and 6.0 <= raw.evidence["z"] <= 7.5, raw.evidence
        report = analyze(rows_table(steps, time=np.cumsum(interval), loss=loss_curve(n), grad_norm=grad_curve(n)))
        assert [(f.kind, f.onset_step, f.severity) for f in report.findings if f.kind in ("stall", "slowdown")] \
            == expected, (factor, raw.evidence["z"])


# 96. A ramp that runs across a schedule's step down began before the step.

@pytest.mark.parametrize("name,kind,onset,checkpoint", [
    # the LR x1.025 a step from its update at 261 (first consequence 262), the multistep's x0.35 at 387 on the way: the raise was
    # read from 388, and the advice 378 lay 116 updates into the ramp
    ("f978851-097", "divergence", 262, 252),
    # the LR x1.015 a step from its update at 823, the multistep's step at 942: the rise read from 942, advice 936
    ("f846832-026", "divergence", 824, 819),
])
def test_96_a_ramp_across_a_schedule_step_down_began_before_the_step(name, kind, onset, checkpoint) -> None:
    """Real CPU training (fresh seeds 978851 and 846832, ``tests/fixtures/fresh``): fp32, batch 3, a multistep
    schedule, an LR growing off it by a constant factor a step, and the schedule's step down on the way. A step
    schedule multiplies the LR once, at one row; the ramp multiplies every update, at the same rate on both sides
    of the step: one ramp, begun before the step, and the advice precedes it (the labeller's checkpoint). Fails on
    2c53c14 (the rise read from the row after the step: checkpoints 378 and 936)."""
    report = _fresh_report(name)
    [exc] = [f for f in report.findings if f.needs_action]
    assert (exc.kind, exc.onset_step) == (kind, onset), exc
    assert report.rollback is not None and report.rollback.checkpoint_step == checkpoint, report.rollback.reason


def test_96_guard_a_ramp_after_a_step_down_from_another_rate_begins_after_it() -> None:
    """A ramp of x1.01 a step from 200, the schedule's x0.3 at 300, then a ramp of x1.002 a step: the rates on the two
    sides of the step differ five-fold, two causes and not one ramp; the later one, which the loss answers, began at
    the step (the row after it the first under it)."""
    n = 700
    steps = np.arange(n)
    lr = np.full(n, 1e-3)
    lr[200:300] = 1e-3 * 1.01 ** np.arange(1, 101)
    lr[300:] = lr[299] * 0.3 * 1.002 ** np.arange(0, n - 300)
    rise = lr_rise_start(steps, lr, 450, DEFAULT.lr, until=n - 1)
    assert rise is not None and 299 <= rise <= 301, rise


def test_96_guard_a_ramp_across_a_step_is_measured_net_of_the_step() -> None:
    """Real CPU training (fresh seed 846832's run 065): fp16, a step schedule, a log every 2 steps, checkpoints every
    78. A ramp of x1.005 a step from 236, across the schedule's x0.1 at 308; the loss out from 350. The LR at the
    log's end stands under the ramp's first row (the step took 10x off), so the ramp's rise is the LR's rise over
    the step with the step's factor taken out (x4.3 by the last row): the cause, and the advice precedes it, as
    before the walk crossed steps: 234, the last row of the old LR (test 99; 156 before, the labeller's until
    fresh-v8). Measured gross, a rise across a step read as no rise at all."""
    report = _fresh_report("f846832-065")
    [exc] = [f for f in report.findings if f.needs_action]
    assert (exc.onset_step, exc.evidence["trend_break_step"]) == (350, 236), exc
    assert report.rollback is not None and report.rollback.checkpoint_step == 234, report.rollback.reason


# 97. A backoff under the floor while the scaler regrows from a collapse is that collapse's tail, not one of its own.

def _regrowing_scale(n: int, backoff_at: int | None) -> tuple[np.ndarray, np.ndarray]:
    """GradScaler's rule, growth interval 31: steady at 4096 (the run's sawtooth left out), 17 skips every other step
    from 788 (4096 -> 0.03125), then a doubling per 31 clean steps; one ordinary overflow at ``backoff_at``."""
    scale, found = np.empty(n), np.zeros(n, bool)
    s, clean = 4096.0, 0
    for i in range(n):
        if (788 <= i < 822 and (i - 788) % 2 == 0) or i == backoff_at:
            found[i], s, clean = True, s / 2, 0
        else:
            clean += 1
            if clean == 31 and i >= 822:
                s, clean = s * 2, 0
        scale[i] = s  # the scale after step i's update, as the next row logs it
    return np.r_[4096.0, scale[:-1]], found


@pytest.mark.parametrize("backoff_at", [None, 920])
def test_97_a_backoff_under_the_floor_while_regrowing_is_the_collapses_own_tail(backoff_at) -> None:
    """Real CPU training in miniature (fresh seed 694513's run 089, fp16, growth interval 31): 17 overflows every
    other step from 788 take the scale 4096 -> 0.03; it regrows a doubling per 31 clean steps, and one ordinary
    overflow at 920, at a scale of 0.25, halves it once. That halving, under the floor of 1, was read as a collapse
    of its own, and the first one's late recovery was looked for only up to it: "did not recover", advice, though
    the scale was back within 4x of 4096 by the end. A chain that began under the floor is the tail of the collapse
    that took it there. Fails on 938ed70 (a second collapse at 920; the first needs action)."""
    n = 1347
    steps = np.arange(n)
    scale, found = _regrowing_scale(n, backoff_at)
    assert scale[-1] >= 1024  # regrown within 2^2 of 4096
    report = analyze(rows_table(steps, loss=loss_curve(n), grad_norm=grad_curve(n), loss_scale=scale,
                                found_inf=found), meta={"scaler": {"growth_interval": 31}})
    collapses = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert [(f.self_recovered, f.needs_action) for f in collapses] == [(True, False)], collapses
    assert 788 <= collapses[0].onset_step <= 790


# 98. A checkpoint taken while the loss scale regrows from a collapse holds the collapse's state.

def _collapse_then_regrowth(n: int) -> tuple[np.ndarray, np.ndarray]:
    """GradScaler's rule, growth interval 30: steady at 2^16, 11 overflows every other step from 500 (2^16 -> 32),
    then a doubling per 30 clean steps: back within 2^3 of 2^16 at 761."""
    scale, found = np.empty(n), np.zeros(n, bool)
    s, clean = 2.0**16, 0
    for i in range(n):
        if 500 <= i < 522 and (i - 500) % 2 == 0:
            found[i], s, clean = True, s / 2, 0
        else:
            clean += 1
            if clean == 30 and i >= 522:
                s, clean = min(s * 2, 2.0**16), 0
        scale[i] = s
    return np.r_[2.0**16, scale[:-1]], found


def test_98_a_checkpoint_while_the_scale_regrows_is_inside_the_collapse() -> None:
    """Fresh seed 172015's run 060 in miniature: a collapse from 500 that comes back (the scaler regrows to within
    8x of 2^16 by 761), then the loss jumps from 750 and stays up; checkpoints every 100 steps from 150.
    Checkpoints 550 and 650 lie after the last skip but while the scale is still 2^7-2^9 under where it was:
    resuming one resumes the collapse. The advice is 450, the last checkpoint before the collapse; the scanner's
    own recovery time says where its state ended. Fails on 65af231 (checkpoint 650: the collapse's end read as
    its last skip)."""
    n = 1000
    steps = np.arange(n)
    scale, found = _collapse_then_regrowth(n)
    loss = loss_curve(n)
    loss[750:] += 3.0
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n), loss_scale=scale, found_inf=found),
                     events_table([{"event": "checkpoint", "step": s, "payload": {"path": f"ckpt/{s}"}}
                                   for s in range(150, n, 100)]), meta={"scaler": {"growth_interval": 30}})
    [collapse] = [f for f in report.findings if f.kind == "scaler_collapse"]
    regrew = collapse.onset_step + collapse.evidence["recovery_steps"]
    assert collapse.self_recovered is True and 500 <= collapse.onset_step <= 502 and 755 <= regrew <= 765, collapse
    assert report.rollback is not None and report.rollback.checkpoint_step == 450, report.rollback
    rejected = report.rollback.evidence["rejected_checkpoints"]
    assert [r["step"] for r in rejected if f"regrew by step {regrew}" in r["why"]] == [650, 550], rejected


# 99. The LR the log shows is a logged observation of the cause: the update of the row before its raise ran
# at the old LR.

@pytest.mark.parametrize("every, raised_from, expected", [
    (25, 1210, 1200),  # a coarse log: the raise came somewhere in 1201-1225; update 1200 ran at the old LR
    (1, 1201, 1200),  # a per-step log: the onset is the raise's first consequence, 1202, and the usual rule gives it
    (25, 1190, 1100),  # guard: row 1200 already shows the raise, so its update ran under it
])
def test_99_a_checkpoint_at_the_last_row_of_the_old_lr_is_clean(every, raised_from, expected) -> None:
    """The record logs at step s the LR update s ran at. An LR jumped x20 from update ``raised_from`` and held, the
    loss up from the first row that can show it; checkpoints every 100 steps. Checkpoint 1200 holds updates up to
    1200: where the LR logged at 1200 is still the old one, none of them ran under the raise, and it is clean, though
    no logged loss lies between it and the onset (fresh seed 978851's run 065, a log every 25 steps: LR x40 first
    shown at 1225, checkpoint 1200 refused for 1050; 319368's runs 041 and 123 alike). Where row 1200 already shows
    the raise, its update may have made the damage. Fails on 43568af for the first (checkpoint 1100: the
    consequence rule, which cannot tell whether update 1200 was bad, applied to a cause the log shows)."""
    steps = np.arange(0, 2000, every)
    n = len(steps)
    lr = np.where(steps >= raised_from, 20.0, 1.0) * 1e-3
    loss = loss_curve(n, noise=0.03)
    first_bad = steps > raised_from  # the loss logged at s comes from the weights after update s - 1
    loss[first_bad] += 2.0 + 0.002 * (steps[first_bad] - raised_from)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n), lr=lr),
                     _ckpts(list(range(100, 2000, 100))))
    assert report.rollback is not None and report.rollback.checkpoint_step == expected, report.rollback
    if every > 1 and expected == 1200:
        reason = report.rollback.reason
        assert "the last row at the old LR before its raise at step 1225" in reason, reason


def test_99_guard_a_raise_under_a_schedules_step_down_keeps_the_consequence_rule() -> None:
    """Fresh seed 890668's run 045 (drawn at 4b1867e), in miniature: a log every 25 steps, a multistep schedule's x0.3
    between rows 1025 and 1050, and an LR growing x1.0134 a step from update 1049 under it; the loss out from 1075.
    Row 1050's LR is below row 1025's, so the rise reads from 1075, but row 1050 moved by the step: its update may
    already have run under the raise (it did), and checkpoint 1050 is not known clean. The advice keeps the
    consequence rule: 1015. Fails on 4b1867e (checkpoint 1050)."""
    steps = np.arange(0, 1400, 25)
    n = len(steps)
    lr = np.where(steps < 1049, 1.7e-3, 0.51e-3 * 1.0134 ** np.maximum(steps - 1048, 0))
    loss = loss_curve(n, noise=0.03)
    loss[steps >= 1075] += 2.0 + 0.004 * (steps[steps >= 1075] - 1075)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(n), lr=lr),
                     _ckpts(list(range(35, 1400, 35))))
    assert report.rollback is not None and report.rollback.checkpoint_step == 1015, report.rollback


# 100. A precursor's climb dated before the LR rise it was moved to is not where the incident began.

@pytest.mark.parametrize("lifted_from", [None, 1866])
def test_100_a_precursor_moved_to_its_lr_cause_does_not_walk_the_advice_back_to_the_climb(lifted_from) -> None:
    """Real CPU training (fresh seed 34384's run 008, ``tests/fixtures/fresh``): fp32, batch 4, a linear schedule,
    logged every 2 steps, checkpoints every 105. An LR ramp from update 1892 drives the activation and gradient
    norms x7-8 (OPT's precursor). The climb is dated by blocks at 1886, three rows before the ramp, the norms flat
    at 11-13 there; the precursor's onset moved to the ramp's first consequence (the rows before it carry no lift of
    their own), but the evidence still named the climb and the advice walked back before it: checkpoint 1785, where
    1890, the last row at the old LR, is clean. Fails on d2527ff (checkpoint 1785). Guard: the same run with both
    norms doubled from 1866, a lift of their own before the ramp, keeps the climb as the onset and the advice
    before it."""
    report, div = _precursor_of("f34384-008", lifted_from)
    if lifted_from is None:
        assert div.onset_step == 1892 and div.evidence["act_norm_climb_step"] is None, div
        assert report.rollback is not None and report.rollback.checkpoint_step == 1890, report.rollback
    else:  # dated by blocks of 16 rows (32 steps here)
        assert lifted_from - 32 <= div.onset_step == div.evidence["act_norm_climb_step"] <= lifted_from, div
        assert report.rollback is not None and report.rollback.checkpoint_step == 1785, report.rollback


def _precursor_of(name: str, lifted_from: int | None) -> tuple[Report, Finding]:
    """The report on fresh run ``name`` (both norms doubled from step ``lifted_from`` where given: a lift of their own)
    and its one alarm, a critical precursor."""
    steps, cols = _fresh_run(name)
    if lifted_from is not None:
        lift = np.where(steps >= lifted_from, 2.0, 1.0)
        cols = {**cols, "grad_norm": cols["grad_norm"] * lift, "act_norm": cols["act_norm"] * lift}
    report = _fresh_report_of(name, steps, cols)
    [div] = _alarms(report)
    assert (div.kind, div.severity, div.evidence["rule"]) == ("divergence", "critical", "precursor"), div
    return report, div


# 101. The rest of a warm-up after a burst inside it is the schedule, not a ramp into a later excursion.

@pytest.mark.parametrize("thrown", [False, True])
def test_101_a_warmup_goes_on_past_a_burst_inside_it(thrown) -> None:
    """Real CPU training (fresh seed 694513's run 015, ``tests/fixtures/fresh``): fp32, batch 2, a 189-step linear
    warm-up, checkpoints every 56. An LR burst x5 at 46-49 inside the warm-up moves nothing; an LR burst x300 at 202
    throws the loss 3.9 -> 36, back on its trend by 464; NaN weights from 1517. The warm-up's end is read before the
    first row that steepens its rise, so that a burst inside it reads as a raise; but the LR then rising on along the
    warm-up's path to 189 was read as a ramp, the rise into 202 walked back to 46: a divergence from 47, an alarm
    where nothing happened, and no checkpoint before it, so no advice for the NaN (the right one is 1512). Fails on
    679ec52 (a divergence from 47, advice None). Guard: the warm-up burst is still read as a raise where it throws the
    loss (the loss lifted by 4 at 48-55: a spike from 48 "after the LR rose x5.4")."""
    steps, cols = _fresh_run("f694513-015")
    if thrown:
        cols = {**cols, "loss": cols["loss"] + np.where((steps >= 48) & (steps < 56), 4.0, 0.0)}
    report = _fresh_report_of("f694513-015", steps, cols)
    burst = [f for f in _alarms(report) if f.onset_step == 202]
    assert [(f.kind, f.evidence["lr_raised"], f.self_recovered) for f in burst] == [("spike", True, True)], \
        report.findings
    early = [f for f in _alarms(report) if f.onset_step < 202]
    expected_early = [("spike", 48, True)] if thrown else []
    assert [(f.kind, f.onset_step, f.evidence["lr_raised"]) for f in early] == expected_early, early
    assert report.rollback is not None and report.rollback.checkpoint_step == 1512, report.rollback


# 102. A ramp riding a decaying schedule is read by its own rate from the kink where it began.

@pytest.mark.parametrize("lifted_from", [None, 370])
def test_102_a_slow_ramp_on_a_decay_is_the_cause_of_the_climb_dated_before_it(lifted_from) -> None:
    """Real CPU training (fresh seed 7843's run 103, ``tests/fixtures/fresh``): fp32, batch 1, a linear decay of 0.46%
    a step, checkpoints every 56. An LR ramp of x1.0022 a step from update 393 drives the activation and gradient
    norms x3.3-3.7 by 574 (OPT's precursor); the climb is dated by blocks at 384. The logged LR never rises, and
    against the slope before the kink carried forward it stood only x1.09 up at most (a linear decay steepens its
    log slope), under any bar, so the ramp was no cause: the onset stayed at 384, the advice at 336, where 392 (the
    last row at the schedule's rate) is clean. By the ramp's own rate (the slope's step at the kink) it has lifted
    the LR x1.49: the cause, the onset its first consequence, 394. Fails on be5f188 (onset 384, checkpoint 336).
    Guard: the same run with both norms doubled from 370, a lift of their own before the ramp, keeps the climb as the
    onset and the advice before it."""
    report, div = _precursor_of("f7843-103", lifted_from)
    if lifted_from is None:
        assert div.onset_step == 394 and div.evidence["lr_rise_step"] == 394, div
        assert report.rollback is not None and report.rollback.checkpoint_step == 392, report.rollback
    else:  # dated by blocks of 16 rows
        assert lifted_from - 16 <= div.onset_step == div.evidence["act_norm_climb_step"] <= lifted_from, div
        assert report.rollback is not None and report.rollback.checkpoint_step == 336, report.rollback


# 103. A burst inside the warm-up is not tested at a known change point.

@pytest.mark.parametrize("thrown", [False, True])
def test_103_a_burst_inside_the_warmup_is_not_a_known_change_point(thrown) -> None:
    """Real CPU training (fresh seed 34384's run 141, ``tests/fixtures/fresh``): fp32, batch 2, a 272-step warm-up,
    noisy host. An LR burst x3 at 154-155 inside the warm-up moved nothing: its clean twin's loss is the same to
    0.1 at every step. But the loss level rose with the warm-up there, and the known-change-point test read it as
    "loss level up after the learning rate burst at step 154: 20 standard errors", a warning. That test's risk was
    measured after the warm-up, where the loss level moves slowly; inside it the level moves with the rising LR.
    Fails on 7b3fbb6 (the warning at 155). Guard: the burst is still the cause of a loss it throws (the loss lifted
    by 4 at 155-162: a spike from 155 after the LR rose)."""
    steps, cols = _fresh_run("f34384-141")
    if thrown:
        cols = {**cols, "loss": cols["loss"] + np.where((steps >= 155) & (steps < 163), 4.0, 0.0)}
    report = _fresh_report_of("f34384-141", steps, cols)
    expected = [("spike", 155, "shewhart", True)] if thrown else []
    assert [(f.kind, f.onset_step, f.evidence["rule"], f.evidence["lr_raised"]) for f in _alarms(report)] == expected, \
        report.findings


# 104. The row before a ramp's first raised row is at the old LR, on a decaying schedule too.

def test_104_the_row_before_a_ramp_on_a_decay_is_a_clean_checkpoint() -> None:
    """Real CPU training (fresh seed 499698's run 039, ``tests/fixtures/fresh``): fp32, batch 19, a linear decay,
    logged every 10 steps, checkpoints every 24. An LR ramp from update 841-850 drives a loss spike from 880 (0.97 ->
    5.6, not back). The ramp is read from its kink (test 102): the LR logged at 850 falls less than the schedule,
    it does not rise. The LR logged at step s is the one update s ran at, so every update up to 840 ran at the old
    LR and checkpoint 840 is clean (a raise that lifts the LR above the row before is read so already, test 99); but
    that reading asked the row to rise, and the advice went to 816, a checkpoint early (before the kink was read,
    864: one holding ramped updates). Fails on e62378c (checkpoint 816)."""
    report = _fresh_report("f499698-039")
    [spike] = _alarms(report)
    assert (spike.kind, spike.onset_step, spike.evidence["lr_rise_step"]) == ("spike", 880, 850), spike
    assert report.rollback is not None and report.rollback.checkpoint_step == 840, report.rollback
    evidence = report.rollback.evidence
    assert (evidence["incident_onset_step"], evidence["last_healthy_step"]) == (850, 840), evidence


# 105. A collapse is over once the scale is back within fewer halvings of where the run trained than make one.

@pytest.mark.parametrize("pinned_from, expected", [(1486, 1450), (1420, 1300)])
def test_105_a_collapse_regrown_to_under_a_collapse_depth_is_over(pinned_from: int, expected: int) -> None:
    """Fresh seed 277506's run 082 in GradScaler's terms (growth interval 26): a sawtooth at its ceiling, 2^18 for
    the one step that overflows each growth interval and 2^17 for the rest; 7 overflows every other step from 1322
    take it to 2^10, then it regrows a doubling per 26 clean steps, 2^14 by 1439; every step overflows from 1486
    (the scale driven to its bottom); checkpoints every 50. Regrown to 2^14 the first collapse is over: three
    halvings under where the run trained, fewer than make a collapse (``min_halvings``), so a chain from there to
    here would not be one, and the skipped steps never touched the weights. Checkpoint 1450 holds the scaler
    regrowing at its own pace and the weights of a healthy run. Judged within two halvings of the 2^18 peak the
    burst began after, it "did not recover" and the advice was 1300, before the first burst, where the clean twin
    says 1450. Fails on 13ee570 (checkpoint 1300). Guard: pinned from 1420, the scale still at 2^13 (four halvings
    under), the first collapse is not over and 1300 stays the advice."""
    n = 1500
    steps, scale, flags = _grad_scaler(n, set(range(1322, 1335, 2)) | set(range(pinned_from, n + 1)), 26,
                                       scale=2.0 ** 17)
    report = _scaler_report(steps, scale, flags, 26, every=50)
    first, second = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert (first.onset_step, first.self_recovered) == (1322, expected == 1450), first
    assert (second.onset_step, second.needs_action) == (pinned_from, True), second
    if first.self_recovered:
        assert "regrown to 16384 by step 1439" in first.message, first.message
    assert report.rollback is not None and report.rollback.checkpoint_step == expected, report.rollback


# 106. A burst's loss that comes back and rises again before its lasting cost was measured is its aftershock.

@pytest.mark.parametrize("raised_from", [None, 1585])
def test_106_a_rise_before_an_excursion_settled_is_its_aftershock(raised_from: int | None) -> None:
    """Real CPU training (fresh seed 392002's run 025, ``tests/fixtures/fresh``): fp16, batch 27, cosine, checkpoints
    every 36. An LR burst x51 at 1288 throws the loss 0.89 -> 7.4; it is back in band by 1556 and up again from
    1594 (0.40 -> 1.6, back after 580 steps), the clean twin ~0.25 lower all the while: the labeller's one spike,
    1289-1562, needs no action. A recovered excursion's lasting cost is measured over the ``lasting_obs`` after its
    recovery window; until then it has not settled, and a rise within them is its tail: one warning from 1289, not
    a second from 1594 (it went on only within ``patience_obs``, 16). Fails on 0a2dd67 (a warning at 1594). Guard:
    the LR x3 from 1585 is a cause of its own, and the rise after it a finding of its own."""
    steps, cols = _fresh_run("f392002-025")
    if raised_from is not None:
        cols = {**cols, "lr": np.where(steps >= raised_from, 3.0 * cols["lr"], cols["lr"])}
    report = _fresh_report_of("f392002-025", steps, cols)
    assert [f.onset_step for f in _alarms(report)] == ([1289] if raised_from is None else [1289, 1594]), \
        report.findings
    [burst] = [f for f in report.findings if f.onset_step == 1289]
    assert (burst.severity, burst.self_recovered) == ("warning", True), burst
    assert (burst.end_step > 1594) is (raised_from is None), burst


# 107. A scaler still growing from its initial scale has no usual level below the scale it reached.

@pytest.mark.parametrize("n, recovered, advice", [(496, None, 280), (700, True, None)])
def test_107_a_collapse_of_a_scaler_still_growing_is_judged_against_the_scale_it_reached(
        n: int, recovered: bool | None, advice: int | None) -> None:
    """Fresh seed 991661's run 064 in GradScaler's terms (fp16, growth interval 61, checkpoints every 140): the scale
    grows from 1024 to 65536 with no overflow, then collapses to 512 at 406-412 and regrows a doubling per 61
    steps. Where the run usually trained (test 105's target) is the median scale of a sawtooth; a scaler still
    growing has none yet, and the median over its window, 8192, lags where it was going: the collapse read as
    regrown at 1024 by 474, no advice, while the clean twin went on to 262144. Against the 65536 it reached, it
    is not back by the end (496: not recovered yet, checkpoint 280), and back at 8192 by 657 in a longer run.
    Fails on a82d3bd (regrown at 474)."""
    # GradScaler from 1024 that never overflowed (no ceiling), a doubling per 61 clean steps (65536 by 367), then 7
    # overflows in a row at 406-412 (down to 512), regrowing at the same pace.
    steps, scale, found = _grad_scaler(n, set(range(406, 413)), 61, scale=1024.0, cap=math.inf)
    report = _scaler_report(steps, scale, found, 61, every=140, init_scale=1024.0)
    [collapse] = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert (collapse.onset_step, collapse.self_recovered) == (406, recovered), collapse
    assert (report.rollback.checkpoint_step if report.rollback else None) == advice, report.rollback


# 108. Early in a segment, a rise within a noisy host's normal wander is not yet a warning.

@pytest.mark.parametrize("slower", [None, (1.8, 150, 210), (1.35, 150, 600), (1.35, 300, 420)])
def test_108_an_early_rise_within_a_hosts_wander_is_no_warning(slower: tuple[float, int, int] | None) -> None:
    """Real step times (the clean twin of fresh seed 611909's run 081, ``tests/fixtures/fresh``): a noisy host,
    an AR(1) wander of 10% sd with a correlation time of ~37 steps, whose first 140 steps happened to be calm
    (block medians within 5%, the wander read as 5%); from 142 it wanders 28% up for 17 steps, as such a host
    does. Judged against the calm first stretch, that was a warning; the run had not yet shown its
    variability. Fails on 0af6513 (a warning at 142). Guards: the same host 1.8x slower for 60 steps from 150,
    beyond any host's wander, is a warning from there; 1.35x from 150 to the end is one once it has lasted
    ``learn_steps`` (no wander lasts that long); 1.35x from 300, past ``learn_steps``, is one as before."""
    from runwatch.detectors.slowdown import detect_slowdowns

    logged, cols = _fresh_run("f611909-081-twin-time")
    steps, per_step = logged[1:], np.diff(cols["time"]) / np.diff(logged)
    if slower is not None:
        factor, start, stop = slower
        per_step = np.where((steps >= start) & (steps < stop), factor * per_step, per_step)
    found = detect_slowdowns(steps, per_step)
    warned = [f for f in found if f.severity == "warning"]
    if slower is None:
        assert warned == [] and [(f.onset_step, f.severity) for f in found] == [(142, "info")], found
    else:  # from 146 where it starts at 150: the host's own rise from 142 runs into it
        [slow] = [f for f in warned if f.end_step >= start]
        assert start - 4 <= slow.onset_step <= start + 1 and slow.evidence["rise"] > 0.9 * (factor - 1), found


# 109. A collapse begins at the flagged row before its first lower scale, on any log.

@pytest.mark.parametrize("log_every, ordinary, earliest, checkpoint", [(2, None, 88, 43), (1, None, 88, 86),
                                                                       (1, 60, 60, 43), (2, 60, 88, 43)])
def test_109_a_collapse_begins_at_the_flagged_row_before_its_first_lower_scale(
        log_every: int, ordinary: int | None, earliest: int, checkpoint: int) -> None:
    """Fresh seed 644585's run 149 in GradScaler's terms: fp16 at 2^16 (its initial scale), a growth interval of
    705, overflows every other step at 88-94 (2^16 -> 2^12, not regrown), logged every 2 steps, checkpoints every
    43. Row 88 is flagged: its step overflowed, and its halving shows on the next row, the first lower scale. The
    chain was walked back to a flagged row before its first decrease only where that decrease was flagged too and
    one step later: every other step overflowing, or a log every 2 steps, the collapse began at 90, and the
    advice was checkpoint 86, "the last logged step before the onset that is healthy" of a row that logged an
    overflow. The onset is the first bad observation, 88; on a log every 2 steps checkpoint 43 precedes 86, the
    last logged step before it. Fails on 53b7697 (onset 90 on both logs; checkpoint 86 on the coarse one). With
    an ordinary overflow at 60 (the scale halved once, the burst 28 steps later) the chain's first halving is
    60's, and the change point chooses among 60 and the burst's skips: the onset is 88, but at the alarm, three
    skips into the burst, 60 is within its 95% set (``change_point_slack``), so the advice precedes it: 43 (on
    53b7697, 86 on a per-step log, where the walk back stopped short of 60 and left it out; on the coarse log the
    alarm comes later and the set is 88 alone)."""
    overflows = {88, 90, 92, 94} | ({ordinary} if ordinary else set())
    steps, scale, flags = _grad_scaler(634, overflows, 705, scale=2.0 ** 16)
    keep = steps % log_every == 0
    report = _scaler_report(steps[keep], scale[keep], flags[keep], 705, every=43, init_scale=2.0 ** 16)
    [collapse] = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert (collapse.onset_step, collapse.needs_action) == (88, True), collapse
    assert collapse.evidence["earliest_onset_step"] == earliest, collapse.evidence
    assert report.rollback is not None and report.rollback.checkpoint_step == checkpoint, report.rollback


def test_109_a_sawtooth_probe_before_a_burst_is_not_its_first_skip() -> None:
    """Guard for test 109 (fresh seed 448775's run 027 in GradScaler's terms): a sawtooth at its ceiling, 2^17,
    grows to 2^18 at 52 and overflows there at once (flagged), as GradScaler probes each doubling; every other
    step overflows from 61, logged every 2 steps (the flags on odd steps unseen), checkpoints every 10. The first
    lower scale (54) shows the probe's halving, but an overflow at a scale just grown is the sawtooth's, not the
    burst's first skip (``scaler_collapse._probe``): the onset is 62, the first row whose scale shows the burst,
    and the advice 50. Walked back to the probe, the change point's set reached 52 and the advice went to 40."""
    steps, scale, flags = _grad_scaler(400, set(range(61, 84, 2)), 51, scale=2.0 ** 17)
    report = _scaler_report(steps[1::2], scale[1::2], flags[1::2], 51, every=10, init_scale=2.0 ** 17)
    [collapse] = [f for f in report.findings if f.kind == "scaler_collapse"]
    assert (collapse.onset_step, collapse.evidence["earliest_onset_step"]) == (62, 62), collapse
    assert report.rollback is not None and report.rollback.checkpoint_step == 50, report.rollback


# 110. A spike back to its trend just before the data ends is judged by the rows since it came back.

@pytest.mark.parametrize("lowered", [False, True])
def test_110_a_cost_is_measured_on_the_rows_there_are(lowered: bool) -> None:
    """Real CPU training (fresh seed 991661's run 072, ``tests/fixtures/fresh``): fp32, batch 10, multistep after a
    39-step warm-up, checkpoints every 39. An LR burst x156 at 184 throws the loss 2.97 -> 28.9; it is back within
    3 sigmas of its trend carried forward for the 8 rows 497-504, the last the run logged, but 1.2 (2.1 sigma) above
    it and above its level before the burst: the labeller's spike needs action (checkpoint 156). The lasting cost
    is measured over the ``lasting_obs`` after the recovery window; where the data ends within ``recovery_obs`` of
    it, over the rows since the recovery. Fails on 97e5fb9 (no cost measured: a warning, no advice). Guard: the
    same rows lowered by 1.2 to the level before the burst are a recovery with no cost (a warning, no advice)."""
    steps, cols = _fresh_run("f991661-072")
    if lowered:
        cols = {**cols, "loss": np.where(steps > 496, cols["loss"] - 1.2, cols["loss"])}
    report = _fresh_report_of("f991661-072", steps, cols)
    [spike] = [f for f in report.findings if f.kind == "spike"]
    assert (spike.onset_step, spike.end_step, spike.self_recovered) == (185, 496, True), spike
    assert (spike.severity, spike.needs_action) == (("warning", False) if lowered else ("critical", True)), spike
    assert (spike.evidence.get("lasting_cost_sigmas", 0.0) < 0.5) is lowered, spike.evidence
    assert (report.rollback.checkpoint_step if report.rollback else None) == (None if lowered else 156), report.rollback


# 111. A resumed segment's step times start from its parent's: a restart onto a slow node is slower than before.

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("slower", [False, True])
def test_111_a_resume_onto_a_slow_node_is_slower_than_before_it(seed: int, slower: bool) -> None:
    """A noisy host (an AR(1) wander of 10% sd, correlation time ~39 steps, as fresh seed 611909's run 081's)
    trains 800 steps; the run resumes from checkpoint 600 (segment 1 from 601) and runs 2x slower for its first
    200 steps, as a restart that landed on a slow node does. Each segment learned its speed and its host's
    variability from its own rows alone, so a segment slow from its first step had nothing to be slower than
    (fresh seeds 199657, 878614 and 291372: four of the eight labelled slowdowns missed lay in resumed segments,
    one 591 steps in, at 3.47 of its 3.5 sigmas, its parent's 350 steps unused). A resumed segment's step-time
    series now starts with its parent's step times up to the resume, outside the parent's slowdowns and stalls,
    as its loss series does: a warning from the resume. Fails on 4f9f090 (nothing on any seed). Guard: the same
    host without the slowdown pages nothing in either segment; streaming reads the run as offline does."""
    from tests.detectors.test_failure_classes import _noisy_host

    host = _noisy_host(1700, np.random.default_rng(seed), amp=0.1, phi=0.95)
    per0, per1 = host[:800], host[850:1650]
    steps0, steps1 = np.arange(1, 801), np.arange(601, 1401)
    if slower:
        per1 = np.where(steps1 < 801, 2.0 * per1, per1)
    time0 = np.cumsum(per0)
    time1 = time0[-1] + 300.0 + np.cumsum(per1)  # the restart's own pause before segment 1's first step
    steps, seg = np.concatenate([steps0, steps1]), np.repeat([0, 1], [800, 800])
    rows = rows_table(steps, segment=seg, time=np.concatenate([time0, time1]),
                      loss=np.concatenate([loss_curve(800, seed=seed), loss_curve(1400, seed=seed)[600:]]))
    events = _ckpts(list(range(100, 801, 100)), resume=(1, 600))
    report = analyze(rows, events)
    slow = _alarms(report, "slowdown")
    if not slower:
        assert slow == [], slow
    else:  # the first step time of segment 1 is its second row's (its first has no interval before it)
        [found] = slow
        assert (found.segment, found.self_recovered) == (1, True) and 602 <= found.onset_step <= 610, found
        assert found.end_step == 800 and found.evidence["rise"] > 0.8, found
    _table_streams_alike(rows, events, report.findings)


# 112. The LR levels a resumed run trained at reach back along its main line to the run's start.

@pytest.mark.parametrize("raised", [1.0, 3.0])
def test_112_a_warm_restart_to_a_peak_held_before_the_resumes_history_is_the_schedule(raised: float) -> None:
    """Real CPU training, the clean twin of fresh seed 141563's run 112 (``tests/fixtures/fresh``, no fault): fp16,
    cosine with warm restarts after a 116-step warm-up, its peak 0.00349 held at steps 115-130. Segment 1 resumes
    from checkpoint 480 (its first row 608, batches 481-607 skipped); the schedule restarts x20 back to that peak
    at 964, and the loss rises with it and comes back. The segment's LR levels came from its own rows and the
    history it was seeded with, its parent's last 256 healthy observations (225-480), which never held the peak:
    the restart read as an LR raised off the schedule, 'loss diverged from step 965 ... learning rate x20 ...
    still up', critical, and checkpoint 960 advised on a clean run (test 74 passed only because its history
    reached its restart). The levels trained at are read along the main line back to the run's start
    (``segments.main_line_trained_lr``): an 'info' rise after the schedule's restart. Fails on 0e4102b.
    Guard: the same step to 3x the peak is a raise, and the loss under it a divergence from 965. Streaming reads
    the run as offline does."""
    steps, cols = _fresh_run("f141563-112-twin")
    seg = cols.pop("segment").astype(int)
    cols["lr"] = np.where((seg == 1) & (steps >= 964), raised * cols["lr"], cols["lr"])
    rows = rows_table(steps, seg, **cols)
    events = _fresh_events("f141563-112-twin-events.json")
    report = analyze(rows, events)
    paged = [f for f in _alarms(report) if f.kind in ("spike", "divergence")]
    if raised == 1.0:
        assert paged == [] and report.rollback is None, paged
        [rise] = [f for f in report.findings if f.kind == "spike" and f.onset_step == 965]
        assert rise.severity == "info" and rise.evidence["lr_scheduled"], rise
    else:
        [div] = paged
        assert (div.kind, div.segment, div.onset_step, div.needs_action) == ("divergence", 1, 965, True), div
    _table_streams_alike(rows, events, report.findings)


# 113. A climb refuses checkpoints as OPT's precursor only where the loss is shown to have bought nothing.

@pytest.mark.parametrize("stalled", [False, True])
def test_113_a_climb_the_noisy_loss_fell_through_refuses_no_checkpoint(stalled: bool) -> None:
    """Real CPU training, fresh seed 199657's run 117 (``tests/fixtures/fresh``): fp16, batch 6, cosine with warm
    restarts, checkpoints every 30; NaN weights from 139 on a branch abandoned for checkpoint 120 (segment 1 from
    183), then a collapse of the loss scale from 231 (every step skipped). The activation norm grows 6.1 -> 10.0
    over steps 74-230 as the model learns (its clean twin's alike), while the batch-6 loss falls 2.96 -> 2.41:
    18%, but 2.5 standard errors of the two quarters' medians, under the 3 that called it learning, so the climb
    was OPT's precursor and every checkpoint after 74 refused (checkpoint 60, 150 steps of healthy training thrown
    away; the labeller's is 210). A climb is a precursor only where the stall is shown: the fall, 2 standard
    errors up, still under 1% of the loss (``divergence.loss_stalled``). Fails on 5dc1b31 (checkpoint 60).
    Guard: the same rows with the loss stalled through the climb (held at its level at 74, its noise about its
    fall scaled to 5%) walk the advice back before the climb, to checkpoint 60, as before."""
    steps, cols = _fresh_run("f199657-117")
    seg = cols.pop("segment").astype(int)
    if stalled:
        climb = (steps >= 74) & (steps <= 230) & np.isfinite(cols["loss"])
        level = float(np.median(cols["loss"][(steps >= 60) & (steps < 74)]))
        fit = np.polyval(np.polyfit(steps[climb], cols["loss"][climb], 1), steps)  # the fall through the climb
        cols["loss"] = np.where(climb, level + 0.05 * (cols["loss"] - fit), cols["loss"])
    # The main line from the resume event (``rows_table`` cuts at segment 1's first step, keeping the NaN branch).
    report = analyze(rows_table(steps, seg, **cols).drop_columns(["main"]),
                     _fresh_events("f199657-117-events.json"))
    [collapse] = [f for f in report.findings if f.needs_action and f.open]
    assert (collapse.kind, collapse.segment, collapse.onset_step) == ("scaler_collapse", 1, 231), collapse
    rb = report.rollback
    assert rb is not None and rb.checkpoint_step == (60 if stalled else 210), rb and rb.reason
    assert (rb.evidence.get("act_norm_growth_from") is not None) is stalled, rb.evidence


# 114. The rest of the warm-up after a burst inside it is the schedule when the burst's LR is judged still raised.

@pytest.mark.parametrize("jumped", [False, True])
def test_114_a_burst_inside_the_warmup_is_over_however_far_the_warmup_then_raises_the_lr(jumped: bool) -> None:
    """Real CPU training (fresh seed 246827's run 068, ``tests/fixtures/fresh``): fp16, batch 46, a 204-step linear
    warm-up to a constant LR, checkpoints every 94. An LR burst x270 at step 65 throws the loss 3.9 -> 130 from 66,
    back under its level of before by ~160 and on its trend by 695; an LR jump x5.5 from 753 then diverges it. The
    burst's LR was read as still raised: after the burst the warm-up rose on along its own path to 3.3x the LR
    before the onset (``_lr_story``'s ramp test, its rows over the factor and none at the LR before). So the burst
    was a divergence, needing action and never history, and the advice for the jump at 753 found no checkpoint
    before 66. Fails on 3989dfb (a divergence from 66, advice None). Guard: the LR left x3 above the warm-up's path
    from the burst on (a jump, never back on the path) is still raised: the divergence from 66 stays."""
    steps, cols = _fresh_run("f246827-068")
    if jumped:
        cols = {**cols, "lr": np.where(steps >= 66, 3.0 * cols["lr"], cols["lr"])}
    report = _fresh_report_of("f246827-068", steps, cols)
    early = [(f.kind, f.onset_step, f.evidence["lr_raised"], f.evidence.get("lr_still_raised")) for f in _alarms(report)
             if f.onset_step == 66]
    assert early == [("divergence" if jumped else "spike", 66, True, jumped)], report.findings
    later = [f for f in _alarms(report) if f.onset_step == 753]
    assert [(f.kind, f.evidence["lr_still_raised"]) for f in later] == [("divergence", True)], report.findings
    expected = None if jumped else 658  # the jump's divergence from 66 is still the earliest problem
    assert report.rollback is not None and report.rollback.checkpoint_step == expected, report.rollback
    _streams_alike("f246827-068", steps, cols, report)


# 115. An excursion's lasting cost is measured on the run's own rows, not on a later excursion's.

def test_115_a_later_excursion_is_not_the_lasting_cost_of_the_one_before() -> None:
    """Real CPU training (fresh seed 826151's run 115, ``tests/fixtures/fresh``): fp32, batch 5, cosine after a
    74-step warm-up, checkpoints every 27. An LR burst x47 at 51-54 throws the loss 3.9 -> 31 from 52; it is back on
    its trend by 426, the loss near 2.0, under its level before the burst; a second LR burst x117 at 442-446 throws
    it to 34 from 443 for good (the labeller's right checkpoint is 432). The first burst's lasting cost was measured
    over the 32 rows after its recovery window (434-465), most of them the second burst's: "10.8 (49.3 sigma)
    above it since", a cost that needs action, so the advice went back before the first burst, to checkpoint 27.
    The second burst opened an episode of its own (its LR stepped up), so its rows are its own: the first burst's
    cost is read on the 9 rows before it, and the advice is 432. Fails on 3989dfb (checkpoint 27). The rows a
    cost is read on are pinned: the median of 434-442 less the level before the first burst (a flat trend)."""
    steps, cols = _fresh_run("f826151-115")
    report = _fresh_report_of("f826151-115", steps, cols)
    first, second = [f for f in _alarms(report, "spike") if f.onset_step in (52, 443)]
    assert (first.self_recovered, first.needs_action, second.self_recovered) == (True, False, False), report.findings
    ev = first.evidence
    assert ev["trend_slope"] == 0.0, ev
    own = cols["loss"][(steps >= 434) & (steps < 443)]
    assert ev["lasting_cost"] == pytest.approx(float(np.median(own)) - ev["baseline_loss"]), ev
    assert ev["lasting_cost_sigmas"] < 0, ev
    assert report.rollback is not None and report.rollback.checkpoint_step == 432, report.rollback
    _streams_alike("f826151-115", steps, cols, report)


# 116. A warm-up that ended by holding its LR is over: only a burst inside it is read through.

_HD10_LR = [4e-05, 0.00104, 0.002, 0.002, 0.002704, 0.01783, 0.1176, 0.775, 5.11, 33.69, 222.1, 1464.0, 9654.0, 63650.0,
            419600.0, 2767000.0, 16920000.0]
_HD10_LOSS = [4.16, 4.039, 3.268, 2.58, 2.328, 1.93, 3.453, 7.476, 701.2, 1.695e9, 657200.0, 1.993e7, 2.489e9, 5.426e10,
              3.628e12, 6.313e19, 7.592e15]
_HD10_GRAD = [0.506, 0.5439, 1.271, 0.9623, 1.199, 2.031, 2.439, 2.963, 71.05, 1.53e7, 2100.0, 14260.0, 170600.0,
              383000.0, 4813000.0, 1.108e17, 1.033e16]


@pytest.mark.parametrize("burst", [False, True])
def test_116_a_warmup_that_held_its_lr_is_not_read_through_a_later_rise(burst: bool) -> None:
    """Held-out run h-divergence-10 (``bench/evalruns``, real CPU training, a log every 25 steps): a linear warm-up
    to 0.002 at step 50, held at 75, then an LR growing x1.08 a step from 100: a divergence from 100. The warm-up's
    end read through the bursts inside it (``divergence.warmup_resumed_end``) skipped the row after the end as a
    burst's and, the LR under the warm-up's path carried forward at 100, read the growth on from there as the warm-up
    going on to the log's end; so the LR, x1.4e9, was on the schedule's path, not still raised: a spike, not a
    divergence. A warm-up is read through only a burst: a row after its end that steepens its rise (the cause
    ``warmup_end`` stopped for). Fails on 8de8ffb (the end read as 399; a spike from 125). Guard: a burst x50 at
    row 75 of a warm-up rising to 200 is read through (test 101's class)."""
    steps = np.arange(0, 400, 25)
    steps = np.append(steps, 399)
    lr = np.array(_HD10_LR)
    lrc = DEFAULT.lr
    if burst:
        warm = 1e-4 * (steps / 25 + 1)
        lr = np.where(steps <= 200, warm, warm[steps == 200][0]) * np.where(steps == 75, 50.0, 1.0)
        assert warmup_end(steps, lr, lrc) == 50
        assert warmup_resumed_end(steps, lr, lrc, 50) == 200
        return
    assert warmup_end(steps, lr, lrc) == 50
    assert warmup_resumed_end(steps, lr, lrc, 50) == 50
    report = analyze(rows_table(steps, loss=np.array(_HD10_LOSS), grad_norm=np.array(_HD10_GRAD), lr=lr), None)
    [div] = _alarms(report)
    assert (div.kind, div.onset_step, div.evidence["lr_still_raised"]) == ("divergence", 100, True), div


# 117. A flagged row on a coarse log counts its own skip and those in between: a collapse's rate is read whole.

@pytest.mark.parametrize("every", [2, 1])
def test_117_a_coarse_rows_own_skip_adds_to_the_skips_before_it(every: int) -> None:
    """Real CPU training (fresh seed 796644's run 069, ``tests/fixtures/fresh``): fp16, batch 26, a log every 2
    steps, checkpoints every 139. An ordinary backoff shows at 970 (131072 -> 65536); from step 975 every step
    overflows and the scale falls to 1 and stays there (the labeller's checkpoint is 973). A row's skips were the
    larger of its own flag and the halvings since the row before (less that row's own), not their sum: row 978,
    flagged, 32768 -> 8192, read 1 skip where steps 977 and 978 both skipped. The collapse's rate after its change
    read half what it was, and the change point, fixed at the first alarm, took the backoff at 970 (advice 834).
    Fails on 67b4525 (onset 970, checkpoint 834). Guard: an incident logged every step (a flag on each skipped
    step, its halving on the next row: no row has both), an ordinary overflow 30 steps before a collapse from 975,
    reads as before: onset 975, checkpoint 973."""
    if every == 2:
        steps, cols = _fresh_run("f796644-069")
        cols["found_inf"] = cols["found_inf"].astype(bool)
    else:
        steps = np.arange(0, 1052)
        skipped = (steps == 945) | (steps >= 975)
        halvings = np.cumsum(np.r_[0, skipped[:-1]])  # each skip's halving shows on the next row
        cols = {"loss": loss_curve(len(steps), seed=3), "grad_norm": grad_curve(len(steps)),
                "lr": np.full(len(steps), 1e-3), "loss_scale": np.maximum(131072.0 / 2.0 ** halvings, 1.0),
                "found_inf": skipped}
    report = _fresh_report_of("f796644-069", steps, cols)
    [collapse] = [f for f in _alarms(report, "scaler_collapse") if f.onset_step > 900]
    onset = 976 if every == 2 else 975
    assert (collapse.onset_step, collapse.evidence["earliest_onset_step"]) == (onset, onset), collapse
    assert report.rollback is not None and report.rollback.checkpoint_step == 973, report.rollback
    _streams_alike("f796644-069", steps, cols, report)


# 118. One incident pages once: a second jump inside an excursion is an annotation unless a cause of its own shows.

@pytest.mark.parametrize("lr_raised", [False, True])
def test_118_a_jump_inside_an_excursion_pages_only_with_a_cause_of_its_own(lr_raised: bool) -> None:
    """Real CPU training (fresh seed 344831's run 142, steps 0-899, ``tests/fixtures/fresh``): fp16, batch 2, an LR
    burst x124 at 280 throws the loss 2.96 -> 49.9, and it thrashes back down until 707. On the way a batch-2 loss
    jumps to 20.0 at 603 and to 18.8 at 678, one observation each. The labeller ends the burst's spike at 457 and
    labels nothing after it. Each jump was a warning of its own: two more pages for the incident already paged,
    false alarms with no cause in view (of the 26 second jumps on the 20 looked-at seeds, none was a labelled
    fault's own finding; three were such pages). Fails on 9a79da5 (two warnings). Now 'info' annotations at their
    steps, as a lone bad batch is outside an excursion, and streaming agrees. Guard: the LR raised x50 at 603 (a
    cause of its own in view) keeps that jump a warning."""
    steps, cols = _fresh_run("f344831-142")
    if lr_raised:
        cols["lr"] = cols["lr"] * np.where((steps >= 603) & (steps < 606), 50.0, 1.0)
    report = _fresh_report_of("f344831-142", steps, cols)
    [outer] = [f for f in report.findings if f.evidence.get("rule") != "nested"]
    assert (outer.onset_step, outer.severity, outer.self_recovered, outer.end_step) == (280, "warning", True, 707)
    nested = [(f.onset_step, f.severity) for f in report.findings if f.evidence.get("rule") == "nested"]
    assert nested == [(603, "warning" if lr_raised else "info"), (678, "info")], report.findings
    assert report.rollback is None, report.rollback
    _streams_alike("f344831-142", steps, cols, report)


# 119. A lift after an LR burst too weak to page on is noted: the LR column names the change point.

@pytest.mark.parametrize("case", ["as_logged", "lifted", "no_burst"])
def test_119_a_weak_lift_after_an_lr_burst_is_noted(case: str) -> None:
    """Real CPU training (fresh seed 822603's run 016, steps 0-499, ``tests/fixtures/fresh``): fp16, batch 83, an LR
    burst x15 over steps 270-273. The loss level over the 8 rows after it stands 0.315 above the 1.343 before:
    3.8 standard errors, under the bar of 4 that pages (``lr_shift_z``), and no observation passes a spike's bar.
    The labeller: a spike from 271 (4.3 of the twin's sigmas). Nothing was reported. Fails on de56eb8 (no finding).
    Now an 'info' annotation at 271 (``lr_note_z``: 3), no advice. Guards: the same lift 0.08 higher (4.7 standard
    errors) pages as before; the same rows with the LR left flat (no known change point) note nothing."""
    steps, cols = _fresh_run("f822603-016")
    if case == "lifted":
        cols["loss"] = np.where((steps >= 271) & (steps < 279), cols["loss"] + 0.08, cols["loss"])
    elif case == "no_burst":
        cols["lr"] = np.where((steps >= 270) & (steps < 274), cols["lr"][269], cols["lr"])
    report = _fresh_report_of("f822603-016", steps, cols)
    found = [(f.onset_step, f.severity, f.evidence["rule"], f.evidence["shift_se"] >= DEFAULT.divergence.lr_shift_z)
             for f in report.findings if f.kind == "spike"]
    expected = {"as_logged": [(271, "info", "lr_burst_change_point", False)],
                "lifted": [(271, "warning", "lr_burst_change_point", True)], "no_burst": []}[case]
    assert found == expected, report.findings
    assert report.rollback is None, report.rollback
    _streams_alike("f822603-016", steps, cols, report)


# 120. A spike inside the run's own heavy tail pages only past the tail's bar at the budget's risk.

@pytest.mark.parametrize("case", ["twin", "lr_raised", "light_tail", "stays_up"])
def test_120_a_spike_inside_a_heavy_tailed_runs_own_tail_is_noted(case: str) -> None:
    """Real CPU training, a clean twin (fresh seed 684426's run 050, steps 0-999, ``tests/fixtures/fresh``): fp32,
    batch 7, constant LR. Nothing injected; at 787 the batch-7 loss goes 1.45 -> 4.4 and is back after 86 steps,
    the gradient norm 2x. Its residuals' tail, fitted from the run's own clean block maxima, puts the bar a noise
    observation passes once in 10^6 at 9.2 sigmas; the excursion passed the bar of 6 (``tail_risk``'s, opening
    excursions, raised by this tail to 6.02) and paged: a false alarm of the kind that made 4 of the 13 on the
    clean twins of the 20 looked-at seeds. Fails on 114cb83 (a warning). Now an 'info' annotation that says why
    (``alarm_risk``). Guards: the LR raised x20 into it pages (a cause in view); on a light-tailed run (Gaussian
    noise, the single-observation bar not raised) a 6-8 sigma excursion pages as before, at the bar of 6; and on
    the same twin a jump that stays up (the loss 7 sigmas higher from row 500, 100 rows, under the tail's bar)
    pages as a shift would, far values in a row against the wander: critical, as at 9a79da5 (a review found it
    noted at f99adc7)."""
    if case == "light_tail":
        n = 1200
        steps, loss = np.arange(n), loss_curve(n, seed=4)
        loss[800:806] += 0.03 * np.array([8, 8, 7, 7, 6, 6])
        cols = {"loss": loss, "grad_norm": grad_curve(n), "lr": np.full(n, 1e-3)}
    else:
        steps, cols = _fresh_run("f684426-050-twin")
        if case == "lr_raised":
            cols["lr"] = np.where((steps >= 785) & (steps < 788), cols["lr"] * 20, cols["lr"])
    if case == "stays_up":
        steps, cols = steps[:600], {k: v[:600].copy() for k, v in cols.items()}
        d = np.diff(cols["loss"][300:500])
        cols["loss"][500:] += 7 * 1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2)
        report = analyze(rows_table(steps, **cols))
        [jump] = [f for f in report.findings if f.kind in ("spike", "divergence") and f.onset_step >= 490]
        assert (jump.onset_step, jump.severity, jump.needs_action) == (500, "critical", True), jump
        assert jump.evidence["alarm_sigmas"] > 9 and report.health == "action needed", jump
        return
    report = analyze(rows_table(steps, **cols))
    [spike] = [f for f in report.findings if f.kind == "spike" and f.onset_step >= 780]
    onset, severity = {"twin": (787, "info"), "lr_raised": (787, "warning"), "light_tail": (800, "warning")}[case]
    assert (spike.onset_step, spike.severity) == (onset, severity), spike
    bar = spike.evidence["alarm_sigmas"]
    assert bar > 9 if case != "light_tail" else bar == DEFAULT.spike.z_trigger, bar
    assert ("its paging bar of 9.24 sigmas" in spike.message) == (case == "twin"), spike.message
    _streams_alike(None, steps, cols, report)


# 121. Before a noise model exists, a rise within the spread the cold rows already show is their noise.

@pytest.mark.parametrize("case", ["as_logged", "resumed", "gross"])
def test_121_a_cold_rise_within_the_rows_own_spread_is_no_spike(case: str) -> None:
    """Real CPU training (fresh seeds 344831's run 130 and 937395's run 011, ``tests/fixtures/fresh``): fp16, batch 2
    and batch 1, a log every 5 steps; nothing injected into the loss. Before a segment's first 32 rows a baseline is
    cold, and a rise of 50% with the gradient norm doubled counted as gross. On 344831's run 130 the loss of the 16
    rows before step 135 spans 2.0-5.9 (a noise sigma of 1.01); 5.95 at 135 with the gradient norm x2 opened a
    spike whose cold scale (0.28) the loss never came back within: 'not back to its trend', critical, and checkpoint
    102 advised on a healthy run. On 937395's run 011 the segment resumed at 126, and its second row (4000% over its
    first, a memorised batch's 0.055) did the same. Of the 14 false alarms on the 20 looked-at seeds' faulted runs,
    4 were such cold rises, and 4 of the 10 on their clean twins. Fails on ae881e5 (a page, rollback advice). Now the
    cold scale is at least the spread of the rows before the row judged (``SpikeConfig.cold_spread_obs``; the
    parent's before a resume count, the level is the segment's own): no page, no advice. Guard: the loss at 12 for two
    rows from 135 (8.5 of those sigmas) with the gradient norm x4 still pages at once (and, back after it, advises
    nothing). Streaming reads both runs as offline does."""
    if case == "resumed":
        steps, cols = _fresh_run("f937395-011")
        seg = cols.pop("segment").astype(int)
        rows = rows_table(steps, seg, **cols)
        events = _fresh_events("f937395-011-events.json")
        report = analyze(rows, events)
        assert _alarms(report, "spike") == [] and report.rollback is None, report.findings
        _table_streams_alike(rows, events, report.findings)
        return
    steps, cols = _fresh_run("f344831-130")
    if case == "gross":
        hit = (steps == 135) | (steps == 140)
        cols["loss"] = np.where(hit, 12.0, cols["loss"])
        cols["grad_norm"] = np.where(hit, 4 * cols["grad_norm"], cols["grad_norm"])
    report = _fresh_report_of("f344831-130", steps, cols)
    paged = [(f.onset_step, f.severity) for f in _alarms(report, "spike")]
    assert paged == ([] if case == "as_logged" else [(135, "warning")]), report.findings
    assert report.rollback is None, report.rollback
    _streams_alike("f344831-130", steps, cols, report)


# 122. A ramp riding a decaying schedule inside an excursion not back is a second cause, though the logged LR falls.

@pytest.mark.parametrize("name,expected", [("f726552-032", [608]), ("f884729-077", [])])
def test_122_a_ramp_on_a_decay_inside_an_unrecovered_excursion_is_a_divergence_of_its_own(name: str,
                                                                                       expected: list[int]) -> None:
    """Real CPU training (fresh seed 726552's run 032, ``tests/fixtures/fresh``): fp32, batch 3, a linear decay of
    0.9% a step. An LR burst x226 at 404 throws the loss 2.6 -> 222 and it never comes back (the right checkpoint is
    303); from update 607 an LR ramp of x1.0018 a step rides the decay, so the logged LR still falls (0.00063 ->
    0.00036 by the last row) and no row rises over an earlier one. The labeller has a divergence from 608 beside the
    spike; runwatch read nothing of it, since the second-cause rule asked for a raise over the LR's low
    (``lr_raised_since``). Fails on 377ee7f. The ramp lifted the LR off the schedule's path, read as the spike's LR
    story and the precursor read it (``lr_rise_start``: ``off_path_rise``): a divergence of its own from 608,
    critical, and the rollback still precedes the spike. Guard (fresh seed 884729's run 077): cosine with warm
    restarts, an LR burst's spike from 393 never back, and the schedule's restart at 1593 inside it steps log LR's
    slope as a ramp's first update does; a restart is the schedule, no second cause (it was one, "raised x1", before
    ``lr_rise_start`` asked ``warm_restart`` of a ramp). Streaming reads both as offline does."""
    steps, cols = _fresh_run(name)
    report = _fresh_report_of(name, steps, cols)
    inside = [f for f in report.findings if f.evidence.get("rule") == "lr_raise_inside"]
    assert [f.onset_step for f in inside] == expected, report.findings
    spike = [f for f in _alarms(report, "spike") if f.self_recovered is False]
    assert [f.onset_step for f in spike] == [405 if expected else 393], report.findings
    if expected:
        [divergence] = inside
        assert (divergence.kind, divergence.severity, divergence.evidence["lr_rise_step"]) == ("divergence", "critical",
                                                                                              607), divergence
        assert "left its schedule's path at step 607, a ramp riding its decay" in divergence.message, divergence.message
        assert report.rollback is not None and report.rollback.checkpoint_step == 303, report.rollback
    _streams_alike(name, steps, cols, report)


def _lr_schedule(schedule: str, n: int) -> np.ndarray:
    """A 100-step warm-up to 1e-3, then a linear decay to a floor of 1e-4 at 1200 held after it ("floor"), or a cosine
    to 1e-5 restarting every 1000 steps ("restarts")."""
    t = np.arange(n, dtype=float)
    if schedule == "floor":
        body = np.interp(t, [100, 1200], [1e-3, 1e-4])
    else:
        body = 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + np.cos(np.pi * (np.maximum(t - 100, 0) % 1000) / 1000))
    return np.where(t < 100, 1e-3 * (t + 1) / 100, body)


@pytest.mark.parametrize("schedule,n", [("floor", 1600), ("restarts", 2080)])
@pytest.mark.parametrize("seed", range(3))
def test_122_guard_the_schedules_own_bends_inside_an_unrecovered_excursion_are_no_second_cause(schedule: str, n: int,
                                                                                                seed: int) -> None:
    """An LR burst x100 at 800-802 throws the loss +3 for good; after it the schedule bends log LR's slope up as a
    ramp's first update does: a linear decay reaching its floor at 1200 and holding there, or a cosine's warm restart
    at 1100 read from a window that starts past the first cycle's peak (the run trained at 1e-3 before it; the last
    row, at the end of the second cycle, lies under the restart's low x1.5, so only the off-path branch sees it).
    Neither is a cause. A review of d89fec3 found both read as "left its schedule's path", a critical second
    divergence."""
    steps, lr = np.arange(n), _lr_schedule(schedule, n)
    lr[800:803] *= 100
    loss, grad = loss_curve(n, seed=seed), grad_curve(n, seed=seed + 10)
    loss[801:] += 3.0
    grad[801:] *= 5.0
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad, lr=lr))
    assert [f.onset_step for f in _alarms(report, "spike")] == [801], report.findings
    assert not [f for f in report.findings if f.evidence.get("rule") == "lr_raise_inside"], report.findings
    assert lr_rise_start(steps, lr, n - 1, DEFAULT.lr, since=950) is None


@pytest.mark.parametrize("every", [1, 10, 25])
@pytest.mark.parametrize("after_floor", [1, 5, 8, 12])
def test_122_guard_a_ramp_from_the_floor_is_still_a_rise(every: int, after_floor: int) -> None:
    """A ramp of x1.0015 a step that starts ``after_floor`` rows after the decay reached its floor (1200) is a rise,
    asked 200 steps into it, however the rows are spaced: dated at its first row, or, starting within the rows the
    slope after the floor is read over (``kink_rows``), at the floor's first row (early: the advice precedes it). A
    re-review of test 122's floor rule found such a ramp unseen when it starts 5-8 rows after the floor (the floor's
    own step in the slope raised the kink bar)."""
    steps = np.arange(0, 2000, every)
    lr = _lr_schedule("floor", 2000)[steps]
    first = int(np.searchsorted(steps, 1200)) + after_floor
    lr = (lr * np.where(steps >= steps[first], 1.0015 ** (steps - steps[first] + every), 1.0))
    lr = lr.astype(np.float32).astype(np.float64)
    onset = int(np.searchsorted(steps, steps[first] + 200))
    found, floor = lr_rise_start(steps, lr, onset, DEFAULT.lr), first - after_floor + 1
    assert found == first or (after_floor <= DEFAULT.lr.kink_rows and found == floor), (found, first)


def test_122_a_raise_too_recent_to_judge_does_not_hide_a_cause_before_it() -> None:
    """Real CPU training (fresh seed 270333's run 001, ``tests/fixtures/fresh``): fp32, batch 9, cosine with warm
    restarts, a log every 10 steps, checkpoints every 41. An LR burst x6 at 698 throws the loss 1.5 -> 70 and it never
    comes back (the right checkpoint is 656); an LR jump x24 at 1230 stays (the labeller's divergence from 1240), and
    the schedule's next restart lands on the last row, 1427, where it reads as a raise over the low, one row old:
    too recent to judge, and the rule stopped there. The first review of d89fec3 pointed at it. Fails on f652246.
    Now a raise too recent to judge is passed over for the rise into the last row, as a raise before the
    confirmation is: the jump from 1230, a divergence of its own beside the spike; the advice still precedes the
    spike. Streaming reads it as offline does."""
    steps, cols = _fresh_run("f270333-001")
    report = _fresh_report_of("f270333-001", steps, cols)
    assert [(f.kind, f.onset_step, f.evidence.get("rule")) for f in _alarms(report)] == [
        ("spike", 700, "shewhart"), ("divergence", 1230, "lr_raise_inside")], report.findings
    assert report.rollback is not None and report.rollback.checkpoint_step == 656, report.rollback
    _streams_alike("f270333-001", steps, cols, report)


# 123. A bad batch of a few steps at 4-5 sigmas each is found by the burst CUSUM at three observations.

@pytest.mark.parametrize("case", ["faulty", "twin"])
def test_123_a_three_step_bad_batch_is_found(case: str) -> None:
    """Real CPU training (fresh seed 520650's run 141, ``tests/fixtures/fresh``): fp32, batch 32, constant LR after a
    62-step warm-up, noisy host. A bad batch of three steps at 226-228 (the loss 2.1 -> 3.96, 3.69, 3.78; the labeller
    sizes it 8.2 of its twin's sigmas) and one of a single step at 674 (1.26 -> 7.44). Each of the three rows is 4-5
    of the detector's sigmas, under the single-observation bar of 6, and the burst CUSUM (residuals clipped at 4,
    less ``burst_k`` = 2, so at most 2 a row) needed a fifth row to pass 8. Fails on 52d7ad5 (674 found alone). Now
    ``burst_h`` lets three rows near the clip pass it: both bad batches are 'info' notes, back at once, and nothing
    needs action; the first is named for what it is, no row past the single-observation bar. The clean twin (the
    same batches without the fault) reads no loss finding at all. Streaming reads it as offline does."""
    name = "f520650-141" + ("-twin" if case == "twin" else "")
    steps, cols = _fresh_run(name)
    report = _fresh_report_of("f520650-141", steps, cols)
    loss = [(f.onset_step, f.severity, f.self_recovered) for f in report.findings if f.kind in ("spike", "divergence")]
    assert loss == ([(226, "info", True), (674, "info", True)] if case == "faulty" else []), report.findings
    if case == "faulty":
        burst = report.findings[[f.onset_step for f in report.findings].index(226)]
        assert burst.message.startswith("short loss burst, 3 observations out of band (a bad batch?)"), burst.message
        assert "(a short burst alone: no observation far out" in burst.message, burst.message
    assert report.rollback is None, report.rollback
    _streams_alike("f520650-141", steps, cols, report)


# 124. A burst only the noting bar sees carries no excursion on, and a CUSUM's lead-in says nothing of the band.

@pytest.mark.parametrize("name", ["f822603-021", "f209294-023"])
def test_124_three_rows_near_the_clip_do_not_move_an_incident(name: str) -> None:
    """Real CPU training, two runs the forty-fourth round's lower burst interval (three rows near the clip, test 123)
    read worse; both pass on 8228f7c and fail on 80b98b0.

    f822603-021 (fresh seed 822603's run 021, ``tests/fixtures/fresh``): fp32, batch 95, a multistep schedule, noisy
    host, checkpoints every 42. An LR burst x289 at 800 throws the loss 1.0 -> 4.6 and it is back on its trend at
    1044; the labeller: a spike that needs nothing. Three rows of the run's own noise near the clip inside its
    settling window (its lasting cost's 32 rows) were read as its aftershock, the spike as never back, and
    checkpoint 798 advised. In that window only what pages carries it on (``burst_lasted_h``).

    f209294-023 (fresh seed 209294's run 023): fp32, batch 72, a step schedule, checkpoints every 23. The loss jumps
    at 929 (8.3 sigmas, the clean twin's alike, no label) and wanders 2-3.5 sigmas up until an LR jump x13 at 996
    that stays (the labeller's divergence from 997, right checkpoint 989). The rows before the jump are in band by
    their median, as they were, and the last of them out, which the first reviewed version took as an excursion
    under way: a divergence from 929, checkpoint 920. A row out just before the jump is no more than any other."""
    steps, cols = _fresh_run(name)
    report = _fresh_report_of(name, steps, cols)
    loss = [(f.kind, f.onset_step, f.severity) for f in _alarms(report) if f.kind in ("spike", "divergence")]
    if name == "f822603-021":
        assert loss == [("spike", 801, "warning")] and report.rollback is None, (report.findings, report.rollback)
    else:
        later = [onset for _, onset, _ in loss if onset > 900]
        assert ("divergence", 997, "critical") in loss and min(later) == 997, loss
        assert report.rollback.checkpoint_step == 989, report.rollback
    _streams_alike(name, steps, cols, report)


# 125. Whether the loss moved is read against the baseline the episode froze, from its onset on.

def test_125_a_gradient_led_spike_whose_loss_moved_closes_when_the_loss_is_back() -> None:
    """Real CPU training (fresh seed 431310's run 102, ``tests/fixtures/fresh``): fp32, batch 35, cosine with warm
    restarts after a 27-step warm-up, checkpoints every 33. An LR burst x28 at 62 lifts the gradient norm first and the
    loss to 6.8 of the detector's sigmas at 68 (the labeller: a spike that needs nothing); an LR burst x52 at 466
    throws the loss 1.3 -> 6 and it never gets back to its clean twin's level (a spike that needs action, the right
    checkpoint 462). An episode the gradient norm led closes on the loss alone once the loss itself moved, and the loss
    here is back under its level by 75; but "moved" was read at the opening against the live baseline, which had taken
    in the rows lifted since the onset, and said no. The gradient norm, which early training settles ~45% higher, then
    held the episode open for 474 steps: the second burst was inside it, one 'warning' came back at 536, and no
    advice was given. Fails on da9c701. Read against the frozen baseline as every later row is, the first burst is a
    note back at 68 and the second a critical spike of its own. Streaming reads it as offline does."""
    steps, cols = _fresh_run("f431310-102")
    report = _fresh_report_of("f431310-102", steps, cols)
    loss = [(f.onset_step, f.end_step, f.severity) for f in report.findings if f.kind in ("spike", "divergence")]
    assert loss == [(63, 68, "info"), (467, 547, "critical")], report.findings
    assert report.rollback is not None and report.rollback.checkpoint_step == 462, report.rollback
    _streams_alike("f431310-102", steps, cols, report)


# 126. A lift still there when an LR raise came keeps the incident's onset; the run's own wander there too (known).

@pytest.mark.parametrize(("start", "seed"), [(585, s) for s in range(8)] + [(565, s) for s in (8, 9, 12)])
def test_126_a_lift_still_there_at_the_raise_keeps_its_onset(start: int, seed: int) -> None:
    """A lift of 3 noise sigmas from row ``start`` that stays, the LR growing x1.05 a step from 603 and the loss
    climbing with it, the alarm after the growth began (``_not_before_its_cause``). The rows from the lift to the
    raise carry a lift of their own, and the advice precedes it. The forty-fifth round tried calling a lift over
    when its latest ``recovery_obs`` rows before the raise were in band (dde513e: 604 and checkpoint 602, inside the
    lift, on seeds 1, 3, 6 and 7 from 585) and, after a review, in band and under ``growth_z`` by themselves (81eee45:
    the same from 565 on seeds 8, 9 and 12, where the falling trend leaves the latest rows nearest a flat level).
    Eight rows cannot tell a lift that lasts from one that ended: both were reverted, and these cases guard it."""
    n = 1000
    loss, grad = loss_curve(n, seed=seed), grad_curve(n, seed=seed + 10)
    lr = np.full(n, 1e-3)
    lr[603:] *= 1.05 ** np.arange(1, n - 603 + 1)
    loss[start:] += 0.09
    loss[606:] += 0.002 * np.arange(1, n - 606 + 1)
    report = analyze(rows_table(np.arange(n), loss=loss, grad_norm=grad, lr=lr),
                     _ckpts(list(range(500, 603, 10)) + [598, 602]))
    first = min(report.findings, key=lambda f: f.onset_step)
    assert first.kind == "divergence" and first.onset_step <= start + 1, report.findings
    assert report.rollback is not None and report.rollback.checkpoint_step <= start - 5, report.rollback


@pytest.mark.xfail(strict=True, reason="known limit: the loss alone cannot tell the run's own wander before an LR "
                                        "raise from a lift that lasts (test 126's guard)")
@pytest.mark.parametrize("name", ["f551533-024", "f685406-129", "f911723-118"])
def test_126_the_runs_own_wander_before_an_lr_raise_dates_its_incident_early(name: str) -> None:
    """Real CPU training, three runs whose LR grows off the schedule and stays up; the labeller (who has the clean
    twin) dates each divergence at the growth's first consequence. The CUSUM alarmed only after the growth, its last
    zero tens of rows before it, and the rows from there stand ``growth_z`` standard errors above the level: a lift
    of the run's own noise that the twin shows alike, which the loss alone cannot tell from a real one that lasts
    (the guard above), so the onset stays early and the advice is a checkpoint too early.

    f551533-024 (fresh seed 551533's run 024, ``tests/fixtures/fresh``): fp32, batch 4, multistep, checkpoints every
    45; a bump at 756-761, the LR growing from 767: dated 756, checkpoint 720 for 765. f685406-129: fp32, batch 17,
    constant LR, checkpoints every 69; two rows out at 277-278, the loss ~1 sigma up after them, the LR growing from
    301: 277, checkpoint 207 for 276. f911723-118: fp16, batch 3, linear decay, checkpoints every 78; an LR ramp
    riding the decay from 1886: 1847, checkpoint 1794 for 1872. Strict: a change that gets one right must say so."""
    steps, cols = _fresh_run(name)
    # The fp16 run's scaler as its run.json states it (without it the start-up calibration reads as a collapse).
    meta = {"scaler": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 22}} \
        if name == "f911723-118" else None
    report = analyze(rows_table(steps, **cols), _fresh_events(f"{name}-checkpoints.json"), meta=meta)
    onset, checkpoint = {"f551533-024": (768, 765), "f685406-129": (302, 276), "f911723-118": (1887, 1872)}[name]
    late = [(f.kind, f.onset_step) for f in report.findings
            if f.kind in ("spike", "divergence") and f.onset_step > onset - 100]
    assert late == [("divergence", onset)] and report.rollback.checkpoint_step == checkpoint, report.findings
