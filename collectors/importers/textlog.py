"""Vectorised helpers the text-log importers share.

A training stdout can hold millions of lines, most of them noise. Instead of a
Python regex per line, a file becomes one Arrow string array (split on newline
bytes with numpy, no copy per line) and RE2 kernels from ``pyarrow.compute``
pick the metric lines and their fields; Python touches only the few odd lines.
Line numbers are array indices + 1.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import FILE_STRIDE, LogFormatError, ParsedLog
from runwatch.data.record import METRIC_COLUMNS, conform_metrics, metrics_table

# A number as training logs print it, including NaN/Inf spellings (Arrow's cast accepts these).
NUMBER_RE = r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[nN]a[nN]|[iI]nf(?:inity)?)"
_NUMBER_FULL = f"^{NUMBER_RE}$"
# What an import read around rather than from (a last line cut short), for its result to say; outside an import
# (a parser called directly) a warning says it. Per context: imports on other threads (the dashboard's) keep their own.
IMPORT_NOTES: ContextVar[list[str] | None] = ContextVar("runwatch_import_notes", default=None)
# A wall-clock gap this long between two logged steps means the job stopped and was restarted.
LONG_GAP_S = 3600.0


def read_text(path: str | Path) -> tuple[pa.Array, bytes | None]:
    """The lines of ``path`` (as ``read_lines``) and its raw bytes (None when decoded leniently).

    One C++ split of the whole file (a single large string) on newline bytes:
    no Python object per line, the bytes are copied once.
    """
    data = complete_lines(Path(path).read_bytes(), path)
    if not data:
        return pa.array([], pa.string()), data
    whole = pa.Array.from_buffers(pa.large_binary(), 1, [None, pa.py_buffer(np.array([0, len(data)], np.int64)),
                                                         pa.py_buffer(data)])
    try:
        whole = whole.cast(pa.large_string())
    except pa.ArrowInvalid:
        # Invalid UTF-8 somewhere: decode leniently so noise never stops an import.
        text = data.decode("utf-8", errors="replace")
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        return pa.array(lines, pa.string()), None
    lines = pc.list_flatten(pc.split_pattern(whole, "\n"))
    if data.endswith(b"\n"):
        lines = lines.slice(0, len(lines) - 1)
    return lines, data


def complete_lines(data: bytes, path: str | Path) -> bytes:
    """``data`` through its last newline. A line is complete only with its newline: what follows the last one was cut
    short (a job killed mid-write) or is still being written (a log followed while it grows), and may end mid-number
    (``lm loss: 6.3`` of 6.3456, ``loss scale: 1`` of 16384.0), so it is never read as values. The import's notes
    (``IMPORT_NOTES``), or a warning outside an import, name it. Trailing blanks are nothing to read."""
    cut = data.rfind(b"\n") + 1
    if not data[cut:].strip():
        return data
    note_cut_line(path, data.count(b"\n", 0, cut) + 1)
    return data[:cut]


def note_cut_line(path: str | Path, line: int) -> None:
    """Say that line ``line`` of ``path``, its last, has no newline and was not read (see ``complete_lines``)."""
    note(path, line, "the last line has no newline (a write cut short?); not read")


def note(path: str | Path, line: int | None, what: str) -> None:
    """Say what an import read around at ``path:line`` (a line, or a record of a binary file)."""
    text = f"{path}:{line}: {what}" if line is not None else f"{path}: {what}"
    notes = IMPORT_NOTES.get()
    if notes is None:
        warnings.warn(f"runwatch: {text}", RuntimeWarning, stacklevel=3)
    elif text not in notes:  # `auto` reads a file with every format that recognises it
        notes.append(text)


def read_lines(path: str | Path) -> pa.Array:
    """The lines of ``path`` as a string array, without newlines (``\\r`` kept; patterns allow it)."""
    return read_text(path)[0]


def offsets(lines: pa.Array) -> np.ndarray:
    """The int64 value offsets of a string array into its data buffer (slices respected)."""
    width = np.int64 if pa.types.is_large_string(lines.type) else np.int32
    raw = np.frombuffer(lines.buffers()[1], dtype=width)
    return raw[lines.offset:lines.offset + len(lines) + 1].astype(np.int64)


def data_bytes(lines: pa.Array) -> np.ndarray:
    buf = lines.buffers()[2]
    return np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)


def spans(lines: pa.Array, starts: np.ndarray, stops: np.ndarray) -> pa.Array:
    """The strings ``data[starts[i]:stops[i]]`` of the data buffer of ``lines``, in one C++ gather.

    Spans must be in buffer order and not overlap: then the spans and the gaps
    between them form a zero-copy string array, and a filter keeps the spans.
    """
    n = len(starts)
    if not n:
        return pa.array([], pa.large_string())
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, stops
    both = pa.Array.from_buffers(pa.large_string(), 2 * n - 1, [None, pa.py_buffer(bounds), lines.buffers()[2]])
    return both.take(pa.array(np.arange(0, 2 * n - 1, 2)))


_WS_BYTES = np.array([9, 10, 12, 13, 32], dtype=np.uint8)  # RE2's \s


def trimmed_ends(lines: pa.Array, off: np.ndarray) -> np.ndarray:
    """Buffer position where each line ends once trailing whitespace is dropped."""
    ends = off[1:].copy()
    if not len(ends):
        return ends
    nonempty = ends > off[:-1]
    last = data_bytes(lines)[np.maximum(ends - 1, 0)]
    ws = np.flatnonzero(nonempty & np.isin(last, _WS_BYTES))
    if len(ws):
        kept = pc.binary_length(pc.utf8_rtrim(lines.take(pa.array(ws)), characters=" \t\n\f\r"))
        ends[ws] = off[ws] + kept.to_numpy(zero_copy_only=False)
    return ends


def keyed_spans(lines: pa.Array, head: int, keys: Sequence[tuple[str, int]]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Value spans of lines shaped ``HEAD value (KEY value SUFFIX)*``, keys optional but in this order.

    The lines must already match a strict regex of that shape (so a key literal
    occurs only where its field starts). ``head`` is the length of the fixed
    head; ``keys`` are (key literal, suffix length). Returns (present, starts,
    stops) in buffer positions for the head value and for each key.
    """
    off = offsets(lines)
    line_start = off[:-1]
    nxt = trimmed_ends(lines, off)
    out = []
    for key, suffix in reversed(keys):
        pos = pc.find_substring(lines, key).to_numpy(zero_copy_only=False).astype(np.int64)
        present = pos >= 0
        where = line_start + pos
        out.append((present, where + len(key), nxt - suffix))
        nxt = np.where(present, where, nxt)
    out.append((np.ones(len(lines), dtype=bool), line_start + head, nxt))
    return out[::-1]


def floats_at(lines: pa.Array, span: tuple[np.ndarray, np.ndarray, np.ndarray], line_numbers: np.ndarray,
              path: str | Path, name: str) -> pa.Array:
    """float64 of the spans (null where absent); a bad number raises naming its line, as ``to_float``."""
    present, starts, stops = span
    values = spans(lines, starts[present], stops[present])
    try:
        floats = pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        floats = to_float(values, line_numbers[present], path, name).to_numpy(zero_copy_only=False)
    if present.all():
        return pa.array(floats)
    out = np.full(len(present), np.nan)
    out[present] = floats
    return pa.array(out, mask=~present)


def ints_at(lines: pa.Array, span: tuple[np.ndarray, np.ndarray, np.ndarray], line_numbers: np.ndarray,
            path: str | Path, name: str) -> pa.Array:
    """int64 of digit spans present on every line; anything odd goes through ``to_int`` for its error."""
    return ints_or_error(spans(lines, span[1], span[2]), line_numbers, path, name)


def ints_or_error(values: pa.Array, line_numbers: np.ndarray, path: str | Path, name: str) -> pa.Array:
    """int64 of digit strings in one cast; anything odd goes through ``to_int`` for its error."""
    try:
        ints = pc.cast(values, pa.int64())
        if len(ints) and pc.max(pc.abs(ints)).as_py() > 2**62:
            raise pa.ArrowInvalid("too large")
        return ints
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return to_int(values, line_numbers, path, name)


def lines_containing(lines: pa.Array, raw: bytes | None, literal: str) -> np.ndarray:
    """Indices of lines containing ``literal``, by a bytes search of the raw file when it is at hand.

    ``bytes.find`` runs several times faster than a per-line Arrow scan and the
    literals searched this way (checkpoint, overflow) are rare. Line ``i``
    starts at raw position ``offsets[i] + i`` (one newline dropped per line).
    """
    if raw is None or len(raw) != int(offsets(lines)[-1]) + len(lines) - (0 if raw.endswith(b"\n") else 1) \
            or lines.offset:
        return np.flatnonzero(pc.fill_null(pc.match_substring(lines, literal), False).to_numpy(zero_copy_only=False))
    needle, found = literal.encode(), []
    at = raw.find(needle)
    while at >= 0:
        found.append(at)
        at = raw.find(needle, at + 1)
    if not found:
        return np.zeros(0, dtype=np.int64)
    starts = offsets(lines)[:-1] + np.arange(len(lines))
    return np.unique(np.searchsorted(starts, np.array(found), side="right") - 1)


def empty_to_null(values: pa.Array) -> pa.Array:
    """An optional regex group that did not take part comes back as ``""``: make it null."""
    return pc.if_else(pc.equal(values, ""), pa.scalar(None, values.type), values)


def to_float(values: pa.Array, line_numbers: np.ndarray, path: str | Path, name: str) -> pa.Array:
    """Cast number strings to float64 (empty -> null); the first unparsable one raises naming its line."""
    values = empty_to_null(pc.utf8_trim_whitespace(values))
    try:
        return pc.cast(values, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ok = pc.fill_null(pc.match_substring_regex(values, _NUMBER_FULL), True).to_numpy(zero_copy_only=False)
        bad = int(np.flatnonzero(~ok)[0]) if (~ok).any() else 0
        raise LogFormatError(path, int(line_numbers[bad]),
                             f"expected a number for {name!r}, got {values[bad].as_py()!r}") from None


def to_int(values: pa.Array, line_numbers: np.ndarray, path: str | Path, name: str) -> pa.Array:
    """Cast integer strings (``12``, ``12.0``) to int64; a fraction or junk raises naming its line."""
    floats = to_float(values, line_numbers, path, name)
    arr = floats.to_numpy(zero_copy_only=False)
    bad = ~np.isnan(arr) & ((arr != np.floor(arr)) | ~np.isfinite(arr) | (np.abs(arr) > 2**62))
    bad |= np.isnan(arr) & ~pc.is_null(floats).to_numpy(zero_copy_only=False)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise LogFormatError(path, int(line_numbers[i]), f"expected an integer for {name!r}, got {values[i].as_py()!r}")
    return pc.cast(floats, pa.int64())


def sanitize_name(name: str, prefix: str = "") -> str:
    """An extra column name in ``[a-z0-9_]`` (``num-zeros`` -> ``num_zeros``)."""
    clean = re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_") or "value"
    clean = prefix + clean
    return clean if clean not in METRIC_COLUMNS and clean not in ("segment", "rank", "run", "event", "payload") \
        else f"{clean}_extra"


def bad_line(path: str | Path, line: int, expected: str, skip: bool) -> int:
    """Raise for a malformed line, or count it when skipping bad lines."""
    if not skip:
        raise LogFormatError(path, line, expected)
    return 1


def fold_repeated_steps(table: pa.Table) -> pa.Table:
    """One row per run of consecutive rows with the same step, each column's last non-null value in it: a history
    that logs a step in several calls (training values, then validation) logged one step, not a rerun of it. A
    step going back still starts a new segment (the placer's rule)."""
    if table.num_rows < 2:
        return table
    steps = table["step"].to_numpy(zero_copy_only=False)
    last = np.flatnonzero(np.r_[steps[1:] != steps[:-1], True])  # each run's last row
    if len(last) == table.num_rows:
        return table
    first = np.r_[0, last[:-1] + 1]
    group = np.repeat(np.arange(len(last)), last - first + 1)
    out = {}
    for name in table.column_names:
        col = table[name].combine_chunks()
        valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
        idx = np.where(valid, np.arange(table.num_rows), -1)
        pick = np.full(len(last), -1)
        np.maximum.at(pick, group, idx)  # the last valid row of each run, or -1
        taken = col.take(pa.array(np.maximum(pick, 0)))
        out[name] = pc.if_else(pa.array(pick >= 0), taken, pa.nulls(len(last), col.type))
    return pa.table(out)


def merge_same_step(parsed: ParsedLog) -> ParsedLog:
    """Fold a row into the previous one when both have the same step and no column in common.

    Logs print validation and training values at one step on separate lines; as
    separate rows the repeated step would read as a restart. Rows that clash (a
    real rerun of a step) stay apart and start a new segment.
    """
    table = parsed.metrics
    n = table.num_rows
    if n < 2:
        return parsed
    steps = table["step"].to_numpy(zero_copy_only=False)
    cand = np.flatnonzero(steps[1:] == steps[:-1]) + 1
    cand = np.array([c for c in cand if c not in parsed.breaks], dtype=np.int64)
    if not len(cand):
        return parsed
    cols = [c for c in table.column_names if c not in ("step", "segment", "rank")]
    valid = {c: pc.is_valid(table[c]).to_numpy(zero_copy_only=False) for c in cols}
    same_place = np.ones(len(cand), dtype=bool)
    for c in ("segment", "rank"):
        if c in table.column_names:
            arr = table[c].to_numpy(zero_copy_only=False)
            same_place &= arr[cand] == arr[cand - 1]
    # Targets: walk back through chains of merged rows to the row that stays.
    target = np.arange(n)
    merged = np.zeros(n, dtype=bool)
    for c in cand[same_place]:
        t = target[c - 1]
        if not any(valid[col][c] and valid[col][t] for col in cols):
            target[c] = t
            merged[c] = True
            for col in cols:
                valid[col][t] |= valid[col][c]
    if not merged.any():
        return parsed
    keep = ~merged
    out = {}
    for name in table.column_names:
        col = table[name].combine_chunks() if isinstance(table[name], pa.ChunkedArray) else table[name]
        if name in cols:
            idx = np.arange(n)
            orig_valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
            src = np.flatnonzero(merged & orig_valid)
            idx[target[src]] = src
            col = col.take(pa.array(idx))
        out[name] = col.filter(pa.array(keep))
    new_index = np.concatenate(([0], np.cumsum(keep)))
    events = [{**ev, "row_index": int(new_index[min(int(ev.get("row_index", n)), n)])} for ev in parsed.events]
    breaks = {int(new_index[b]) for b in parsed.breaks if b <= n}
    positions = parsed.positions[keep] if parsed.positions is not None else None
    return ParsedLog(pa.table(out), events, parsed.num_skipped, breaks, positions, parsed.ordinal_steps,
                     parsed.num_ignored)


def time_gap_breaks(times: np.ndarray, min_gap: float = LONG_GAP_S) -> set[int]:
    """Row indices after a wall-clock gap longer than ``min_gap`` seconds."""
    t = np.asarray(times, dtype=np.float64)
    if len(t) < 2:
        return set()
    dt = t[1:] - t[:-1]
    with np.errstate(invalid="ignore"):
        return {int(i) + 1 for i in np.flatnonzero(dt > min_gap)}


def concat_parsed(parts: Sequence[ParsedLog], break_between: bool = True) -> ParsedLog:
    """One ParsedLog from per-file parts in order; each new file may start a new segment."""
    parts = [p for p in parts]
    if len(parts) == 1:
        return parts[0]
    tables = [p.metrics for p in parts if p.metrics.num_rows]
    table = pa.concat_tables(tables, promote_options="permissive") if tables else metrics_table([])
    events, breaks, offset, skipped = [], set(), 0, 0
    ignored = sum(p.num_ignored for p in parts)
    for p in parts:
        if break_between and offset:
            breaks.add(offset)
        breaks |= {b + offset for b in p.breaks}
        events += [{**ev, "row_index": int(ev.get("row_index", p.metrics.num_rows)) + offset} for ev in p.events]
        offset += p.metrics.num_rows
        skipped += p.num_skipped
    return ParsedLog(table, events, skipped, breaks, concat_positions(parts), any(p.ordinal_steps for p in parts),
                     ignored)


def concat_positions(parts: Sequence[ParsedLog]) -> np.ndarray | None:
    """The stream positions of per-file parts in file order (None unless every part has them)."""
    if any(p.positions is None for p in parts):
        return None
    return np.concatenate([p.positions + k * FILE_STRIDE for k, p in enumerate(parts)]) if parts else None


def parse_each(paths: Sequence[str | Path], parse_one: Callable[[Path, bool], ParsedLog],
               skip_bad_lines: bool, break_between: bool = True) -> ParsedLog:
    """Parse every file with ``parse_one`` and join the parts (a new process per file)."""
    if not paths:
        raise ValueError("no input files given")
    parts = [parse_one(Path(p), skip_bad_lines) for p in paths]
    return concat_parsed(parts, break_between)


def build_table(columns: dict[str, pa.Array]) -> pa.Table:
    """A metrics table in the record's schema from named arrays (``step`` required; ``rank`` kept)."""
    columns = dict(columns)
    rank = columns.pop("rank", None)
    table = conform_metrics(pa.table(columns))
    return table.append_column("rank", pc.cast(rank, pa.int32())) if rank is not None else table


def matches(lines: pa.Array, pattern: str) -> np.ndarray:
    """Boolean mask of the lines matching ``pattern`` (RE2, vectorised); null lines do not match."""
    return pc.fill_null(pc.match_substring_regex(lines, pattern), False).to_numpy(zero_copy_only=False)


def first_line(head: str) -> str | None:
    """The first non-blank line of ``head`` (without splitting the whole head: heads run to megabytes)."""
    m = re.search(r"\S", head)
    if m is None:
        return None
    start = head.rfind("\n", 0, m.start()) + 1
    end = head.find("\n", m.start())
    return head[start:end if end >= 0 else len(head)]


def first_line_matches(head: str, pattern: str) -> bool:
    """True when the first non-blank line of ``head`` matches ``pattern``: a sniffer for line formats."""
    line = first_line(head)
    return line is not None and re.match(pattern, line) is not None
