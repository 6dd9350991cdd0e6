"""Where a root lives: a local directory or an object-store URL, behind one small read interface.

The store, the dashboard and ``check --all`` ask a root the same few
questions (which runs, which committed files with their size and time, the
bytes of a small file, whether a run was switched under them); ``LocalRoot``
answers them from the filesystem (``storage.py``'s layout, unchanged) and
``objstore.ObjectRoot`` from an fsspec listing. ``open_root`` picks one:
any ``scheme://`` URL but ``file://`` is an object store.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from runwatch.data.storage import RUN_META, data_files, list_runs, read_run_meta, run_dir

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(root: str | Path) -> bool:
    """True for an object-store root (``s3://bucket/prefix``, ``gs://...``, ``memory://...``); ``file://`` is local."""
    return isinstance(root, str) and bool(_URL.match(root)) and not root.startswith("file://")


def local_path(root: str | Path) -> Path:
    """A local root as a path (``file://`` stripped)."""
    return Path(root[len("file://"):]) if isinstance(root, str) and root.startswith("file://") else Path(root)


@dataclass(frozen=True)
class FileInfo:
    """One committed file of a run: what identifies its content and when it last changed."""

    path: str
    """A path DuckDB can open (a local path, or a URL its registered filesystem serves)."""
    size: int
    mtime: float
    """Last modification, unix seconds."""
    ident: object
    """Inode on disk, ETag on an object store: a rewritten file with the same size and time still differs."""


class Root(Protocol):
    """What readers need of a root; ``LocalRoot`` and ``objstore.ObjectRoot`` implement it."""

    url: str

    def runs(self) -> list[str]: ...
    def files(self, run: str | None, kind: str) -> list[FileInfo]: ...
    def has_run(self, run: str) -> bool: ...
    def meta(self, run: str) -> dict: ...
    def read_bytes(self, path: str) -> bytes: ...
    def open(self, path: str) -> IO[bytes]: ...
    def exists(self, path: str) -> bool: ...
    def generation(self, run: str) -> object: ...


class LocalRoot:
    """A root directory on this machine (see ``storage.py`` for the layout and how it is switched)."""

    def __init__(self, root: str | Path) -> None:
        self.path = local_path(root)
        self.url = str(self.path)

    def runs(self) -> list[str]:
        return list_runs(self.path)

    def files(self, run: str | None, kind: str) -> list[FileInfo]:
        """Committed files of ``kind`` with their stat; listed again when one vanished meanwhile (a switch)."""
        for _ in range(5):
            try:
                out = []
                for p in data_files(self.path, run, kind):
                    st = os.stat(p)
                    out.append(FileInfo(str(p), st.st_size, st.st_mtime, (st.st_ino, st.st_mtime_ns)))
                return out
            except FileNotFoundError:
                continue
        return []

    def has_run(self, run: str) -> bool:
        return run_dir(self.path, run).is_dir() and bool(data_files(self.path, run, "metrics"))

    def meta(self, run: str) -> dict:
        return read_run_meta(self.path, run)

    def read_bytes(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def open(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def generation(self, run: str) -> object:
        """The run directory's identity: a whole-run switch (``--replace``) changes it."""
        try:
            st = os.stat(run_dir(self.path, run))
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def run_meta_path(self, run: str) -> str:
        return str(run_dir(self.path, run) / RUN_META)


def open_root(root: str | Path, *, create: bool = False) -> LocalRoot | Root:
    """The root at ``root``: an ``ObjectRoot`` for a URL, else a ``LocalRoot`` (which must be a directory)."""
    if is_url(root):
        from runwatch.data.objstore import ObjectRoot

        return ObjectRoot(str(root), create=create)
    local = LocalRoot(root)
    if not create and not local.path.is_dir():
        raise ValueError(f"{root}: no such directory (expected a runwatch root)")
    return local


def run_of(path: str) -> str:
    """The run of a part's path ``.../run=<id>/segment=<k>/rank=<r>/<file>``."""
    return path.replace("\\", "/").split("/")[-4][len("run="):]


def segment_rank(path: str) -> tuple[int, int]:
    """(segment, rank) from a part's path ``.../segment=<k>/rank=<r>/<file>``."""
    parts = path.replace("\\", "/").split("/")
    return int(parts[-3].split("=", 1)[1]), int(parts[-2].split("=", 1)[1])
