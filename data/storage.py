"""Storage: the Hive-partitioned Parquet tree that collectors write and the store reads.

    ROOT/run=<id>/run.json                                   run metadata
    ROOT/run=<id>/segment=<k>/rank=<r>/metrics-<seq>.parquet per-step rows
    ROOT/run=<id>/segment=<k>/rank=<r>/events-<seq>.jsonl    checkpoint/resume/config/note

Events are JSON Lines rather than Parquet so that ``read_parquet('ROOT/**/*.parquet')``
returns metrics only.

How readers never see a partial or mixed state (the reliability design):

* One file: written whole under a hidden temporary name (``.<name>.tmp-<hex>``,
  no ``.parquet`` suffix, so no glob matches it), fsynced, renamed into place.
  This is how a ``Monitor`` publishes each flush. A writer killed mid-file
  leaves an orphan temporary file that every reader ignores (``data_files``
  lists only the committed layout) and ``compact`` or ``--replace`` deletes.
* Many files at once (an import, ``--replace``, ``compact``): the new tree of
  the run, or of one partition, is built whole in a staging directory beside
  the root (``staging.py``) and switched in with one ``renameat2(RENAME_EXCHANGE)``
  (or one ``rename`` when nothing was there), then the old tree, which the
  exchange moved into staging, is deleted. Staging lives *beside* the root
  because DuckDB's ``**`` descends into hidden directories (a staged copy
  inside the root would be read, twice or with a Hive-key mismatch) and does
  not follow symlinked directories (a symlink swap would hide the run from
  ``read_parquet('ROOT/**/*.parquet')``); both were checked with DuckDB 2.0.
  A crash before the exchange leaves the old tree, after it the new one; the
  next writer of the run deletes what staging still holds. Where the
  filesystem has no exchange (NFS, some parallel filesystems), the old tree is
  moved into staging first and the new one in next, with a marker: readers may
  see the run missing for that instant (never mixed), and the next writer
  finishes a switch a crash interrupted.
* Who may write: run-level writers hold the run's lock and ``Monitor``s claim
  their own partition (``locks.py``); ``compact`` skips partitions whose
  ``Monitor`` is alive, ``--replace`` refuses a run that has one.
* Readers (``store.py``) list the committed layout only and list again when
  a file they listed was switched away before they read it.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; ranks of one job there are rare
    fcntl = None

from runwatch.data.record import EVENT_KINDS, SCHEMA_VERSION, check_oncall_event, conform_metrics, json_safe

RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
RUN_META = "run.json"


def check_run_name(run: str) -> str:
    """Return ``run`` if it is a safe directory name, else raise ``ValueError``."""
    if not isinstance(run, str) or not RUN_NAME_RE.match(run) or ".." in run:
        raise ValueError(
            f"invalid run name {run!r}: use letters, digits, '.', '_', '+' or '-' "
            "(at most 128 characters, not starting with a dot)"
        )
    return run


def run_dir(root: str | Path, run: str) -> Path:
    return Path(root) / f"run={check_run_name(run)}"


def partition_dir(root: str | Path, run: str, segment: int, rank: int) -> Path:
    if segment < 0 or rank < 0:
        raise ValueError(f"segment and rank must be >= 0, got segment={segment} rank={rank}")
    return run_dir(root, run) / f"segment={int(segment)}" / f"rank={int(rank)}"


def part_name(prefix: str, ext: str) -> str:
    """A file name that sorts by creation time and never collides across processes."""
    return f"{prefix}-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.{ext}"


def _temp_path(path: Path) -> Path:
    # Hidden and without the .parquet suffix: no glob of the tree can match it.
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")


def write_parquet_synced(table: pa.Table, path: Path) -> None:
    with open(path, "wb") as f:
        pq.write_table(table, f, compression="zstd")
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the rename publishes them


def write_bytes_synced(data: bytes, path: Path) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(directory: Path) -> None:
    """Make renames into ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(path: Path, write: Callable[[Path], None]) -> Path:
    """Write a file whole under a temporary name, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_parquet_atomic(table: pa.Table, path: Path) -> Path:
    """Write ``table`` to ``path`` whole: temporary name, fsync, rename."""
    return _publish(path, lambda tmp: write_parquet_synced(table, tmp))


def write_bytes_atomic(data: bytes, path: Path) -> Path:
    return _publish(path, lambda tmp: write_bytes_synced(data, tmp))


def events_jsonl(events: Iterable[Mapping[str, object]]) -> bytes:
    """Serialise events: ``{"event", "step", "time", "payload": {...}}`` per line."""
    lines = []
    for ev in events:
        kind = ev.get("event")
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; expected one of {', '.join(EVENT_KINDS)}")
        if ev.get("step") is None:
            raise ValueError(f"{kind} event without a step")
        check_oncall_event(ev)
        payload = {k: json_safe(v) for k, v in ev.items() if k not in ("event", "step", "time", "segment", "rank")}
        record = {"event": kind, "step": int(ev["step"]), "time": json_safe(ev.get("time")), "payload": payload}
        lines.append(json.dumps(record, allow_nan=False, default=str))
    return ("\n".join(lines) + "\n").encode() if lines else b""


class StagedWrite:
    """Files staged under temporary names in their final directories, renamed into place on success.

    Used as a context manager: on an exception no staged file appears. The
    renames at commit are one per file, so a crash in the middle of a commit
    can publish some of them: use it for one file (run metadata) or for
    tests; an import lands through ``staging.StagedRun``, which switches a
    whole tree at once.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._moves: list[tuple[Path, Path]] = []

    def __enter__(self) -> "StagedWrite":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def _stage(self, final: Path, write) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_path(final)
        self._moves.append((tmp, final))
        write(tmp)
        return final

    def add_metrics(self, run: str, segment: int, rank: int, table: pa.Table) -> Path:
        final = partition_dir(self.root, run, segment, rank) / part_name("metrics", "parquet")
        table = conform_metrics(table)
        return self._stage(final, lambda p: write_parquet_synced(table, p))

    def add_events(self, run: str, segment: int, rank: int, events: Iterable[Mapping[str, object]]) -> Path | None:
        data = events_jsonl(events)
        if not data:
            return None
        final = partition_dir(self.root, run, segment, rank) / part_name("events", "jsonl")
        return self._stage(final, lambda p: write_bytes_synced(data, p))

    def add_run_meta(self, run: str, meta: Mapping[str, object]) -> Path:
        final = run_dir(self.root, run) / RUN_META
        merged = {**read_run_meta(self.root, run), **meta, "run": run, "schema_version": SCHEMA_VERSION}
        merged.setdefault("created", time.time())
        data = json.dumps(merged, indent=1, default=str).encode()
        return self._stage(final, lambda p: write_bytes_synced(data, p))

    def commit(self) -> list[Path]:
        done = []
        for tmp, final in self._moves:
            os.replace(tmp, final)
            done.append(final)
        for directory in {p.parent for p in done}:
            fsync_dir(directory)
        self._moves = []
        return done

    def abort(self) -> None:
        for tmp, _ in self._moves:
            tmp.unlink(missing_ok=True)
        self._moves = []


def merge_meta(old: Mapping[str, object], new: Mapping[str, object]) -> dict:
    """``old`` updated by ``new``; a mapping under a key both have is merged the same way (``hosts``)."""
    out = dict(old)
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_meta(out[key], value)
        else:
            out[key] = value
    return out


def merge_run_meta(root: str | Path, run: str, meta: Mapping[str, object]) -> Path:
    """Merge ``meta`` into ``run.json`` under an exclusive lock: every rank of a job registers its host at
    start, at the same moment, and a plain read-merge-write would lose all but one."""
    directory = run_dir(root, run)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".run.json.lock", "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes
        merged = {**merge_meta(read_run_meta(root, run), meta), "run": run, "schema_version": SCHEMA_VERSION}
        merged.setdefault("created", time.time())
        return write_bytes_atomic(json.dumps(merged, indent=1, default=str).encode(), directory / RUN_META)


def read_run_meta(root: str | Path, run: str) -> dict:
    path = run_dir(root, run) / RUN_META
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: unreadable run metadata ({err})") from err


HEARTBEAT = "heartbeat.json"
"""Each rank's liveness file in its partition (``Monitor``'s writer thread rewrites it every few seconds)."""


def read_heartbeats(root: str | Path, run: str) -> dict[tuple[int, int], dict]:
    """(segment, rank) -> that rank's latest heartbeat. A heartbeat is advisory: one that cannot be read (being
    replaced on a filesystem without atomic rename, or not JSON) is left out rather than failing the run."""
    out: dict[tuple[int, int], dict] = {}
    for path in run_dir(root, run).glob(f"segment=*/rank=*/{HEARTBEAT}"):
        seg, rank = path.parent.parent.name.split("=", 1)[1], path.parent.name.split("=", 1)[1]
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if seg.isdigit() and rank.isdigit() and isinstance(beat, dict):
            out[(int(seg), int(rank))] = beat
    return out


def run_exists(root: str | Path, run: str) -> bool:
    """True when the run has committed data (metrics or events): a directory alone is an empty shell."""
    if isinstance(root, str) and "://" in root and not root.startswith("file://"):
        from runwatch.data.roots import open_root  # an object-store root (roots.py imports this module)

        location = open_root(root, create=True)
        return bool(location.files(run, "metrics") or location.files(run, "events"))
    return bool(data_files(root, run, "metrics") or data_files(root, run, "events"))


def list_runs(root: str | Path) -> list[str]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name[4:] for p in root.iterdir() if p.is_dir() and p.name.startswith("run="))


def data_files(root: str | Path, run: str | None = None, kind: str = "metrics") -> list[Path]:
    """Committed files of one kind ('metrics' or 'events'), oldest first per partition.

    Only the committed layout counts: temporary files (hidden, other suffix)
    and anything staged elsewhere are never listed.
    """
    ext = "parquet" if kind == "metrics" else "jsonl"
    pattern = f"segment=*/rank=*/{kind}-*.{ext}"
    if run is not None:
        return sorted(run_dir(root, run).glob(pattern))
    return sorted(Path(root).glob(f"run=*/{pattern}"))


def temp_files(directory: Path) -> list[Path]:
    """Temporary files a writer left in ``directory`` (orphans once that writer is gone)."""
    return [p for p in directory.glob(".*.tmp-*") if p.is_file()]
