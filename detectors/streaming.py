"""Streaming analysis: the same detectors, fed one row at a time for a live run.

``StreamingAnalyzer.update(row)`` appends the row to its segment's column
buffers (amortized O(1), plain Python per row) and advances the detectors once
per ``BLOCK`` buffered rows, or when findings are asked for: the vectorised
detectors then run over a block of rows instead of paying numpy's fixed cost on
every one-row slice (feeding rows in any grouping gives the same findings); ``report()`` assembles findings, segments, health and
rollback advice exactly as ``analyze`` does. Because both paths run the same
scanners, streaming and offline give the same findings on the same rows.
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
from runwatch.detectors.finding import Finding, SegmentInfo
from runwatch.detectors.segment_scan import SegmentDetectors
from runwatch.detectors.segments import FLOAT_COLUMNS, infos_from_ranges, on_main_line
from runwatch.detectors.series import BLOCK, Grow


class _SegmentBuffer:
    """Column buffers of one segment's rows, in arrival order."""

    def __init__(self, segment: int, seconds: dict[int, float]) -> None:
        self.detectors = SegmentDetectors(segment, seconds)
        self.cols: dict[str, Grow] = {"step": Grow(np.int64), "found_inf": Grow(np.bool_)}
        for name in FLOAT_COLUMNS:
            self.cols[name] = Grow(np.float64)
            self.cols[name + "_present"] = Grow(np.bool_)

    def append(self, row: Mapping[str, object]) -> None:
        self.cols["step"].append(int(row["step"]))
        self.cols["found_inf"].append(bool(row.get("found_inf") or False))
        for name in FLOAT_COLUMNS:
            value = row.get(name)
            present = value is not None
            self.cols[name].append(float(value) if present else math.nan)
            self.cols[name + "_present"].append(present)

    def views(self) -> dict[str, np.ndarray]:
        return {k: g.view for k, g in self.cols.items()}


class StreamingAnalyzer:
    """Live findings for one run (one rank), updated row by row."""

    def __init__(self, events: pa.Table | list[dict] | None = None) -> None:
        self._events: list[dict] = []
        self._segments: dict[int, _SegmentBuffer] = {}
        self._current: int | None = None
        self._pending: dict[int, _SegmentBuffer] = {}  # segments with rows the detectors have not seen
        self._num_pending = 0
        for ev in (events.to_pylist() if isinstance(events, pa.Table) else events or []):
            self.add_event(ev)

    def add_event(self, event: Mapping[str, object]) -> None:
        """A checkpoint (or note) event; checkpoint write times count from segments started after it."""
        payload = event.get("payload")
        if not isinstance(payload, str):
            payload = json.dumps(payload if isinstance(payload, Mapping) else
                                 {k: v for k, v in event.items() if k not in ("event", "step", "time", "segment", "rank")})
        self._events.append({"segment": event.get("segment"), "rank": event.get("rank", 0), "event": event["event"],
                             "step": int(event["step"]), "time": event.get("time"), "payload": payload})

    def _checkpoints(self) -> list[dict]:
        return checkpoints_from_events(pa.Table.from_pylist(self._events) if self._events else None)

    def update(self, row: Mapping[str, object]) -> None:
        """One metrics row (the record's keys; None or missing = not logged). A ``segment`` key, or a
        step that does not advance, starts a new segment."""
        buf = self._append(row)
        self._pending[buf.detectors.segment] = buf
        self._num_pending += 1
        if self._num_pending >= BLOCK:
            self._flush()

    def update_many(self, rows: list[Mapping[str, object]]) -> None:
        """A flush worth of rows: the same result as ``update`` on each, with one detector pass per segment."""
        for row in rows:
            buf = self._append(row)
            self._pending[buf.detectors.segment] = buf
        self._flush()

    def _flush(self) -> None:
        """Advance the detectors over every buffered row (segments are judged independently)."""
        for buf in self._pending.values():
            buf.detectors.advance(buf.views())
        self._pending, self._num_pending = {}, 0

    def _append(self, row: Mapping[str, object]) -> _SegmentBuffer:
        segment = row.get("segment")
        if segment is None:
            segment = self._current if self._current is not None else 0
            buf = self._segments.get(segment)
            if buf is not None and buf.cols["step"].size and int(row["step"]) <= buf.cols["step"].view[-1]:
                segment += 1
        segment = int(segment)
        if segment not in self._segments:
            self._segments[segment] = _SegmentBuffer(segment, checkpoint_seconds(self._checkpoints()))
        self._current = segment
        buf = self._segments[segment]
        buf.append(row)
        return buf

    def raw_findings(self) -> list[Finding]:
        self._flush()
        out: list[Finding] = []
        for seg in sorted(self._segments):
            out.extend(self._segments[seg].detectors.findings())
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
            return _SegmentBuffer(0, {}).views()
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.argsort(merged["step"], kind="stable")
        return {k: v[order] for k, v in merged.items()}

    def report(self, now: float | None = None, present_paths: set[str] | None = None) -> Report:
        return assemble(self.raw_findings(), self.segments(), self.main_line(), self._checkpoints(), now, present_paths)

    def findings(self, now: float | None = None) -> list[Finding]:
        return self.report(now).findings
