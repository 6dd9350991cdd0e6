"""``compact``: merge each partition's small parts into one, switching the partition atomically.

For every partition of a run whose ``Monitor`` is gone, the merged partition
(one metrics part, one events part, anything else hard-linked as it is) is
built in staging and exchanged with the live one (``staging.switch_in``), so
every reader sees either the old parts or the merged one, never both and
never neither; a kill at any point leaves one of the two. Rows keep their
write order and query results are unchanged. Partitions a live ``Monitor``
still writes are left alone, and the temporary files a dead writer left are
dropped. The run's lock is held throughout.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from runwatch.data.locks import WRITER_LOCK, RunBusy, RunLock, is_held
from runwatch.data.record import METRICS_SCHEMA, conform_metrics
from runwatch.data.roots import is_url
from runwatch.data.staging import abort, crash_point, new_op, recover, staged_runs, switch_in
from runwatch.data.storage import fsync_dir, list_runs, part_name, temp_files


@dataclass
class CompactResult:
    files_before: int = 0
    files_after: int = 0
    live_partitions: int = 0
    """Partitions left alone because a live ``Monitor`` writes them."""
    busy: list[str] = field(default_factory=list)
    """One line per run another writer held (skipped when compacting every run)."""


def _union_schema(parts: list[Path]) -> pa.Schema:
    """The record's columns, then every extra in order of first appearance."""
    fields: dict[str, pa.Field] = {}
    for p in parts:
        schema = pq.read_schema(p)
        empty = conform_metrics(pa.Table.from_batches([], schema=schema.remove_metadata()))
        for f in empty.schema:
            fields.setdefault(f.name, f)
    return pa.schema(list(fields.values()), metadata=METRICS_SCHEMA.metadata)


def _merge_metrics(parts: list[Path], out: Path) -> None:
    """Concatenate the parts into ``out`` one part at a time (memory: the largest part, not the partition)."""
    schema = _union_schema(parts)
    with open(out, "wb") as f:
        with pq.ParquetWriter(f, schema, compression="zstd") as writer:
            for p in parts:
                table = conform_metrics(pq.read_table(p))
                for name in schema.names:
                    if name not in table.column_names:
                        table = table.append_column(schema.field(name), pa.nulls(table.num_rows, schema.field(name).type))
                writer.write_table(table.select(schema.names).cast(schema))
        f.flush()
        os.fsync(f.fileno())


def _merge_events(parts: list[Path], out: Path) -> None:
    chunks = [p.read_bytes() for p in parts]
    data = b"".join(c if c.endswith(b"\n") or not c else c + b"\n" for c in chunks)
    with open(out, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def compact_partition(root: Path, run: str, directory: Path) -> tuple[int, int]:
    """Merge one partition; (files before, files after). The caller holds the run's lock."""
    metrics = sorted(directory.glob("metrics-*.parquet"))
    events = sorted(directory.glob("events-*.jsonl"))
    for orphan in temp_files(directory):  # invisible to readers; their writer is gone
        orphan.unlink(missing_ok=True)
    before = len(metrics) + len(events)
    if len(metrics) < 2 and len(events) < 2:
        return before, before
    op = new_op(root, run, str(directory.relative_to(root)))
    try:
        staged = op / directory.relative_to(root)
        staged.mkdir(parents=True)
        merged = set(metrics if len(metrics) > 1 else []) | set(events if len(events) > 1 else [])
        if len(metrics) > 1:
            _merge_metrics(metrics, staged / part_name("metrics", "parquet"))
        if len(events) > 1:
            _merge_events(events, staged / part_name("events", "jsonl"))
        for p in directory.iterdir():
            if p.is_file() and p not in merged and p.name != WRITER_LOCK:
                _link_or_copy(p, staged / p.name)
    except (pa.ArrowException, OSError) as err:
        abort(op)
        raise ValueError(f"cannot compact {directory}: {err}") from err
    crash_point("compact.staged")
    switch_in(root, op)
    return before, min(len(metrics), 1) + min(len(events), 1)


def compact_run(root: Path, run: str, result: CompactResult) -> None:
    """Compact every partition of ``run`` whose writer is gone; the caller holds the run's lock."""
    run_path = root / f"run={run}"
    num_live = 0
    for directory in sorted(run_path.glob("segment=*/rank=*")):
        if not directory.is_dir():
            continue
        if is_held(directory / WRITER_LOCK):
            num = len(list(directory.glob("metrics-*.parquet"))) + len(list(directory.glob("events-*.jsonl")))
            result.files_before += num
            result.files_after += num
            num_live += 1
            continue
        before, after = compact_partition(root, run, directory)
        result.files_before += before
        result.files_after += after
    if not num_live:  # a live Monitor may be renaming its run.json into place right now
        for orphan in temp_files(run_path):
            orphan.unlink(missing_ok=True)
    result.live_partitions += num_live
    fsync_dir(run_path)


def compact(root: str | Path, run: str | None = None) -> CompactResult:
    """Merge the small parts of each partition of ``run`` (or of every run) into one.

    With ``run``, another writer holding it raises ``RunBusy``; without, busy
    runs are skipped and named in ``busy``.
    """
    if is_url(root):
        from runwatch.data.objcompact import compact_url

        return compact_url(str(root), run)
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: no such directory (expected a runwatch root)")
    names = [run] if run is not None else sorted(set(list_runs(root)) | set(staged_runs(root)))
    return compact_each(names, run, root, lock=lambda name: RunLock(root, name, "compact"),
                        recover_run=lambda name: recover(root, name),
                        has_run=lambda name: (root / f"run={name}").is_dir(),
                        compact_one=lambda name, result: compact_run(root, name, result))


def compact_each(names: list[str], run: str | None, where: object, *, lock: Callable[[str], ContextManager],
                 recover_run: Callable[[str], object], has_run: Callable[[str], bool],
                 compact_one: Callable[[str, CompactResult], None]) -> CompactResult:
    """The loop both backends share: each run under its lock, what a killed writer left recovered first. With
    ``run`` named, a missing run is an error and a busy one raises; over every run they are skipped (busy
    ones named in ``busy``)."""
    result = CompactResult()
    for name in names:
        try:
            with lock(name):
                recover_run(name)
                if not has_run(name):
                    if run is None:
                        continue
                    raise ValueError(f"no run {name!r} under {where}")
                compact_one(name, result)
        except RunBusy as err:
            if run is not None:
                raise
            result.busy.append(str(err))
    return result


__all__ = ["CompactResult", "compact", "compact_each", "compact_partition", "compact_run"]
