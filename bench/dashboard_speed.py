"""Dashboard speed: how fast the run page and the overview are ready on big runs.

Writes a synthetic 1M-step run (two segments, so there is an abandoned
branch; one-step spikes and a NaN the chart must keep) as 20 flush-sized
Parquet parts, then times what the run page does on the server: one DuckDB
read and per-bucket first/min/max/last for the six panels, the ECharts
option, its JSON (what Streamlit ships to the browser), a zoom re-query, and,
separately, the detectors over all rows. Then copies the run ten times and
times what the overview does per refresh.

    .venv/bin/python bench/dashboard_speed.py [--steps 1000000] [--root DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from runwatch.app import charts, series, state, views
from runwatch.data.storage import StagedWrite, data_files
from runwatch.data.store import Store

NUM_PARTS = 20
NUM_BUCKETS = state.NUM_BUCKETS


def synthetic_run(root: Path, run: str, num_steps: int) -> dict[str, int]:
    """Write the run; returns where its spikes are (the chart must show them)."""
    rng = np.random.default_rng(0)
    steps = np.arange(num_steps, dtype=np.int64)
    loss = 2.0 + 3.0 * np.exp(-steps / (num_steps / 5)) + 0.02 * rng.standard_normal(num_steps)
    spike_at, nan_at = int(num_steps * 0.613) + 7, int(num_steps * 0.8) + 3
    loss[spike_at] = 40.0
    loss[nan_at] = np.nan
    table = pa.table({
        "step": steps, "time": 1.7e9 + 0.1 * steps + 0.001 * rng.random(num_steps),
        "tokens": (steps + 1) * 4096, "samples": (steps + 1) * 8, "loss": loss,
        "grad_norm": np.abs(1.0 + 0.1 * rng.standard_normal(num_steps)), "loss_scale": np.full(num_steps, 65536.0),
        "act_norm": 10.0 + steps / (num_steps / 10), "lr": np.full(num_steps, 3e-4),
    })
    resume = int(num_steps * 0.7)
    branch_end = int(num_steps * 0.75)
    with StagedWrite(root) as staged:
        # Segment 0 ran to 75% and was rolled back to 70%: 5% of the steps are an abandoned branch.
        for part in np.array_split(np.arange(branch_end), NUM_PARTS // 2):
            staged.add_metrics(run, 0, 0, table.take(pa.array(part)))
        for part in np.array_split(np.arange(resume, num_steps), NUM_PARTS // 2):
            staged.add_metrics(run, 1, 0, table.take(pa.array(part)))
        staged.add_events(run, 0, 0, [{"event": "checkpoint", "step": s, "time": 1.7e9 + 0.1 * s, "path": f"ckpt/{s}.pt"}
                                      for s in range(0, branch_end, num_steps // 20)])
        staged.add_events(run, 1, 0, [{"event": "resume", "step": resume, "checkpoint": f"ckpt/{resume}.pt"}])
        staged.add_run_meta(run, {"source": "bench"})
    return {"spike_at": spike_at, "nan_at": nan_at}


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Median wall seconds over ``repeat`` calls (each on a fresh Store: no warm DuckDB state)."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def run_page(root: Path, run: str, x: str = "step", lo: float | None = None, hi: float | None = None) -> dict:
    """What the run page does between 'query' and 'figure ready', without Streamlit around it."""
    out: dict = {}
    with Store(root) as store:
        t0 = time.perf_counter()
        columns = list(charts.PANEL_COLUMNS) + (["step"] if x == "tokens" else [])
        tables = store.downsample_columns(run, columns, x=x, lo=lo, hi=hi, num_buckets=NUM_BUCKETS)
        segments = store.segments(run).to_pylist()
        events = store.events(run)
        out["query_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        to_x = None
        if x == "tokens":
            main = series.main_part(tables["step"])
            to_x = series.step_mapper(main["first"].to_numpy(), main["x_first"].to_numpy())
        marks = [{**m, "kind": k} for k in ("checkpoint", "resume") for m in views.event_marks(events, k, to_x)]
        chart = charts.run_chart(tables, charts.panels_for(store.columns(run)), view=charts.View(x=x), marks=marks,
                                 abandoned_from={s["segment"]: s["abandoned_from"] for s in segments
                                                 if s["abandoned_from"] is not None})
        out["figure_s"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        out["json_bytes"] = len(json.dumps(chart.option))
        out["json_s"] = time.perf_counter() - t2
        lines = [s_ for s_ in chart.option["series"] if s_["type"] == "line"]
        out["points"] = sum(len(s_["data"]) for s_ in lines)
        out["loss_max"] = max(p[1] for s_ in lines if s_["name"] == "main line" and s_["xAxisIndex"] == 0
                              for p in s_["data"] if p[1] is not None)
        out["nan_marks"] = sum(len(s_["data"]) for s_ in chart.option["series"] if s_["name"] == "NaN/Inf")
    out["total_s"] = out["query_s"] + out["figure_s"] + out["json_s"]
    return out


def _analysis_child(root: str, run: str, limit_bytes: int, out: "multiprocessing.Queue") -> None:
    import resource

    from runwatch.detectors.analysis import analyze

    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))  # a MemoryError here, not the OOM killer
    try:
        with Store(root) as store:
            t0 = time.perf_counter()
            analyze(store.rows(run, rank=0), store.events(run), now=None)
            out.put(("ok", time.perf_counter() - t0))
    except MemoryError:
        out.put(("out of memory", limit_bytes))


def analysis(root: Path, run: str, limit_gb: float) -> str:
    """The detectors over every row, in a child process with an address-space cap."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_analysis_child, args=(str(root), run, int(limit_gb * 2**30), out))
    child.start()
    child.join()
    if out.empty():
        return f"crashed (exit code {child.exitcode})"
    status, value = out.get()
    return f"{value:.2f} s" if status == "ok" else f"failed: MemoryError under a {limit_gb:g} GiB cap"


def overview_refresh(root: Path) -> dict:
    """One overview tick: the runs table, and the per-run change signatures that decide what to recompute."""
    with Store(root) as store:
        t0 = time.perf_counter()
        runs = store.runs().to_pylist()
        t1 = time.perf_counter()
        for r in runs:
            state.signature(str(root), r["run"])
        t2 = time.perf_counter()
    return {"runs_query_s": t1 - t0, "signatures_s": t2 - t1, "num_runs": len(runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--root", help="work directory (default: a temporary one, removed after)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-analysis", action="store_true", help="do not time the detectors")
    parser.add_argument("--analysis-memory-gb", type=float, default=8.0,
                        help="address-space cap for the detectors' process (default 8)")
    args = parser.parse_args()
    base = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="runwatch-bench-"))
    root = base / "one"
    try:
        t0 = time.perf_counter()
        marks = synthetic_run(root, "big", args.steps)
        print(f"wrote {args.steps:,} steps in {len(data_files(root, 'big'))} parts in {time.perf_counter() - t0:.1f} s")
        rows = []
        for label, kw in (("run page, full range, x=step", {}), ("run page, full range, x=tokens", {"x": "tokens"}),
                          ("zoom re-query: 1% of the steps", {"lo": marks["spike_at"] - args.steps // 200,
                                                             "hi": marks["spike_at"] + args.steps // 200})):
            _, out = timed(lambda: run_page(root, "big", **kw), 1)  # warm the OS file cache once
            med, out = timed(lambda: run_page(root, "big", **kw), args.repeat)
            rows.append((label, out))
        print("\n| run page (1 run of %s steps) | query | figure | to JSON | total | points drawn | JSON size | spike kept | NaN marked |" % f"{args.steps:,}")
        print("|---|---|---|---|---|---|---|---|---|")
        for label, o in rows:
            print(f"| {label} | {o['query_s']:.2f} s | {o['figure_s']:.2f} s | {o['json_s']:.2f} s | **{o['total_s']:.2f} s** | "
                  f"{o['points']:,} | {o['json_bytes'] / 1e6:.1f} MB | {'yes' if o['loss_max'] >= 40 else 'NO'} "
                  f"({o['loss_max']:.1f}) | {o['nan_marks']} |")
        if not args.skip_analysis:
            result = analysis(root, "big", args.analysis_memory_gb)
            print(f"\ndetectors (analyze) over all {args.steps:,} rows: {result} "
                  "(once per change of the run's files; cached between refreshes)")
        many = base / "ten"
        for i in range(10):
            shutil.copytree(root / "run=big", many / f"run=big-{i}")
        med, ov = timed(lambda: overview_refresh(many), args.repeat)
        _, page = timed(lambda: run_page(many, "big-3"), args.repeat)
        print(f"\n| root of 10 runs x {args.steps:,} steps | seconds |\n|---|---|")
        print(f"| overview refresh: runs table (DuckDB over all files) | {ov['runs_query_s']:.2f} |")
        print(f"| overview refresh: change signatures of 10 runs (stat only) | {ov['signatures_s']:.3f} |")
        print(f"| run page of one of the 10 runs | {page['total_s']:.2f} |")
        print(f"\nspike at step {marks['spike_at']:,}, NaN at step {marks['nan_at']:,}")
    finally:
        if not args.root:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
