"""``compact`` on an object-store root: each partition's parts merged into one, switched by an op record.

The merge is ``compact.py``'s (same bytes as on disk: one metrics part, one
events part, rows in write order), done in a local temporary directory; the
switch is ``objwrite.switch`` (readers see the old parts or the merged one,
never both). A partition whose ``Monitor`` still ships (a fresh
``_writer.json``) is left alone. The run's lock is held throughout.
"""

from __future__ import annotations

import re
import tempfile
from collections import defaultdict
from pathlib import Path

import pyarrow as pa

from runwatch.data.compact import CompactResult, _merge_events, _merge_metrics, compact_each
from runwatch.data.objstore import OPS_DIR, ObjectRoot
from runwatch.data.objwrite import WRITER_CLAIM, ObjectRunLock, live_writers, recover, switch
from runwatch.data.staging import crash_point
from runwatch.data.storage import part_name

_PART = re.compile(r"^(run=[^/]+/segment=\d+/rank=\d+)/(metrics-[^/]*\.parquet|events-[^/]*\.jsonl)$")


def _partitions(committed: dict[str, dict]) -> dict[str, dict[str, list[str]]]:
    """partition prefix -> {'metrics': keys, 'events': keys}, oldest first."""
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: {"metrics": [], "events": []})
    for rel in sorted(committed):
        m = _PART.match(rel)
        if m:
            out[m.group(1)]["metrics" if m.group(2).startswith("metrics") else "events"].append(rel)
    return out


def compact_partition(root: ObjectRoot, run: str, prefix: str, parts: dict[str, list[str]]) -> tuple[int, int]:
    """Merge one partition's parts; (files before, files after). The caller holds the run's lock."""
    metrics, events = parts["metrics"], parts["events"]
    before = len(metrics) + len(events)
    if len(metrics) < 2 and len(events) < 2:
        return before, before
    with tempfile.TemporaryDirectory(prefix="runwatch-compact-") as tmp:
        add, remove = {}, []
        for kind, keys, merge, ext in (("metrics", metrics, _merge_metrics, "parquet"),
                                       ("events", events, _merge_events, "jsonl")):
            if len(keys) < 2:
                continue
            local = []
            for i, rel in enumerate(keys):
                path = Path(tmp) / f"{kind}-{i:06d}.{ext}"
                root.fs.get_file(root.key(rel), str(path))
                local.append(path)
            merged = Path(tmp) / part_name(kind, ext)
            try:
                merge(local, merged)
            except (pa.ArrowException, OSError) as err:
                raise ValueError(f"cannot compact {root.full(prefix)}: {err}") from err
            add[f"{prefix}/{merged.name}"] = str(merged)
            remove += keys
        crash_point("compact.staged")
        switch(root, run, add, remove, "compact")
    return before, min(len(metrics), 1) + min(len(events), 1)


def compact_run(root: ObjectRoot, run: str, result: CompactResult) -> None:
    """Compact every partition of ``run`` no live Monitor ships to; the caller holds the run's lock."""
    live = {h.path.rsplit("/", 1)[0] for h in live_writers(root, run)}
    for prefix, parts in sorted(_partitions(root.committed(run)).items()):
        if root.full(prefix) in live:
            num = len(parts["metrics"]) + len(parts["events"])
            result.files_before += num
            result.files_after += num
            result.live_partitions += 1
            continue
        before, after = compact_partition(root, run, prefix, parts)
        result.files_before += before
        result.files_after += after
    dead = [k for k in root.listing(run)
            if k.endswith("/" + WRITER_CLAIM) and root.full(k.rsplit("/", 1)[0]) not in live]
    root.delete(dead)  # claims of Monitors long gone: nothing reads them


def compact_url(url: str, run: str | None = None) -> CompactResult:
    """``compact`` for an object-store root (see ``compact.compact``)."""
    root = ObjectRoot(url)
    names = [run] if run is not None else sorted(set(root.runs()) | _runs_with_ops(root))
    return compact_each(names, run, url, lock=lambda name: ObjectRunLock(root, name, "compact"),
                        recover_run=lambda name: recover(root, name), has_run=root.has_run,
                        compact_one=lambda name, result: compact_run(root, name, result))


def _runs_with_ops(root: ObjectRoot) -> set[str]:
    return {k.split("/", 1)[0][4:] for k in root.listing() if f"/{OPS_DIR}/op-" in k}
