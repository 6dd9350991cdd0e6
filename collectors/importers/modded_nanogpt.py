"""modded-nanogpt logs: ``step:N/M train_loss:X train_time:Tms step_avg:Sms`` and ``val_loss`` lines.

``train_time`` is cumulative training milliseconds (eval time excluded). The log
has no wall clock, so ``time`` is ``train_time / 1000``: seconds since training
started, not unix time. ``step_time`` (seconds per step) is the difference of
``train_time`` between logged training steps; ``step_avg`` is kept as an extra
in seconds. A literal ``nan`` in a timing field is a missing measurement and
becomes null. Validation lines only add ``val_loss`` to their step's row.

Speed: one RE2 match (no captures, so the fast DFA) checks every line; the
fields of good lines are cut out by literal key positions and cast in bulk.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import (
    NUMBER_RE, build_table, data_bytes, first_line_matches, floats_at, ints_at, keyed_spans, matches, merge_same_step,
    parse_each, read_lines,
)

_STEP_LINE = r"^step:\d"
_LINE = (rf"^step:(?P<step>\d+)/(?P<total>\d+) (?P<kind>train_loss|val_loss):(?P<loss>{NUMBER_RE})"
         rf"(?: train_time:(?P<train_time>{NUMBER_RE})ms)?(?: step_avg:(?P<step_avg>{NUMBER_RE})ms)?\s*$")
EXPECTED = "a modded-nanogpt line 'step:N/M train_loss:X train_time:Tms step_avg:Sms' (or val_loss)"


def sniff(head: str) -> bool:
    """True when the first non-blank line is a modded-nanogpt step line."""
    return first_line_matches(head, r"^step:\d+/\d+ (train_loss|val_loss):")


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


def _good_lines(lines: pa.Array, path: Path, skip_bad_lines: bool) -> tuple[np.ndarray, int]:
    """Indices of the step lines that parse, and how many claimed step lines did not."""
    ok = matches(lines, _LINE)
    miss = np.flatnonzero(~ok)
    # Lines that claim to be step lines but do not parse; everything else is noise.
    bad = miss[matches(lines.take(pa.array(miss)), _STEP_LINE)] if len(miss) else miss
    idx = np.flatnonzero(ok)
    if not len(idx) and not len(bad):
        raise LogFormatError(path, None, "no modded-nanogpt step lines ('step:N/M train_loss:...') found")
    if len(bad) and not skip_bad_lines:
        raise LogFormatError(path, int(bad[0]) + 1, f"expected {EXPECTED}, got {lines[int(bad[0])].as_py()[:200]!r}")
    return idx, len(bad)


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    lines = read_lines(path)
    idx, num_skipped = _good_lines(lines, path, skip_bad_lines)
    keep = np.zeros(len(lines), dtype=bool)
    keep[idx] = True
    good = lines if keep.all() else lines.filter(pa.array(keep))
    nums = idx + 1
    # Fields by position: "step:" STEP "/" TOTAL " " KIND ":" LOSS [" train_time:" T "ms"] [" step_avg:" S "ms"].
    step_span, _, kind_span, time_span, avg_span = keyed_spans(good, 5, [("/", 0), (" ", 0), (" train_time:", 2),
                                                                         (" step_avg:", 2)])
    steps = ints_at(good, step_span, nums, path, "step")
    present, kind_start, kind_stop = kind_span
    is_train = data_bytes(good)[kind_start] == ord("t") if len(idx) else np.zeros(0, bool)
    loss_span = (present, kind_start + np.where(is_train, len("train_loss:"), len("val_loss:")), kind_stop)
    loss = floats_at(good, loss_span, nums, path, "loss")
    train_s = pc.divide(_missing_nan(floats_at(good, time_span, nums, path, "train_time")), 1000.0)
    step_avg = pc.divide(_missing_nan(floats_at(good, avg_span, nums, path, "step_avg")), 1000.0)
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
