"""Long jobs show progress the way their output expects: a live bar on a terminal, plain lines in a log file."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.app.progress import EVERY_ENV, Progress

RUNWATCH = [sys.executable, "-m", "runwatch.app.cli"]
NUM_LINES = 400_000


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JSONL log large enough that importing it takes a few seconds here."""
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    with open(path, "w") as f:
        for s in range(NUM_LINES):
            f.write(json.dumps({"step": s, "time": 1.7e9 + s, "loss": 2.0 + 1.0 / (1 + s), "grad_norm": 1.0,
                                "lr": 3e-4, "tokens": 4096 * s}) + "\n")
    return path


def _import_on_a_terminal(args: list[str], env: dict) -> str:
    """Run with stdout and stderr on a pseudo-terminal; everything the terminal received."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=300)
    os.close(leader)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_a_terminal_gets_one_live_bar(big_log: Path, tmp_path: Path) -> None:
    env = {**os.environ, EVERY_ENV: "0.2"}
    text = _import_on_a_terminal([*RUNWATCH, "import", "jsonl", str(big_log), "--root", str(tmp_path / "r"),
                                  "--run", "big"], env)
    bar_lines = [part for part in text.split("\r") if "importing big [" in part]
    assert len(bar_lines) >= 2  # redrawn in place ...
    assert "100%" in bar_lines[-1]  # ... ending full
    assert f"imported {NUM_LINES} rows" in text
    before_summary = text[:text.index("imported ")]
    assert before_summary.count("\n") == 1 and before_summary.endswith("\n")  # one line, ended once


def test_a_log_file_gets_plain_periodic_lines(big_log: Path, tmp_path: Path) -> None:
    # As often as the reader reports (every 0.2 s): the import takes ~1 s here, and at 0.3 s a fast run of it
    # fitted only one line (a fresh-clone run saw "35%" and then the summary).
    env = {**os.environ, EVERY_ENV: "0.05"}
    with open(tmp_path / "job.log", "w") as log:
        done = subprocess.run([*RUNWATCH, "import", "jsonl", str(big_log), "--root", str(tmp_path / "r"),
                               "--run", "big"], stdout=log, stderr=log, env=env, timeout=300)
    assert done.returncode == 0
    text = (tmp_path / "job.log").read_text()
    assert "\r" not in text and "\x1b" not in text  # nothing joined by carriage returns, no terminal codes
    lines = text.splitlines()
    progress = [line for line in lines if line.startswith("importing big: ") and "%" in line]
    assert len(progress) >= 2 and all("elapsed" in line for line in progress)
    assert any(line.startswith(f"importing big: {NUM_LINES:,} rows in ") for line in lines)


def test_a_short_job_prints_nothing_of_its_own() -> None:
    out = io.StringIO()
    ticks = iter([0.0, 0.1, 0.2, 0.3])
    progress = Progress(10, "quick", out, every_s=5.0, clock=lambda: next(ticks))
    progress.update(5)
    progress.update(10)
    progress.close("done")
    assert out.getvalue() == ""


def test_log_lines_come_at_the_interval_with_what_is_left() -> None:
    out = io.StringIO()
    ticks = iter([0.0, 4.0, 10.0, 12.0, 21.0, 25.0])
    progress = Progress(100, "demo", out, unit="steps", every_s=10.0, clock=lambda: next(ticks))
    for done in (10, 25, 30, 50):
        progress.update(done, f"step {done}")
    progress.close("done")
    assert out.getvalue().splitlines() == [
        "demo: 25% (25/100 steps), step 25, 10 s elapsed, about 30 s left",
        "demo: 50% (50/100 steps), step 50, 21 s elapsed, about 21 s left",
        "demo: done in 25 s",
    ]


def test_check_all_reports_progress_in_a_log_file(tmp_path: Path) -> None:
    """`check --all` over several runs: plain progress lines on stderr, the results alone on stdout."""
    from tests.app.conftest import spike_lines, write_jsonl_run

    root = tmp_path / "root"
    root.mkdir()
    for i in range(4):
        write_jsonl_run(root, f"run-{i}", spike_lines(400, spike_at=200))
    env = {**os.environ, EVERY_ENV: "0"}
    with open(tmp_path / "job.log", "w") as log:
        done = subprocess.run([*RUNWATCH, "check", "--all", "--root", str(root), "--workers", "1", "--json"],
                              stdout=subprocess.PIPE, stderr=log, env=env, text=True, timeout=300, check=False)
    assert [r["run"] for r in json.loads(done.stdout)] == [f"run-{i}" for i in range(4)]
    lines = (tmp_path / "job.log").read_text().splitlines()
    assert [line.split(",")[0] for line in lines if "%" in line] == [
        "judging runs: 25% (1/4 runs)", "judging runs: 50% (2/4 runs)", "judging runs: 75% (3/4 runs)",
        "judging runs: 100% (4/4 runs)"]
    assert lines[-1].startswith("judging runs: 4 runs judged in ")


def test_the_demo_reports_progress_in_a_log_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``runwatch demo`` trains real runs for a minute or more: to a log file, plain lines with what is left."""
    from runwatch.app.demo import DemoPlan, record_demo
    from tests.app.conftest import TEST_PLAN_KW

    monkeypatch.setenv(EVERY_ENV, "0.05")
    with open(tmp_path / "demo.log", "w") as log:
        record_demo(tmp_path / "root", DemoPlan(**TEST_PLAN_KW), runs=("demo-diverged",), progress_out=log)
    text = (tmp_path / "demo.log").read_text()
    assert "\r" not in text and "\x1b" not in text
    lines = [line for line in text.splitlines() if line.startswith("recording the demo runs: ")]
    assert len([line for line in lines if "%" in line and "steps" in line]) >= 2, text
    assert lines[-1].startswith("recording the demo runs: done in "), text
