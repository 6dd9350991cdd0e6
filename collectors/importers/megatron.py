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
``val_loss``/``val_ppl`` to step N (``... on test set``: ``test_*``; a named set
``validation-NAME``: ``val_NAME_*``). Checkpoints: the training loop counts an
iteration once its update is applied, prints ``iteration k`` and then saves,
so ``saving checkpoint at iteration k`` is a checkpoint event at k holding the
state after update k (the record's contract; the next iteration logged is
k+1); ``loaded checkpoint from DIR ... at iteration k`` is a resume at k.
``[defaultN]:`` prefixes name the printing process; Megatron prints from one
rank, so rows are rank 0 unless several ranks print different values. Iteration lines hard-wrapped by other tools are rejoined.
The log has no wall clock on these lines, so ``time`` stays null.
GPT-NeoX prints the same shape with its own spellings: a leading
``samples/sec: X |`` (moved behind the iteration head, kept as an extra),
``lm_loss`` -> loss, ``approx flops per GPU: 150.3TFLOPS`` (-> FLOP/s) and
``validation results at iteration N | lm_loss value: X | lm_loss_ppl value: Y``.

Speed: one anchored RE2 pass finds the iteration and validation lines, the
field text is split in C++ and pivoted per distinct key (megatron_fields),
and the rare event literals are found by a bytes search of the raw file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.deepspeed import OVERFLOW_LITERALS, OVERFLOW_MARK
from runwatch.collectors.importers.megatron_fields import (
    fields_to_columns,
    find_events,
    split_pieces,
)
from runwatch.collectors.importers.textlog import (
    build_table,
    data_bytes,
    lines_containing,
    matches,
    merge_same_step,
    offsets,
    parse_each,
    read_text,
    sanitize_name,
)

_PREFIX = r"^\s*(?:\[default(?P<rank>\d+)\]:)?\s*"
ITERATION_START = _PREFIX + r"iteration\s+[^\s=(,]+\s*/"
VALID_START = _PREFIX + r"valid(?:ation)?(?:-[^\s|]+)? (?:loss|results) at iteration\s"
# GPT-NeoX puts its throughput before the iteration head: "samples/sec: 51.2 | iteration 10/ 50 | ...".
_RATE_FIRST = r"^(\s*(?:\[default\d+\]:)?\s*)(samples/sec:[^|]*\|)\s*(iteration\s[^|]*\|)"
# The text before a line's first '|' (its head), and where the step number ends in it.
_ITERATION = (_PREFIX + r"iteration\s+(?P<step>\d+)\s*/\s*\d+\s*$", "/")
_VALID = (_PREFIX + r"valid(?:ation)? (?:loss|results) at iteration\s+(?P<step>\d+)\s*$", None)
# One anchored pass over every line finds both kinds (RE2 gives up on noise after a few bytes).
# The set an evaluation line reports on: Megatron-LM names several validation sets "validation-NAME" and
# prints "... at iteration N on validation set" / "on test set" at the end of training.
_EVAL_SET = (r"valid(?:ation)?(?:-(?P<name>[^\s|]+))? (?:loss|results) at iteration\s+\d+"
             r"(?:\s+on\s+(?P<set>\w+)\s+set)?")
_EVAL_PLAIN = ((r"^(\s*(?:\[default\d+\]:)?\s*valid(?:ation)?)-[^\s|]+", r"\1"),
               (r"(at iteration\s+\d+)\s+on\s+\w+\s+set", r"\1"))
_EITHER_START = r"^\s*(?:\[default\d+\]:)?\s*(?:samples/sec:[^|]*\|\s*)?(?:iteration\s|valid)"
_CONTINUATION_STOP = re.compile(r"^\s*(\[default\d+\]:\s*)?(iteration\s|valid|time \(ms\)|\[\d{4}-|$|#|\.\.\.)")


def sniff(head: str) -> bool:
    """True when the head holds a Megatron iteration line."""
    return re.search(r"(?m)^\s*(\[default\d+\]:)?\s*(samples/sec:[^|\n]*\|\s*)?iteration\s+\d+\s*/\s*\d+\s*\|",
                     head) is not None


def _rate_last(heads: pa.Array) -> pa.Array:
    """GPT-NeoX lines with the iteration head first, so every line starts the Megatron way."""
    if not pc.any(pc.match_substring(heads, "samples/sec:")).as_py():
        return heads
    return pc.replace_substring_regex(heads, _RATE_FIRST, r"\1\3 \2")


def _rejoin(lines: pa.Array, idx: np.ndarray, texts: pa.Array) -> pa.Array:
    """The iteration lines ``texts`` (at ``idx``), with hard-wrapped ones joined back to their continuations."""
    if not len(texts):
        return texts
    # Only a line whose last byte is not '|' can be open; Python looks at those few.
    last = data_bytes(texts)[np.maximum(offsets(texts)[1:] - 1, 0)]
    maybe = np.flatnonzero((last != ord("|")) | (np.diff(offsets(texts)) == 0))
    open_k = [int(k) for k, t in zip(maybe, texts.take(pa.array(maybe, pa.int64())).to_pylist())
              if not t.rstrip().endswith("|")]
    if not open_k:
        return texts
    n, joined_texts = len(lines), []
    for k in open_k:
        i = int(idx[k])
        joined, j = texts[k].as_py().rstrip("\r"), i + 1
        # A wrapper breaks at a column; the continuation is at most a few lines of fields.
        while j < n and j <= i + 3 and not joined.rstrip().endswith("|"):
            nxt = lines[j].as_py().rstrip("\r")
            if _CONTINUATION_STOP.match(nxt) or ("|" not in nxt and ":" not in nxt):
                break
            joined += nxt
            j += 1
        joined_texts.append(joined)
    mask = np.zeros(len(texts), dtype=bool)
    mask[open_k] = True
    return pc.replace_with_mask(texts, pa.array(mask), pa.array(joined_texts, texts.type))


def _parse_kind(texts: pa.Array, idx: np.ndarray, head: tuple[str, str | None], path: Path, skip: bool,
                prefix: str) -> tuple[dict[str, pa.Array], np.ndarray, int]:
    """Columns of the iteration (or validation) lines ``texts`` found at line indices ``idx``."""
    flat, loff = split_pieces(texts)
    heads = flat.take(pa.array(loff[:-1]))
    # A line is good when its head matches and a '|' follows it.
    ok = matches(heads, head[0]) & (np.diff(loff) >= 2)
    num_skipped = 0
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        if not skip:
            raise LogFormatError(path, int(idx[bad]) + 1,
                                 f"expected 'iteration N/ M | key: value | ...', got {texts[bad].as_py()[:200]!r}")
        num_skipped, idx, heads = int((~ok).sum()), idx[ok], heads.filter(pa.array(ok))
    columns, good = fields_to_columns(flat, loff, ok, heads, head, idx, path, skip, prefix)
    num_skipped += int((~good).sum())
    return columns, idx[good], num_skipped


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    lines, raw = read_text(path)
    cand = np.flatnonzero(matches(lines, _EITHER_START))
    heads = _rate_last(lines.take(pa.array(cand, pa.int64())))
    is_it = matches(heads, ITERATION_START)
    it_idx = cand[is_it]
    # The two starts exclude each other: only the other candidates can be validation lines.
    val_idx = cand[~is_it][matches(heads.filter(pa.array(~is_it)), VALID_START)]
    if not len(it_idx):
        raise LogFormatError(path, None, f"no megatron iteration lines ('iteration N/ M | ...') found in {path}")
    texts = _rejoin(lines, it_idx, heads if is_it.all() else heads.filter(pa.array(is_it)))
    train, it_idx, num_skipped = _parse_kind(texts, it_idx, _ITERATION, path, skip_bad_lines, "")
    val, val_idx, num_bad_val = _parse_evaluations(lines, val_idx, path, skip_bad_lines)
    overflows = _overflow_lines(lines, raw)
    _mark_overflows(train, it_idx, overflows)
    tables = [build_table(c) for c, i in [(train, it_idx), *zip(val, val_idx)] if len(i)]
    val_idx = np.concatenate(val_idx) if val_idx else np.zeros(0, np.int64)
    table = pa.concat_tables(tables, promote_options="permissive") if tables else build_table({"step": pa.array([], pa.int64())})
    line_idx = np.concatenate([it_idx, val_idx])
    order = np.argsort(line_idx, kind="stable")
    table, keep = _rank_rows(table.take(pa.array(order)))
    row_lines = line_idx[order][keep]
    events, breaks = find_events(lines, row_lines, raw)
    return merge_same_step(ParsedLog(table, events, num_skipped + num_bad_val, breaks,
                                     positions=row_lines.astype(np.float64)))


def _eval_prefix(name: str | None, kind: str | None) -> str:
    """Column prefix of an evaluation line: ``val_`` (``test_`` for the test set), plus a named set's name."""
    base = "test_" if kind == "test" else "val_" if kind in (None, "validation") else sanitize_name(kind) + "_"
    return base + (sanitize_name(name) + "_" if name else "")


def _parse_evaluations(lines: pa.Array, idx: np.ndarray, path: Path,
                       skip: bool) -> tuple[list[dict[str, pa.Array]], list[np.ndarray], int]:
    """Columns of the evaluation lines at ``idx``, one group per set they report on."""
    texts = lines.take(pa.array(idx, pa.int64()))
    if not len(idx):
        return [], [], 0
    sets = pc.extract_regex(texts, _EVAL_SET)
    prefixes = [_eval_prefix(n or None, k or None) for n, k in zip(sets.field("name").to_pylist(),
                                                                   sets.field("set").to_pylist())]
    for pattern, replacement in _EVAL_PLAIN:
        texts = pc.replace_substring_regex(texts, pattern, replacement)
    columns, kept, num_bad = [], [], 0
    for prefix in dict.fromkeys(prefixes):
        mask = np.array([p == prefix for p in prefixes])
        cols, good_idx, bad = _parse_kind(texts.filter(pa.array(mask)), idx[mask], _VALID, path, skip, prefix)
        columns.append(cols)
        kept.append(good_idx)
        num_bad += bad
    return columns, kept, num_bad


def _overflow_lines(lines: pa.Array, raw: bytes | None) -> np.ndarray:
    """Indices of DeepSpeed's overflow lines, in each spelling (see deepspeed.py): one bytes search for the
    part they share, then the few hits checked for a spelling."""
    idx = lines_containing(lines, raw, OVERFLOW_MARK)
    if not len(idx):
        return idx
    return idx[matches(lines.take(pa.array(idx, pa.int64())), "|".join(re.escape(lit) for lit in OVERFLOW_LITERALS))]


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
