"""Helpers for the storage tests: the real CLI in a subprocess, plain-DuckDB reads, JSONL logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb

CLI = [sys.executable, "-m", "runwatch.app.cli"]


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def write_log(path: Path, steps: range, loss: float = 1.0, **extra: float) -> Path:
    path.write_text("".join(json.dumps({"step": s, "loss": loss, **extra}) + "\n" for s in steps))
    return path


def plain_rows(root: Path, run: str | None = None) -> list[tuple]:
    """(run, segment, rank, step, loss) of every row, read by plain DuckDB without runwatch code."""
    where = f"WHERE run = '{run}'" if run else ""
    with duckdb.connect() as con:
        if not list(root.glob("**/*.parquet")):
            return []
        return con.sql(f"SELECT run, segment, rank, step, loss FROM read_parquet('{root}/**/*.parquet', "
                       f"hive_partitioning=1, union_by_name=1) {where} ORDER BY ALL").fetchall()


def staging_leftovers(root: Path) -> list[Path]:
    """Whatever a writer left in staging, beside or inside the root."""
    areas = [root.parent / f".{root.name}.runwatch-staging", root / ".runwatch-staging"]
    return [p for area in areas if area.exists() for p in area.iterdir()]
