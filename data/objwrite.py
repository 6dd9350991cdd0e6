"""Writing an object-store root: the run lock, switching many objects through an op record, recovery.

The op protocol is ``objstore.py``'s (why readers see the old parts or the
new, never both). The run lock is one object, ``ROOT/.run=<id>.lock``,
created with a conditional PUT (``If-None-Match: *``: the store refuses it
when the key exists, so of two writers exactly one gets it). A holder that
dies cannot release it, so the lock is a lease: it carries an expiry that
the holder pushes forward while it works (``LEASE_SECONDS``), and a lock past
its expiry is broken with a conditional delete (``If-Match`` its ETag, so
two breakers cannot both win). Stores that ignore ``If-None-Match`` (checked
once per store with a probe key: a second conditional create must fail)
get a warning: there the README's single-writer rule applies, one run-level
writer per run at a time by arrangement (one cron host for ``compact``).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from runwatch.data.locks import Holder, RunBusy
from runwatch.data.objstore import OPS_DIR, ObjectRoot
from runwatch.data.staging import StagedRun, crash_point
from runwatch.data.storage import RUN_META, check_run_name

LEASE_SECONDS = 600.0
"""How long a run lock holds without a refresh; the holder refreshes it every tenth of that."""
WRITER_TTL_SECONDS = 300.0
"""A Monitor's claim (``_writer.json``) counts as live while its heartbeat is younger than this."""
WRITER_CLAIM = "_writer.json"
_UPLOAD_THREADS = 8

T = TypeVar("T")
_conditional: dict[tuple[str, str], bool] = {}


def _precondition_failed(err: OSError) -> bool:
    return isinstance(err, FileExistsError) or err.errno == errno.EINVAL or "Precondition" in str(err)


def create(root: ObjectRoot, rel: str, data: bytes) -> bool:
    """PUT ``rel`` only if no object has that key (``If-None-Match: *``); False when one does."""
    try:
        root.fs.pipe_file(root.key(rel), data, mode="create")
        return True
    except TypeError:  # an fsspec driver without exclusive create: check, then write (racy; see supports_create)
        if root.fs.exists(root.key(rel)):
            return False
        root.put(rel, data)
        return True
    except OSError as err:
        if _precondition_failed(err):
            return False
        raise


def supports_create(root: ObjectRoot) -> bool:
    """Whether the store honours conditional creates (probed once per bucket: the second create must fail)."""
    where = (root.protocol, root.base.split("/", 1)[0])
    if where not in _conditional:
        probe = f"{OPS_DIR}/probe-{uuid.uuid4().hex}"
        try:
            honoured = create(root, probe, b"1") and not create(root, probe, b"2")
        finally:
            root.delete([probe])
        _conditional[where] = honoured
        if not honoured:
            warnings.warn(f"runwatch: {root.url} does not refuse a second conditional create (If-None-Match); "
                          "run-level writers (import, --replace, compact) cannot exclude each other there: run "
                          "one per run at a time (see the README's single-writer rule)", RuntimeWarning, stacklevel=3)
    return _conditional[where]


def _etag(root: ObjectRoot, rel: str) -> str | None:
    try:
        info = root.fs.info(root.key(rel))
    except FileNotFoundError:
        return None
    return info.get("ETag") or info.get("etag")


def delete_if(root: ObjectRoot, rel: str, etag: str | None) -> bool:
    """Delete ``rel`` only if it still has ``etag`` (``If-Match``) where the store can; False when it changed."""
    if etag is None or root.protocol not in ("s3", "s3a"):
        root.delete([rel])
        return True
    bucket, key, _ = root.fs.split_path(root.key(rel))
    try:
        root.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=etag)
        return True
    except FileNotFoundError:
        return True
    except OSError as err:
        if _precondition_failed(err):
            return False
        raise


def _holder_json(action: str, token: str, lease: float) -> bytes:
    now = time.time()
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "action": action, "since": now,
                       "expires": now + lease, "token": token}).encode()


def _read_json(root: ObjectRoot, rel: str) -> dict | None:
    try:
        value = json.loads(root.fs.cat_file(root.key(rel)))
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class ObjectRunLock:
    """The run lock of a run-level writer on an object store; a context manager that never waits."""

    def __init__(self, root: ObjectRoot, run: str, action: str, *, lease: float = LEASE_SECONDS) -> None:
        self.root, self.run, self.action, self.lease = root, check_run_name(run), action, lease
        self.rel = f".run={run}.lock"
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> ObjectRunLock:
        supports_create(self.root)
        for _ in range(3):
            if create(self.root, self.rel, _holder_json(self.action, self.token, self.lease)):
                self._thread = threading.Thread(target=self._refresh, name="runwatch-lease", daemon=True)
                self._thread.start()
                return self
            etag, info = _etag(self.root, self.rel), _read_json(self.root, self.rel)
            if info is None:
                continue  # released meanwhile
            if time.time() < float(info.get("expires") or 0):
                holder = Holder(self.root.full(self.rel), info.get("pid"), str(info.get("host", "?")),
                                str(info.get("action", "a writer")), info.get("since"))
                raise RunBusy(f"run {self.run!r} under {self.root.url} is busy: {holder.describe()} holds "
                              f"{self.rel}; try again when it has finished")
            delete_if(self.root, self.rel, etag)  # an expired lease: its holder died; one breaker wins
        raise RunBusy(f"run {self.run!r} under {self.root.url}: could not take {self.rel} (contended)")

    def _refresh(self) -> None:
        """Push the lease's expiry forward while the operation runs (a killed holder stops doing so)."""
        while not self._stop.wait(self.lease / 10):
            try:
                self.root.put(self.rel, _holder_json(self.action, self.token, self.lease))
            except OSError:
                continue  # the next refresh tries again; the lease has nine more chances

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            info = _read_json(self.root, self.rel)
            if info is not None and info.get("token") == self.token:
                self.root.delete([self.rel])

    def __enter__(self) -> ObjectRunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _op_record(state: str, add: list[str], remove: list[str], action: str, meta: str | None) -> bytes:
    return json.dumps({"state": state, "add": add, "remove": remove, "action": action, "pid": os.getpid(),
                       "host": socket.gethostname(), "time": time.time(), "meta": meta}).encode()


def _meta_rel(run: str) -> str:
    return f"run={run}/{RUN_META}"


def switch(root: ObjectRoot, run: str, add: Mapping[str, str], remove: list[str], action: str,
           meta: bytes | None = None) -> list[str]:
    """Replace the keys ``remove`` of ``run`` by the local files ``add`` (key -> path) for every reader at once.

    ``meta``: the run's new ``run.json``, written right after the switch (one key cannot be both old
    and new; the record carries it, so a crash in between is finished by ``recover``). Hold the run's
    lock. Returns the new objects' URLs.
    """
    op = f"run={check_run_name(run)}/{OPS_DIR}/op-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    added, removed = sorted(add), sorted(remove)
    text = None if meta is None else meta.decode()
    root.put(op, _op_record("pending", added, removed, action, text))
    crash_point("objop.pending")
    with ThreadPoolExecutor(_UPLOAD_THREADS, thread_name_prefix="runwatch-upload") as pool:
        list(pool.map(lambda rel: root.put_file(rel, add[rel]), added))
    crash_point("objop.uploaded")
    root.put(op, _op_record("committed", added, removed, action, text))  # the switch: one PUT
    crash_point("objop.committed")
    _finish(root, run, op, removed, text)
    return [root.full(rel) for rel in added]


def _finish(root: ObjectRoot, run: str, op: str, removed: list[str], meta: str | None) -> None:
    """After the commit: the new run.json, the old parts deleted, then the record."""
    if meta is not None:
        root.put(_meta_rel(run), meta.encode())
    root.delete(removed)
    root.delete([op])


def recover(root: ObjectRoot, run: str) -> int:
    """Finish or undo the ops a dead writer of ``run`` left (hold the run's lock); returns how many."""
    listing = root.listing(run)
    ops = sorted(k for k in listing if k.startswith(f"run={run}/{OPS_DIR}/op-"))
    for op in ops:
        record = root.read_op(op) or {}
        if record.get("state") == "committed":
            _finish(root, run, op, record.get("remove", []), record.get("meta"))
        else:
            root.delete(record.get("add", []))
            root.delete([op])
    return len(ops)


def replace_run(url: str, run: str, build: Callable[[StagedRun], T], *, replace: bool,
                action: str) -> tuple[T, list[str]]:
    """Land a new run tree (built by ``build`` into a local ``StagedRun``) as ``run`` under ``url``.

    Takes the run's lock, recovers, refuses an existing run without ``replace`` and a run a Monitor
    still ships to; then uploads through one op: every reader sees the old run (or none) or the new
    one. Returns what ``build`` returned and the new objects' URLs.
    """
    root = ObjectRoot(url, create=True)
    with ObjectRunLock(root, run, action):
        recover(root, run)
        old = root.committed(run)
        if root.files_of(old, run, "metrics") and not replace:
            raise ValueError(f"run {run!r} already exists under {url}; choose another --run or pass --replace")
        writers = live_writers(root, run)
        if writers:
            raise RunBusy(f"run {run!r} under {url} is being recorded: {writers[0].describe()}; "
                          "stop it before replacing the run")
        with tempfile.TemporaryDirectory(prefix="runwatch-stage-") as tmp:
            staged = StagedRun(tmp, run)
            try:
                result = build(staged)
                staged.commit()
            except BaseException:
                staged.abort()
                raise
            base = Path(tmp)
            files = [p for p in (base / f"run={run}").rglob("*") if p.is_file()]
            add = {p.relative_to(base).as_posix(): str(p) for p in files if p.name != RUN_META}
            meta = (base / f"run={run}" / RUN_META).read_bytes() if (base / f"run={run}" / RUN_META).exists() else None
            urls = switch(root, run, add, [k for k in old if k != _meta_rel(run)], action, meta)
    return result, urls


def live_writers(root: ObjectRoot, run: str, now: float | None = None) -> list[Holder]:
    """The Monitors still shipping to ``run``: claims whose heartbeat is younger than ``WRITER_TTL_SECONDS``."""
    now = time.time() if now is None else now
    out = []
    for rel in sorted(k for k in root.listing(run) if k.endswith("/" + WRITER_CLAIM)):
        info = _read_json(root, rel) or {}
        if now - float(info.get("heartbeat") or 0) < WRITER_TTL_SECONDS:
            out.append(Holder(root.full(rel), info.get("pid"), str(info.get("host", "?")), "Monitor",
                              info.get("since")))
    return out
