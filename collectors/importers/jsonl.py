"""Generic JSON Lines import: the contract other tools write to.

Metric line: ``{"step": 12, "loss": 2.3, "grad_norm": NaN, "my_metric": 0.5}``.
Event line:  ``{"event": "checkpoint", "step": 100, "path": "ckpt/100.pt"}``.
``NaN``/``Infinity`` tokens and ``null`` are accepted and kept as they are.
Events are the record's own: a checkpoint at step s holds the state after
update s, a resume from it carries s; the writer states it, nothing is shifted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import first_line
from runwatch.data.record import EVENT_KINDS, FLOAT_METRICS, is_valid_extra_name

INT_FIELDS = ("tokens", "samples")
PLACEMENT_FIELDS = ("segment", "rank")


def sniff(head: str) -> bool:
    """True when the first non-blank line is a JSON object with a step."""
    line = first_line(head)
    if line is None:
        return False
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and "step" in obj


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _as_int(v: object, name: str, minimum: int | None = None) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or (minimum is not None and v < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ValueError(f"'{name}' must be an integer{bound}, got {v!r}")
    if not -(2**63) <= v < 2**63:  # the store keeps 64-bit integers
        raise ValueError(f"'{name}' must fit in 64 bits, got {v!r}")
    return v


def parse_metric(obj: dict) -> dict:
    """Validate one metric object into a record row (raises ``ValueError``)."""
    row: dict = {"step": _as_int(obj["step"], "step")}
    for key, value in obj.items():
        if key == "step":
            continue
        if value is None:
            continue  # null: not measured at this step
        if key in FLOAT_METRICS or key == "time":
            if not _is_number(value):
                raise ValueError(f"'{key}' must be a number, NaN, Infinity or null, got {value!r}")
            row[key] = float(value)
        elif key in INT_FIELDS:
            if _is_number(value) and not math.isfinite(value):
                raise ValueError(f"'{key}' must be a finite integer, got {value!r}")
            row[key] = _as_int(value, key, 0)
        elif key == "found_inf":
            if value not in (True, False, 0, 1):
                raise ValueError(f"'found_inf' must be true, false, 0 or 1, got {value!r}")
            row[key] = bool(value)
        elif key in PLACEMENT_FIELDS:
            row[key] = _as_int(value, key, 0)
        elif _is_number(value) or isinstance(value, bool):
            if not is_valid_extra_name(key):
                raise ValueError(f"{key!r} is not usable as an extra scalar name")
            row[key] = float(value)
        # Strings, lists and objects on metric lines are annotations, not scalars.
    return row


def parse_event(obj: dict) -> dict:
    kind = obj.get("event")
    if kind not in EVENT_KINDS:
        raise ValueError(f"'event' must be one of {', '.join(EVENT_KINDS)}, got {kind!r}")
    if "step" not in obj:
        raise ValueError(f"a {kind} event needs a 'step'")
    ev = dict(obj)
    ev["step"] = _as_int(obj["step"], "step")
    for key in PLACEMENT_FIELDS:
        if obj.get(key) is not None:
            ev[key] = _as_int(obj[key], key, 0)
    if kind == "resume" and obj.get("skip_batches") is not None:
        skip = obj["skip_batches"]
        if not (isinstance(skip, list) and len(skip) == 2 and all(_is_number(x) for x in skip)):
            raise ValueError(f"'skip_batches' must be [first, last], got {skip!r}")
    return ev


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    rows: list[dict] = []
    events: list[dict] = []
    breaks: set[int] = set()
    num_skipped = 0
    first_with_segment: tuple[Path, int] | None = None
    first_without_segment: tuple[Path, int] | None = None
    for path in paths:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")  # per line, so a bad byte is reported (or skipped) with its line
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(f"expected one JSON object per line ({err.msg} at column {err.colno})") from err
                    if not isinstance(obj, dict):
                        raise ValueError("expected a JSON object")
                    if "event" in obj:
                        ev = parse_event(obj)
                        ev["row_index"] = len(rows)
                        events.append(ev)
                        if ev["event"] == "resume":
                            breaks.add(len(rows))
                    elif "step" in obj:
                        row = parse_metric(obj)
                        if "segment" in row:
                            first_with_segment = first_with_segment or (path, lineno)
                        else:
                            first_without_segment = first_without_segment or (path, lineno)
                        rows.append(row)
                    else:
                        raise ValueError("expected a metric line with 'step' or an event line with 'event'")
                except (ValueError, KeyError, TypeError) as err:
                    if skip_bad_lines:
                        num_skipped += 1
                        continue
                    raise LogFormatError(path, lineno, str(err)) from err
    if first_with_segment and first_without_segment:
        where, lineno = max(first_with_segment, first_without_segment, key=lambda pl: (paths.index(pl[0]), pl[1]))
        raise LogFormatError(where, lineno, "either every metric line carries 'segment' or none does "
                             f"(line {first_with_segment[1]} of {first_with_segment[0]} has one)")
    return ParsedLog.from_rows(rows, events=events, num_skipped=num_skipped, breaks=breaks)
