"""Importers: archived run logs -> the run record.

Each format is a module with ``parse(paths, *, skip_bad_lines) -> ParsedLog``
and ``sniff(head: str) -> bool``; ``FORMATS`` maps the CLI name to the module.
``auto`` reads a file with every format that recognises it and joins the
readings (``importers.auto``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runwatch.collectors.importers import auto
from runwatch.collectors.importers.base import ImportResult, LogFormatError, ParsedLog, write_import
from runwatch.collectors.importers.formats import FORMATS, get_format, sniff_formats
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
    if fmt == "auto":
        name, parsed = auto.read([Path(p) for p in paths], skip_bad_lines=skip_bad_lines)
    else:
        name, parsed = fmt, get_format(fmt).parse([Path(p) for p in paths], skip_bad_lines=skip_bad_lines)
    meta = {"source": f"import:{name}", "source_files": [str(Path(p).resolve()) for p in paths]}
    if parsed.num_ignored:
        meta["ignored_lines"] = parsed.num_ignored
    result = write_import(root, run, parsed, replace=replace, meta=meta)
    return dataclasses.replace(result, format=name)


__all__ = ["FORMATS", "ImportResult", "LogFormatError", "ParsedLog", "detect_format", "get_format", "import_logs",
           "sniff_formats"]
