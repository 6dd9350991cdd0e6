"""``runwatch check --all``: judge every run of a root, on this machine's cores or on Spark.

``--engine local`` judges runs in a process pool (``spawn``: DuckDB and
fsspec keep threads that a fork would copy mid-flight), each worker with one
``Store`` over the root calling ``judge_run``; ``--engine spark`` is
``spark_check.py``. Both write each run's findings file (``findings.py``)
and return, per run, the object ``check --json`` prints for it (or
``{"run", "error"}`` for a run that cannot be read). Exit status: 1 when any
run needs action (or stalled), else 2 when any run could not be judged,
else 0.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from runwatch.app import escape
from runwatch.app.check import ACTION_HEALTH, EXIT_ACTION, EXIT_OK, EXIT_USAGE, came_back_by_itself
from runwatch.app.progress import Progress
from runwatch.data.roots import open_root, run_of

ENGINES = ("local", "spark")

_store = None  # one per worker process


def runs_with_metrics(root: str | Path) -> list[str]:
    """The runs both engines judge: every run with committed metrics parts."""
    return sorted({run_of(f.path) for f in open_root(root).files(None, "metrics")})


def _open(root: str) -> None:
    global _store
    from runwatch.data.store import Store

    _store = Store(root)


def _open_worker(root: str) -> None:
    from runwatch.detectors.segment_scan import THREADS_ENV

    os.environ[THREADS_ENV] = "1"  # the pool already judges runs side by side on every core
    _open(root)


def _judge(run: str, now: float | None) -> dict:
    from runwatch.app.findings import judge_and_store

    try:
        return judge_and_store(_store, run, engine="local", now=now)
    except (ValueError, RuntimeError, OSError, ArithmeticError, MemoryError) as err:
        return {"run": run, "error": f"{type(err).__name__}: {' '.join(str(err).split())}"}


def check_all_local(root: str | Path, *, workers: int | None = None, now: float | None = None) -> list[dict]:
    """Judge every run in a pool of ``workers`` processes (default: the cores this process may use)."""
    runs = runs_with_metrics(root)
    if not runs:
        return []
    workers = max(1, min(workers or len(os.sched_getaffinity(0)), len(runs)))
    progress = Progress(len(runs), "judging runs", unit="runs")  # on stderr, shown only when it takes a while
    results = []
    if workers == 1:
        _open(str(root))
        judged = (_judge(run, now) for run in runs)
        for result in judged:
            results.append(result)
            progress.advance(result["run"])
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_open_worker, initargs=(str(root),)) as pool:
            for result in pool.map(_judge, runs, [now] * len(runs), chunksize=max(1, len(runs) // (workers * 8))):
                results.append(result)
                progress.advance(result["run"])
    progress.close(f"{len(results):,} runs judged")
    return results


def check_all(root: str | Path, engine: str = "local", *, workers: int | None = None,
              now: float | None = None, master: str | None = None) -> list[dict]:
    """Every run's ``check --json`` object (sorted by run), judged by ``engine``; findings files written."""
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    open_root(root)  # a missing root is one clear error, before any worker starts
    now = time.time() if now is None else now  # one clock for the whole pass, whichever engine
    if engine == "spark":
        from runwatch.app.spark_check import check_all_spark

        results = check_all_spark(root, master=master, now=now)
    else:
        results = check_all_local(root, workers=workers, now=now)
    return sorted(results, key=lambda r: r["run"])


def exit_code(results: Sequence[dict]) -> int:
    """1 when any run needs action (``check``'s rule), else 2 when any could not be judged, else 0."""
    if any(r.get("health") in ACTION_HEALTH for r in results):
        return EXIT_ACTION
    return EXIT_USAGE if any("error" in r for r in results) else EXIT_OK


def format_line(result: dict) -> str:
    """One terminal line per run: health, then the open findings' kinds and the recent ones that came back by
    themselves, as ``check`` groups them (run names and kinds are data)."""
    if "error" in result:
        return escape.terminal(f"{result['run']}: ERROR {result['error']}")
    line = f"{result['run']}: {result['health'].upper()}"
    recent = [f for f in result["findings"] if came_back_by_itself(f)]
    for title, group in (("open", [f for f in result["findings"] if f.get("open") and f not in recent]),
                         ("recent", recent)):
        if group:
            line += f"  {title}: " + ", ".join(f"{f['kind']}@{f['onset_step']}" for f in group)
    return escape.terminal(line)


def main(args: object) -> int:
    """``runwatch check --all``: a list for scripts (``--json``) or one line per run."""
    results = check_all(args.root, args.engine, workers=getattr(args, "workers", None),
                        now=getattr(args, "now", None), master=getattr(args, "master", None))
    if args.json:
        sys.stdout.write(json.dumps(results, allow_nan=False) + "\n")
    elif not results:
        print(f"no runs under {args.root}")
    else:
        for result in results:
            print(format_line(result))
        counts: dict[str, int] = {}
        for r in results:
            counts[r.get("health", "error")] = counts.get(r.get("health", "error"), 0) + 1
        print(f"{len(results)} runs: " + ", ".join(f"{n} {h}" for h, n in sorted(counts.items())))
    return exit_code(results)
