"""``Monitor``: the zero-sync collector a PyTorch training loop calls once per step.

Per step, tensor values (loss, grad norm, loss scale, found-inf, activation
norm, tensor extras) go into a device buffer (``StepBuffer``) with one fused
copy, following a ``StepPlan`` made once per kind of step, and host values
(step, wall time, tokens, Python numbers) into host rows; no value leaves
the device. Every ``flush_every_steps`` steps or
``flush_every_seconds`` seconds one non-blocking copy moves the buffer to host
memory and a background thread (``BackgroundWriter``) writes it as Parquet
under ``ROOT/run=<id>/segment=<k>/rank=<r>/``. Nothing raised in here reaches
the training loop: errors become one warning and a count (``num_errors``,
``num_dropped_rows``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import tempfile
import time
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from runwatch.collectors.buffer import StepBuffer
from runwatch.collectors.plan import FIELD_NAMES, StepPlan
from runwatch.collectors.rank_signals import Heartbeat, StepTimer, has_replicated_grads, param_checksum
from runwatch.collectors.signals import ScalerReader, fused_grad_norm, register_activation_hook
from runwatch.collectors.uploader import Uploader, UploaderConfig
from runwatch.collectors.writer import BackgroundWriter, EventsBatch, MetricsBatch, RunMetaUpdate
from runwatch.data.locks import PartitionClaim, claim_partition
from runwatch.data.roots import is_url
from runwatch.data.storage import check_run_name, run_dir

_USER_EVENT_KINDS = ("config", "note")
_MAX_PLANS = 256  # kinds of step remembered; names that change every step must not grow memory


@dataclass(kw_only=True, frozen=True)
class MonitorConfig:
    """How often ``Monitor`` flushes and how much it may hold."""

    flush_every_steps: int = 500
    """Flush the device buffer after this many steps (also its capacity in rows).

    Large, because the writer's cost per row falls with the batch (about 3x
    from 50 to 500 rows) and the store gets 10x fewer files; how stale the
    store may get is bounded by ``flush_every_seconds`` instead."""
    flush_every_seconds: float = 10.0
    """Also flush when this much wall time passed since the last flush (checked at each step)."""
    max_queue: int = 64
    """Flushed batches waiting for the writer; beyond this the oldest is dropped and counted."""
    compute_grad_norm: bool = True
    """When ``step`` gets no ``grad_norm``, compute one with a fused foreach pass over the model's grads."""
    pin_memory: bool = True
    """Copy CUDA buffers into pinned host memory (needed for a truly non-blocking copy)."""
    close_timeout_seconds: float = 60.0
    """How long ``close`` waits for the writer to drain before giving up with a warning."""
    time_forward: bool = True
    """Time each forward pass and the input wait before it (hooks on the model; wall clock on a CPU, CUDA
    events read at flush on a GPU): what ``straggler`` compares across ranks."""
    heartbeat_seconds: float = 10.0
    """How often the writer thread rewrites this rank's ``heartbeat.json`` (how far it got, that it lives):
    what names the rank that holds a hung job."""
    param_checksum_every: int = 0
    """Every N steps record ``param_norm``, the parameters' norm computed on the device (one fused pass), for
    ``rank_disagreement`` to compare across replicas; 0: off."""

    def __post_init__(self) -> None:
        if self.flush_every_steps < 1:
            raise ValueError(f"flush_every_steps must be >= 1, got {self.flush_every_steps}")
        if not self.flush_every_seconds > 0:
            raise ValueError(f"flush_every_seconds must be > 0, got {self.flush_every_seconds}")
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {self.max_queue}")
        if not self.close_timeout_seconds > 0:
            raise ValueError(f"close_timeout_seconds must be > 0, got {self.close_timeout_seconds}")
        if not self.heartbeat_seconds > 0:
            raise ValueError(f"heartbeat_seconds must be > 0, got {self.heartbeat_seconds}")
        if self.param_checksum_every < 0:
            raise ValueError(f"param_checksum_every must be >= 0, got {self.param_checksum_every}")


def detect_rank() -> tuple[int, int]:
    """(rank, world size): from torch.distributed when initialised, else RANK/WORLD_SIZE, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError as err:
        raise ValueError(f"RANK/WORLD_SIZE must be integers: {err}") from err


def next_segment(root: str | Path, run: str, rank: int) -> int:
    """The next free segment number of ``run`` for ``rank``: 0 for a new run."""
    used = [
        int(p.parent.name.split("=", 1)[1])
        for p in run_dir(root, run).glob(f"segment=*/rank={rank}")
        if p.parent.name.split("=", 1)[1].isdigit()
    ]
    return max(used) + 1 if used else 0


def claim_segment(root: str | Path, run: str, rank: int) -> tuple[PartitionClaim | None, str | None]:
    """Claim the rank's next free segment (its directory, created atomically). Never raises.

    Returns the claim, or None when the root cannot be written (the writer
    reports that on its first flush), and a warning when another live writer
    records the same run and rank: this one then writes the next segment
    instead of interleaving rows with it.
    """
    try:
        claim = claim_partition(root, run, rank, next_segment(root, run, rank))
    except OSError:
        return None, None
    if not claim.others:
        return claim, None
    return claim, (f"another live writer records run {run!r} rank {rank} ({claim.others[-1].describe()}); "
                   f"this monitor writes segment {claim.segment} of its own")


def default_spool(remote: str, spool: str | Path | None) -> Path:
    """The local spool of a Monitor writing to ``remote``: ``spool``, else one per URL under the temp directory."""
    if spool is not None:
        return Path(spool)
    digest = hashlib.sha256(remote.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"runwatch-spool-{os.getuid()}" / digest


def _path_bytes(path: Path) -> int | None:
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():  # sharded checkpoints are directories
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return None


class Monitor:
    """Records one rank of a training run; see the module docstring.

    Every (re)start is a new segment (the next free number for this run and
    rank). With ``resume_step`` it also records a ``resume`` event: from which
    checkpoint, the batches skipped and the config changes. ``root`` may be an
    object-store URL (``s3://bucket/prefix``): the parts are written into the
    local ``spool`` directory first and shipped by a background uploader
    (``uploader.py``, configured by ``upload``); the training loop never waits
    on the network.
    """

    def __init__(
        self,
        root: str | Path,
        run: str,
        *,
        model: nn.Module | None = None,
        scaler: torch.amp.GradScaler | None = None,
        activation_module: nn.Module | None = None,
        config: MonitorConfig | None = None,
        rank: int | None = None,
        resume_step: int | None = None,
        resume_checkpoint: str | Path | None = None,
        skip_batches: tuple[int, int] | None = None,
        config_changes: Mapping[str, Any] | None = None,
        precision: str | None = None,
        meta: Mapping[str, Any] | None = None,
        spool: str | Path | None = None,
        upload: UploaderConfig | None = None,
        replicated_grads: bool | None = None,
    ) -> None:
        # An object-store root: write into a local spool as usual; an uploader ships it (uploader.py).
        self.remote = str(root) if is_url(root) else None
        self.root = Path(root) if self.remote is None else default_spool(self.remote, spool)
        self.run = check_run_name(run)
        self.config = config or MonitorConfig()
        if skip_batches is not None and len(skip_batches) != 2:
            raise ValueError(f"skip_batches must be (first, last), got {skip_batches!r}")
        detected_rank, self.world_size = detect_rank()
        self.rank = detected_rank if rank is None else rank
        claim, claim_warning = claim_segment(self.root, self.run, self.rank)
        self.segment = claim.segment if claim is not None else next_segment(self.root, self.run, self.rank)
        self._params = list(model.parameters()) if model is not None else []
        device = self._params[0].device if self._params else None
        self._scaler = ScalerReader(scaler) if scaler is not None else None
        self._activation: torch.Tensor | None = None
        self._plans: dict[tuple, StepPlan] = {}
        self._hook = None
        self._num_errors = 0
        self._num_dropped_rows = 0
        self._warned = False
        self._closed = False
        self._last_flush = time.monotonic()
        self._heartbeat = Heartbeat(self.root, self.run, self.segment, self.rank, self.config.heartbeat_seconds)
        # Without a claim nothing of this Monitor is written, its heartbeat included (the partition is not its own).
        self._writer = BackgroundWriter(self.root, max_queue=self.config.max_queue, claim=claim,
                                        heartbeat=self._heartbeat if claim is not None else None)
        if claim_warning is not None or claim is None:
            self._num_errors += 1  # without a claim the writer's first failed flush says why
        if claim_warning is not None:
            warnings.warn(f"runwatch: {claim_warning}", RuntimeWarning, stacklevel=2)
        self._uploader = Uploader(self.remote, self.root, self.run, self.rank, claim.directory, upload) \
            if self.remote is not None and claim is not None else None
        self._pending = _Pending(self.run, self.segment, self.rank, self._writer, self._uploader)
        if device is not None:
            self._pending.buffer = self._new_buffer(device)
        if activation_module is not None:
            self._hook = register_activation_hook(activation_module, self._on_activation, self._hook_error)
        self._timer = None
        if model is not None and self.config.time_forward:
            inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
            self._timer = StepTimer(model, inner, self._hook_error, self._heartbeat)
        self._pending.give_back = self._timer.give_back if self._timer is not None else None
        # Every rank registers its host for this segment; rank 0 writes the run's metadata too.
        registration = {"hosts": {str(self.segment): {str(self.rank): socket.gethostname()}}}
        if self.rank == 0:
            registration.update(self._run_meta(model, scaler, precision, meta),
                                replicated_grads=has_replicated_grads(model, replicated_grads))
        self._writer.submit(RunMetaUpdate(self.run, registration))
        if resume_step is not None:
            self._submit_events([{
                "event": "resume", "step": int(resume_step), "time": time.time(), "segment": self.segment,
                "checkpoint": None if resume_checkpoint is None else str(resume_checkpoint),
                "skip_batches": None if skip_batches is None else [int(b) for b in skip_batches],
                "config_changes": dict(config_changes or {}),
            }])
        # A monitor that is never closed still hands over its last rows when it is
        # collected or at interpreter exit; the finalizer holds the state, not the monitor.
        self._finalizer = weakref.finalize(self, _finish, self._pending, self.config.close_timeout_seconds)

    # -- counters -------------------------------------------------------------------

    @property
    def num_errors(self) -> int:
        """Errors so far: bad values, failed writes, dropped batches (the writer's and ours)."""
        return self._num_errors + self._writer.num_errors

    @property
    def num_dropped_rows(self) -> int:
        """Rows that will never reach the store (failed or dropped writes, rejected steps, a full spool)."""
        shipped = self._uploader.num_dropped_rows if self._uploader is not None else 0
        return self._num_dropped_rows + self._writer.num_dropped_rows + shipped

    @property
    def num_uploaded_parts(self) -> int:
        """Parts shipped from the spool to the object-store root (0 for a local root)."""
        return self._uploader.num_uploaded_parts if self._uploader is not None else 0

    @property
    def num_dropped_parts(self) -> int:
        """Metrics parts dropped because the spool outgrew ``UploaderConfig.max_spool_bytes`` in an outage."""
        return self._uploader.num_dropped_parts if self._uploader is not None else 0

    @property
    def num_written_rows(self) -> int:
        return self._writer.num_written_rows

    def _fail(self, what: str, err: BaseException, num_rows: int = 0) -> None:
        self._num_errors += 1
        self._num_dropped_rows += num_rows
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"runwatch: {what} failed: {type(err).__name__}: {err} (training continues; further errors are only "
                "counted in Monitor.num_errors)", RuntimeWarning, stacklevel=3,
            )

    def _hook_error(self, err: Exception) -> None:
        self._fail("activation hook", err)

    def _on_activation(self, rms: torch.Tensor) -> None:
        """Called by the forward hook with the final layer's activation RMS (a device tensor)."""
        self._activation = rms

    # -- the hot path -----------------------------------------------------------------

    def step(self, step: int, *, loss: Any = None, grad_norm: Any = None, lr: Any = None,
             tokens: Any = None, samples: Any = None, **extra: Any) -> None:
        """Record one optimizer step. Tensors stay on the device; no host-device sync.

        Values may be 1-element tensors or Python numbers; ``step`` must be a
        Python int. ``extra`` holds any further named scalars. NaN and Inf are
        recorded as they are. All of the step's tensors go into the device
        buffer in one fused copy. Never raises.
        """
        if self._closed:
            self._fail("Monitor.step after close()", RuntimeError("the monitor is closed"), 1)
            return
        try:
            self._record(step, (loss, grad_norm, lr, tokens, samples), extra)
            if len(self._pending.host_rows) >= self.config.flush_every_steps or (
                time.monotonic() - self._last_flush >= self.config.flush_every_seconds
            ):
                self.flush()
        except Exception as err:
            self._fail("Monitor.step", err, 1)

    def _record(self, step: int, given: tuple[Any, ...], extra: dict[str, Any]) -> None:
        if isinstance(step, torch.Tensor) or not isinstance(step, (int, np.integer)):
            raise TypeError(f"step must be a Python int, got {type(step).__name__}")  # int(tensor) would sync
        if given[1] is None and self._params and self.config.compute_grad_norm:
            given = (given[0], fused_grad_norm(self._params), *given[2:])
        act, self._activation = self._activation, None
        scale = found_inf = lag_start = None
        if self._scaler is not None:
            scale, found_inf, lag_start = self._scaler.read()
        every = self.config.param_checksum_every
        if every and step % every == 0 and self._params:
            extra = {**extra, "param_norm": param_checksum(self._params)}
        values = (*given, act, scale, found_inf, *extra.values())
        # The kind of step (which fields are tensors, numbers or absent) picks a plan made once;
        # per step there is no per-field work in Python, and one device copy for all tensors.
        plan = self._plans.get((tuple(map(type, values)), tuple(extra), lag_start is not None))
        if plan is None:
            plan = self._new_plan(values, extra, lag_start is not None)
        for err in plan.errors:
            self._fail("Monitor.step", err)
        pending = self._pending
        buffer = pending.buffer
        tensors = plan.pick_device(values)
        if tensors and buffer is None:
            buffer = pending.buffer = self._new_buffer(tensors[0].device)
            for _ in pending.host_rows:  # a buffer made mid-flush: an empty row per earlier row
                buffer.put(buffer.layout(()), ())
        if buffer is not None:  # every step takes a buffer row: rows stay aligned
            if plan.layout is None:
                plan.layout = buffer.layout(plan.device_names, plan.lagged)
            try:
                buffer.put(plan.layout, tensors, lag_start)
            except RuntimeError:  # shapes or devices the fused copy cannot take: check field by field
                self._put_checked(buffer, plan, tensors, lag_start)
        host = dict(zip(plan.host_names, plan.pick_host(values)))
        host["step"], host["time"] = int(step), time.time()
        if self._timer is not None:
            timed, pairs = self._timer.take(int(step))
            host.update(timed)
            if pairs:
                pending.timings.append((len(pending.host_rows), pairs))
        self._heartbeat.mark(int(step), "step")
        pending.host_rows.append(host)

    def _new_plan(self, values: tuple[Any, ...], extra: dict[str, Any], lagged: bool) -> StepPlan:
        if len(self._plans) >= _MAX_PLANS:  # names that change every step: keep memory bounded
            self._plans.clear()
        types, names = tuple(map(type, values)), tuple(extra)
        plan = self._plans[(types, names, lagged)] = StepPlan.make(FIELD_NAMES + names, types,
                                                                   lagged="loss_scale" if lagged else None)
        return plan

    def _put_checked(self, buffer: StepBuffer, plan: StepPlan, tensors: tuple[torch.Tensor, ...],
                     lag_start: torch.Tensor | float | None) -> None:
        """The slow path: each tensor checked (one element), reshaped and moved to the buffer's device."""
        names, checked = [], []
        for name, value in zip(plan.device_names, tensors):
            if value.numel() != 1:
                self._fail("Monitor.step", ValueError(f"{name}: expected a 1-element tensor, got shape "
                                                      f"{tuple(value.shape)}"))
            else:
                names.append(name)
                checked.append(value.detach().reshape(()).to(buffer.device, non_blocking=True))
        lagged = plan.lagged if plan.lagged in names else None
        buffer.put(buffer.layout(tuple(names), lagged), checked, lag_start)

    def _new_buffer(self, device: torch.device) -> StepBuffer:
        return StepBuffer(device, self.config.flush_every_steps, pin_memory=self.config.pin_memory)

    def flush(self) -> None:
        """Hand the buffered steps to the writer: one non-blocking device-to-host copy. Never raises."""
        self._last_flush = time.monotonic()
        num_rows = len(self._pending.host_rows)
        try:
            self._pending.hand_over()
            if num_rows and not self._writer.alive:
                raise RuntimeError("the writer thread is not running")
        except Exception as err:
            self._fail("flushing to the writer", err, num_rows)

    # -- events -----------------------------------------------------------------------

    def checkpoint(self, step: int, path: str | Path, *, bytes: int | None = None,
                   write_seconds: float | None = None, **payload: Any) -> None:
        """Called after a checkpoint save completed. ``bytes=None`` stats ``path`` when it exists. Never raises."""
        try:
            size = bytes if bytes is not None else _path_bytes(Path(path))
            self._submit_events([{"event": "checkpoint", "step": int(step), "time": time.time(), "path": str(path),
                                  "bytes": size, "write_seconds": write_seconds, **payload}])
        except Exception as err:
            self._fail("Monitor.checkpoint", err)

    def event(self, kind: str, step: int, **payload: Any) -> None:
        """Record a ``config`` change (lr, clip, precision) or a ``note``. Never raises."""
        try:
            if kind not in _USER_EVENT_KINDS:
                raise ValueError(f"event kind must be one of {', '.join(_USER_EVENT_KINDS)}, got {kind!r}")
            self._submit_events([{"event": kind, "step": int(step), "time": time.time(), **payload}])
        except Exception as err:
            self._fail("Monitor.event", err)

    def _submit_events(self, events: list[dict[str, Any]]) -> None:
        # Flush first so that on disk the rows up to an event are never newer than the event.
        self.flush()
        self._writer.submit(EventsBatch(self.run, self.segment, self.rank, events))

    def _run_meta(self, model: nn.Module | None, scaler: torch.amp.GradScaler | None,
                  precision: str | None, meta: Mapping[str, Any] | None) -> dict[str, Any]:
        dtype = str(self._params[0].dtype).removeprefix("torch.") if self._params else None
        scaled = self._scaler is not None and self._scaler.enabled
        return {
            "precision": precision or (f"{dtype}+GradScaler" if scaled else dtype),
            "world_size": self.world_size,
            "monitor": dataclasses.asdict(self.config),
            "model": type(model).__name__ if model is not None else None,
            "num_parameters": sum(p.numel() for p in self._params) if self._params else None,
            "host": socket.gethostname(),
            "torch_version": torch.__version__,
            "finished": False,  # a (re)started run is live until close(): only a live run can stall
            **({"scaler": self._scaler.settings()} if scaled else {}),
            **dict(meta or {}),
        }

    # -- lifecycle --------------------------------------------------------------------

    def close(self, *, finished: bool = True) -> None:
        """Flush, drain the writer and join it; idempotent. Never raises.

        ``finished=False`` (training stopped by an exception) keeps the run
        live, so that a run which does not come back is called stalled.
        """
        if self._closed:
            return
        self.flush()
        if self.rank == 0 and finished:
            self._writer.submit(RunMetaUpdate(self.run, {"finished": True, "finished_time": time.time()}))
        self._closed = True
        # Only a finished run's last heartbeat says "closed" (ended on purpose): one stopped by an exception keeps
        # its last phase, so that, silent, it is called stalled (a review: close(finished=False) read HEALTHY forever).
        self._heartbeat.closed = finished
        if self._hook is not None:
            self._hook.remove()
        if self._timer is not None:
            self._timer.remove()
        self._finalizer.detach()
        if not self._writer.close(self.config.close_timeout_seconds):
            self._fail("closing the writer", TimeoutError(
                f"not drained after {self.config.close_timeout_seconds} s; unwritten rows are lost"))
        if self._uploader is not None:
            self._uploader.close(self.config.close_timeout_seconds)  # what it cannot ship stays in the spool

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



@dataclass
class _Pending:
    """What a monitor has not handed to its writer yet: host rows and the device buffer."""

    run: str
    segment: int
    rank: int
    writer: BackgroundWriter
    uploader: Uploader | None = None
    buffer: StepBuffer | None = None
    host_rows: list[dict[str, Any]] = field(default_factory=list)
    timings: list[tuple[int, list]] = field(default_factory=list)  # GPU forward events, read by the writer
    give_back: Any = None

    def hand_over(self) -> None:
        """Submit the pending rows as one batch (one non-blocking device-to-host copy)."""
        rows, self.host_rows = self.host_rows, []
        timings, self.timings = self.timings, []
        if rows:
            names, values, present, ready = self.buffer.drain() if self.buffer is not None else ([], None, None, None)
            self.writer.submit(MetricsBatch(self.run, self.segment, self.rank, rows, names, values, present, ready,
                                            timings, self.give_back))


def _finish(pending: _Pending, timeout: float) -> None:
    """Finalizer of a monitor never closed: hand over its last rows and drain the writer."""
    try:
        pending.hand_over()
    except Exception as err:  # at exit there is nobody left to raise to
        warnings.warn(f"runwatch: the last rows of run {pending.run!r} were lost: {err}", RuntimeWarning, stacklevel=1)
    pending.writer.close(timeout)
    if pending.uploader is not None:
        pending.uploader.close(timeout)
