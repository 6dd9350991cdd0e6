"""Labelled runs, part 2: the scenario list and each run's ground truth.

Every run is a ``RunSpec`` (real training, see training.py) plus labels:
the injected events (kind, onset step, end step, segment) and, when the run
needs action, the correct rollback checkpoint by truth.py's rule (the latest
checkpoint strictly before the last logged step before the onset: c <= onset
- 2 on a per-step log). Fault steps are drawn at least 3 steps away from any
checkpoint so that an onset found one or two steps late cannot make a wrong
checkpoint look right, or the other way round (the fresh set does not avoid
them).

Label onset = the first step whose recorded consequence values (loss, gradient
norm, activation norm, non-finite values, found_inf / loss scale, wall time)
carry the fault (``first_effect``): an LR change at step s acts through update
s and first shows in the loss of step s+1; the step that trained on the
corrupt batch; the first overflow of a burst; the first slow or stalled step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .training import Fault, Resume, RunSpec
from .truth import right_checkpoint, spec_main_line

# Kinds a label (and a finding) can have.
KINDS = ("spike", "divergence", "scaler_collapse", "nan", "stall", "slowdown")
# Faults that act through the update of their step (the LR, a weight edit after it): seen from step + 1.
AFTER_UPDATE = ("lr_burst", "lr_jump", "lr_grow", "lr_ramp", "weight_growth")


def first_effect(fault: Fault) -> int:
    """The first step whose consequence values carry ``fault`` (the LR column is its cause, not its effect)."""
    return fault.step + 1 if fault.kind in AFTER_UPDATE else fault.step


@dataclass(frozen=True)
class Label:
    kind: str
    subtype: str
    onset: int
    end: int
    segment: int = 0
    needs_action: bool = False
    open: bool = True  # on the main line and not already rolled back
    dont_care: bool = False  # an effect between negligible and clear: a finding here is neither a hit nor a false alarm
    size: float | None = None  # the effect in the twin's noise sigmas (fresh set; 999 = non-finite)
    settled: int | None = None  # a label needing no action: the step from which the run is no worse than
    # before it (fresh set, v10); checkpoints from the step before it on hold no damage


@dataclass
class LabelledRun:
    spec: RunSpec
    labels: list[Label] = field(default_factory=list)
    rollback_step: int | None = None  # the correct checkpoint when the run needs action now

    @classmethod
    def judged(cls, spec: RunSpec, labels: list[Label]) -> "LabelledRun":
        """The run with its rollback truth from truth.py's rule, read off the spec."""
        return cls(spec, labels, right_checkpoint(labels, spec_main_line(spec)))

    @property
    def needs_action(self) -> bool:
        return any(lab.needs_action and lab.open and not lab.dont_care for lab in self.labels)

    def to_dict(self) -> dict:
        return {"run": self.spec.run, "scenario": self.spec.scenario, "seed": self.spec.seed,
                "labels": [asdict(lab) for lab in self.labels], "rollback_step": self.rollback_step,
                "needs_action": self.needs_action}


def _fault_step(rng: np.random.Generator, lo: int, hi: int, ckpt_every: int) -> int:
    while True:
        s = int(rng.integers(lo, hi))
        if 3 <= s % ckpt_every <= ckpt_every - 3:
            return s


def _last_ckpt_before(step: int, ckpt_every: int) -> int:
    return (step - 1) // ckpt_every * ckpt_every


def _base(rng: np.random.Generator, run: str, scenario: str, seed: int, **kw: object) -> dict:
    """Background variety shared by fault runs: schedule, batch, checkpoint cadence, step time."""
    base = dict(run=run, scenario=scenario, seed=seed, num_steps=int(rng.integers(480, 600)),
                batch=int(rng.choice([24, 32, 48])), schedule=str(rng.choice(["const", "cosine", "const"])),
                ckpt_every=int(rng.choice([40, 50])), step_seconds=float(rng.uniform(0.5, 3.0)))
    base.update(kw)
    return base


def _spike(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"spike-{i:02d}", "spike", 100 + i)
    s = _fault_step(rng, 220, 380, b["ckpt_every"])
    if i % 2 == 0:
        n = 2  # one-step bursts at these factors are within batch noise: not a labelled event
        fault = Fault("lr_burst", s, n, float(rng.uniform(25, 45)))
        sub = "lr_burst"
    else:
        n = int(rng.integers(1, 4))
        fault, sub = Fault("bad_batch", s, n), "bad_batch"
    spec = RunSpec(**b, faults=(fault,))
    return LabelledRun.judged(spec, [Label("spike", sub, first_effect(fault), first_effect(fault) + n - 1)])


def _divergence(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"divergence-{i:02d}", "divergence", 200 + i)
    sub = ("lr_jump", "lr_grow", "lr_ramp_act_growth")[i % 3]
    if sub == "lr_ramp_act_growth":
        s = _fault_step(rng, 180, 260, b["ckpt_every"])
        faults = (Fault("lr_ramp", s, 10_000, 1.005), Fault("weight_growth", s, 10_000, 1.01))
        b["num_steps"] = max(b["num_steps"], s + 330)
    elif sub == "lr_jump":
        s = _fault_step(rng, 220, 380, b["ckpt_every"])
        faults = (Fault("lr_jump", s, 10_000, float(rng.uniform(30, 60))),)
    else:
        s = _fault_step(rng, 220, 360, b["ckpt_every"])
        faults = (Fault("lr_grow", s, 10_000, float(rng.uniform(1.05, 1.1))),)
    spec = RunSpec(**b, faults=faults)
    label = Label("divergence", sub, first_effect(faults[0]), spec.num_steps - 1, needs_action=True)
    return LabelledRun.judged(spec, [label])


def _collapse(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"scaler-collapse-{i:02d}", "scaler_collapse", 300 + i, fp16=True,
              growth_interval=int(rng.choice([50, 100])))
    s = _fault_step(rng, 220, 380, b["ckpt_every"])
    every = 1 if i % 3 else 2
    n = int(rng.integers(10, 20)) * every
    # One ordinary overflow long before, so the detector sees what normal looks like.
    spec = RunSpec(**b, normal_overflows=(int(rng.integers(60, 150)),), faults=(Fault("overflow", s, n, every=every),))
    label = Label("scaler_collapse", "consecutive" if every == 1 else "every_other", s, s + n - 1, needs_action=True)
    return LabelledRun.judged(spec, [label])


def _nan(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"nan-{i:02d}", "nan", 400 + i)
    s = _fault_step(rng, 220, 380, b["ckpt_every"])
    sub = "nan_weight" if i % 2 == 0 else "nan_grad"
    b["num_steps"] = s + int(rng.integers(5, 40))  # a NaN run limps on for a while, then dies
    spec = RunSpec(**b, faults=(Fault(sub, s, 1),))
    return LabelledRun.judged(spec, [Label("nan", sub, s, spec.num_steps - 1, needs_action=True)])


def _stall(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"stall-{i:02d}", "stall", 500 + i, fp16=bool(i % 3 == 0))
    s = _fault_step(rng, 150, 450, b["ckpt_every"])
    spec = RunSpec(**b, faults=(Fault("stall", s, 1, float(rng.uniform(30, 300))),))
    return LabelledRun.judged(spec, [Label("stall", "gap", s, s)])


def _slowdown(i: int, rng: np.random.Generator) -> LabelledRun:
    b = _base(rng, f"slowdown-{i:02d}", "slowdown", 600 + i)
    s = _fault_step(rng, 150, 350, b["ckpt_every"])
    n = int(rng.integers(40, 120))
    spec = RunSpec(**b, faults=(Fault("slowdown", s, n, float(rng.uniform(1.6, 4.0))),))
    return LabelledRun.judged(spec, [Label("slowdown", "sustained", s, s + n - 1)])


def _rollback(i: int, rng: np.random.Generator) -> LabelledRun:
    """A fault on segment 0, then a resume from a healthy checkpoint with a skip window: history, not an alarm."""
    b = _base(rng, f"rollback-{i:02d}", "rollback", 700 + i)
    s = _fault_step(rng, 220, 340, b["ckpt_every"])
    ck = _last_ckpt_before(s, b["ckpt_every"])
    at = s + int(rng.integers(25, 60))
    if i % 2 == 0:
        fault, kind, sub = Fault("lr_jump", s, 10_000, float(rng.uniform(30, 60))), "divergence", "lr_jump"
    else:
        fault, kind, sub = Fault("bad_batch", s, 3), "spike", "bad_batch"
    spec = RunSpec(**b, faults=(fault,), resume=Resume(at, ck, s - ck + 40))
    label = Label(kind, sub, first_effect(fault), at, segment=0, needs_action=kind == "divergence", open=False)
    return LabelledRun.judged(spec, [label])


def _clean(i: int, rng: np.random.Generator) -> LabelledRun:
    sub = ("warmup_cosine", "step_decay", "tiny_noisy_batch", "fp16_normal_backoffs", "fp16_startup_calibration")[i % 5]
    kw: dict = {}
    if sub == "warmup_cosine":
        kw = dict(schedule="cosine")
    elif sub == "step_decay":
        kw = dict(schedule="step")
    elif sub == "tiny_noisy_batch":
        kw = dict(batch=int(rng.choice([2, 3, 4])), base_lr=1e-3)
    else:
        n = int(rng.integers(480, 600))
        every = rng.integers(60, 160, size=8).cumsum()
        kw = dict(fp16=True, num_steps=n, normal_overflows=tuple(int(x) for x in every if x < n),
                  growth_interval=int(rng.choice([50, 100])),
                  startup_overflows=int(rng.integers(3, 7)) if sub == "fp16_startup_calibration" else 0)
    b = _base(rng, f"clean-{i:02d}", f"clean:{sub}", 800 + i, **kw)
    return LabelledRun(RunSpec(**b))


MAKERS = {"spike": _spike, "divergence": _divergence, "scaler_collapse": _collapse, "nan": _nan,
          "stall": _stall, "slowdown": _slowdown, "rollback": _rollback, "clean": _clean}


def scenarios(counts: dict[str, int] | None = None, seed: int = 0) -> list[LabelledRun]:
    """The evaluation set: ``counts[name]`` runs of each scenario (defaults give ~20+ events per kind)."""
    counts = counts or {"spike": 24, "divergence": 21, "scaler_collapse": 21, "nan": 20, "stall": 20,
                        "slowdown": 20, "rollback": 10, "clean": 25}
    out = []
    for name, n in counts.items():
        rng = np.random.default_rng([seed, list(MAKERS).index(name)])
        out.extend(MAKERS[name](i, rng) for i in range(n))
    return out
