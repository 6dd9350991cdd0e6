"""Rank disagreement: data-parallel replicas whose replicated values differ, a silent-data-corruption suspect.

With replicated gradients (plain DDP: every rank holds the same gradients
after the all-reduce) every rank must log the same gradient norm at every
step, and the same parameter checksum (``Monitor(param_checksum_every=N)``,
computed on the device, read at flush). A value that differs beyond
floating-point tolerance means one replica computed or stored something
else: its update differs from the others' and the replicas have silently
drifted apart. The idea is Megatron's ``check_param_hashes_across_dp_replicas``.

Off unless the run says its gradients are replicated (``run.json``
``replicated_grads``: detected from ``DistributedDataParallel`` or declared);
under FSDP, ZeRO or tensor parallelism per-rank norms legitimately differ.
The odd ones out are the suspects when a majority agrees; with two replicas
(or no majority) every disagreeing rank is named, since either may be the
corrupt one. Non-finite values are compared by kind (NaN, +Inf, -Inf); a
NaN on one rank alone is also the ``nan`` detector's finding on that rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runwatch.detectors.finding import Finding
from runwatch.detectors.scanner import Observations, ScanContext


@dataclass
class _Suspect:
    first_index: int
    last_index: int
    num_steps: int = 0
    columns: dict[str, int] = field(default_factory=dict)  # column -> index of its first disagreement
    majority: bool = True
    first_values: dict[str, list] = field(default_factory=dict)


def _value_key(v: float, rtol: float, ref: float) -> object:
    """The class a value falls in: within ``rtol`` of ``ref``, another finite value, or its non-finite kind."""
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return "ref" if abs(v - ref) <= rtol * abs(ref) or v == ref else float(v)


def odd_ones_out(values: np.ndarray, rtol: float) -> tuple[list[int], bool]:
    """Columns whose value disagrees with the others' (one step), and whether a majority said so.

    Values within ``rtol`` of the majority's value agree; with no strict majority every column outside the
    largest agreeing group is named, or all columns when no group is larger than another.
    """
    finite = values[np.isfinite(values)]
    candidates = [float(np.median(finite))] if finite.size else []
    candidates += [float(v) for v in finite]
    best: tuple[int, list[object]] | None = None
    for ref in candidates:  # the reference value that the most columns agree with
        keys = [_value_key(v, rtol, ref) for v in values]
        count = keys.count("ref")
        if best is None or count > best[0]:
            best = (count, keys)
    if best is None:  # every value non-finite: group by kind
        keys = [_value_key(v, rtol, 0.0) for v in values]
        sizes = {k: keys.count(k) for k in keys}
        top = max(sizes.values())
        if list(sizes.values()).count(top) > 1:
            return list(range(len(values))), False
        winner = max(sizes, key=sizes.get)
        return [j for j, k in enumerate(keys) if k != winner], True
    count, keys = best
    odd = [j for j, k in enumerate(keys) if k != "ref"]
    if not odd:
        return [], True
    if 2 * count > len(values):
        return odd, True
    return list(range(len(values))), False  # no majority: any of them may be the corrupt one


class DisagreementScanner:
    """Incremental over one segment's steps that every rank logged (series 'ranks')."""

    def __init__(self, ctx: ScanContext) -> None:
        self.segment, self.cfg = ctx.segment, ctx.config.disagreement
        self.active = ctx.meta.get("replicated_grads") is True
        self.pos = 0
        self.suspects: dict[int, _Suspect] = {}  # column -> what it disagreed on
        self.rtol = {"grad_norm": self.cfg.grad_rtol, "param_norm": self.cfg.param_rtol}

    def advance(self, obs: Observations) -> None:
        n = len(obs["step"])
        if not self.active or n <= self.pos or len(obs["rank"]) < 2:
            self.pos = n
            return
        for col, rtol in self.rtol.items():
            if col not in obs:
                continue
            values, present = obs[col][self.pos:n], obs[col + "_present"][self.pos:n]
            for i in _suspect_rows(values, present, rtol):
                self._note(col, self.pos + int(i), values[i], present[i], rtol)
        self.pos = n

    def _note(self, col: str, i: int, values: np.ndarray, present: np.ndarray, rtol: float) -> None:
        cols = np.flatnonzero(present)
        odd, majority = odd_ones_out(values[cols], rtol)
        for j in cols[odd]:
            s = self.suspects.setdefault(int(j), _Suspect(first_index=i, last_index=i))
            if col not in s.columns:
                s.columns[col] = i
                s.first_values[col] = [None if np.isnan(v) else float(v) for v in np.where(present, values, np.nan)]
            s.first_index, s.last_index = min(s.first_index, i), max(s.last_index, i)
            s.num_steps += 1
            s.majority = s.majority and majority

    def findings(self, obs: Observations) -> list[Finding]:
        steps, ranks = obs["step"], obs["rank"]
        out = []
        for j, s in sorted(self.suspects.items()):
            rank = int(ranks[j])
            col = min(s.columns, key=s.columns.get)
            first = int(steps[s.columns[col]])
            values = {int(r): v for r, v in zip(ranks, s.first_values[col])}
            others = [v for r, v in values.items() if r != rank and v is not None]
            what = {"grad_norm": "gradient norm", "param_norm": "parameter checksum"}.get(col, col)
            message = (f"rank {rank}'s {what} differs from the other replicas' from step {first} "
                       f"({_fmt(values[rank])} vs {', '.join(_fmt(v) for v in others) or 'none'}), "
                       f"{s.num_steps} time(s): a silent-data-corruption suspect"
                       + ("" if s.majority else "; with no majority to say which replica is wrong, every "
                          "disagreeing rank is a suspect"))
            evidence = {"column": col, "first_step": {c: int(steps[i]) for c, i in s.columns.items()},
                        "values_at_first": {str(r): v for r, v in values.items()}, "majority": s.majority,
                        "num_disagreements": s.num_steps, "rtol": self.rtol[col], "detected_step": first}
            out.append(Finding(kind="rank_disagreement", onset_step=int(steps[s.first_index]),
                               end_step=int(steps[s.last_index]), peak_step=first, segment=self.segment,
                               severity="critical", self_recovered=False, needs_action=True,
                               evidence=evidence, message=message, rank=rank))
        return out


def _suspect_rows(values: np.ndarray, present: np.ndarray, rtol: float) -> np.ndarray:
    """Rows where the present values do not all agree (vectorised; the rare rows that fail are examined one
    by one)."""
    with np.errstate(all="ignore"):
        big = np.where(present, values, -np.inf).max(axis=1)
        small = np.where(present, values, np.inf).min(axis=1)
        all_finite = np.all(~present | np.isfinite(values), axis=1)
        agree = all_finite & ((big - small <= rtol * np.abs(small)) | (big == small))
        any_nonfinite = np.any(present & ~np.isfinite(values), axis=1)
    # Rows where every value is the same non-finite kind also agree (the scaler skips on every rank alike).
    same_kind = np.array([len({str(v) for v in row[p]}) <= 1 for row, p in zip(values, present)]) if \
        any_nonfinite.any() else np.zeros(len(values), bool)
    return np.flatnonzero((np.sum(present, axis=1) >= 2) & ~agree & ~same_kind)


def _fmt(v: float | None) -> str:
    return "missing" if v is None else f"{v:.9g}"
