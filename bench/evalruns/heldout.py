"""Labelled runs, held-out set: the same real training, varying what the dev set held fixed.

The detectors were tuned on ``scenarios.scenarios()``. This set checks for
overfitting with the same machinery (training.py's loop and fault injection,
generate.py's store path, scoring.py's matching) but other draws of what the
dev set kept fixed: seeds; model width (embedding and hidden size) and batch
size; logging every step or only every 5 / 10 / 25 steps (rows subsampled the
way a real log interval drops them); LR schedules the dev set never used
(warm-up + constant, linear decay, cosine with restarts, multi-step decay) and
warm-up lengths; mild to severe fault magnitudes, early and late positions;
longer runs; a rollback followed by a later fault; clean runs with tiny
(heavy-tailed) batches and fp16 scalers that back off often.

Model width, schedules and warm-ups are ``RunSpec`` fields; the log interval
rides on ``HeldoutSpec`` (a ``RunSpec`` subclass). ``train_heldout`` runs
training.train, then subsamples the rows the way a log interval drops them,
and each label moves to the logged steps that can show it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import training
from .generate import generate
from .scenarios import Label, LabelledRun, _fault_step, _last_ckpt_before, first_effect
from .training import Fault, Resume, RunSpec
from .truth import logged_steps

VERSION = "labelled-heldout-v3"  # v3: resume events carry the checkpoint's step; rollback truth by truth.py
HELDOUT_SEED = 2027  # any seed but the dev set's 0


@dataclass(frozen=True)
class HeldoutSpec(RunSpec):
    log_every: int = 1


def subsample(rows: list[dict], events: list[dict], every: int) -> tuple[list[dict], list[dict]]:
    """Keep the rows a log written every ``every`` steps holds (and the final row); remap event row indices."""
    if every <= 1:
        return rows, events
    keep = [i for i, r in enumerate(rows) if r["step"] % every == 0 or i == len(rows) - 1]
    new_index = np.searchsorted(np.array(keep), np.arange(len(rows) + 1))
    out_events = [{**ev, "row_index": int(new_index[ev["row_index"]])} for ev in events]
    return [rows[i] for i in keep], out_events


def train_heldout(spec: RunSpec) -> tuple[list[dict], list[dict]]:
    """training.train with the held-out knobs applied; a plain RunSpec trains as usual."""
    rows, events = training.train(spec)
    return subsample(rows, events, spec.log_every) if isinstance(spec, HeldoutSpec) else (rows, events)


def visible_label(spec: HeldoutSpec, lab: Label) -> Label | None:
    """Move a label to the logged steps that show it; None when no logged row can show it."""
    steps = logged_steps(spec, lab.segment)
    inside = steps[(steps >= lab.onset) & (steps <= lab.end)]
    if lab.kind == "stall":
        # The pause lies somewhere in the interval between two logged rows: it starts at the earlier one
        # (the dev set's convention: a stall at step s is the interval (s - 1, s]).
        before, after = steps[steps < lab.onset], steps[steps >= lab.onset]
        if not len(after):
            return None
        onset = int(before[-1]) if len(before) and spec.log_every > 1 else lab.onset
        return replace(lab, onset=onset, end=int(after[0]))
    if lab.kind in ("slowdown", "divergence", "nan", "scaler_collapse") or lab.subtype.startswith("lr_"):
        # A gap, a slower pace, a lasting loss/scale change, a NaN or the aftermath of an LR burst (its
        # update is done; the damage stays in the weights) shows at the next logged row.
        after = steps[steps >= lab.onset]
        if not len(after):
            return None
        onset = int(after[0])
        return replace(lab, onset=onset, end=max(onset, int(inside[-1]) if len(inside) else onset))
    if not len(inside):
        return None  # a spike between two logged rows leaves no trace in the log
    return replace(lab, onset=int(inside[0]), end=int(inside[-1]))


# ---- scenario makers ----------------------------------------------------------------------------


def _base(rng: np.random.Generator, run: str, scenario: str, seed: int, **kw: object) -> dict:
    """Background variety the dev set did not have."""
    num_steps = int(rng.choice([400, 550, 700, 1000]))
    base = {"run": run, "scenario": scenario, "seed": seed, "num_steps": num_steps,
                "batch": int(rng.choice([8, 16, 32, 64, 96])), "base_lr": float(rng.choice([1e-3, 2e-3, 3e-3, 5e-3])),
                "ckpt_every": int(rng.choice([25, 50, 100])), "step_seconds": float(rng.uniform(0.2, 8.0)),
                "embed": int(rng.choice([8, 16, 32])), "hidden": int(rng.choice([32, 64, 128, 192])),
                "schedule": str(rng.choice(["const", "linear", "cosine_restarts", "multistep"])),
                "warmup": int(rng.choice([0, 10, 50, 150])), "log_every": int(rng.choice([1, 1, 5, 10, 25]))}
    base.update(kw)
    return base


def _aligned_step(rng: np.random.Generator, lo: int, hi: int, b: dict, length: int = 1) -> int:
    """A fault step away from checkpoints whose window holds at least one logged step."""
    if b["log_every"] >= b["ckpt_every"]:
        b["log_every"] = 5  # every logged step is a checkpoint step, which faults keep away from
    while True:
        s = _fault_step(rng, lo, hi, b["ckpt_every"])
        if any(t % b["log_every"] == 0 for t in range(s, s + length)):
            return s


def _position(rng: np.random.Generator, n: int) -> tuple[int, int]:
    return (60, 160) if rng.random() < 0.35 else (int(n * 0.5), n - 60)


def _done(b: dict, labels: list[Label]) -> LabelledRun:
    """The run with its labels moved to the logged steps and its rollback truth from truth.py's rule."""
    spec = HeldoutSpec(**b)
    vis = [v for v in (visible_label(spec, lab) for lab in labels) if v is not None]
    return LabelledRun.judged(spec, vis)


def _spike(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"h-spike-{i:02d}", "spike", 5100 + i)
    lo, hi = _position(rng, b["num_steps"])
    if i % 2 == 0:
        n = int(rng.integers(1, 4))
        factor = float(rng.uniform(30, 100)) if n > 1 else float(rng.uniform(80, 150))
        s = _aligned_step(rng, lo, hi, b, n)
        fault, sub = Fault("lr_burst", s, n, factor), "lr_burst_severe" if factor * n >= 120 else "lr_burst_mild"
    else:
        n = int(rng.integers(1, 6))
        s = _aligned_step(rng, lo, hi, b, n)
        fault, sub = Fault("bad_batch", s, n), f"bad_batch_{'long' if n >= 3 else 'short'}"
    return _done({**b, "faults": (fault,)}, [Label("spike", sub, first_effect(fault), first_effect(fault) + n - 1)])


def _divergence(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"h-divergence-{i:02d}", "divergence", 5200 + i)
    lo, hi = _position(rng, b["num_steps"])
    sub = ("lr_jump", "lr_grow", "lr_ramp_act_growth")[i % 3]
    s = _fault_step(rng, lo, hi, b["ckpt_every"])
    if sub == "lr_jump":
        f = float(rng.uniform(15, 80))
        faults, sub = (Fault("lr_jump", s, 10_000, f),), "lr_jump_mild" if f < 30 else "lr_jump_severe"
    elif sub == "lr_grow":
        faults = (Fault("lr_grow", s, 10_000, float(rng.uniform(1.03, 1.15))),)
    else:
        faults = (Fault("lr_ramp", s, 10_000, float(rng.uniform(1.004, 1.008))),
                  Fault("weight_growth", s, 10_000, float(rng.uniform(1.008, 1.015))))
        b["num_steps"] = max(b["num_steps"], s + 330)
    b["faults"] = faults
    label = Label("divergence", sub, first_effect(faults[0]), b["num_steps"] - 1, needs_action=True)
    return _done(b, [label])


def _collapse(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"h-scaler-collapse-{i:02d}", "scaler_collapse", 5300 + i, fp16=True,
              growth_interval=int(rng.choice([20, 50, 200])))
    lo, hi = _position(rng, b["num_steps"])
    s = _fault_step(rng, lo, hi, b["ckpt_every"])
    every = 1 if i % 3 else 2
    n = max(int(rng.integers(8, 30)), 2 * b["log_every"]) * every
    normal = tuple(sorted({int(x) for x in rng.integers(30, lo, size=3)}))
    b.update(normal_overflows=normal, faults=(Fault("overflow", s, n, every=every),))
    label = Label("scaler_collapse", "consecutive" if every == 1 else "every_other", s, s + n - 1, needs_action=True)
    return _done(b, [label])


def _nan(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"h-nan-{i:02d}", "nan", 5400 + i)
    lo, hi = _position(rng, b["num_steps"])
    s = _fault_step(rng, lo, hi, b["ckpt_every"])
    sub = "nan_weight" if i % 2 == 0 else "nan_grad"
    b.update(num_steps=s + int(rng.integers(3, 60)), faults=(Fault(sub, s, 1),))
    label = Label("nan", sub, s, b["num_steps"] - 1, needs_action=True)
    return _done(b, [label])


def _stall(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"h-stall-{i:02d}", "stall", 5500 + i, fp16=bool(i % 3 == 0))
    lo, hi = _position(rng, b["num_steps"])
    s = _fault_step(rng, lo, hi, b["ckpt_every"])
    gap = float(rng.uniform(20, 400))
    b["faults"] = (Fault("stall", s, 1, gap),)
    return _done(b, [Label("stall", "gap_short" if gap < 60 else "gap_long", s, s)])


def _slowdown(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"h-slowdown-{i:02d}", "slowdown", 5600 + i)
    lo, hi = _position(rng, b["num_steps"])
    s = _fault_step(rng, lo, hi, b["ckpt_every"])
    n = int(rng.integers(40, 250))
    f = float(rng.uniform(1.5, 5.0))
    b["faults"] = (Fault("slowdown", s, n, f),)
    return _done(b, [Label("slowdown", "mild" if f < 2.0 else "strong", s, min(s + n, b["num_steps"]) - 1)])


def _rollback(i: int, rng: np.random.Generator) -> LabelledRun:
    """A rolled-back fault on segment 0, then (every other run) a fresh fault on the resumed segment."""
    b = _base(rng, f"h-rollback-{i:02d}", "rollback", 5700 + i, num_steps=900)
    s = _fault_step(rng, 150, 300, b["ckpt_every"])
    ck = _last_ckpt_before(s, b["ckpt_every"])
    at = s + int(rng.integers(25, 60))
    jump = i % 2 == 0
    kind, sub = ("divergence", "lr_jump") if jump else ("spike", "bad_batch")
    faults = [Fault("lr_jump", s, 10_000, float(rng.uniform(30, 60))) if jump else Fault("bad_batch", s, 3)]
    labels = [Label(kind, sub, first_effect(faults[0]), at, segment=0, needs_action=jump, open=False)]
    if i % 4 in (1, 2):  # a later fault after the resume: the run needs a second look
        t = _fault_step(rng, at + 100, 800, b["ckpt_every"])
        if i % 4 == 1:
            faults.append(Fault("lr_jump", t, 10_000, float(rng.uniform(30, 60)), segment=1))
            labels.append(Label("divergence", "lr_jump_after_resume", t + 1, b["num_steps"] - 1, segment=1,
                                needs_action=True))
        else:
            t = _aligned_step(rng, at + 100, 800, b, 2)
            faults.append(Fault("lr_burst", t, 2, float(rng.uniform(40, 80)), segment=1))
            labels.append(Label("spike", "lr_burst_after_resume", t + 1, t + 2, segment=1))
    b.update(faults=tuple(faults), resume=Resume(at, ck, s - ck + 40))
    return _done(b, labels)


def _clean(i: int, rng: np.random.Generator) -> LabelledRun:
    sub = ("tiny_batch_heavy_tail", "fp16_frequent_backoffs", "cosine_restarts", "multistep_decay",
           "long_warmup_linear", "long_run")[i % 6]
    kw: dict = {}
    if sub == "tiny_batch_heavy_tail":
        kw = {"batch": int(rng.choice([1, 2, 3])), "base_lr": float(rng.choice([5e-4, 1e-3, 2e-3]))}
    elif sub == "fp16_frequent_backoffs":
        n = int(rng.choice([500, 800]))
        every = rng.integers(8, 45, size=n // 8).cumsum()
        kw = {"fp16": True, "num_steps": n, "normal_overflows": tuple(int(x) for x in every if x < n),
                  "growth_interval": int(rng.choice([10, 20, 30])), "startup_overflows": int(rng.integers(0, 10))}
    elif sub == "cosine_restarts":
        kw = {"schedule": "cosine_restarts"}
    elif sub == "multistep_decay":
        kw = {"schedule": "multistep"}
    elif sub == "long_warmup_linear":
        kw = {"schedule": "linear", "warmup": int(rng.choice([150, 300]))}
    else:
        kw = {"num_steps": 1800, "batch": 16, "hidden": 32}
    b = _base(rng, f"h-clean-{i:02d}", f"clean:{sub}", 5800 + i, **kw)
    return _done(b, [])


# Labels the data contradicts, found after generation (the injected fault is not what the run shows):
# - h-clean-07 (fp16_frequent_backoffs): the ordinary overflows come faster than growth_interval lets the
#   scale regrow, so after the startup overflows the scale never grows again and halves down to 0.125 by
#   the last step (below 1 from step 425): a scaler collapse from the first logged row after the startup
#   overflows (25). No checkpoint precedes it (the first is at 50).
# - h-divergence-15 (lr_jump_severe, x32 at step 60): the loss jumped (3.54 -> 6.35 at 65, the first logged
#   row after update 60) and was back under its pre-jump level at 75, then kept falling under the raised
#   LR: a spike, not a divergence.
CORRECTIONS: dict[str, list[Label]] = {
    "h-clean-07": [Label("scaler_collapse", "drift_below_1", 25, 499, needs_action=True)],
    "h-divergence-15": [Label("spike", "lr_jump_recovered", 65, 75)],
}


def _corrected(lr: LabelledRun) -> LabelledRun:
    fix = CORRECTIONS.get(lr.spec.run)
    return lr if fix is None else LabelledRun.judged(lr.spec, fix)


MAKERS = {"spike": _spike, "divergence": _divergence, "scaler_collapse": _collapse, "nan": _nan,
          "stall": _stall, "slowdown": _slowdown, "rollback": _rollback, "clean": _clean}
COUNTS = {"spike": 20, "divergence": 18, "scaler_collapse": 12, "nan": 10, "stall": 10, "slowdown": 10,
          "rollback": 8, "clean": 18}


def heldout_scenarios(counts: dict[str, int] | None = None, seed: int = HELDOUT_SEED) -> list[LabelledRun]:
    """The held-out set: ``counts[name]`` runs of each scenario."""
    out = []
    for name, n in (counts or COUNTS).items():
        rng = np.random.default_rng([seed, list(MAKERS).index(name)])
        out.extend(_corrected(MAKERS[name](i, rng)) for i in range(n))
    return out


def generate_heldout(out_dir: Path, runs: list[LabelledRun] | None = None, *, verbose: bool = False) -> dict:
    """Train and write the held-out runs under ``out_dir`` (root = out_dir/'store') plus ``labels.json``."""
    return generate(out_dir, heldout_scenarios() if runs is None else runs, verbose=verbose, train_fn=train_heldout,
                    version=VERSION, source="bench/evalruns/heldout",
                    describe=lambda lr: {**lr.to_dict(), "knobs": _knobs(lr.spec)})


def _knobs(spec: RunSpec) -> dict:
    keys = ("embed", "hidden", "batch", "base_lr", "schedule", "warmup", "log_every", "num_steps", "ckpt_every", "fp16")
    return {k: getattr(spec, k) for k in keys if hasattr(spec, k)}


def current_labels(info: dict) -> dict:
    """The cached runs with the labels this module gives them now.

    Labels are not inputs to training (the spec is), so a label fix must not
    cost a regeneration; the knobs are compared so a changed spec still does.
    """
    by_run = {lr.spec.run: lr for lr in heldout_scenarios()}
    runs = []
    for run in info["runs"]:
        lr = by_run.get(run["run"])
        if lr is None or _knobs(lr.spec) != run["knobs"]:
            raise ValueError(f"{VERSION}/labels.json: run {run['run']} no longer matches heldout.py "
                             f"(expected its spec unchanged; regenerate with --regenerate)")
        runs.append({**lr.to_dict(), "knobs": run["knobs"]})
    return {**info, "runs": runs}


def load_or_generate_heldout(results_dir: Path, *, verbose: bool = True) -> tuple[Path, dict]:
    """The cached held-out set for ``VERSION``, generating it on first use."""
    out_dir = results_dir / VERSION
    labels = out_dir / "labels.json"
    if labels.exists():
        return out_dir / "store", current_labels(json.loads(labels.read_text()))
    if verbose:
        print(f"generating held-out labelled runs into {out_dir} (real CPU training, one thread)...", flush=True)
    return out_dir / "store", generate_heldout(out_dir, verbose=verbose)
