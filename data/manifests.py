"""Symlink manifests: the committed metrics parts of each partition, for engines that read whole directories.

Hive-style engines (Trino's and Athena's Hive connectors) read every file in a
partition's directory as the table's format, and a runwatch partition also
holds its ``events-*.jsonl``; they also see a compaction's parts before its op
record is resolved. A table defined with Hive's ``SymlinkTextInputFormat``
reads instead the Parquet files listed in a text file per partition. This
writes those lists, from runwatch's own view of what is committed:

    ROOT/_symlink/run=<id>/segment=<k>/rank=<r>/manifest    one part URL per line

(``_symlink`` starts with an underscore, which Spark, Hive and Trino skip, and
holds no ``.parquet`` key.) A manifest is rewritten whole (one PUT, or a
rename on disk); the manifests of partitions that no longer exist are deleted.
Run it after imports and compactions (the same cron job as ``compact``).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from runwatch.data.roots import is_url, open_root
from runwatch.data.storage import write_bytes_atomic

SYMLINK_DIR = "_symlink"


def _partition(path: str) -> str:
    return "/".join(path.replace("\\", "/").split("/")[-4:-1])


def write_manifests(root: str | Path) -> int:
    """Write one manifest per partition holding metrics; returns how many were written."""
    location = open_root(root)
    by_partition: dict[str, list[str]] = defaultdict(list)
    for f in location.files(None, "metrics"):
        by_partition[_partition(f.path)].append(f.path if is_url(root) else str(Path(f.path).resolve()))
    if is_url(root):
        stale = {k.rsplit("/", 1)[0][len(SYMLINK_DIR) + 1:] for k in location.listing()
                 if k.startswith(SYMLINK_DIR + "/")}
        for partition, parts in by_partition.items():
            location.put(f"{SYMLINK_DIR}/{partition}/manifest", ("\n".join(parts) + "\n").encode())
        location.delete(f"{SYMLINK_DIR}/{p}/manifest" for p in stale - set(by_partition))
    else:
        top = location.path / SYMLINK_DIR
        stale = {m.parent.relative_to(top).as_posix() for m in top.glob("run=*/segment=*/rank=*/manifest")}
        for partition, parts in by_partition.items():
            write_bytes_atomic(("\n".join(parts) + "\n").encode(), top / partition / "manifest")
        for p in stale - set(by_partition):
            (top / p / "manifest").unlink(missing_ok=True)
    return len(by_partition)
