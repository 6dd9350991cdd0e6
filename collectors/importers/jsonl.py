"""Generic JSON Lines import: the contract other tools write to.

Metric line: ``{"step": 12, "loss": 2.3, "grad_norm": NaN, "my_metric": 0.5}``.
Event line:  ``{"event": "checkpoint", "step": 100, "path": "ckpt/100.pt"}``.
``NaN``/``Infinity`` tokens and ``null`` are accepted and kept as they are.
Events are the record's own: a checkpoint at step s holds the state after
update s, a resume from it carries s; the writer states it, nothing is shifted.

A file is read in blocks of ``BLOCK_BYTES`` cut at line ends, so memory stays
bounded whatever its size (``parse_chunks`` yields one ``ParsedLog`` per
block and ``write_import_stream`` writes each before the next is read). A
block goes through ``pyarrow.json`` with the record's types given, after the
few event lines are taken out by a bytes search; only a block that Arrow
rejects or whose values break a rule is parsed again line by line in Python,
so every error still names its file and line and ``--skip-bad-lines`` skips
exactly the bad lines.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import concat_parsed, first_line, note_cut_line
from runwatch.data.record import (
    EVENT_KINDS,
    FLOAT_METRICS,
    METRIC_FIELDS,
    check_oncall_event,
    conform_metrics,
    is_valid_extra_name,
)

INT_FIELDS = ("tokens", "samples")
PLACEMENT_FIELDS = ("segment", "rank")
BLOCK_BYTES = 8 << 20
"""Bytes per block: large enough for Arrow's parallel parse, small enough to bound memory (a few x this)."""

# The record's fields with their types (placement as int64, checked >= 0 below); other keys are inferred.
_EXPLICIT = pa.schema([*(pa.field(f.name, f.type) for f in METRIC_FIELDS),
                       *(pa.field(name, pa.int64()) for name in PLACEMENT_FIELDS)])
_EVENT_KEY = b'"event"'


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


def _as_float(v: object) -> float:
    try:
        return float(v)
    except OverflowError:  # an integer literal beyond float range: infinite, as 1e400 is (and as Arrow reads it)
        return math.inf if v > 0 else -math.inf


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
            row[key] = _as_float(value)
        elif key in INT_FIELDS:
            if isinstance(value, float) and not math.isfinite(value):
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
            row[key] = _as_float(value)
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
    if kind == "checkpoint":  # the blocking save time and the size, read by `runwatch advise`
        if obj.get("write_seconds") is not None and not (_is_number(obj["write_seconds"])
                                                         and 0 <= obj["write_seconds"] < math.inf):
            raise ValueError(f"'write_seconds' must be a finite number >= 0 or null, got {obj['write_seconds']!r}")
        if obj.get("bytes") is not None:
            ev["bytes"] = _as_int(obj["bytes"], "bytes", 0)
    if kind == "resume" and obj.get("skip_batches") is not None:
        skip = obj["skip_batches"]
        if not (isinstance(skip, list) and len(skip) == 2 and all(_is_number(x) for x in skip)):
            raise ValueError(f"'skip_batches' must be [first, last], got {skip!r}")
    check_oncall_event(ev)  # ack / silence: the same shape rule as every other writer of the record
    return ev


@dataclass
class _SegmentColumn:
    """Where the first metric line with and without ``segment`` was seen: both is an error."""

    first_with: tuple[Path, int] | None = None
    first_without: tuple[Path, int] | None = None

    def see(self, has_segment: bool, where: tuple[Path, int]) -> None:
        if has_segment:
            self.first_with = self.first_with or where
        else:
            self.first_without = self.first_without or where
        if self.first_with and self.first_without:
            with_path, with_line = self.first_with
            raise LogFormatError(where[0], where[1], "either every metric line carries 'segment' or none does "
                                 f"(line {with_line} of {with_path} has one)")

    def conflicts(self, has_segment: bool) -> bool:
        return (self.first_without if has_segment else self.first_with) is not None


def blocks(path: Path, size: int = BLOCK_BYTES) -> Iterator[tuple[int, bytes]]:
    """(first line number, bytes) of consecutive blocks of whole lines; a longer line makes a longer block."""
    line, rest = 1, b""
    with open(path, "rb") as f:
        while True:
            data = f.read(size)
            if not data:
                if rest.strip():  # a last line without its newline: read only if its JSON is whole
                    if _whole_json(rest):
                        yield line, rest
                    else:
                        note_cut_line(path, line)
                return
            buf = rest + data if rest else data
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                rest = buf
                continue
            block, rest = buf[:cut], buf[cut:]
            yield line, block
            line += block.count(b"\n")


def _whole_json(raw: bytes) -> bool:
    """A last line without its newline is whole when it parses: a JSON value closes itself (a text log's number does
    not, ``textlog.complete_lines``), and a writer killed mid-line leaves one that does not."""
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def parse_chunks(paths: Sequence[str | Path], *, skip_bad_lines: bool = False,
                 block_bytes: int = BLOCK_BYTES) -> Iterator[ParsedLog]:
    """One ``ParsedLog`` per block of every file, in order (indices relative to the block)."""
    seen = _SegmentColumn()
    for path in paths:
        path = Path(path)
        for block_line, block in blocks(path, block_bytes):
            chunk = _fast_block(path, block_line, block, seen)
            yield chunk if chunk is not None else _slow_block(path, block_line, block, skip_bad_lines, seen)


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    """The whole import as one ``ParsedLog`` (``parse_chunks`` keeps memory bounded instead)."""
    return concat_parsed(list(parse_chunks(paths, skip_bad_lines=skip_bad_lines)), break_between=False)


def _event_lines(block: bytes) -> list[tuple[int, int, dict]] | None:
    """(start, end, event) of the block's event lines, or None when one is malformed (the slow path says why)."""
    found: dict[int, tuple[int, int, dict]] = {}
    at = block.find(_EVENT_KEY)
    while at >= 0:
        start = block.rfind(b"\n", 0, at) + 1
        end = block.find(b"\n", at)
        end = len(block) if end < 0 else end + 1
        if start not in found:
            try:
                obj = json.loads(block[start:end])
            except (ValueError, RecursionError):
                return None
            if isinstance(obj, dict) and "event" in obj:
                try:
                    found[start] = (start, end, parse_event(obj))
                except (ValueError, TypeError, OverflowError):
                    return None
        at = block.find(_EVENT_KEY, end)
    return sorted(found.values(), key=lambda e: e[0])


def _fast_block(path: Path, first_line: int, block: bytes, seen: _SegmentColumn) -> ParsedLog | None:
    """The block through ``pyarrow.json``; None when anything needs the per-line path."""
    events_at = _event_lines(block) if _EVENT_KEY in block else []
    if events_at is None:
        return None
    events, breaks, pieces, pos, num_lines = [], set(), [], 0, 0
    for start, end, ev in events_at:
        pieces.append(block[pos:start])
        num_lines += block.count(b"\n", pos, start)
        pos = end
        ev["row_index"] = num_lines  # right when every line is a row: checked below
        events.append(ev)
        if ev["event"] == "resume":
            breaks.add(num_lines)
    data = b"".join([*pieces, block[pos:]]) if events_at else block
    if not data or data.isspace():
        return ParsedLog.from_rows([], events=events, breaks=breaks) if events else ParsedLog.from_rows([])
    try:
        table = pajson.read_json(io.BytesIO(data), parse_options=pajson.ParseOptions(
            explicit_schema=_EXPLICIT, unexpected_field_behavior="infer"))
    except (pa.ArrowException, UnicodeDecodeError, ValueError):
        return None
    if events and table.num_rows != data.count(b"\n") + (not data.endswith(b"\n")):
        return None  # blank lines (Arrow skips them) move the rows under the events: the slow path counts
    metrics = _checked_metrics(table)
    if metrics is None:
        return None
    has_segment = "segment" in metrics.column_names
    if metrics.num_rows and seen.conflicts(has_segment):
        return None
    if metrics.num_rows and (seen.first_with if has_segment else seen.first_without) is None:
        seen.see(has_segment, (path, first_line + _first_metric_line(block, events_at)))
    return ParsedLog(metrics, events, 0, breaks)


def _checked_metrics(table: pa.Table) -> pa.Table | None:
    """The block's rows in the record's schema, or None when a rule is broken (the slow path names the line)."""
    n = table.num_rows
    if table["step"].null_count:
        return None
    for name in (*INT_FIELDS, *PLACEMENT_FIELDS):
        if pc.any(pc.less(table[name], 0)).as_py():
            return None
    placement = {}
    for name in PLACEMENT_FIELDS:
        nulls = table[name].null_count
        if 0 < nulls < n:
            return None  # some rows carry it, others not: the slow path raises with the line
        if nulls == 0 and n:
            placement[name] = pc.cast(table[name], pa.int32())
    columns = {}
    for name in table.column_names:
        col = table[name]
        if name in _EXPLICIT.names:
            if name not in PLACEMENT_FIELDS:
                columns[name] = col
        elif pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
            if not is_valid_extra_name(name):
                return None
            columns[name] = pc.cast(col, pa.float64())
        # null, string, list and struct columns are annotations (or absent): not scalars
    body = conform_metrics(pa.table(columns))
    for name, values in placement.items():
        body = body.append_column(name, values)
    return body


def _first_metric_line(block: bytes, events_at: list[tuple[int, int, dict]]) -> int:
    """Offset (in lines) of the block's first metric line."""
    skip = {start for start, _, _ in events_at}
    pos, index = 0, 0
    while pos < len(block):
        end = block.find(b"\n", pos)
        end = len(block) if end < 0 else end + 1
        if pos not in skip and block[pos:end].strip():
            return index
        pos, index = end, index + 1
    return index


def _slow_block(path: Path, first_line: int, block: bytes, skip_bad_lines: bool, seen: _SegmentColumn) -> ParsedLog:
    """The block line by line in Python: every error names its line, bad lines can be skipped."""
    rows: list[dict] = []
    events: list[dict] = []
    breaks: set[int] = set()
    num_skipped = 0
    for lineno, raw in enumerate(block.split(b"\n"), first_line):
        try:
            line = raw.decode("utf-8")  # per line, so a bad byte is reported (or skipped) with its line
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"expected one JSON object per line ({err.msg}: column {err.colno})") from err
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
                seen.see("segment" in row, (path, lineno))
                rows.append(row)
            else:
                raise ValueError("expected a metric line with 'step' or an event line with 'event'")
        except LogFormatError:
            raise
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as err:
            if skip_bad_lines:
                num_skipped += 1
                continue
            raise LogFormatError(path, lineno, str(err)) from err
    return ParsedLog.from_rows(rows, events=events, num_skipped=num_skipped, breaks=breaks)
