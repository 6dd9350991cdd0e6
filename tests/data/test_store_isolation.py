"""One unreadable file fails only its own run: every other run still lists and checks (issue 9.8, 9.9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runwatch.data.record import metrics_table
from runwatch.data.storage import StagedWrite, data_files
from runwatch.data.store import Store, StoreError
from tests.data.helpers import run_cli


def _run(root: Path, run: str, steps: int = 50) -> None:
    with StagedWrite(root) as staged:
        staged.add_metrics(run, 0, 0, metrics_table([{"step": s, "loss": 2.0, "tokens": 10 * s} for s in range(steps)]))
        staged.add_run_meta(run, {"source": "import:jsonl"})


@pytest.fixture
def root_with_a_truncated_file(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    for run in ("alpha", "broken", "gamma"):
        _run(root, run)
    bad = data_files(root, "broken")[0]
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])  # a truncated Parquet file
    return root, bad


def test_runs_reports_the_bad_file_against_its_run(root_with_a_truncated_file: tuple[Path, Path]) -> None:
    root, bad = root_with_a_truncated_file
    with Store(root) as store:
        runs = {r["run"]: r for r in store.runs().to_pylist()}
    assert set(runs) == {"alpha", "broken", "gamma"}
    assert runs["alpha"]["error"] is None and runs["alpha"]["last_step"] == 49 and runs["gamma"]["tokens"] == 490
    assert str(bad) in runs["broken"]["error"] and "'broken'" in runs["broken"]["error"]
    assert runs["broken"]["last_step"] is None and runs["broken"]["last_update"] is not None


def test_the_cli_lists_and_checks_every_other_run(root_with_a_truncated_file: tuple[Path, Path]) -> None:
    root, bad = root_with_a_truncated_file
    out = run_cli("runs", "--root", str(root))
    assert out.returncode == 2  # a data error, named, after everything else was listed
    assert "alpha" in out.stdout and "gamma" in out.stdout and "unreadable" in out.stdout
    [broken_line] = [line for line in out.stdout.splitlines() if line.startswith("broken")]
    assert "None" not in broken_line, broken_line  # its unknown counts are dashes, as any unknown
    assert out.stderr.count("\n") == 1 and str(bad) in out.stderr and "Traceback" not in out.stderr
    listed = json.loads(run_cli("runs", "--root", str(root), "--json").stdout)
    assert [r["run"] for r in listed if r["error"] is None] == ["alpha", "gamma"]
    assert run_cli("check", "--root", str(root), "--run", "alpha").returncode == 0
    broken = run_cli("check", "--root", str(root), "--run", "broken")
    assert broken.returncode == 2 and str(bad) in broken.stderr and broken.stderr.count("\n") == 1


def test_a_malformed_stored_event_names_its_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _run(root, "r")
    events = data_files(root, "r")[0].parent / "events-1.jsonl"
    events.write_text(json.dumps({"event": "note", "step": 1}) + "\n" + json.dumps({"step": 2}) + "\n")
    with Store(root) as store, pytest.raises(StoreError, match=f"{events}:2: expected an event object"):
        store.events("r")
    out = run_cli("check", "--root", str(root), "--run", "r")
    assert out.returncode == 2 and f"{events}:2" in out.stderr and "KeyError" not in out.stderr


def test_summaries_are_reused_until_the_files_change(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _run(root, "r")
    with Store(root) as store:
        first = store.runs().to_pylist()
        assert store.runs().to_pylist() == first
        with StagedWrite(root) as staged:
            staged.add_metrics("r", 0, 0, metrics_table([{"step": 50, "loss": 1.0}]))
        assert store.runs().to_pylist()[0]["last_step"] == 50
