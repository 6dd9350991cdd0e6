"""Streaming analysis: the same detectors, fed one row at a time for a live run.

``StreamingAnalyzer.update(row)`` appends the row to its segment's column
buffers (amortized O(1), plain Python per row) and advances the detectors once
per ``BLOCK`` buffered rows, or when findings are asked for: the vectorised
detectors then run over a block of rows instead of paying numpy's fixed cost
on every one-row slice (feeding rows in any grouping gives the same findings).
``report()`` assembles findings, segments, health and rollback advice exactly
as ``analyze`` does. Because both paths run the same scanners, streaming and
offline give the same findings on the same rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from runwatch.data.record import resume_steps_of
from runwatch.detectors.advisor import checkpoints_from_events
from runwatch.detectors.analysis import Report, assemble, checkpoint_seconds
from runwatch.detectors.config import DEFAULT, DetectorConfig
from runwatch.detectors.core import Grow
from runwatch.detectors.finding import Finding, SegmentInfo
from runwatch.detectors.rank_stall import pause_seconds
from runwatch.detectors.segment_scan import SegmentDetectors
from runwatch.detectors.segments import (
    FLOAT_COLUMNS,
    infos_from_ranges,
    on_main_line,
    parent_history,
)

BLOCK = 16
"""Rows buffered before the detectors advance (their blocks are 16 observations)."""


class _SegmentBuffer:
    """Column buffers of one segment's rows, in arrival order; its detectors start at the first flush."""

    def __init__(self, segment: int) -> None:
        self.segment = segment
        self.detectors: SegmentDetectors | None = None
        self.cols: dict[str, Grow] = {"step": Grow(np.int64), "found_inf": Grow(np.bool_),
                                      "found_inf_present": Grow(np.bool_)}
        for name in FLOAT_COLUMNS:
            self.cols[name] = Grow(np.float64)
            self.cols[name + "_present"] = Grow(np.bool_)

    def append(self, row: Mapping[str, object]) -> None:
        self.cols["step"].append(int(row["step"]))
        found = row.get("found_inf")
        self.cols["found_inf"].append(bool(found or False))
        self.cols["found_inf_present"].append(found is not None)
        for name in FLOAT_COLUMNS:
            value = row.get(name)
            present = value is not None
            self.cols[name].append(float(value) if present else math.nan)
            self.cols[name + "_present"].append(present)

    def extend(self, table: pa.Table) -> None:
        """Rows as one Arrow table: what ``append`` does row by row, column by column (a null is absent)."""
        steps = table["step"].to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        self.cols["step"].extend(steps)
        names = set(table.column_names)
        if "found_inf" in names:
            col = table["found_inf"]
            self.cols["found_inf"].extend(col.fill_null(False).to_numpy(zero_copy_only=False).astype(np.bool_))
            self.cols["found_inf_present"].extend(col.is_valid().to_numpy(zero_copy_only=False))
        else:
            self.cols["found_inf"].extend(np.zeros(len(steps), np.bool_))
            self.cols["found_inf_present"].extend(np.zeros(len(steps), np.bool_))
        for name in FLOAT_COLUMNS:
            if name in names:
                col = table[name].cast(pa.float64())
                self.cols[name].extend(col.fill_null(math.nan).to_numpy(zero_copy_only=False))
                self.cols[name + "_present"].extend(col.is_valid().to_numpy(zero_copy_only=False))
            else:
                self.cols[name].extend(np.full(len(steps), math.nan))
                self.cols[name + "_present"].extend(np.zeros(len(steps), np.bool_))

    def views(self) -> dict[str, np.ndarray]:
        return {k: g.view for k, g in self.cols.items()}


class StreamingAnalyzer:
    """Live findings for one run (one rank), updated row by row."""

    def __init__(self, events: pa.Table | list[dict] | None = None, *, meta: dict | None = None,
                 config: DetectorConfig | None = None) -> None:
        self.meta, self.config = meta or {}, config or DEFAULT
        self._events: list[dict] = []
        self._segments: dict[int, _SegmentBuffer] = {}
        self._current: int | None = None
        self._pending: dict[int, _SegmentBuffer] = {}  # segments with rows the detectors have not seen
        self._num_pending = 0
        for ev in (events.to_pylist() if isinstance(events, pa.Table) else events or []):
            self.add_event(ev)

    def add_event(self, event: Mapping[str, object]) -> None:
        """A checkpoint, resume or note event (give a resume before its segment's rows)."""
        payload = event.get("payload")
        if not isinstance(payload, str):
            payload = json.dumps(payload if isinstance(payload, Mapping) else
                                 {k: v for k, v in event.items() if k not in ("event", "step", "time", "segment", "rank")})
        self._events.append({"segment": event.get("segment"), "rank": event.get("rank", 0), "event": event["event"],
                             "step": int(event["step"]), "time": event.get("time"), "payload": payload})
        if event["event"] in ("checkpoint", "note") and self._segments:
            # A pause logged while a segment runs applies to its rows not judged yet (the rows after the save).
            pauses = pause_seconds(checkpoint_seconds(self._checkpoints()), self._events)
            for buf in self._segments.values():
                if buf.detectors is not None:
                    buf.detectors.set_pause_seconds(pauses)

    def _checkpoints(self) -> list[dict]:
        return checkpoints_from_events(pa.Table.from_pylist(self._events) if self._events else None)

    def update(self, row: Mapping[str, object]) -> None:
        """One metrics row (the record's keys; None or missing = not logged). A ``segment`` key, or a
        step that does not advance, starts a new segment."""
        buf = self._append(row)
        self._pending[buf.segment] = buf
        self._num_pending += 1
        if self._num_pending >= BLOCK:
            self._flush()

    def update_many(self, rows: list[Mapping[str, object]]) -> None:
        """A flush worth of rows: the same result as ``update`` on each, with one detector pass per segment."""
        for row in rows:
            buf = self._append(row)
            self._pending[buf.segment] = buf
        self._flush()

    def update_table(self, segment: int, table: pa.Table) -> None:
        """One segment's rows as an Arrow table, in step order: the same result as ``update_many`` on its rows
        with that segment, without a Python object per row (a run read from scratch is millions of them)."""
        if table.num_rows == 0:
            return
        segment = int(segment)
        if segment not in self._segments:
            self._flush()  # the parent's rows are judged before its child starts
            self._segments[segment] = _SegmentBuffer(segment)
        self._current = segment
        self._segments[segment].extend(table)
        self._pending[segment] = self._segments[segment]
        self._flush()

    def _flush(self) -> None:
        """Advance the detectors over every buffered row (segments in order: a child reads its parent)."""
        for seg in sorted(self._pending):
            buf = self._pending[seg]
            if buf.detectors is None:
                buf.detectors = self._start(buf)
            buf.detectors.advance(buf.views())
        self._pending, self._num_pending = {}, 0

    def _start(self, buf: _SegmentBuffer) -> SegmentDetectors:
        """A segment's detectors, seeded with its parent's healthy history (as ``analyze`` does)."""
        earlier = {k: b.views() for k, b in self._segments.items() if k < buf.segment}
        findings = [f for k, b in sorted(self._segments.items()) if k < buf.segment and b.detectors is not None
                    for f in b.detectors.findings()]
        history, resume_step, trained_lr = parent_history(
            buf.segment, int(buf.cols["step"].view[0]), {**earlier, buf.segment: buf.views()},
            resume_steps_of(self._events), findings, self.config.lr, self.config.slowdown.history_obs)
        return SegmentDetectors(buf.segment, self.config, meta=self.meta,
                                checkpoint_seconds=pause_seconds(checkpoint_seconds(self._checkpoints()), self._events),
                                history=history, resume_step=resume_step, trained_lr=trained_lr)

    def _append(self, row: Mapping[str, object]) -> _SegmentBuffer:
        segment = row.get("segment")
        if segment is None:
            segment = self._current if self._current is not None else 0
            buf = self._segments.get(segment)
            if buf is not None and buf.cols["step"].size and int(row["step"]) <= buf.cols["step"].view[-1]:
                segment += 1
        segment = int(segment)
        if segment not in self._segments:
            self._flush()  # the parent's rows are judged before its child starts
            self._segments[segment] = _SegmentBuffer(segment)
        self._current = segment
        buf = self._segments[segment]
        buf.append(row)
        return buf

    def raw_findings(self) -> list[Finding]:
        self._flush()
        out: list[Finding] = []
        for seg in sorted(self._segments):
            det = self._segments[seg].detectors
            if det is not None:
                out.extend(det.findings())
        return out

    def segments(self) -> list[SegmentInfo]:
        bufs = {k: b.cols["step"].view for k, b in self._segments.items() if b.cols["step"].size}
        return infos_from_ranges({k: int(v.min()) for k, v in bufs.items()}, {k: int(v.max()) for k, v in bufs.items()},
                                 resume_steps_of(self._events))

    def main_line(self) -> dict[str, np.ndarray]:
        """For every step, the row of the latest segment covering it (as ``Store.rows``'s ``main``)."""
        infos = self.segments()
        parts = []
        for info in infos:
            views = self._segments[info.segment].views()
            keep = on_main_line(views["step"], info.segment, infos)
            parts.append({k: v[keep] for k, v in views.items()})
        if not parts:
            return _SegmentBuffer(0).views()
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.argsort(merged["step"], kind="stable")
        return {k: v[order] for k, v in merged.items()}

    def report(self, now: float | None = None, present_paths: set[str] | None = None) -> Report:
        return assemble(self.raw_findings(), self.segments(), self.main_line(), self._checkpoints(), now,
                        present_paths, self.config)

    def findings(self, now: float | None = None) -> list[Finding]:
        return self.report(now).findings
