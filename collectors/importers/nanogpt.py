"""nanoGPT (karpathy/nanoGPT ``train.py``) stdout: ``iter N: loss X, time Tms, mfu M%`` lines.

Lines read (an optional leading ``YYYY-MM-DD HH:MM:SS`` stamp, as ``ts`` or a
job wrapper adds, becomes ``time`` in unix seconds, read as UTC):

* ``iter 3010: loss nan, time 1019.95ms, mfu 14.12%`` -> loss, ``step_time``
  (seconds), ``mfu`` (percent; the ``-100.00%`` printed before MFU is measured
  is null). Older train.py printed ``, lr 6.00e-04`` instead of mfu: -> lr.
* ``step 3000: train loss 4.0390, val loss 4.0427`` (the eval) -> ``val_loss``
  and ``eval_train_loss`` at that step; it folds into the ``iter`` row of the
  same step.
* ``saving checkpoint to out`` -> a ``checkpoint`` event, path ``out/ckpt.pt``,
  at step k-1 where k is the step of the eval before it. train.py evaluates and
  saves at the top of iteration k, before iteration k's update: the file holds
  the state after update k-1 (the record's contract: a checkpoint at step s
  holds the state after update s; the next step logged, k, is the first whose
  loss those weights produce). nanoGPT overwrites that one file at every save,
  so the payload says ``overwrites: true``: only the newest save still exists.
* ``Resuming training from out`` -> a ``resume`` event that starts a segment,
  at step k-1 where k is the first step printed after it: train.py restarts at
  the checkpoint's ``iter_num`` k, which holds the state after update k-1.

Other lines (config dumps, warnings) are noise. A line that starts like an
``iter``/``step`` line but does not parse is an error naming file and line.
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
    lines_containing,
    matches,
    merge_same_step,
    parse_each,
    read_text,
    to_float,
    to_int,
)

_TS = r"^\s*(?:\[?(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[.,]\d+)?\]?\s+)?"
_ITER = (_TS + rf"iter (?P<step>\d+): loss (?P<loss>{NUMBER_RE})(?:, time (?P<ms>{NUMBER_RE})ms)?"
         rf"(?:, mfu (?P<mfu>{NUMBER_RE})%)?(?:, lr (?P<lr>{NUMBER_RE}))?\s*$")
_EVAL = _TS + rf"step (?P<step>\d+): train loss (?P<train>{NUMBER_RE}), val loss (?P<val>{NUMBER_RE})\s*$"
_CLAIM = _TS + r"(?:iter \d+:|step \d+: )"
_CKPT = re.compile(r"saving checkpoint to (?P<dir>\S+)\s*$")
_RESUME = re.compile(r"Resuming training from (?P<dir>\S+)\s*$")
EXPECTED = "a nanoGPT line 'iter N: loss X, time Tms, mfu M%' or 'step N: train loss X, val loss Y'"


def sniff(head: str) -> bool:
    """True when the head holds a nanoGPT iter or eval line (train.py prints its config first)."""
    if ": loss " not in head and ": train loss " not in head:  # cheap literal test before the regex
        return False
    return re.search(r"(?m)" + _TS + rf"(?:iter \d+: loss {NUMBER_RE}, time "
                     rf"|step \d+: train loss {NUMBER_RE}, val loss )", head) is not None


def _stamps(ts: pa.Array) -> pa.Array:
    """Unix seconds of ``YYYY-MM-DD HH:MM:SS`` stamps (empty -> null)."""
    ts = pc.replace_substring(ts, "T", " ")
    ts = pc.if_else(pc.equal(ts, ""), pa.scalar(None, pa.string()), ts)
    parsed = pc.strptime(ts, format="%Y-%m-%d %H:%M:%S", unit="s", error_is_null=True)
    return pc.divide(pc.cast(pc.cast(parsed, pa.int64()), pa.float64()), 1.0)


def _rows(lines: pa.Array, idx: np.ndarray, pattern: str) -> pa.StructArray:
    return pc.extract_regex(lines.take(pa.array(idx, pa.int64())), pattern)


def _checkpoints(lines: pa.Array, raw: bytes | None, eval_idx: np.ndarray, eval_steps: np.ndarray,
                 row_lines: np.ndarray) -> list[dict]:
    """A checkpoint event per ``saving checkpoint to DIR`` line, at the step of the eval before it."""
    events = []
    for i in lines_containing(lines, raw, "saving checkpoint to "):
        m = _CKPT.search(lines[int(i)].as_py())
        before = np.searchsorted(eval_idx, i) - 1
        if m is None or before < 0:
            continue  # a save before any eval: train.py never does this; no step to place it at
        # Saved at the top of iteration k, before its update: the state after update k-1.
        events.append({"event": "checkpoint", "step": int(eval_steps[before]) - 1,
                       "path": f"{m['dir'].rstrip('/')}/ckpt.pt", "overwrites": True,
                       "row_index": int(np.searchsorted(row_lines, i))})
    return events


def _resumes(lines: pa.Array, raw: bytes | None, row_lines: np.ndarray, row_steps: np.ndarray) -> list[dict]:
    """A resume event per ``Resuming training from DIR`` line, at the step before the first row after it."""
    events = []
    for i in lines_containing(lines, raw, "Resuming training from "):
        m = _RESUME.search(lines[int(i)].as_py())
        after = int(np.searchsorted(row_lines, i))
        if m is None or after >= len(row_steps):
            continue  # nothing printed after it: no step to place it at
        events.append({"event": "resume", "step": int(row_steps[after]) - 1,
                       "path": f"{m['dir'].rstrip('/')}/ckpt.pt", "row_index": after})
    return events


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    lines, raw = read_text(path)
    is_iter, is_eval = matches(lines, _ITER), matches(lines, _EVAL)
    bad = np.flatnonzero(matches(lines, _CLAIM) & ~is_iter & ~is_eval)
    it_idx, ev_idx = np.flatnonzero(is_iter), np.flatnonzero(is_eval)
    if not len(it_idx) and not len(ev_idx):
        raise LogFormatError(path, None, "no nanoGPT lines ('iter N: loss X, time Tms') found")
    if len(bad) and not skip_bad_lines:
        raise LogFormatError(path, int(bad[0]) + 1, f"expected {EXPECTED}, got {lines[int(bad[0])].as_py()[:200]!r}")
    it, ev = _rows(lines, it_idx, _ITER), _rows(lines, ev_idx, _EVAL)
    null = pa.nulls(len(it_idx), pa.float64())
    ev_null = pa.nulls(len(ev_idx), pa.float64())
    mfu = to_float(it.field("mfu"), it_idx + 1, path, "mfu")
    # running_mfu starts at -1 and prints as -100.00% until measured: not a measurement.
    mfu = pc.if_else(pc.less(mfu, 0.0), pa.scalar(None, pa.float64()), mfu)
    ev_steps = to_int(ev.field("step"), ev_idx + 1, path, "step")
    it_steps = to_int(it.field("step"), it_idx + 1, path, "iter")
    # An eval's stamp would clash with its iter row's when the two fold together: the iter row keeps the time.
    ev_time = pc.if_else(pa.array(np.isin(ev_steps.to_numpy(), it_steps.to_numpy())),
                         pa.scalar(None, pa.float64()), _stamps(ev.field("ts")))
    columns = {
        "step": pa.concat_arrays([it_steps, ev_steps]),
        "time": pa.concat_arrays([_stamps(it.field("ts")), ev_time]),
        "loss": pa.concat_arrays([to_float(it.field("loss"), it_idx + 1, path, "loss"), ev_null]),
        "step_time": pa.concat_arrays([pc.divide(to_float(it.field("ms"), it_idx + 1, path, "time"), 1000.0),
                                       ev_null]),
        "mfu": pa.concat_arrays([mfu, ev_null]),
        "lr": pa.concat_arrays([to_float(it.field("lr"), it_idx + 1, path, "lr"), ev_null]),
        "val_loss": pa.concat_arrays([null, to_float(ev.field("val"), ev_idx + 1, path, "val loss")]),
        "eval_train_loss": pa.concat_arrays([null, to_float(ev.field("train"), ev_idx + 1, path, "train loss")]),
    }
    columns = {k: v for k, v in columns.items() if k == "step" or v.null_count < len(v)}
    line_idx = np.concatenate([it_idx, ev_idx])
    order = np.argsort(line_idx, kind="stable")
    table = build_table(columns).take(pa.array(order))
    row_lines = line_idx[order]
    events = _checkpoints(lines, raw, ev_idx, ev_steps.to_numpy(), row_lines)
    resumes = _resumes(lines, raw, row_lines, table["step"].to_numpy())
    events = sorted(events + resumes, key=lambda ev: ev["row_index"])
    return merge_same_step(ParsedLog(table, events, num_skipped=len(bad), breaks={ev["row_index"] for ev in resumes},
                                     positions=row_lines.astype(np.float64)))


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
