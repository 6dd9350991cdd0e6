"""Switching a whole tree at once: build it beside the root, exchange it in, recover after a crash.

An operation ("op") is a directory under the staging area,
``<staging>/<run>@<pid>-<hex>/``, holding ``target`` (the path it replaces,
relative to the root: ``run=<id>`` or ``run=<id>/segment=<k>/rank=<r>``) and
the new tree at that same relative path inside the op. ``switch_in`` makes it
visible in one step; ``recover`` (called by every run-level writer under the
run's lock) finishes or undoes what a killed writer left. See the storage
module's docstring for why staging lives beside the root.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from runwatch.data.record import SCHEMA_VERSION, conform_metrics
from runwatch.data.storage import (
    RUN_META,
    RUN_NAME_RE,
    check_run_name,
    events_jsonl,
    fsync_dir,
    part_name,
    partition_dir,
    run_dir,
    write_bytes_synced,
)

STAGING_NAME = ".runwatch-staging"
TARGET_FILE = "target"
SWITCHING = "SWITCHING"  # written only by the two-rename fallback, before the old tree moves out
CRASH_ENV = "RUNWATCH_CRASH_AT"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_warned_inside = False


def crash_point(name: str) -> None:
    """SIGKILL this process here when ``$RUNWATCH_CRASH_AT`` names this point (fault-injection tests)."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def staging_root(root: str | Path) -> Path:
    """``<parent>/.<root name>.runwatch-staging``, on the root's filesystem; inside the root as a fallback.

    Inside the root, a plain ``read_parquet('ROOT/**/*.parquet')`` can see a
    staged copy while an operation runs (runwatch's own readers never do); we
    fall back to it only when the root's parent is not writable or is another
    filesystem (the root is a mount point), and warn once.
    """
    global _warned_inside
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if root.parent != root:
        beside = root.parent / f".{root.name}{STAGING_NAME}"
        try:
            beside.mkdir(exist_ok=True)
            if beside.stat().st_dev == root.stat().st_dev:
                return beside
        except OSError:
            pass
    if not _warned_inside:
        _warned_inside = True
        warnings.warn(f"runwatch: staging inside {root} (its parent is not writable on the same filesystem); "
                      "a plain DuckDB glob of the root may see staged files while an import or compact runs",
                      RuntimeWarning, stacklevel=2)
    inside = root / STAGING_NAME
    inside.mkdir(exist_ok=True)
    return inside


def new_op(root: str | Path, run: str, target: str) -> Path:
    """A fresh op directory for replacing ``target`` (relative to the root) of ``run``."""
    op = staging_root(root) / f"{run}@{os.getpid()}-{uuid.uuid4().hex[:12]}"
    op.mkdir(parents=True)  # parents: another writer may have just removed the empty staging area
    (op / TARGET_FILE).write_text(target)
    return op


def _all_ops(root: str | Path) -> list[Path]:
    root = Path(root).resolve()
    areas = [root.parent / f".{root.name}{STAGING_NAME}", root / STAGING_NAME]
    return sorted(p for area in areas if area.is_dir() for p in area.iterdir() if p.is_dir() and "@" in p.name)


def ops_of(root: str | Path, run: str) -> list[Path]:
    """Op directories of ``run`` left in staging (by this or a dead process), beside or inside the root."""
    return [p for p in _all_ops(root) if p.name.rsplit("@", 1)[0] == run]


def staged_runs(root: str | Path) -> list[str]:
    """Runs with ops in staging: a run whose switch a crash interrupted may be missing from the root."""
    return sorted({name for p in _all_ops(root) if RUN_NAME_RE.match(name := p.name.rsplit("@", 1)[0])})


def _renameat2(a: Path, b: Path, flags: int) -> int:
    """0, or the errno; ENOSYS where libc has no renameat2."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return errno.ENOSYS
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return 0
    return ctypes.get_errno()


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False where the filesystem or OS cannot."""
    err = _renameat2(a, b, _RENAME_EXCHANGE)
    if err == 0:
        return True
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def fsync_tree(top: Path) -> None:
    """Make the directory entries of a staged tree durable before it is published."""
    for directory, _, _ in os.walk(top, topdown=False):
        fsync_dir(Path(directory))


def switch_in(root: str | Path, op: Path) -> Path:
    """Make the op's staged tree the live one at its target in one step; delete the old tree. Returns the target."""
    root = Path(root)
    rel = (op / TARGET_FILE).read_text()
    staged, target = op / rel, root / rel
    fsync_tree(staged)
    crash_point("switch.before")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        os.rename(staged, target)  # nothing was there: a plain rename is atomic
    elif not exchange(staged, target):
        (op / SWITCHING).touch()
        fsync_dir(op)
        parked = op / "old" / rel
        parked.parent.mkdir(parents=True)
        os.rename(target, parked)
        crash_point("switch.middle")
        os.rename(staged, target)
    fsync_dir(target.parent)
    crash_point("switch.after")
    _delete(op)  # the switch is done: what is left is the replaced tree, outside every reader's view
    return target


def abort(op: Path) -> None:
    """Drop an op whose switch never happened."""
    _delete(op)


def _delete(op: Path) -> None:
    """Delete an op; a tree that cannot be deleted (an unwritable directory) stays in staging, with a warning."""
    shutil.rmtree(op, ignore_errors=True)
    if op.exists():
        warnings.warn(f"runwatch: could not delete {op} (replaced data, no longer read); delete it by hand",
                      RuntimeWarning, stacklevel=3)
    _remove_if_empty(op.parent)


def _remove_if_empty(area: Path) -> None:
    """Leave no empty staging area beside the root (another writer may be using it: then it stays)."""
    try:
        area.rmdir()
    except OSError:
        pass


def recover(root: str | Path, run: str) -> int:
    """Finish or undo the ops of ``run`` a dead writer left; call it holding the run's lock.

    A switch that moved the old tree out but not the new one in (the fallback
    without exchange) is finished; anything else is deleted: either the
    switch never happened (the old tree stands) or it did (staging holds the
    old tree). Returns how many ops were cleaned.
    """
    root = Path(root)
    ops = ops_of(root, run)
    for op in ops:
        try:
            rel = (op / TARGET_FILE).read_text()
        except OSError:
            rel = ""
        if rel and (op / SWITCHING).exists() and not (root / rel).exists() and (op / rel).exists():
            os.rename(op / rel, root / rel)
            fsync_dir((root / rel).parent)
        _delete(op)
    return len(ops)


class _PartWriter:
    """One open Parquet part of a staged partition: row groups appended until the schema changes."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path, self.schema = path, schema
        self._file = open(path, "wb")
        self._writer = pq.ParquetWriter(self._file, schema, compression="zstd")

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


class StagedRun:
    """The whole new tree of one run, built in staging and switched in at once by ``commit``.

    Metrics arrive in any number of tables per partition (an import streams
    them) and are appended as row groups of one part, a new part when the
    columns change; at most ``max_open`` parts are open at a time, so memory
    stays bounded whatever the number of partitions. Use it holding the run's
    lock (``locks.RunLock``).
    """

    def __init__(self, root: str | Path, run: str, *, max_open: int = 16) -> None:
        self.root, self.run = Path(root), check_run_name(run)
        self.op = new_op(root, run, run_dir(root, run).name)
        self.base = self.op / run_dir(root, run).name
        self.base.mkdir()
        self._open: OrderedDict[tuple[int, int], _PartWriter] = OrderedDict()
        self._max_open = max_open
        self.files: list[Path] = []

    def _final(self, staged: Path) -> Path:
        return self.root / staged.relative_to(self.op)

    def _partition(self, segment: int, rank: int) -> Path:
        directory = self.base / partition_dir(self.root, self.run, segment, rank).relative_to(run_dir(self.root, self.run))
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def add_metrics(self, segment: int, rank: int, table: pa.Table) -> Path:
        """Append ``table`` (conformed to the record) to the partition's open part."""
        table = conform_metrics(table)
        key = (segment, rank)
        part = self._open.pop(key, None)
        if part is not None and not part.schema.equals(table.schema):
            part.close()
            part = None
        if part is None:
            part = _PartWriter(self._partition(segment, rank) / part_name("metrics", "parquet"), table.schema)
            self.files.append(self._final(part.path))
            while len(self._open) >= self._max_open:
                self._open.popitem(last=False)[1].close()
        part.write(table)
        self._open[key] = part
        return self._final(part.path)

    def add_events(self, segment: int, rank: int, events: Iterable[Mapping[str, object]]) -> Path | None:
        data = events_jsonl(events)
        if not data:
            return None
        path = self._partition(segment, rank) / part_name("events", "jsonl")
        write_bytes_synced(data, path)
        self.files.append(self._final(path))
        return self._final(path)

    def add_run_meta(self, meta: Mapping[str, object]) -> Path:
        """A fresh ``run.json`` for the new tree (nothing of a replaced run's metadata carries over)."""
        data = {**meta, "run": self.run, "schema_version": SCHEMA_VERSION}
        data.setdefault("created", time.time())
        path = self.base / RUN_META
        write_bytes_synced(json.dumps(data, indent=1, default=str).encode(), path)
        self.files.append(self._final(path))
        return self._final(path)

    def commit(self) -> list[Path]:
        """Close every part and switch the new tree in; returns the files as they now lie under the root."""
        while self._open:
            self._open.popitem(last=False)[1].close()
        crash_point("import.staged")
        switch_in(self.root, self.op)
        return list(self.files)

    def abort(self) -> None:
        for part in self._open.values():
            try:
                part.close()
            except OSError:
                pass
        self._open.clear()
        abort(self.op)
