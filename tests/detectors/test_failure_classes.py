"""Regression tests for the classes of failure the detectors issue named (the README-loop ones, 8-11, are in
test_user_loop.py; the main-line cut, 10, also in tests/data/test_store.py)."""

from __future__ import annotations

import numpy as np
import pytest

from runwatch.detectors.analysis import analyze, overlaps
from runwatch.detectors.finding import Finding
from runwatch.detectors.scaler_collapse import detect_scaler_collapse
from runwatch.detectors.slowdown import detect_slowdowns
from tests.detectors.synth import events_table, grad_curve, loss_curve, rows_table

N = 3000


def _ckpts(steps: list[int]) -> list[dict]:
    return [{"event": "checkpoint", "step": s, "payload": {"path": f"/ckpt/{s}"}} for s in steps]


def test_1_a_late_recovery_is_a_recovery_and_does_not_push_later_advice_back() -> None:
    steps = np.arange(N)
    loss, grad = loss_curve(N), grad_curve(N)
    loss[800:1400] += 1.5 * np.exp(-np.arange(600) / 150)  # back to its trend after ~600 steps
    finished = analyze(rows_table(steps[:2000], loss=loss[:2000], grad_norm=grad[:2000]), events_table(_ckpts([500, 1500])))
    [spike] = [f for f in finished.findings if f.kind == "spike"]
    assert spike.self_recovered is True and not spike.needs_action and spike.severity == "warning"
    assert 300 <= spike.evidence["recovery_steps"] <= 700 and "lasting_cost" in spike.evidence
    assert finished.rollback is None and finished.health != "action needed"
    # A real problem later: the advice is the checkpoint before it, not before the recovered spike.
    loss[2500:] += np.linspace(0, 4, N - 2500)
    grad[2500:] *= np.linspace(1, 8, N - 2500)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad), events_table(_ckpts([500, 1500, 2400])))
    assert report.rollback is not None and report.rollback.checkpoint_step == 2400, report.rollback


def test_2_a_small_sustained_shift_is_caught_by_the_cusum() -> None:
    """The issue's case: a few steps of raised LR lift the loss ~3 sigmas for ~20 steps. The CUSUM bank sees
    it and the raised LR corroborates it: a warning. The same lift with the LR steady and the gradient norm
    quiet is still found, as an annotation (``SpikeConfig.corroborate_shifts``: training's own loss wanders
    in such shifts with nothing wrong); the clean run raises nothing."""
    rng = np.random.default_rng(7)
    steps = np.arange(N)
    loss = 3.0 + 2.0 * np.exp(-steps / 300) + rng.normal(0, 0.05, N)
    loss[1500:1520] += 3 * 0.05  # ~3 sigma for 20 steps: no single observation stands out
    assert (loss[1500:1520] - (3.0 + 2.0 * np.exp(-steps[1500:1520] / 300))).max() < 6 * 0.05
    lr = np.full(N, 3e-4)
    lr[1496:1500] *= 4  # the cause: four updates at 4x the LR
    for logged, severity in ((True, "warning"), (False, "info")):
        cols = {"lr": lr} if logged else {}
        report = analyze(rows_table(steps, loss=loss, grad_norm=grad_curve(N), **cols))
        found = [f for f in report.findings if f.kind == "spike" and 1490 <= f.onset_step <= 1510]
        # Either CUSUM of the bank (a 3-sigma shift adds 1 per observation above the burst CUSUM's k = 2 and
        # reaches its interval of 8 before the 2.5 per observation above k = 0.5 reach 24): not a Shewhart.
        assert found and found[0].evidence["rule"] in ("cusum", "burst"), report.findings
        assert (found[0].severity, found[0].evidence["uncorroborated"]) == (severity, not logged), found[0]
    assert "noted, not paged" in found[0].message
    clean = analyze(rows_table(steps, loss=3.0 + 2.0 * np.exp(-steps / 300) + rng.normal(0, 0.05, N),
                               grad_norm=grad_curve(N)))
    assert [f for f in clean.findings if f.severity != "info"] == []


def test_3_divergence_onset_is_the_trend_break_and_the_rollback_precedes_the_ramp() -> None:
    steps = np.arange(N)
    loss, grad = loss_curve(N), grad_curve(N)
    grad[1500:] *= np.exp(np.linspace(0, 2.5, N - 1500))  # the gradient norm starts growing at 1500...
    loss[2200:] += np.linspace(0, 3, N - 2200)  # ...the loss climbs only from 2200
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad), events_table(_ckpts([1000, 1400, 1800, 2100])))
    [div] = [f for f in report.findings if f.kind == "divergence"]
    assert 1450 <= div.onset_step <= 1600 and div.evidence["loss_climb_step"] >= 2150
    assert report.rollback.checkpoint_step == 1400, report.rollback.reason


def _noisy_host(n: int, rng: np.random.Generator, amp: float = 0.2, phi: float = 0.97) -> np.ndarray:
    wander = np.zeros(n)
    eps = rng.normal(0, amp * np.sqrt(1 - phi ** 2), n)
    for i in range(1, n):
        wander[i] = phi * wander[i - 1] + eps[i]
    return 2.0 * np.exp(wander + rng.normal(0, 0.03, n))


def test_4_a_noisy_host_pages_only_beyond_its_own_wander() -> None:
    rng = np.random.default_rng(3)
    n = 100_000  # a host whose step time wanders 20-50% for tens of steps
    st = _noisy_host(n, rng)
    assert [f for f in detect_slowdowns(np.arange(n), st) if f.severity != "info"] == []
    slow = st.copy()
    slow[60_000:61_000] *= 3.0  # a real slowdown, far beyond the wander
    found = [f for f in detect_slowdowns(np.arange(n), slow) if f.severity != "info"]
    assert [(f.kind, abs(f.onset_step - 60_000) <= 20) for f in found] == [("slowdown", True)]


def test_5_every_step_skipped_at_a_pinned_floor_is_a_collapse() -> None:
    steps = np.arange(2000)
    scale = np.full(2000, 1024.0)
    skipped = np.zeros(2000, bool)
    scale[1500:] = 1.0  # DeepSpeed: "Attempted loss scale: 1, reducing to 1", every step
    skipped[1500:] = True
    [f] = detect_scaler_collapse(steps, scale, found_inf=skipped)
    assert f.needs_action and f.severity == "critical" and f.evidence["still_skipping"]
    assert 1500 <= f.onset_step <= 1510 and not f.evidence["below_floor"]
    # Pinned from the start of the log, with no halving to see at all.
    [f] = detect_scaler_collapse(steps[1500:], scale[1500:], found_inf=skipped[1500:])
    assert f.needs_action and f.onset_step <= 1505


@pytest.mark.parametrize("first_step, is_collapse", [(0, False), (10_000, True)])
def test_6_calibration_is_a_property_of_the_step_not_the_row(first_step: int, is_collapse: bool) -> None:
    # The same opening rows: 12 halvings from 2^16 on consecutive steps, then a steady scale. At the start of
    # training that is GradScaler calibrating; in an excerpt that starts at step 10000 it is a collapse.
    steps = first_step + np.arange(400)
    scale = np.full(400, 16.0)
    scale[:12] = 65536.0 / 2.0 ** np.arange(12)
    found = detect_scaler_collapse(steps, scale)
    assert bool(found) is is_collapse


def _f(onset: int, end: int, segment: int = 0) -> Finding:
    return Finding(kind="spike", onset_step=onset, end_step=end, peak_step=onset, segment=segment,
                   severity="warning", self_recovered=True, needs_action=False)


@pytest.mark.parametrize("a, b, expected", [
    ((100, 200), (150, 250), True),  # partly overlapping
    ((100, 200), (200, 300), True),  # touching at one step
    ((100, 200), (900, 950), False),  # a later, unrelated finding
    ((900, 950), (100, 200), False),  # the same, the other way round
    ((100, 900), (300, 400), True),  # one inside the other
    ((300, 400), (100, 900), True),
    ((100, 200), (201, 300), False),  # adjacent, not overlapping
])
def test_7_overlaps_is_a_real_interval_intersection(a: tuple, b: tuple, expected: bool) -> None:
    assert overlaps(_f(*a), _f(*b)) is expected
    assert overlaps(_f(*a), _f(*b, segment=1)) is False  # other segments never overlap
