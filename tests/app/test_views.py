"""View helpers: what the on-call engineer reads (health order, rollback card, resume command, path safety)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from runwatch.app import views
from runwatch.app.judge import is_finished
from runwatch.data.store import Store
from runwatch.detectors.advisor import resume_hint
from runwatch.detectors.finding import Finding, Rollback
from tests.app.conftest import shown, spike_lines, write_jsonl_run


def _finding(kind: str, onset: int, *, open_: bool, severity: str = "warning", needs: bool = False,
             end: int | None = None, recovered: bool | None = None) -> Finding:
    return Finding(kind=kind, onset_step=onset, end_step=onset + 5 if end is None else end, peak_step=onset + 1,
                   segment=0, severity=severity, self_recovered=recovered, needs_action=needs, open=open_,
                   evidence={}, message=f"{kind} at {onset}")


class _Report:
    def __init__(self, health: str, findings: list[Finding]) -> None:
        self.health, self.findings, self.rollback = health, findings, None


def test_overview_puts_trouble_first() -> None:
    runs = [{"run": "ok", "last_step": 10, "last_update": 100.0, "tokens": 5, "num_segments": 1},
            {"run": "bad", "last_step": 20, "last_update": 50.0, "tokens": 6, "num_segments": 2},
            {"run": "quiet", "last_step": 30, "last_update": 10.0, "tokens": 7, "num_segments": 1},
            {"run": "broken", "last_step": 1, "last_update": 90.0, "tokens": None, "num_segments": 1},
            {"run": "new", "last_step": 1, "last_update": 95.0, "tokens": None, "num_segments": 1}]
    reports = {"ok": _Report("healthy", []),
               "bad": _Report("action needed", [_finding("divergence", 5, open_=True, needs=True),
                                                _finding("spike", 1, open_=False)]),
               "quiet": _Report("stalled", [_finding("stall", 30, open_=True, needs=True)])}
    rows = views.overview_rows(runs, reports, {"broken": "StoreError: unreadable"}, now=200.0, pending=["new"])
    assert [r["run"] for r in rows] == ["bad", "quiet", "broken", "new", "ok"]
    bad = rows[0]
    assert bad["health"] == "action needed" and bad["open findings"] == 1 and bad["what"] == "divergence"
    assert rows[2]["what"] == "StoreError: unreadable" and rows[3]["health"] == "analysing"
    assert bad["idle"] == "2.5 min ago"


@pytest.mark.parametrize("seconds, text", [(None, "never"), (5, "5 s ago"), (90, "1.5 min ago"), (7200, "2.0 h ago")])
def test_ago(seconds: float | None, text: str) -> None:
    assert views.ago(seconds) == text


@pytest.mark.parametrize("value, text", [(None, "-"), (999, "999"), (12_345_678, "12.3M"), (2.5e9, "2.5B")])
def test_human_count(value: float | None, text: str) -> None:
    assert views.human_count(value) == text


def test_health_label_and_cell_colours() -> None:
    assert views.health_label("action needed") == ":red[● action needed]"
    assert views.cell_style("stalled").startswith("background-color")
    assert views.cell_style("critical").startswith("background-color")
    assert views.cell_style("something else") == ""


def test_rollback_card_and_resume_command() -> None:
    rb = Rollback(checkpoint_step=250, checkpoint_path="/ckpt/step 250.pt", skip_batches=[251, 300],
                  actions=["lower the learning rate x0.5"], reason="loss diverging from step 291",
                  evidence={"onset_step": 291, "missing_checkpoint": {"step": 280, "path": "/ckpt/step 280.pt"}},
                  checkpoint_missing=True)
    text = shown("\n".join(views.rollback_lines(rb)))
    assert "step 250" in text and "/ckpt/step 250.pt" in text and "251 – 300" in text
    assert "lower the learning rate" in text and "no longer retained" in text and "diverging" in text
    cmd = views.resume_command("gpt", rb, {"command": "torchrun train.py --cfg a.yaml"})
    assert cmd.startswith("torchrun train.py --cfg a.yaml")
    assert "--resume '/ckpt/step 250.pt' --skip-batches 251-300" in cmd  # quoted for the shell
    assert resume_hint(rb.checkpoint_path, rb.skip_batches) in cmd  # the same hint as `runwatch check`
    assert "Monitor" not in cmd  # the shell block holds no Python: a paste into a shell runs only the command
    call = views.monitor_call("gpt", rb)
    assert call.startswith("mon = Monitor(root, run='gpt', ") and "resume_step=250" in call
    assert "skip_batches=(251, 300)" in call and "resume_checkpoint='/ckpt/step 250.pt'" in call
    assert views.evidence_rows(rb.evidence)[0] == {"evidence": "onset_step", "value": "291"}


def test_no_checkpoint_is_said_plainly() -> None:
    rb = Rollback(checkpoint_step=None, checkpoint_path=None, skip_batches=None, actions=[], reason="",
                  evidence={}, checkpoint_missing=True)  # the advisor's flag when none qualifies
    assert views.rollback_lines(rb)[0].startswith("**No healthy checkpoint")
    # A review's TensorBoard import (no checkpoint ever recorded) read "That checkpoint is no longer retained".
    assert "no longer retained" not in "\n".join(views.rollback_lines(rb))
    assert "--resume" not in views.resume_command("gpt", rb)


def test_findings_table_and_bands() -> None:
    findings = [_finding("spike", 10, open_=False, recovered=True), _finding("divergence", 50, open_=True, end=60),
                _finding("slowdown", 20, open_=True)]
    rows = views.findings_rows(findings)
    assert [r["kind"] for r in rows] == ["slowdown", "divergence", "spike"]  # open first, then by onset
    assert [r["status"] for r in rows] == ["OPEN", "OPEN", "recovered"]
    bands = views.finding_bands(findings + [_finding("stall", 30, open_=False)], last_step=99,
                                x_of_step=lambda s: 10.0 * s)
    assert len(bands) == 4  # every finding is shaded, the closed stall too
    assert bands[1]["x0"] == 500 and bands[1]["x1"] == 600
    assert bands[2]["panels"] == ("step_time",) and bands[0]["panels"] is None
    assert [b["open"] for b in bands] == [False, True, True, False]


def test_event_marks_and_finished(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    lines = spike_lines(100, spike_at=-1)
    lines.insert(50, {"event": "checkpoint", "step": 49, "path": "ckpt/49.pt"})
    write_jsonl_run(root, "r", lines)
    with Store(root) as store:
        events = store.events("r")
    marks = views.event_marks(events, "checkpoint")
    assert marks == [{"x": 49.0, "text": "checkpoint @ step 49: ckpt/49.pt", "step": 49}]
    assert not is_finished(events)
    finished = pa.concat_tables([events, pa.Table.from_pylist(
        [{"segment": 0, "rank": 0, "event": "note", "step": 99, "time": None, "payload": json.dumps({"status": "finished"})}],
        schema=events.schema)])
    assert is_finished(finished)


def test_import_paths_cannot_leave_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "archive").mkdir(parents=True)
    inside = root / "archive" / "log.jsonl"
    inside.write_text("{}\n")
    outside = tmp_path / "secret.jsonl"
    outside.write_text("{}\n")
    os.symlink(outside, root / "archive" / "link.jsonl")
    assert views.resolve_under_root(root, "archive/log.jsonl") == inside.resolve()
    assert views.resolve_under_root(root, str(inside)) == inside.resolve()
    for bad in ("../secret.jsonl", str(outside), "archive/../../secret.jsonl", "archive/link.jsonl", "/etc/passwd"):
        with pytest.raises(ValueError, match="outside the dashboard root"):
            views.resolve_under_root(root, bad)
    with pytest.raises(ValueError, match="no such file"):
        views.resolve_under_root(root, "archive/missing.jsonl")


def test_a_rolled_back_finding_is_grey_and_stops_where_the_main_line_took_over() -> None:
    rolled_back = _finding("divergence", 200, open_=False, severity="critical", needs=True, end=400)
    [band] = views.finding_bands([rolled_back], last_step=480, abandoned_from={0: 220})
    assert (band["x0"], band["x1"], band["severity"]) == (200, 220, "history")
    assert band["label"] == "divergence (rolled back)"
    [band] = views.finding_bands([rolled_back], last_step=480)  # the same finding with no resume after it
    assert (band["x1"], band["severity"]) == (400, "critical")


@pytest.mark.parametrize("framework, resume", [
    ("transformers 4.57.0", "trainer.train(resume_from_checkpoint='/ckpt/checkpoint-250')"),
    ("lightning 2.5.1", "trainer.fit(model, datamodule, ckpt_path='/ckpt/checkpoint-250')")])
def test_a_run_recorded_by_a_framework_callback_resumes_through_the_framework(framework: str, resume: str) -> None:
    """A review's HF Trainer run was told to add ``mon = Monitor(...)``: a second recorder beside the callback,
    whose resume makes a segment of its own and a warning. The recipe is the callback and the trainer's resume."""
    rb = Rollback(checkpoint_step=250, checkpoint_path="/ckpt/checkpoint-250", skip_batches=[251, 300], actions=[],
                  reason="", evidence={}, checkpoint_missing=False)
    lines = views.monitor_call("gpt", rb, {"framework": framework}).splitlines()
    assert "Monitor(" not in "\n".join(lines) and lines[-1] == resume, lines
    assert lines[1].endswith("(root, run='gpt', skip_batches=(251, 300))") and "251-300" in lines[0], lines
    for line in lines:
        compile(line, "recipe", "exec")  # each line is Python as it stands
    none = Rollback(checkpoint_step=None, checkpoint_path=None, skip_batches=None, actions=[], reason="",
                    evidence={}, checkpoint_missing=False)
    recipe = views.monitor_call("gpt", none, {"framework": framework})
    compile(recipe, "recipe", "exec")
    assert "None)" in recipe and "no retained, healthy checkpoint" in recipe
