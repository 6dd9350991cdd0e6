"""Hugging Face Transformers ``Trainer`` stdout: the printed log dicts, or a ``trainer_state.json``.

The Trainer prints each ``self.log`` call as a Python dict, usually through a
tqdm bar (so a dict may follow ``\\r``-joined progress text on its line):

* training: ``{'loss': 2.3456, 'grad_norm': 1.234, 'learning_rate': 4.9e-05, 'epoch': 0.01}``
  (``grad_norm`` since 4.38; recent versions print floats as strings,
  ``{'loss': '2.346', ...}``; DeepSpeed runs of 4.38 may print
  ``'grad_norm': tensor(1.23, device='cuda:0')``; NaN prints as ``nan``);
* evaluation: ``{'eval_loss': 2.1, 'eval_runtime': 3.2, ..., 'epoch': 0.5}``;
* the end-of-training summary ``{'train_runtime': ..., 'train_loss': ...}``: not a
  row (it averages the whole run), counted as ignored.

Steps: a dict prints no step (unless it carries a ``step``/``global_step``
key). The training bar tqdm draws in the same stdout does: the Trainer prints a
dict once the step has ended and tqdm redraws the bar right after it, so a
dict's step is the bar's count next to it (``stepcount.step_of_lines``). When
some training dict has no bar count of its own (tqdm disabled, or the bar went
elsewhere), every dict is numbered in order instead (1, 2, 3, ...; with
``logging_steps`` > 1 these are log indices, not optimizer steps; ``epoch``, an
extra column, places them in the run) and the reading says so
(``ordinal_steps``). An eval dict without a step joins the row of the training
dict before it (a new row at that step + 1 when none came yet).
Mapping: ``loss`` -> loss, ``grad_norm``, ``learning_rate`` -> lr,
``eval_loss`` -> ``val_loss``, other ``eval_X`` -> ``eval_X``, anything else
numeric -> an extra of its sanitised name.

Events (printed with ``--log_level info``): ``Saving model checkpoint to
DIR/checkpoint-K`` -> a checkpoint event at K. The Trainer names the folder
after ``global_step`` once update K is done, so it holds the state after
update K (the record's contract; the next step logged is K+1). ``Continuing
training from global step K`` -> a resume event at K, which starts a segment.

A ``trainer_state.json`` (saved in every checkpoint directory) is read too: its
``log_history`` entries carry the real ``step``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.stepcount import find_counters, position, step_of_lines
from runwatch.collectors.importers.textlog import (
    NUMBER_RE,
    build_table,
    matches,
    merge_same_step,
    parse_each,
    read_text,
    sanitize_name,
)

_DICT_START = r"\{'(?:loss|eval_[a-z_]+|train_runtime|grad_norm|learning_rate)': "
_DICT = re.compile(r"\{'(?:loss|eval_[a-z_]+|train_runtime|grad_norm|learning_rate)': [^{}]*\}")
_SAVE = re.compile(r"Saving model checkpoint to (?P<path>\S*checkpoint-(?P<step>\d+)\S*)")
_RESUME = re.compile(r"Continuing training from global step (?P<step>\d+)")
_EVENT_START = r"Saving model checkpoint to |Continuing training from global step "
_PAIR = re.compile(r"'(?P<key>[^']+)': (?P<value>'[^']*'|tensor\([^)]*\)|[^,}]+)")
_NUMBER = re.compile(rf"^\s*'?(?:tensor\()?(?P<num>{NUMBER_RE})")
_NAMES = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr", "eval_loss": "val_loss",
          "step": "step", "global_step": "step"}


def sniff(head: str) -> bool:
    """True for a Trainer stdout holding a log dict, or a trainer_state.json."""
    if head.lstrip().startswith("{") and '"log_history"' in head:
        return True
    return re.search(_DICT_START + r"'?" + NUMBER_RE, head) is not None


def _value(raw: str) -> float | None:
    """The number of a printed value (``1.2``, ``'1.2'``, ``nan``, ``tensor(1.2, ...)``); None if not a number."""
    m = _NUMBER.match(raw)
    if m is None:
        return None
    return float(m["num"]) if m["num"].lower() not in ("nan",) else math.nan


def _rows_from_dicts(dicts: list[tuple[int, dict[str, float]]], counted: np.ndarray | None = None) -> list[dict[str, float]]:
    """Rows from log dicts in order (``counted``: each dict's step from the bar, -1 for none); eval dicts join
    the training row before them."""
    rows: list[dict[str, float]] = []
    for k, (_, d) in enumerate(dicts):
        is_eval = any(key.startswith("eval_") for key in d)
        row: dict[str, float] = {}
        for key, value in d.items():
            row[_NAMES.get(key) or sanitize_name(key)] = value
        if "step" not in row and counted is not None and counted[k] >= 0:
            row["step"] = float(counted[k])
        if "step" not in row:
            last = rows[-1]["step"] if rows else 0
            row["step"] = last if is_eval and rows else last + 1
        if is_eval and "epoch" in row and rows and rows[-1]["step"] == row["step"]:
            row["eval_epoch"] = row.pop("epoch")  # the training row at this step keeps its own epoch
        rows.append(row)
    return rows


def _table(rows: list[dict[str, float]], path: Path) -> pa.Table:
    if not rows:
        raise LogFormatError(path, None, "no Trainer log dicts ({'loss': ...}) found")
    names = list(dict.fromkeys(k for r in rows for k in r))
    columns: dict[str, pa.Array] = {}
    for name in names:
        vals = [r.get(name) for r in rows]
        if name == "step":
            columns[name] = pa.array([int(v) for v in vals], pa.int64())
        else:
            columns[name] = pa.array(np.array([np.nan if v is None else v for v in vals], dtype=np.float64),
                                     mask=np.array([v is None for v in vals]))
    return build_table(columns)


def _parse_state(path: Path) -> ParsedLog:
    try:
        history = json.loads(path.read_text())["log_history"]
    except (ValueError, KeyError, TypeError) as err:
        raise LogFormatError(path, None, f"expected a trainer_state.json with a 'log_history' list ({err})") from None
    dicts, num_ignored = [], 0
    for entry in history:
        if not isinstance(entry, dict):
            raise LogFormatError(path, None, f"expected log_history entries to be objects, got {entry!r:.80}")
        d = {k: float(v) for k, v in entry.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "total_flos"}
        if "step" not in d:
            raise LogFormatError(path, None, f"expected a 'step' in every log_history entry, got {entry!r:.80}")
        if "train_runtime" in d:
            num_ignored += 1  # the end-of-training summary: an average over the run, not a step
            continue
        dicts.append((0, d))
    return merge_same_step(ParsedLog(_table(_rows_from_dicts(dicts), path), num_ignored=num_ignored))


def _event(text: str) -> dict | None:
    if m := _SAVE.search(text):
        return {"event": "checkpoint", "step": int(m["step"]), "path": m["path"]}
    if m := _RESUME.search(text):
        return {"event": "resume", "step": int(m["step"])}
    return None


def _scan(path: Path, lines: pa.Array, skip: bool) -> tuple[list, list, int, int]:
    """Log dicts and events as (position, dict) in stream order, and the bad and ignored counts."""
    idx = np.flatnonzero(matches(lines, f"{_DICT_START}|{_EVENT_START}"))
    dicts, events, skipped, ignored = [], [], 0, 0
    for i, text in zip(idx.tolist(), lines.take(pa.array(idx, pa.int64())).to_pylist()):
        for m in _DICT.finditer(text):
            d: dict[str, float] = {}
            for pair in _PAIR.finditer(m.group(0)):
                value = _value(pair["value"])
                if value is not None and pair["key"] != "total_flos":
                    d[pair["key"]] = value
            if not d or ("loss" in m.group(0)[:8] and "loss" not in d):
                if not skip:
                    raise LogFormatError(path, i + 1, f"expected a Trainer log dict of numbers, got {m.group(0)[:200]!r}")
                skipped += 1
            elif "train_runtime" in d:
                ignored += 1  # the end-of-training summary: an average over the run, not a step
            else:
                dicts.append((position(i, m.start(), len(text)), d))
        if (ev := _event(text)) is not None:
            events.append((float(i), ev))
        elif "Saving model checkpoint to " in text:
            ignored += 1  # the final save_model(): no step in its folder name
    return dicts, events, skipped, ignored


def _bar_steps(lines: pa.Array, raw: bytes | None, dicts: list[tuple[float, dict[str, float]]]) -> np.ndarray | None:
    """Each dict's step from the training bar, or None when some training dict has none (see the docstring)."""
    at = np.array([p for p, _ in dicts], dtype=np.float64)
    counted = step_of_lines(*find_counters(lines, at, raw=raw, kinds=("tqdm",)), at)
    needs = np.array([not any(k.startswith("eval_") for k in d) and "step" not in d and "global_step" not in d
                      for _, d in dicts], dtype=bool)
    return None if (counted[needs] < 0).any() or (counted < 0).all() else counted


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    with open(path, "rb") as f:
        start = f.read(4096).lstrip()
    if start.startswith(b"{") and b'"log_history"' in path.read_bytes()[:1 << 20]:
        return _parse_state(path)
    lines, raw = read_text(path)
    dicts, events, skipped, ignored = _scan(path, lines, skip_bad_lines)
    counted = _bar_steps(lines, raw, dicts) if dicts else None
    table = _table(_rows_from_dicts(dicts, counted), path)
    positions = np.array([p for p, _ in dicts], dtype=np.float64)
    ordinal = counted is None and not any("step" in d or "global_step" in d for _, d in dicts)
    evs = [{**ev, "row_index": int(np.searchsorted(positions, pos))} for pos, ev in events]
    breaks = {ev["row_index"] for ev in evs if ev["event"] == "resume"}
    return merge_same_step(ParsedLog(table, evs, skipped, breaks, positions, ordinal, ignored))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
