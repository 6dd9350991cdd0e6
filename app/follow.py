"""``RunFollower``: every run under a root, followed file by file and judged by the streaming analyser.

Shared by ``runwatch watch`` and the dashboard. On a local root a watchdog
observer (inotify, or polling for network filesystems) reports each file the
writers rename into place; an object store sends no events, so there the
root is listed every ``poll_seconds`` (``data.changes.ListingChanges``) and
the runs whose signature changed are listed again. Either way the follower
reads each new metrics file once (through the root's ``Root``: a path or an
object) and feeds its rows to the run's ``FleetStreamingAnalyzer``, each new
events file's events before them, and keeps ``run.json`` and the heartbeats
current. A report is then the streaming analyser's, equal to ``judge_run``'s
on the same files.

When the files say the past changed (a compaction deleted parts, rows or an
event arrived for steps already judged), the run is read again from scratch:
the streaming result stays the offline one.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from runwatch.app.judge import as_of_now, is_live, present_checkpoint_paths
from runwatch.data.changes import ListingChanges
from runwatch.data.record import EVENTS_SCHEMA
from runwatch.data.roots import is_url, open_root, segment_rank
from runwatch.data.storage import HEARTBEAT, RUN_META, read_heartbeats
from runwatch.detectors.advisor import checkpoints_from_events
from runwatch.detectors.analysis import Report
from runwatch.detectors.config import DetectorConfig
from runwatch.detectors.fleet_analysis import FleetStreamingAnalyzer, event_row


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _key(path: str) -> str:
    """A part's name within its run, ``segment=<k>/rank=<r>/<file>``: the same for a path and an object URL."""
    return "/".join(path.replace("\\", "/").split("/")[-3:])


def run_of(root: Path, path: Path) -> str | None:
    """The run a path under the root belongs to (``run=<id>/...``), or None."""
    try:
        first = Path(path).resolve().relative_to(root).parts[0]
    except (ValueError, IndexError):
        return None
    return first[4:] if first.startswith("run=") else None


@dataclass
class FollowedRun:
    """One run as the follower knows it."""

    name: str
    analyzer: FleetStreamingAnalyzer
    consumed: set[str] = field(default_factory=set)
    last_step: dict[int, int] = field(default_factory=dict)  # segment -> the highest step fed, any rank
    rank_last: dict[tuple[int, int], int] = field(default_factory=dict)  # (segment, rank) -> its last step fed
    meta: dict = field(default_factory=dict)
    heartbeats: dict = field(default_factory=dict)
    version: int = 0  # the follower's change counter when this run last got new data (never goes back)
    changed_at: float = 0.0


class RunFollower:
    """Follows every run under ``root``; see the module docstring."""

    LISTING_SECONDS = 10.0
    """How often an object-store root is listed when ``poll_seconds`` is not given (one LIST per 1,000 keys)."""

    def __init__(self, root: str | Path, *, config: DetectorConfig | None = None, poll_seconds: float | None = None,
                 on_change: Callable[[set[str]], None] | None = None) -> None:
        self.local = not is_url(root)
        self.source = open_root(root)  # a missing local directory is a ValueError naming it
        self.root: Path | str = Path(root).resolve() if self.local else str(root)
        self.config, self.poll_seconds, self.on_change = config, poll_seconds, on_change
        self.runs: dict[str, FollowedRun] = {}
        self.errors: dict[str, str] = {}  # run -> why its files could not be read (retried on its next event)
        self.lock = threading.RLock()
        self.events: queue.Queue[str] = queue.Queue()
        self.num_rebuilds = 0
        self.generation = 0  # counts every change of any run: versions are unique and only grow
        self._observer = None
        self._listing: ListingChanges | None = None
        self.listing_error: str | None = None  # why the object store's latest listing failed (None: it worked)

    # -- file events ------------------------------------------------------------------

    def start(self) -> None:
        """Start watching (inotify, or polling every ``poll_seconds``; listing for an object store) and read
        what is already there."""
        if not self.local:
            self._listing = ListingChanges(self.root, self.poll_seconds or self.LISTING_SECONDS)
            self.sync(self._listing.poll())
            return
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer
        from watchdog.observers.polling import PollingObserver

        follower = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: object) -> None:
                # Only what writers do (files renamed into place, parts deleted); never opens and reads,
                # which the follower itself causes when it reads a file.
                if getattr(event, "event_type", "") not in ("created", "moved", "deleted", "modified"):
                    return
                for attr in ("dest_path", "src_path"):
                    path = getattr(event, attr, "")
                    if path:
                        follower.events.put(path if isinstance(path, str) else path.decode())

        observer = PollingObserver(timeout=self.poll_seconds) if self.poll_seconds else Observer()
        observer.schedule(Handler(), str(self.root), recursive=True)
        observer.daemon = True
        observer.start()
        self._observer = observer
        self.sync(self.source.runs())

    def changes(self, timeout: float) -> set[str]:
        """Wait up to ``timeout`` seconds for runs to change and take the change in; the runs whose data
        changed. Local: the file events. Object store: a listing when one is due (at most every
        ``poll_seconds``), then only the runs whose files changed are listed again."""
        if self._listing is None:
            paths = self.drain(timeout=timeout)
            return self.sync_paths(paths) if paths else set()
        if self._listing.due_in() > timeout:
            time.sleep(max(timeout, 0.0))
            return set()
        time.sleep(self._listing.due_in())
        try:
            changed = self._listing.poll()
        except (OSError, ValueError) as err:  # an outage: every run is compared again at the next poll
            self.listing_error = f"listing {self.root}: {type(err).__name__}: {err}"
            return set()
        self.listing_error = None
        return self.sync(changed)

    def resync(self) -> set[str]:
        """Every run listed again (catches a dropped file event)."""
        return self.sync(self.source.runs())

    def stop(self) -> None:
        if self._listing is not None:
            self._listing.stop()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None

    def drain(self, timeout: float | None) -> list[Path]:
        """Wait up to ``timeout`` for file events, then take every one queued: the paths they named."""
        try:
            first = self.events.get(timeout=timeout) if timeout != 0 else self.events.get_nowait()
        except queue.Empty:
            return []
        return [Path(p) for p in dict.fromkeys([first, *self._take_all()])]

    def _take_all(self) -> Iterable[str]:
        while True:
            try:
                yield self.events.get_nowait()
            except queue.Empty:
                return

    def sync_paths(self, paths: Iterable[Path]) -> set[str]:
        """Take in the files that events named; the runs whose data changed. A heartbeat only refreshes the
        heartbeat; a new metrics or events file is read on its own (no directory listing); anything else
        (a deletion, a run not seen before) re-reads that run's directory."""
        by_run: dict[str, list[Path]] = {}
        for path in paths:
            name = run_of(self.root, path)
            if name is not None:
                by_run.setdefault(name, []).append(path)
        return self._each(by_run, lambda name: self._take(name, by_run[name]))

    def _take(self, name: str, paths: list[Path]) -> bool:
        fr = self.runs.get(name)
        if fr is None:
            return self._sync_run(name)
        run_dir = self.root / f"run={name}"
        data = []
        for path in paths:
            if path.name.startswith("."):
                continue  # a file still being written under its temporary name
            if path.name == HEARTBEAT:
                beat = _read_json(path)
                if beat is not None and path.parent.name.startswith("rank="):
                    fr.heartbeats[segment_rank(str(path))] = beat
            elif path.name == RUN_META or path == run_dir:
                data.append(path)
            elif path.suffix in (".parquet", ".jsonl"):
                if not path.exists() or path.parent.parent.parent != run_dir:
                    return self._sync_run(name)  # gone (a compaction) or somewhere unexpected: list the run
                if _key(str(path)) not in fr.consumed:
                    data.append(str(path))
        if not data:
            return False
        if any(not isinstance(p, str) for p in data):  # run.json or the run directory itself
            return self._sync_run(name)
        return self._feed(fr, data)

    # -- reading ----------------------------------------------------------------------

    def sync(self, names: Iterable[str]) -> set[str]:
        """Bring the named runs up to date with their files; the ones whose data changed."""
        return self._each(names, self._sync_run)

    def _each(self, names: Iterable[str], update: Callable[[str], bool]) -> set[str]:
        """``update`` each run under the lock; the runs whose data changed. A run whose files cannot be read now
        is named in ``errors`` (its next event or listing retries) and costs only itself."""
        changed = set()
        with self.lock:
            for name in names:
                try:
                    if update(name):
                        changed.add(name)
                    self.errors.pop(name, None)
                except (OSError, ValueError, pa.ArrowException) as err:
                    self.errors[name] = f"{type(err).__name__}: {err}"
        if changed and self.on_change is not None:
            self.on_change(changed)
        return changed

    def _new(self, name: str, meta: dict | None = None) -> FollowedRun:
        return FollowedRun(name, FleetStreamingAnalyzer(meta=meta or {}, config=self.config), meta=meta or {})

    def _sync_run(self, name: str) -> bool:
        files = [f.path for kind in ("events", "metrics") for f in self.source.files(name, kind)]
        if not (self.root / f"run={name}").is_dir() if self.local else not files:
            return bool(self.runs.pop(name, None))
        fr = self.runs.get(name)
        if fr is None:
            fr = self.runs[name] = self._new(name)
        meta = self.source.meta(name)
        changed = False
        if meta != fr.meta:
            fr.meta = meta
            fr.analyzer.set_meta(meta)
            self.generation += 1
            fr.version, changed = self.generation, True
        # Heartbeats are files beside the parts on a local root; an object store's uploader sends none.
        fr.heartbeats = read_heartbeats(self.root, name) if self.local else {}
        if fr.consumed - {_key(p) for p in files}:  # a part went away (compaction): read the run again
            return self._rebuild(name) or True
        return self._feed(fr, [p for p in files if _key(p) not in fr.consumed]) or changed

    def _feed(self, fr: FollowedRun, files: list[str]) -> bool:
        """Feed new files in the order they were written (their names start with the write time), each
        partition's events before its rows."""
        if not files:
            return False
        files = sorted(files, key=lambda p: (_name(p).split("-", 1)[1], _name(p)))
        for path in (p for p in files if _name(p).startswith("events-")):
            if not self._feed_events(fr, path):
                return self._rebuild(fr.name) or True
        for path in (p for p in files if _name(p).startswith("metrics-")):
            if not self._feed_metrics(fr, path):
                return self._rebuild(fr.name) or True
        self.generation += 1
        fr.version, fr.changed_at = self.generation, time.time()
        return bool(files)

    def _feed_events(self, fr: FollowedRun, path: str) -> bool:
        segment, rank = segment_rank(path)
        rows = []
        for lineno, line in enumerate(self.source.read_bytes(path).decode().splitlines(), 1):
            if line.strip():
                try:
                    ev = json.loads(line)
                except ValueError as err:
                    raise ValueError(f"{path}:{lineno}: not a JSON event ({err})") from err
                rows.append(event_row({"segment": segment, "rank": rank, "event": ev["event"], "step": ev["step"],
                                       "time": ev.get("time"), "payload": ev.get("payload") or {}}))
        # An event for steps already judged (another rank flushed past it first) changes the past: rebuild.
        if any(r["step"] < fr.last_step.get(segment, -1) for r in rows):
            return False
        for r in rows:
            fr.analyzer.add_event(r)
        fr.consumed.add(_key(path))
        return True

    def _feed_metrics(self, fr: FollowedRun, path: str) -> bool:
        segment, rank = segment_rank(path)
        table = pq.read_table(pa.BufferReader(self.source.read_bytes(path)))
        if table.num_rows and "step" in table.column_names:
            steps = table["step"].to_numpy(zero_copy_only=False)
            if (steps[1:] < steps[:-1]).any():
                table = table.sort_by("step")
                steps = table["step"].to_numpy(zero_copy_only=False)
            if fr.rank_last.get((segment, rank), -1) >= int(steps[0]):
                return False  # rows rewritten (a compacted part, a replaced import): read it all again
            fr.analyzer.update_table(rank, segment, table)
            fr.rank_last[(segment, rank)] = int(steps[-1])
            fr.last_step[segment] = max(fr.last_step.get(segment, -1), int(steps[-1]))
        fr.consumed.add(_key(path))
        return True

    def _rebuild(self, name: str) -> None:
        """Read a run again from scratch (its history changed under us)."""
        self.num_rebuilds += 1
        self.runs[name] = self._new(name)
        self._sync_run(name)

    # -- judging ----------------------------------------------------------------------

    def _followed(self, name: str) -> FollowedRun:
        fr = self.runs.get(name)
        if fr is None:
            raise ValueError(f"unknown run {name!r} under {self.root}")
        return fr

    def is_live(self, name: str) -> bool:
        """Whether the run can still stall (``judge.is_live`` over what the follower has read)."""
        with self.lock:
            fr = self._followed(name)
            return is_live(fr.meta, pa.Table.from_pylist(fr.analyzer.events, schema=_EVENTS))

    def checkpoints(self, name: str) -> list[dict]:
        """The run's checkpoints as far as the follower has read its events (``checkpoints_from_events``)."""
        with self.lock:
            fr = self._followed(name)
            events = pa.Table.from_pylist(fr.analyzer.events, schema=_EVENTS) if fr.analyzer.events else None
            return checkpoints_from_events(events)

    def report(self, name: str, now: float | None = None) -> Report:
        """The run's report as of ``now`` (a live run can stall), from the streaming analyser."""
        with self.lock:
            fr = self._followed(name)
            present = present_checkpoint_paths(self.root, self.checkpoints(name))
            live = self.is_live(name)
            live_now = (time.time() if now is None else now) if live else None
            return as_of_now(fr.analyzer.report(live_now, present, fr.heartbeats if live else None), live)


_EVENTS = pa.schema([pa.field("segment", pa.int32()), pa.field("rank", pa.int32()), *EVENTS_SCHEMA])
