"""``runwatch watch`` following many live runs: alert latency (file landed -> webhook received) and CPU cost.

A writer thread plays ``--runs`` live runs (``--ranks`` each): every run
flushes a metrics part every ``--flush-every`` seconds per rank (rows at
``--steps-per-s``, written as Monitor's writer does: Parquet under a
temporary name, renamed into place) and rewrites each rank's heartbeat
every 10 s. Each run starts with ``--history`` steps already on disk. At a
random moment each run's next flush carries a NaN loss on one rank; the
moment that file was renamed into place is when it landed. The real
``runwatch watch`` CLI runs as a subprocess, its messages going through
apprise's ``json://`` to a local HTTP server here; latency is the server's
arrival time minus the landing time. The watch's CPU is read from
/proc/<pid>/stat over the measured window.

The anchor, in the same run: ``runwatch watch --once`` (judge_run over every
live run, the cron way) on the same root afterwards: its CPU per pass, and
the latency a cron job every minute would give (a finding waits for the next
pass: half a minute on average).

    .venv/bin/python bench/watch_latency.py [--runs 100] [--ranks 1] [--seconds 240]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow as pa

from runwatch.data.storage import (
    HEARTBEAT,
    StagedWrite,
    merge_run_meta,
    part_name,
    partition_dir,
    write_bytes_atomic,
    write_parquet_atomic,
)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Receiver:
    """A local webhook: when each message arrived, by title."""

    def __init__(self) -> None:
        self.received: list[tuple[float, str]] = []
        lock, received = threading.Lock(), self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with lock:
                    received.append((time.time(), body["title"]))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server.server_address[1]}/hook"


def rows(first: int, count: int, t0: float, step_s: float, rng: np.random.Generator, nan_at: int | None) -> pa.Table:
    steps = np.arange(first, first + count, dtype=np.int64)
    loss = 2.0 + 3.0 * np.exp(-steps / 3000.0) + 0.02 * rng.standard_normal(count)
    if nan_at is not None:
        loss[nan_at - first:] = np.nan
    return pa.table({"step": steps, "time": t0 + steps * step_s + 0.001 * rng.random(count), "loss": loss,
                     "grad_norm": np.exp(rng.normal(np.log(0.4), 0.1, count)), "lr": np.full(count, 3e-4),
                     "forward_time": np.exp(rng.normal(np.log(0.02), 0.05, count)),
                     "data_time": np.exp(rng.normal(np.log(0.001), 0.2, count))})


class Fleet:
    """The live runs: their history, then flushes and heartbeats on schedule, and one NaN each."""

    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        self.root, self.args = root, args
        self.rng = np.random.default_rng(0)
        self.step_s = 1.0 / args.steps_per_s
        self.t0 = time.time() - args.history * self.step_s
        self.next_step = {}
        self.landed: dict[str, float] = {}  # run -> when its NaN file was renamed into place
        self.fault_at = {f"run{i:03d}": time.time() + 15 + random.Random(i).random() * (args.seconds - 45)
                         for i in range(args.runs)}
        self.files = 0
        for run in self.fault_at:
            with StagedWrite(root) as staged:
                for rank in range(args.ranks):
                    staged.add_metrics(run, 0, rank, rows(0, args.history, self.t0, self.step_s, self.rng, None))
            merge_run_meta(root, run, {"host": "node0", "finished": False, "world_size": args.ranks,
                                       "hosts": {"0": {str(r): f"node{r}" for r in range(args.ranks)}}})
            self.next_step[run] = args.history

    def flush(self, run: str, now: float) -> None:
        first = self.next_step[run]
        count = max(int((now - self.t0) / self.step_s) - first, 1)
        fault = run not in self.landed and now >= self.fault_at[run]
        for rank in range(self.args.ranks):
            poisoned = run in self.landed or fault  # the weights went NaN: every later row of that rank is NaN
            nan_at = (first + count // 2 if fault else first) if poisoned and rank == self.args.ranks - 1 else None
            table = rows(first, count, self.t0, self.step_s, self.rng, nan_at)
            write_parquet_atomic(table, partition_dir(self.root, run, 0, rank) / part_name("metrics", "parquet"))
            self.files += 1
        if fault:
            self.landed[run] = time.time()  # the faulty part is in place: the clock starts
        self.next_step[run] = first + count

    def beat(self, run: str, now: float) -> None:
        for rank in range(self.args.ranks):
            beat = {"time": now, "every_s": 10.0, "step": self.next_step[run] - 1, "phase": "step", "phase_time": now}
            write_bytes_atomic(json.dumps(beat).encode(), partition_dir(self.root, run, 0, rank) / HEARTBEAT)

    def play(self, until: float, stop: threading.Event) -> None:
        runs = sorted(self.fault_at)
        offset = {run: i * self.args.flush_every / len(runs) for i, run in enumerate(runs)}
        due = {run: time.time() + offset[run] for run in runs}
        beat_due = {run: time.time() + 10 * offset[run] / self.args.flush_every for run in runs}
        while time.time() < until and not stop.is_set():
            now = time.time()
            for run in runs:
                if now >= due[run]:
                    self.flush(run, now)
                    due[run] += self.args.flush_every
                if now >= beat_due[run]:
                    self.beat(run, now)
                    beat_due[run] += 10.0
            time.sleep(0.01)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def wait_until_idle(pid: int, limit_s: float = 120.0) -> None:
    """Until the process spends under a fifth of a core for a second (it has read what was there)."""
    start, before = time.time(), cpu_seconds(pid)
    while time.time() - start < limit_s:
        time.sleep(1.0)
        now = cpu_seconds(pid)
        if now - before < 0.2 and time.time() - start > 3:
            return
        before = now
    raise RuntimeError(f"the watch was still busy after {limit_s:.0f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--seconds", type=float, default=240.0, help="how long the runs are played")
    p.add_argument("--flush-every", type=float, default=5.0)
    p.add_argument("--steps-per-s", type=float, default=10.0)
    p.add_argument("--history", type=int, default=2000)
    p.add_argument("--root")
    args = p.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="watch-bench-"))
    receiver = Receiver()
    fleet = Fleet(root, args)
    state = root.parent / f"{root.name}-state.json"
    cmd = [sys.executable, "-m", "runwatch.app.cli", "watch", "--root", str(root), "--notify", receiver.url,
           "--state", str(state), "--interval", "5"]
    watch = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until_idle(watch.pid)  # up and has read the history of every run
    cpu0, wall0 = cpu_seconds(watch.pid), time.time()
    stop = threading.Event()
    fleet.play(time.time() + args.seconds, stop)
    time.sleep(5)
    cpu1, wall1 = cpu_seconds(watch.pid), time.time()
    watch.terminate()
    out, _ = watch.communicate(timeout=30)
    arrivals = {}
    for at, title in receiver.received:
        run = title.split(" ")[2].rstrip(":")
        if "nan" in title and run not in arrivals:
            arrivals[run] = at
    latency = sorted(arrivals[r] - fleet.landed[r] for r in fleet.landed if r in arrivals)
    missing = sorted(set(fleet.landed) - set(arrivals))
    extra = len([t for _, t in receiver.received if "nan" in t]) - len(arrivals)
    # The anchor: one cron pass over the same root.
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.time()
    once = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "watch", "--root", str(root), "--once",
                           "--state", str(root.parent / f"{root.name}-once.json")], capture_output=True, text=True)
    once_wall = time.time() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    once_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    q = np.quantile(latency, [0.5, 0.99]) if latency else [float("nan")] * 2
    print(f"runs {args.runs} x {args.ranks} rank(s), {args.seconds:.0f} s played, {fleet.files} metrics files "
          f"({fleet.files / args.seconds:.1f}/s) + heartbeats every 10 s per rank")
    print(f"alerts: {len(latency)}/{len(fleet.landed)} delivered, {len(missing)} missing, {extra} repeated")
    print(f"latency file landed -> webhook received: median {q[0]:.3f} s, p99 {q[1]:.3f} s, max "
          f"{max(latency) if latency else float('nan'):.3f} s, mean {statistics.fmean(latency) if latency else 0:.3f} s")
    print(f"watch CPU: {cpu1 - cpu0:.1f} s over {wall1 - wall0:.0f} s = {100 * (cpu1 - cpu0) / (wall1 - wall0):.1f}% "
          f"of one core ({1e3 * (cpu1 - cpu0) / max(fleet.files, 1):.1f} ms per metrics file)")
    print(f"anchor, one --once pass (cron) over the same {args.runs} runs: {once_wall:.1f} s wall, {once_cpu:.1f} s "
          f"CPU (exit {once.returncode}); a pass every 60 s costs {100 * once_cpu / 60:.1f}% of one core and answers "
          f"in ~30 s on average, up to 60 s (+ the pass)")
    if missing:
        print("missing:", missing[:10], "\nwatch output tail:", out[-2000:])


if __name__ == "__main__":
    main()
