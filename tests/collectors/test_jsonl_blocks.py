"""JSONL in bounded blocks: the same store whatever the block size, errors still at file:line, memory bounded."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runwatch.collectors.importers import jsonl
from runwatch.collectors.importers.base import LogFormatError, write_import_stream
from runwatch.data.store import Store

_value = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.integers(-5, 10**6), st.none())


@st.composite
def _lines(draw: st.DrawFn) -> list[str]:
    """A valid JSONL log: steps that advance or restart, ranks, extras, NaN, events, resumes, blank lines."""
    out, step = [], 0
    ranked = draw(st.booleans())
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["metric"] * 8 + ["checkpoint", "resume", "note", "blank", "restart"]))
        if kind == "restart":
            step = draw(st.integers(0, max(step, 0)))
            continue
        if kind == "blank":
            out.append(draw(st.sampled_from(["", "  ", "\t"])))
        elif kind == "metric":
            row = {"step": step, "loss": draw(_value), "grad_norm": draw(_value)}
            if draw(st.booleans()):
                row["extra_x"] = draw(st.floats(-1e6, 1e6))
            if draw(st.booleans()):
                row["tokens"] = step * 8
            if draw(st.booleans()):
                row["note"] = "text annotation"  # strings on metric lines are not scalars
            if ranked:
                row["rank"] = draw(st.integers(0, 2))
            out.append(json.dumps(row))
            step += draw(st.integers(1, 3))
        else:
            ev = {"event": kind, "step": max(step - 1, 0)}
            if kind == "resume":
                ev["checkpoint"] = f"c/{step}"
                step = draw(st.integers(max(step - 5, 0), step))
            out.append(json.dumps(ev))
    out.append(json.dumps({"step": step, "loss": 1.0, **({"rank": 0} if ranked else {})}))
    return out


def _stored(root: Path, path: Path, block_bytes: int) -> tuple[list[str], list[str]]:
    write_import_stream(root, "r", jsonl.parse_chunks([path], block_bytes=block_bytes))
    with Store(root) as store:
        rows = [repr(sorted(r.items())) for r in store.rows("r", rank=None).to_pylist()]
        events = [repr(sorted(r.items())) for r in store.events("r").to_pylist()]
    return rows, events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=_lines(), block_bytes=st.sampled_from([1, 64, 300, 4096]))
@example(lines=['{"step": 0, "rank": 1}', '{"event": "resume", "step": 0, "checkpoint": "c/0"}',
                '{"event": "checkpoint", "step": 0}', '{"step": 0, "loss": 1.0, "rank": 0}'], block_bytes=1)
def test_any_block_size_lands_the_same_run(tmp_path_factory: pytest.TempPathFactory, lines: list[str],
                                           block_bytes: int) -> None:
    base = tmp_path_factory.mktemp("blocks")
    path = base / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    whole = _stored(base / "whole", path, 1 << 30)
    assert _stored(base / "blocks", path, block_bytes) == whole
    # And the per-line reference (the whole file through the Python path) agrees too.
    reference = base / "reference"
    chunk = jsonl._slow_block(path, 1, path.read_bytes(), False, jsonl._SegmentColumn())
    write_import_stream(reference, "r", [chunk])
    with Store(reference) as store:
        assert [repr(sorted(r.items())) for r in store.rows("r", rank=None).to_pylist()] == whole[0]


def test_an_error_in_a_late_block_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in range(10_000)]
    lines[7776] = '{"step": 7776, "loss": "high"}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogFormatError, match=r"in.jsonl:7777: 'loss' must be a number"):
        list(jsonl.parse_chunks([path], block_bytes=4096))
    lines[100] = '{"step": 100, "loss": 1.0'  # truncated
    lines[9000] = "[1, 2]"
    path.write_text("\n".join(lines) + "\n")
    chunks = list(jsonl.parse_chunks([path], skip_bad_lines=True, block_bytes=4096))
    assert sum(c.num_skipped for c in chunks) == 3 and sum(c.metrics.num_rows for c in chunks) == 9997


def test_numbers_beyond_float_range_are_infinite_on_both_paths(tmp_path: Path) -> None:
    """Issue 9.9: an integer too large for a float raised OverflowError (a traceback, exit 1)."""
    huge = "1" + "0" * 400
    path = tmp_path / "in.jsonl"
    path.write_text(f'{{"step": 1, "loss": {huge}, "x": -{huge}}}\n{{"step": 2, "loss": 1e400}}\n')
    fast = jsonl.parse([path]).metrics
    slow = jsonl._slow_block(path, 1, path.read_bytes(), False, jsonl._SegmentColumn()).metrics
    for table in (fast, slow):
        assert table["loss"].to_pylist() == [math.inf, math.inf] and table["x"].to_pylist()[0] == -math.inf
    path.write_text(f'{{"step": 1, "tokens": {huge}}}\n')
    with pytest.raises(LogFormatError, match="in.jsonl:1: 'tokens' must fit in 64 bits"):
        jsonl.parse([path])


MEASURE = """
import resource, sys
from runwatch.collectors.importers import import_logs
import pyarrow as pa, pyarrow.compute as pc
pc.sum(pa.array([1]))  # load every library first: measure the import, not the imports
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = import_logs("jsonl", [sys.argv[1]], sys.argv[2], "big")
print(result.num_rows, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)
"""


@pytest.mark.integration
def test_memory_stays_bounded_whatever_the_file_size(tmp_path: Path) -> None:
    """Issue 9.14: 2M lines peaked at 2 GB (about 1 KB a line)."""
    path = tmp_path / "big.jsonl"
    line = '{"step": %d, "time": 1.7e9, "loss": 2.5, "grad_norm": 0.4, "lr": 3e-4, "tokens": %d, "my_metric": 0.5}\n'
    with open(path, "w") as f:
        for start in range(0, 600_000, 10_000):
            f.write("".join(line % (s, 4096 * s) for s in range(start, start + 10_000)))
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(tmp_path / "root")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    num_rows, grown_mb = map(int, out.stdout.split())
    assert num_rows == 600_000
    assert grown_mb < 200, f"{grown_mb} MB for a {path.stat().st_size >> 20} MB file"  # ~1 KB a line was 600 MB
