"""Idle overview cost: server CPU while one real Chromium tab sits on the overview of 300 runs.

Generates a root of N runs (most archived imports, some finished Monitor runs,
some live runs that went silent and some that are still flushing), serves it
with ``runwatch dashboard`` from each interpreter given (e.g. a checkout of
main and this one), opens the overview in headless Debian Chromium, waits
until every run is analysed and a warm-up has passed, then samples the CPU
time (user + system) of the server's process tree over a window. Interpreters
take turns, round by round, on the same root; the report quotes the median
share of one core per interpreter and the ratio.

    .venv/bin/python bench/idle_overview_cpu.py --python /work/main/.venv/bin/python --python .venv/bin/python
    .venv/bin/python bench/idle_overview_cpu.py --runs 300 --seconds 60 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa

from runwatch.data.storage import StagedWrite

CHROMIUM = "/usr/bin/chromium"
TICK = os.sysconf("SC_CLK_TCK")


def _run_table(rng: np.random.Generator, num_steps: int, t_end: float, step_seconds: float) -> pa.Table:
    steps = np.arange(num_steps, dtype=np.int64)
    loss = 2.0 + 3.0 * np.exp(-steps / (num_steps / 5)) + 0.02 * rng.standard_normal(num_steps)
    return pa.table({
        "step": steps, "time": t_end - step_seconds * (num_steps - 1 - steps) + 0.01 * rng.random(num_steps),
        "tokens": (steps + 1) * 4096, "samples": (steps + 1) * 8, "loss": loss,
        "grad_norm": np.abs(1.0 + 0.1 * rng.standard_normal(num_steps)), "loss_scale": np.full(num_steps, 65536.0),
        "act_norm": 10.0 + 0.001 * steps, "lr": np.full(num_steps, 3e-4),
    })


def kind_of(i: int, num_runs: int, num_flushing: int) -> str:
    """80% archived imports, 10% finished Monitor runs, the rest live: silent (they turn stalled) or flushing."""
    if i >= num_runs - num_flushing:
        return "flushing"
    share = i / num_runs
    return "import" if share < 0.8 else "finished" if share < 0.9 else "silent"


def generate(root: Path, num_runs: int, num_steps: int, num_flushing: int) -> list[str]:
    """Write the runs; returns the names of those a background writer keeps flushing."""
    rng = np.random.default_rng(0)
    now, flushing = time.time(), []
    for i in range(num_runs):
        run, kind = f"run-{i:03d}", kind_of(i, num_runs, num_flushing)
        t_end = now - (86400 * 30 * rng.random() if kind in ("import", "finished") else 60.0 if kind == "silent" else 1.0)
        table = _run_table(rng, num_steps, t_end, step_seconds=0.5)
        with StagedWrite(root) as staged:
            for part in np.array_split(np.arange(num_steps), 4):
                staged.add_metrics(run, 0, 0, table.take(pa.array(part)))
            staged.add_events(run, 0, 0, [{"event": "checkpoint", "step": int(s), "time": float(table["time"][s].as_py()),
                                           "path": f"ckpt/{run}/{s}.pt"} for s in range(0, num_steps, 1000)])
            meta = {"source": "import:jsonl"} if kind == "import" else {"precision": "bf16"}
            staged.add_run_meta(run, meta)
            if kind == "finished":
                staged.add_events(run, 0, 0, [{"event": "note", "step": num_steps - 1, "time": t_end, "status": "finished"}])
        if kind == "flushing":
            flushing.append(run)
    return flushing


def keep_flushing(root: Path, runs: list[str], num_steps: int, stop: threading.Event, every_s: float = 10.0) -> None:
    """A live trainer's writer: a 20-row flush into each flushing run every ``every_s`` seconds."""
    rng, step = np.random.default_rng(1), num_steps
    while not stop.wait(every_s):
        for run in runs:
            table = _run_table(rng, 20, time.time(), 0.5)
            table = table.set_column(0, "step", pa.array(np.arange(step, step + 20, dtype=np.int64)))
            with StagedWrite(root) as staged:
                staged.add_metrics(run, 0, 0, table)
        step += 20


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its descendants (from /proc)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / TICK
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(times.get(p, 0.0) for p in tree)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(python: str, root: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([python, "-m", "runwatch.app.cli", "dashboard", "--root", str(root), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(480):
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{python}: the dashboard exited with {proc.returncode}")
            time.sleep(0.25)
    proc.terminate()
    raise RuntimeError(f"{python}: the dashboard did not come up in 120 s")


def measure(python: str, root: Path, seconds: float, warmup: float, browser,
            first_limit: float = 300.0) -> tuple[float, float | None]:
    """Share of one core the server's process tree used while the overview tab was idle, and how long the
    first analysis of every run took (None: it had not finished after ``first_limit`` seconds)."""
    proc, url = start_server(python, root)
    context = browser.new_context(viewport={"width": 1400, "height": 1200})
    try:
        tab = context.new_page()
        t_open = time.monotonic()
        tab.goto(url)
        tab.wait_for_selector('[data-testid="stDataFrame"]', timeout=300_000)
        first: float | None = None
        while time.monotonic() - t_open < first_limit:
            if "Analysing" not in str(tab.locator('[data-testid="stCaptionContainer"]').all_inner_texts()):
                first = time.monotonic() - t_open
                break
            time.sleep(1.0)
        time.sleep(warmup)
        cpu0, t0 = tree_cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = tree_cpu_seconds(proc.pid), time.monotonic()
        if tab.locator(".stException").count():
            raise RuntimeError("the overview shows an exception")
        return (cpu1 - cpu0) / (t1 - t0), first
    finally:
        context.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


def code_of(python: str) -> str:
    """Where that interpreter's runwatch.app comes from (which checkout is being measured)."""
    out = subprocess.run([python, "-c", "import runwatch.app as a; print(list(a.__path__)[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    head = subprocess.run(["git", "-C", out, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", out, "status", "--porcelain", "--", "."], capture_output=True, text=True).stdout
    return f"{out} @ {head}{' (+ uncommitted changes)' if dirty.strip() else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", action="append", help="interpreter whose runwatch serves (repeatable; default: this one)")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=5000, help="steps per run")
    parser.add_argument("--flushing", type=int, default=3, help="live runs a writer flushes into every 10 s")
    parser.add_argument("--seconds", type=float, default=60.0, help="sampling window per measurement")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds after the first analysis before sampling")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--root", type=Path, help="reuse or create the generated root here")
    args = parser.parse_args()
    pythons = args.python or [sys.executable]
    root = args.root or Path(tempfile.mkdtemp(prefix="idle-overview-"))
    if not any(root.glob("run=*")):
        t0 = time.perf_counter()
        flushing = generate(root, args.runs, args.steps, args.flushing)
        print(f"generated {args.runs} runs x {args.steps} steps under {root} in {time.perf_counter() - t0:.0f} s")
    else:
        flushing = [f"run-{i:03d}" for i in range(args.runs) if kind_of(i, args.runs, args.flushing) == "flushing"]
    stop = threading.Event()
    writer = threading.Thread(target=keep_flushing, args=(root, flushing, args.steps, stop), daemon=True)
    writer.start()
    from playwright.sync_api import sync_playwright

    results: dict[str, list[float]] = {p: [] for p in pythons}
    firsts: dict[str, list[float | None]] = {p: [] for p in pythons}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            for r in range(args.rounds):
                for python in (pythons if r % 2 == 0 else pythons[::-1]):
                    share, first = measure(python, root, args.seconds, args.warmup, browser)
                    results[python].append(share)
                    firsts[python].append(first)
                    print(f"round {r + 1}: {python}: {100 * share:.1f}% of a core; first analysis "
                          + ("not done after 300 s" if first is None else f"done after {first:.0f} s"), flush=True)
        finally:
            browser.close()
            stop.set()
    print(f"\n{args.runs} runs ({len(flushing)} flushing every 10 s), idle overview tab, {args.seconds:.0f} s windows:")
    print("| server | median % of one core | rounds | first analysis of every run |\n|---|---:|---|---|")
    medians = {}
    for python in pythons:
        medians[python] = statistics.median(results[python])
        done = ", ".join("not done after 300 s" if f is None else f"{f:.0f} s" for f in firsts[python])
        print(f"| {code_of(python)} | {100 * medians[python]:.1f}% | "
              + ", ".join(f"{100 * s:.1f}%" for s in results[python]) + f" | {done} |")
    if len(pythons) == 2 and medians[pythons[1]] > 0:
        print(f"ratio (first / second): {medians[pythons[0]] / medians[pythons[1]]:.1f}x")


if __name__ == "__main__":
    main()
