"""llm.c training logs: ``s:N trl:LOSS lr:LR norm:GNORM`` and ``s:N tel:VAL_LOSS``.

The older format has ``s:N trl:LOSS`` only. Validation (``tel``) is stored as
``val_loss``; a validation line at the step of a training line joins its row.
Lines that do not start with ``s:<digit>`` are ignored; one that does but does
not parse is an error naming the file and line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import (
    NUMBER_RE, build_table, pick, first_bad, merge_same_step, parse_each, read_lines, to_float, to_int,
)

_STEP_LINE = r"^s:\d"
_FIELDS = {"trl": "loss", "tel": "val_loss", "lr": "lr", "norm": "grad_norm"}
_LINE = (rf"^s:(?P<step>\d+)(?: trl:(?P<trl>{NUMBER_RE}))?(?: tel:(?P<tel>{NUMBER_RE}))?(?: lr:(?P<lr>{NUMBER_RE}))?"
         rf"(?: norm:(?P<norm>{NUMBER_RE}))?\s*$")
EXPECTED = "an llm.c line 's:STEP trl:LOSS [lr:LR norm:NORM]' or 's:STEP tel:VAL_LOSS'"


def sniff(head: str) -> bool:
    """True when the first non-blank line is an llm.c step line."""
    for line in head.splitlines():
        if line.strip():
            return re.match(r"^s:\d+ (trl|tel):\S+", line) is not None
    return False


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    idx, sub, parts, ok = pick(read_lines(path), "s:", _STEP_LINE, _LINE)
    if not len(idx):
        raise LogFormatError(path, None, "no llm.c step lines ('s:N trl:...') found")
    # A step line with no value at all (``s:5``) is as malformed as one that does not match.
    has_value = np.zeros(len(idx), dtype=bool)
    for key in _FIELDS:
        has_value |= pc.fill_null(pc.not_equal(parts.field(key), ""), False).to_numpy(zero_copy_only=False)
    ok &= has_value
    num_skipped = 0
    bad = first_bad(~ok)
    if bad is not None:
        if not skip_bad_lines:
            raise LogFormatError(path, int(idx[bad]) + 1, f"expected {EXPECTED}, got {sub[bad].as_py()[:200]!r}")
        num_skipped = int((~ok).sum())
        idx, parts = idx[ok], parts.filter(pa.array(ok))
    line_numbers = idx + 1
    columns: dict[str, pa.Array] = {"step": to_int(parts.field("step"), line_numbers, path, "s")}
    for key, name in _FIELDS.items():
        values = parts.field(key)
        if pc.any(pc.not_equal(values, "")).as_py():
            columns[name] = to_float(values, line_numbers, path, key)
    return merge_same_step(ParsedLog(build_table(columns), num_skipped=num_skipped))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
