"""The fleet detectors' series: one segment's rows of every rank, aligned by step, one column per rank.

``FleetScan`` takes each rank's rows of one segment as they come (in step
order per rank), aligns the steps every member rank logged (up to the step
the slowest rank has reached: a step below it that some rank lacks will
never come), and feeds the registered fleet scanners (``scope='fleet'``:
``straggler``, ``rank_disagreement``) the aligned columns, shaped (steps,
ranks). Offline analysis adds all rows and advances once; the streaming
analyzer adds each flush and advances; the scanners judge only what is
complete, so both give the same findings. No collective is ever needed: the
ranks are compared here, from what each wrote on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce

import numpy as np

from runwatch.detectors.config import DetectorConfig
from runwatch.detectors.core import Grow
from runwatch.detectors.finding import Finding
from runwatch.detectors.registry import REGISTRY, scanner_class
from runwatch.detectors.scanner import ScanContext

FLEET_COLUMNS: tuple[str, ...] = ("time", "forward_time", "data_time", "grad_norm", "param_norm")
"""Per-rank columns the fleet detectors read: wall time, the forward pass and the input wait before it
(``Monitor``'s timing hooks), the all-reduced gradient norm and the parameter checksum."""


class Grow2D:
    """A (rows, columns) array growing along rows with amortized O(1) appends."""

    def __init__(self, num_columns: int, dtype: type = np.float64) -> None:
        self._data = np.empty((64, num_columns), dtype=dtype)
        self.size = 0

    def extend(self, block: np.ndarray) -> None:
        need = self.size + len(block)
        if need > len(self._data):
            grown = np.empty((max(need, 2 * len(self._data)), self._data.shape[1]), dtype=self._data.dtype)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size:need] = block
        self.size = need

    @property
    def view(self) -> np.ndarray:
        return self._data[: self.size]


class FleetScan:
    """The fleet scanners of one segment over its member ranks' aligned steps."""

    def __init__(self, segment: int, ranks: list[int], config: DetectorConfig, meta: Mapping | None = None) -> None:
        self.segment, self.ranks = segment, sorted(ranks)
        self.rows: dict[int, dict[str, Grow]] = {r: self._columns() for r in self.ranks}
        width = len(self.ranks)
        self.aligned: dict[str, Grow | Grow2D] = {"step": Grow(np.int64)}
        for col in FLEET_COLUMNS:
            self.aligned[col] = Grow2D(width)
            self.aligned[col + "_present"] = Grow2D(width, np.bool_)
        self.done: int | None = None  # the last step aligned so far
        self.scanners = [scanner_class(spec.kind)(ScanContext(segment=segment, config=config, meta=dict(meta or {})))
                         for spec in REGISTRY if spec.scope == "fleet"]

    @staticmethod
    def _columns() -> dict[str, Grow]:
        cols: dict[str, Grow] = {"step": Grow(np.int64)}
        for col in FLEET_COLUMNS:
            cols[col], cols[col + "_present"] = Grow(np.float64), Grow(np.bool_)
        return cols

    def add(self, rank: int, cols: Mapping[str, np.ndarray]) -> None:
        """Rows of one rank (``step`` and any of ``FLEET_COLUMNS``, NaN or absent where not logged), in step
        order; a step at or below the rank's last one is a repeat and is left out (the first one counts)."""
        if rank not in self.rows:
            return  # not a member of this segment
        buf = self.rows[rank]
        steps = np.asarray(cols["step"], dtype=np.int64)
        last = buf["step"].view[-1] if buf["step"].size else np.iinfo(np.int64).min
        keep = _first_increasing(steps, last)
        if not keep.any():
            return
        buf["step"].extend(steps[keep])
        for col in FLEET_COLUMNS:
            values = np.asarray(cols[col], dtype=np.float64) if col in cols else np.full(len(steps), np.nan)
            present = np.asarray(cols[col + "_present"], dtype=bool) if col + "_present" in cols else ~np.isnan(values)
            buf[col].extend(values[keep])
            buf[col + "_present"].extend(present[keep])

    def advance(self) -> None:
        """Align the steps every member logged up to the slowest member's last step, and scan them."""
        if any(self.rows[r]["step"].size == 0 for r in self.ranks):
            return
        frontier = min(int(self.rows[r]["step"].view[-1]) for r in self.ranks)
        if self.done is not None and frontier <= self.done:
            return
        lo = np.iinfo(np.int64).min if self.done is None else self.done
        spans = {}
        for r in self.ranks:
            steps = self.rows[r]["step"].view
            spans[r] = (int(np.searchsorted(steps, lo, side="right")), int(np.searchsorted(steps, frontier, side="right")))
        common = reduce(np.intersect1d, [self.rows[r]["step"].view[a:b] for r, (a, b) in spans.items()])
        self.done = frontier
        if not len(common):
            return
        self.aligned["step"].extend(common)
        for col in FLEET_COLUMNS:
            for suffix in ("", "_present"):
                parts = []
                for r, (a, b) in spans.items():
                    steps = self.rows[r]["step"].view[a:b]
                    parts.append(self.rows[r][col + suffix].view[a:b][np.searchsorted(steps, common)])
                self.aligned[col + suffix].extend(np.stack(parts, axis=1))
        views = self.views()
        for scanner in self.scanners:
            scanner.advance(views)

    def views(self) -> dict[str, np.ndarray]:
        out = {name: grow.view for name, grow in self.aligned.items()}
        out["rank"] = np.array(self.ranks, dtype=np.int64)
        return out

    def findings(self) -> list[Finding]:
        views = self.views()
        return [f for scanner in self.scanners for f in scanner.findings(views)]

    def rank_rows(self, rank: int) -> dict[str, np.ndarray]:
        """One member's rows so far (for attributing a stall to the rank that held the others up)."""
        return {name: grow.view for name, grow in self.rows[rank].items()}


def _first_increasing(steps: np.ndarray, last: int) -> np.ndarray:
    """Which steps extend a strictly increasing sequence that ended at ``last`` (repeats keep the first)."""
    running = np.maximum.accumulate(np.concatenate([[last], steps]))[:-1]
    return steps > running
