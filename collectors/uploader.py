"""Shipping a Monitor's parts to an object-store root: a local spool, a background uploader, back-off.

``Monitor("s3://bucket/prefix", run=..., spool="/local/dir")`` writes exactly
as it does to a local root, into the spool (a local runwatch root); this
thread copies each finished part to the remote root and deletes it from the
spool once the PUT succeeded. The training thread never waits on the
network: it only ever touches the spool, through the writer.

* **Exactly once.** A part keeps its file name remotely, under the remote
  segment this spool partition was mapped to (``.remote.json``, written
  before the first upload), so an upload retried after a lost response, or
  repeated by the next uploader after a kill between the PUT and the local
  delete, rewrites the same key with the same bytes: no row twice.
* **Outages delay, never drop** while the spool holds: a failed PUT is
  retried with exponential back-off (with jitter) up to ``retry_max_seconds``.
  When the parts waiting exceed ``max_spool_bytes``, the oldest metrics parts
  are deleted and counted (``num_dropped_parts``, ``num_dropped_rows``);
  events and run metadata never are.
* **Segments.** Each spool partition claims the next free remote segment of
  its rank with a conditional create of ``_writer.json`` (whose heartbeat,
  refreshed while shipping, tells ``--replace`` and ``compact`` that a
  writer is alive); another Monitor of the same rank elsewhere gets the
  next one.
* **Leftovers.** Parts a killed Monitor left in the spool are shipped by the
  next uploader of the same spool, run and rank (an ``flock`` per spool
  partition makes sure only one uploader ships it).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from runwatch.data.locks import WRITER_LOCK, is_held
from runwatch.data.objstore import ObjectRoot
from runwatch.data.objwrite import WRITER_CLAIM, create
from runwatch.data.storage import RUN_META, run_dir

MAPPING = ".remote.json"
UPLOADER_LOCK = ".uploader.lock"


@dataclass(kw_only=True, frozen=True)
class UploaderConfig:
    """How a Monitor ships its spool to an object-store root."""

    max_spool_bytes: int = 1 << 30
    """Bytes of parts that may wait in the spool; beyond it the oldest metrics parts are dropped and counted.
    An outage lasts as long as this over the bytes per second the run writes (the README gives numbers)."""
    retry_initial_seconds: float = 1.0
    """First wait after a failed upload; doubled after each further failure."""
    retry_max_seconds: float = 60.0
    """Longest wait between tries during an outage (how soon shipping resumes once the store is back)."""
    poll_seconds: float = 1.0
    """How often the spool is looked at for new parts when nothing wakes the uploader."""
    heartbeat_seconds: float = 60.0
    """How often the remote claim's heartbeat is refreshed while the Monitor lives."""

    def __post_init__(self) -> None:
        if self.max_spool_bytes < 1:
            raise ValueError(f"max_spool_bytes must be >= 1, got {self.max_spool_bytes}")
        if not 0 < self.retry_initial_seconds <= self.retry_max_seconds:
            raise ValueError("need 0 < retry_initial_seconds <= retry_max_seconds, got "
                             f"{self.retry_initial_seconds} and {self.retry_max_seconds}")
        if not self.poll_seconds > 0 or not self.heartbeat_seconds > 0:
            raise ValueError("poll_seconds and heartbeat_seconds must be > 0")


def _parts(directory: Path) -> list[Path]:
    """Finished parts of a spool partition, oldest first (names sort by creation time; temporaries are hidden)."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith(("metrics-", "events-"))
                 and n.endswith((".parquet", ".jsonl"))]
    except FileNotFoundError:
        return []
    return sorted((directory / n for n in names), key=lambda p: p.name.split("-", 1)[1])


def _rows(path: Path) -> int:
    try:
        return pq.read_metadata(path).num_rows
    except Exception:  # noqa: BLE001 - a part we cannot read is still dropped; count no rows
        return 0


class Uploader:
    """The background thread that ships one Monitor's spool partition (and dead leftovers) to ``remote``."""

    def __init__(self, remote: str, spool: Path, run: str, rank: int, partition: Path,
                 config: UploaderConfig | None = None) -> None:
        self.root = ObjectRoot(remote, create=True, fail_fast=True)  # no network here: the first call is the thread's
        self.spool, self.run, self.rank, self.partition = spool, run, rank, partition
        self.config = config or UploaderConfig()
        self.num_uploaded_parts = 0
        self.num_failures = 0
        self.num_dropped_parts = 0
        self.num_dropped_rows = 0
        self.last_error: str | None = None
        """The latest failed upload's error (None once a try succeeds): what an outage looks like from here."""
        self._meta_mtime: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._deadline = float("inf")
        self._warned = False
        self._locks: dict[Path, int] = {}
        self._last_beat: dict[str, float] = {}
        self._lock_partition(partition)
        self._thread = threading.Thread(target=self._run, name="runwatch-uploader", daemon=True)
        self._thread.start()

    # -- the Monitor's side ---------------------------------------------------------------

    def wake(self) -> None:
        """A part landed in the spool: look now instead of at the next poll."""
        self._wake.set()

    @property
    def num_waiting(self) -> int:
        """Parts of this Monitor's partition still in the spool."""
        return len(_parts(self.partition))

    def close(self, timeout: float) -> bool:
        """Ship what is left (within ``timeout``), end the claim and stop; False when parts stayed in the spool."""
        self._deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout + 1.0)
        left = self.num_waiting
        if left:
            warnings.warn(f"runwatch: {left} part(s) of run {self.run!r} are still in the spool {self.partition} "
                          f"(not yet uploaded to {self.root.url}; last error: {self.last_error}); the next Monitor "
                          "with this spool ships them",
                          RuntimeWarning, stacklevel=2)
        return not self._thread.is_alive() and not left

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        delay = self.config.retry_initial_seconds
        while True:
            try:
                # Decided before the pass, not after it: a part the writer renamed into the spool while a pass
                # was listing it would otherwise be left behind by the last pass (seen as 1 part in the spool,
                # no error, at close).
                last_pass = self._stop.is_set() and self._writer_done()
                self._ship_all()
                delay, self.last_error = self.config.retry_initial_seconds, None
                if last_pass:
                    self._end_claims()
                    return
            except Exception as err:  # noqa: BLE001 - an outage or anything else: wait, then try again
                self.num_failures += 1
                self.last_error = f"{type(err).__name__}: {' '.join(str(err).split())}"
                self._warn_once(err)
                self._enforce_bound()
                wait = min(delay, self.config.retry_max_seconds) * random.uniform(0.8, 1.2)
                if self._stop.is_set() and time.monotonic() + wait > self._deadline:
                    return  # closing and the store is still away: the parts stay in the spool
                self._wake.wait(wait)
                self._wake.clear()
                delay = min(delay * 2, self.config.retry_max_seconds)
                continue
            self._wake.wait(self.config.poll_seconds)
            self._wake.clear()

    def _writer_done(self) -> bool:
        return not is_held(self.partition / WRITER_LOCK)

    def _ship_all(self) -> None:
        self._enforce_bound()
        for directory in [*self._leftovers(), self.partition]:  # older segments claim remote numbers first
            mapping = self._remote_partition(directory)
            for part in _parts(directory):
                self.root.put_file(f"{mapping}/{part.name}", str(part))
                part.unlink(missing_ok=True)
                self.num_uploaded_parts += 1
            self._heartbeat(mapping, directory)
            if directory != self.partition and not _parts(directory) and not is_held(directory / WRITER_LOCK):
                self._end_claim(mapping)
                self._unlock_partition(directory)
        self._ship_meta()

    def _leftovers(self) -> list[Path]:
        """Spool partitions of this run and rank whose Monitor is gone, with parts still to ship."""
        out = []
        for directory in sorted(run_dir(self.spool, self.run).glob(f"segment=*/rank={self.rank}")):
            if directory == self.partition or not _parts(directory) or is_held(directory / WRITER_LOCK):
                continue
            if directory in self._locks or self._lock_partition(directory):
                out.append(directory)
        return out

    def _lock_partition(self, directory: Path) -> bool:
        """Hold the partition's uploader lock (one uploader per spool partition); False when another has it."""
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / UPLOADER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._locks[directory] = fd
        return True

    def _unlock_partition(self, directory: Path) -> None:
        fd = self._locks.pop(directory, None)
        if fd is not None:
            os.close(fd)

    def _remote_partition(self, directory: Path) -> str:
        """The remote ``run=<id>/segment=<k>/rank=<r>`` of a spool partition: remembered, else claimed now."""
        mapping = directory / MAPPING
        try:
            known = json.loads(mapping.read_text())
            if known.get("url") == self.root.url:
                return known["partition"]
        except (FileNotFoundError, ValueError, KeyError):
            pass
        committed = self.root.listing(self.run)
        used = {int(k.split("/")[1].split("=", 1)[1]) for k in committed
                if k.split("/")[1].startswith("segment=") and k.split("/")[2] == f"rank={self.rank}"}
        segment = max(used) + 1 if used else 0
        while not create(self.root, self._claim_key(segment), self._claim_json()):
            segment += 1
        partition = f"run={self.run}/segment={segment}/rank={self.rank}"
        tmp = mapping.with_name(mapping.name + ".tmp")
        tmp.write_text(json.dumps({"url": self.root.url, "partition": partition}))
        os.replace(tmp, mapping)  # remembered before the first part goes up: retries hit the same keys
        return partition

    def _claim_key(self, segment: int) -> str:
        return f"run={self.run}/segment={segment}/rank={self.rank}/{WRITER_CLAIM}"

    def _claim_json(self) -> bytes:
        now = time.time()
        return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now, "heartbeat": now}).encode()

    def _heartbeat(self, mapping: str, directory: Path) -> None:
        if directory != self.partition or self._stop.is_set():
            return
        now = time.time()
        if now - self._last_beat.get(mapping, 0.0) >= self.config.heartbeat_seconds:
            self.root.put(f"{mapping}/{WRITER_CLAIM}", self._claim_json())
            self._last_beat[mapping] = now

    def _end_claim(self, mapping: str) -> None:
        self.root.delete([f"{mapping}/{WRITER_CLAIM}"])

    def _end_claims(self) -> None:
        try:
            known = json.loads((self.partition / MAPPING).read_text())
            self._end_claim(known["partition"])
        except (FileNotFoundError, ValueError, KeyError):
            pass  # nothing was ever shipped: no claim was made

    def _ship_meta(self) -> None:
        """The spool's ``run.json`` (rank 0 writes it), merged into the remote one when it changed."""
        local = run_dir(self.spool, self.run) / RUN_META
        try:
            mtime = local.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if mtime == self._meta_mtime:
            return
        merged = {**self.root.meta(self.run), **json.loads(local.read_text())}
        self.root.put(f"run={self.run}/{RUN_META}", json.dumps(merged, indent=1, default=str).encode())
        self._meta_mtime = mtime

    def _enforce_bound(self) -> None:
        """Keep the spool's waiting parts under ``max_spool_bytes``: drop the oldest metrics parts, count them."""
        parts = [p for d in [self.partition, *self._locks] for p in _parts(d)]
        sizes = {}
        for p in parts:
            try:
                sizes[p] = p.stat().st_size
            except FileNotFoundError:
                continue
        total = sum(sizes.values())
        for p in sorted((p for p in sizes if p.name.startswith("metrics-")), key=lambda p: p.name.split("-", 1)[1]):
            if total <= self.config.max_spool_bytes:
                break
            self.num_dropped_rows += _rows(p)
            p.unlink(missing_ok=True)
            self.num_dropped_parts += 1
            total -= sizes[p]

    def _warn_once(self, err: Exception) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"runwatch: uploading to {self.root.url} failed ({type(err).__name__}: {err}); parts wait "
                          f"in the spool and are retried with back-off (training continues; further failures are "
                          "only counted)", RuntimeWarning, stacklevel=2)
