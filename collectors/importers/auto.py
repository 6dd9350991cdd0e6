"""``auto``: read a log with every format that recognises it, keep the reading with most signal, join the rest.

A training stdout is often written by several tools at once: Megatron prints
iteration lines (loss, grad norm) while DeepSpeed underneath prints its step
reports and loss-scale overflows; the HF Trainer prints log dicts while
DeepSpeed prints overflows. No one format reads all of it, and taking the
first format that recognises the file can drop every loss or every overflow.
The rule, for any mix of formats:

1. Candidates: every format whose sniffer accepts the head of the first file
   (its first 256 KiB and, for a longer file, its first 16 MiB).
2. Each candidate parses the files. A reading that finds none of its lines is
   dropped; a malformed line is still an error naming file and line.
3. Signal: the number of non-null cells of record columns (loss, grad_norm,
   loss_scale, found_inf, lr, time, ...) a reading keeps. The reading with the
   most is the primary (a tie goes to the earlier format in ``FORMATS``).
4. Join: each other reading adds the columns the primary lacks altogether
   (loss from one tool, loss scale and found_inf from the other; extras too),
   by step within the primary's segments; its rows at steps the primary did
   not log become rows of their own. A column the primary has stays the
   primary's, so no series mixes two tools' notions of it. A row of another
   reading belongs to the segment of the next primary row printed after it
   (a tool's line about step s comes before the line that reports step s);
   where a parser gives no stream positions, its segment k joins the
   primary's segment k. Events are the primary's, plus the others' of a kind
   and step the primary has none of. A reading whose steps are ordinals (the
   log printed no step) is never joined: its steps are not training steps.

The name of the result is the formats joined by ``+`` (``megatron+deepspeed``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError, ParsedLog, event_segment, row_segments
from runwatch.collectors.importers.formats import get_format, sniff_formats
from runwatch.data.record import METRIC_COLUMNS

SIGNAL_COLUMNS: tuple[str, ...] = tuple(c for c in METRIC_COLUMNS if c != "step")
_PLACEMENT = ("step", "segment", "rank")


def signal(parsed: ParsedLog) -> int:
    """Non-null cells of the record's columns (NaN is a value: a measured non-finite loss is signal)."""
    table = parsed.metrics
    return sum(table.num_rows - table[c].null_count for c in SIGNAL_COLUMNS if c in table.column_names)


def _has_values(table: pa.Table, column: str) -> bool:
    return column in table.column_names and table[column].null_count < table.num_rows


def _rank0(table: pa.Table) -> np.ndarray:
    if "rank" not in table.column_names:
        return np.ones(table.num_rows, dtype=bool)
    return pc.fill_null(pc.equal(table["rank"], 0), True).to_numpy(zero_copy_only=False)


def _target_segments(primary: ParsedLog, other: ParsedLog, p_seg: np.ndarray, o_seg: np.ndarray) -> np.ndarray:
    """The primary segment each row of ``other`` joins (see the module docstring)."""
    own = np.flatnonzero(_rank0(primary.metrics))
    if not len(own):
        return np.zeros(len(o_seg), dtype=np.int32)
    if primary.positions is None or other.positions is None:
        return np.minimum(o_seg, p_seg[own].max()).astype(np.int32)
    order = own[np.argsort(primary.positions[own], kind="stable")]
    nxt = np.searchsorted(primary.positions[order], other.positions, side="left")
    return p_seg[order][np.minimum(nxt, len(order) - 1)].astype(np.int32)


def _last_per_key(seg: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Row indices keeping the last row of each (segment, step)."""
    order = np.lexsort((np.arange(len(step)), step, seg))
    s, t = seg[order], step[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (s[1:] != s[:-1]) | (t[1:] != t[:-1])
    return np.sort(order[last])


def _joined_events(primary: ParsedLog, other: ParsedLog, p_seg: np.ndarray, o_seg: np.ndarray,
                   target: np.ndarray) -> list[dict]:
    """The primary's events and the other's of a kind and step the primary lacks, with explicit segments."""
    out = [{**ev, "segment": event_segment(ev, p_seg)} for ev in primary.events]
    have = {(ev["event"], ev["step"]) for ev in out}
    top = int(p_seg.max()) if len(p_seg) else 0
    for ev in other.events:
        if (ev["event"], ev["step"]) in have:
            continue
        own = event_segment(ev, o_seg)
        rows = np.flatnonzero(o_seg == own)
        out.append({**ev, "segment": int(target[rows[0]]) if len(rows) else min(own, top)})
    return [{k: v for k, v in ev.items() if k != "row_index"} for ev in out]


def join(primary: ParsedLog, other: ParsedLog) -> ParsedLog:
    """``primary`` with the columns only ``other`` has, joined by (segment, step); new steps become rows."""
    p_tab, o_tab = primary.metrics, other.metrics
    cols = [c for c in o_tab.column_names if c not in _PLACEMENT and _has_values(o_tab, c) and not _has_values(p_tab, c)]
    if not cols:
        return primary
    p_seg, o_seg = row_segments(primary), row_segments(other)
    target = _target_segments(primary, other, p_seg, o_seg)
    keep = _last_per_key(target, o_tab["step"].to_numpy(zero_copy_only=False))
    right = o_tab.select(["step", *cols]).take(pa.array(keep))
    right = right.append_column("__seg", pa.array(target[keep], pa.int32()))
    left = p_tab.drop_columns([c for c in cols if c in p_tab.column_names]).drop_columns(
        [c for c in ("segment",) if c in p_tab.column_names])
    left = left.append_column("__seg", pa.array(p_seg, pa.int32())).append_column(
        "__row", pa.array(np.arange(p_tab.num_rows)))
    has_pos = primary.positions is not None and other.positions is not None
    if has_pos:
        left = left.append_column("__pos", pa.array(primary.positions))
        right = right.append_column("__pos_other", pa.array(other.positions[keep]))
    mine = _rank0(p_tab)
    joined = left.filter(pa.array(mine)).join(right, keys=["__seg", "step"], join_type="full outer")
    rest = left.filter(pa.array(~mine))
    table = pa.concat_tables([joined, rest], promote_options="permissive") if rest.num_rows else joined
    table = table.sort_by([("__seg", "ascending"), ("step", "ascending"), ("__row", "ascending")])
    positions = None
    if has_pos:
        positions = pc.coalesce(table["__pos"], table["__pos_other"]).to_numpy(zero_copy_only=False)
    segment = table["__seg"]
    table = table.drop_columns([c for c in table.column_names if c.startswith("__")]).append_column("segment", segment)
    events = _joined_events(primary, other, p_seg, o_seg, target)
    return ParsedLog(table, events, primary.num_skipped, set(), positions, False, primary.num_ignored)


def read(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> tuple[str, ParsedLog]:
    """The ``auto`` reading of ``paths``: its name (formats joined by ``+``) and the joined log."""
    if not paths:
        raise ValueError("no input files given")
    readings: list[tuple[str, ParsedLog]] = []
    missing: list[LogFormatError] = []
    for name in sniff_formats(paths[0]):
        try:
            readings.append((name, get_format(name).parse([Path(p) for p in paths], skip_bad_lines=skip_bad_lines)))
        except LogFormatError as err:
            if err.line is not None:
                raise  # a malformed line: an error whoever reads it
            missing.append(err)  # this format recognised the head but found none of its lines
    if not readings:
        raise missing[0]
    # Each reading skipped (or ignored) lines of its own format: the import skipped all of them.
    num_skipped, num_ignored = sum(r.num_skipped for _, r in readings), sum(r.num_ignored for _, r in readings)
    readings = [(n, r) for n, r in readings if r.metrics.num_rows] or readings[:1]
    # Stable sort: equal signal keeps FORMATS order.
    readings.sort(key=lambda r: -signal(r[1]))
    name, parsed = readings[0]
    for other_name, other in readings[1:]:
        if parsed.ordinal_steps or other.ordinal_steps:
            continue
        joined = join(parsed, other)
        if joined is not parsed:
            name, parsed = f"{name}+{other_name}", joined
    return name, dataclasses.replace(parsed, num_skipped=num_skipped, num_ignored=num_ignored)
