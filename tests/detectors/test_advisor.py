"""Rollback advice and segment handling through analyze(): checkpoint choice, walk-back, deleted checkpoints, history."""

from __future__ import annotations

import numpy as np

from runwatch.detectors.analysis import analyze
from tests.detectors.synth import events_table, grad_curve, loss_curve, rows_table

N = 3000


def _ckpts(steps: list[int], **payload_by_step: dict) -> list[dict]:
    return [{"event": "checkpoint", "step": s, "payload": {"path": f"/ckpt/step{s}", "bytes": 1000, "write_seconds": 0.5,
                                                          **payload_by_step.get(f"s{s}", {})}} for s in steps]


def _unrecovered_spike_run(at: int = 2000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    loss, grad = loss_curve(N), grad_curve(N)
    loss[at:] += 1.2
    grad[at:at + 10] *= 20
    return np.arange(N), loss, grad


def test_latest_checkpoint_before_onset_and_skip_window() -> None:
    steps, loss, grad = _unrecovered_spike_run()
    rows = rows_table(steps, loss=loss, grad_norm=grad, samples=(steps + 1) * 8.0, time=steps * 1.0)
    report = analyze(rows, events_table(_ckpts([1000, 1500, 1900, 2000, 2500])))
    assert report.health == "action needed"
    rb = report.rollback
    assert rb.checkpoint_step == 1900 and rb.checkpoint_path == "/ckpt/step1900" and not rb.checkpoint_missing
    a, b = rb.skip_batches
    assert a == 1901 and b >= 2100 and b - a + 1 >= 200
    assert rb.evidence["skip_samples"][0] == a * 8
    assert any("skip batches" in x for x in rb.actions)


def test_deleted_checkpoint_is_said_and_the_next_one_used() -> None:
    steps, loss, grad = _unrecovered_spike_run()
    rows = rows_table(steps, loss=loss, grad_norm=grad)
    events = _ckpts([1000, 1500, 1900], s1900={"deleted": True})
    rb = analyze(rows, events_table(events)).rollback
    assert rb.checkpoint_step == 1500 and rb.checkpoint_missing and "1900" in rb.reason
    # A 'note' event saying the file was deleted works too, and so does a path not on disk.
    events = _ckpts([1000, 1500, 1900]) + [{"event": "note", "step": 1950, "payload": {"path": "/ckpt/step1900", "deleted": True}}]
    assert analyze(rows, events_table(events)).rollback.checkpoint_step == 1500
    # A note that merely mentions deletion does not delete anything.
    events = _ckpts([1000, 1500, 1900]) + [{"event": "note", "step": 1950, "payload": {"path": "/ckpt/step1900", "text": "not deleted"}}]
    assert analyze(rows, events_table(events)).rollback.checkpoint_step == 1900
    rb = analyze(rows, events_table(_ckpts([1000, 1500, 1900])), present_paths={"/ckpt/step1000"}).rollback
    assert rb.checkpoint_step == 1000 and rb.checkpoint_missing


def test_walks_back_before_activation_norm_growth() -> None:
    steps = np.arange(N)
    loss, grad = loss_curve(N), grad_curve(N)
    act = np.full(N, 20.0) + np.random.default_rng(0).normal(0, 0.1, N)
    act[1400:] *= np.linspace(1.0, 3.0, N - 1400)  # grows long before the loss moves (slow LR ramp)
    loss[2300:] += np.linspace(0, 3, N - 2300)
    rows = rows_table(steps, loss=loss, grad_norm=grad, act_norm=act)
    report = analyze(rows, events_table(_ckpts([1000, 1300, 1600, 2000, 2200])))
    [f] = [f for f in report.findings if f.needs_action]
    assert f.kind == "divergence"
    # The onset of a divergence is where the trend broke, not where the loss crossed a line.
    assert 1350 <= f.onset_step <= 1450 and f.evidence["act_norm_climb_step"] == f.onset_step
    assert f.evidence["loss_climb_step"] >= 2250
    rb = report.rollback
    assert rb.checkpoint_step == 1300, rb.reason
    assert any("learning rate" in x for x in rb.actions) and any("clipping" in x for x in rb.actions)


def test_unhealthy_checkpoint_under_collapsed_scale_is_skipped_and_bf16_advised() -> None:
    steps = np.arange(N)
    loss, grad = loss_curve(N), grad_curve(N)
    scale = np.full(N, 65536.0)
    scale[1700:1716] = 65536.0 / 2.0 ** np.arange(1, 17)  # burst of halvings to 1, never regrows
    scale[1716:] = 0.5
    rows = rows_table(steps, loss=loss, grad_norm=grad, loss_scale=scale)
    report = analyze(rows, events_table(_ckpts([1500, 1800, 2500])))
    [f] = [f for f in report.findings if f.needs_action]
    assert f.kind == "scaler_collapse" and f.onset_step == 1700
    assert report.rollback.checkpoint_step == 1500
    assert any("BF16" in x for x in report.rollback.actions)


def test_self_recovered_spike_means_no_rollback() -> None:
    steps = np.arange(N)
    loss, grad = loss_curve(N), grad_curve(N)
    loss[2900:2930] += 1.5 * np.exp(-np.arange(30) / 8)
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad), events_table(_ckpts([1000, 2000])))
    [f] = report.findings
    assert f.self_recovered and f.open and report.health == "watching" and report.rollback is None


def test_old_self_recovered_spike_is_history() -> None:
    steps = np.arange(N)
    loss = loss_curve(N)
    loss[1000:1030] += 1.5 * np.exp(-np.arange(30) / 8)
    report = analyze(rows_table(steps, loss=loss), None)
    assert [f.open for f in report.findings] == [False] and report.health == "healthy"


def test_rolled_back_spike_is_history_and_main_line_judged_alone() -> None:
    # Segment 0 spikes at 1500 and never recovers; segment 1 resumed from the 1400 checkpoint and is clean.
    s0 = np.arange(0, 2000)
    loss0 = loss_curve(2000)
    loss0[1500:] += 1.0
    s1 = np.arange(1400, 3000)
    loss1 = loss_curve(3000, seed=5)[1400:]
    rows = rows_table(np.concatenate([s0, s1]), segment=np.concatenate([np.zeros(2000), np.ones(1600)]),
                      loss=np.concatenate([loss0, loss1]))
    report = analyze(rows, events_table(_ckpts([1400])))
    assert [(s.segment, s.first_step, s.last_step, s.abandoned_from) for s in report.segments] == [(0, 0, 1999, 1400), (1, 1400, 2999, None)]
    [f] = report.findings
    assert f.segment == 0 and f.onset_step == 1500 and not f.open and f.needs_action
    assert report.health == "healthy" and report.rollback is None


def test_to_dict_is_strict_json_with_the_contract_keys() -> None:
    import json

    steps, loss, grad = _unrecovered_spike_run()
    loss[2990:] = np.nan
    report = analyze(rows_table(steps, loss=loss, grad_norm=grad), events_table(_ckpts([1900])))
    out = json.loads(json.dumps(report.to_dict("r"), allow_nan=False))
    assert set(out) >= {"run", "findings", "segments", "rollback"}
    for f in out["findings"]:
        assert set(f) >= {"kind", "onset_step", "end_step", "segment", "self_recovered", "severity", "message"}
    assert set(out["rollback"]) >= {"checkpoint_step", "checkpoint_path", "skip_batches", "actions", "reason"}


def test_a_checkpoint_overwritten_by_a_later_save_is_gone() -> None:
    steps, loss, grad = _unrecovered_spike_run()
    rows = rows_table(steps, loss=loss, grad_norm=grad)
    # One file rewritten at every save (nanoGPT's out/ckpt.pt): the saves at 1000 and 1500 were
    # overwritten by the one at 2300, after the onset at 2000, so no retained checkpoint predates it.
    events = [{"event": "checkpoint", "step": s, "payload": {"path": "/out/ckpt.pt"}} for s in (1000, 1500, 2300)]
    rb = analyze(rows, events_table(events)).rollback
    assert rb.checkpoint_step is None and rb.checkpoint_missing
