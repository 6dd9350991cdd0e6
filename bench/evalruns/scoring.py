"""Scoring predicted events against labelled ones: precision, recall, onset error, rollback.

Matching rule (the same for runwatch's findings and for the baselines):
- a prediction can match a label of the same kind in the same segment of the
  same run when its onset lies in ``[label.onset - WINDOW_BEFORE, label.end +
  WINDOW_AFTER]``; each label takes the closest-onset prediction (one to one);
- further predictions inside an already-matched label's window are
  *duplicates*: reported, but neither true nor false positives (a divergence
  that a baseline flags ten separate times is one detected event, and ten
  alerts);
- every other prediction is a false positive (on clean runs, all of them);
- strict kinds: a ``spike`` finding on a ``divergence`` label is a false
  positive for spike and leaves the divergence missed. The ``loss_excursion``
  row merges the two kinds, so the detectors are compared with the baselines
  (which cannot tell them apart) on equal terms;
- onset error = |predicted onset - labelled onset| in steps, over matches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

WINDOW_BEFORE = 10
WINDOW_AFTER = 10
EXCURSION = ("spike", "divergence")


@dataclass(frozen=True)
class Pred:
    kind: str
    onset: int
    end: int
    segment: int
    open: bool = True
    needs_action: bool = False


@dataclass
class KindScore:
    num_labels: int = 0
    tp: int = 0
    fp: int = 0
    duplicates: int = 0
    onset_errors: list[int] = field(default_factory=list)
    signed_errors: list[int] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    false_alarms: list[str] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else float("nan")

    @property
    def recall(self) -> float:
        return self.tp / self.num_labels if self.num_labels else float("nan")

    @property
    def median_onset_error(self) -> float:
        return float(np.median(self.onset_errors)) if self.onset_errors else float("nan")


def _kind_of(kind: str, merge_excursions: bool) -> str:
    return "loss_excursion" if merge_excursions and kind in EXCURSION else kind


def match_run(run: str, labels: list[dict], preds: list[Pred], scores: dict[str, KindScore],
              *, merge_excursions: bool = False, kinds: tuple[str, ...] | None = None) -> dict[int, Pred]:
    """Match one run's predictions to its labels, adding to ``scores``; returns label index -> match."""
    matched: dict[int, Pred] = {}
    used: set[int] = set()
    order = sorted(range(len(labels)), key=lambda i: labels[i]["onset"])
    for i in order:
        lab = labels[i]
        k = _kind_of(lab["kind"], merge_excursions)
        if kinds is not None and k not in kinds:
            continue
        sc = scores.setdefault(k, KindScore())
        sc.num_labels += 1
        lo, hi = lab["onset"] - WINDOW_BEFORE, lab["end"] + WINDOW_AFTER
        cands = [j for j, p in enumerate(preds) if j not in used and _kind_of(p.kind, merge_excursions) == k
                 and p.segment == lab["segment"] and lo <= p.onset <= hi]
        if not cands:
            sc.misses.append(f"{run} ({lab['subtype']}, onset {lab['onset']}, segment {lab['segment']})")
            continue
        j = min(cands, key=lambda j: abs(preds[j].onset - lab["onset"]))
        used.add(j)
        matched[i] = preds[j]
        sc.tp += 1
        sc.onset_errors.append(abs(preds[j].onset - lab["onset"]))
        sc.signed_errors.append(preds[j].onset - lab["onset"])
    for j, p in enumerate(preds):
        k = _kind_of(p.kind, merge_excursions)
        if j in used or (kinds is not None and k not in kinds):
            continue
        sc = scores.setdefault(k, KindScore())
        inside = any(_kind_of(lab["kind"], merge_excursions) == k and lab["segment"] == p.segment
                     and lab["onset"] - WINDOW_BEFORE <= p.onset <= lab["end"] + WINDOW_AFTER for lab in labels)
        if inside:
            sc.duplicates += 1
        else:
            sc.fp += 1
            sc.false_alarms.append(f"{run} ({p.kind} onset {p.onset}, segment {p.segment})")
    return matched


def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def table(rows: list[tuple[str, str, KindScore, str]]) -> str:
    """Markdown: one line per (method, kind) with P, R, onset error, rollback column."""
    out = ["| method | kind | labelled | found | false alarms | duplicates | precision | recall | "
           "median onset error (steps) | median signed error | rollback right |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for method, kind, sc, rollback in rows:
        signed = float(np.median(sc.signed_errors)) if sc.signed_errors else float("nan")
        out.append(f"| {method} | {kind} | {sc.num_labels} | {sc.tp} | {sc.fp} | {sc.duplicates} | "
                   f"{fmt(sc.precision)} | {fmt(sc.recall)} | {fmt(sc.median_onset_error, 1)} | "
                   f"{fmt(signed, 1)} | {rollback} |")
    return "\n".join(out)
