"""`runwatch check` end to end: a real store (JSONL import and write_import), the installed CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runwatch.collectors.importers.base import ParsedLog, write_import
from tests.detectors.synth import grad_curve, loss_curve

RUNWATCH = [sys.executable, "-m", "runwatch.app.cli"]


def _runwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUNWATCH, *args], capture_output=True, text=True, timeout=120)


def _jsonl(path: Path, loss: np.ndarray, grad: np.ndarray, ckpts: dict[int, str], resume: tuple[int, np.ndarray] | None = None) -> None:
    lines = []
    for s, (l, g) in enumerate(zip(loss, grad)):
        lines.append(json.dumps({"step": s, "time": 1.7e9 + s, "loss": float(l), "grad_norm": float(g), "samples": (s + 1) * 8}))
        if s in ckpts:
            lines.append(json.dumps({"event": "checkpoint", "step": s, "path": ckpts[s], "bytes": 10, "write_seconds": 0.1}))
    if resume is not None:
        at, tail = resume
        lines.append(json.dumps({"event": "resume", "step": at, "from_step": at}))
        for k, l in enumerate(tail):
            s = at + k
            lines.append(json.dumps({"step": s, "time": 1.7e9 + 5000 + k, "loss": float(l), "grad_norm": 0.3, "samples": (s + 1) * 8}))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("check")
    n = 2000
    loss, grad = loss_curve(n), grad_curve(n)
    _jsonl(base / "clean.jsonl", loss, grad, {500: "ckpt/500.pt"})
    bad = loss.copy()
    bad[1500:] += 1.2  # a loss jump that never comes back
    present = base / "ckpt"
    present.mkdir()
    for s in (1000, 1400):
        (present / f"{s}.pt").write_bytes(b"x")
    _jsonl(base / "spike.jsonl", bad, grad, {1000: str(present / "1000.pt"), 1400: str(present / "1400.pt"),
                                            1450: str(present / "1450.pt")})  # 1450 was deleted by retention
    _jsonl(base / "rolled.jsonl", bad[:1700], grad[:1700], {1400: "ckpt/1400.pt"}, resume=(1400, loss_curve(2500, seed=3)[1400:]))
    store = base / "store"
    for run in ("clean", "spike", "rolled"):
        done = _runwatch("import", "jsonl", str(base / f"{run}.jsonl"), "--root", str(store), "--run", run)
        assert done.returncode == 0, done.stderr
    return store


def test_healthy_run_exits_0(root: Path) -> None:
    done = _runwatch("check", "--root", str(root), "--run", "clean")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "clean: HEALTHY"


def test_unrecovered_spike_exits_1_with_json_contract(root: Path) -> None:
    done = _runwatch("check", "--root", str(root), "--run", "spike", "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)  # exactly one JSON object, strict
    assert out["run"] == "spike" and out["health"] == "action needed"
    [f] = [f for f in out["findings"] if f["needs_action"]]
    assert f["kind"] == "spike" and f["onset_step"] == 1500 and f["segment"] == 0 and f["self_recovered"] is False
    assert out["segments"] == [{"segment": 0, "first_step": 0, "last_step": 1999, "abandoned_from": None}]
    rb = out["rollback"]
    assert rb["checkpoint_step"] == 1400 and rb["checkpoint_path"].endswith("1400.pt")
    assert rb["checkpoint_missing"] is True  # 1450 is not on disk
    assert rb["skip_batches"][0] == 1401 and rb["actions"] and "1450" in rb["reason"]
    assert "NaN" not in done.stdout and "Infinity" not in done.stdout


def test_human_output_leads_with_health_and_what_to_do(root: Path) -> None:
    done = _runwatch("check", "--root", str(root), "--run", "spike")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0] == "spike: ACTION NEEDED"
    assert any(line.startswith("what to do:") for line in lines)
    assert any("resume: --resume" in line for line in lines)


def test_rolled_back_spike_is_history(root: Path) -> None:
    done = _runwatch("check", "--root", str(root), "--run", "rolled", "--json")
    assert done.returncode == 0, done.stdout
    out = json.loads(done.stdout)
    assert [s["abandoned_from"] for s in out["segments"]] == [1400, None]
    assert all(not f["open"] for f in out["findings"]) and out["rollback"] is None


def test_unknown_run_and_bad_root_exit_2(root: Path, tmp_path: Path) -> None:
    done = _runwatch("check", "--root", str(root), "--run", "nope", "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert "unknown run 'nope'" in done.stderr and "clean" in done.stderr
    assert _runwatch("check", "--root", str(tmp_path / "missing"), "--run", "x").returncode == 2
    assert _runwatch("check", "--root", str(root)).returncode == 2  # --run is required


def test_write_import_store_with_nan_and_fp16(tmp_path: Path) -> None:
    n = 800
    steps = np.arange(n)
    loss = loss_curve(n)
    loss[700:] = np.nan
    rows = [{"step": int(s), "loss": float(l), "grad_norm": 0.3, "loss_scale": 1024.0} for s, l in zip(steps, loss)]
    events = [{"event": "checkpoint", "step": 600, "path": "ckpt/600.pt", "row_index": 601}]
    write_import(tmp_path, "fp16nan", ParsedLog.from_rows(rows, events=events))
    done = _runwatch("check", "--root", str(tmp_path), "--run", "fp16nan", "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    [f] = out["findings"]
    assert f["kind"] == "nan" and f["onset_step"] == 700
    assert out["rollback"]["checkpoint_step"] == 600 and any("BF16" in a for a in out["rollback"]["actions"])


def test_live_run_that_went_silent_is_stalled(tmp_path: Path) -> None:
    import argparse
    import time

    from runwatch.app.check import main

    n = 300
    now = time.time()
    rows = [{"step": s, "time": now - 3600 + s * 1.0, "loss": float(l)} for s, l in enumerate(loss_curve(n))]
    write_import(tmp_path, "live", ParsedLog.from_rows(rows), meta={"source": "monitor"})
    args = argparse.Namespace(root=str(tmp_path), run="live", json=True, now=now)
    assert main(args) == 1  # silent for ~55 min after 1 s steps
    args.now = now - 3600 + n + 30  # 30 s after the last step: fine
    assert main(args) == 0
    write_import(tmp_path, "archive", ParsedLog.from_rows(rows), meta={"source": "import:jsonl"})
    assert main(argparse.Namespace(root=str(tmp_path), run="archive", json=True, now=now)) == 0
