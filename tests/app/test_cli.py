"""The CLI: help everywhere, tables, and one-line errors (exit 2) instead of tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

RUNWATCH = [sys.executable, "-m", "runwatch.app.cli"]


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*RUNWATCH, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize("command", ["import", "runs", "compact", "check", "watch", "dashboard", "demo"])
def test_every_command_has_help(command):
    out = _run(command, "--help")
    assert out.returncode == 0 and "usage: runwatch" in out.stdout and "--root" in out.stdout


def test_import_runs_and_compact_end_to_end(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 3 - s / 10, "tokens": 512 * s}) + "\n" for s in range(20)))
    root = tmp_path / "root"
    out = _run("import", "jsonl", str(log), "--root", str(root), "--run", "tiny")
    assert out.returncode == 0, out.stderr
    assert "imported 20 rows" in out.stdout
    table = _run("runs", "--root", str(root))
    assert table.returncode == 0 and "tiny" in table.stdout and "9,728" in table.stdout
    runs = json.loads(_run("runs", "--root", str(root), "--json").stdout)
    assert runs[0]["run"] == "tiny" and runs[0]["last_step"] == 19
    assert _run("compact", "--root", str(root)).returncode == 0


def test_runs_lists_the_main_lines_last_step_the_state_and_the_runs_own_clock(tmp_path):
    """`runs` follows the same rules as the overview (``lifecycle``): a run resumed from step 30 after its first
    segment ran to 50 ends at the new segment's 39 (and its tokens), not the abandoned branch's 50; an import is archived and its
    last update is the log's last time, before and after ``compact`` (not the import's or compact's time)."""
    lines = [{"step": s, "time": 1.7e9 + s, "tokens": 100 * (s + 1), "loss": 3 - s / 100} for s in range(51)]
    lines.append({"event": "resume", "step": 30, "checkpoint": "ck/30.pt"})
    lines += [{"step": s, "time": 1.7e9 + 100 + s, "tokens": 100 * (s + 1), "loss": 3 - s / 100} for s in range(31, 40)]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    root = tmp_path / "root"
    assert _run("import", "jsonl", str(log), "--root", str(root), "--run", "branchy").returncode == 0
    for _ in range(2):
        [row] = json.loads(_run("runs", "--root", str(root), "--json").stdout)
        assert (row["last_step"], row["state"], row["last_update"]) == (39, "archived", 1.7e9 + 139), row
        assert row["tokens"] == 4000, row  # the main line's (step 39), not the abandoned branch's 5,100
        assert _run("compact", "--root", str(root)).returncode == 0
    table = _run("runs", "--root", str(root)).stdout.splitlines()
    assert table[0].split()[:3] == ["run", "state", "last"] and table[1].split()[:3] == ["branchy", "archived", "39"]


@pytest.mark.parametrize("args, message", [
    (["runs", "--root", "/definitely/not/here"], "no such directory"),
    (["import", "jsonl", "/definitely/not/here.jsonl", "--root", "r", "--run", "x"], "no such file"),
    (["import", "nosuchformat", __file__, "--root", "r", "--run", "x"], "unknown format"),
    (["import", "jsonl", __file__, "--root", "r", "--run", "../escape"], "invalid run name"),
    (["runs"], "the following arguments are required: --root"),
    (["compact", "--root", "/definitely/not/here"], "no such directory"),
    (["import", "jsonl", "/", "--root", "r", "--run", "x"], "expected a log file"),
])
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    out = _run(*args, cwd=tmp_path)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.parquet"))


def test_output_piped_into_head_is_not_an_error(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(5)))
    assert _run("import", "jsonl", str(log), "--root", str(tmp_path / "root"), "--run", "r").returncode == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`head`) has already gone: every write gets EPIPE
    try:
        done = subprocess.run([*RUNWATCH, "runs", "--root", str(tmp_path / "root")], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 0 and "Broken pipe" not in done.stderr and "Traceback" not in done.stderr
