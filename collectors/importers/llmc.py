"""llm.c training logs (``main.log``): ``s:N key:value ...`` lines.

llm.c's logger writes three kinds of line (``llmc/logger.h``), each read:

* ``s:N trl:LOSS lr:LR norm:GNORM`` (training; older runs print ``s:N trl:LOSS``
  only) -> loss, lr, grad_norm;
* ``s:N tel:VAL_LOSS`` (validation) -> ``val_loss``;
* ``s:N eval:ACC`` (HellaSwag accuracy) -> ``val_hellaswag_acc``: validation
  metrics are kept apart as ``val_*`` columns.

Any other ``key:number`` on an ``s:N`` line is kept as an extra of its
sanitised name. Lines of one step fold into one row. Lines that do not start
with ``s:<digit>`` are ignored; one that does but is not ``s:N`` followed by
``key:number`` fields is an error naming the file and line.

Speed: one RE2 match (no captures, so the fast DFA) checks every line for the
usual training/validation shape; the fields of those lines are cut out by
literal key positions and cast in bulk. Only the rare other lines (eval lines,
other field orders) go through a Python regex.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import (
    NUMBER_RE,
    build_table,
    first_line_matches,
    floats_at,
    ints_at,
    keyed_spans,
    matches,
    merge_same_step,
    parse_each,
    read_lines,
    sanitize_name,
)
from runwatch.data.record import metrics_table

_STEP_LINE = r"^s:\d"
_FIELDS = {"trl": "loss", "tel": "val_loss", "lr": "lr", "norm": "grad_norm"}
NAMES = {**_FIELDS, "eval": "val_hellaswag_acc"}
_LINE = (rf"^s:(?P<step>\d+)(?: trl:(?P<trl>{NUMBER_RE}))?(?: tel:(?P<tel>{NUMBER_RE}))?(?: lr:(?P<lr>{NUMBER_RE}))?"
         rf"(?: norm:(?P<norm>{NUMBER_RE}))?\s*$")
# Any llm.c line: a step, then one or more key:number fields.
_ANY_LINE = re.compile(rf"^s:(\d+)((?: [A-Za-z_][\w.]*:{NUMBER_RE})+)\s*$")
_PAIR = re.compile(rf" ([A-Za-z_][\w.]*):({NUMBER_RE})")
EXPECTED = "an llm.c line 's:STEP key:NUMBER ...' ('trl:LOSS lr:LR norm:NORM', 'tel:VAL_LOSS', 'eval:ACC')"


def sniff(head: str) -> bool:
    """True when the first non-blank line is an llm.c step line."""
    return first_line_matches(head, r"^s:\d+ (trl|tel|eval):\S+")


def _other_rows(lines: pa.Array, idx: np.ndarray) -> tuple[list[dict], list[int], list[int]]:
    """Rows of the step lines outside the fast shape (eval lines, other fields), their line indices, and bad ones."""
    rows, at, bad = [], [], []
    for i, text in zip(idx.tolist(), lines.take(pa.array(idx, pa.int64())).to_pylist()):
        m = _ANY_LINE.match(text)
        if m is None or int(m.group(1)) > 2**62:
            bad.append(i)
            continue
        row: dict = {"step": int(m.group(1))}
        for key, value in _PAIR.findall(m.group(2)):
            row[NAMES.get(key) or sanitize_name(key)] = float(value)
        rows.append(row)
        at.append(i)
    return rows, at, bad


def _fast_columns(good: pa.Array, fields: list, idx: np.ndarray, path: Path) -> dict[str, pa.Array]:
    """Columns of the lines in the fast shape from their field spans (``keyed_spans``)."""
    line_numbers = idx + 1
    columns: dict[str, pa.Array] = {"step": ints_at(good, fields[0], line_numbers, path, "s")}
    for (key, name), span in zip(_FIELDS.items(), fields[1:]):
        if span[0].any():
            columns[name] = floats_at(good, span, line_numbers, path, key)
    return columns


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    lines = read_lines(path)
    ok = matches(lines, _LINE)
    miss = np.flatnonzero(~ok)
    # Step lines outside the fast shape; everything not starting with "s:<digit>" is noise.
    claimed = miss[matches(lines.take(pa.array(miss)), _STEP_LINE)] if len(miss) else miss
    idx = np.flatnonzero(ok)
    good = lines if len(idx) == len(lines) else lines.filter(pa.array(ok))
    keys = [(f" {key}:", 0) for key in _FIELDS]
    fields = keyed_spans(good, 2, keys)
    # A step line with no value at all (``s:5``) is as malformed as one that does not match.
    has_value = np.logical_or.reduce([present for present, _, _ in fields[1:]]) if len(idx) else np.zeros(0, bool)
    other, other_at, bad = _other_rows(lines, claimed)
    bad = np.union1d(np.array(bad, dtype=np.int64), idx[~has_value])
    if not len(idx) and not other and not len(bad):
        raise LogFormatError(path, None, "no llm.c step lines ('s:N trl:...') found")
    if len(bad) and not skip_bad_lines:
        raise LogFormatError(path, int(bad[0]) + 1, f"expected {EXPECTED}, got {lines[int(bad[0])].as_py()[:200]!r}")
    if not has_value.all():
        idx, good = idx[has_value], good.filter(pa.array(has_value))
        fields = keyed_spans(good, 2, keys)
    table = build_table(_fast_columns(good, fields, idx, path))
    if other:
        table = pa.concat_tables([table, metrics_table(other)], promote_options="permissive")
        idx = np.concatenate([idx, np.array(other_at, dtype=np.int64)])
        order = np.argsort(idx, kind="stable")
        table, idx = table.take(pa.array(order)), idx[order]
    return merge_same_step(ParsedLog(table, num_skipped=len(bad), positions=idx.astype(np.float64)))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
