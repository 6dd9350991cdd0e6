"""Who may write what: the per-run lock of run-level writers and the claim of a Monitor's partition.

Run-level writers (``import``, ``import --replace``, ``compact``) take the
run's lock, ``ROOT/.run=<id>.lock``, before they look at the run, and hold it
until their switch is done. It is an ``flock`` taken without waiting: a second
writer fails at once with a ``RunBusy`` naming the holder (pid, host, action,
since when), which the holder wrote into the file. The kernel drops the lock
when its process dies, so a lock left by a killed writer is simply taken over
by the next one; there is no stale lock to clean. The holder deletes the file
when it is done (a taker checks that the file it locked is still the one at
the path, so a deletion racing with a new taker cannot give two holders).

``Monitor``s do not take the run lock (the ranks of one run write at the same
time by design). Each claims its own ``segment=<k>/rank=<r>`` directory with
``mkdir``, which fails when the directory exists, so two writers can never
share a partition; the claimant then holds ``.writer.lock`` inside it for its
life. ``live_writers`` finds the partitions whose writer is still alive:
``--replace`` refuses such a run and ``compact`` leaves those partitions alone.
Locks are advisory and local-host reliable; on network filesystems they are as
good as the filesystem's ``flock``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from runwatch.data.storage import partition_dir, run_dir

WRITER_LOCK = ".writer.lock"
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


class RunBusy(RuntimeError):
    """Another live writer holds the run (or partition) this one needs."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as it wrote itself into the lock file."""

    path: Path
    pid: int | None
    host: str
    action: str
    since: float | None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)) if self.since else "?"
        text = f"{self.action} (pid {self.pid} on host {self.host}, since {when})"
        return _PRINTABLE.sub("?", text)  # a lock file is data: no control characters reach a terminal


def run_lock_path(root: str | Path, run: str) -> Path:
    return run_dir(root, run).with_name(f".{run_dir(root, run).name}.lock")


def read_holder(path: Path) -> Holder:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    info = info if isinstance(info, dict) else {}
    pid = info.get("pid")
    since = info.get("since")
    return Holder(path, pid if isinstance(pid, int) else None, str(info.get("host", "?")),
                  str(info.get("action", "a writer")), since if isinstance(since, (int, float)) else None)


def _holder_bytes(action: str) -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "action": action,
                       "since": time.time()}).encode()


def _try_flock(fd: int, shared: bool = False) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


class RunLock:
    """The exclusive lock of one run for a run-level writer; a context manager. Never waits."""

    def __init__(self, root: str | Path, run: str, action: str) -> None:
        self.root, self.run, self.action = Path(root), run, action
        self.path = run_lock_path(root, run)
        self._fd: int | None = None
        self._made_root = False

    def acquire(self) -> "RunLock":
        """Take the lock or raise ``RunBusy`` naming the holder."""
        self._made_root = not self.root.exists()
        self.root.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                if not _try_flock(fd):
                    holder = read_holder(self.path)
                    raise RunBusy(f"run {self.run!r} under {self.root} is busy: {holder.describe()} holds "
                                  f"{self.path.name}; try again when it has finished")
                if _same_file(fd, self.path):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the previous holder deleted the file we locked: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder_bytes(self.action), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)  # closing drops the flock
            self._fd = None
            if self._made_root:
                try:
                    self.root.rmdir()  # a failed first import leaves no empty root behind
                except OSError:
                    pass

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def is_held(lock_path: Path) -> bool:
    """True while a live process holds ``lock_path`` (a momentary shared probe; False when absent)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return not _try_flock(fd, shared=True)
    finally:
        os.close(fd)  # drops the probe's shared lock, if it got one


def live_writers(root: str | Path, run: str) -> list[Holder]:
    """The ``Monitor``s still alive on ``run``: one holder per claimed partition."""
    return [read_holder(p) for p in sorted(run_dir(root, run).glob(f"segment=*/rank=*/{WRITER_LOCK}"))
            if is_held(p)]


@dataclass
class PartitionClaim:
    """A partition this process created and writes alone; ``release`` ends the claim."""

    segment: int
    directory: Path
    fd: int | None
    others: list[Holder]
    """Live writers found on other segments of the same run and rank when the claim was made."""

    def release(self) -> None:
        """End the claim: the lock file goes, the directory (and what was written) stays."""
        if self.fd is not None:
            (self.directory / WRITER_LOCK).unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


def claim_partition(root: str | Path, run: str, rank: int, first: int) -> PartitionClaim:
    """Create ``segment=<k>/rank=<rank>`` for the first free k >= ``first`` and hold its writer lock.

    ``mkdir`` is the claim: it fails when another writer made the directory
    first, and then the next segment is tried. Raises ``OSError`` when the
    directory cannot be created at all (a read-only root).
    """
    segment = first
    while True:
        directory = partition_dir(root, run, segment, rank)
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir()
            break
        except FileExistsError:
            segment += 1
    others = [read_holder(p) for p in sorted(run_dir(root, run).glob(f"segment=*/rank={rank}/{WRITER_LOCK}"))
              if p.parent != directory and is_held(p)]
    fd = None
    try:
        fd = os.open(directory / WRITER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        # Only momentary probes (``is_held``) can hold it now: wait them out, briefly.
        for _ in range(200):
            if _try_flock(fd):
                os.pwrite(fd, _holder_bytes("Monitor"), 0)
                break
            time.sleep(0.005)
        else:
            os.close(fd)
            fd = None
    except OSError:
        # A filesystem without flock: the claim (the directory) still stands, liveness is unknown.
        if fd is not None:
            os.close(fd)
        fd = None
    return PartitionClaim(segment, directory, fd, others)
