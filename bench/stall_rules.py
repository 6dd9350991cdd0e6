"""The live stall rule: runwatch's (README) against nvidia-resiliency-ext's, on the same simulated days of training.

runwatch: silent for more than max(10 x the expected wait, 300 s), plus the
longest pause the run has logged so far (checkpoint ``write_seconds``,
evaluation ``seconds``); silence counts from the newest row the watcher has
(rows land in flushes every 10 s). nvidia-resiliency-ext (fault tolerance,
``TimeoutsCalc``): a heartbeat per training step (none during a checkpoint
save), timeout = 5 x the longest interval between heartbeats measured, in
two ways: updated at every heartbeat from the start (45 min before two were
seen), and as its docs and Lightning callback use it, the 45-minute default
until timeouts are calculated after the first checkpoint save, then
recalculated at each save.

Each simulated run is a day of training whose per-step times are blocks
resampled from a real log (modded-nanogpt 1.5B: 1.7 s steps; Megatron-LM
GPT-3 15B golden values on H100: 1.4 s per step with a 4x slow stretch),
plus what a pre-training job does besides steps: a checkpoint every 1000
steps (lognormal, median 90 s, logged with its write time once done), an
evaluation every 500 steps (median 45 s, logged with its duration) and
unlogged hiccups (a filesystem stall: 2 a day, median 40 s, up to ~5 min).
Healthy days count false alarms; a hang injected at a random moment of each
day gives the detection delay (the threshold in force then).

    .venv/bin/python bench/stall_rules.py [--runs 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from runwatch.collectors.importers import import_logs
from runwatch.data.store import Store
from runwatch.detectors.config import StallConfig
from runwatch.detectors.stall import expected_wait, is_live_stall

REALRUNS = Path(__file__).resolve().parents[2] / "shared" / "realruns"
SOURCES = {"modded-nanogpt 1.5B": ("modded-nanogpt", REALRUNS / "modded-nanogpt-1p5b" / "raw.log"),
           "Megatron GPT-3 15B (H100)": ("megatron-golden", REALRUNS / "megatron-lm-gpt3-15b-8t" / "raw_dgx_h100.json")}
DAY = 86400.0
FLUSH_S = 10.0
NVRX_FACTOR, NVRX_INITIAL = 5.0, 45 * 60.0


def real_step_times(fmt: str, path: Path) -> np.ndarray:
    with tempfile.TemporaryDirectory() as root:
        import_logs(fmt, [path], root, "r")
        with Store(root) as store:
            rows = store.rows("r")
    st = rows["step_time"].to_numpy(zero_copy_only=False).astype(float)
    return st[np.isfinite(st) & (st > 0)]


def simulate_day(base: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One day: each step's end time, the pause logged after it (0: none), and whether a pause is unlogged."""
    blocks = []
    total = 0.0
    while total < DAY:
        start = rng.integers(0, max(len(base) - 64, 1))
        block = base[start:start + 64]
        blocks.append(block)
        total += block.sum()
    step_s = np.concatenate(blocks)
    n = len(step_s)
    extra = np.zeros(n)
    logged = np.zeros(n)
    steps = np.arange(1, n + 1)
    ckpt = steps % 1000 == 0
    extra[ckpt] = logged[ckpt] = rng.lognormal(np.log(90.0), 0.5, ckpt.sum())
    evals = (steps % 500 == 0) & ~ckpt
    extra[evals] = logged[evals] = rng.lognormal(np.log(45.0), 0.4, evals.sum())
    hiccups = rng.choice(n, rng.poisson(2), replace=False)
    extra[hiccups] += np.minimum(rng.lognormal(np.log(40.0), 0.8, len(hiccups)), 300.0)
    ends = np.cumsum(step_s + extra)  # a pause delays the next step's end
    keep = ends < DAY
    return ends[keep], logged[keep], (extra - logged)[keep] > 0


def runwatch_thresholds(ends: np.ndarray, logged: np.ndarray, cfg: StallConfig,
                        allow_pauses: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """At each step: runwatch's threshold, and the silence the watcher sees before the next row lands."""
    per_step = np.diff(ends, prepend=ends[0] - (ends[1] - ends[0]))
    # The median of the last 64 intervals (as ``stall.expected_wait``), at every step at once.
    padded = np.concatenate([np.full(63, per_step[0]), per_step])
    expected = np.median(np.lib.stride_tricks.sliding_window_view(padded, 64), axis=1)
    longest = np.maximum.accumulate(logged) if allow_pauses else np.zeros(len(ends))
    thresholds = np.maximum(cfg.ratio * expected, cfg.live_min_seconds) + longest
    # The next row reaches the store at the flush after its step (every 10 s or at once after a pause).
    silence = np.diff(ends, append=np.inf) + FLUSH_S
    return thresholds, silence


def nvrx_thresholds(ends: np.ndarray, ckpt_steps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """At each step: nvidia-resiliency-ext's timeout (5 x the longest interval measured) and the next interval.
    ``ckpt_steps``: timeouts set only at these steps (45 min before the first); None: at every heartbeat."""
    gaps = np.diff(ends, prepend=0.0)
    longest = np.maximum.accumulate(gaps)
    timeout = np.where(np.arange(len(ends)) >= 2, NVRX_FACTOR * longest, NVRX_INITIAL)
    if ckpt_steps is not None:
        # The timeout in force at step i: the one calculated at the latest checkpoint at or before i.
        set_at = np.full(len(ends), -1)
        set_at[ckpt_steps[ckpt_steps < len(ends)]] = ckpt_steps[ckpt_steps < len(ends)]
        set_at = np.maximum.accumulate(set_at)
        timeout = np.where(set_at >= 0, NVRX_FACTOR * longest[np.maximum(set_at, 0)], NVRX_INITIAL)
    return timeout, np.diff(ends, append=np.inf)


def check_against_detector(ends: np.ndarray, logged: np.ndarray, cfg: StallConfig, threshold: np.ndarray,
                           rng: np.random.Generator) -> None:
    """The vectorised rule above is the detector's own (``expected_wait``, ``is_live_stall``): spot-checked."""
    steps = np.arange(1, len(ends) + 1)
    for i in rng.integers(100, len(ends) - 1, 5):
        expected = expected_wait(steps[:i + 1], ends[:i + 1])
        allowance = float(logged[:i + 1].max())
        for silence, fires in ((float(threshold[i]) * 0.999, False), (float(threshold[i]) * 1.001, True)):
            assert is_live_stall(silence, expected, cfg, allowance) is fires, (int(i), silence, expected, allowance)


def judge(threshold: np.ndarray, silence: np.ndarray, hang: int) -> tuple[int, float]:
    """(false alarms on the healthy day, detection delay of a hang after step ``hang``)."""
    return int(np.sum(silence[:-1] > threshold[:-1])), float(threshold[hang])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=200, help="simulated days per source")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = StallConfig()
    print("| step times from | rule | false alarms per run-day | runs with any | hang found after: median | p90 |")
    print("|---|---|---:|---:|---:|---:|")
    for name, (fmt, path) in SOURCES.items():
        base = real_step_times(fmt, path)
        rng = np.random.default_rng(args.seed)
        rules = ("runwatch (README)", "runwatch without the logged-pause allowance",
                 "nvidia-resiliency-ext, 5x longest, updated every step",
                 "nvidia-resiliency-ext, 5x longest, set at each checkpoint (45 min before)")
        results: dict[str, list[tuple[int, float]]] = {rule: [] for rule in rules}
        for run in range(args.runs):
            ends, logged, _ = simulate_day(base, rng)
            hang = int(rng.integers(len(ends) // 10, len(ends) - 1))  # the same moment for every rule
            ckpt_steps = np.flatnonzero((np.arange(1, len(ends) + 1) % 1000) == 0)
            ours = runwatch_thresholds(ends, logged, cfg)
            if run < 3:
                check_against_detector(ends, logged, cfg, ours[0], rng)
            judged = (ours, runwatch_thresholds(ends, logged, cfg, allow_pauses=False), nvrx_thresholds(ends),
                      nvrx_thresholds(ends, ckpt_steps))
            for rule, (threshold, silence) in zip(rules, judged):
                results[rule].append(judge(threshold, silence, hang))
        for rule, res in results.items():
            fa = np.array([r[0] for r in res])
            delay = np.array([r[1] for r in res]) / 60
            print(f"| {name} | {rule} | {fa.mean():.2f} | {np.mean(fa > 0):.0%} | {np.median(delay):.1f} min | "
                  f"{np.quantile(delay, 0.9):.1f} min |")

if __name__ == "__main__":
    main()
