"""The importer formats: CLI name -> module, and the sniff of a file's head.

Each format is a module with ``parse(paths, *, skip_bad_lines) -> ParsedLog``
and ``sniff(head: str) -> bool``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

# CLI name -> module under runwatch.collectors.importers. For `auto`, the order
# breaks ties between readings that keep the same signal (see importers.auto).
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
# Heads a sniffer looks at: a short one, then, for a longer file, a long one
# (noisy stdouts can print one tool's first line megabytes in).
HEAD_SIZES = (256 * 1024, 16 * 1024 * 1024)


def get_format(name: str) -> ModuleType:
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; expected one of: auto, {', '.join(FORMATS)}")
    return importlib.import_module(f"runwatch.collectors.importers.{FORMATS[name]}")


def sniff_formats(path: str | Path) -> list[str]:
    """Every format whose sniffer accepts the head of ``path`` (either head), in ``FORMATS`` order."""
    path = Path(path)
    if path.is_dir():  # a log directory: only TensorBoard logs come as one
        # Event files sit in the directory or one level down (one per run); don't walk a whole tree.
        if any(path.glob("*tfevents*")) or any(path.glob("*/*tfevents*")):
            return ["tensorboard"]
        raise ValueError(f"{path}: is a directory without TensorBoard event files; expected a log file")
    accepted: set[str] = set()
    size = path.stat().st_size
    for head_size in HEAD_SIZES:
        with open(path, "rb") as f:
            head = f.read(head_size).decode("utf-8", errors="replace")
        accepted |= {name for name in FORMATS if name not in accepted and get_format(name).sniff(head)}
        if size <= head_size:
            break
    if not accepted:
        raise ValueError(f"{path}: could not detect the log format; pass one of: {', '.join(FORMATS)}")
    return [name for name in FORMATS if name in accepted]
