"""Megatron-LM / Megatron-DeepSpeed stdout: ``iteration N/ M | key: value | ...`` lines.

Mostly noise (argument dumps, timers, tracebacks); only iteration lines,
validation lines, checkpoint saves/loads and DeepSpeed ``OVERFLOW!`` lines are
read. Field mapping: ``lm loss`` -> loss (absent on skipped steps: null, not
NaN), ``grad norm``, ``loss scale``, ``learning rate`` -> lr, ``consumed
samples/tokens`` -> samples/tokens, ``elapsed time per iteration (ms|s)`` ->
``step_time`` in seconds; every other numeric field becomes an extra
(``global batch size`` -> ``global_batch_size``, ``TFLOPs`` -> ``tflops``).
``number of skipped iterations: K`` counts skips over the logging interval that
ends at the row: ``found_inf`` is true when K > 0 or an ``OVERFLOW!`` line came
since the previous iteration line. ``validation loss at iteration N`` lines add
``val_loss``/``val_ppl`` to step N. ``[defaultN]:`` prefixes name the printing
process; Megatron prints from one rank, so rows are rank 0 unless several ranks
print different values. Iteration lines hard-wrapped by other tools are rejoined.
The log has no wall clock on these lines, so ``time`` stays null.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.megatron_fields import (
    fields_to_columns, find_events,
)
from runwatch.collectors.importers.textlog import build_table, merge_same_step, parse_each, read_lines, select

_PREFIX = r"^\s*(?:\[default(?P<rank>\d+)\]:)?\s*"
ITERATION_START = _PREFIX + r"iteration\s+[^\s=(,]+\s*/"
_ITERATION = _PREFIX + r"iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|(?P<rest>.*)$"
VALID_START = _PREFIX + r"valid(?:ation)? loss at iteration\s"
_VALID = _PREFIX + r"valid(?:ation)? loss at iteration\s+(?P<step>\d+)\s*\|(?P<rest>.*)$"
_CONTINUATION_STOP = re.compile(r"^\s*(\[default\d+\]:\s*)?(iteration\s|valid|time \(ms\)|\[\d{4}-|$|#|\.\.\.)")


def sniff(head: str) -> bool:
    """True when the head holds a Megatron iteration line."""
    return re.search(r"(?m)^\s*(\[default\d+\]:)?\s*iteration\s+\d+\s*/\s*\d+\s*\|", head) is not None


def _rejoin(lines: pa.Array, idx: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Iteration lines, with hard-wrapped ones joined back to their continuation lines."""
    texts = lines.take(pa.array(idx)).to_pylist()
    ends_open = [not t.rstrip().endswith("|") for t in texts]
    if not any(ends_open):
        return texts, idx
    n = len(lines)
    for k, i in enumerate(idx):
        if not ends_open[k]:
            continue
        joined, j = texts[k].rstrip("\r"), int(i) + 1
        # A wrapper breaks at a column; the continuation is at most a few lines of fields.
        while j < n and j <= i + 3 and not joined.rstrip().endswith("|"):
            nxt = lines[j].as_py().rstrip("\r")
            if _CONTINUATION_STOP.match(nxt) or ("|" not in nxt and ":" not in nxt):
                break
            joined += nxt
            j += 1
        texts[k] = joined
    return texts, idx


def _matching(lines: pa.Array, literal: str | list[str], pattern: str | None = None) -> np.ndarray:
    return select(lines, literal, pattern)


def _parse_kind(texts: pa.Array, idx: np.ndarray, pattern: str, path: Path, skip: bool,
                prefix: str) -> tuple[dict[str, pa.Array], np.ndarray, int]:
    """Columns of the iteration (or validation) lines ``texts`` found at line indices ``idx``."""
    parts = pc.extract_regex(texts, pattern)
    ok = pc.is_valid(parts).to_numpy(zero_copy_only=False)
    num_skipped = 0
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        if not skip:
            raise LogFormatError(path, int(idx[bad]) + 1,
                                 f"expected 'iteration N/ M | key: value | ...', got {texts[bad].as_py()[:200]!r}")
        num_skipped, idx, parts = int((~ok).sum()), idx[ok], parts.filter(pa.array(ok))
    columns, good = fields_to_columns(parts, idx, path, skip, prefix)
    num_skipped += int((~good).sum())
    return columns, idx[good], num_skipped


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    lines = read_lines(path)
    it_idx = _matching(lines, "iteration", ITERATION_START)
    if not len(it_idx):
        raise LogFormatError(path, None, f"no megatron iteration lines ('iteration N/ M | ...') found in {path}")
    texts, it_idx = _rejoin(lines, it_idx)
    train, it_idx, num_skipped = _parse_kind(pa.array(texts, pa.string()), it_idx, _ITERATION, path,
                                             skip_bad_lines, "")
    val_idx = _matching(lines, "loss at iteration", VALID_START)
    val, val_idx, num_bad_val = _parse_kind(lines.take(pa.array(val_idx)), val_idx, _VALID, path, skip_bad_lines, "val_")
    _mark_overflows(train, it_idx, _matching(lines, ["OVERFLOW!", "Overflow detected"]))
    tables = [build_table(c) for c, i in ((train, it_idx), (val, val_idx)) if len(i)]
    table = pa.concat_tables(tables, promote_options="permissive") if tables else build_table({"step": pa.array([], pa.int64())})
    line_idx = np.concatenate([it_idx, val_idx])
    order = np.argsort(line_idx, kind="stable")
    table, keep = _rank_rows(table.take(pa.array(order)))
    events, breaks = find_events(lines, line_idx[order][keep])
    return merge_same_step(ParsedLog(table, events, num_skipped + num_bad_val, breaks))


def _mark_overflows(train: dict[str, pa.Array], it_idx: np.ndarray, overflow_idx: np.ndarray) -> None:
    """An OVERFLOW line belongs to the next iteration line printed after it: that row skipped a step."""
    if not len(overflow_idx) or not len(it_idx):
        return
    owner = np.searchsorted(it_idx, overflow_idx)
    flagged = np.zeros(len(it_idx), dtype=bool)
    flagged[owner[owner < len(it_idx)]] = True
    found = train.get("found_inf")
    base = np.zeros(len(it_idx), dtype=bool) if found is None else pc.fill_null(found, False).to_numpy(zero_copy_only=False)
    train["found_inf"] = pa.array(base | flagged)


def _rank_rows(table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """Rank 0 unless several ranks printed different values; exact repeats from other ranks are dropped."""
    keep = np.ones(table.num_rows, dtype=bool)
    if "rank" not in table.column_names:
        return table, keep
    ranks = table["rank"].to_numpy(zero_copy_only=False)
    if len(np.unique(ranks)) <= 1:
        return table.drop_columns(["rank"]), keep
    seen: set[tuple] = set()
    for i, row in enumerate(table.drop_columns(["rank"]).to_pylist()):
        key = tuple(sorted((k, v) for k, v in row.items() if v is not None and v == v))
        keep[i] = key not in seen
        seen.add(key)
    table = table.filter(pa.array(keep))
    if len(np.unique(table["rank"].to_numpy(zero_copy_only=False))) <= 1:
        table = table.drop_columns(["rank"])
    return table, keep


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
