"""The fresh evaluation set: randomised runs from one seed, labelled by a counterfactual twin.

The dev set (scenarios.py) was tuned on and the held-out set (heldout.py)
was looked at; this one is drawn from ``numpy.random.default_rng(seed)`` with
a seed given on the command line, so a seed drawn after the detectors are
frozen is a set nobody tuned on. The same seed gives the same runs and labels
byte for byte.

Per run it draws the model width, batch, LR and schedule with warm-up, run
length, checkpoint and log intervals, fp16 (a GradScaler with an fp16-like
ceiling, ordinary overflows at a Poisson rate, sometimes DeepSpeed's floor of
1) or not, a steady or a noisy host, and 0-3 faults of every kind, sized from
the edge of detectability to far past it, placed anywhere after the first ~40
logged observations, often 0-2 steps after a checkpoint. Some runs roll back
(a resume from a checkpoint before the first fault, skipping batches) and some
of those get more faults after the resume.

Training is training.py's; every faulty run is trained again without its
faults (the clean twin) and counterfactual.py turns the difference into
labels; truth.py gives the rollback checkpoint. Trained pairs are cached by
their spec under ``results/fresh-train-cache/``, so a label-rule change
costs no training.
"""

from __future__ import annotations

import ast
import gzip
import multiprocessing
import hashlib
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from . import draws, training
from .counterfactual import LabelRules, label_run, lineage
from .generate import write_run
from .heldout import HeldoutSpec, subsample
from .scenarios import LabelledRun
from .truth import MainLine, backoff_bursts, lr_raised, right_checkpoint

# v11: a collapse's depth is counted below the twin's scale no higher than at its onset (the twin's later growth is
# no halving of the faulty run's); v10: a checkpoint in a spike that needs no action is clean once the run is out of
# its thick and no worse than before it for good; v9: a spike needs action only if the run is worse now than before
# it; v8: a checkpoint at the row before the first row showing an LR fault's raise is clean; v7: a collapse is over
# once back under the depth of one (v6: within 1.5 halvings of the twin), a later loss fault ends its window, a
# natural slide spans from its first halving; v6: sigma from 64 twin observations centred on the fault (v5: the 64
# before it; v4: 200); natural events from the first observations
VERSION = "fresh-v11"
NUM_RUNS = 150


def fresh_runs(seed: int, num_runs: int = NUM_RUNS) -> list[draws.FreshRun]:
    """The runs of one seed; run i is the same whatever ``num_runs`` is (one child generator per run)."""
    children = np.random.default_rng(seed).spawn(num_runs)
    return [draws.draw_run(f"f{seed}-{i:03d}", rng) for i, rng in enumerate(children)]


# What training.py does, not how it is laid out: a change to its code retrains, a comment does not.
TRAINING_CODE = ast.dump(ast.parse(Path(training.__file__).read_text())).encode()


def _cache_key(spec: HeldoutSpec) -> str:
    return hashlib.sha1(repr(spec).encode() + TRAINING_CODE).hexdigest()[:16]


def cache_path(run: draws.FreshRun, cache_dir: Path) -> Path:
    """Where ``train_pair`` keeps the run's pair: keyed by its spec and the training code."""
    return cache_dir / f"{run.spec.run}-{_cache_key(run.spec)}.json.gz"


def train_pair(run: draws.FreshRun, cache_dir: Path) -> tuple[tuple[list, list], tuple[list, list]]:
    """(rows, events) of the faulty run and of its clean twin, per step; cached by spec and training code."""
    path = cache_path(run, cache_dir)
    if path.exists():
        with gzip.open(path, "rt") as fh:
            got = json.load(fh)
        return tuple(got["faulty"]), tuple(got["twin"])
    faulty = training.train(run.spec)
    twin = training.train(replace(run.spec, faults=())) if run.spec.faults else faulty
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as fh:
        json.dump({"faulty": faulty, "twin": twin}, fh)
    tmp.rename(path)
    return faulty, twin


def _train_worker_init() -> None:
    torch.set_num_threads(1)  # one thread per worker, as in one process: the same numbers either way


def _train_one(args: tuple[draws.FreshRun, Path]) -> str:
    run, cache_dir = args
    train_pair(run, cache_dir)
    return run.spec.run


def prefill_cache(runs: list[draws.FreshRun], cache_dir: Path, jobs: int) -> None:
    """Train the runs' pairs into the cache in ``jobs`` processes (each run is independent and trained on one
    thread, so the cache holds what one process would write); the labelling pass then reads them in order."""
    todo = [(run, cache_dir) for run in runs]
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=_train_worker_init) as pool:
        for _ in pool.imap_unordered(_train_one, todo):
            pass


def _segments(rows: list[dict], events: list[dict]) -> np.ndarray:
    seg = np.zeros(len(rows), dtype=int)
    for ev in events:
        if ev["event"] == "resume":
            seg[ev["row_index"]:] += 1
    return seg


def main_line(full: tuple[list, list], logged: tuple[list, list], spec: HeldoutSpec) -> MainLine:
    """truth.MainLine read off the trained run: logged steps, checkpoints and per-step overflows on the main line."""
    cut, last = (spec.resume.from_ckpt, 1) if spec.resume else (None, 0)

    def on_main(step: int, segment: int) -> bool:
        return segment == last or step <= cut

    rows, events = full
    overflows = [r["step"] for r, s in zip(rows, _segments(rows, events))
                 if r.get("found_inf") and on_main(r["step"], s)]
    steps = [r["step"] for r, s in zip(logged[0], _segments(*logged)) if on_main(r["step"], s)]
    ckpts, num_resumes = [], 0
    for ev in events:  # in training order: a checkpoint belongs to the segment of the resumes before it
        num_resumes += ev["event"] == "resume"
        if ev["event"] == "checkpoint" and on_main(ev["step"], num_resumes):
            ckpts.append(int(ev["step"]))
    return MainLine(np.sort(np.array(steps)), tuple(ckpts), backoff_bursts(overflows),
                    lr_raised(spec.faults, spec.num_steps - 1))


def label(run: draws.FreshRun, faulty: tuple[list, list], twin: tuple[list, list],
          rules: LabelRules = LabelRules()) -> tuple[LabelledRun, list[dict], list[dict]]:
    """The run's labels and rollback truth, and its logged rows and events as the store gets them."""
    spec = run.spec
    rows_f, ev_f = subsample(*faulty, spec.log_every)
    rows_t, _ = subsample(*twin, spec.log_every)
    if [r["step"] for r in rows_f] != [r["step"] for r in rows_t]:
        raise RuntimeError(f"{spec.run}: the twin logged other steps than the faulty run")
    seg = _segments(rows_f, ev_f)
    cut = spec.resume.from_ckpt if spec.resume else None
    lines = {s: lineage(rows_f, rows_t, seg, s, cut if s else None) for s in np.unique(seg).tolist()}
    cuts = {0: cut if len(lines) > 1 else None, 1: None}
    labels = label_run(list(run.injections), lines, cuts, spec.log_every, rules)
    truth = right_checkpoint(labels, main_line(faulty, (rows_f, ev_f), spec))
    return LabelledRun(spec, labels, truth), rows_f, ev_f


def describe(lr: LabelledRun, run: draws.FreshRun) -> dict:
    return {**lr.to_dict(), "knobs": draws.knobs(lr.spec), "injections": [asdict(i) for i in run.injections]}


def generate_fresh(out_dir: Path, seed: int, num_runs: int = NUM_RUNS, *, cache_dir: Path,
                   verbose: bool = True, jobs: int = 1) -> dict:
    """Train (or take from the cache; in ``jobs`` processes when more than one), label and store the runs of
    one seed under ``out_dir``."""
    torch.set_num_threads(1)
    root = out_dir / "store"
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    described, num_rows = [], 0
    runs = fresh_runs(seed, num_runs)
    if jobs > 1:
        prefill_cache(runs, cache_dir, jobs)
    for k, run in enumerate(runs):
        faulty, twin = train_pair(run, cache_dir)
        lr, rows, events = label(run, faulty, twin)
        write_run(root, run.spec.run, rows, events, meta={"source": "bench/evalruns/fresh", "seed": seed,
                  "scenario": run.spec.scenario, "labels_version": VERSION, **run.meta})
        described.append(describe(lr, run))
        num_rows += len(rows)
        if verbose and ((k + 1) % 10 == 0 or k + 1 == len(runs)):
            print(f"  fresh seed {seed}: {k + 1}/{len(runs)} runs, {time.perf_counter() - t0:.0f}s", flush=True)
    info = {"version": VERSION, "seed": seed, "labels_from": "counterfactual", "num_runs": len(runs),
            "num_rows": num_rows, "runs": described}
    (out_dir / "labels.json").write_text(json.dumps(info, indent=1))
    (out_dir / "generation.json").write_text(json.dumps({"seconds": round(time.perf_counter() - t0, 1)}))
    return info


def result_name(seed: int, num_runs: int = NUM_RUNS) -> str:
    """The folder of one seed's set under results/ (a subset of the first runs gets its own)."""
    return f"{VERSION}-seed{seed}" + ("" if num_runs == NUM_RUNS else f"-n{num_runs}")


def load_or_generate_fresh(results_dir: Path, seed: int, num_runs: int = NUM_RUNS, *,
                           verbose: bool = True, jobs: int = 1) -> tuple[Path, dict, str]:
    """The cached fresh set of ``seed`` (generated on first use); returns (store root, info, set name)."""
    name = result_name(seed, num_runs)
    out_dir = results_dir / name
    labels = out_dir / "labels.json"
    if labels.exists():
        return out_dir / "store", json.loads(labels.read_text()), name
    if verbose:
        print(f"generating fresh seed {seed} ({num_runs} runs) into {out_dir} (real CPU training, one thread "
              f"per process, {jobs} process{'es' if jobs > 1 else ''})...", flush=True)
    info = generate_fresh(out_dir, seed, num_runs, cache_dir=results_dir / "fresh-train-cache" / f"seed{seed}",
                          verbose=verbose, jobs=jobs)
    return out_dir / "store", info, name


