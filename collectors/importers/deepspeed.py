"""DeepSpeed engine logs: ``step=N, skipped=K, lr=[..]`` lines and fp16 loss-scale overflows.

DeepSpeed prints no per-step loss of its own; what it does print is the
loss-scaler's story. Read lines (everything else is noise):

- ``[TIME] ... step=N, skipped=K, lr=[a, b]`` -> a row at step N: ``lr`` (first
  group), ``skipped_steps`` (cumulative count), ``time`` (the line's timestamp,
  read as UTC: the log carries no zone).
- ``OVERFLOW! Rank 0 Skipping step. Attempted loss scale: X, reducing to Y`` and
  ``Overflow detected. Skipping step. Attempted loss scale: X, reducing to Y`` ->
  a row with ``found_inf`` true, ``loss_scale`` Y (the scale after the skipped
  step) and ``attempted_loss_scale`` X; ``... but hysteresis is H`` keeps X.
  The overflow's step is not printed: it lies between the ``step=`` lines around
  it, placed by its timestamp (or, before the first ``step=`` line, on the
  steps just before the next one), never on or before a step already logged.
- ``global_step=N, RunningAvgSamplesPerSec=.., CurrSamplesPerSec=..`` -> extras.
- ``Saving model checkpoint: PATH`` -> a checkpoint event (step from ``global_stepN``).
- DeepSpeed-Chat eval lines (``ppl: X``, ``chosen_last_scores ...: X, acc ...: Y``)
  -> ``val_ppl``, ``val_chosen_last_scores``, ``val_acc`` at the current step.
A ``step=`` counter going backwards or an hour without output starts a new segment.
Known limit: DeepSpeed-Chat PPO runs two engines (actor, critic) in one log;
their overflow lines cannot be told apart and their loss scales interleave.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import LONG_GAP_S, NUMBER_RE, build_table, read_lines

_N = NUMBER_RE
_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:,(\d+))?\]")
_STEP = re.compile(rf"\bstep=(\d+), skipped=(\d+), lr=\[\s*({_N})")
_OVERFLOW = re.compile(rf"(?:OVERFLOW!|Overflow detected\.).*?Attempted loss scale:\s*({_N}),\s*"
                       rf"(?:reducing to\s*({_N})|but hysteresis is)")
_TIMER = re.compile(rf"global_step=(\d+), RunningAvgSamplesPerSec=({_N}), CurrSamplesPerSec=({_N})")
_SAVE = re.compile(r"Saving model checkpoint:\s*(\S+)")
_PPL = re.compile(rf"^ppl:\s*({_N})\s*$")
_REWARD = re.compile(rf"chosen_last_scores \(higher is better\) :\s*({_N}), acc \(higher is better\) :\s*({_N})")
_ANY = r"step=\d|OVERFLOW!|Overflow detected|RunningAvgSamplesPerSec|Saving model checkpoint|^ppl:|chosen_last_scores"
# Lines that claim to be an overflow or step report; if the full pattern fails they are malformed.
_CLAIMS = ((re.compile(r"Attempted loss scale"), _OVERFLOW, "'Attempted loss scale: X, reducing to Y'"),
           (re.compile(r"\[Rank \d+\] step="), _STEP, "'step=N, skipped=K, lr=[...]'"))


def sniff(head: str) -> bool:
    """True when the head holds a DeepSpeed step report or loss-scale overflow line."""
    return re.search(r"\] step=\d+, skipped=\d+, lr=\[|OVERFLOW! Rank \d+ Skipping step|Overflow detected\. Skipping step", head) is not None


def _timestamp(line: str) -> float | None:
    m = _TIME.match(line)
    if not m:
        return None
    t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return t + (float(f"0.{m.group(2)}") if m.group(2) else 0.0)


def _scan(path: Path, skip: bool) -> tuple[list[tuple[int, str, tuple, float | None]], int]:
    """(line number, kind, groups, time) of every line this format reads, in file order."""
    lines = read_lines(path)
    idx = np.flatnonzero(pc.fill_null(pc.match_substring_regex(lines, _ANY), False).to_numpy(zero_copy_only=False))
    found, num_bad = [], 0
    for i, line in zip(idx.tolist(), lines.take(pa.array(idx)).to_pylist()):
        t = _timestamp(line)
        for kind, pattern in (("step", _STEP), ("overflow", _OVERFLOW), ("timer", _TIMER), ("save", _SAVE),
                              ("ppl", _PPL), ("reward", _REWARD)):
            m = pattern.search(line)
            if m:
                found.append((i + 1, kind, m.groups(), t))
                break
        else:
            for claim, _, expected in _CLAIMS:
                if claim.search(line):
                    if not skip:
                        raise LogFormatError(path, i + 1, f"expected {expected}, got {line[:200]!r}")
                    num_bad += 1
    return found, num_bad


def _overflow_steps(found: list, anchors: list[tuple[int, int, float | None]]) -> dict[int, int]:
    """Step of each overflow line (by line number), placed between the step= lines around it."""
    out: dict[int, int] = {}
    over = [(ln, t) for ln, kind, _, t in found if kind == "overflow"]
    lines_a = [a[0] for a in anchors]
    groups: dict[int, list[tuple[int, float | None]]] = {}
    for ln, t in over:
        groups.setdefault(int(np.searchsorted(lines_a, ln)), []).append((ln, t))
    for k, items in groups.items():
        prev = anchors[k - 1] if k > 0 else None
        nxt = anchors[k] if k < len(anchors) else None
        lo = prev[1] if prev else None
        if nxt is not None and (lo is None or nxt[1] <= lo):
            lo = None  # the counter restarted: these overflows belong before the next report
        m = len(items)
        for j, (ln, t) in enumerate(items, 1):
            if nxt is None:
                step = (lo or 0) + j
            elif lo is None:
                step = max(nxt[1] - m + j, j)
            elif t is not None and prev[2] is not None and nxt[2] is not None and nxt[2] > prev[2]:
                frac = (t - prev[2]) / (nxt[2] - prev[2])
                step = int(np.clip(np.ceil(lo + frac * (nxt[1] - lo)), lo + j, nxt[1] - m + j))
            else:
                step = min(lo + j, nxt[1])
            out[ln] = step
    # Strictly after the previous overflow of the same gap.
    last = None
    for ln in sorted(out):
        if last is not None and out[ln] <= out[last] and not any(a[0] in range(last, ln) for a in anchors):
            out[ln] = out[last] + 1
        last = ln
    return out


def _apply(row: dict, kind: str, g: tuple, t: float | None) -> None:
    if kind == "step":
        key = "lr" if "lr" not in row else "lr_2"  # a second engine (PPO critic) at the same step
        row[key] = float(g[2])
        row["skipped_steps" if key == "lr" else "skipped_steps_2"] = float(g[1])
        row.setdefault("time", t)
    elif kind == "overflow":
        row["found_inf"] = True
        row["attempted_loss_scale"] = float(g[0])
        row["loss_scale"] = float(g[1]) if g[1] is not None else float(g[0])
        if row.get("time") is None:
            row["time"] = t
    elif kind == "timer":
        row["samples_per_sec_avg"], row["samples_per_sec"] = float(g[1]), float(g[2])
    elif kind == "ppl":
        row["val_ppl"] = float(g[0])
    elif kind == "reward":
        row["val_chosen_last_scores"], row["val_acc"] = float(g[0]), float(g[1])


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    found, num_bad = _scan(path, skip_bad_lines)
    anchors = [(ln, int(g[0]), t) for ln, kind, g, t in found if kind == "step"]
    if not anchors and not any(k == "overflow" for _, k, _, _ in found):
        raise LogFormatError(path, None, f"no DeepSpeed step= or OVERFLOW lines found in {path}")
    over_steps = _overflow_steps(found, anchors)
    rows: dict[tuple[int, int], dict] = {}
    events: list[tuple[tuple[int, int], dict]] = []
    segment, current, last_t = 0, 0, None
    for ln, kind, g, t in found:
        if kind == "step":
            step = int(g[0])
            if step < current or (t is not None and last_t is not None and t - last_t > LONG_GAP_S):
                segment += 1
            current = step
        elif kind == "overflow":
            step = over_steps[ln]
        elif kind == "timer":
            step = int(g[0])
        else:
            step = current
        last_t = t if t is not None else last_t
        if kind == "save":
            m = re.search(r"global_step(\d+)", g[0])
            events.append(((segment, int(m.group(1)) if m else current),
                           {"event": "checkpoint", "step": int(m.group(1)) if m else current, "path": g[0], "time": t}))
            continue
        _apply(rows.setdefault((segment, step), {"step": step, "segment": segment}), kind, g, t)
    keys = sorted(rows)
    table = build_table(_columns([rows[k] for k in keys]))
    table = table.append_column("segment", pa.array([k[0] for k in keys], pa.int32()))
    evs = [{**ev, "segment": key[0], "row_index": int(np.searchsorted(np.array(keys).reshape(-1, 2)[:, 1], key[1]))}
           for key, ev in events]
    return ParsedLog(table, evs, num_bad)


def _columns(rows: list[dict]) -> dict[str, pa.Array]:
    names: list[str] = []
    for r in rows:
        names += [k for k in r if k not in names and k != "segment"]
    cols = {}
    for name in names:
        values = [r.get(name) for r in rows]
        typ = pa.int64() if name == "step" else pa.bool_() if name == "found_inf" else pa.float64()
        cols[name] = pa.array(values, typ)
    return cols


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    parts = [parse_file(Path(p), skip_bad_lines) for p in paths]
    if not parts:
        raise ValueError("no input files given")
    # Segments are explicit here: number them on across files (each file is a new process).
    offset, tables, events, skipped, rows = 0, [], [], 0, 0
    for p in parts:
        seg = pc.add(p.metrics["segment"], offset)
        tables.append(p.metrics.set_column(p.metrics.column_names.index("segment"), "segment", seg))
        events += [{**ev, "segment": ev["segment"] + offset, "row_index": ev["row_index"] + rows} for ev in p.events]
        offset = int(pc.max(seg).as_py()) + 1 if p.metrics.num_rows else offset + 1
        rows += p.metrics.num_rows
        skipped += p.num_skipped
    return ParsedLog(pa.concat_tables(tables, promote_options="permissive"), events, skipped)
