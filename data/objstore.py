"""A root on object storage (``s3://bucket/prefix``, any fsspec URL): listing, reading, and what is committed.

The layout is the one on disk (``storage.py``), key for key. What differs is
how many files change at once. An object store has no rename: one PUT (or
one completed multipart upload) is atomic, so a single part is written under
its final name only once complete, and nothing else is needed for a
``Monitor``'s uploads. An import, ``--replace`` or ``compact`` changes many
objects, which no store can do at once; instead each such operation writes
an **op record** first, ``run=<id>/_runwatch/op-<id>.json``::

    {"state": "pending" | "committed", "add": [keys], "remove": [keys], ...}

and readers resolve the listing through it: a key in a *pending* op's
``add`` is not there yet, a key in a *committed* op's ``remove`` is gone
already. The writer (``objwrite.py``) writes the record (pending), uploads
the new parts, rewrites the record as committed (the switch: one PUT),
deletes the old parts, then deletes the record. Whatever a reader's listing
caught of that sequence, it resolves to the old parts or the new, never
both, and never neither:

* before the commit, every new part is hidden by the pending record, and the
  old parts are all there (nothing is deleted before the commit);
* after the commit, the old parts are hidden by the committed record
  (whether or not their deletion has happened yet), and the new parts were
  all uploaded before the commit, but a listing taken *before* some of them
  landed and a record read *after* the commit would miss them: a committed
  record whose ``add`` is not all listed marks the listing stale, and it is
  taken again;
* a record listed but gone when read means the operation finished meanwhile:
  listed again too.

S3 has been strongly consistent for LIST after PUT and DELETE since 2020, so
"listed again" converges at once. Engines that list the prefix themselves
(Spark, Trino, plain DuckDB globs) do not read op records: they may see a
compaction's merged part beside its old parts for the seconds between the
upload and the deletes (the README says so). The ``_runwatch`` folder starts
with an underscore, which Spark, Hive and Trino skip, and holds no
``.parquet`` key, so no metrics glob matches a record.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from datetime import datetime
from typing import IO

from runwatch.data.roots import FileInfo
from runwatch.data.storage import RUN_META, check_run_name

OPS_DIR = "_runwatch"
_DATA_KEY = re.compile(r"^run=([^/]+)/segment=(\d+)/rank=(\d+)/(metrics-[^/]*\.parquet|events-[^/]*\.jsonl)$")
_OP_KEY = re.compile(r"^run=([^/]+)/_runwatch/op-[^/]*\.json$")
_ATTEMPTS = 5

_fs_lock = threading.Lock()


def storage_options(protocol: str, fail_fast: bool = False) -> dict:
    """fsspec options per protocol: no listing cache (a stale listing would hide a flush or show a
    switched-away part) and bounded network waits (an outage must fail a call, not hang it).
    ``fail_fast``: one try per call with short timeouts, for a caller that retries with its own
    back-off (the Monitor's uploader). Credentials and the endpoint come from the SDK's own chain
    (``AWS_*`` variables, profiles, instance roles, ``AWS_ENDPOINT_URL``); runwatch never reads or
    stores a secret."""
    if protocol in ("s3", "s3a"):
        if fail_fast:
            return {"use_listings_cache": False,
                    "config_kwargs": {"connect_timeout": 3, "read_timeout": 10, "retries": {"max_attempts": 1}}}
        return {"use_listings_cache": False,
                "config_kwargs": {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 3}}}
    return {"use_listings_cache": False} if protocol in ("gs", "gcs", "abfs", "az") else {}


def filesystem(url: str, fail_fast: bool = False) -> tuple[object, str]:
    """(fsspec filesystem, path without protocol) of ``url``; a missing optional package says what to install."""
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        with _fs_lock:
            fs, path = fsspec.url_to_fs(url, **storage_options(protocol, fail_fast))
    except ImportError as err:
        raise ImportError(f"{url}: reading {protocol}:// roots needs an fsspec driver: "
                          f"pip install 'runwatch[s3]' (s3fs) or the driver for {protocol}") from err
    if fail_fast and hasattr(fs, "retries"):
        fs.retries = 1  # s3fs's own retry loop (not a constructor option); its instance is this caller's alone
    return fs, path


def _mtime(info: dict) -> float:
    for name in ("LastModified", "mtime", "last_modified", "created", "updated"):
        value = info.get(name)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


class StaleListing(RuntimeError):
    """A listing that an operation overtook (see the module docstring); list again."""


class ObjectRoot:
    """A runwatch root under an fsspec URL; see the module docstring for how it is read."""

    def __init__(self, url: str, *, create: bool = False, fail_fast: bool = False) -> None:
        self.url = url.rstrip("/")
        self.fs, self.base = filesystem(self.url, fail_fast)
        self.base = self.base.rstrip("/")
        self.protocol = self.url.split("://", 1)[0]
        if not create and not self._root_exists():
            raise ValueError(f"{self.url}: no such bucket or prefix (expected a runwatch root)")

    def _root_exists(self) -> bool:
        try:
            return bool(self.fs.exists(self.base)) or bool(self.fs.ls(self.base, detail=False))
        except FileNotFoundError:
            return False

    # -- keys -------------------------------------------------------------------------

    def key(self, rel: str) -> str:
        """The filesystem path of ``rel`` (a key relative to the root)."""
        return f"{self.base}/{rel}"

    def full(self, rel: str) -> str:
        """The URL of ``rel``, as DuckDB (through the registered filesystem) and users see it."""
        return f"{self.protocol}://{self.key(rel)}"

    def rel(self, path: str) -> str:
        path = path.split("://", 1)[-1]
        return path[len(self.base) + 1:] if path.startswith(self.base + "/") else path

    # -- listing and resolution ---------------------------------------------------------

    def listing(self, run: str | None = None) -> dict[str, dict]:
        """Every object under the root (or one run), by key relative to the root."""
        top = self.key(f"run={check_run_name(run)}") if run is not None else self.base
        try:
            found = self.fs.find(top, detail=True)
        except FileNotFoundError:
            return {}
        # Only keys under the run's own folder: a driver whose find() matched by bare prefix would also
        # return run=<id>x/..., which a --replace of <id> must never see (it deletes what it lists).
        inside = "" if run is None else f"run={run}/"
        return {rel: v for k, v in found.items()
                if v.get("type", "file") != "directory" and (rel := self.rel(k)).startswith(inside)}

    def read_op(self, rel: str) -> dict | None:
        """An op record, or None when it is gone (its operation finished after we listed)."""
        try:
            record = json.loads(self.fs.cat_file(self.key(rel)))
        except FileNotFoundError:
            return None
        return record if isinstance(record, dict) else {}

    def resolve(self, listing: dict[str, dict]) -> dict[str, dict]:
        """The committed keys of a listing (op records applied); raises ``StaleListing`` when overtaken."""
        hidden: set[str] = set()
        for rel in sorted(k for k in listing if _OP_KEY.match(k)):
            hidden.add(rel)
            record = self.read_op(rel)
            if record is None:
                raise StaleListing(rel)
            if record.get("state") == "committed":
                if not all(k in listing for k in record.get("add", [])):
                    raise StaleListing(rel)
                hidden.update(record.get("remove", []))
            else:
                hidden.update(record.get("add", []))
        return {k: v for k, v in listing.items() if k not in hidden}

    def committed(self, run: str | None = None) -> dict[str, dict]:
        """The committed objects under the root (or one run), listed again while an operation overtakes us."""
        for attempt in range(_ATTEMPTS):
            try:
                return self.resolve(self.listing(run))
            except StaleListing:
                if attempt + 1 == _ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _info(self, rel: str, info: dict) -> FileInfo:
        return FileInfo(self.full(rel), int(info.get("size") or 0), _mtime(info),
                        info.get("ETag") or info.get("etag") or info.get("md5Hash") or (info.get("size"), _mtime(info)))

    def files_of(self, committed: dict[str, dict], run: str | None, kind: str) -> list[FileInfo]:
        """Data files of ``kind`` ('metrics' or 'events') among ``committed``, oldest first per partition."""
        out = []
        for rel in sorted(committed):
            m = _DATA_KEY.match(rel)
            if m and (run is None or m.group(1) == run) and m.group(4).startswith(kind):
                out.append(self._info(rel, committed[rel]))
        return out

    # -- the reader interface (roots.Root) -------------------------------------------------

    def runs(self) -> list[str]:
        return sorted({m.group(1) for rel in self.committed() if (m := _DATA_KEY.match(rel))})

    def files(self, run: str | None, kind: str) -> list[FileInfo]:
        return self.files_of(self.committed(run), run, kind)

    def has_run(self, run: str) -> bool:
        return bool(self.files(run, "metrics"))

    def meta(self, run: str) -> dict:
        try:
            data = self.fs.cat_file(self.key(f"run={check_run_name(run)}/{RUN_META}"))
        except FileNotFoundError:
            return {}
        try:
            meta = json.loads(data)
        except ValueError as err:
            raise ValueError(f"{self.full(f'run={run}/{RUN_META}')}: unreadable run metadata ({err})") from err
        return meta if isinstance(meta, dict) else {}

    def read_bytes(self, path: str) -> bytes:
        return self.fs.cat_file(self.key(self.rel(path)))

    def open(self, path: str) -> IO[bytes]:
        return self.fs.open(self.key(self.rel(path)), "rb")

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(self.key(self.rel(path))))

    def generation(self, run: str) -> object:
        """The committed data files of the run: any switch, flush or compaction changes it."""
        return frozenset((f.path, f.ident) for kind in ("metrics", "events") for f in self.files(run, kind))

    # -- writing (used by objwrite.py and the Monitor's uploader) ---------------------------

    def put(self, rel: str, data: bytes) -> None:
        """One atomic PUT of a whole object under its final key."""
        self.fs.pipe_file(self.key(rel), data)

    def put_file(self, rel: str, local: str) -> None:
        """Upload a local file under its final key (a multipart upload appears only once complete)."""
        self.fs.put_file(local, self.key(rel))

    def delete(self, rels: Iterable[str]) -> None:
        keys = [self.key(r) for r in rels]
        if keys:
            try:
                self.fs.rm(keys)
            except FileNotFoundError:
                pass  # already gone: what we wanted
