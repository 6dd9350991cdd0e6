"""Every failure of the CLI is one line naming what failed, exit 2; never a traceback, never exit 1 (issue 9.9)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUNWATCH = [sys.executable, "-m", "runwatch.app.cli"]
HUGE = "1" + "0" * 400


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUNWATCH, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("fmt, name, text, where", [
    ("jsonl", "a.jsonl", f'{{"step": 1, "tokens": {HUGE}}}\n', "a.jsonl:1:"),
    ("jsonl", "b.jsonl", '{"step": 1, "loss": 1.0}\n{"event": "checkpoint"}\n', "b.jsonl:2:"),
    ("jsonl", "c.jsonl", '{"step": 1}\n{"event": 5, "step": 1}\n', "c.jsonl:2:"),
    ("csv", "d.csv", f"step,loss,tokens\n1,1.0,{HUGE}\n", "d.csv:2:"),
    ("csv", "e.csv", "step,loss\n1,2\n2,3,\x1b[2J\n", "e.csv:3:"),
    ("megatron-golden", "f.json",
     f'{{"lm loss": {{"start_step": 1, "end_step": 1, "step_interval": 1, "values": {{"1": {HUGE}}}}}}}\n', "f.json"),
])
def test_bad_input_is_one_line_naming_the_place_and_exit_2(tmp_path: Path, fmt: str, name: str, text: str,
                                                           where: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    for extra in ([], ["--skip-bad-lines"]):
        out = _run("import", fmt, str(path), "--root", str(tmp_path / "root"), "--run", "r", *extra)
        if out.returncode == 0:
            continue  # skipping the bad line left a valid import
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr and "\x1b" not in out.stderr
        assert where in out.stderr or (extra and f"{path}: nothing to import" in out.stderr)


def test_runs_and_check_on_a_broken_events_file(tmp_path: Path) -> None:
    log = tmp_path / "in.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(5)))
    root = tmp_path / "root"
    assert _run("import", "jsonl", str(log), "--root", str(root), "--run", "r").returncode == 0
    events = next(root.glob("run=r/segment=0/rank=0")) / "events-9.jsonl"
    events.write_text('{"step": 3}\n')
    out = _run("check", "--root", str(root), "--run", "r")
    assert out.returncode == 2 and f"{events}:1:" in out.stderr and out.stderr.count("\n") == 1
