"""Which runs changed: a change source that works by listing, for roots that cannot be watched.

An object store sends no inotify events, so anything that follows live runs
there (``runwatch watch``, the dashboard's overview) lists the root at an
interval and compares each run's **signature**: the newest modification time
and the number of its committed data files (metrics and events), the same
signature the dashboard keys its caches on. A flush adds a file, a
compaction or ``--replace`` changes the count or the times, so an unchanged
signature means unchanged data. On an object store one poll is one paginated
LIST of the root (1,000 keys a page on S3) plus a GET per op record in flight;
on disk it is a directory walk.

    changes = ListingChanges("s3://bucket/prefix", interval=10.0)
    while True:
        for run, sig in changes.poll().items():   # sig None: the run is gone
            ...                                   # judge `run` again
        changes.wait()
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from runwatch.data.roots import Root, open_root, run_of

Signature = tuple[float, int]


def listed_signatures(root: Root) -> dict[str, Signature]:
    """Every run's (newest modification time, number of data files) from one listing of the root."""
    out: dict[str, list[float]] = {}
    for kind in ("metrics", "events"):
        for f in root.files(None, kind):
            out.setdefault(run_of(f.path), []).append(f.mtime)
    return {run: (max(mtimes), len(mtimes)) for run, mtimes in sorted(out.items())}


class ListingChanges:
    """Polls a root (a directory or an object-store URL) by listing; reports the runs whose files changed."""

    def __init__(self, root: str | Path, interval: float = 10.0) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.root = open_root(root)
        self.interval = interval
        self.known: dict[str, Signature] = {}
        self._stop = threading.Event()
        self._last = 0.0

    def poll(self) -> dict[str, Signature | None]:
        """Runs that are new or changed since the last poll (with their signature), and gone runs (None).

        The first poll reports every run. A listing that fails (an outage)
        raises; the caller keeps its state and polls again later.
        """
        self._last = time.monotonic()
        now = listed_signatures(self.root)
        changed: dict[str, Signature | None] = {run: sig for run, sig in now.items() if self.known.get(run) != sig}
        changed.update({run: None for run in self.known if run not in now})
        self.known = now
        return changed

    def due_in(self) -> float:
        """Seconds until the next poll is due (0 when it is)."""
        return max(0.0, self.interval - (time.monotonic() - self._last))

    def wait(self) -> bool:
        """Sleep until the next poll is due; False when ``stop`` was called."""
        return not self._stop.wait(self.due_in())

    def stop(self) -> None:
        self._stop.set()
