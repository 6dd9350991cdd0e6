"""The three evaluation anchors (bench/baselines.py) and the scoring rule (bench/evalruns/scoring.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from baselines import megatron_flags, merge_flags, olmo_flags, run_baselines, zclip_flags  # noqa: E402
from evalruns.scoring import MISS_CLASSES, KindScore, Pred, match_run, miss_class  # noqa: E402


def noisy_loss(n: int = 400, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 3.0 + 0.05 * rng.standard_normal(n)


@pytest.mark.parametrize("flags_fn", [lambda x: megatron_flags(x), lambda x: olmo_flags(x, x), lambda x: zclip_flags(x, None)])
def test_constant_series_flags_nothing(flags_fn) -> None:
    assert not flags_fn(np.full(500, 2.5)).any()


def test_megatron_needs_ten_times_the_first_hundred_max() -> None:
    loss = noisy_loss()
    loss[250] = 9.0 * loss[:100].max()
    assert not megatron_flags(loss).any()
    loss[300] = 10.0 * loss[:100].max()
    assert np.flatnonzero(megatron_flags(loss)).tolist() == [300]
    loss[50] = np.inf  # NaN/Inf are ignored, as Megatron's is_unexpectedly_large does
    loss[350] = np.nan
    assert not megatron_flags(loss)[[50, 350]].any()


def test_olmo_and_zclip_flag_a_clear_spike_at_its_step() -> None:
    loss = noisy_loss()
    loss[300:303] = 6.0
    assert olmo_flags(loss, None)[300]
    assert zclip_flags(loss, None)[300]
    assert not olmo_flags(loss, None)[:300].any()


def test_merge_flags_makes_one_event_per_run_of_flags() -> None:
    steps = np.arange(100, 110)
    flags = np.array([0, 1, 1, 0, 0, 1, 0, 0, 1, 1], dtype=bool)
    events = merge_flags(steps, flags, segment=2)
    assert [(e.onset_step, e.end_step, e.segment) for e in events] == [(101, 102, 2), (105, 105, 2), (108, 109, 2)]


def test_run_baselines_keeps_segments_apart() -> None:
    loss = noisy_loss()
    loss[200] = 50.0
    out = run_baselines([(0, np.arange(400), loss, None), (1, np.arange(150, 550), noisy_loss(seed=1), None)])
    assert [(e.onset_step, e.segment) for e in out["olmo2_7std"]] == [(200, 0)]


def test_matching_rule_true_false_and_duplicate() -> None:
    labels = [{"kind": "spike", "subtype": "x", "onset": 100, "end": 101, "segment": 0}]
    preds = [Pred("spike", 102, 110, 0), Pred("spike", 105, 106, 0), Pred("spike", 300, 301, 0),
             Pred("spike", 100, 101, 1)]
    scores: dict[str, KindScore] = {}
    matched = match_run("r", labels, preds, scores)
    sc = scores["spike"]
    assert matched[0].onset == 102
    assert (sc.tp, sc.duplicates, sc.fp, sc.onset_errors) == (1, 1, 2, [2])
    assert sc.precision == pytest.approx(1 / 3) and sc.recall == 1.0


OUTER = {"kind": "spike", "subtype": "lr_burst", "onset": 100, "end": 400, "segment": 0, "needs_action": True}
MISSED = {"kind": "spike", "subtype": "bad_batch", "onset": 250, "end": 253, "segment": 0}


@pytest.mark.parametrize("labels, preds, expect", [
    # An earlier fault's excursion still out at its onset, needing action or not.
    ([OUTER, MISSED], [], 0),
    ([{**OUTER, "needs_action": False}, MISSED], [], 1),
    # ...but not a natural one, a dont_care one, one in another segment, one over before it, or a slowdown
    # (which leaves the loss alone); a collapse (skipped updates) is one.
    ([{**OUTER, "subtype": "natural"}, MISSED], [], 4),
    ([{**OUTER, "dont_care": True}, MISSED], [], 4),
    ([{**OUTER, "segment": 1}, MISSED], [], 4),
    ([{**OUTER, "end": 249}, MISSED], [], 4),
    ([{**OUTER, "kind": "slowdown"}, MISSED], [], 4),
    ([{**OUTER, "kind": "scaler_collapse"}, MISSED], [], 0),
    # The other loss kind in its window; the same kind or another segment is no excuse.
    ([MISSED], [Pred("divergence", 245, 500, 0)], 2),
    ([MISSED], [Pred("divergence", 245, 500, 1)], 4),
    # A finding that began before it and was still open at its onset.
    ([MISSED], [Pred("spike", 200, 300, 0)], 3),
    ([MISSED], [Pred("spike", 200, 249, 0)], 4),
    ([MISSED], [Pred("slowdown", 200, 300, 0)], 4),
])
def test_a_missed_excursion_is_classed_by_what_covers_it(labels: list[dict], preds: list[Pred], expect: int) -> None:
    assert miss_class(MISSED, labels, preds, window=10) == MISS_CLASSES[expect]
