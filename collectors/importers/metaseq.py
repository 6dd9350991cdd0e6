"""fairseq / metaseq ``--log-format json`` stdout: ``... | train_inner | {"loss": "9.1", ...}``.

Records: ``train_inner`` (one per log interval) -> a row at ``num_updates``;
``valid`` -> ``val_<name>`` columns at ``valid_num_updates`` (``valid_loss`` ->
``val_loss``); ``train`` (end of epoch) -> ``epoch_<name>`` averages at
``train_num_updates``. Mapping: ``loss`` -> loss (fairseq reports it in bits,
base 2, as printed), ``gnorm`` -> grad_norm, ``loss_scale``, ``lr``,
``actv_norm`` (metaseq) -> act_norm; other numbers (wps, ups, wpb, bsz, ppl,
clip, train_wall, wall, ...) become extras. The line's ``YYYY-MM-DD HH:MM:SS``
prefix is the row's time (read as UTC). ``Saved checkpoint PATH (epoch E @ N
updates ...)`` -> a checkpoint event at N; ``Loaded checkpoint PATH (epoch E @ N
updates)`` -> a resume event at N that starts a new segment. fairseq's trainer
counts an update once it is applied and saves after it, so the file holds the
state after update N (the record's contract; the next ``num_updates`` logged is
N+1 or later).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import merge_same_step, parse_each, read_lines, sanitize_name
from runwatch.data.record import metrics_table

_RECORD = re.compile(r"\|\s*(train_inner|valid|train)\s*\|\s*(\{.*\})\s*$")
_CLAIM = r"\|\s*(?:train_inner|valid|train)\s*\|\s*\{"
_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_SAVED = re.compile(r"Saved checkpoint (\S+) \(epoch (\d+) @ (\d+) updates.*?(?:writing took ([0-9.]+) seconds)?\)?\s*$")
_LOADED = re.compile(r"Loaded checkpoint (\S+) \(epoch (\d+) @ (\d+) updates\)")
NAMES = {"loss": "loss", "gnorm": "grad_norm", "loss_scale": "loss_scale", "lr": "lr", "actv_norm": "act_norm"}
STEP_KEY = {"train_inner": "num_updates", "valid": "valid_num_updates", "train": "train_num_updates"}


def sniff(head: str) -> bool:
    """True when the head holds a fairseq/metaseq JSON progress record."""
    return re.search(r"\| (train_inner|valid|train) \| \{", head) is not None


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _row(kind: str, obj: dict, t: float | None) -> dict:
    step_key = STEP_KEY[kind]
    if step_key not in obj:
        raise ValueError(f"a {kind} record needs {step_key!r}")
    step = _number(obj[step_key])
    if step is None or not math.isfinite(step) or step != int(step) or step < 0:
        raise ValueError(f"{step_key!r} must be a non-negative integer, got {obj[step_key]!r}")
    row: dict = {"step": int(step)}
    if kind == "train_inner":
        row["time"] = t
    for key, value in obj.items():
        num = _number(value)
        if key == step_key or num is None:
            continue
        if kind == "train_inner":
            row[NAMES.get(key) or sanitize_name(key)] = num
        elif kind == "valid":
            name = key[len("valid_"):] if key.startswith("valid_") else key
            row[sanitize_name(name, "val_")] = num
        else:
            name = key[len("train_"):] if key.startswith("train_") else key
            row[sanitize_name(name, "epoch_")] = num
    return row


def _timestamp(line: str) -> float | None:
    m = _TIME.match(line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp() if m else None


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    lines = read_lines(path)
    pattern = f"{_CLAIM}|Saved checkpoint|Loaded checkpoint"
    idx = np.flatnonzero(pc.fill_null(pc.match_substring_regex(lines, pattern), False).to_numpy(zero_copy_only=False))
    rows, events, breaks, num_bad = [], [], set(), 0
    for i, line in zip(idx.tolist(), lines.take(pa.array(idx)).to_pylist()):
        t = _timestamp(line)
        if m := _SAVED.search(line):
            ev = {"event": "checkpoint", "step": int(m.group(3)), "path": m.group(1), "time": t, "row_index": len(rows)}
            if m.group(4):
                ev["write_seconds"] = float(m.group(4))
            events.append(ev)
            continue
        if m := _LOADED.search(line):
            events.append({"event": "resume", "step": int(m.group(3)), "path": m.group(1), "time": t, "row_index": len(rows)})
            breaks.add(len(rows))
            continue
        try:
            m = _RECORD.search(line)
            if not m:
                raise ValueError("expected '| train_inner | {json}' with the JSON object ending the line")
            obj = json.loads(m.group(2))
            if not isinstance(obj, dict):
                raise ValueError("expected a JSON object")
            rows.append(_row(m.group(1), obj, t))
        except ValueError as err:
            if not skip_bad_lines:
                raise LogFormatError(path, i + 1, str(err)) from None
            num_bad += 1
    if not rows:
        raise LogFormatError(path, None, f"no fairseq/metaseq train_inner/valid JSON records found in {path}")
    return merge_same_step(ParsedLog(metrics_table(rows), events, num_bad, breaks))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
