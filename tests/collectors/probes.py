"""Test probes for the hot path: host-device syncs and device operations, counted for real.

``SyncCounter`` wraps the tensor methods that force a sync (``.item()``,
``float(t)``, ``bool(t)``, ...) and ``GradScaler.get_scale``; with
``only_from`` it counts only calls whose nearest caller outside torch lives
under that directory, so a whole Lightning or Hugging Face run can be
watched and only runwatch's own syncs counted (the framework's are its
business). ``OpCounter`` records every aten operation dispatched while it is
active.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import runwatch.collectors

RUNWATCH_DIR = Path(runwatch.collectors.__file__).resolve().parent
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


def _caller_dir(depth: int) -> str:
    """File of the nearest frame outside torch, ``depth`` frames above the caller."""
    frame = sys._getframe(depth + 1)
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    return "" if frame is None else str(Path(frame.f_code.co_filename).resolve())


class SyncCounter:
    """Counts, on the calling thread only, the calls that force a host-device sync."""

    NAMES = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")

    def __init__(self, only_from: Path | None = None) -> None:
        self.calls: list[str] = []
        self.num_other = 0  # syncs seen but made by someone else (with only_from)
        self._only = None if only_from is None else str(only_from.resolve())
        self._thread = threading.get_ident()
        self._saved: list[tuple[type, str, object]] = []

    def _wrap(self, owner: type, name: str) -> None:
        original = getattr(owner, name)
        counter = self

        def counted(*args: object, **kw: object) -> object:
            if threading.get_ident() == counter._thread:
                if counter._only is None or _caller_dir(1).startswith(counter._only):
                    counter.calls.append(name)
                else:
                    counter.num_other += 1
            return original(*args, **kw)

        self._saved.append((owner, name, original))
        setattr(owner, name, counted)

    def __enter__(self) -> "SyncCounter":
        for name in self.NAMES:
            self._wrap(torch.Tensor, name)
        self._wrap(torch.amp.GradScaler, "get_scale")
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)


class OpCounter(TorchDispatchMode):
    """The aten operations dispatched while active, by name (``aten._foreach_copy_.default``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))
