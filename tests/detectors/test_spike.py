"""Spike detector on synthetic series: onsets, recovery, and the things that must not be findings."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.detectors.spike import detect_spikes
from tests.detectors.synth import grad_curve, loss_curve

N = 2000


def _spike(loss: np.ndarray, at: int, height: float, length: int) -> np.ndarray:
    out = loss.copy()
    out[at:at + length] += height * np.exp(-np.arange(length) / max(length / 3, 1))
    return out


def test_clean_run_with_warmup_has_no_finding() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[:50] = 10.0 - np.arange(50) * 0.1  # warm-up: the loss falls fast
    assert detect_spikes(steps, loss, grad_curve(N)) == []


def test_recovered_spike_onset_and_no_action() -> None:
    steps = np.arange(N)
    loss = _spike(loss_curve(N), 1200, 1.5, 30)
    [f] = detect_spikes(steps, loss, grad_curve(N))
    assert f.kind == "spike" and f.onset_step == 1200
    assert f.self_recovered is True and not f.needs_action and f.severity == "warning"
    assert 1200 <= f.peak_step <= 1205 and 1210 <= f.end_step <= 1230


def test_grad_norm_moving_first_sets_onset() -> None:
    # BLOOM 31214: grad norm 0.24 -> 0.95 while the loss barely moved, the loss follows.
    steps = np.arange(N)
    loss = _spike(loss_curve(N), 1203, 2.0, 25)
    grad = grad_curve(N)
    grad[1200:1230] *= 4.0
    grad[1203:1215] *= 50.0
    [f] = detect_spikes(steps, loss, grad)
    assert f.onset_step == 1200
    assert f.evidence["grad_norm_moved_first"] is True


def test_unrecovered_spike_needs_action() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[1000:] += 1.0  # jumps and stays up
    [f] = [f for f in detect_spikes(steps, loss, grad_curve(N)) if f.needs_action]
    assert f.onset_step == 1000 and f.self_recovered is False and f.severity == "critical"
    assert f.end_step == N - 1 and f.evidence["recovery_steps"] is None  # followed to the end, never closed early


def test_fresh_spike_at_the_end_is_pending_not_an_alarm() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[N - 10:] += 1.0
    [f] = detect_spikes(steps, loss, grad_curve(N))
    assert f.self_recovered is None and not f.needs_action and f.onset_step == N - 10


def test_spike_out_for_a_whole_block_at_the_end_is_an_alarm() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[N - 20:] += 1.0
    [f] = detect_spikes(steps, loss, grad_curve(N))
    assert f.self_recovered is False and f.needs_action and f.onset_step == N - 20


def test_sparse_logging_every_100_steps() -> None:
    steps = np.arange(400) * 100
    loss = _spike(loss_curve(400, noise=0.02), 250, 1.0, 6)
    [f] = detect_spikes(steps, loss, grad_curve(400))
    assert f.onset_step == 25000 and f.self_recovered is True


def test_two_step_bad_batch_is_a_recovered_warning() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[1500:1502] += 5.0  # two corrupt batches, back at once: it persisted past one observation
    [f] = detect_spikes(steps, loss, grad_curve(N))
    assert (f.onset_step, f.end_step) == (1500, 1501) and f.severity == "warning" and not f.needs_action
    assert f.self_recovered is True and f.evidence["recovery_steps"] == 2


def test_one_step_bad_batch_at_five_times_the_loss_is_info() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[1500] *= 5.0
    [f] = detect_spikes(steps, loss, np.full(N, np.nan))
    assert (f.onset_step, f.severity, f.self_recovered, f.needs_action) == (1500, "info", True, False)


def test_lr_step_decay_is_not_a_finding() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[1000:] -= 0.4  # LR step decay: the loss drops
    assert detect_spikes(steps, loss, grad_curve(N)) == []


def test_heavy_tailed_single_step_bumps_are_never_alarms() -> None:
    # modded-nanogpt: many one-step +0.5..1.5 bumps that recover at the next step.
    rng = np.random.default_rng(3)
    steps = np.arange(N)
    loss = loss_curve(N, noise=0.1)
    bumps = rng.choice(np.arange(100, N, 4), size=40, replace=False)  # single steps, never adjacent
    loss[bumps] += rng.uniform(0.5, 1.5, size=40)
    found = detect_spikes(steps, loss, np.full(N, np.nan))
    assert all(f.severity == "info" and not f.needs_action for f in found)
    assert len(found) < 40  # the run's own heavy tail raises the single-observation bar


@pytest.mark.parametrize("ratio", [5.3, 7.5])
def test_one_step_grad_norm_blip_is_info_only(ratio: float) -> None:
    # llm.c steps 7435 and 9025: grad norm 1.44 and 2.02 against a median of 0.27, back at once.
    steps = np.arange(N)
    grad = grad_curve(N, level=0.27)
    grad[1500] = 0.27 * ratio
    [f] = detect_spikes(steps, loss_curve(N), grad)
    assert f.severity == "info" and f.self_recovered is True and not f.needs_action
    assert f.onset_step == 1500


def test_two_to_three_x_grad_norm_noise_is_quiet() -> None:
    steps = np.arange(N)
    grad = grad_curve(N, level=0.27)
    grad[[400, 900, 1300, 1700]] *= 2.8
    assert detect_spikes(steps, loss_curve(N), grad) == []


def test_nan_values_do_not_crash_or_count_as_recovery() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[1000:1010] = np.nan
    assert detect_spikes(steps, loss, grad_curve(N)) == []
