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

from runwatch.collectors.importers.textlog import matches

# tqdm's default bar: "{desc}: {percent}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}]".
_TQDM = re.compile(r"\d+%\|[^|\r\n]*\| *(\d+)/(\d+) \[")
_TQDM_RE2 = r"\d%\|[^|\r\n]*\| *\d+/\d+ \["
_DEEPSPEED = r"\bstep=(?P<step>\d+), skipped=\d+, lr=\["
_MEGATRON = r"^\s*(?:\[default\d+\]:)?\s*(?:samples/sec:[^|]*\|\s*)?iteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|"


def position(line_index: int, start: int, length: int) -> float:
    """The stream position of text starting at ``start`` in a line of ``length`` characters."""
    return line_index + start / (length + 1)


def _regex_counters(lines: pa.Array, pattern: str, literal: str) -> tuple[np.ndarray, np.ndarray]:
    """(positions, steps) of the lines matching ``pattern`` (group ``step``), placed where ``literal`` starts."""
    idx = np.flatnonzero(matches(lines, pattern))
    if not len(idx):
        return np.zeros(0), np.zeros(0, np.int64)
    hit = lines.take(pa.array(idx, pa.int64()))
    steps = pc.cast(pc.extract_regex(hit, pattern).field("step"), pa.int64()).to_numpy(zero_copy_only=False)
    at = np.maximum(pc.find_substring(hit, literal).to_numpy(zero_copy_only=False), 0)
    length = pc.utf8_length(hit).to_numpy(zero_copy_only=False)
    # find_substring counts bytes, utf8_length characters: clip so a position never reaches the next line.
    return idx + np.minimum(at, length) / (length + 1), steps


def _bars(lines: pa.Array) -> list[tuple[float, int, int]]:
    """(position, count, total) of every tqdm bar update."""
    idx = np.flatnonzero(matches(lines, _TQDM_RE2))
    out = []
    for i, text in zip(idx.tolist(), lines.take(pa.array(idx, pa.int64())).to_pylist()):
        out += [(position(i, m.start(), len(text)), int(m.group(1)), int(m.group(2))) for m in _TQDM.finditer(text)]
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


def find_counters(lines: pa.Array, near: np.ndarray | None = None, *,
                  kinds: tuple[str, ...] = ("tqdm", "deepspeed", "megatron")) -> tuple[np.ndarray, np.ndarray]:
    """(positions, steps) of the step counters of ``kinds`` in ``lines``, in stream order.

    ``near`` are the positions of the lines that need a step; they choose the
    training bar among several tqdm bars.
    """
    parts = []
    if "tqdm" in kinds:
        bars = _bars(lines)
        total = _training_total(bars, np.zeros(0) if near is None else np.asarray(near, dtype=np.float64))
        chosen = [(p, n) for p, n, t in bars if t == total]
        parts.append((np.array([p for p, _ in chosen]), np.array([n for _, n in chosen], np.int64)))
    if "deepspeed" in kinds:
        parts.append(_regex_counters(lines, _DEEPSPEED, "step="))
    if "megatron" in kinds:
        parts.append(_regex_counters(lines, _MEGATRON, "iteration"))
    pos = np.concatenate([p for p, _ in parts]) if parts else np.zeros(0)
    steps = np.concatenate([s for _, s in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
    order = np.argsort(pos, kind="stable")
    return pos[order], steps[order]


def step_of_lines(positions: np.ndarray, steps: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The step of each line at ``at`` (sorted) that prints after its step's counter; -1 where none is known.

    Such a line (an HF Trainer log dict) is printed once its step has ended, and
    tqdm redraws the bar right after it: its step is the first counter after it,
    before the next such line; failing that, the last counter before it, after
    the previous such line. A counter shared with a neighbour places neither.
    """
    at = np.asarray(at, dtype=np.float64)
    out = np.full(len(at), -1, dtype=np.int64)
    if not len(steps) or not len(at):
        return out
    nxt = np.append(at[1:], np.inf)
    prev = np.insert(at[:-1], 0, -np.inf)
    k = np.searchsorted(positions, at, side="left")
    after = (k < len(steps)) & (positions[np.minimum(k, len(steps) - 1)] < nxt)
    out[after] = steps[k[after]]
    before = ~after & (k > 0) & (positions[np.maximum(k - 1, 0)] > prev)
    out[before] = steps[k[before] - 1]
    return out
