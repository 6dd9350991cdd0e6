"""The fresh evaluation set (bench/evalruns/fresh.py): its draws, its counterfactual labels and the rollback rule.

Small real CPU training runs with one cause each are labelled against their
clean twin; the label rules are checked on them (onsets, the checkpoint rule
0-2 steps after a checkpoint, dont_care for a burst no logged row shows) and
on synthetic twin differences (spike vs divergence, lasting cost). No
detector is run here: this is the ruler, not what it measures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from evalruns.counterfactual import (  # noqa: E402
    Injection, LabelRules, Lineage, collapse_label, label_run, loss_label, natural_slides)
from evalruns.draws import FreshRun, make_injection  # noqa: E402
from evalruns.fresh import fresh_runs, label, train_pair  # noqa: E402
from evalruns.heldout import HeldoutSpec  # noqa: E402
from evalruns.training import Fault, train  # noqa: E402

BASE = {"scenario": "test", "seed": 11, "num_steps": 320, "batch": 16, "embed": 8, "hidden": 32, "base_lr": 3e-3,
        "ckpt_every": 40}
FOREVER = 10**6


def fresh_run(name: str, kind: str, sub: str, faults: tuple[Fault, ...], step: int, **kw: object) -> FreshRun:
    spec = HeldoutSpec(run=name, **{**BASE, **kw}, faults=faults)
    return FreshRun(spec, (make_injection(kind, sub, faults, step, 0, spec.num_steps - 1),))


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    cache = tmp_path_factory.mktemp("fresh-cache")

    def run(fr: FreshRun):
        lr, _, _ = label(fr, *train_pair(fr, cache))
        return lr

    return run


def test_one_seed_gives_the_same_runs_and_a_subset_is_a_prefix() -> None:
    a, b = fresh_runs(5, 6), fresh_runs(5, 6)
    assert [r.spec for r in a] == [r.spec for r in b] and [r.injections for r in a] == [r.injections for r in b]
    assert [r.spec for r in fresh_runs(5, 3)] == [r.spec for r in a[:3]]
    assert [r.spec for r in fresh_runs(6, 6)] != [r.spec for r in a]


def test_the_twin_is_bit_identical_until_the_first_step_the_fault_shows_in() -> None:
    torch.set_num_threads(1)
    spec = HeldoutSpec(run="t", **{**BASE, "num_steps": 160})
    clean, _ = train(spec)
    for fault, first in ((Fault("lr_burst", 150, 1, 20.0), 151), (Fault("bad_batch", 150, 1), 150)):
        faulty, _ = train(HeldoutSpec(run="t", **{**BASE, "num_steps": 160}, faults=(fault,)))
        same = [a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] for a, b in zip(faulty, clean)]
        assert all(same[:first]) and not same[first], fault.kind


@pytest.mark.parametrize("name,kind,sub,faults,step,kw,expect", [
    ("burst", "spike", "lr_burst", (Fault("lr_burst", 150, 2, 80.0),), 150, {}, ("spike", 151)),
    ("badbatch", "spike", "bad_batch", (Fault("bad_batch", 150, 2),), 150, {}, ("spike", 150)),
    ("nangrad", "nan", "nan_grad", (Fault("nan_grad", 150),), 150, {}, ("nan", 150)),
    ("overflow", "scaler_collapse", "consecutive", (Fault("overflow", 150, 8),), 150,
     {"fp16": True, "growth_interval": 2000}, ("scaler_collapse", 150)),
    ("stall", "stall", "gap", (Fault("stall", 150, 1, 50.0),), 150, {}, ("stall", 150)),
    ("stall-coarse", "stall", "gap", (Fault("stall", 152, 1, 50.0),), 152, {"log_every": 5}, ("stall", 150)),
    ("slowdown", "slowdown", "sustained", (Fault("slowdown", 150, 40, 3.0),), 150, {}, ("slowdown", 150)),
])
def test_onset_is_the_first_logged_step_the_fault_shows_in(labelled, name, kind, sub, faults, step, kw, expect) -> None:
    lr = labelled(fresh_run(name, kind, sub, faults, step, **kw))
    real = [lab for lab in lr.labels if not lab.dont_care]
    assert (real[0].kind, real[0].onset) == expect, lr.labels
    if name == "stall-coarse":
        assert real[0].end == 155  # the logged row whose interval holds the pause
    if kind in ("stall", "slowdown"):
        assert not lr.needs_action and lr.rollback_step is None


@pytest.mark.parametrize("sub,cause,expect", [
    ("lr_jump", 160, 120),  # 0 steps after checkpoint 160: update 160 used the LR, checkpoint 160 holds it
    ("lr_jump", 161, 160),  # first bad loss at 162; the row at 161 vouches for checkpoint 160
    ("nan_weight", 161, 120),  # 1 step after: the NaN shows at 161 itself, no healthy row after 160
    ("nan_weight", 162, 160),  # 2 steps after: row 161 was healthy
])
def test_right_checkpoint_for_a_fault_right_after_a_checkpoint(labelled, sub, cause, expect) -> None:
    kind = "divergence" if sub == "lr_jump" else "nan"
    f = Fault(sub, cause, FOREVER, 40.0) if sub == "lr_jump" else Fault(sub, cause)
    lr = labelled(fresh_run(f"ck-{sub}-{cause}", kind, sub, (f,), cause))
    assert lr.needs_action, lr.labels
    assert lr.rollback_step == expect


def test_a_burst_no_logged_row_shows_is_dont_care(labelled) -> None:
    kw = {"num_steps": 400, "log_every": 25}
    lr = labelled(fresh_run("traceless", "spike", "lr_burst", (Fault("lr_burst", 303, 1, 2.0),), 303, **kw))
    (lab,) = lr.labels
    assert lab.dont_care and lab.kind == "spike" and lab.onset == 325
    assert not lr.needs_action


def test_a_large_lr_jump_is_a_divergence_that_needs_action(labelled) -> None:
    lr = labelled(fresh_run("jump", "divergence", "lr_jump", (Fault("lr_jump", 150, FOREVER, 60.0),), 150))
    div = [lab for lab in lr.labels if lab.kind == "divergence"]
    assert div and div[0].onset == 151 and div[0].end == 319 and div[0].needs_action and not div[0].dont_care


def _lineage(effect: np.ndarray, seed: int = 0, fall: float = 0.0) -> Lineage:
    """Twin: a loss from 3.0 falling ``fall`` per observation, with 0.05 noise; faulty: the twin plus ``effect``
    (its first 100 observations zero)."""
    n = len(effect)
    twin = 3.0 - fall * np.arange(n) + 0.05 * np.random.default_rng(seed).standard_normal(n)
    cols = {"grad_norm": np.ones(n), "loss_scale": np.full(n, np.nan), "found_inf": np.zeros(n, bool),
            "step_time": np.ones(n)}
    return Lineage(np.arange(n), np.zeros(n, int), {**cols, "loss": twin + effect}, {**cols, "loss": twin})


def _inj(sub: str, kind: str = "divergence") -> Injection:
    return Injection(kind, sub, 0, 99, 100, 100 if kind == "spike" else 399)


@pytest.mark.parametrize("shape,sub,kind,expect", [
    # a persisting LR cause whose loss came back within the twin's band and stayed: a spike
    ("back", "lr_jump", "divergence", ("spike", "lr_jump_recovered", False)),
    ("stays", "lr_jump", "divergence", ("divergence", "lr_jump", True)),
    # a transient cause is a spike even when it never came back; then it needs action
    ("stays", "lr_burst", "spike", ("spike", "lr_burst", True)),
    ("back", "lr_burst", "spike", ("spike", "lr_burst", False)),
    # back in band for 8 observations, then 4 sigma above for good: a lasting cost
    ("cost", "lr_burst", "spike", ("spike", "lr_burst", True)),
])
def test_spike_or_divergence_is_what_the_twin_difference_shows(shape, sub, kind, expect) -> None:
    effect = np.zeros(400)
    effect[100:110] = 1.0  # 20 sigma
    if shape == "stays":
        effect[110:] = 0.5
    elif shape == "cost":
        effect[118:] = 0.2
    lab = loss_label(_inj(sub, kind), _lineage(effect), 100, 400, LabelRules())
    assert (lab.kind, lab.subtype, lab.needs_action) == expect
    assert lab.onset == 100 and not lab.dont_care
    if expect[0] == "spike" and not expect[2]:
        assert 109 <= lab.end <= 112


@pytest.mark.parametrize("behind,expect_action", [
    # 100 observations behind the twin at the end, but below its own loss before the burst: nothing to roll back to
    (0.4, False),
    # 375 behind: still above where it was before the burst, so the checkpoint before it is the better state
    (1.5, True),
])
def test_a_spike_needs_action_only_if_the_run_is_worse_now_than_before_it(behind, expect_action) -> None:
    """Issue 8, item 1: a recovered spike must not throw away the training after it. On a falling curve a run that
    lost progress to a burst stays above its twin for good (v8 called that a lasting cost, needing action); a
    rollback restores the loss from before the burst, so it helps only if the run is worse now than that."""
    n = 400
    effect = np.zeros(n)
    effect[100:110] = 1.0  # the burst: 20 sigma
    effect[110:] = behind  # then on the twin's curve, this far behind it (0.004 per observation)
    lab = loss_label(_inj("lr_burst", "spike"), _lineage(effect, seed=1, fall=0.004), 100, n, LabelRules())
    assert (lab.kind, lab.end, lab.dont_care) == ("spike", n - 1, False)  # never back within the twin's band
    assert lab.needs_action is expect_action
    # v10: one that needs none settled where the run came back to its level before the burst (2.62), 0.4 behind
    # the twin: the median of the 8 observations from ~177 on, 3.4 - 0.004 (j + 3.5), within 2 of their standard
    # errors (0.063), and every 32 from there (181 on this seed)
    assert lab.settled is None if expect_action else 175 <= lab.settled <= 190


@pytest.mark.parametrize("seed", range(3))
def test_a_spike_that_needs_no_action_settles_once_out_of_its_thick(seed: int) -> None:
    """v10: a checkpoint inside a spike that needs no action is clean from where the run is no worse than before it,
    but not in the thick of it. Five observations 20 sigma up, then back on the twin: the 8 observations from the
    onset, or the one after it, are mostly the spike's (their median up), and from the third or fourth on mostly back;
    every 32 from there are no worse. So checkpoints 99-100 (their losses the spike's) stay blocked, and the one
    that made the third or fourth observation's loss is clean (``truth._damaged_to``)."""
    effect = np.zeros(400)
    effect[100:105] = 1.0
    lab = loss_label(_inj("lr_burst", "spike"), _lineage(effect, seed=seed, fall=0.004), 100, 400, LabelRules())
    assert (lab.kind, lab.onset, lab.end, lab.needs_action) == ("spike", 100, 104, False)
    assert lab.settled in (102, 103)


@pytest.mark.parametrize("size,expect", [(0.06, None), (0.25, "dont_care"), (0.6, "label")])
def test_effect_size_decides_label_dont_care_or_nothing(size, expect) -> None:
    effect = np.zeros(400)
    effect[100] = size  # one observation: 1.2, 5 and 12 sigma
    lab = loss_label(_inj("lr_burst", "spike"), _lineage(effect), 100, 400, LabelRules())
    got = None if lab is None else "dont_care" if lab.dont_care else "label"
    assert got == expect


def test_an_effect_is_judged_in_the_noise_around_it_not_in_early_training() -> None:
    """Seed 595643's run 123 in miniature: the batch-to-batch spread grows as training leaves its start (0.05
    for the first 100 observations, 0.4 from there), and a one-observation bump of 1.6 at observation 130 is 4
    sigma of the noise there. The 64 observations before it are mostly the quiet start (they read it as ~11
    sigma, a clear label runwatch would be scored as missing); centred on it they are mostly the noise it
    lives in: a dont_care, neither a miss nor a false alarm."""
    rng = np.random.default_rng(3)
    n = 400
    twin = 3.0 + np.where(np.arange(n) < 100, 0.05, 0.4) * rng.standard_normal(n)
    effect = np.zeros(n)
    effect[130] = 1.6
    cols = {"grad_norm": np.ones(n), "loss_scale": np.full(n, np.nan), "found_inf": np.zeros(n, bool),
            "step_time": np.ones(n)}
    lin = Lineage(np.arange(n), np.zeros(n, int), {**cols, "loss": twin + effect}, {**cols, "loss": twin})
    lab = loss_label(Injection("spike", "bad_batch", 0, 130, 130, 130), lin, 130, n, LabelRules())
    assert lab is not None and lab.dont_care and 3.0 <= lab.size < LabelRules().clear_peak


def test_a_fault_in_a_segment_that_never_ran_is_no_label() -> None:
    """Fresh seed 32670's run 064 drew its resume at step 287 of a 283-step run, so its segment-1 fault (a NaN
    gradient at 280) has no segment to act in: no label, where the labeller raised a KeyError."""
    effect = np.zeros(400)
    effect[100:110] = 1.0
    inj = [Injection("spike", "lr_burst", 0, 99, 100, 101), Injection("nan", "nan_grad", 1, 280, 280, 282)]
    labels = label_run(inj, {0: _lineage(effect)}, {0: None}, 1)
    assert [(lab.kind, lab.segment) for lab in labels if not lab.dont_care] == [("spike", 0)]


def _scaler_lineage(faulty_scale: np.ndarray) -> Lineage:
    """A twin whose scale sits at 2^16; the faulty run's scale as given (found_inf where it halved)."""
    n = len(faulty_scale)
    cols = {"loss": np.full(n, 3.0), "grad_norm": np.ones(n), "step_time": np.ones(n)}
    found = np.r_[False, faulty_scale[1:] < faulty_scale[:-1]]
    return Lineage(np.arange(n), np.zeros(n, int), {**cols, "loss_scale": faulty_scale, "found_inf": found},
                   {**cols, "loss_scale": np.full(n, 2.0**16), "found_inf": np.zeros(n, bool)})


@pytest.mark.parametrize("after,expect_end,expect_action", [
    # 4 overflows at 100-103 (2^16 -> 2^12), then a doubling 300 clean steps later: back under the depth of a
    # collapse at step 404, though 3 halvings under the twin to the end (fresh seed 846832's run 049)
    ({404: 2.0**13}, 403, False),
    # every step skipped from 100 on, the scale pinned at 1: never over, it needs action
    ({104: 1.0}, 599, True),
    # down to 1, then regrowing to 2 and 4 where the twin runs at 2^16: still a collapse (fresh seed 172015's run 040)
    ({104: 1.0, 300: 2.0, 500: 4.0}, 599, True),
])
def test_a_collapse_is_over_once_back_under_the_depth_of_one(after, expect_end, expect_action) -> None:
    n = 600
    scale = np.full(n, 2.0**16)
    for k in range(4):
        scale[100 + k:] = 2.0 ** (15 - k)
    for step, value in after.items():
        scale[step:] = value
    lab = collapse_label(Injection("scaler_collapse", "consecutive", 0, 100, 100, 103), _scaler_lineage(scale),
                         100, n, LabelRules())
    assert not lab.dont_care and lab.onset == 100
    assert (lab.end, lab.needs_action) == (expect_end, expect_action)


@pytest.mark.parametrize("halvings,twin_grows,expect", [
    (3, True, "dont_care"),  # fresh seed 878614's run 032: 3 skips, the twin regrown past the onset's scale
    (3, False, "dont_care"),
    (4, True, "clear"),  # 4 skips are a collapse whatever the twin does after
])
def test_a_collapses_depth_is_its_own_halvings_not_the_twins_later_growth(halvings, twin_grows, expect) -> None:
    """Every overflow resets the scaler's growth timer, so the faulty run regrows up to a growth interval after its
    twin: a twin that doubles after the fault puts it one halving further under with no step skipped. Three
    overflows (2^16 -> 2^13) and the twin grown to 2^17 at 300 read 4 halvings, a clear collapse needing action
    on labels v10 (fresh seed 878614's run 032, which trained on at 2^13 unharmed); the depth is counted below the
    twin's scale no higher than at the onset (v11): 3, between negligible and clear (``dont_care``)."""
    n = 600
    scale = np.full(n, 2.0**16)
    for k in range(halvings):
        scale[100 + k:] = 2.0 ** (15 - k)
    lin = _scaler_lineage(scale)
    if twin_grows:
        lin.twin["loss_scale"][300:] = 2.0**17
    lab = collapse_label(Injection("scaler_collapse", "consecutive", 0, 100, 100, 100 + halvings - 1), lin,
                         100, n, LabelRules())
    assert ("dont_care" if lab.dont_care else "clear") == expect and lab.size == halvings, lab


def test_a_later_nan_ends_an_earlier_collapse_window() -> None:
    """Fresh seed 929825's run 112 in miniature: two overflows (2 halvings, no collapse), then a NaN weight after
    which every step overflows: the NaN's scale collapse is the NaN's, not a 16-halving collapse of the two."""
    n = 400
    scale = np.full(n, 2.0**16)
    scale[196:] = 2.0**15
    scale[197:] = 2.0**14
    scale[380:] = 2.0 ** (14 - np.minimum(np.arange(n - 380) + 1, 14))
    lin = _scaler_lineage(scale)
    lin.faulty["loss"] = np.where(np.arange(n) >= 379, np.nan, 3.0)
    inj = [Injection("scaler_collapse", "consecutive", 0, 196, 196, 197), Injection("nan", "nan_weight", 0, 379, 379, 379)]
    labels = label_run(inj, {0: lin}, {0: None}, 1)
    collapse = [lab for lab in labels if lab.kind == "scaler_collapse" and lab.subtype == "consecutive"]
    assert collapse and collapse[0].dont_care and collapse[0].size == 2.0
    assert [lab.kind for lab in labels if lab.needs_action and not lab.dont_care] == ["nan"]


def test_label_rules_reject_inverted_thresholds() -> None:
    with pytest.raises(ValueError, match="negligible < clear"):
        LabelRules(clear_peak=2.0)


def test_a_seed_generates_the_same_store_and_labels_byte_for_byte(tmp_path: Path) -> None:
    """Seed 446's first two runs are short (a clean fp16 run and an fp16 slowdown + overflow burst); trained in
    one process and again in two (``--jobs 2``), the labels are the same bytes."""
    import json

    from evalruns.fresh import generate_fresh

    from runwatch.data.store import Store

    texts = []
    for k in range(2):  # separate training caches: the second trains again, it does not read the first
        info = generate_fresh(tmp_path / f"out{k}", 446, 2, cache_dir=tmp_path / f"cache{k}", verbose=False,
                              jobs=1 + k)
        texts.append((tmp_path / f"out{k}" / "labels.json").read_bytes())
    assert texts[0] == texts[1]
    assert json.loads(texts[0]) == info and [r["run"] for r in info["runs"]] == ["f446-000", "f446-001"]
    with Store(tmp_path / "out0" / "store") as store:
        for run in info["runs"]:
            meta = store.meta(run["run"])
            assert meta["scaler"]["growth_interval"] > 0 and meta["scaler"]["backoff_factor"] == 0.5
            assert store.rows(run["run"], rank=0).num_rows > 0


def test_a_natural_slide_spans_from_its_first_halving_off_the_peak() -> None:
    """The twin's own slide of four halvings (a healthy sawtooth's deep tooth) is a dont_care from the row before its
    first halving off the peak, where a detector's change point dates it, to the row it regrew at."""
    scale = np.full(400, 2.0**16)
    for step, halvings in ((100, 1), (130, 2), (160, 3), (190, 4)):
        scale[step:] = 2.0 ** (16 - halvings)
    scale[300:] = 2.0**13
    assert natural_slides(scale, LabelRules()) == [(99, 300)]
