"""What one rank records so the ranks can be compared afterwards, with no collective and no per-step sync.

- ``StepTimer``: forward pre- and post-hooks time each rank's forward pass
  (the part of a step with no collective in it) and the input wait before
  it (from the previous ``Monitor.step`` to the next forward). Wall clock on
  a CPU; on a GPU two CUDA events per forward, recorded on the stream and
  read by the writer thread after the flush's copy completed, never on the
  training thread.
- ``Heartbeat``: how far the rank got (last step; inside or past the next
  forward pass) as host values set by the hooks, written to
  ``heartbeat.json`` by the writer thread every few seconds, so a hang can be
  pinned on the rank that is behind or whose process stopped beating.
- ``param_checksum``: the parameters' global norm, computed on the device
  every N steps and read at flush: replicas must hold identical values.
- ``has_replicated_grads``: plain DDP replicates gradients; FSDP, ZeRO and
  tensor parallelism do not.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runwatch.data.storage import HEARTBEAT, partition_dir, write_bytes_atomic


def has_replicated_grads(model: nn.Module | None, declared: bool | None) -> bool:
    """Whether every data-parallel rank holds the same gradients after the all-reduce: as declared, else
    True for ``DistributedDataParallel`` (FSDP, DeepSpeed ZeRO and tensor-parallel models are not)."""
    if declared is not None:
        return bool(declared)
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


def param_checksum(params: list[torch.Tensor]) -> torch.Tensor | None:
    """The global L2 norm of the parameters as a 0-dim device tensor (no sync); replicas agree bit for bit."""
    if not params:
        return None
    with torch.no_grad():
        norms = torch._foreach_norm([p.detach() for p in params], 2.0)
        return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device, torch.float64) for n in norms]), 2.0)


class Heartbeat:
    """A rank's progress (host values only) and the file the writer thread rewrites from it."""

    def __init__(self, root: str | Path, run: str, segment: int, rank: int, every_s: float) -> None:
        self.path = partition_dir(root, run, segment, rank) / HEARTBEAT
        self.every_s = every_s
        self.ident = {"run": run, "segment": segment, "rank": rank, "host": socket.gethostname(), "pid": os.getpid()}
        # One tuple, swapped whole by the training thread: the writer never reads a half-updated progress.
        self.progress: tuple[int | None, str, float] = (None, "start", time.time())
        self.closed = False

    def mark(self, step: int | None, phase: str) -> None:
        """Called on the training thread (hooks, ``Monitor.step``): a few hundred nanoseconds."""
        self.progress = (step, phase, time.time())

    def write(self) -> None:
        """Called on the writer thread: the whole file, renamed into place."""
        step, phase, at = self.progress
        beat = {**self.ident, "time": time.time(), "every_s": self.every_s, "step": step,
                "phase": "closed" if self.closed else phase, "phase_time": at}
        write_bytes_atomic(json.dumps(beat).encode(), self.path)


class StepTimer:
    """Times the forward pass and the input wait of every training step of one rank (see the module docstring).

    ``outer`` is the module the loop calls (a DDP wrapper, whose forward may start with a buffer broadcast);
    ``inner`` the model inside it, whose forward has no collective. Evaluation forwards (``eval()`` mode)
    are not counted. With gradient accumulation a step's forward time is the sum over its micro-batches.
    """

    def __init__(self, outer: nn.Module, inner: nn.Module, on_error: Callable[[Exception], None],
                 heartbeat: Heartbeat | None = None) -> None:
        param = next(inner.parameters(), None)
        self.cuda = param is not None and param.device.type == "cuda"
        self.on_error, self.heartbeat = on_error, heartbeat
        self.last_step_at: float | None = None
        self.last_step: int | None = None
        self._data: float | None = None
        self._forward = 0.0
        self._start: float | Any = None
        self._depth = 0  # forwards of ``inner`` under way: a nested call is part of the outermost one
        self._pairs: list[tuple[Any, Any]] = []
        self._free: list[Any] = []  # CUDA events handed back by the writer, reused
        disable = getattr(torch.compiler, "disable", lambda f: f)  # keep the hooks out of a compiled graph
        self._handles = [outer.register_forward_pre_hook(disable(self._outer_pre)),
                         inner.register_forward_pre_hook(disable(self._inner_pre)),
                         inner.register_forward_hook(disable(self._inner_post))]

    def _event(self) -> Any:
        return self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)

    def _outer_pre(self, module: nn.Module, args: object) -> None:
        try:
            if not module.training:
                return
            if self._data is None and self.last_step_at is not None:
                self._data = time.perf_counter() - self.last_step_at
            if self.heartbeat is not None:
                # The rank has its input: from here on it may wait for others (DDP's buffer broadcast), not they for it.
                self.heartbeat.mark(self.last_step, "forward")
        except Exception as err:  # the observer never kills the patient
            self.on_error(err)

    def _inner_pre(self, module: nn.Module, args: object) -> None:
        try:
            if not module.training:
                return
            self._depth += 1
            if self._depth > 1:
                # A call inside the forward (Lightning runs ``training_step`` through the module's ``__call__``,
                # and it calls ``self(x)``): the time is the outermost call's, from its start.
                return
            if self.cuda:
                self._start = self._event()
                self._start.record()  # enqueued on the stream: no sync
            else:
                self._start = time.perf_counter()
        except Exception as err:
            self.on_error(err)

    def _inner_post(self, module: nn.Module, args: object, output: object) -> None:
        try:
            if not module.training or self._depth == 0:
                return
            self._depth -= 1
            if self._depth > 0 or self._start is None:
                return
            if self.cuda:
                end = self._event()
                end.record()
                self._pairs.append((self._start, end))
            else:
                self._forward += time.perf_counter() - self._start
            self._start = None
            if self.heartbeat is not None:
                self.heartbeat.mark(self.last_step, "backward")
        except Exception as err:
            self.on_error(err)

    def take(self, step: int) -> tuple[dict[str, float], list[tuple[Any, Any]]]:
        """At ``Monitor.step``: this step's host timings (seconds) and, on a GPU, its event pairs to read later."""
        host: dict[str, float] = {}
        if self._data is not None:
            host["data_time"] = self._data
        pairs, self._pairs = self._pairs, []
        if not self.cuda and self._forward > 0:
            host["forward_time"] = self._forward
        # A forward that raised never ran its post-hook: each step starts from no forward under way.
        self._data, self._forward, self._start, self._depth = None, 0.0, None, 0
        self.last_step_at, self.last_step = time.perf_counter(), step
        return host, pairs

    def give_back(self, pairs: list[tuple[Any, Any]]) -> None:
        """Events the writer has read, for reuse (list.extend is atomic under the GIL)."""
        self._free.extend(e for pair in pairs for e in pair)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def read_forward_seconds(pairs: list[tuple[Any, Any]]) -> float | None:
    """On the writer thread: the summed elapsed time of a step's (start, end) CUDA events, in seconds.

    ``end.synchronize()`` waits for that event only (the flush's copy was recorded after it, so it is done).
    """
    if not pairs:
        return None
    total = 0.0
    for start, end in pairs:
        end.synchronize()
        total += start.elapsed_time(end) / 1000.0
    return total
