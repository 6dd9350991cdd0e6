"""False alarms on clean training: the fault-free twins of the fresh sets' runs.

    .venv/bin/python bench/twin_alarms.py --seeds 501650 595643     # seeds whose training is cached
    .venv/bin/python bench/twin_alarms.py --cached                  # every seed evaluated to the end

Every run of a fresh seed (bench/evalruns/fresh.py) is trained twice: as drawn and without its faults (the
clean twin the labeller compares it with). The twins are real CPU training with everything the fresh
generator draws (short runs and their starts, resumes, fp16 scalers, noisy hosts, logs every 1-25 steps) and
no fault, so every warning or critical finding on one is a false alarm, unless it lies in a natural event
the labeller found on the twin itself (a ``natural`` dont_care label: a batch-1 run's loss doubling, a
noisy host's slow stretch). bench/calibrate.py checks the budget (one alarm per 10^6 healthy logged steps)
on long simulated runs, where run starts are rare; this is the same count over the generator's many short
runs. It reads the training cache only (the seeds' ``eval_detectors.py --set fresh --seed N`` runs fill it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evalruns import fresh  # noqa: E402
from evalruns.generate import write_run  # noqa: E402
from evalruns.heldout import subsample  # noqa: E402
from evalruns.scoring import ALARM, match_window  # noqa: E402

from runwatch.data.store import Store  # noqa: E402
from runwatch.detectors.analysis import analyze  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = RESULTS / "fresh-train-cache"


def cached_seeds() -> list[int]:
    """Seeds evaluated to the end: training cached and runs labelled (an interrupted evaluation has no labels)."""
    seeds = (int(p.name.removeprefix("seed")) for p in CACHE.glob("seed*") if p.is_dir())
    return sorted(s for s in seeds if (RESULTS / fresh.result_name(s) / "labels.json").exists())


def cached_twin(run: fresh.FreshRun, seed: int) -> tuple[list[dict], list[dict]]:
    """The logged rows and events of ``run``'s clean twin, read from the training cache (never trained here)."""
    path = fresh.cache_path(run, CACHE / f"seed{seed}")
    if not path.exists():  # train_pair would train it: this script only reads
        raise SystemExit(f"{path}: not cached (run eval_detectors.py --set fresh --seed {seed} first)")
    _, twin = fresh.train_pair(run, CACHE / f"seed{seed}")
    return subsample(*twin, run.spec.log_every)


def twin_alarms(seed: int) -> dict:
    """Alarms on every twin of ``seed`` outside the natural events labelled on it, and the healthy logged steps."""
    labels = json.loads((RESULTS / fresh.result_name(seed) / "labels.json").read_text())
    natural = {r["run"]: [lab for lab in r["labels"] if lab["subtype"] == "natural"] for r in labels["runs"]}
    alarms, healthy, num_runs = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for run in fresh.fresh_runs(seed):
            spec, nat = run.spec, natural.get(run.spec.run, [])
            rows, events = cached_twin(run, seed)
            write_run(root, spec.run, rows, events, meta={"source": "bench/twin_alarms", "seed": seed, **run.meta})
            with Store(root) as st:
                table = st.rows(spec.run, rank=0)
                report = analyze(table, st.events(spec.run), now=None, meta=st.meta(spec.run))
            w = match_window(spec.log_every)
            steps, segs = np.asarray(table["step"]), np.asarray(table["segment"])
            inside = np.zeros(len(steps), bool)
            for lab in nat:
                inside |= (segs == lab["segment"]) & (steps >= lab["onset"] - w) & (steps <= lab["end"] + w)
            healthy += int((~inside).sum())
            num_runs += 1
            for f in report.findings:
                if f.severity in ALARM and not any(lab["segment"] == f.segment and lab["kind"] in _absorbing(f.kind)
                                                   and lab["onset"] - w <= f.onset_step <= lab["end"] + w
                                                   for lab in nat):
                    alarms.append({"run": spec.run, "kind": f.kind, "severity": f.severity, "segment": f.segment,
                                   "onset": f.onset_step, "knobs": {k: v for k, v in fresh.draws.knobs(spec).items()
                                                                    if k in ("log_every", "clock", "fp16")},
                                   "message": f.message})
    return {"seed": seed, "runs": num_runs, "healthy_steps": healthy, "alarms": alarms}


def _absorbing(kind: str) -> tuple[str, ...]:
    """Natural label kinds a finding of ``kind`` may lie in (a loss excursion is a spike or a divergence)."""
    return ("spike", "divergence") if kind in ("spike", "divergence") else (kind,)


def report(results: list[dict]) -> str:
    total = sum(r["healthy_steps"] for r in results)
    kinds: dict[str, int] = {}
    for r in results:
        for a in r["alarms"]:
            kinds[a["kind"]] = kinds.get(a["kind"], 0) + 1
    n = sum(kinds.values())
    lines = ["## False alarms on the fresh sets' clean twins", "",
             f"{n} warning/critical findings in {total:,} healthy logged steps of {sum(r['runs'] for r in results)} "
             f"fault-free runs (seeds {', '.join(str(r['seed']) for r in results)}): "
             f"**{1e6 * n / max(total, 1):.1f} per 10^6** (budget: 1).", "",
             "| seed | runs | healthy steps | alarms | per 10^6 |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seed']} | {r['runs']} | {r['healthy_steps']:,} | {len(r['alarms'])} | "
              f"{1e6 * len(r['alarms']) / max(r['healthy_steps'], 1):.1f} |" for r in results]
    lines += ["", "By kind: " + (", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"), ""]
    for r in results:
        lines += [f"- {a['run']} segment {a['segment']}: {a['kind']} ({a['severity']}) at {a['onset']} "
                  f"{json.dumps(a['knobs'])}: {a['message']}" for a in r["alarms"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="*", default=[])
    ap.add_argument("--cached", action="store_true", help="every seed whose evaluation finished (training cached, runs labelled)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "twin_alarms.md")
    args = ap.parse_args()
    seeds = args.seeds or (cached_seeds() if args.cached else [])
    if not seeds:
        ap.error("name --seeds or --cached")
    t0 = time.perf_counter()
    with get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(twin_alarms, seeds)
    text = report(results)
    args.out.write_text(text)
    print(text + f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
