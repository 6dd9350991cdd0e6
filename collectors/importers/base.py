"""What every importer shares: the parsed form of a log and the all-or-nothing write.

A parser turns files into a ``ParsedLog`` (metric rows and events in file
order) and never touches the store; ``write_import`` assigns segments, splits
by segment and rank and lands everything in one ``StagedWrite``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.data.record import metrics_table
from runwatch.data.storage import StagedWrite, data_files, run_exists


class LogFormatError(ValueError):
    """A line of an archived log is not what its format promises."""

    def __init__(self, path: str | Path, line: int | None, expected: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {expected}")
        self.path, self.line, self.expected = str(path), line, expected


@dataclass
class ParsedLog:
    """Metric rows and events of one import, in file order.

    ``metrics`` has the record's columns (any subset, ``step`` required), extra
    float columns, and optionally ``segment`` and ``rank``. Each event is a dict
    with ``event``, ``step`` and payload keys; ``row_index`` (the number of
    metric rows parsed before it) places it in the stream, and a ``resume``
    event starts a new segment there unless rows carry explicit segments.
    """

    metrics: pa.Table
    events: list[dict] = field(default_factory=list)
    num_skipped: int = 0
    # Row indices where a new segment starts for a reason the steps cannot show
    # (a resume line, a long wall-clock gap), besides a step going backwards.
    breaks: set[int] = field(default_factory=set)
    # Where each row was printed: line index (plus the fraction of the line before
    # it), files one after another FILE_STRIDE apart. Lets two readings of one
    # stdout be joined in stream order; None where a parser does not say.
    positions: np.ndarray | None = None
    # True when the log printed no step and rows are numbered in order: such
    # steps are not training steps, so no other reading can be joined on them.
    ordinal_steps: bool = False
    # Lines of a kind the format prints that were recognised and deliberately not
    # read (a summary over the whole run, another rank's copy of a line).
    num_ignored: int = 0

    @classmethod
    def from_rows(cls, rows: Sequence[dict], **kw: object) -> "ParsedLog":
        return cls(metrics=metrics_table(rows) if rows else metrics_table([]), **kw)


@dataclass(frozen=True)
class ImportResult:
    run: str
    num_rows: int
    num_events: int
    num_segments: int
    num_skipped: int
    files: tuple[Path, ...]
    # The reading that landed: a format name, or names joined by "+" (see importers.auto).
    format: str = ""
    num_ignored: int = 0


# Stream positions of consecutive files are this far apart (more lines than any log has).
FILE_STRIDE = float(2**33)


def assign_segments(steps: np.ndarray, breaks: set[int] = frozenset()) -> np.ndarray:
    """Segment id per row: a new segment where the step does not advance, or at a break."""
    steps = np.asarray(steps, dtype=np.int64)
    new = np.zeros(len(steps), dtype=bool)
    if len(steps) > 1:
        new[1:] = steps[1:] <= steps[:-1]
    for i in breaks:
        if 0 < i < len(steps):
            new[i] = True
    return np.cumsum(new).astype(np.int32)


def _segments_for(table: pa.Table, ranks: np.ndarray, breaks: set[int]) -> np.ndarray:
    if "segment" in table.column_names:
        if table["segment"].null_count:
            raise ValueError("some rows carry a segment and others do not")
        return table["segment"].to_numpy(zero_copy_only=False).astype(np.int32)
    steps = table["step"].to_numpy(zero_copy_only=False)
    if "rank" not in table.column_names:
        return assign_segments(steps, breaks)
    # Interleaved ranks: each rank's own step sequence decides its segments.
    segments = np.zeros(len(steps), dtype=np.int32)
    for r in np.unique(ranks):
        idx = np.flatnonzero(ranks == r)
        local_breaks = {int(np.searchsorted(idx, b)) for b in breaks}
        segments[idx] = assign_segments(steps[idx], local_breaks)
    return segments


def row_segments(parsed: ParsedLog) -> np.ndarray:
    """Segment id per metric row, as ``write_import`` assigns them."""
    table = parsed.metrics
    ranks = (pc.fill_null(table["rank"], 0).to_numpy(zero_copy_only=False).astype(np.int32)
             if "rank" in table.column_names else np.zeros(table.num_rows, np.int32))
    return _segments_for(table, ranks, parsed.breaks)


def event_segment(ev: dict, segments: np.ndarray) -> int:
    """The segment of an event: its own, else the row before it (a resume: the row after it)."""
    if ev.get("segment") is not None:
        return int(ev["segment"])
    n = len(segments)
    pos = min(int(ev.get("row_index", n)), n)
    if ev["event"] == "resume" or pos == 0:
        return int(segments[pos]) if pos < n else (int(segments[-1]) + 1 if n else 0)
    return int(segments[pos - 1])


def write_import(root: str | Path, run: str, parsed: ParsedLog, *, replace: bool = False,
                 meta: dict | None = None) -> ImportResult:
    """Land a parsed log in the store as run ``run``: every file or none."""
    if parsed.metrics.num_rows == 0:
        raise ValueError("nothing to import: expected at least one metric line")
    if run_exists(root, run) and not replace:
        raise ValueError(f"run {run!r} already exists under {root}; choose another --run or pass --replace")
    old_files = data_files(root, run, "metrics") + data_files(root, run, "events") if replace else []
    table = parsed.metrics
    if table.num_rows and pc.any(pc.is_null(table["step"])).as_py():
        raise ValueError("a metric row has no step")
    # A line without a rank was printed by rank 0 (the rank is optional per line).
    ranks = (pc.fill_null(table["rank"], 0).to_numpy(zero_copy_only=False).astype(np.int32)
             if "rank" in table.column_names else np.zeros(table.num_rows, np.int32))
    segments = _segments_for(table, ranks, parsed.breaks)
    if (segments < 0).any() or (ranks < 0).any():
        raise ValueError("segment and rank must be >= 0")
    body = table.drop_columns([c for c in ("segment", "rank") if c in table.column_names])

    events_by_part: dict[tuple[int, int], list[dict]] = {}
    for ev in parsed.events:
        seg = event_segment(ev, segments)
        rank = int(ev.get("rank") or 0)
        clean = {k: v for k, v in ev.items() if k not in ("row_index", "segment", "rank")}
        events_by_part.setdefault((seg, rank), []).append(clean)

    files: list[Path] = []
    with StagedWrite(root) as staged:
        parts = np.unique(np.stack([segments, ranks], axis=1), axis=0)
        for seg, rank in parts.tolist():
            # One partition (the usual import) is the whole table: no filter pass over millions of rows.
            part = body if len(parts) == 1 else body.filter(pa.array((segments == seg) & (ranks == rank)))
            files.append(staged.add_metrics(run, seg, rank, part))
        for (seg, rank), evs in sorted(events_by_part.items()):
            path = staged.add_events(run, seg, rank, evs)
            if path is not None:
                files.append(path)
        files.append(staged.add_run_meta(run, meta or {}))
    for path in old_files:
        path.unlink(missing_ok=True)
    num_segments = len(set(segments.tolist()) | {s for s, _ in events_by_part})
    return ImportResult(run, table.num_rows, len(parsed.events), num_segments, parsed.num_skipped, tuple(files),
                        num_ignored=parsed.num_ignored)
