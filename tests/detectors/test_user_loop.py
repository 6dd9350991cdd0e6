"""The README's own training loop, tried as a new user would: the advice never names a checkpoint that holds the
fault, and a resume from a damaged checkpoint is not called healthy.

Real tiny-GPT training on CPU under ``Monitor``: ``mon.step(step, ...)`` after the update, then every 50 steps
``save`` and ``mon.checkpoint(step, path)``, so checkpoint s holds the state after update s. The LR is x50 for
updates 300-304: the first bad loss is logged at step 301, and checkpoint 300 already holds a bad update.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch

from runwatch.app import views
from runwatch.app.check import run_check
from runwatch.app.state import _judge
from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, set_lr, synthetic_batches, train_step
from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig

BASE_LR, BURST, BURST_STEPS, EVERY = 3e-3, 50.0, range(300, 305), 50


def _train(root: Path, model: TinyGPT, opt: torch.optim.Optimizer, steps: range, *, resume: int | None = None,
           burst: range = BURST_STEPS) -> None:
    """The README loop over ``steps`` with the LR x50 for the updates in ``burst``; a resume from checkpoint
    ``resume`` is a new segment."""
    data = synthetic_batches(model.cfg, 8, seed=1)
    for _ in range(steps.start):  # the data position of a resumed run
        next(data)
    path = None if resume is None else str(root / "ckpt" / f"{resume}.pt")
    mon = Monitor(root, "gpt", model=model, activation_module=model.blocks[-1], resume_step=resume,
                  resume_checkpoint=path, config=MonitorConfig(flush_every_steps=64))
    with mon:
        for step in steps:
            lr = BASE_LR * (BURST if step in burst else 1.0)
            set_lr(opt, lr)
            loss, grad_norm = train_step(model, opt, next(data))
            mon.step(step, loss=loss, grad_norm=grad_norm, lr=lr)
            if step % EVERY == 0:
                ckpt = root / "ckpt" / f"{step}.pt"
                ckpt.parent.mkdir(exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)
                mon.checkpoint(step, ckpt)


@pytest.fixture(scope="module")
def burst_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("userloop")
    model = TinyGPT(TinyGPTConfig(d_model=32, num_layers=1, seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR)
    _train(root, model, opt, range(0, 420))
    return root


def test_advice_never_names_the_checkpoint_that_holds_the_bad_update(burst_run: Path) -> None:
    report = run_check(burst_run, "gpt")
    target = [f for f in report.findings if f.needs_action and f.open]
    assert target and target[0].onset_step == 301  # the first bad loss; the LR of step 300 is the cause
    rb = report.rollback
    assert rb.checkpoint_step == 250, rb.reason  # checkpoint 300 holds update 300, made with the x50 LR
    assert "before step 300, the last logged step before the onset at 301" in rb.reason
    # The cause is read from the data that is there: the LR of the update before the onset jumped x50.
    assert rb.evidence["lr_ratio"] == pytest.approx(BURST, rel=0.01)
    assert rb.evidence["lr_at_onset"] == pytest.approx(BASE_LR * BURST)
    assert any("learning rate rose x50 into the excursion" in a and "at its highest" in a for a in rb.actions)


def test_dashboard_and_cli_judge_alike_and_give_one_quoted_hint(burst_run: Path) -> None:
    cli = run_check(burst_run, "gpt")
    page, error, _ = _judge(str(burst_run), "gpt")
    assert error is None and page.findings == cli.findings and page.rollback == cli.rollback
    hint = cli.rollback.evidence["resume_hint"]
    assert shlex.split(hint)[:2] == ["--resume", cli.rollback.checkpoint_path]
    assert hint in views.resume_command("gpt", page.rollback)


def test_resume_from_the_damaged_checkpoint_is_a_bad_resume(tmp_path: Path, burst_run: Path) -> None:
    import shutil

    root = tmp_path / "store"
    shutil.copytree(burst_run, root)
    model = TinyGPT(TinyGPTConfig(d_model=32, num_layers=1, seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR)
    state = torch.load(root / "ckpt" / "300.pt", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    _train(root, model, opt, range(301, 360), resume=300)  # the old advice: "restart from checkpoint 300"
    report = run_check(root, "gpt")
    assert report.health == "action needed"
    [bad] = [f for f in report.findings if f.kind == "bad_resume"]
    assert bad.segment == 1 and bad.onset_step == 301 and bad.needs_action and bad.open
    assert report.rollback.checkpoint_step == 250, report.rollback.reason  # an earlier checkpoint
    # The main line is cut at the resume step: segment 0's rows after 300 are the abandoned branch.
    assert [(s.segment, s.abandoned_from) for s in report.segments] == [(0, 301), (1, None)]


def test_a_resume_whose_restored_optimizer_runs_the_raised_lr_is_no_bad_checkpoint(tmp_path: Path) -> None:
    """A user's report: a LambdaLR schedule with the LR x300 for updates 301-305, the advice "restart from checkpoint
    300" (right: it holds update 300, at the normal LR) followed with the schedule fixed. The optimizer state saved
    with checkpoint 300 holds the LR of update 301 (the scheduler stepped after update 300), so the resume's first
    update ran at the raised LR and the loss jumped from its second row. On 1f0af81: a bad_resume, "the checkpoint
    already held the damage", and the advice went back to checkpoint 250. The first loss after the resume is the
    loaded state's own and was healthy: the raise at the resume is the cause, read against the parent's LR."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyGPT(TinyGPTConfig(d_model=32, num_layers=1, seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR)
    _train(tmp_path, model, opt, range(0, 420), burst=range(301, 306))
    first = run_check(tmp_path, "gpt")
    assert first.rollback is not None and first.rollback.checkpoint_step == 300, first.rollback
    model = TinyGPT(TinyGPTConfig(d_model=32, num_layers=1, seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR)
    state = torch.load(tmp_path / "ckpt" / "300.pt", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    _train(tmp_path, model, opt, range(301, 420), resume=300, burst=range(301, 302))  # the restored LR, once
    report = run_check(tmp_path, "gpt")
    assert not [f for f in report.findings if f.kind == "bad_resume"], report.findings
    [spike] = [f for f in report.findings if f.segment == 1 and f.kind in ("spike", "divergence")]
    assert spike.onset_step == 302 and spike.evidence["lr_raised"], spike
    assert spike.evidence["lr_ratio"] == pytest.approx(BURST, rel=0.01) and "after the LR rose x50" in spike.message
    assert report.rollback is None or report.rollback.checkpoint_step == 300, report.rollback
