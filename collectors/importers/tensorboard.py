"""TensorBoard event files, read with the tensorboard package's own loader (no TensorFlow).

Scalars become rows keyed by step: common tags map to the record
(``train/loss``, ``loss``, ``lm loss`` -> loss; ``grad_norm``, ``grad-norm`` ->
grad_norm; ``lr``, ``learning-rate`` -> lr; ``loss_scale``, ``loss-scale`` ->
loss_scale; ``iteration-time`` -> step_time; validation tags such as
``val/loss`` or ``lm loss validation`` -> ``val_loss``); every other scalar tag
becomes an extra with a sanitised name (Lightning's ``lr-<optimizer>`` is the LR). ``time`` is the event's wall time.
A run is what TensorBoard calls one: the event files of one directory, read
in order. TensorBoard purges steps that go backwards after a restart; here a
step going backwards (within a file or from one file to the next) or a
``SessionLog.START`` starts a new segment, so the abandoned branch stays
visible. A tag logged again at the step it was logged at is the same row, the
later value kept, as TensorBoard reads it (Lightning logs ``epoch`` again at
each validation, an LR monitor once per micro-batch: no restart). A directory
holding several runs (Keras' ``train/`` and ``validation/``, a logdir of
experiments) is refused with their names: import each as a run of its own.
The subdirectory ``SummaryWriter.add_hparams`` writes (only the hparams
plugin's summaries and their metrics) is the run's hyperparameter record, not
a run. A torn last record (a write cut short) and a corrupt record are named:
what follows a corrupt record cannot be read, since the file's framing is lost.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import note, sanitize_name
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
_LR_MONITOR = re.compile(r"^lr-[a-z][a-z0-9_]*$")
"""Lightning's ``LearningRateMonitor``: ``lr-<optimizer class>`` is the first parameter group's LR (``lr-AdamW``;
``lr-AdamW/pg1`` and ``lr-AdamW-momentum`` are other values, kept as extras)."""
_VAL = re.compile(r"^(?:val|valid|validation|eval)[/_ -](.+)$|^(.+?)[/_ -](?:val|valid|validation)$")
_START = 1  # SessionLog.START


def sniff(head: str) -> bool:
    """True for an event file: its first record is the ``brain.Event:N`` file-version event."""
    return "brain.Event:" in head[:256]


def column_for(tag: str) -> str:
    key = tag.strip().lower()
    if key in TAGS:
        return TAGS[key]
    if _LR_MONITOR.match(key):
        return "lr"
    m = _VAL.match(key)
    if m:
        inner = (m.group(1) or m.group(2)).strip()
        return "val_loss" if TAGS.get(inner) == "loss" else sanitize_name(inner, "val_")
    return sanitize_name(key)


def _count_records(data: bytes) -> tuple[int, bool]:
    """TFRecord framing: u64 length, u32 crc, payload, u32 crc. (Whole records, whether a torn one follows them:
    a write cut short, or a live writer's tail.)"""
    pos = num = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        if pos + 12 + length + 4 > len(data):
            break
        pos += 12 + length + 4
        num += 1
    return num, pos < len(data)


def _events(path: Path) -> Iterator[object]:
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError as err:
        raise ImportError("reading TensorBoard event files needs tensorboard: pip install 'runwatch[tensorboard]'") from err
    data = path.read_bytes()
    if data and not sniff(data[:256].decode("latin-1")):
        raise LogFormatError(path, 1, "not a TensorBoard event file (no brain.Event file-version record first)")
    expected, torn = _count_records(data)
    num = 0
    for event in EventFileLoader(str(path)).Load():
        num += 1
        yield event
    if num < expected:
        raise LogFormatError(path, num + 1, f"record {num + 1} of {expected} is corrupt; the {expected - num - 1} "
                                            "after it cannot be read either (the file's framing is lost there)")
    if torn:
        note(path, num + 1, "the last record is cut short (a write cut short?); not read")


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
                if current is None or event.step != current["step"]:
                    if current is not None:
                        rows.append(current)
                    current = {"step": int(event.step), "time": float(event.wall_time)}
                current[name] = x  # logged again at its step: the same row, the later value (TensorBoard's reading)
    except LogFormatError as err:
        if not skip_bad_lines:
            raise
        num_skipped += 1
        note(path, err.line, f"{err.expected}; read up to it")
    if current is not None:
        rows.append(current)
    if not rows:
        raise LogFormatError(path, None, "no scalar summaries found in this TensorBoard event file")
    # Consecutive rows differ in step by construction: nothing for ``merge_same_step`` to fold.
    return ParsedLog(metrics_table(rows), breaks=breaks, num_skipped=num_skipped)


def _hparams_only(files: Sequence[Path]) -> bool:
    """Event files that hold the hparams plugin's record and no series (``SummaryWriter.add_hparams``: its metrics
    once each); a run's own directory may hold the record too (Lightning's logger), beside its series."""
    counts: dict[str, int] = {}
    plugin = False
    for path in files:
        for event in _events(path):
            for value in event.summary.value if event.WhichOneof("what") == "summary" else ():
                plugin |= value.metadata.plugin_data.plugin_name == "hparams"
                counts[value.tag] = counts.get(value.tag, 0) + 1
    return plugin and max(counts.values(), default=0) <= 1


def _expand(paths: Sequence[str | Path]) -> list[Path]:
    """The event files of one run: a file as given, or a directory's (those of its subdirectories too when it has
    none of its own and one subdirectory holds them all). Several runs in a directory are refused by name."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            out.append(p)
            continue
        runs: dict[Path, list[Path]] = {}
        for f in sorted(p.glob("**/events.out.tfevents.*")):
            runs.setdefault(f.parent, []).append(f)
        runs = {d: fs for d, fs in runs.items() if not (d != p and _hparams_only(fs))}
        if len(runs) > 1:
            names = ", ".join(str(d.relative_to(p)) or "." for d in runs)
            raise ValueError(f"{p} holds {len(runs)} TensorBoard runs ({names}): import each directory as a run "
                             "of its own")
        out += next(iter(runs.values()), [])
    return out


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    from runwatch.collectors.importers.textlog import parse_each

    files = _expand(paths)
    if not files:
        raise ValueError(f"no TensorBoard event files found in {', '.join(map(str, paths))}")
    # No break between files: a later file that starts where the last one ended continues the run; one that goes
    # back is a restart by the step rule (TensorBoard's own).
    return parse_each(files, parse_file, skip_bad_lines, break_between=False)
