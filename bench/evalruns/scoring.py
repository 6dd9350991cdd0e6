"""Scoring predicted events against labelled ones: precision, recall, onset error, rollback.

Matching rule (the same for runwatch's findings and for the baselines):
- a prediction can match a label of the same kind in the same segment of the
  same run when its onset lies in ``[label.onset - w, label.end + w]``, with
  ``w = match_window(log_every)`` = max(10, 2 x log_every) steps; each label
  takes the closest-onset prediction (one to one);
- a ``dont_care`` label (an effect between negligible and clear, or one no
  logged row shows) is not counted, and predictions in its window are
  neither hits nor false alarms (spike and divergence absorb each other there);
- further predictions inside an already-matched label's window are
  *duplicates*: reported, but neither true nor false positives (a divergence
  that a baseline flags ten separate times is one detected event, and ten
  alerts);
- every other prediction is a false positive (on clean runs, all of them);
- strict kinds: a ``spike`` finding on a ``divergence`` label is a false
  positive for spike and leaves the divergence missed. The ``loss_excursion``
  row merges the two kinds, so the detectors are compared with the baselines
  (which cannot tell them apart) on equal terms;
- onset error = |predicted onset - labelled onset| in steps, over matches;
- alarm precision matches the warning/critical predictions alone; false
  alarms per 1M healthy steps counts the unmatched ones whose onset lies
  outside every label's and dont_care's window (any kind), over the logged
  steps outside those windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .truth import EXCURSION_KINDS

WINDOW_BEFORE = 10
WINDOW_AFTER = 10
EXCURSION = ("spike", "divergence")
ALARM = ("warning", "critical")


def match_window(log_every: int = 1) -> int:
    """Steps either side of a label a prediction's onset may lie: 10, or two log intervals on a coarse log."""
    return max(WINDOW_BEFORE, 2 * log_every)


@dataclass(frozen=True)
class Pred:
    kind: str
    onset: int
    end: int
    segment: int
    open: bool = True
    needs_action: bool = False
    severity: str = "warning"  # baselines page on every flag


@dataclass
class KindScore:
    num_labels: int = 0
    tp: int = 0
    fp: int = 0
    duplicates: int = 0
    ignored: int = 0  # predictions inside a dont_care window only
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


def _absorbs(lab: dict, kind: str, merge_excursions: bool) -> bool:
    """Whether a prediction of ``kind`` inside ``lab``'s window belongs to it (dont_care: spike ~ divergence)."""
    if lab.get("dont_care") and lab["kind"] in EXCURSION and kind in (*EXCURSION, "loss_excursion"):
        return True
    return _kind_of(lab["kind"], merge_excursions) == kind


def match_run(run: str, labels: list[dict], preds: list[Pred], scores: dict[str, KindScore],
              *, merge_excursions: bool = False, kinds: tuple[str, ...] | None = None,
              window: int = WINDOW_BEFORE) -> dict[int, Pred]:
    """Match one run's predictions to its labels, adding to ``scores``; returns label index -> match."""
    matched: dict[int, Pred] = {}
    used: set[int] = set()
    order = sorted((i for i in range(len(labels)) if not labels[i].get("dont_care")), key=lambda i: labels[i]["onset"])
    for i in order:
        lab = labels[i]
        k = _kind_of(lab["kind"], merge_excursions)
        if kinds is not None and k not in kinds:
            continue
        sc = scores.setdefault(k, KindScore())
        sc.num_labels += 1
        lo, hi = lab["onset"] - window, lab["end"] + window
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
        near = [lab for lab in labels if _absorbs(lab, k, merge_excursions) and lab["segment"] == p.segment
                and lab["onset"] - window <= p.onset <= lab["end"] + window]
        if any(lab.get("dont_care") for lab in near) and not any(not lab.get("dont_care") for lab in near):
            sc.ignored += 1
        elif near:
            sc.duplicates += 1
        else:
            sc.fp += 1
            sc.false_alarms.append(f"{run} ({p.kind} onset {p.onset}, segment {p.segment})")
    return matched


MISS_CLASSES = ("inside another fault that needs action", "inside another fault that needs none",
                "found as the other kind", "inside a finding open since before it", "found nowhere")
"""Why a spike or divergence label was missed, the first that applies:
- *inside another fault*: its onset lies inside an earlier labelled fault's excursion in the same segment, a fault
  that changed the weights or skipped their updates (``truth.EXCURSION_KINDS``: a stall or slowdown leaves them);
  split by whether that one needs action, where the clean twin, fault-free on both counts, can no longer size
  the second;
- *found as the other kind*: a divergence (or spike) prediction in its window, the kind the cause was read as;
- *inside a finding open since before it*: a loss-kind prediction that began earlier and was still open at its
  onset (one episode, two labels);
- *found nowhere*: none of these (a prediction the one-to-one matching gave to another label counts for them too,
  so one that began after this onset and went to a neighbour leaves it here)."""


def miss_class(lab: dict, labels: list[dict], preds: list[Pred], window: int) -> str:
    """The class (``MISS_CLASSES``) of a missed spike or divergence label ``lab`` among its run's labels and
    predictions (``window``: ``match_window`` of the run)."""
    seg, onset = lab["segment"], lab["onset"]
    outer = [o for o in labels if o is not lab and o["kind"] in EXCURSION_KINDS and o["segment"] == seg
             and not o.get("dont_care") and o.get("subtype") != "natural" and o["onset"] < onset <= o["end"]]
    if outer:
        return MISS_CLASSES[0] if any(o.get("needs_action") for o in outer) else MISS_CLASSES[1]
    loss = [p for p in preds if p.segment == seg and p.kind in EXCURSION]
    if any(p.kind != lab["kind"] and onset - window <= p.onset <= lab["end"] + window for p in loss):
        return MISS_CLASSES[2]
    if any(p.onset < onset <= p.end for p in loss):
        return MISS_CLASSES[3]
    return MISS_CLASSES[4]


def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


@dataclass
class FalseAlarms:
    """Warning/critical predictions outside every label's window, over the logged steps outside them."""

    healthy_steps: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    after_a_fault: int = 0
    """Of those, the ones after an injected fault's onset in the same segment (a dont_care one included): the
    run's weights differ from its twin's there, so the twin can no longer vouch that the run is healthy (an
    aftershock of an LR burst, a loss rise while every step is skipped). Reported beside the total, never
    subtracted from it."""

    def add_run(self, steps: np.ndarray, segments: np.ndarray, labels: list[dict], preds: list[Pred],
                window: int, merge_excursions: bool = False) -> None:
        inside = np.zeros(len(steps), dtype=bool)
        for lab in labels:
            inside |= (segments == lab["segment"]) & (steps >= lab["onset"] - window) & (steps <= lab["end"] + window)
        self.healthy_steps += int((~inside).sum())
        for p in preds:
            if p.severity in ALARM and not any(lab["segment"] == p.segment and
                                               lab["onset"] - window <= p.onset <= lab["end"] + window
                                               for lab in labels):
                k = _kind_of(p.kind, merge_excursions)
                self.by_kind[k] = self.by_kind.get(k, 0) + 1
                self.after_a_fault += any(lab["segment"] == p.segment and lab.get("subtype") != "natural"
                                          and lab["onset"] < p.onset for lab in labels)

    def per_million(self, kind: str) -> float:
        return 1e6 * self.by_kind.get(kind, 0) / self.healthy_steps if self.healthy_steps else float("nan")


@dataclass(frozen=True)
class Row:
    """One line of the report: a method's scores on one kind."""

    method: str
    kind: str
    all: KindScore  # every finding, info included
    alarms: KindScore  # warning and critical findings only
    false_alarms_per_million: float
    rollback: str = ""


def table(rows: list[Row]) -> str:
    """Markdown, the same for every set: labelled, found, both precisions, recall, onset error, false alarms."""
    out = ["| method | kind | labelled | found | alarm precision | precision (all findings) | recall | "
           "median onset error (steps) | false alarms / 1M healthy steps | rollback right |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r.method} | {r.kind} | {r.all.num_labels} | {r.all.tp} | {fmt(r.alarms.precision)} | "
                   f"{fmt(r.all.precision)} | {fmt(r.all.recall)} | {fmt(r.all.median_onset_error, 1)} | "
                   f"{fmt(r.false_alarms_per_million, 1)} | {r.rollback} |")
    return "\n".join(out)
