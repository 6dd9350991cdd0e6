"""TensorBoard event files, read with the tensorboard package's own loader (no TensorFlow).

Scalars become rows keyed by step: common tags map to the record
(``train/loss``, ``loss``, ``lm loss`` -> loss; ``grad_norm``, ``grad-norm`` ->
grad_norm; ``lr``, ``learning-rate`` -> lr; ``loss_scale``, ``loss-scale`` ->
loss_scale; ``iteration-time`` -> step_time; validation tags such as
``val/loss`` or ``lm loss validation`` -> ``val_loss``); every other scalar tag
becomes an extra with a sanitised name. ``time`` is the event's wall time.
TensorBoard itself purges steps that go backwards after a restart; here a
step going backwards, a step logged again, a ``SessionLog.START`` or a new
event file starts a new segment, so the abandoned branch stays visible.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import merge_same_step, sanitize_name
from runwatch.data.record import metrics_table

TAGS = {
    "loss": "loss", "train/loss": "loss", "train_loss": "loss", "training/loss": "loss", "lm loss": "loss",
    "lm-loss": "loss", "train/lm_loss": "loss", "train/lm loss": "loss", "loss/train": "loss",
    "grad_norm": "grad_norm", "grad-norm": "grad_norm", "grad norm": "grad_norm", "gnorm": "grad_norm",
    "train/grad_norm": "grad_norm", "train/gnorm": "grad_norm",
    "lr": "lr", "learning_rate": "lr", "learning-rate": "lr", "train/lr": "lr", "train/learning_rate": "lr",
    "loss_scale": "loss_scale", "loss-scale": "loss_scale", "train/loss_scale": "loss_scale",
    "act_norm": "act_norm", "actv_norm": "act_norm", "train/act_norm": "act_norm",
    "iteration-time": "step_time", "iteration_time": "step_time", "step_time": "step_time",
}
_VAL = re.compile(r"^(?:val|valid|validation|eval)[/_ -](.+)$|^(.+?)[/_ -](?:val|valid|validation)$")
_START = 1  # SessionLog.START


def sniff(head: str) -> bool:
    """True for an event file: its first record is the ``brain.Event:N`` file-version event."""
    return "brain.Event:" in head[:256]


def column_for(tag: str) -> str:
    key = tag.strip().lower()
    if key in TAGS:
        return TAGS[key]
    m = _VAL.match(key)
    if m:
        inner = (m.group(1) or m.group(2)).strip()
        return "val_loss" if TAGS.get(inner) == "loss" else sanitize_name(inner, "val_")
    return sanitize_name(key)


def _count_records(data: bytes) -> int:
    """TFRecord framing: u64 length, u32 crc, payload, u32 crc. A torn last record is a live writer's tail."""
    pos = num = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        if pos + 12 + length + 4 > len(data):
            break
        pos += 12 + length + 4
        num += 1
    return num


def _events(path: Path) -> Iterator[object]:
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError as err:
        raise ImportError("reading TensorBoard event files needs tensorboard: pip install 'runwatch[tensorboard]'") from err
    data = path.read_bytes()
    expected = _count_records(data)
    num = 0
    for event in EventFileLoader(str(path)).Load():
        num += 1
        yield event
    if num < expected or (data and num == 0):
        raise LogFormatError(path, num + 1, f"expected a valid TensorBoard event record (record {num + 1} is corrupt)")


def _scalar(value: object) -> float | None:
    from tensorboard.util import tensor_util

    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":
        arr = tensor_util.make_ndarray(value.tensor)
        if arr.size == 1 and arr.dtype.kind in "fiub":
            return float(arr.reshape(()))
    return None


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    rows: list[dict] = []
    breaks: set[int] = set()
    current: dict | None = None
    num_skipped = 0
    try:
        for event in _events(path):
            what = event.WhichOneof("what")
            if what == "session_log" and event.session_log.status == _START and rows:
                breaks.add(len(rows) + (current is not None))
                continue
            if what != "summary":
                continue
            for value in event.summary.value:
                x = _scalar(value)
                if x is None:
                    continue
                name = column_for(value.tag)
                if current is None or current["step"] != event.step or name in current:
                    if current is not None:
                        rows.append(current)
                    current = {"step": int(event.step), "time": float(event.wall_time)}
                current[name] = x
    except LogFormatError:
        if not skip_bad_lines:
            raise
        num_skipped += 1
    if current is not None:
        rows.append(current)
    if not rows:
        raise LogFormatError(path, None, f"no scalar summaries found in TensorBoard event file {path}")
    return merge_same_step(ParsedLog(metrics_table(rows), breaks=breaks, num_skipped=num_skipped))


def _expand(paths: Sequence[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.glob("**/events.out.tfevents.*")) if p.is_dir() else [p]
    return out


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    from runwatch.collectors.importers.textlog import parse_each

    files = _expand(paths)
    if not files:
        raise ValueError(f"no TensorBoard event files found in {', '.join(map(str, paths))}")
    return parse_each(files, parse_file, skip_bad_lines)
