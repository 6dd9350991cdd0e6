"""Calibrate the detectors' alarm thresholds against a false-alarm budget on long healthy runs.

    .venv/bin/python bench/calibrate.py                      # the budget check at the shipped thresholds
    .venv/bin/python bench/calibrate.py --sweep              # + the curve: threshold vs alarms per 1M vs recall
    .venv/bin/python bench/calibrate.py --steps 3000000      # healthy logged steps to simulate (default 3M)
    .venv/bin/python bench/calibrate.py --draws 10           # ten independent draws (seeds 0-9), pooled
    .venv/bin/python bench/calibrate.py --draws 3 --sweep --jobs 2   # the curve on three draws, two processes

The budget (../shared/DETECTION.md, section 4): at most one warning-or-critical
finding, all kinds together, per 10^6 logged healthy steps. With zero alarms
observed, 3 x 10^6 steps bound the rate under 1 per 10^6 (the rule of three).

Healthy series come from two places:

- every healthy real log in ../shared/realruns (llm.c 124M, modded-nanogpt
  1.5B, Megatron-LM's golden A100 run and the H100 run's loss, Megatron-DS 125M
  fp16, DeepSpeed-Chat SFT), imported with the real importers;
- long simulated runs made by the block bootstrap of those logs' residuals
  (blocks of 64 observations resampled, so heavy tails and autocorrelation
  are kept) laid on power-law loss curves with warm-ups, gradient norms with
  the real logs' log residuals, step times from a steady host (3-8% jitter)
  or a noisy one (an AR(1) wander of 20-50% lasting tens of steps, plus rare
  short hiccups), and fp16 loss scales from a real GradScaler rule (halve on
  an overflow, double after ``growth_interval`` clean steps) with overflows
  at a healthy rate; logged every 1, 10 or 100 steps.

Recall for the curve is measured on the labelled sets (bench/evalruns) with
the same thresholds, so the published trade-off is measured on both sides.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evalruns.realruns import REALRUNS, runwatch_cli  # noqa: E402

from runwatch.data.store import Store  # noqa: E402
from runwatch.detectors.analysis import analyze  # noqa: E402
from runwatch.detectors.config import DEFAULT, DetectorConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HEALTHY_LOGS = (  # (name, format, path under realruns, columns that are healthy there, residual donor)
    ("llmc-124m", "llmc", "llmc-gpt2-124m/raw.log", ("loss", "grad_norm"), True),
    ("llmc-124m-adamw", "llmc", "llmc-gpt2-124m/raw_2024-06-06_AdamW_baseline.log", ("loss", "grad_norm"), True),
    ("modded-1p5b", "modded-nanogpt", "modded-nanogpt-1p5b/raw.log", ("loss", "step_time"), True),
    ("golden-a100", "megatron-golden", "megatron-lm-gpt3-15b-8t/raw_lts_dgx_a100.json", ("loss", "step_time"), True),
    ("golden-h100-loss", "megatron-golden", "megatron-lm-gpt3-15b-8t/raw_dgx_h100.json", ("loss",), True),
    # Judged, but not residual donors: 213 rows, and a multi-epoch fine-tune whose loss steps down each epoch.
    ("msft-125m-fp16", "megatron", "msft-megatron-ds-gpt3-125m-fp16/raw.log", ("loss", "loss_scale", "lr"), False),
    ("ds-chat-sft", "deepspeed", "deepspeed-chat-opt/step1_supervised_finetuning__opt-1.3b-globalBatchSize128.log",
     ("loss", "loss_scale", "found_inf", "lr"), False),
)
DONORS = {name for name, *_, donor in HEALTHY_LOGS if donor}
"""Pre-training logs whose residuals are resampled (fine-tuning logs step down at each epoch)."""
BLOCK = 64
"""Observations per resampled residual block: long enough to keep the logs' autocorrelation."""


# -- healthy real logs --------------------------------------------------------------------------------

def import_healthy(root: Path) -> dict[str, pa.Table]:
    """The healthy real logs, imported with the real CLI, as rows of their healthy columns only."""
    out = {}
    for name, fmt, rel, cols, _ in HEALTHY_LOGS:
        path = REALRUNS / rel
        if not path.exists():
            continue
        res = runwatch_cli("import", fmt, str(path), "--root", str(root), "--run", name)
        if res.returncode != 0:
            raise RuntimeError(f"import {rel}: {res.stderr.strip()[-300:]}")
        with Store(root) as store:
            rows = store.rows(name)
        keep = ["step", "segment", "main"] + [c for c in (*cols, "time") if c in rows.column_names
                                               and (c != "time" or "step_time" in cols)]
        out[name] = rows.select(keep)
    return out


def unit_residuals(x: np.ndarray, log: bool) -> np.ndarray:
    """Residuals about a centred rolling median (33), in units of their own robust sigma."""
    x = x[np.isfinite(x) & ((x > 0) if log else True)]
    if log:
        x = np.log(x)
    if len(x) < 4 * BLOCK:
        return np.empty(0)
    pad = np.pad(x, (16, 16), mode="edge")
    med = np.median(np.lib.stride_tricks.sliding_window_view(pad, 33), axis=1)
    r = x - med
    sigma = 1.4826 * np.median(np.abs(r - np.median(r)))
    return r / sigma if sigma > 0 else np.empty(0)


def residual_pools(logs: dict[str, pa.Table]) -> dict[str, list[np.ndarray]]:
    """Unit residual series of the real logs, per signal (loss; log grad norm)."""
    pools: dict[str, list[np.ndarray]] = {"loss": [], "grad_norm": []}
    for name, rows in logs.items():
        if name not in DONORS:
            continue
        for col, log in (("loss", False), ("grad_norm", True)):
            if col in rows.column_names:
                r = unit_residuals(rows[col].to_numpy(zero_copy_only=False).astype(float), log)
                if len(r):
                    pools[col].append(r)
    return pools


def bootstrap(pool: list[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """n residuals made of BLOCK-long blocks drawn at random from the pool's series."""
    out = np.empty(0)
    while len(out) < n:
        src = pool[rng.integers(len(pool))]
        start = rng.integers(0, len(src) - BLOCK)
        out = np.concatenate([out, src[start:start + BLOCK]])
    return out[:n]


# -- simulated healthy runs -------------------------------------------------------------------------

def scaler_trace(n: int, rng: np.random.Generator, interval: int) -> tuple[np.ndarray, np.ndarray]:
    """A healthy GradScaler: halve on an overflow, double after ``interval`` clean steps. An overflow is the
    largest gradient times the scale passing fp16's range; gradient maxima have a power-law tail, so the
    chance of one grows as a power of the scale (here the cube): about one per growth interval at the run's
    level, eight times fewer at half of it. The scale saws around that level; the opening calibration
    halves down to it from 2^16."""
    scale, clean = 2.0 ** 16, 0
    level = 2.0 ** float(rng.uniform(8, 16))
    out, skipped = np.empty(n), np.zeros(n, bool)
    for i in range(n):
        out[i] = scale
        overflow = rng.random() < min(0.5, (scale / level) ** 3 / interval)
        skipped[i] = overflow
        if overflow:
            scale, clean = scale / 2, 0
        else:
            clean += 1
            if clean >= interval:
                scale, clean = scale * 2, 0
    return out, skipped


def step_time_trace(n: int, rng: np.random.Generator, noisy: bool) -> np.ndarray:
    base = float(rng.uniform(0.2, 8.0))
    if not noisy:
        return base * np.exp(rng.normal(0, rng.uniform(0.03, 0.08), n))
    # A shared or preemptible host: an AR(1) wander of the log step time (20-50% for tens of steps).
    phi, amp = float(rng.uniform(0.9, 0.98)), float(rng.uniform(0.1, 0.25))  # excursions of 2 sigma: 20-50%
    eps = rng.normal(0, amp * np.sqrt(1 - phi ** 2), n)
    wander = np.empty(n)
    wander[0] = eps[0]
    for i in range(1, n):
        wander[i] = phi * wander[i - 1] + eps[i]
    hiccup = rng.random(n) < 1e-3  # a GC pause or a noisy neighbour for a step
    return base * np.exp(wander + rng.normal(0, 0.05, n)) * np.where(hiccup, rng.uniform(1.5, 3.0, n), 1.0)


def simulate_run(n_steps: int, every: int, pools: dict[str, list[np.ndarray]], rng: np.random.Generator) -> tuple[pa.Table, dict]:
    """One long healthy run logged every ``every`` steps: loss, grad norm, step time, maybe fp16 scale."""
    steps = np.arange(0, n_steps, every)
    n = len(steps)
    warm = int(rng.uniform(0, 0.05) * n_steps) + 1
    t = steps + 1.0
    level = float(rng.uniform(1.5, 4.0))
    trend = level * (1 + rng.uniform(0.5, 2.0) * (t / 100.0) ** -float(rng.uniform(0.2, 0.6)))
    trend = np.where(steps < warm, trend * (1 + 0.3 * (1 - steps / warm)), trend)
    sigma = level * float(np.exp(rng.uniform(np.log(0.002), np.log(0.05)))) / np.sqrt(every)
    loss = trend + sigma * bootstrap(pools["loss"], n, rng)
    grad = np.exp(np.log(rng.uniform(0.2, 2.0)) + 0.3 * np.exp(-t / 5000)
                  + float(rng.uniform(0.03, 0.2)) * bootstrap(pools["grad_norm"], n, rng))
    noisy = bool(rng.random() < 0.5)
    per_step = step_time_trace(n_steps, rng, noisy)
    times = 1.7e9 + np.cumsum(per_step)[steps]
    cols = {"step": pa.array(steps, pa.int64()), "loss": loss, "grad_norm": grad, "time": times,
            "segment": pa.array(np.zeros(n, np.int32)), "main": pa.array(np.ones(n, bool))}
    meta: dict = {}
    if rng.random() < 0.4:
        interval = int(rng.choice([100, 500, 1000, 2000]))
        scale, skipped = scaler_trace(n_steps, rng, interval)
        if every == 1:
            cols["loss_scale"], cols["found_inf"] = scale, pa.array(skipped)
        else:
            cols["loss_scale"] = scale[steps]
        meta = {"scaler": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                           "growth_interval": interval}}
    return pa.table(cols), {"noisy_host": noisy, "every": every, **meta}


def simulated_runs(total: int, pools: dict[str, list[np.ndarray]], seed: int) -> list[tuple[str, pa.Table, dict]]:
    rng = np.random.default_rng(seed)
    out, done, k = [], 0, 0
    while done < total:
        every = int(rng.choice([1, 1, 1, 10, 100]))
        n_steps = int(rng.choice([20_000, 50_000, 100_000])) * (every if every > 1 else 1)
        n_steps = min(n_steps, (total - done) * every + every)
        rows, meta = simulate_run(n_steps, every, pools, rng)
        out.append((f"sim-{k:03d}", rows, meta))
        done += rows.num_rows
        k += 1
    return out


# -- judging ----------------------------------------------------------------------------------------

def alarms(rows: pa.Table, meta: dict, config: DetectorConfig) -> list:
    report = analyze(rows, None, now=None, meta=meta, config=config)
    return [f for f in report.findings if f.severity in ("warning", "critical")]


def budget(real: dict[str, pa.Table], sims: list, config: DetectorConfig) -> dict:
    """Warning/critical findings per 1M healthy logged steps, with each one listed (simulated runs are named
    ``d<draw>/sim-<k>``)."""
    found, steps, by_kind = [], 0, {}
    series = [(name, "real", rows, {}) for name, rows in real.items()] + [(n, "sim", r, m) for n, r, m in sims]
    for name, source, rows, meta in series:
        for f in alarms(rows, meta, config):
            found.append(f"{name}: {f.kind} at {f.onset_step} ({f.severity}" + (f"; {json.dumps(meta)[:80]})" if meta else ")"))
            by_kind[f"{source} {f.kind}"] = by_kind.get(f"{source} {f.kind}", 0) + 1
        steps += rows.num_rows
    return {"steps": steps, "alarms": len(found), "per_million": len(found) / steps * 1e6, "list": found,
            "by_kind": by_kind}


def poisson_upper(count: int, level: float = 0.95) -> float:
    """The exact one-sided upper confidence bound of a Poisson mean after ``count`` events (Garwood): the mean
    at which seeing ``count`` or fewer has probability 1 - level (3.0 for none at 95%: the rule of three)."""
    lo, hi = 0.0, count + 10.0 * (count + 1) ** 0.5 + 10.0
    for _ in range(100):  # bisect P(X <= count; mu) = 1 - level
        mu = (lo + hi) / 2
        term = total = math.exp(-mu)
        for k in range(1, count + 1):
            term *= mu / k
            total += term
        lo, hi = (mu, hi) if total > 1 - level else (lo, mu)
    return (lo + hi) / 2


SWEEPS = {  # (component, field): values around the shipped one
    ("spike", "cusum_h"): [16, 24, 32, 40, 50, 60],
    ("spike", "burst_h"): [4.0, 5.9, 8.0, 10.0, 14.0, 20.0],
    ("spike", "burst_lasted_h"): [5.9, 8.0, 10.0, 14.0],
    ("spike", "z_trigger"): [5.0, 6.0, 7.0, 8.0],
    ("scaler", "skip_h"): [10, 15, 20, 30],
    ("scaler", "min_halvings"): [3.0, 4.0, 5.0, 6.0],
    ("slowdown", "min_sigmas"): [3.0, 3.5, 4.0, 5.0, 6.0],
    ("slowdown", "cusum_h"): [10, 20, 40],
    ("stall", "z"): [6.0, 8.0, 10.0, 12.0],
    ("stall", "z_alone"): [6.0, 6.5, 7.0, 8.0],
}


def with_value(config: DetectorConfig, component: str, field: str, value: float) -> DetectorConfig:
    """``config`` with one threshold moved. The burst CUSUM's noting bar moved past its paging bar takes the paging
    bar with it (``burst_lasted_h`` >= ``burst_h``: a burst it does not note cannot page)."""
    values = {field: value}
    if (component, field) == ("spike", "burst_h"):
        values["burst_lasted_h"] = max(config.spike.burst_lasted_h, value)
    part = dataclasses.replace(getattr(config, component), **values)
    return dataclasses.replace(config, **{component: part})


def recall_at(config: DetectorConfig, kinds: tuple[str, ...]) -> float | None:
    """Recall of ``kinds`` on the cached held-out labelled set (None when it is not generated)."""
    from evalruns.heldout import VERSION

    labels = RESULTS / VERSION / "labels.json"
    if not labels.exists():
        return None
    info = json.loads(labels.read_text())
    found = total = 0
    with Store(RESULTS / VERSION / "store") as store:
        for run in info["runs"]:
            wanted = [lab for lab in run["labels"] if lab["kind"] in kinds]
            if not wanted:
                continue
            report = analyze(store.rows(run["run"]), store.events(run["run"]), meta=store.meta(run["run"]), config=config)
            for lab in wanted:
                total += 1
                found += any(f.kind == lab["kind"] and lab["onset"] - 10 <= f.onset_step <= lab["end"] + 10
                             for f in report.findings)
    return found / total if total else None


_SHARED: dict = {}
"""The healthy series and the shipped budget, set before the sweep's workers fork."""


def sweep_row(point: tuple[str, str, float]) -> str:
    """One line of the curve: the budget and the held-out recall with one threshold moved."""
    component, field, value = point
    cfg = with_value(DEFAULT, component, field, value)
    b = _SHARED["shipped"] if cfg == DEFAULT else budget(_SHARED["real"], _SHARED["sims"], cfg)
    rec = recall_at(cfg, KIND_OF[component])
    own = sum(v for key, v in b["by_kind"].items() if key.split(" ")[1] in KIND_OF[component])
    shipped_mark = " (shipped)" if getattr(getattr(DEFAULT, component), field) == value else ""
    return (f"| {component}.{field} | {value}{shipped_mark} | {own / b['steps'] * 1e6:.2f} | "
            f"{b['per_million']:.2f} | {'n/a' if rec is None else f'{rec:.2f}'} |")


KIND_OF = {"spike": ("spike", "divergence"), "scaler": ("scaler_collapse",), "slowdown": ("slowdown",),
           "stall": ("stall",)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3_000_000, help="simulated healthy logged steps")
    parser.add_argument("--seed", type=int, default=0, help="the first draw's seed")
    parser.add_argument("--draws", type=int, default=1, help="independent draws of simulated runs (seeds seed, "
                        "seed+1, ...), pooled; the real logs count once")
    parser.add_argument("--sweep", action="store_true", help="also sweep each alarm threshold (the published curve)")
    parser.add_argument("--jobs", type=int, default=1, help="processes for the sweep's points")
    parser.add_argument("--fields", help="sweep only these thresholds (comma-separated, e.g. spike.cusum_h,stall.z)")
    args = parser.parse_args(argv)
    known = [f"{c}.{f}" for c, f in SWEEPS]
    wanted = set(known) if args.fields is None else set(args.fields.split(","))
    # Checked before any work: a misspelt name would sweep nothing, silently, after minutes of simulation.
    if wanted - set(known):
        parser.error(f"--fields: unknown threshold {', '.join(sorted(wanted - set(known)))} (known: {', '.join(known)})")
    if args.fields is not None and not args.sweep:
        parser.error("--fields needs --sweep")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        real = import_healthy(Path(tmp))
    pools = residual_pools(real)
    seeds = range(args.seed, args.seed + args.draws)
    sims = [(f"d{seed}/{name}", rows, meta) for seed in seeds for name, rows, meta in simulated_runs(args.steps, pools, seed)]
    print(f"healthy series: {len(real)} real logs ({sum(r.num_rows for r in real.values()):,} rows), "
          f"{len(sims)} simulated runs in {args.draws} draw(s) ({sum(r.num_rows for _, r, _ in sims):,} rows); "
          f"{time.perf_counter() - t0:.0f} s")
    shipped = budget(real, sims, DEFAULT)
    lines = ["## False alarms on healthy runs (shipped thresholds)", "",
             f"{shipped['alarms']} warning/critical findings in {shipped['steps']:,} healthy logged steps: "
             f"**{shipped['per_million']:.2f} per 10^6** (budget: 1; 95% upper bound "
             f"{poisson_upper(shipped['alarms']) / shipped['steps'] * 1e6:.2f}).", ""]
    if args.draws > 1:  # each draw's own count: the spread one draw of 3M steps has
        per_draw = [sum(item.startswith(f"d{seed}/") for item in shipped["list"]) for seed in seeds]
        lines += [f"Per draw (seeds {args.seed}-{args.seed + args.draws - 1}; the real logs' "
                  f"{shipped['alarms'] - sum(per_draw)} apart): "
                  + ", ".join(map(str, per_draw)), ""]
    lines += [f"- {k}: {v}" for k, v in sorted(shipped["by_kind"].items())] + [""]
    lines += [f"- {x}" for x in shipped["list"][:60]]
    if args.sweep:
        lines += ["", "## The curve: threshold vs false alarms per 10^6 healthy steps vs held-out recall", "",
                  "| threshold | value | its kinds' alarms per 10^6 | all alarms per 10^6 | held-out recall |",
                  "|---|---|---:|---:|---:|"]
        points = [(component, field, value) for (component, field), values in SWEEPS.items()
                  if f"{component}.{field}" in wanted for value in values]
        _SHARED.update(real=real, sims=sims, shipped=shipped)
        # Forked workers read the simulated runs from this process's memory; each point is independent.
        with get_context("fork").Pool(args.jobs) as pool:
            for line in pool.imap(sweep_row, points):
                lines.append(line)
                print(line, flush=True)
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "calibration.md").write_text(text)
    print(text)
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
