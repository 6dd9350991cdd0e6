"""Judging a run across its ranks: every rank's shard, the fleet detectors and per-rank stalls, offline and live.

``analyze_fleet`` (offline: ``judge_run``) and ``FleetStreamingAnalyzer``
(live: ``runwatch watch`` and the dashboard) do the same four things:

1. every rank's rows are judged by the per-rank detectors (``analyze``, or one
   ``StreamingAnalyzer`` per rank: the same findings);
2. one incident seen on every rank of its segment is one finding about the
   run (``rank`` None); seen on some ranks only, it is one finding per rank
   that saw it, so a NaN on rank 3 alone names rank 3. A finished stall seen
   on every rank names the rank whose input wait and forward pass cover it;
3. the fleet detectors compare the ranks step by step (``fleet.FleetScan``);
4. a live run gets the per-rank live stall check (``rank_stall``).

Then open/closed, rollback advice and health as ``analyze`` does, on the
lowest rank's main line. Hosts come from ``run.json`` (``rank_hosts``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.data.record import rank_hosts, segment_members
from runwatch.detectors.advisor import advise, checkpoints_from_events
from runwatch.detectors.analysis import (
    Report,
    analyze,
    assemble,
    checkpoint_seconds,
    health_of,
    mark_open,
    overlaps,
)
from runwatch.detectors.config import DEFAULT, DetectorConfig
from runwatch.detectors.finding import Finding, SegmentInfo
from runwatch.detectors.fleet import FLEET_COLUMNS, FleetScan
from runwatch.detectors.rank_stall import RankProgress, live_rank_stalls, longest_pause, pause_seconds, stall_holder
from runwatch.detectors.segments import main_line
from runwatch.detectors.streaming import StreamingAnalyzer

Heartbeats = Mapping[tuple[int, int], Mapping]
"""(segment, rank) -> that rank's heartbeat (``Monitor``'s ``heartbeat.json``)."""


def event_row(event: Mapping) -> dict:
    """An event as ``Store.events`` gives it: segment, rank, event, step, time, payload (JSON text)."""
    payload = event.get("payload")
    if not isinstance(payload, str):
        payload = json.dumps(payload if isinstance(payload, Mapping) else
                             {k: v for k, v in event.items() if k not in ("event", "step", "time", "segment", "rank")})
    return {"segment": event.get("segment"), "rank": event.get("rank", 0), "event": event["event"],
            "step": int(event["step"]), "time": event.get("time"), "payload": payload}


def table_columns(table: pa.Table) -> dict[str, np.ndarray]:
    """``step`` and the fleet columns of one rank's rows (NaN and a False ``_present`` where not logged)."""
    out = {"step": table["step"].to_numpy(zero_copy_only=False).astype(np.int64)}
    for col in FLEET_COLUMNS:
        if col in table.column_names:
            present = pc.is_valid(table[col]).to_numpy(zero_copy_only=False)
            values = pc.cast(table[col], pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)
            out[col], out[col + "_present"] = np.where(present, values, np.nan), present
    return out


class FleetState:
    """Every rank's fleet columns per segment and the fleet scanners over them; shared by both paths."""

    def __init__(self, meta: Mapping | None, config: DetectorConfig) -> None:
        self.meta, self.config = dict(meta or {}), config
        self.cols: dict[int, dict[int, dict[str, list[np.ndarray]]]] = {}  # segment -> rank -> column parts
        self.scans: dict[int, FleetScan] = {}

    def add(self, segment: int, rank: int, cols: Mapping[str, np.ndarray]) -> None:
        parts = self.cols.setdefault(segment, {}).setdefault(rank, {})
        n = len(cols["step"])
        for name in ("step", *FLEET_COLUMNS):
            values = np.asarray(cols[name]) if name in cols else np.full(n, np.nan)
            parts.setdefault(name, []).append(values)
            if name != "step":
                present = cols.get(name + "_present", ~np.isnan(values))
                parts.setdefault(name + "_present", []).append(np.asarray(present, dtype=bool))
        scan = self.scans.get(segment)
        if scan is not None and rank in scan.rows:
            scan.add(rank, cols)

    def set_meta(self, meta: Mapping) -> None:
        if dict(meta) != self.meta:
            self.meta = dict(meta)
            self.scans.clear()  # membership or replication may have changed: scan again from the rows

    def members(self, segment: int) -> list[int]:
        registered = segment_members(self.meta, segment)
        return registered if registered is not None else sorted(self.cols.get(segment, {}))

    def rank_rows(self, segment: int) -> dict[int, dict[str, np.ndarray]]:
        """Each rank's rows of one segment, as whole columns (step order, repeats left in)."""
        return {rank: {name: np.concatenate(chunks) for name, chunks in parts.items()}
                for rank, parts in self.cols.get(segment, {}).items()}

    def tail(self, segment: int, rank: int, n: int = 65) -> tuple[np.ndarray, np.ndarray]:
        """The last ``n`` (step, time) rows of one rank in one segment, without joining all its parts."""
        parts = self.cols.get(segment, {}).get(rank)
        if not parts:
            return np.empty(0, np.int64), np.empty(0)
        steps, times, have = [], [], 0
        for st, tm in zip(reversed(parts["step"]), reversed(parts["time"])):
            steps.append(st)
            times.append(tm)
            have += len(st)
            if have >= n:
                break
        return np.concatenate(steps[::-1])[-n:], np.concatenate(times[::-1])[-n:]

    def findings(self) -> list[Finding]:
        out = []
        for segment in sorted(self.cols):
            members = self.members(segment)
            scan = self.scans.get(segment)
            if scan is None or scan.ranks != members:
                scan = self.scans[segment] = FleetScan(segment, members, self.config, self.meta)
                for rank, rows in self.rank_rows(segment).items():
                    scan.add(rank, rows)
            scan.advance()
            out.extend(scan.findings())
        return out


def combine(reports: Mapping[int, Report], fleet: FleetState) -> list[Finding]:
    """Per-rank findings as incidents: one about the run when every rank of its segment saw it, else one per
    rank that did (see the module docstring)."""
    incidents: list[list[tuple[int, Finding]]] = []
    for rank in sorted(reports):
        for f in reports[rank].findings:
            match = next((inc for inc in incidents if inc[0][1].kind == f.kind and overlaps(inc[0][1], f)
                          and all(r != rank for r, _ in inc)), None)
            if match is None:
                incidents.append([(rank, f)])
            else:
                match.append((rank, f))
    out = []
    for inc in incidents:
        first, segment = inc[0][1], inc[0][1].segment
        with_rows = set(fleet.cols.get(segment, {})) or {rank for rank, _ in inc}
        if {rank for rank, _ in inc} >= with_rows:
            out.append(_attribute(first, fleet, segment) if first.kind == "stall" and len(with_rows) > 1 else first)
        else:
            out.extend(dataclasses.replace(f, rank=rank) for rank, f in inc)
    return out


def _attribute(stall: Finding, fleet: FleetState, segment: int) -> Finding:
    """A finished stall every rank saw: name the rank whose own time before the collective covers it."""
    holder, evidence = stall_holder(stall, fleet.rank_rows(segment), fleet.config.stall)
    if holder is None:
        return dataclasses.replace(stall, evidence={**stall.evidence, **evidence}) if evidence else stall
    message = stall.message + f"; rank {holder} held the others up (its input wait and forward pass took the time)"
    return dataclasses.replace(stall, rank=holder, message=message,
                               evidence={**stall.evidence, **evidence, "held_by_rank": holder})


def live_stalls(fleet: FleetState, now: float, heartbeats: Heartbeats | None, allowance: float,
                cfg: DetectorConfig) -> list[Finding]:
    """The per-rank live stall check over the latest segment's members."""
    if not fleet.cols:
        return []
    segment = max(fleet.cols)
    ranks = {}
    for rank in sorted(set(fleet.members(segment)) | set(fleet.cols[segment])):
        steps, times = fleet.tail(segment, rank)
        ranks[rank] = RankProgress(rank, steps, times, (heartbeats or {}).get((segment, rank)))
    return live_rank_stalls(ranks, segment, now, cfg.stall, allowance, rank_hosts(fleet.meta, segment))


def finish(found: list[Finding], segments: list[SegmentInfo], main: dict[str, np.ndarray], checkpoints: list[dict],
           present_paths: set[str] | None, meta: Mapping, cfg: DetectorConfig) -> Report:
    """Open/closed, hosts, order, rollback advice and health, as ``analysis.assemble`` does for one rank."""
    found = mark_open(found, segments, main["step"], cfg)
    found = [dataclasses.replace(f, host=rank_hosts(meta, f.segment).get(f.rank))
             if f.rank is not None and f.host is None else f for f in found]
    found.sort(key=lambda f: (f.onset_step, f.segment, f.kind, -1 if f.rank is None else f.rank))
    rollback = advise(found, checkpoints, main, present_paths, segments, cfg.advice, cfg.lr)
    return Report(findings=found, segments=segments, rollback=rollback, health=health_of(found))


def _allowance(checkpoints: list[dict], event_rows: list[dict]) -> float:
    return longest_pause(pause_seconds(checkpoint_seconds(checkpoints), event_rows))


def split_ranks(rows: pa.Table) -> dict[int, pa.Table]:
    """Each rank's rows (a table without a rank column is rank 0's)."""
    if "rank" not in rows.column_names:
        return {0: rows}
    ranks = rows["rank"].to_numpy(zero_copy_only=False)
    return {int(r): rows.filter(pa.array(ranks == r)) for r in np.unique(ranks)}


def analyze_fleet(rows: pa.Table, events: pa.Table | None = None, now: float | None = None,
                  present_paths: set[str] | None = None, *, meta: Mapping | None = None,
                  config: DetectorConfig | None = None, heartbeats: Heartbeats | None = None) -> Report:
    """Judge a run over every rank: ``rows`` = ``Store.rows(run, rank=None)``; see ``analysis.analyze`` for
    the rest. ``heartbeats``: ``read_heartbeats(root, run)`` for a live run."""
    cfg, meta = config or DEFAULT, dict(meta or {})
    by_rank = split_ranks(rows)
    reports = {r: analyze(t, events, None, present_paths, meta=meta, config=cfg) for r, t in by_rank.items()}
    fleet = FleetState(meta, cfg)
    for rank, table in by_rank.items():
        seg = table["segment"].to_numpy(zero_copy_only=False) if "segment" in table.column_names \
            else np.zeros(table.num_rows, np.int64)
        for segment in np.unique(seg):
            part = table.filter(pa.array(seg == segment)).sort_by("step")
            fleet.add(int(segment), rank, table_columns(part))
    ref = min(by_rank)
    segments = reports[ref].segments
    checkpoints = checkpoints_from_events(events)
    event_rows = events.to_pylist() if events is not None else []
    found = combine(reports, fleet) + fleet.findings()
    if now is not None:
        found += live_stalls(fleet, now, heartbeats, _allowance(checkpoints, event_rows), cfg)
    return finish(found, segments, main_line(by_rank[ref], segments), checkpoints, present_paths, meta, cfg)


class FleetStreamingAnalyzer:
    """Live findings for one run over every rank, updated flush by flush: the same report as ``analyze_fleet``."""

    def __init__(self, events: pa.Table | list[dict] | None = None, *, meta: Mapping | None = None,
                 config: DetectorConfig | None = None) -> None:
        self.config, self.meta = config or DEFAULT, dict(meta or {})
        self.ranks: dict[int, StreamingAnalyzer] = {}
        self.fleet = FleetState(self.meta, self.config)
        self.events: list[dict] = []
        self.version = 0  # bumped by every change of data; the expensive part of a report is cached on it
        self._cache: tuple[int, tuple] | None = None
        for ev in (events.to_pylist() if isinstance(events, pa.Table) else events or []):
            self.add_event(ev)

    def _rank(self, rank: int) -> StreamingAnalyzer:
        if rank not in self.ranks:
            self.ranks[rank] = StreamingAnalyzer(list(self.events), meta=self.meta, config=self.config)
        return self.ranks[rank]

    def update_table(self, rank: int, segment: int, table: pa.Table) -> None:
        """One flush (a metrics file) of one rank and segment, rows in step order."""
        if table.num_rows == 0:
            return
        self._rank(rank).update_table(segment, table)
        self.fleet.add(segment, rank, table_columns(table))
        self.version += 1

    def add_event(self, event: Mapping) -> None:
        """A checkpoint, resume or note event (a resume before its segment's rows)."""
        self.events.append(event_row(event))
        for analyzer in self.ranks.values():
            analyzer.add_event(event)
        self.version += 1

    def set_meta(self, meta: Mapping) -> None:
        """``run.json`` changed (a rank registered, the run finished)."""
        self.meta = dict(meta)
        for analyzer in self.ranks.values():
            analyzer.meta = self.meta
        self.fleet.set_meta(self.meta)
        self.version += 1

    def _data_part(self) -> tuple:
        """What changes only with new data: combined and fleet findings, segments, main line, checkpoints."""
        if self._cache is None or self._cache[0] != self.version:
            checkpoints = checkpoints_from_events(pa.Table.from_pylist(self.events) if self.events else None)
            reports, mains = {}, {}
            for r, a in self.ranks.items():  # as StreamingAnalyzer.report, keeping each main line (built once)
                mains[r] = a.main_line()
                reports[r] = assemble(a.raw_findings(), a.segments(), mains[r], checkpoints, None, None, self.config)
            ref = min(self.ranks)
            found = combine(reports, self.fleet) + self.fleet.findings()
            self._cache = (self.version, (found, reports[ref].segments, mains[ref], checkpoints))
        return self._cache[1]

    def report(self, now: float | None = None, present_paths: set[str] | None = None,
               heartbeats: Heartbeats | None = None) -> Report:
        if not self.ranks:
            return Report(findings=[], segments=[], rollback=None, health="healthy")
        found, segments, main, checkpoints = self._data_part()
        found = list(found)
        if now is not None:
            found += live_stalls(self.fleet, now, heartbeats, _allowance(checkpoints, self.events), self.config)
        return finish(found, segments, main, checkpoints, present_paths, self.meta, self.config)
