"""Fault injection: kill -9 import, ``--replace``, ``compact`` and a training process at random points.

Run: ``.venv/bin/python bench/fault_injection.py [--kills 50] [--only import,replace,compact,train]``.

Each trial starts a real process (this file with ``--child OP``), waits until
it says the operation begins, sleeps a random time drawn from the operation's
measured duration, and sends SIGKILL. Then the store is read twice, by
runwatch's ``Store`` and by plain DuckDB (``read_parquet('ROOT/**/*.parquet',
hive_partitioning=1)``), and compared with what may be there:

* import of a new run: no run, or the whole run;
* ``--replace``: exactly the old run or exactly the new one;
* ``compact``: the same rows as before;
* training with ``Monitor``: steps 0..k-1 with no gap, where k is at most the
  last step the trainer printed + 1, short by at most the documented window
  (the unflushed buffer plus one flush on its way to the disk).

Rows duplicated and rows lost are counted against that; then the next writer
runs (``compact`` of the run, which recovers first) and the check is repeated,
and nothing may be left in staging.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

FLUSH_EVERY = 10
IMPORT_LINES = 60_000


# -- the child: one operation, announced --------------------------------------------------------------------


def _child(op: str, root: str, log: str) -> None:
    from runwatch.collectors.importers import import_logs
    from runwatch.data.compact import compact

    if op == "train":
        _train(root)
        return
    print("BEGIN", flush=True)
    if op == "import":
        import_logs("jsonl", [log], root, "r")
    elif op == "replace":
        import_logs("jsonl", [log], root, "r", replace=True)
    elif op == "compact":
        compact(root, "r")
    print("DONE", flush=True)


def _train(root: str) -> None:
    import torch

    from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
    from runwatch.collectors.monitor import Monitor, MonitorConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = TinyGPTConfig(d_model=16, num_layers=1)
    model = TinyGPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = synthetic_batches(cfg, batch_size=2, seed=0)
    mon = Monitor(root, "r", model=model, config=MonitorConfig(flush_every_steps=FLUSH_EVERY,
                                                               flush_every_seconds=3600))
    print("BEGIN", flush=True)
    for step in range(100_000):
        loss, grad_norm = train_step(model, optimizer, next(batches))
        mon.step(step, loss=loss, grad_norm=grad_norm)
        print(f"step {step} written {mon.num_written_rows}", flush=True)  # what the writer has made durable
        if step % 50 == 49:
            mon.checkpoint(step, f"ckpt/{step}.pt", bytes=1)


# -- the parent ---------------------------------------------------------------------------------------------


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "runwatch.app.cli", *args], check=True, capture_output=True, timeout=300)


def _rows(root: Path) -> list[tuple]:
    """(segment, rank, step, loss) by runwatch, and the same by plain DuckDB; they must agree."""
    from runwatch.data.store import Store

    with duckdb.connect() as con:
        plain = sorted(con.sql(f"SELECT segment, rank, step, loss FROM read_parquet('{root}/**/*.parquet', "
                               "hive_partitioning=1, union_by_name=1) WHERE run = 'r'").fetchall()) \
            if list(root.glob("**/*.parquet")) else []
    with Store(root) as store:
        mine = sorted(tuple(r[c] for c in ("segment", "rank", "step", "loss"))
                      for r in store.rows("r", rank=None).to_pylist()) if store.has_run("r") else []
    if mine != plain:
        raise AssertionError(f"runwatch and plain DuckDB disagree: {len(mine)} vs {len(plain)} rows")
    return mine


def _log(path: Path, steps: range, loss: float) -> Path:
    with open(path, "w") as f:
        for s in steps:
            f.write(f'{{"step": {s}, "loss": {loss}, "grad_norm": 0.5, "tokens": {s * 4096}}}\n')
            if s % 1000 == 999:
                f.write(f'{{"event": "checkpoint", "step": {s}, "path": "c/{s}"}}\n')
    return path


def _parts(root: Path, partitions: int = 12, parts: int = 8, per: int = 500) -> None:
    from runwatch.data.record import metrics_table
    from runwatch.data.storage import StagedWrite

    for seg in range(partitions):
        for i in range(parts):
            lo = seg * parts * per + i * per
            with StagedWrite(root) as staged:
                staged.add_metrics("r", seg, 0, metrics_table([{"step": s, "loss": 1.0} for s in range(lo, lo + per)]))


def _staging_left(root: Path) -> int:
    areas = [root.parent / f".{root.name}.runwatch-staging", root / ".runwatch-staging"]
    return sum(len(list(a.iterdir())) for a in areas if a.exists())


def _diff(rows: list[tuple], expected: list[tuple]) -> tuple[int, int]:
    """(rows duplicated or foreign, rows lost) of ``rows`` against ``expected``, as multisets."""
    got, want = collections.Counter(rows), collections.Counter(expected)
    return sum((got - want).values()), sum((want - got).values())


class Trial:
    def __init__(self, op: str, work: Path, logs: dict[str, Path], rng: random.Random, duration: float) -> None:
        self.op, self.work, self.logs, self.rng, self.duration = op, work, logs, rng, duration
        self.root = work / "root"

    def prepare(self) -> list[list[tuple]]:
        """Set the store up; return the states the store may be in after the kill."""
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.work / ".root.runwatch-staging", ignore_errors=True)
        self.root.mkdir()
        new = [(0, 0, s, 2.0) for s in range(IMPORT_LINES)]
        if self.op == "import":
            return [[], new]
        if self.op == "replace":
            _cli("import", "jsonl", str(self.logs["old"]), "--root", str(self.root), "--run", "r")
            return [[(0, 0, s, 1.0) for s in range(IMPORT_LINES // 2)], new]
        if self.op == "compact":
            _parts(self.root)
            return [_rows(self.root)]
        return []

    def run(self) -> dict:
        allowed = self.prepare()
        proc = subprocess.Popen([sys.executable, __file__, "--child", self.op, str(self.root), str(self.logs["new"])],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.stdout.readline().strip() == "BEGIN"
        time.sleep(self.rng.uniform(0, self.duration))
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait()
        finished = "DONE" in rest
        staged_at_kill = _staging_left(self.root) > 0  # the kill landed while a new tree was staged
        rows = _rows(self.root)
        if self.op == "train":
            printed = [line.split() for line in rest.splitlines() if line.startswith("step ")]
            done = int(printed[-1][1]) + 1 if printed else 0
            written = int(printed[-1][3]) if printed else 0
            # Rows are steps 0..k-1 in segment 0, each once: anything else is duplicated or out of place.
            duplicated, gaps = _diff(rows, [(0, 0, s, r[3]) for s, r in zip(range(len(rows)), rows)])
            lost = max(0, done - len(rows))
            unflushed = done % FLUSH_EVERY  # flushes happen every FLUSH_EVERY steps (checkpoints fall on them)
            outcome = {"duplicated": duplicated + gaps, "lost": lost, "steps_done": done,
                       "lost_written": max(0, written - len(rows)),  # reported written, then gone: never allowed
                       "flushes_pending": (lost - unflushed) // FLUSH_EVERY,
                       "lost_beyond_window": max(0, lost - unflushed - FLUSH_EVERY)}
        else:
            best = min(allowed, key=lambda state: sum(_diff(rows, state)))
            duplicated, lost = _diff(rows, best)
            outcome = {"duplicated": duplicated, "lost": lost, "state": allowed.index(best), "finished": finished,
                       "staged_at_kill": staged_at_kill}
        if self.root.joinpath("run=r").exists() or _staging_left(self.root):
            _cli("compact", "--root", str(self.root))  # the next writer: recovers every run, then compacts
        after = _rows(self.root)
        if self.op != "train" and after != rows and sum(_diff(after, best)):
            raise AssertionError(f"the next writer left {len(after)} rows, not a state that may be there")
        outcome["staging_left"] = _staging_left(self.root)
        return outcome


def _calibrate(op: str, work: Path, logs: dict[str, Path]) -> float:
    """Seconds the operation takes (from BEGIN to DONE), so kills are drawn across all of it."""
    if op == "train":
        return 6.0
    trial = Trial(op, work, logs, random.Random(0), 0)
    trial.prepare()
    proc = subprocess.Popen([sys.executable, __file__, "--child", op, str(trial.root),
                             str(logs["new"])], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    t0 = time.perf_counter()
    proc.stdout.read()
    proc.wait()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--only", default="import,replace,compact,train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", nargs=3, metavar=("OP", "ROOT", "LOG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    rng = random.Random(args.seed)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| operation | kills | killed before the end | of which with a tree staged | outcome (old / new state) "
          "| rows duplicated | rows lost | lost beyond the one-flush window | staging left after the next writer |\n"
          "|---|---:|---:|---:|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        logs = {"old": _log(work / "old.jsonl", range(IMPORT_LINES // 2), 1.0),
                "new": _log(work / "new.jsonl", range(IMPORT_LINES), 2.0)}
        for op in args.only.split(","):
            duration = _calibrate(op, work, logs)
            outcomes = [Trial(op, work, logs, rng, duration * 1.1).run() for _ in range(args.kills)]
            _report(op, outcomes, duration)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def _report(op: str, outcomes: list[dict], duration: float) -> None:
    dup = sum(o["duplicated"] for o in outcomes)
    lost = sum(o["lost"] for o in outcomes)
    left = sum(o["staging_left"] for o in outcomes)
    if op == "train":
        beyond = sum(o["lost_beyond_window"] for o in outcomes)
        pending = collections.Counter(o["flushes_pending"] for o in outcomes)
        state = (f"median {sorted(o['steps_done'] for o in outcomes)[len(outcomes) // 2]} steps; flushes not yet "
                 "written at the kill: " + ", ".join(f"{k}: {pending[k]}x" for k in sorted(pending)))
        early, staged = len(outcomes), "-"
        lost_text = (f"{lost} (none of them reported written: {sum(o['lost_written'] for o in outcomes)} "
                     "written rows lost)")
    else:
        beyond = lost
        states = collections.Counter(o["state"] for o in outcomes)
        state = f"{states.get(0, 0)} / {states.get(1, 0)}" if op != "compact" else f"{states.get(0, 0)} unchanged"
        early = sum(not o["finished"] for o in outcomes)
        staged = sum(o["staged_at_kill"] for o in outcomes)
        lost_text = str(lost)
    print(f"| {op} ({duration:.2f} s) | {len(outcomes)} | {early} | {staged} | {state} | {dup} | {lost_text} | {beyond} "
          f"| {left} |")


if __name__ == "__main__":
    main()
