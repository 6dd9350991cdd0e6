"""Importers: archived run logs -> the run record.

Each format is a module with ``parse(paths, *, skip_bad_lines) -> ParsedLog``
and ``sniff(head: str) -> bool``; ``FORMATS`` maps the CLI name to the module.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from runwatch.collectors.importers.base import ImportResult, LogFormatError, ParsedLog, write_import
from runwatch.data.storage import check_run_name

# CLI name -> module under runwatch.collectors.importers. Order matters for
# `auto`: the first format whose sniff() accepts the file's head wins.
FORMATS: dict[str, str] = {
    "megatron-golden": "megatron_golden",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "jsonl": "jsonl",
    "metaseq": "metaseq",
    "fairseq": "fairseq_text",
    "llmc": "llmc",
    "modded-nanogpt": "modded_nanogpt",
    "nanogpt": "nanogpt",
    "megatron": "megatron",
    "hf-trainer": "hf_trainer",
    "deepspeed": "deepspeed",
    "csv": "csv_log",
}


def get_format(name: str) -> ModuleType:
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; expected one of: auto, {', '.join(FORMATS)}")
    return importlib.import_module(f"runwatch.collectors.importers.{FORMATS[name]}")


def detect_format(path: str | Path) -> str:
    """The first format whose sniffer accepts the head of ``path``."""
    if Path(path).is_dir():  # a log directory: only TensorBoard logs come as one
        # Event files sit in the directory or one level down (one per run); don't walk a whole tree.
        if any(Path(path).glob("*tfevents*")) or any(Path(path).glob("*/*tfevents*")):
            return "tensorboard"
        raise ValueError(f"{path}: is a directory without TensorBoard event files; expected a log file")
    # Noisy stdout logs can print their first metric line megabytes in (argument
    # dumps, dataset builds): look at a short head first, then a longer one.
    for size in (256 * 1024, 16 * 1024 * 1024):
        with open(path, "rb") as f:
            head = f.read(size).decode("utf-8", errors="replace")
        for name in FORMATS:
            if get_format(name).sniff(head):
                return name
        if len(head) < size:
            break
    raise ValueError(f"{path}: could not detect the log format; pass one of: {', '.join(FORMATS)}")


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
    name = detect_format(paths[0]) if fmt == "auto" else fmt
    parsed = get_format(name).parse([Path(p) for p in paths], skip_bad_lines=skip_bad_lines)
    meta = {"source": f"import:{name}", "source_files": [str(Path(p).resolve()) for p in paths]}
    return write_import(root, run, parsed, replace=replace, meta=meta)


__all__ = ["FORMATS", "ImportResult", "LogFormatError", "ParsedLog", "detect_format", "get_format", "import_logs"]
