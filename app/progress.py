"""Progress of a long job (``runwatch demo``, a large import), the way its output expects it.

On a terminal: one live bar, redrawn in place at most ten times a second.
Anywhere else (a log file, a pipe, CI): a plain line every ``every_s``
seconds, each complete and newline-terminated, so ``tail -f`` and ``grep``
read it and nothing is joined by carriage returns. A job shorter than the
first report prints nothing of its own.

``reading(paths, progress)`` follows a parser that opens the files itself,
without a hook in every format: a thread reads the offset of this process's
open descriptors on those files from ``/proc/self/fdinfo`` (Linux; elsewhere
it reports elapsed time only).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

BAR_WIDTH = 30
EVERY_ENV = "RUNWATCH_PROGRESS_SECONDS"
"""How often a log file gets a progress line (seconds, default 10); a terminal's bar starts after at most 1 s."""


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """``update(done)`` as work proceeds, ``close()`` at the end; draws a bar on a tty, writes lines elsewhere."""

    def __init__(self, total: float, label: str, out: TextIO | None = None, *, unit: str = "",
                 every_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.label, self.unit = max(float(total), 1e-9), label, unit
        self.out = sys.stderr if out is None else out
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        every_s = float(os.environ.get(EVERY_ENV, "10")) if every_s is None else every_s
        self.every_s = min(1.0, every_s) if self.tty else every_s
        """The first report waits this long (short jobs print nothing); a log file gets a line this often."""
        self.clock = clock
        self.start = clock()
        self.done = 0.0
        self.detail = ""
        self._last_report: float | None = None
        self._lock = threading.Lock()

    def advance(self, detail: str = "", by: float = 1.0) -> None:
        self.update(self.done + by, detail)

    def update(self, done: float, detail: str = "") -> None:
        with self._lock:
            self.done, self.detail = min(float(done), self.total), detail
            now = self.clock()
            if now - self.start < self.every_s:
                return
            if self._last_report is not None and now - self._last_report < (0.1 if self.tty else self.every_s):
                return
            self._last_report = now
            self._report(now)

    def _counts(self) -> str:
        if not self.unit:
            return ""
        return f" ({self.done:,.0f}/{self.total:,.0f} {self.unit})"

    def _eta(self, now: float) -> str:
        elapsed = now - self.start
        frac = self.done / self.total
        left = f", about {_duration(elapsed * (1 - frac) / frac)} left" if 0 < frac < 1 else ""
        return f"{_duration(elapsed)} elapsed{left}"

    def _report(self, now: float) -> None:
        frac = self.done / self.total
        if self.tty:
            bar = "#" * int(frac * BAR_WIDTH)
            line = f"\r{self.label} [{bar:<{BAR_WIDTH}}] {frac:4.0%}{self._counts()} {self.detail}  {self._eta(now)}"
            self.out.write(line[:200] + "\x1b[K")  # erase what a longer previous line left
        else:
            self.out.write(f"{self.label}: {frac:.0%}{self._counts()}"
                           + (f", {self.detail}" if self.detail else "") + f", {self._eta(now)}\n")
        self.out.flush()

    def close(self, summary: str | None = None) -> None:
        """End the bar (a final full bar and a newline) or the log (a last line), only if anything was shown."""
        with self._lock:
            now = self.clock()
            if self._last_report is None:
                return
            self.done = self.total if summary is not None else self.done
            if self.tty:
                self._report(now)
                self.out.write("\n")
            else:
                self.out.write(f"{self.label}: {summary or 'stopped'} in {_duration(now - self.start)}\n")
            self.out.flush()


def _offsets(paths: Sequence[Path]) -> dict[int, int]:
    """Index of each file among ``paths`` -> the furthest offset of an open descriptor on it in this process."""
    wanted = {os.path.realpath(p): i for i, p in enumerate(paths)}
    out: dict[int, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target not in wanted:
                continue
            with open(f"/proc/self/fdinfo/{fd}") as info:
                pos = int(info.readline().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # closed between listing and reading
        out[wanted[target]] = max(out.get(wanted[target], 0), pos)
    return out


@contextmanager
def reading(paths: Sequence[str | Path], progress: Progress, every_s: float = 0.2) -> Iterator[Progress]:
    """Report how far this process has read into ``paths`` (in order) while the body runs."""
    files = [Path(p) for p in paths if Path(p).is_file()]
    sizes = [f.stat().st_size for f in files]
    stop = threading.Event()
    proc_fd = os.path.isdir("/proc/self/fdinfo")

    def follow() -> None:
        reached = -1
        while not stop.wait(every_s):
            offsets = _offsets(files) if proc_fd else {}
            if offsets:
                reached = max(reached, max(offsets))
            if reached < 0:
                progress.update(0, "starting")
                continue
            done = sum(sizes[:reached]) + offsets.get(reached, sizes[reached] if reached < len(sizes) else 0)
            progress.update(done, f"reading {files[reached].name}")

    thread = threading.Thread(target=follow, name="runwatch-progress", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()
