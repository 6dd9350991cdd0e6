"""What every importer shares: the parsed form of a log and the all-or-nothing write.

A parser turns files into a ``ParsedLog`` (metric rows and events in file
order), or a stream of them for a large file, and never touches the store.
``write_import_stream`` takes the run's lock (a second writer fails at once,
naming the holder), assigns segments as the chunks arrive, writes each
partition into a ``StagedRun`` beside the root and switches the whole run in
at the end: every file or none, and a kill at any point leaves the old run
(or no run) or the new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.data.locks import RunBusy, RunLock, live_writers
from runwatch.data.record import metrics_table
from runwatch.data.roots import is_url
from runwatch.data.staging import StagedRun, recover
from runwatch.data.storage import run_exists


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
    In a stream of chunks, indices count from the chunk's first row; an index
    equal to the chunk's row count means "before the next chunk's first row".
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
    files: tuple[Path | str, ...]
    # The reading that landed: a format name, or names joined by "+" (see importers.auto).
    format: str = ""
    num_ignored: int = 0
    # What the import read around, one line each (``textlog.IMPORT_NOTES``: a last line cut short, not read).
    notes: tuple[str, ...] = ()


# Stream positions of consecutive files are this far apart (more lines than any log has).
FILE_STRIDE = float(2**33)


class SegmentPlacer:
    """Segments of a stream of chunks, one rule for all importers.

    Without explicit segments, each rank's own step sequence decides: a new
    segment where its step does not advance, or at its first row after a
    break (a resume line, a long wall-clock gap). A line without a rank was
    printed by rank 0. State carries over from chunk to chunk, so a file is
    placed the same whether it arrives whole or in blocks.
    """

    def __init__(self) -> None:
        self.explicit: bool | None = None
        self.last_step: dict[int, int] = {}
        self.segment: dict[int, int] = {}
        self.pending_break: set[int] = set()  # ranks whose next row starts a new segment

    def place(self, table: pa.Table, breaks: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """(segments, ranks) of the chunk's rows; ``breaks`` are chunk-relative (>= rows: the next chunk)."""
        n = table.num_rows
        ranks = (pc.fill_null(table["rank"], 0).to_numpy(zero_copy_only=False).astype(np.int32)
                 if "rank" in table.column_names else np.zeros(n, np.int32))
        explicit = "segment" in table.column_names
        if n and self.explicit is not None and explicit != self.explicit:
            raise ValueError("some rows carry a segment and others do not")
        if n:
            self.explicit = explicit
        if explicit:
            if table["segment"].null_count:
                raise ValueError("some rows carry a segment and others do not")
            return table["segment"].to_numpy(zero_copy_only=False).astype(np.int32), ranks
        steps = table["step"].to_numpy(zero_copy_only=False).astype(np.int64)
        segments = np.zeros(n, np.int32)
        breaks = sorted({int(b) for b in breaks})
        present = np.unique(ranks).tolist()
        for r in present:
            idx = np.flatnonzero(ranks == r)
            segments[idx] = self._place_rank(r, idx, steps[idx], breaks)
        if breaks:  # a rank seen before but silent in this chunk starts a new segment at its next row
            self.pending_break.update(r for r in self.last_step if r not in present)
        return segments, ranks

    def _place_rank(self, rank: int, idx: np.ndarray, steps: np.ndarray, breaks: list[int]) -> np.ndarray:
        new = np.zeros(len(steps), dtype=bool)
        new[1:] = steps[1:] <= steps[:-1]
        prev = self.last_step.get(rank)
        if prev is not None:
            new[0] = steps[0] <= prev or rank in self.pending_break
        self.pending_break.discard(rank)
        for b in breaks:
            i = int(np.searchsorted(idx, b))
            if i == len(steps):
                self.pending_break.add(rank)  # the break falls after this rank's last row here
            elif i > 0 or prev is not None:  # a rank's very first row never starts a new segment
                new[i] = True
        out = self.segment.get(rank, 0) + np.cumsum(new).astype(np.int32)
        self.segment[rank], self.last_step[rank] = int(out[-1]), int(steps[-1])
        return out


class _EventPlacer:
    """Which partition each event lands in, from the rows around it (resolved once they are known)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[int, dict]] = []  # placed by the segment of the next row, not seen yet
        self.prev_segment: int | None = None
        self._landed: dict[tuple[int, int], list[tuple[int, dict]]] = {}
        self.num_events = 0

    def _land(self, order: int, ev: dict, seg: int) -> None:
        rank = int(ev.get("rank") or 0)
        clean = {k: v for k, v in ev.items() if k not in ("row_index", "segment", "rank")}
        self._landed.setdefault((seg, rank), []).append((order, clean))

    @property
    def by_part(self) -> dict[tuple[int, int], list[dict]]:
        """Events per (segment, rank), in file order whenever each was placed."""
        return {part: [ev for _, ev in sorted(evs, key=lambda e: e[0])] for part, evs in self._landed.items()}

    def add(self, events: list[dict], segments: np.ndarray) -> None:
        """Place a chunk's events; ``segments`` are the chunk's rows' segments."""
        n = len(segments)
        if n and self.waiting:
            for order, ev in self.waiting:
                self._land(order, ev, int(segments[0]))
            self.waiting = []
        for ev in events:
            order = self.num_events
            self.num_events += 1
            pos = min(int(ev.get("row_index", n)), n)
            own = ev.get("segment") is not None
            if not own and pos == 0 and self.prev_segment is not None and ev["event"] != "resume":
                self._land(order, ev, self.prev_segment)  # the row before it came in an earlier chunk
            elif not own and pos == n and (ev["event"] == "resume" or n == 0):
                self.waiting.append((order, ev))  # placed by the next row, which comes in a later chunk
            else:
                self._land(order, ev, event_segment(ev, segments))
        if n:
            self.prev_segment = int(segments[-1])

    def finish(self) -> None:
        for order, ev in self.waiting:  # nothing followed: the event opens the next segment
            self._land(order, ev, self.prev_segment + 1 if self.prev_segment is not None else 0)
        self.waiting = []


def _check_target(root: str | Path, run: str, replace: bool) -> None:
    """Refuse an existing run without ``replace``, and any run a live ``Monitor`` is writing."""
    if run_exists(root, run) and not replace:
        raise ValueError(f"run {run!r} already exists under {root}; choose another --run or pass --replace")
    writers = live_writers(root, run)
    if writers:
        raise RunBusy(f"run {run!r} under {root} is being recorded: {writers[0].describe()}; "
                      "stop it before replacing the run")


def row_segments(parsed: ParsedLog) -> np.ndarray:
    """Segment id per metric row, as ``write_import`` assigns them."""
    return SegmentPlacer().place(parsed.metrics, parsed.breaks)[0]


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
    return write_import_stream(root, run, [parsed], replace=replace, meta=meta)


def write_import_stream(root: str | Path, run: str, chunks: Iterable[ParsedLog], *, replace: bool = False,
                        meta: dict | None = None, source: str | None = None) -> ImportResult:
    """Land a stream of parsed chunks as run ``run``: memory bounded by a chunk, every file or none.

    The run's lock is taken before the first chunk is parsed, so a second
    writer fails at once; what a killed writer left in staging is finished or
    undone first. ``source`` (the input files) prefixes an empty import's error.
    """
    action = "import --replace" if replace else "import"

    def build(staged: StagedRun) -> _Totals:
        totals = _write_chunks(staged, chunks, source)
        staged.add_run_meta({**(meta or {}), **({"ignored_lines": totals.num_ignored} if totals.num_ignored else {})})
        return totals

    if is_url(root):  # built locally, then uploaded through one op record (data/objwrite.py)
        from runwatch.data.objwrite import replace_run

        totals, files = replace_run(str(root), run, build, replace=replace, action=action)
    else:
        with RunLock(root, run, action):
            recover(root, run)
            _check_target(root, run, replace)
            staged = StagedRun(root, run)
            try:
                totals = build(staged)
                files = staged.commit()
            except BaseException:
                staged.abort()
                raise
    return ImportResult(run, totals.num_rows, totals.num_events, len(totals.segments), totals.num_skipped,
                        tuple(files), num_ignored=totals.num_ignored)


@dataclass
class _Totals:
    """What an import wrote, counted as the chunks go by."""

    num_rows: int = 0
    num_events: int = 0
    num_skipped: int = 0
    num_ignored: int = 0
    segments: set[int] = field(default_factory=set)


def _partitions(segments: np.ndarray, ranks: np.ndarray) -> list[tuple[int, int, np.ndarray | None]]:
    """(segment, rank, row mask) of each partition in a chunk; mask None when the chunk is one partition."""
    if not len(segments):
        return []
    if segments.min() == segments.max() and ranks.min() == ranks.max():
        return [(int(segments[0]), int(ranks[0]), None)]
    keys = segments.astype(np.int64) << 32 | ranks.astype(np.int64)
    return [(int(k >> 32), int(k & 0xFFFFFFFF), keys == k) for k in np.unique(keys).tolist()]


def _write_parts(staged: StagedRun, table: pa.Table, parts: list[tuple[int, int, np.ndarray | None]]) -> None:
    body = table.drop_columns([c for c in ("segment", "rank") if c in table.column_names])
    for seg, rank, mask in parts:
        # One partition (the usual import) is the whole chunk: no filter pass over it.
        staged.add_metrics(seg, rank, body if mask is None else body.filter(pa.array(mask)))


def _write_chunks(staged: StagedRun, chunks: Iterable[ParsedLog], source: str | None) -> _Totals:
    """Write every chunk's partitions, then the events."""
    placer, events, totals = SegmentPlacer(), _EventPlacer(), _Totals()
    # The next chunk is parsed while this one is written (Arrow releases the GIL in both); one
    # write in flight at a time keeps memory at two chunks.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="runwatch-import") as pool:
        writing = None
        for chunk in chunks:
            table = chunk.metrics
            totals.num_skipped += chunk.num_skipped
            totals.num_ignored += chunk.num_ignored
            if table.num_rows and pc.any(pc.is_null(table["step"])).as_py():
                raise ValueError("a metric row has no step")
            segments, ranks = placer.place(table, chunk.breaks)
            if (segments < 0).any() or (ranks < 0).any():
                raise ValueError("segment and rank must be >= 0")
            events.add(chunk.events, segments)
            parts = _partitions(segments, ranks)
            totals.segments.update(seg for seg, _, _ in parts)
            if writing is not None:
                writing.result()
            writing = pool.submit(_write_parts, staged, table, parts)
            totals.num_rows += table.num_rows
        if writing is not None:
            writing.result()
    if totals.num_rows == 0:
        skipped = f" ({totals.num_skipped} bad line{'s' * (totals.num_skipped != 1)} skipped)" \
            if totals.num_skipped else ""
        raise ValueError(f"{source + ': ' if source else ''}nothing to import: expected at least one metric line"
                         + skipped)
    events.finish()
    by_part = events.by_part
    for (seg, rank), evs in sorted(by_part.items()):
        staged.add_events(seg, rank, evs)
    totals.num_events = events.num_events
    totals.segments.update(seg for seg, _ in by_part)
    return totals
