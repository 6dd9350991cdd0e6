"""Each Monitor claims its own (segment, rank): writers never share a partition, ranks never wait (issue 9.2)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from runwatch.collectors.importers import import_logs
from runwatch.collectors.monitor import Monitor
from runwatch.data.compact import compact
from runwatch.data.locks import RunBusy
from runwatch.data.storage import data_files
from runwatch.data.store import Store

SCRIPT = Path(__file__).with_name("train_script.py")


def _record(mon: Monitor, steps: range, loss: float) -> None:
    for s in steps:
        mon.step(s, loss=torch.tensor(loss))
        mon.flush()  # many small parts, so interleaving would show


def test_two_monitors_on_one_run_and_rank_take_separate_segments(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = Monitor(tmp_path, "r", rank=0)
        second = Monitor(tmp_path, "r", rank=0)
        for s in range(20):  # interleaved in time, as two processes would be
            first.step(s, loss=1.0)
            second.step(s, loss=2.0)
            first.flush()
            second.flush()
        first.close()
        second.close()
    assert (first.segment, second.segment) == (0, 1)
    messages = [str(w.message) for w in caught if "another live writer" in str(w.message)]
    assert len(messages) == 1 and f"pid {os.getpid()}" in messages[0] and "segment 1" in messages[0]
    assert first.num_errors == 0 and second.num_errors == 1
    with Store(tmp_path) as store:
        rows = store.rows("r", rank=0).to_pylist()
    by_segment = {seg: [(r["step"], r["loss"]) for r in rows if r["segment"] == seg] for seg in (0, 1)}
    assert by_segment == {0: [(s, 1.0) for s in range(20)], 1: [(s, 2.0) for s in range(20)]}


def test_ranks_of_one_run_write_the_same_segment_at_once(tmp_path: Path) -> None:
    monitors = [Monitor(tmp_path, "r", rank=rank) for rank in range(4)]
    for mon in monitors:
        _record(mon, range(5), 1.0)
    for mon in monitors:
        mon.close()
    assert {mon.segment for mon in monitors} == {0} and all(mon.num_errors == 0 for mon in monitors)
    with Store(tmp_path) as store:
        assert store.ranks("r") == [0, 1, 2, 3]


@pytest.mark.integration
def test_two_trainer_processes_on_one_rank_never_interleave(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), "--root", str(tmp_path), "--name", "twice", "--steps", "60",
                               "--flush-every", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    with Store(tmp_path) as store:
        segments = store.segments("twice").to_pylist()
        rows = store.rows("twice", rank=0).to_pylist()
    assert [s["segment"] for s in segments] == [0, 1]
    for seg in (0, 1):
        assert [r["step"] for r in rows if r["segment"] == seg] == list(range(60))


def test_compact_leaves_a_live_partition_alone_and_replace_refuses_the_run(tmp_path: Path) -> None:
    mon = Monitor(tmp_path, "live", rank=0)
    for step in range(10):
        _record(mon, range(step, step + 1), 1.0)
        deadline = time.monotonic() + 10
        while mon.num_written_rows <= step and time.monotonic() < deadline:
            time.sleep(0.01)  # one part per flush: let the writer finish each before the next
    parts = data_files(tmp_path, "live")
    assert len(parts) == 10
    result = compact(tmp_path, "live")
    assert result.live_partitions == 1 and data_files(tmp_path, "live") == parts
    log = tmp_path / "in.jsonl"
    log.write_text('{"step": 1, "loss": 1.0}\n')
    with pytest.raises(RunBusy, match=f"being recorded: Monitor \\(pid {os.getpid()}"):
        import_logs("jsonl", [log], tmp_path, "live", replace=True)
    mon.close()
    assert compact(tmp_path, "live").live_partitions == 0 and len(data_files(tmp_path, "live")) == 1
    with Store(tmp_path) as store:
        assert store.rows("live")["step"].to_pylist() == list(range(10))


def test_an_orphan_temporary_file_is_ignored_then_cleaned(tmp_path: Path) -> None:
    """Issue 9.5: what a writer killed mid-file leaves is invisible to readers and removed by compact."""
    mon = Monitor(tmp_path, "r", rank=0)
    _record(mon, range(5), 1.0)
    mon.close()
    partition = data_files(tmp_path, "r")[0].parent
    orphan = partition / ".metrics-0001.parquet.tmp-deadbeef"
    orphan.write_bytes(b"PAR1 half a file")
    with Store(tmp_path) as store:
        assert store.rows("r").num_rows == 5 and store.runs()["error"].to_pylist() == [None]
    compact(tmp_path)
    assert not orphan.exists()
