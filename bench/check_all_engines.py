"""``runwatch check --all`` over a fleet of runs: the local process pool vs Spark in local mode, same machine.

Makes ``--runs`` runs of ``--steps`` steps each (one Parquet part and a few
checkpoint events per run; one run in ten has a loss spike, one in ten a
divergence), then times ``runwatch check --all --json`` end to end as a user
runs it (a fresh process each time: imports, Spark's JVM start-up included),
alternating the engines for ``--repeat`` rounds, and checks that both return
the same findings for every run.

    .venv/bin/python bench/check_all_engines.py --runs 1000 --steps 2000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_fleet(root: Path, num_runs: int, num_steps: int) -> None:
    from runwatch.data.record import metrics_table
    from runwatch.data.storage import StagedWrite

    rng = np.random.default_rng(0)
    for i in range(num_runs):
        steps = np.arange(num_steps)
        loss = 2.0 + 3.0 * np.exp(-steps / (num_steps / 5)) + rng.normal(0, 0.02, num_steps)
        grad = 1.0 + rng.normal(0, 0.05, num_steps)
        if i % 10 == 3:
            loss[num_steps // 2] += 20.0
            grad[num_steps // 2] *= 30.0
        if i % 10 == 7:
            loss[num_steps // 2:] += np.linspace(0, 5, num_steps - num_steps // 2)
        rows = [{"step": int(s), "time": 1.7e9 + float(s), "tokens": int(s + 1) * 4096, "loss": float(loss[s]),
                 "grad_norm": float(grad[s]), "lr": 3e-4} for s in steps]
        run = f"run-{i:04d}"
        with StagedWrite(root) as staged:
            staged.add_metrics(run, 0, 0, metrics_table(rows))
            staged.add_events(run, 0, 0, [{"event": "checkpoint", "step": int(s), "path": f"ck/{run}/{s}.pt"}
                                          for s in range(num_steps // 4 - 1, num_steps, num_steps // 4)])
            staged.add_run_meta(run, {"source": "import:bench"})


def time_check(root: Path, engine: str, extra: list[str]) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "runwatch.app.cli", "check", "--all", "--root", str(root), "--json",
           "--engine", engine, *extra]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - t0
    if out.returncode not in (0, 1):
        raise SystemExit(f"{engine} failed: {out.stderr[-2000:]}")
    return seconds, json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--root", help="reuse (or make) the fleet here instead of a temporary directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.root) if args.root else Path(tmp) / "fleet"
        if not root.exists():
            t0 = time.perf_counter()
            make_fleet(root, args.runs, args.steps)
            print(f"made {args.runs} runs x {args.steps} steps in {time.perf_counter() - t0:.1f} s", flush=True)
        engines = {"local": ["--workers", str(args.workers)], "spark": ["--master", f"local[{args.workers}]"]}
        seconds: dict[str, list[float]] = {e: [] for e in engines}
        results: dict[str, list[dict]] = {}
        for r in range(args.repeat):
            for engine in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
                s, results[engine] = time_check(root, engine, engines[engine])
                seconds[engine].append(s)
                print(f"round {r}: {engine} {s:.1f} s", flush=True)
        same = all(a == b for a, b in zip(results["local"], results["spark"])) \
            and len(results["local"]) == len(results["spark"]) == args.runs
        needs = sum(r.get("health") == "action needed" for r in results["local"])
        print(f"\n{args.runs} runs x {args.steps} steps ({args.runs * args.steps:,} rows), {args.workers} workers, "
              f"load average {os.getloadavg()[0]:.1f}; both engines gave the same findings for every run: {same}; "
              f"{needs} runs need action")
        print("| engine | median s | runs/s | vs local | rounds (s) |\n|---|---:|---:|---:|---|")
        base = statistics.median(seconds["local"])
        for engine, times in seconds.items():
            med = statistics.median(times)
            print(f"| {engine} | {med:.1f} | {args.runs / med:.1f} | {med / base:.2f}x | "
                  f"{', '.join(f'{t:.1f}' for t in times)} |")
        if not math.isfinite(base) or not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
