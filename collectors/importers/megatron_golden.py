"""Megatron-LM "golden values" JSON: one series per metric, sampled every ``step_interval`` steps.

``{"lm loss": {"start_step": 1, "end_step": 51000, "step_interval": 5,
"values": {"1": 12.95, "5": "nan", ...}}, "iteration-time": {...}}``.
The string ``"nan"`` marks a step where the metric was not recorded (the CI
pads every series to ``end_step``), so it becomes null; a JSON ``NaN`` number
is a real NaN measurement and is kept. ``lm loss`` -> loss, ``iteration-time``
-> ``step_time`` (seconds), other metrics -> extras (``num-zeros`` ->
``num_zeros``). Steps where every metric is missing are dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import build_table, parse_each, sanitize_name

NAMES = {
    "lm loss": "loss", "loss": "loss", "iteration-time": "step_time", "iteration_time": "step_time",
    "grad-norm": "grad_norm", "grad norm": "grad_norm", "lr": "lr", "learning-rate": "lr",
    "loss-scale": "loss_scale", "loss scale": "loss_scale",
}
EXPECTED = '{"<metric>": {"start_step": int, "end_step": int, "step_interval": int, "values": {"<step>": number | "nan"}}}'


def sniff(head: str) -> bool:
    """True for a JSON object whose first metric has ``start_step`` and ``values``."""
    text = head.lstrip()
    return text.startswith("{") and '"start_step"' in text[:4096] and '"values"' in text[:4096]


def _line_of(text: str, key: str) -> int | None:
    pos = text.find(json.dumps(key))
    return text.count("\n", 0, pos) + 1 if pos >= 0 else None


def _series(text: str, path: Path, key: str, spec: object) -> tuple[np.ndarray, np.ndarray]:
    """Steps and values of one metric (missing -> NaN with a separate mask by the caller)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("values"), dict):
        raise LogFormatError(path, _line_of(text, key), f"expected {EXPECTED} for metric {key!r}")
    steps, values = [], []
    for step, value in spec["values"].items():
        try:
            s = int(step)
        except ValueError:
            raise LogFormatError(path, _line_of(text, key), f"expected an integer step key in {key!r}, got {step!r}") from None
        if isinstance(value, str) and value.strip().lower() == "nan":
            value = None  # padding for a step the run did not record
        elif value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise LogFormatError(path, _line_of(text, key), f"expected a number or \"nan\" at step {step} of {key!r}, got {value!r}")
        steps.append(s)
        values.append(value)
    return np.array(steps, dtype=np.int64), np.array([math.inf if v is None else v for v in values], dtype=object)


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise LogFormatError(path, err.lineno, f"expected a JSON object ({err.msg})") from None
    if not isinstance(obj, dict) or not obj:
        raise LogFormatError(path, 1, f"expected {EXPECTED}")
    series: dict[str, dict[int, float | None]] = {}
    num_skipped = 0
    for key, spec in obj.items():
        try:
            steps, values = _series(text, path, key, spec)
        except LogFormatError:
            if not skip_bad_lines:
                raise
            num_skipped += 1
            continue
        name = NAMES.get(key.strip().lower(), sanitize_name(key))
        col = series.setdefault(name, {})
        for s, v in zip(steps.tolist(), values.tolist()):
            col[s] = None if v is math.inf else float(v)
    all_steps = np.array(sorted({s for col in series.values() for s, v in col.items() if v is not None}), dtype=np.int64)
    if not len(all_steps):
        raise LogFormatError(path, None, "no recorded values found (every value is \"nan\")")
    columns: dict[str, pa.Array] = {"step": pa.array(all_steps)}
    for name, col in series.items():
        columns[name] = pa.array([col.get(s) for s in all_steps.tolist()], pa.float64())
    return ParsedLog(build_table(columns), num_skipped=num_skipped)


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
