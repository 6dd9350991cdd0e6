"""Labelled runs, part 1: a tiny real torch training loop with injectable faults.

The detector evaluation needs runs whose faults are known exactly. This module
trains a small MLP language model on CPU (synthetic order-2 Markov tokens) and
injects faults by *acting on the real training*: learning-rate bursts and
ramps, corrupted batches, NaN weights, inf gradients under a GradScaler,
checkpoint/resume with a skipped data window, a GradScaler with an fp16-like
ceiling (the scale overflows when it grows too large, the healthy sawtooth) and
optionally DeepSpeed's floor. Only wall time is simulated (a seeded clock: a
steady host or a noisy one), because real step times on a shared 2-core box are
noise that would make stall/slowdown labels meaningless.

The record's contract holds: a checkpoint at step s is saved after the update
of step s (the next logged step is s+1, and its data position is batch s+1),
and a resume from it carries step s.

Training is deterministic on one CPU thread: two runs of the same spec that
differ only in ``faults`` are bit-identical until the first fault acts (the
fresh set's counterfactual labels rely on this).

The output is a list of record rows and events in the form
``runwatch.collectors.importers.base.ParsedLog`` takes, so runs land in a real
store through ``write_import``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

VOCAB = 64
CONTEXT = 8
EMBED = 16
HIDDEN = 64
POOL = 8192  # sequences per run; batches cycle through a fixed permutation


@dataclass(frozen=True)
class Fault:
    """One injected fault. ``step`` is the first step it acts on; ``length`` steps in all."""

    # lr_burst | lr_jump | lr_grow | lr_ramp | weight_growth | bad_batch | nan_weight | nan_grad | overflow
    # | stall | slowdown
    kind: str
    step: int  # bad_batch: the data position (batch index), which a resume's skip window can jump over
    length: int = 1
    factor: float = 1.0  # lr multiplier, growth rate, gap or slowdown factor; bad_batch: share of the batch corrupted
    every: int = 1  # overflow bursts: one overflow every `every` steps
    segment: int = 0  # only acts in this segment


@dataclass(frozen=True)
class Resume:
    """Roll back: at the end of step ``at_step`` restart from checkpoint ``from_ckpt``, skipping batches.

    The new segment reads batch ``from_ckpt + 1 + num_skip`` first; its first
    step is ``from_ckpt + 1``, or ``from_ckpt + 1 + num_skip`` when the step
    counter skips with the data (``skip_steps``).
    """

    at_step: int
    from_ckpt: int
    num_skip: int
    lr_factor: float = 0.5
    skip_steps: bool = False


@dataclass(frozen=True)
class HostClock:
    """The simulated host's step time: lognormal jitter, plus (a noisy host) slow wander and hiccups."""

    jitter: float = 0.05  # sd of log step time, drawn afresh each step
    wander_sd: float = 0.0  # noisy host: stationary sd of an AR(1) process on log step time
    wander_phi: float = 0.0  # its lag-1 correlation: 0.9-0.97 wanders for tens of steps
    hiccup_rate: float = 0.0  # chance per step that a hiccup (a few slow steps) starts
    hiccup_factor: float = 1.0  # step time multiplier during a hiccup


@dataclass(frozen=True)
class RunSpec:
    run: str
    scenario: str
    seed: int
    num_steps: int
    batch: int = 32
    base_lr: float = 3e-3
    schedule: str = "const"  # const | cosine | step | linear | cosine_restarts | multistep
    warmup: int | None = None  # linear warm-up steps; None: cosine's own max(n // 10, 20), none for the others
    embed: int = EMBED
    hidden: int = HIDDEN
    ckpt_every: int = 50
    fp16: bool = False  # a GradScaler, with ordinary single overflows when `normal_overflows`
    normal_overflows: tuple[int, ...] = ()
    startup_overflows: int = 0
    growth_interval: int = 50
    init_scale: float = 2.0**16
    scale_ceiling: float | None = None  # fp16's range: a step whose scale is at or above this overflows
    min_scale: float | None = None  # DeepSpeed's min_loss_scale: the scale never backs off below it
    step_seconds: float = 1.0
    clock: HostClock = HostClock()
    faults: tuple[Fault, ...] = ()
    resume: Resume | None = None
    clip: float = 1.0


class TinyLM(torch.nn.Module):
    """Embedding -> two GELU layers -> vocabulary head; ``h`` is the final-layer activation."""

    def __init__(self, embed: int = EMBED, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, embed)
        self.fc1 = torch.nn.Linear(CONTEXT * embed, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, VOCAB)

    def forward(self, x_BC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h_BH = F.gelu(self.fc1(self.emb(x_BC).flatten(1)))
        h_BH = self.fc2(h_BH)  # the final layer's output, before the head: the OPT act-norm signal
        return self.head(h_BH), h_BH


def make_pool(seed: int) -> torch.Tensor:
    """POOL sequences of CONTEXT+1 tokens from a random sparse first-order Markov chain.

    Four successors per token keep the achievable loss near 1 nat, far below
    uniform (ln 64 = 4.16), so a divergence back towards uniform is visible.
    """
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, VOCAB, size=(VOCAB, 4))
    probs = rng.dirichlet(np.full(4, 0.7), size=VOCAB)
    cum = probs.cumsum(-1)
    seq = np.empty((POOL, CONTEXT + 1), dtype=np.int64)
    seq[:, 0] = rng.integers(0, VOCAB, size=POOL)
    for t in range(1, CONTEXT + 1):
        a = seq[:, t - 1]
        u = rng.random(POOL)[:, None]
        pick = (u > cum[a]).sum(-1).clip(0, 3)
        seq[:, t] = succ[a, pick]
    return torch.from_numpy(seq)


@dataclass
class _State:
    """Everything a checkpoint holds, plus the loop's own position."""

    model: TinyLM
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    step: int = 0
    batch_idx: int = 0
    segment: int = 0
    clock: float = 0.0
    wander: float = 0.0  # the noisy host's AR(1) state (log step time)
    hiccup_left: int = 0
    rows: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    checkpoints: dict[int, dict] = field(default_factory=dict)


def _active(spec: RunSpec, st: _State, kind: str) -> Fault | None:
    for f in spec.faults:
        if f.kind == kind and f.segment == st.segment and f.step <= st.step < f.step + f.length:
            return f
    return None


def schedule_factor(spec: RunSpec, step: int) -> float:
    """The LR multiplier of the schedule at ``step``, warm-up included."""
    n = spec.num_steps
    w = spec.warmup if spec.warmup is not None else (max(n // 10, 20) if spec.schedule == "cosine" else 0)
    if step < w:
        return (step + 1) / w
    t, span = step - w, max(n - w, 1)
    if spec.schedule == "cosine":
        return 0.1 + 0.45 * (1 + math.cos(math.pi * t / span))
    if spec.schedule == "step":
        return 0.1 if step >= int(n * 0.6) else 1.0
    if spec.schedule == "linear":
        return max(1.0 - 0.95 * t / span, 0.05)
    if spec.schedule == "cosine_restarts":
        period = max(span // 3, 1)
        return 0.05 + 0.475 * (1 + math.cos(math.pi * (t % period) / period))
    if spec.schedule == "multistep":
        return 0.3 ** sum(step >= int(n * f) for f in (0.4, 0.75))
    return 1.0


def _lr(spec: RunSpec, st: _State) -> float:
    lr = spec.base_lr * schedule_factor(spec, st.step)
    if spec.resume is not None and st.segment > 0:
        lr *= spec.resume.lr_factor
    for f in spec.faults:
        if f.segment != st.segment or st.step < f.step:
            continue
        k = st.step - f.step
        if f.kind == "lr_burst" and k < f.length:
            lr *= f.factor
        elif f.kind == "lr_jump":
            lr *= f.factor
        elif f.kind in ("lr_grow", "lr_ramp"):
            lr *= f.factor ** (k + 1)
    return lr


def _batch(spec: RunSpec, st: _State, pool: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    idx = perm[(st.batch_idx * spec.batch + torch.arange(spec.batch)) % POOL]
    seq = pool[idx].clone()
    bad = [f for f in spec.faults if f.kind == "bad_batch" and f.step <= st.batch_idx < f.step + f.length]
    if bad:
        # A corrupted shard: tokens and targets from nowhere near the training distribution,
        # in the first `factor` of the batch's rows (the whole batch by default).
        g = torch.Generator().manual_seed(spec.seed * 7919 + st.batch_idx)
        junk = torch.randint(0, VOCAB, seq.shape, generator=g)
        junk[:, -1] = (junk[:, -2] * 7 + 3) % VOCAB  # a consistent wrong rule, so the gradient is large
        n = max(1, round(bad[0].factor * spec.batch))
        seq[:n] = junk[:n]
    return seq


def _inject_inf_grad(model: TinyLM) -> None:
    with torch.no_grad():
        model.fc1.weight.grad.view(-1)[0] = float("inf")


def _overflow_now(spec: RunSpec, st: _State, scale: float) -> bool:
    if st.segment == 0 and st.step < spec.startup_overflows:
        return True
    if spec.scale_ceiling is not None and scale >= spec.scale_ceiling:
        return True
    if st.step in spec.normal_overflows:
        return True
    f = _active(spec, st, "overflow")
    return f is not None and (st.step - f.step) % f.every == 0


def _train_step(spec: RunSpec, st: _State, pool: torch.Tensor, perm: torch.Tensor) -> dict:
    """One real optimizer step; returns the record row (values read back once, off any hot path)."""
    lr = _lr(spec, st)
    for group in st.opt.param_groups:
        group["lr"] = lr
    if _active(spec, st, "nan_weight"):
        with torch.no_grad():
            st.model.fc2.weight.view(-1)[0] = float("nan")
    seq = _batch(spec, st, pool, perm)
    logits, h_BH = st.model(seq[:, :-1])
    loss = F.cross_entropy(logits, seq[:, -1])
    st.opt.zero_grad(set_to_none=True)
    row: dict = {"step": st.step, "lr": lr}
    if st.scaler is not None:
        scale = st.scaler.get_scale()
        st.scaler.scale(loss).backward()
        if _overflow_now(spec, st, scale):
            _inject_inf_grad(st.model)
        st.scaler.unscale_(st.opt)
        gn = torch.nn.utils.clip_grad_norm_(st.model.parameters(), spec.clip)
        st.scaler.step(st.opt)
        st.scaler.update()
        # The scaler skipped the step iff it backed off (a gradient norm that overflows while every
        # gradient is finite is not a skip: the step ran, clipped to nothing).
        skipped = st.scaler.get_scale() < scale
        if spec.min_scale is not None and st.scaler.get_scale() < spec.min_scale:
            st.scaler.update(new_scale=float(spec.min_scale))  # DeepSpeed: "reducing to 1" stays at 1
        row.update(loss_scale=float(scale), found_inf=skipped)
    else:
        loss.backward()
        if _active(spec, st, "nan_grad"):
            _inject_inf_grad(st.model)
        gn = torch.nn.utils.clip_grad_norm_(st.model.parameters(), spec.clip)
        st.opt.step()
    grow = _active(spec, st, "weight_growth")
    if grow:
        # Weights creeping up (no effective weight decay at a rising LR): the final
        # layer's activations grow for many steps before the loss notices.
        with torch.no_grad():
            st.model.fc2.weight.mul_(grow.factor)
    row.update(loss=float(loss.detach()), grad_norm=float(gn),
               act_norm=float(h_BH.detach().norm(dim=-1).mean()))
    return row


def _host_factor(clock: HostClock, st: _State, rng: np.random.Generator) -> float:
    """This step's time over the base step time; the draws depend on the rng alone, never on faults."""
    log_dt = rng.normal(0.0, clock.jitter)
    if clock.wander_sd > 0:
        innovation = clock.wander_sd * math.sqrt(1 - clock.wander_phi**2)
        st.wander = clock.wander_phi * st.wander + rng.normal(0.0, innovation)
        if st.hiccup_left == 0 and rng.random() < clock.hiccup_rate:
            st.hiccup_left = int(rng.integers(1, 5))
        log_dt += st.wander
    if st.hiccup_left:
        st.hiccup_left -= 1
        log_dt += math.log(clock.hiccup_factor)
    return float(np.exp(log_dt))


def _advance_clock(spec: RunSpec, st: _State, rng: np.random.Generator) -> float:
    dt = spec.step_seconds * _host_factor(spec.clock, st, rng)
    if st.rows and st.rows[-1]["step"] % spec.ckpt_every == 0 and st.rows[-1]["step"] > 0:
        dt += 0.5 * spec.step_seconds  # the checkpoint write delays the next step a little
    slow = _active(spec, st, "slowdown")
    if slow:
        dt *= slow.factor
    stall = _active(spec, st, "stall")
    if stall:
        dt += stall.factor * spec.step_seconds
    st.clock += dt
    return st.clock


def _checkpoint(spec: RunSpec, st: _State) -> None:
    path = f"ckpt/{spec.run}/step-{st.step:06d}.pt"
    st.checkpoints[st.step] = {
        "model": copy.deepcopy(st.model.state_dict()), "opt": copy.deepcopy(st.opt.state_dict()),
        "scaler": copy.deepcopy(st.scaler.state_dict()) if st.scaler else None,
        "next_batch": st.batch_idx + 1,  # saved after step s's update: batch s is consumed
    }
    st.events.append({"event": "checkpoint", "step": st.step, "time": st.clock, "path": path,
                      "bytes": 52_000, "write_seconds": 0.5 * spec.step_seconds, "row_index": len(st.rows)})


def _resume(spec: RunSpec, st: _State) -> None:
    r = spec.resume
    ck = st.checkpoints[r.from_ckpt]
    st.model.load_state_dict(ck["model"])
    st.opt.load_state_dict(ck["opt"])
    if st.scaler is not None:
        st.scaler.load_state_dict(ck["scaler"])
    st.segment += 1
    st.step = r.from_ckpt + 1 + (r.num_skip if r.skip_steps else 0)
    first_skipped = ck["next_batch"]
    st.batch_idx = first_skipped + r.num_skip
    st.clock += 900.0  # the time it takes a person to notice, decide and requeue
    # The record's contract: a resume from the checkpoint of step s carries step s.
    st.events.append({"event": "resume", "step": r.from_ckpt, "time": st.clock, "row_index": len(st.rows),
                      "checkpoint": f"ckpt/{spec.run}/step-{r.from_ckpt:06d}.pt", "from_step": r.from_ckpt,
                      "skip_batches": [first_skipped, first_skipped + r.num_skip - 1],
                      "config": {"lr_factor": r.lr_factor}})


def train(spec: RunSpec) -> tuple[list[dict], list[dict]]:
    """Train the run described by ``spec``; return its record rows and events."""
    torch.manual_seed(spec.seed)
    pool = make_pool(spec.seed)
    perm = torch.randperm(POOL, generator=torch.Generator().manual_seed(spec.seed + 1))
    model = TinyLM(spec.embed, spec.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.base_lr, weight_decay=0.0)
    scaler = (torch.amp.GradScaler("cpu", init_scale=spec.init_scale, growth_interval=spec.growth_interval)
              if spec.fp16 else None)
    st = _State(model, opt, scaler, clock=1.7e9 + spec.seed * 1e6)
    rng = np.random.default_rng(spec.seed + 2)
    while st.step < spec.num_steps:
        row = _train_step(spec, st, pool, perm)
        row["time"] = _advance_clock(spec, st, rng)
        row["samples"] = (st.batch_idx + 1) * spec.batch
        row["tokens"] = row["samples"] * CONTEXT
        st.rows.append(row)
        if st.step > 0 and st.step % spec.ckpt_every == 0:
            _checkpoint(spec, st)
        if spec.resume is not None and st.segment == 0 and st.step == spec.resume.at_step:
            _resume(spec, st)
            continue
        st.step += 1
        st.batch_idx += 1
    return st.rows, st.events
