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


def _train(root: Path, model: TinyGPT, opt: torch.optim.Optimizer, steps: range, *, resume: int | None = None) -> None:
    """The README loop over ``steps``; a resume from checkpoint ``resume`` is a new segment."""
    data = synthetic_batches(model.cfg, 8, seed=1)
    for _ in range(steps.start):  # the data position of a resumed run
        next(data)
    path = None if resume is None else str(root / "ckpt" / f"{resume}.pt")
    mon = Monitor(root, "gpt", model=model, activation_module=model.blocks[-1], resume_step=resume,
                  resume_checkpoint=path, config=MonitorConfig(flush_every_steps=64))
    with mon:
        for step in steps:
            lr = BASE_LR * (BURST if step in BURST_STEPS else 1.0)
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
    assert any("learning rate rose x50" in a for a in rb.actions)


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
