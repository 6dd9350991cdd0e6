"""modded-nanogpt logs: ``step:N/M train_loss:X train_time:Tms step_avg:Sms`` and ``val_loss`` lines.

Later records print training lines without a loss (``step:N/M train_time:Tms
step_avg:Sms``, the loss is no longer synced every step): they are read for
their timing, with a null loss. Those logs start with the training script's
source, so the sniffer looks for a step line anywhere in the head.

``train_time`` is cumulative training milliseconds (eval time excluded), kept
as the extra ``train_time`` in seconds since training started. The log has no
wall clock, so ``time`` (unix seconds, a contract) stays null, as for Megatron
(a user saw "updated 20792.5d ago": 1970 plus the training's seconds).
``step_time`` (seconds per step) is the difference of ``train_time`` between
logged training steps; ``step_avg`` is kept as an extra in seconds. A literal
``nan`` in a timing field is a missing measurement and becomes null. Validation lines only add ``val_loss`` to their step's row.

Speed: one RE2 match (no captures, so the fast DFA) checks every line; the
fields of good lines are cut out by literal key positions and cast in bulk.
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
    NUMBER_RE,
    build_table,
    data_bytes,
    floats_at,
    ints_at,
    keyed_spans,
    matches,
    merge_same_step,
    parse_each,
    read_lines,
)

_STEP_LINE = r"^step:\d"
_LINE = (rf"^step:(?P<step>\d+)/(?P<total>\d+) (?P<kind>train_loss|val_loss):(?P<loss>{NUMBER_RE})"
         rf"(?: train_time:(?P<train_time>{NUMBER_RE})ms)?(?: step_avg:(?P<step_avg>{NUMBER_RE})ms)?\s*$")
_TIME_LINE = rf"^step:\d+/\d+ train_time:{NUMBER_RE}ms(?: step_avg:{NUMBER_RE}ms)?\s*$"
EXPECTED = ("a modded-nanogpt line 'step:N/M train_loss:X train_time:Tms step_avg:Sms' (or val_loss, "
            "or no loss: 'step:N/M train_time:Tms step_avg:Sms')")


def sniff(head: str) -> bool:
    """True when a line of the head is a modded-nanogpt step line."""
    return "step:" in head and re.search(r"(?m)^step:\d+/\d+ (?:train_loss|val_loss|train_time):", head) is not None


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


def _good_lines(lines: pa.Array, path: Path, skip_bad_lines: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """Indices of the step lines that parse (with a loss, timing only), and how many claimed step lines did not."""
    ok = matches(lines, _LINE)
    miss = np.flatnonzero(~ok)
    # Lines that claim to be step lines; those outside both shapes are malformed, everything else is noise.
    claimed = miss[matches(lines.take(pa.array(miss)), _STEP_LINE)] if len(miss) else miss
    timing = claimed[matches(lines.take(pa.array(claimed, pa.int64())), _TIME_LINE)] if len(claimed) else claimed
    bad = np.setdiff1d(claimed, timing)
    idx = np.flatnonzero(ok)
    if not len(idx) and not len(timing) and not len(bad):
        raise LogFormatError(path, None, "no modded-nanogpt step lines ('step:N/M train_loss:...') found")
    if len(bad) and not skip_bad_lines:
        raise LogFormatError(path, int(bad[0]) + 1, f"expected {EXPECTED}, got {lines[int(bad[0])].as_py()[:200]!r}")
    return idx, timing, len(bad)


def _columns(good: pa.Array, nums: np.ndarray, path: Path, with_loss: bool) -> dict[str, pa.Array]:
    """Columns of step lines in one shape; fields by position:
    "step:" STEP "/" TOTAL [" " KIND ":" LOSS] [" train_time:" T "ms"] [" step_avg:" S "ms"]."""
    keys = [("/", 0), (" ", 0), (" train_time:", 2), (" step_avg:", 2)] if with_loss else \
        [("/", 0), (" train_time:", 2), (" step_avg:", 2)]
    spans = keyed_spans(good, 5, keys)
    step_span, time_span, avg_span = spans[0], spans[-2], spans[-1]
    steps = ints_at(good, step_span, nums, path, "step")
    if with_loss:
        present, kind_start, kind_stop = spans[2]
        is_train = data_bytes(good)[kind_start] == ord("t") if len(nums) else np.zeros(0, bool)
        loss_span = (present, kind_start + np.where(is_train, len("train_loss:"), len("val_loss:")), kind_stop)
        loss = floats_at(good, loss_span, nums, path, "loss")
    else:
        is_train, loss = np.ones(len(nums), dtype=bool), pa.nulls(len(nums), pa.float64())
    train_s = pc.divide(_missing_nan(floats_at(good, time_span, nums, path, "train_time")), 1000.0)
    step_avg = pc.divide(_missing_nan(floats_at(good, avg_span, nums, path, "step_avg")), 1000.0)
    train_mask, null = pa.array(is_train), pa.scalar(None, pa.float64())
    return {
        "step": steps,
        # Validation lines carry only val_loss, so they fold into their step's training row.
        "train_time": pc.if_else(train_mask, train_s, null),
        "loss": pc.if_else(train_mask, loss, null),
        "val_loss": pc.if_else(train_mask, null, loss),
        "step_avg": pc.if_else(train_mask, step_avg, null),
        "is_train": train_mask,
    }


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    lines = read_lines(path)
    idx, timing, num_skipped = _good_lines(lines, path, skip_bad_lines)
    parts = []
    for at, with_loss in ((idx, True), (timing, False)):
        if len(at) or with_loss:
            good = lines if len(at) == len(lines) else lines.take(pa.array(at, pa.int64()))
            parts.append(pa.table(_columns(good, at + 1, path, with_loss)))
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    line_idx = np.concatenate([idx, timing]) if len(timing) else idx
    if len(timing):
        order = np.argsort(line_idx, kind="stable")
        table, line_idx = table.take(pa.array(order)), line_idx[order]
    is_train = table["is_train"].to_numpy(zero_copy_only=False)
    train_np = table["train_time"].to_numpy(zero_copy_only=False)
    columns = {name: table[name] for name in ("step", "loss", "val_loss")}
    columns["step_time"] = pa.array(_step_time(table["step"].to_numpy(), train_np, is_train), from_pandas=True)
    columns["step_avg"], columns["train_time"] = table["step_avg"], table["train_time"]
    return merge_same_step(ParsedLog(build_table(columns), num_skipped=num_skipped,
                                     positions=line_idx.astype(np.float64)))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
