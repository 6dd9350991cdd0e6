"""JSONL import speed and memory, beside ``pyarrow.json.read_json`` and DuckDB's ``read_json`` on the same file.

Run: ``.venv/bin/python bench/jsonl_import.py [--lines 2000000] [--repeat 3]``.

The file follows the JSONL contract (a metric line per step with seven
fields, a checkpoint event every 1,000 steps). Every measurement runs in its
own process, so its peak RSS (``ru_maxrss``, libraries loaded before the
clock starts) is its own; variants are interleaved and their order rotated
each round, and the table gives medians and each median's ratio to
``pyarrow.json``'s:

* ``pyarrow.json.read_json``: the whole file into one Arrow table (parse only);
* DuckDB ``read_json``: the whole file into an Arrow table (parse only);
* runwatch parse: ``jsonl.parse_chunks``, bounded blocks, validated, no store;
* runwatch import: ``import_logs`` end to end, parse and store (Parquet, staged, switched in);
* per-line Python parser: the path every line took before (now only blocks
  Arrow rejects), whole file in memory, then stored.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = ("pyarrow.json.read_json", "duckdb read_json", "runwatch parse", "runwatch import", "per-line Python parser")

CHILD = r"""
import json, resource, shutil, sys, time
import duckdb, pyarrow as pa, pyarrow.compute as pc, pyarrow.json as pajson
from pathlib import Path
from runwatch.collectors.importers import import_logs, jsonl
from runwatch.collectors.importers.base import write_import
pc.sum(pa.array([1]))  # load every library before the clock starts
variant, path, root = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
shutil.rmtree(root, ignore_errors=True)
t0 = time.perf_counter()
if variant == "pyarrow.json.read_json":
    rows = pajson.read_json(path).num_rows
elif variant == "duckdb read_json":
    with duckdb.connect() as con:
        rel = con.sql("SELECT * FROM read_json(?, format='newline_delimited')", params=[str(path)])
        rows = (rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()).num_rows
elif variant == "runwatch parse":
    rows = sum(c.metrics.num_rows + len(c.events) for c in jsonl.parse_chunks([path]))
elif variant == "runwatch import":
    result = import_logs("jsonl", [path], root, "bench")
    rows = result.num_rows + result.num_events
else:
    parsed = jsonl._slow_block(path, 1, path.read_bytes(), False, jsonl._SegmentColumn())
    result = write_import(root, "bench", parsed)
    rows = result.num_rows + result.num_events
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "rows": rows, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_file(path: Path, num_lines: int) -> int:
    """The benchmark file; returns its number of lines."""
    written = 0
    with open(path, "w") as f:
        for start in range(0, num_lines, 10_000):
            out = []
            for s in range(start, min(start + 10_000, num_lines)):
                out.append(f'{{"step": {s}, "time": {1.7e9 + s:.1f}, "loss": {2 + (s % 997) / 1000:.6f}, '
                           f'"grad_norm": {0.3 + (s % 89) / 100:.4f}, "lr": 0.0003, "tokens": {s * 4096}, '
                           f'"my_metric": {(s % 13) / 13:.5f}}}\n')
                if s % 1000 == 999:
                    out.append(json.dumps({"event": "checkpoint", "step": s, "path": f"ckpt/{s}.pt"}) + "\n")
            f.write("".join(out))
            written += len(out)
    return written


def measure(variant: str, path: Path, root: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, variant, str(path), str(root)], capture_output=True, text=True,
                         timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-per-line", action="store_true", help="leave out the slow per-line reference")
    args = parser.parse_args()
    variants = [v for v in VARIANTS if not (args.skip_per_line and v == "per-line Python parser")]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl"
        num_lines = write_file(path, args.lines)
        print(f"{num_lines:,} lines, {path.stat().st_size / 1e6:.0f} MB; cpus: {len(os.sched_getaffinity(0))}; "
              f"load average before: {os.getloadavg()[0]:.2f}")
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for r in range(args.repeat):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for variant in order:
                runs[variant].append(measure(variant, path, Path(tmp) / "root"))
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    anchor = statistics.median(m["seconds"] for m in runs["pyarrow.json.read_json"])
    print("\n| variant | median s | lines/s (median) | speed vs pyarrow.json | peak RSS MB (median) | rows |")
    print("|---|---:|---:|---:|---:|---:|")
    for variant in variants:
        secs = statistics.median(m["seconds"] for m in runs[variant])
        rss = statistics.median(m["rss_mb"] for m in runs[variant])
        print(f"| {variant} | {secs:.2f} | {num_lines / secs:,.0f} | {anchor / secs:.2f}x | {rss:.0f} "
              f"| {runs[variant][0]['rows']:,} |")


if __name__ == "__main__":
    main()
