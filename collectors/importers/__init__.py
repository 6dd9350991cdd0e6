"""Importers: archived run logs -> the run record.

Each format is a module with ``parse(paths, *, skip_bad_lines) -> ParsedLog``
and ``sniff(head: str) -> bool``; ``FORMATS`` maps the CLI name to the module.
``auto`` reads a file with every format that recognises it and joins the
readings (``importers.auto``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from runwatch.collectors.importers import auto
from runwatch.collectors.importers.base import (
    ImportResult,
    LogFormatError,
    ParsedLog,
    write_import,
    write_import_stream,
)
from runwatch.collectors.importers.formats import FORMATS, get_format, sniff_formats
from runwatch.collectors.importers.textlog import IMPORT_NOTES
from runwatch.data.storage import check_run_name


def detect_format(path: str | Path) -> str:
    """The name of the reading ``auto`` takes for ``path``: a format, or formats joined by ``+``."""
    names = sniff_formats(path)
    return names[0] if len(names) == 1 else auto.read([Path(path)])[0]


def import_logs(fmt: str, paths: list[str | Path], root: str | Path, run: str, *,
                skip_bad_lines: bool = False, replace: bool = False) -> ImportResult:
    """Parse ``paths`` as ``fmt`` (or ``auto``) and land them as run ``run`` under ``root``."""
    check_run_name(run)  # fail before parsing a large file
    if not paths:
        raise ValueError("no input files given")
    for p in paths:
        if not Path(p).exists():
            raise ValueError(f"{p}: no such file")
        if Path(p).is_dir() and fmt not in ("tensorboard", "auto"):
            raise ValueError(f"{p}: is a directory; expected a log file")
    if Path(root).exists() and not Path(root).is_dir():
        raise ValueError(f"--root {root}: not a directory")
    files = [Path(p) for p in paths]
    names = sniff_formats(files[0]) if fmt == "auto" else [fmt]
    module = get_format(names[0]) if len(names) == 1 else None
    meta = {"source": f"import:{names[0]}", "source_files": [str(p.resolve()) for p in files]}

    def chunks() -> Iterator[ParsedLog]:  # parsed only once the run's lock is held
        try:
            if module is not None and hasattr(module, "parse_chunks"):  # streamed: memory bounded by a block
                yield from module.parse_chunks(files, skip_bad_lines=skip_bad_lines)
            elif module is not None and fmt != "auto":
                yield module.parse(files, skip_bad_lines=skip_bad_lines)
            else:
                name, parsed = auto.read(files, skip_bad_lines=skip_bad_lines)
                meta["source"] = f"import:{name}"  # the run's metadata is written after the last chunk
                yield parsed
        except (ArithmeticError, RecursionError) as err:  # a parser's own guard missed it: still name the input
            raise ValueError(f"{', '.join(map(str, files))}: a value cannot be read ({type(err).__name__}: {err})") \
                from err

    notes = IMPORT_NOTES.set([])
    try:
        result = write_import_stream(root, run, chunks(), replace=replace, meta=meta,
                                     source=", ".join(str(p) for p in files))
        return dataclasses.replace(result, format=meta["source"].removeprefix("import:"),
                                   notes=tuple(IMPORT_NOTES.get()))
    finally:
        IMPORT_NOTES.reset(notes)


__all__ = ["FORMATS", "ImportResult", "LogFormatError", "ParsedLog", "detect_format", "get_format", "import_logs",
           "sniff_formats", "write_import", "write_import_stream"]
