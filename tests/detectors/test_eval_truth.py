"""The evaluation's ground truth for rollbacks (bench/evalruns/truth.py) and the checkpoint contract of the
labelled runs' trainer (bench/evalruns/training.py), through the real store."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from evalruns.generate import write_run  # noqa: E402
from evalruns.heldout import heldout_scenarios  # noqa: E402
from evalruns.scenarios import Label, scenarios  # noqa: E402
from evalruns.training import Resume, RunSpec, train  # noqa: E402
from evalruns.truth import MainLine, backoff_bursts, right_checkpoint, spec_main_line  # noqa: E402

from runwatch.data.store import Store  # noqa: E402

DIV = Label("divergence", "x", 130, 300, needs_action=True)


@pytest.mark.parametrize("labels,logged,ckpts,bursts,expect", [
    ([Label("divergence", "x", 102, 300, needs_action=True)], np.arange(301), (50, 100), (), 100),  # c <= onset - 2
    ([Label("divergence", "x", 101, 300, needs_action=True)], np.arange(301), (50, 100), (), 50),
    ([Label("divergence", "x", 125, 300, needs_action=True)], np.arange(0, 301, 25), (50, 100), (), 50),  # coarse
    ([Label("spike", "x", 60, 80), DIV], np.arange(301), (50, 75, 100), (), 100),  # recovered earlier: no push back
    ([Label("spike", "x", 95, 110), DIV], np.arange(301), (50, 75, 100), (), 75),  # inside [onset - 1, end]
    ([Label("spike", "x", 101, 110), DIV], np.arange(301), (50, 75, 100), (), 75),  # onset - 1 made the onset
    # a spike that needs no action and was no worse than before it from step 98 on: checkpoint 96 made 97's loss
    ([Label("spike", "x", 60, 125, settled=98), DIV], np.arange(301), (50, 75, 96, 100), (), 100),
    ([Label("spike", "x", 60, 125, settled=103), DIV], np.arange(301), (50, 75, 100), (), 50),
    ([Label("spike", "x", 60, 125, needs_action=True, settled=98)], np.arange(301), (50, 100), (), 50),
    ([DIV], np.arange(301), (50, 100), ((98, 104),), 50),  # inside a backoff burst
    ([DIV], np.arange(301), (150,), (), None),  # no checkpoint qualifies
    ([Label("spike", "x", 100, 110)], np.arange(301), (50,), (), None),  # nothing needs action
    ([Label("divergence", "x", 100, 300, needs_action=True, dont_care=True)], np.arange(301), (50,), (), None),
    ([Label("divergence", "x", 100, 300, needs_action=True, open=False), DIV], np.arange(301), (50, 125), (), 125),
])
def test_right_checkpoint(labels, logged, ckpts, bursts, expect) -> None:
    assert right_checkpoint(labels, MainLine(logged, ckpts, bursts)) == expect


@pytest.mark.parametrize("raised, expect", [
    (((0, 110, 10**6),), 100),  # the raise shows first at the onset's row 125: update 100 ran at the old LR
    (((0, 100, 10**6),), 50),  # row 100 shows it: its update ran under it
    (((0, 105, 107),), 50),  # a burst over before the onset's row: the log never showed it, a consequence rule
    (((1, 110, 10**6),), 50),  # another segment's fault
])
def test_a_checkpoint_at_the_last_row_of_the_old_lr_is_right(raised, expect) -> None:
    """The LR logged at step s is the one update s ran at: where the onset's own row is the first to show an LR
    fault's raise, the checkpoint at the row before it holds no update under the raise (fresh-v8)."""
    labels = [Label("divergence", "lr_jump", 125, 300, needs_action=True)]
    assert right_checkpoint(labels, MainLine(np.arange(0, 301, 25), (50, 100), (), raised)) == expect


def test_backoff_bursts_are_two_or_more_overflows_close_together() -> None:
    assert backoff_bursts([5, 50, 51, 53, 90, 200, 202]) == ((50, 53), (200, 202))
    assert backoff_bursts([10, 40, 70]) == ()


def test_dev_and_heldout_rollbacks_follow_the_rule() -> None:
    for lr in scenarios() + heldout_scenarios():
        if lr.rollback_step is None:
            continue
        line = spec_main_line(lr.spec)
        first = min((lab for lab in lr.labels if lab.needs_action and lab.open), key=lambda lab: lab.onset)
        limit = line.logged[line.logged < first.onset][-1]
        assert lr.rollback_step in line.checkpoints
        raised = [a <= first.onset <= b and not a <= limit <= b for seg, a, b in line.lr_raised if seg == first.segment]
        assert lr.rollback_step < limit or (lr.rollback_step == limit and any(raised)), lr.spec.run


@pytest.mark.parametrize("skip_steps", [False, True])
def test_a_resume_carries_its_checkpoint_step_and_cuts_the_main_line_there(tmp_path: Path, skip_steps: bool) -> None:
    torch.set_num_threads(1)
    spec = RunSpec(run="r", scenario="t", seed=3, num_steps=260, batch=8, ckpt_every=40,
                   resume=Resume(at_step=190, from_ckpt=160, num_skip=50, skip_steps=skip_steps))
    rows, events = train(spec)
    (resume,) = [ev for ev in events if ev["event"] == "resume"]
    first = rows[resume["row_index"]]
    assert resume["step"] == 160 and resume["skip_batches"] == [161, 210]
    assert first["step"] == (211 if skip_steps else 161)
    assert first["samples"] == (211 + 1) * spec.batch  # it trained on batch 211, the first one after the skip
    write_run(tmp_path, "r", rows, events, meta={})
    with Store(tmp_path) as store:
        got = store.rows("r", rank=0)
    seg, step, main = (got[c].to_numpy(zero_copy_only=False) for c in ("segment", "step", "main"))
    assert set(seg.tolist()) == {0, 1}
    assert main[(seg == 0) & (step <= 160)].all() and not main[(seg == 0) & (step > 160)].any()
