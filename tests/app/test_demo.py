"""The demo store tells the story it promises: real checkpoints, a rollback with a skip window, an alarm."""

from __future__ import annotations

import json
import time
from pathlib import Path

from runwatch.app.demo import CHECKPOINT_DIR, DemoPlan, has_demo
from runwatch.app.judge import is_finished
from runwatch.data.store import Store
from runwatch.detectors.analysis import analyze
from tests.app.conftest import TEST_PLAN_KW


def test_rollback_run_has_an_abandoned_branch_and_skips(demo_root: Path) -> None:
    plan = DemoPlan(**TEST_PLAN_KW)
    with Store(demo_root) as store:
        segments = store.segments("demo-rollback").to_pylist()
        events = store.events("demo-rollback")
        main = store.main_line("demo-rollback")
    assert [s["segment"] for s in segments] == [0, 1]
    # Resumed from checkpoint s (the state after update s): segment 0's rows after s are the abandoned branch.
    assert segments[0]["abandoned_from"] == plan.rollback_step + 1
    assert [e["step"] for e in events.to_pylist() if e["event"] == "resume"] == [plan.rollback_step]
    resume = [json.loads(e["payload"]) for e in events.to_pylist() if e["event"] == "resume"]
    assert resume[0]["skip_batches"] == [plan.lr_jump_at, plan.lr_jump_at + plan.skip_batches - 1]
    assert Path(resume[0]["checkpoint"]).is_file()  # a real torch.save file
    skipped = set(range(plan.lr_jump_at, plan.lr_jump_at + plan.skip_batches))
    steps = set(main["step"].to_pylist())
    assert not skipped & steps and max(steps) == plan.num_steps - 1  # skipped batches were not trained on
    assert is_finished(events)


def test_checkpoints_are_real_files(demo_root: Path) -> None:
    with Store(demo_root) as store:
        events = store.events("demo-diverged").to_pylist()
    paths = [json.loads(e["payload"])["path"] for e in events if e["event"] == "checkpoint"]
    assert len(paths) >= 5 and all(Path(p).is_file() and Path(p).stat().st_size > 10_000 for p in paths)
    assert all(Path(p).parent.parent.name == CHECKPOINT_DIR for p in paths)


def test_diverged_run_needs_action_with_rollback_advice(demo_root: Path) -> None:
    plan = DemoPlan(**TEST_PLAN_KW)
    with Store(demo_root) as store:
        report = analyze(store.rows("demo-diverged", rank=0), store.events("demo-diverged"), now=time.time())
    assert report.health == "action needed"
    # The LR jump acts through update lr_jump_at: checkpoint lr_jump_at already holds it, so the advice is the
    # latest checkpoint before the last healthy logged step.
    assert report.rollback is not None and report.rollback.checkpoint_step == plan.rollback_step
    recovered = [f for f in report.findings if f.kind == "spike" and f.self_recovered]
    assert any(abs(f.onset_step - plan.bad_batches[0]) <= 2 for f in recovered)  # the spike that came back


def test_has_demo(demo_root: Path, tmp_path: Path) -> None:
    assert not has_demo(tmp_path)
    assert not has_demo(demo_root)  # the test store holds two of the three runs
