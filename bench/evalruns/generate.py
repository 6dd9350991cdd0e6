"""Labelled runs, part 3: train every scenario and land it in a real runwatch store.

Runs go through the same path as an archived log (``ParsedLog`` ->
``write_import``: real Parquet, real segments from the resume events), and the
labels go next to the store as ``labels.json``. Generated sets are cached
under ``bench/results/`` keyed by ``VERSION``: bump it whenever training.py or
scenarios.py changes what a run contains.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from runwatch.collectors.importers.base import ParsedLog, write_import

from .scenarios import LabelledRun, scenarios
from .training import RunSpec, train

VERSION = "labelled-v6"  # v6: resume events carry the checkpoint's step (the record's contract)


def generate(out_dir: Path, runs: list[LabelledRun] | None = None, *, verbose: bool = False,
             train_fn: Callable[[RunSpec], tuple[list, list]] = train, version: str = VERSION,
             source: str = "bench/evalruns", describe: Callable[[LabelledRun], dict] = LabelledRun.to_dict) -> dict:
    """Train and write every run, plus ``labels.json``, under ``out_dir`` (root = out_dir/'store')."""
    torch.set_num_threads(1)
    runs = scenarios() if runs is None else runs
    root = out_dir / "store"
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    num_rows = 0
    for k, lr in enumerate(runs):
        rows, events = train_fn(lr.spec)
        write_run(root, lr.spec.run, rows, events,
                  meta={"source": source, "scenario": lr.spec.scenario, "labels_version": version})
        num_rows += len(rows)
        if verbose and (k + 1) % 20 == 0:
            print(f"  generated {k + 1}/{len(runs)} runs, {time.perf_counter() - t0:.0f}s", flush=True)
    info = {"version": version, "num_runs": len(runs), "num_rows": num_rows,
            "seconds": round(time.perf_counter() - t0, 1), "runs": [describe(lr) for lr in runs]}
    (out_dir / "labels.json").write_text(json.dumps(info, indent=1))
    return info


def write_run(root: Path, run: str, rows: list[dict], events: list[dict], meta: dict) -> None:
    """Land one trained run in the store the way an archived log lands (``write_import``).

    A resume event starts a new segment at its row even when the new segment's
    first step is later than the last one (the step counter skipped with the data).
    """
    breaks = {int(ev["row_index"]) for ev in events if ev["event"] == "resume"}
    write_import(root, run, ParsedLog.from_rows(rows, events=events, breaks=breaks), replace=True, meta=meta)


def load_or_generate(results_dir: Path, *, verbose: bool = True) -> tuple[Path, dict]:
    """The cached labelled set for ``VERSION``, generating it on first use."""
    out_dir = results_dir / VERSION
    labels = out_dir / "labels.json"
    if labels.exists():
        return out_dir / "store", json.loads(labels.read_text())
    if verbose:
        print(f"generating labelled runs into {out_dir} (real CPU training, one thread)...", flush=True)
    info = generate(out_dir, verbose=verbose)
    return out_dir / "store", info
