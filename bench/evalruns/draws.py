"""Fresh set, part 1: what one run is, drawn from its own generator.

Background (model width, batch, LR, schedule and warm-up, run length,
checkpoint and log intervals, fp16 scaler, host clock), then 0-3 causes, each
an ``Injection`` (the label kind it is a candidate for, the steps it acts on)
carried by one or two ``training.Fault``s. Sizes are log-uniform from below
the edge of detectability to far past it; whether each one is a label is
decided afterwards from the data (counterfactual.py), never here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .counterfactual import Injection
from .heldout import HeldoutSpec
from .scenarios import first_effect
from .training import Fault, HostClock, Resume

# Spikes and divergences get the most: near the edge many of them are dont_care; a stall is always clear.
KIND_WEIGHTS = {"spike": 0.36, "divergence": 0.18, "nan": 0.08, "scaler_collapse": 0.30, "stall": 0.10,
                "slowdown": 0.14}
SUBTYPES = {"spike": ("lr_burst", "bad_batch"), "divergence": ("lr_jump", "lr_grow", "lr_ramp"),
            "nan": ("nan_weight", "nan_grad"), "scaler_collapse": ("consecutive", "every_other", "pinned_floor"),
            "stall": ("gap",), "slowdown": ("sustained",)}
TERMINAL = ("lr_jump", "lr_grow", "lr_ramp", "nan_weight", "nan_grad", "pinned_floor")  # nothing after them
TRIGGERS = ("spike", "divergence", "nan", "scaler_collapse")  # what an operator rolls back for
FOREVER = 10**6  # a persisting fault's length
MIN_OBS = 40  # faults start after this many logged observations (a resumed segment: half of it)
NEAR_CHECKPOINT = 0.35  # share of faults placed 0, 1 or 2 steps after a checkpoint


@dataclass(frozen=True)
class FreshRun:
    spec: HeldoutSpec
    injections: tuple[Injection, ...]
    meta: dict = field(default_factory=dict)  # run.json extras (the GradScaler's parameters)


def _logu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _logu_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    return min(hi, max(lo, round(_logu(rng, lo, hi))))


def _clock(rng: np.random.Generator) -> HostClock:
    if rng.random() < 0.35:  # a shared or preemptible host: wander of 20-50% for tens of steps, rare hiccups
        return HostClock(jitter=float(rng.uniform(0.02, 0.05)), wander_sd=math.log(1 + rng.uniform(0.2, 0.5)) / 2.3,
                         wander_phi=float(rng.uniform(0.9, 0.97)), hiccup_rate=_logu(rng, 1e-3, 5e-3),
                         hiccup_factor=float(rng.uniform(1.3, 2.0)))
    return HostClock(jitter=float(rng.uniform(0.03, 0.08)))


def _background(rng: np.random.Generator, run: str) -> tuple[dict, dict]:
    """Spec keywords (no faults yet) and run.json extras."""
    every = int(rng.choice([1, 2, 5, 10, 25], p=[0.6, 0.1, 0.1, 0.1, 0.1]))
    n = _logu_int(rng, max(400, 60 * every), 2500)
    kw = {"run": run, "scenario": "", "seed": int(rng.integers(0, 10_000)), "num_steps": n, "log_every": every,
          "embed": int(rng.integers(8, 33)), "hidden": int(rng.integers(32, 193)), "batch": _logu_int(rng, 1, 96),
          "base_lr": _logu(rng, 5e-4, 6e-3),
          "schedule": str(rng.choice(["const", "cosine", "linear", "cosine_restarts", "multistep", "step"])),
          "warmup": int(rng.uniform(0, 0.15) * n), "ckpt_every": _logu_int(rng, 20, 200),
          "step_seconds": float(rng.uniform(0.2, 8.0)), "clock": _clock(rng), "fp16": bool(rng.random() < 0.4)}
    if not kw["fp16"]:
        return kw, {}
    init = 2.0**16 if rng.random() < 0.5 else 2.0 ** int(rng.integers(10, 25))
    interval = _logu_int(rng, 20, 2000)
    rate = _logu(rng, 0.02, 0.4) / interval  # ordinary overflows: the scale still regrows between them
    kw.update(init_scale=init, growth_interval=interval, scale_ceiling=2.0 ** int(rng.integers(12, 21)),
              normal_overflows=tuple(int(s) for s in np.flatnonzero(rng.random(n) < rate)),
              min_scale=1.0 if rng.random() < 0.5 else None)
    scaler = {"init_scale": init, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": interval}
    return kw, {"scaler": scaler}


def _causes(rng: np.random.Generator, fp16: bool) -> list[tuple[str, str]]:
    """0-3 (kind, subtype) pairs; about a fifth of the runs are clean."""
    if rng.random() < 0.2:
        return []
    kinds = [k for k in KIND_WEIGHTS if fp16 or k != "scaler_collapse"]
    p = np.array([KIND_WEIGHTS[k] for k in kinds])
    out = []
    for _ in range(int(rng.choice([1, 2, 3], p=[0.45, 0.35, 0.2]))):
        kind = str(rng.choice(kinds, p=p / p.sum()))
        subs = [s for s in SUBTYPES[kind] if not (s == "nan_grad" and fp16)]  # the scaler would skip an inf grad
        out.append((kind, str(rng.choice(subs))))
    return out


def _terminal_last(rng: np.random.Generator, causes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """At most one cause after which nothing else can be judged, and it comes last (extras become spikes)."""
    term = [c for c in causes if c[1] in TERMINAL]
    extra = [("spike", str(rng.choice(SUBTYPES["spike"]))) for _ in term[1:]]
    return [c for c in causes if c[1] not in TERMINAL] + extra + term[:1]


def _positions(rng: np.random.Generator, k: int, lo: int, hi: int, b: dict) -> list[int]:
    """k cause steps in [lo, hi), apart by a spike's recovery room, some 0-2 steps after a checkpoint."""
    gap = max(60, 15 * b["log_every"])
    if hi <= lo:
        return []
    for _ in range(100):
        out = []
        for _ in range(k):
            ckpts = [c for c in range(b["ckpt_every"], hi, b["ckpt_every"]) if c >= lo]
            if ckpts and rng.random() < NEAR_CHECKPOINT:
                out.append(int(rng.choice(ckpts)) + int(rng.integers(0, 3)))
            else:
                out.append(int(rng.integers(lo, hi)))
        out.sort()
        if all(later - earlier >= gap for earlier, later in zip(out, out[1:])):
            return out
    return out[:1]  # the segment is too short for them all: keep one


def _faults(rng: np.random.Generator, sub: str, s: int, seg: int, batch_offset: int,
            every: int) -> tuple[Fault, ...]:
    """The training faults of one cause at step ``s``, sized log-uniformly across the edge of detectability."""
    if sub == "lr_burst":
        return (Fault("lr_burst", s, int(rng.integers(1, 5)), _logu(rng, 2.0, 300.0), segment=seg),)
    if sub == "bad_batch":  # keyed by data position, which a resume's skip window moves away from the step
        return (Fault("bad_batch", s + batch_offset, int(rng.integers(1, 6)), min(1.0, _logu(rng, 0.05, 3.0))),)
    if sub == "lr_jump":
        return (Fault("lr_jump", s, FOREVER, _logu(rng, 1.5, 80.0), segment=seg),)
    if sub == "lr_grow":
        return (Fault("lr_grow", s, FOREVER, 1 + _logu(rng, 0.002, 0.12), segment=seg),)
    if sub == "lr_ramp":  # a slow LR ramp with the final layer's weights creeping up (the OPT act-norm signal)
        return (Fault("lr_ramp", s, FOREVER, 1 + _logu(rng, 0.002, 0.008), segment=seg),
                Fault("weight_growth", s, FOREVER, 1 + _logu(rng, 0.002, 0.015), segment=seg))
    if sub in ("nan_weight", "nan_grad"):
        return (Fault(sub, s, 1, segment=seg),)
    if sub == "consecutive":
        return (Fault("overflow", s, _logu_int(rng, 2, 40), segment=seg),)
    if sub == "every_other":
        return (Fault("overflow", s, 2 * _logu_int(rng, 2, 30) - 1, every=2, segment=seg),)
    if sub == "pinned_floor":  # every step overflows; the scale halves to DeepSpeed's floor of 1 and stays
        return (Fault("overflow", s, FOREVER, segment=seg),)
    if sub == "gap":
        return (Fault("stall", s, 1, _logu(rng, 10.0, 400.0), segment=seg),)
    if sub == "sustained":
        return (Fault("slowdown", s, _logu_int(rng, max(20, 4 * every), 300), _logu(rng, 1.2, 5.0), segment=seg),)
    raise ValueError(f"unknown cause {sub!r}")


def make_injection(kind: str, sub: str, faults: tuple[Fault, ...], s: int, seg: int, end: int) -> Injection:
    """The cause as the labeller sees it: steps it acts on directly, and its first visible step."""
    f = replace(faults[0], step=s)  # bad_batch counts data positions; the label counts steps
    direct = {"lr_burst": s + f.length, "bad_batch": s + f.length - 1, "overflow": s + f.length - 1,
              "stall": s, "slowdown": s + f.length - 1}.get(f.kind, end)
    return Injection(kind, sub, seg, s, first_effect(f), min(direct, end))


def _tail(rng: np.random.Generator, sub: str, every: int) -> int:
    """How long a run goes on after a terminal cause before someone stops it."""
    if sub.startswith("nan"):
        return max(int(rng.integers(3, 60)), 3 * every)
    if sub == "pinned_floor":
        return _logu_int(rng, max(60, 10 * every), 600)
    return _logu_int(rng, max(100, 12 * every), 800)


def _rollback(rng: np.random.Generator, kind: str, effect: int, b: dict) -> Resume | None:
    """The operator's resume after the trigger (first seen at step ``effect``): from a checkpoint that a
    healthy logged row after it vouches for, skipping the batches up to where training stopped."""
    every = b["log_every"]
    onset = -(-effect // every) * every
    limit = onset - every  # the last logged step before the onset
    ckpts = [c for c in range(b["ckpt_every"], limit, b["ckpt_every"])]
    if not ckpts:
        return None
    c = ckpts[-2] if len(ckpts) > 1 and rng.random() < 0.25 else ckpts[-1]
    at = onset + every * int(rng.integers(2, 6)) + int(rng.integers(0, 40))
    if at >= b["num_steps"] // 2 + 200:
        return None
    return Resume(at, c, at - c + int(rng.integers(0, 60)), 0.5 if kind == "divergence" else
                  float(rng.choice([1.0, 0.5])), skip_steps=bool(rng.random() < 0.5))


def _placed(rng: np.random.Generator, b: dict) -> tuple[list[tuple[str, str, int, int]], Resume | None]:
    """(kind, subtype, step, segment) of every cause, and the rollback when the run has one."""
    every, n = b["log_every"], b["num_steps"]
    causes = _causes(rng, b["fp16"])
    rolls = bool(causes) and causes[0][0] in TRIGGERS and rng.random() < 0.3
    plan = causes[:1] if rolls else _terminal_last(rng, causes)
    pos = _positions(rng, len(plan), MIN_OBS * every, n // 2 if rolls else n - 10 * every, b)
    placed = [(k, sub, s, 0) for (k, sub), s in zip(plan, pos)]
    if not (rolls and placed):
        return placed, None
    k, sub, s, _ = placed[0]
    resume = _rollback(rng, k, s + 1 if sub in ("lr_burst", "lr_jump", "lr_grow", "lr_ramp") else s, b)
    if resume is None:
        return placed, None
    first = resume.from_ckpt + 1 + (resume.num_skip if resume.skip_steps else 0)
    plan = _terminal_last(rng, causes[1:])
    pos = _positions(rng, len(plan), first + MIN_OBS // 2 * every, n - 10 * every, b)
    return placed + [(k, sub, s, 1) for (k, sub), s in zip(plan, pos)], resume


def draw_run(run: str, rng: np.random.Generator) -> FreshRun:
    """One fresh run: its spec (faults included), its causes and its run.json extras."""
    b, meta = _background(rng, run)
    placed, resume = _placed(rng, b)
    every, n = b["log_every"], b["num_steps"]
    offset = resume.num_skip if resume is not None and not resume.skip_steps else 0
    last_seg = 1 if resume is not None else 0
    faults: list[Fault] = []
    injections = []
    for kind, sub, s, seg in placed:
        fs = _faults(rng, sub, s, seg, offset if seg else 0, every)
        if seg == 0 and resume is not None and fs[0].length == FOREVER and fs[0].kind == "overflow":
            fs = (replace(fs[0], length=resume.at_step - s + 1),)  # pinned until the operator rolled back
        if sub in TERMINAL and seg == last_seg:
            n = min(n, s + _tail(rng, sub, every))
        end = resume.at_step if seg == 0 and resume is not None else n - 1
        faults += fs
        injections.append(make_injection(kind, sub, fs, s, seg, end))
    b.update(num_steps=n, faults=tuple(faults), resume=resume,
             scenario="+".join([sub for _, sub, _, _ in placed] + (["rollback"] if resume else [])) or "clean")
    if any(sub == "pinned_floor" for _, sub, _, _ in placed):
        b["min_scale"] = 1.0
    return FreshRun(HeldoutSpec(**b), tuple(injections), meta)


def knobs(spec: HeldoutSpec) -> dict:
    """What the report needs to know of a run besides its labels (the log interval sets the match window)."""
    clock = "noisy" if spec.clock.wander_sd > 0 else "steady"
    return {"log_every": spec.log_every, "num_steps": spec.num_steps, "ckpt_every": spec.ckpt_every,
            "fp16": spec.fp16, "batch": spec.batch, "embed": spec.embed, "hidden": spec.hidden,
            "schedule": spec.schedule, "warmup": spec.warmup, "clock": clock}
