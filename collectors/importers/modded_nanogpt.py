"""modded-nanogpt logs: ``step:N/M train_loss:X train_time:Tms step_avg:Sms`` and ``val_loss`` lines.

``train_time`` is cumulative training milliseconds (eval time excluded). The log
has no wall clock, so ``time`` is ``train_time / 1000``: seconds since training
started, not unix time. ``step_time`` (seconds per step) is the difference of
``train_time`` between logged training steps; ``step_avg`` is kept as an extra
in seconds. A literal ``nan`` in a timing field is a missing measurement and
becomes null. Validation lines only add ``val_loss`` to their step's row.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import (
    NUMBER_RE, build_table, pick, first_bad, merge_same_step, parse_each, read_lines, to_float, to_int,
)

_STEP_LINE = r"^step:\d"
_LINE = (rf"^step:(?P<step>\d+)/(?P<total>\d+) (?P<kind>train_loss|val_loss):(?P<loss>{NUMBER_RE})"
         rf"(?: train_time:(?P<train_time>{NUMBER_RE})ms)?(?: step_avg:(?P<step_avg>{NUMBER_RE})ms)?\s*$")
EXPECTED = "a modded-nanogpt line 'step:N/M train_loss:X train_time:Tms step_avg:Sms' (or val_loss)"


def sniff(head: str) -> bool:
    """True when the first non-blank line is a modded-nanogpt step line."""
    for line in head.splitlines():
        if line.strip():
            return re.match(r"^step:\d+/\d+ (train_loss|val_loss):", line) is not None
    return False


def _missing_nan(values: pa.Array) -> pa.Array:
    # A timing field printed as "nan" was not measured yet: null, not a NaN measurement.
    return pc.if_else(pc.is_nan(values), pa.scalar(None, pa.float64()), values)


def _step_time(steps: np.ndarray, train_s: np.ndarray, is_train: np.ndarray) -> np.ndarray:
    """Seconds per step from cumulative train time, over consecutive training rows."""
    out = np.full(len(steps), np.nan)
    rows = np.flatnonzero(is_train & ~np.isnan(train_s))
    if len(rows) > 1:
        dstep = steps[rows[1:]] - steps[rows[:-1]]
        dt = train_s[rows[1:]] - train_s[rows[:-1]]
        with np.errstate(invalid="ignore", divide="ignore"):
            per = np.where((dstep > 0) & (dt >= 0), dt / np.maximum(dstep, 1), np.nan)
        out[rows[1:]] = per
    return out


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    idx, sub, parts, ok = pick(read_lines(path), "step:", _STEP_LINE, _LINE)
    if not len(idx):
        raise LogFormatError(path, None, "no modded-nanogpt step lines ('step:N/M train_loss:...') found")
    num_skipped = 0
    bad = first_bad(~ok)
    if bad is not None:
        if not skip_bad_lines:
            raise LogFormatError(path, int(idx[bad]) + 1, f"expected {EXPECTED}, got {sub[bad].as_py()[:200]!r}")
        num_skipped = int((~ok).sum())
        idx, parts = idx[ok], parts.filter(pa.array(ok))
    nums = idx + 1
    steps = to_int(parts.field("step"), nums, path, "step")
    is_train = pc.equal(parts.field("kind"), "train_loss").to_numpy(zero_copy_only=False)
    loss = to_float(parts.field("loss"), nums, path, "loss")
    train_s = pc.divide(_missing_nan(to_float(parts.field("train_time"), nums, path, "train_time")), 1000.0)
    step_avg = pc.divide(_missing_nan(to_float(parts.field("step_avg"), nums, path, "step_avg")), 1000.0)
    train_mask = pa.array(is_train)
    null = pa.scalar(None, pa.float64())
    train_np = train_s.to_numpy(zero_copy_only=False)
    step_time = _step_time(steps.to_numpy(), train_np, is_train)
    columns = {
        "step": steps,
        # Validation lines carry only val_loss, so they fold into their step's training row.
        "time": pc.if_else(train_mask, train_s, null),
        "loss": pc.if_else(train_mask, loss, null),
        "val_loss": pc.if_else(train_mask, null, loss),
        "step_time": pa.array(step_time, from_pandas=True),
        "step_avg": pc.if_else(train_mask, step_avg, null),
    }
    return merge_same_step(ParsedLog(build_table(columns), num_skipped=num_skipped))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
