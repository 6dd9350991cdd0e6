"""llm.c training logs: ``s:N trl:LOSS lr:LR norm:GNORM`` and ``s:N tel:VAL_LOSS``.

The older format has ``s:N trl:LOSS`` only. Validation (``tel``) is stored as
``val_loss``; a validation line at the step of a training line joins its row.
Lines that do not start with ``s:<digit>`` are ignored; one that does but does
not parse is an error naming the file and line.

Speed: one RE2 match (no captures, so the fast DFA) checks every line; the
fields of good lines are cut out by literal key positions and cast in bulk.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import (
    NUMBER_RE, build_table, first_line_matches, floats_at, ints_at, keyed_spans, matches, merge_same_step, parse_each,
    read_lines,
)

_STEP_LINE = r"^s:\d"
_FIELDS = {"trl": "loss", "tel": "val_loss", "lr": "lr", "norm": "grad_norm"}
_LINE = (rf"^s:(?P<step>\d+)(?: trl:(?P<trl>{NUMBER_RE}))?(?: tel:(?P<tel>{NUMBER_RE}))?(?: lr:(?P<lr>{NUMBER_RE}))?"
         rf"(?: norm:(?P<norm>{NUMBER_RE}))?\s*$")
EXPECTED = "an llm.c line 's:STEP trl:LOSS [lr:LR norm:NORM]' or 's:STEP tel:VAL_LOSS'"


def sniff(head: str) -> bool:
    """True when the first non-blank line is an llm.c step line."""
    return first_line_matches(head, r"^s:\d+ (trl|tel):\S+")


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    lines = read_lines(path)
    ok = matches(lines, _LINE)
    miss = np.flatnonzero(~ok)
    # Lines that claim to be step lines but do not parse; everything else is noise.
    claimed = miss[matches(lines.take(pa.array(miss)), _STEP_LINE)] if len(miss) else miss
    idx = np.flatnonzero(ok)
    good = lines if len(idx) == len(lines) else lines.filter(pa.array(ok))
    fields = keyed_spans(good, 2, [(f" {key}:", 0) for key in _FIELDS])
    # A step line with no value at all (``s:5``) is as malformed as one that does not match.
    has_value = np.logical_or.reduce([present for present, _, _ in fields[1:]]) if len(idx) else np.zeros(0, bool)
    bad = np.union1d(claimed, idx[~has_value])
    if not len(idx) and not len(bad):
        raise LogFormatError(path, None, "no llm.c step lines ('s:N trl:...') found")
    num_skipped = 0
    if len(bad):
        if not skip_bad_lines:
            raise LogFormatError(path, int(bad[0]) + 1, f"expected {EXPECTED}, got {lines[int(bad[0])].as_py()[:200]!r}")
        num_skipped = len(bad)
        if not has_value.all():
            keep = pa.array(has_value)
            idx, good = idx[has_value], good.filter(keep)
            fields = keyed_spans(good, 2, [(f" {key}:", 0) for key in _FIELDS])
    line_numbers = idx + 1
    columns: dict[str, pa.Array] = {"step": ints_at(good, fields[0], line_numbers, path, "s")}
    for (key, name), span in zip(_FIELDS.items(), fields[1:]):
        if span[0].any():
            columns[name] = floats_at(good, span, line_numbers, path, key)
    return merge_same_step(ParsedLog(build_table(columns), num_skipped=num_skipped))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
