"""Step counters in a training stdout, for the lines that print no step of their own.

Training tools print a step counter as they go, each at the end of a step:
tqdm's training bar (``  5%|▌    | 50/1000 [00:10<03:10, 5.00it/s]``, the HF
Trainer's and many loops'), DeepSpeed's ``step=N, skipped=K, lr=[...]`` report
and Megatron's ``iteration N/ M |`` line. A line without a step (a DeepSpeed
overflow, an HF Trainer log dict) takes its step from the counters around it
in the stream, never from its row number.

A stream position is a float: the line index plus the fraction of the line
before the text. tqdm redraws its bar with ``\\r`` and no newline, so many bar
updates and then a log line can share one physical line; the fraction keeps
them in the order they were printed.

A loop that draws a new bar every epoch counts within the epoch: a bar that
reached its total and starts again is read as the next epoch, its counts going
on from the total; a bar that goes back before reaching it is a restart.

Several bars can run in one stdout (evaluation, dataset maps). The training bar
is the one running when the lines that need a step were printed: of all bars
(told apart by their total), the one that most often is the last counter
before such a line; with no such line, the one that advanced through the most
counts.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.textlog import lines_containing, matches

# tqdm's default bar: "{desc}: {percent}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}]".
_TQDM = re.compile(r"\d+%\|[^|\r\n]*\| *(\d+)/(\d+) \[")
_TQDM_RE2 = r"\d%\|[^|\r\n]*\| *\d+/\d+ \["
_DEEPSPEED = r"\bstep=(?P<step>\d+), skipped=\d+, lr=\["
_MEGATRON = r"^\s*(?:\[default\d+\]:)?\s*(?:samples/sec:[^|]*\|\s*)?iteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|"


def position(line_index: int, start: int, length: int) -> float:
    """The stream position of text starting at ``start`` in a line of ``length`` characters."""
    return line_index + start / (length + 1)


def _lines_matching(lines: pa.Array, raw: bytes | None, literal: str | None, pattern: str) -> np.ndarray:
    """Indices of the lines matching ``pattern``; a rare ``literal`` they all hold is found by a bytes search
    first (a frequent one, like Megatron's "iteration", is faster as one RE2 pass: ``literal`` None)."""
    if literal is None:
        return np.flatnonzero(matches(lines, pattern))
    idx = lines_containing(lines, raw, literal)
    return idx[matches(lines.take(pa.array(idx, pa.int64())), pattern)] if len(idx) else idx


def _regex_counters(lines: pa.Array, raw: bytes | None, pattern: str, literal: str,
                    rare: bool) -> tuple[np.ndarray, np.ndarray]:
    """(positions, steps) of the lines matching ``pattern`` (group ``step``), placed where ``literal`` starts."""
    idx = _lines_matching(lines, raw, literal if rare else None, pattern)
    if not len(idx):
        return np.zeros(0), np.zeros(0, np.int64)
    hit = lines.take(pa.array(idx, pa.int64()))
    digits = pc.extract_regex(hit, pattern).field("step")
    sane = pc.less_equal(pc.utf8_length(digits), 18).to_numpy(zero_copy_only=False)  # a counter, not junk
    if not sane.all():
        idx, hit, digits = idx[sane], hit.filter(pa.array(sane)), digits.filter(pa.array(sane))
    steps = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
    at = np.maximum(pc.find_substring(hit, literal).to_numpy(zero_copy_only=False), 0)
    length = pc.utf8_length(hit).to_numpy(zero_copy_only=False)
    # find_substring counts bytes, utf8_length characters: clip so a position never reaches the next line.
    return idx + np.minimum(at, length) / (length + 1), steps


def _bars(lines: pa.Array, raw: bytes | None) -> list[tuple[float, int, int]]:
    """(position, count, total) of every tqdm bar update."""
    idx = _lines_matching(lines, raw, None, _TQDM_RE2)
    out = []
    for i, text in zip(idx.tolist(), lines.take(pa.array(idx, pa.int64())).to_pylist()):
        out += [(position(i, m.start(), len(text)), int(m.group(1)), int(m.group(2))) for m in _TQDM.finditer(text)
                if len(m.group(1)) <= 18 and len(m.group(2)) <= 18]  # a counter, not junk
    return out


def _training_total(bars: list[tuple[float, int, int]], near: np.ndarray) -> int | None:
    """The total of the training bar (see the module docstring)."""
    if not bars:
        return None
    at = np.array([b[0] for b in bars])
    before = np.searchsorted(at, near, side="right") - 1
    votes = Counter(bars[k][2] for k in before[before >= 0].tolist())
    distinct = Counter(total for total, _ in {(b[2], b[1]) for b in bars})
    return max(distinct, key=lambda total: (votes[total], distinct[total], total))


def _across_epochs(bar: list[tuple[float, int]], total: int | None) -> list[tuple[float, int]]:
    """Counts of a bar that runs once per epoch, made cumulative: a bar that reached its total and starts
    again is the next epoch (its counts go on from there); one that goes back before its total restarted."""
    out, offset, last = [], 0, None
    for p, n in bar:
        if last is not None and n < last and last == total:
            offset += total
        out.append((p, n + offset))
        last = n
    return out


def find_counters(lines: pa.Array, near: np.ndarray | None = None, *, raw: bytes | None = None,
                  kinds: tuple[str, ...] = ("tqdm", "deepspeed", "megatron")) -> tuple[np.ndarray, np.ndarray]:
    """(positions, steps) of the step counters of ``kinds`` in ``lines``, in stream order.

    ``near`` are the positions of the lines that need a step; they choose the
    training bar among several tqdm bars. ``raw`` (the file's bytes, as
    ``read_text`` returns them) makes finding candidate lines a bytes search.
    """
    parts = []
    if "tqdm" in kinds:
        bars = _bars(lines, raw)
        total = _training_total(bars, np.zeros(0) if near is None else np.asarray(near, dtype=np.float64))
        chosen = _across_epochs([(p, n) for p, n, t in bars if t == total], total)
        parts.append((np.array([p for p, _ in chosen]), np.array([n for _, n in chosen], np.int64)))
    if "deepspeed" in kinds:
        parts.append(_regex_counters(lines, raw, _DEEPSPEED, "step=", rare=True))
    if "megatron" in kinds:
        parts.append(_regex_counters(lines, raw, _MEGATRON, "iteration", rare=False))
    pos = np.concatenate([p for p, _ in parts]) if parts else np.zeros(0)
    steps = np.concatenate([s for _, s in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
    order = np.argsort(pos, kind="stable")
    return pos[order], steps[order]


def counter_of_lines(positions: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The counter (an index into ``positions``) of each line at ``at`` (sorted) that prints after its step's
    counter; -1 where none is known.

    Such a line (an HF Trainer log dict) is printed once its step has ended, and
    tqdm redraws the bar right after it: its counter is the first one after it,
    before the next such line; failing that, the last one before it, after the
    previous such line. Each counter places at most one line.
    """
    at = np.asarray(at, dtype=np.float64)
    out = np.full(len(at), -1, dtype=np.int64)
    if not len(positions) or not len(at):
        return out
    n = len(positions)
    nxt = np.append(at[1:], np.inf)
    k = np.searchsorted(positions, at, side="left")  # the first counter at or after each line
    after = (k < n) & (positions[np.minimum(k, n - 1)] < nxt)
    out[after] = k[after]
    # Counters since the previous line; the first of them is taken if the previous line took its "after".
    since_prev = k - np.searchsorted(positions, np.insert(at[:-1], 0, -np.inf), side="right")
    prev_took = np.insert(after[:-1], 0, False)
    before = ~after & (since_prev > prev_took.astype(np.int64))
    out[before] = k[before] - 1
    return out


def step_of_lines(positions: np.ndarray, steps: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The step of each line at ``at`` from its counter (``counter_of_lines``); -1 where none is known."""
    index = counter_of_lines(positions, at)
    return np.where(index >= 0, steps[np.maximum(index, 0)] if len(steps) else -1, -1)
