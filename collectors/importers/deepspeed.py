"""DeepSpeed engine logs: ``step=N, skipped=K, lr=[..]`` lines and fp16 loss-scale overflows.

DeepSpeed prints no per-step loss of its own; what it does print is the
loss-scaler's story. Read lines (everything else is noise):

- ``[TIME] ... step=N, skipped=K, lr=[a, b]`` -> a row at step N: ``lr`` (first
  group), ``skipped_steps`` (cumulative count), ``time`` (the line's timestamp,
  read as UTC: the log carries no zone). The engine prints it at the end of
  step N (every ``steps_per_print`` steps), skipped steps included.
- An overflow, in each spelling DeepSpeed's scalers print it: ``OVERFLOW! Rank 0
  Skipping step. Attempted loss scale: X, reducing to Y`` (ZeRO, the dynamic
  scaler), ``Overflow detected. Skipping step. Attempted loss scale: X, reducing
  to Y`` and ``fp16 dynamic loss scale overflow! Skipping step. Attempted loss
  scale: X, reducing to Y`` (the fused/unfused fp16 optimizers) -> a row with
  ``found_inf`` true, ``loss_scale`` Y (the scale after the skipped step) and
  ``attempted_loss_scale`` X; ``... but hysteresis is H`` keeps X; a bare
  ``OVERFLOW! Rank 0 Skipping step.`` (no scale printed) is ``found_inf`` alone.
  Another rank's copy of the line is counted as ignored, not read twice.
- ``global_step=N, RunningAvgSamplesPerSec=.., CurrSamplesPerSec=..`` -> extras.
- ``Saving model checkpoint: PATH`` -> a checkpoint event at N, from the
  ``global_stepN`` tag in the path: the engine names a checkpoint after the
  number of steps it has taken, so it holds the state after update N (the
  record's contract; the next step logged is N+1).
- DeepSpeed-Chat eval lines (``ppl: X``, ``chosen_last_scores ...: X, acc ...: Y``)
  -> ``val_ppl``, ``val_chosen_last_scores``, ``val_acc`` at the current step.

Steps: an overflow line prints no step. It takes its step from the step
counters around it in the stream (``stepcount``): DeepSpeed's own ``step=``
reports, a tqdm training bar and Megatron iteration lines printed by the same
job, each printed at the end of its step. An overflow after counter a and
before counter b happened in a step of (a, b]: the step after a when the
counters are dense (a tqdm bar), else placed by its timestamp between the two
reports, never on or before a step already logged. Without any counter in the
file the overflows are numbered in order and the reading says so
(``ordinal_steps``). A counter going backwards or an hour without output
starts a new segment.
Known limit: DeepSpeed-Chat PPO runs two engines (actor, critic) in one log;
their overflow lines cannot be told apart and their loss scales interleave.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.stepcount import find_counters, position
from runwatch.collectors.importers.textlog import (
    LONG_GAP_S,
    NUMBER_RE,
    build_table,
    concat_positions,
    lines_containing,
    read_text,
)

_N = NUMBER_RE
_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:,(\d+))?\]")
_STEP = re.compile(rf"\bstep=(\d+), skipped=(\d+), lr=\[\s*({_N})")
_OVERFLOW = re.compile(rf"(?:OVERFLOW!(?:\s+Rank\s+(?P<rank>\d+))?|Overflow detected\.|loss scale overflow!)\s*Skipping step\.?"
                       rf"(?:\s*Attempted loss scale:\s*(?P<attempted>{_N}),\s*"
                       rf"(?:reducing to\s*(?P<new>{_N})|but hysteresis is))?")
_TIMER = re.compile(rf"global_step=(\d+), RunningAvgSamplesPerSec=({_N}), CurrSamplesPerSec=({_N})")
_SAVE = re.compile(r"Saving model checkpoint:\s*(\S+)")
_PPL = re.compile(rf"^ppl:\s*({_N})\s*$")
_REWARD = re.compile(rf"chosen_last_scores \(higher is better\) :\s*({_N}), acc \(higher is better\) :\s*({_N})")
# Every overflow spelling DeepSpeed prints holds "Skipping step" and one of these.
OVERFLOW_MARK = "Skipping step"
OVERFLOW_LITERALS = ("OVERFLOW!", "Overflow detected", "loss scale overflow!")
_LITERALS = ("step=", OVERFLOW_MARK, "Attempted loss scale", "RunningAvgSamplesPerSec", "Saving model checkpoint", "ppl:",
             "chosen_last_scores")
_KINDS = (("step", _STEP), ("overflow", _OVERFLOW), ("timer", _TIMER), ("save", _SAVE), ("ppl", _PPL),
          ("reward", _REWARD))
# Lines that claim to be an overflow or step report; if the full pattern fails they are malformed.
_CLAIMS = ((re.compile(r"Attempted loss scale"), "'Attempted loss scale: X, reducing to Y'"),
           (re.compile(r"\[Rank \d+\] step="), "'step=N, skipped=K, lr=[...]'"))


def sniff(head: str) -> bool:
    """True when the head holds a DeepSpeed step report or loss-scale overflow line."""
    if "step=" not in head and "Skipping step" not in head:  # cheap literal test before the regex
        return False
    return re.search(r"\] step=\d+, skipped=\d+, lr=\[|OVERFLOW! Rank \d+ Skipping step|Overflow detected\. Skipping step"
                     r"|loss scale overflow! Skipping step", head) is not None


def _timestamp(line: str) -> float | None:
    """Unix seconds of the line's ``[YYYY-MM-DD HH:MM:SS,mmm]`` prefix (UTC); an impossible date is no time."""
    m = _TIME.match(line)
    if not m:
        return None
    ts = m.group(1)
    y, mo, d, h, mi, sec = int(ts[0:4]), int(ts[5:7]), int(ts[8:10]), int(ts[11:13]), int(ts[14:16]), int(ts[17:19])
    if not (y >= 1 and 1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1] and h < 24 and mi < 60 and sec < 62):
        return None
    # calendar.timegm, not strptime: strptime costs several times more per line.
    return calendar.timegm((y, mo, d, h, mi, sec)) + (float(f"0.{m.group(2)}") if m.group(2) else 0.0)


def _claimed(line: str, kind: str, m: re.Match) -> bool:
    """A match that is only part of what the line claims: an overflow whose scale does not parse."""
    return kind == "overflow" and m["attempted"] is None and "Attempted loss scale" in line


def _scan(path: Path, skip: bool) -> tuple[list[tuple[float, str, re.Match, float | None]], int, int, pa.Array,
                                            bytes | None]:
    """(position, kind, match, time) of every line this format reads, in file order; bad and ignored counts;
    the file's lines and bytes."""
    lines, raw = read_text(path)
    # Bytes searches for the literals every read line holds (far faster than a regex over every line).
    idx = np.unique(np.concatenate([lines_containing(lines, raw, literal) for literal in _LITERALS]))
    found, num_bad, num_ignored = [], 0, 0
    for i, line in zip(idx.tolist(), lines.take(pa.array(idx, pa.int64())).to_pylist()):
        t = _timestamp(line)
        for kind, pattern in _KINDS:
            m = pattern.search(line)
            if m and not _claimed(line, kind, m):
                if kind == "overflow" and m["rank"] not in (None, "0"):
                    num_ignored += 1  # every rank prints the same overflow; rank 0's copy is read
                else:
                    found.append((position(i, m.start(), len(line)), kind, m, t))
                break
        else:
            for claim, expected in _CLAIMS:
                if claim.search(line):
                    if not skip:
                        raise LogFormatError(path, i + 1, f"expected {expected}, got {line[:200]!r}")
                    num_bad += 1
                    break
    return found, num_bad, num_ignored, lines, raw


def _by_time(t: float | None, at: float, timed: list[tuple[float, int, float | None]],
             timed_at: np.ndarray) -> float | None:
    """The step an overflow at time ``t`` (position ``at``) reaches between the timed counters around it."""
    if t is None or not timed:
        return None
    k = int(np.searchsorted(timed_at, at, side="right"))
    if k == 0 or k == len(timed):
        return None
    (_, s0, t0), (_, s1, t1) = timed[k - 1], timed[k]
    if not (s1 > s0 and t1 > t0):
        return None
    return s0 + (t - t0) / (t1 - t0) * (s1 - s0)


def _overflow_steps(over: list[tuple[float, float | None]], anchors: list[tuple[float, int, float | None]]) -> list[int]:
    """Step of each overflow (position, time), between the step counters (position, step, time) around it."""
    at = np.array([a[0] for a in anchors], dtype=np.float64)
    timed = [a for a in anchors if a[2] is not None]
    timed_at = np.array([a[0] for a in timed], dtype=np.float64)
    gaps = np.searchsorted(at, np.array([p for p, _ in over], dtype=np.float64), side="right")
    out: list[int] = []
    for k in dict.fromkeys(gaps.tolist()):  # gaps in stream order (overflows are sorted)
        items = [over[i] for i in np.flatnonzero(gaps == k)]
        lo = anchors[k - 1][1] if k > 0 else None
        hi = anchors[k][1] if k < len(anchors) else None
        if hi is not None and (lo is None or hi <= lo):
            lo = None  # the counter restarted: these overflows belong before the next counter
        m, last = len(items), None
        for j, (pos, t) in enumerate(items, 1):
            if hi is None:
                step = (lo or 0) + j
            elif lo is None:
                step = max(hi - m + j, j)
            else:
                guess = _by_time(t, pos, timed, timed_at)
                step = min(lo + j, hi) if guess is None else int(np.clip(np.ceil(guess), lo + j, max(hi - m + j, lo + j)))
            if last is not None and step <= last:  # strictly after the previous overflow of the gap
                step = last + 1 if hi is None else min(last + 1, hi)
            out.append(step)
            last = step
    return out


def _apply(row: dict, kind: str, m: re.Match, t: float | None) -> None:
    g = m.groups()
    if kind == "step":
        key = "lr" if "lr" not in row else "lr_2"  # a second engine (PPO critic) at the same step
        row[key] = float(g[2])
        row["skipped_steps" if key == "lr" else "skipped_steps_2"] = float(g[1])
        row.setdefault("time", t)
    elif kind == "overflow":
        row["found_inf"] = True
        if m["attempted"] is not None:
            row["attempted_loss_scale"] = float(m["attempted"])
            row["loss_scale"] = float(m["new"]) if m["new"] is not None else float(m["attempted"])
        if row.get("time") is None:
            row["time"] = t
    elif kind == "timer":
        row["samples_per_sec_avg"], row["samples_per_sec"] = float(g[1]), float(g[2])
    elif kind == "ppl":
        row["val_ppl"] = float(g[0])
    elif kind == "reward":
        row["val_chosen_last_scores"], row["val_acc"] = float(g[0]), float(g[1])


def _stream(path: Path, skip_bad_lines: bool) -> tuple[list, dict[float, int], bool, int, int]:
    """Read lines and step counters in stream order, the step of each overflow, whether steps are ordinals,
    and the bad and ignored line counts.

    Items are (position, kind, payload, time); a counter's payload is its step, a read line's its match.
    """
    found, num_bad, num_ignored, lines, raw = _scan(path, skip_bad_lines)
    over = [(pos, t) for pos, kind, _, t in found if kind == "overflow"]
    # Counters printed by the job's other tools (a tqdm bar, Megatron iterations) place overflows; the other
    # lines carry their own step, so without an overflow there is nothing to place (and no pass to pay for).
    counters = list(zip(*find_counters(lines, np.array([p for p, _ in over]), raw=raw, kinds=("tqdm", "megatron")))) \
        if over else []
    if not any(kind in ("step", "overflow") for _, kind, _, _ in found) and not num_bad:
        raise LogFormatError(path, None, f"no DeepSpeed step= or OVERFLOW lines found in {path}")
    stream = sorted([(pos, kind, m, t) for pos, kind, m, t in found]
                    + [(float(pos), "counter", int(step), None) for pos, step in counters], key=lambda x: x[0])
    anchors = [(pos, int(m.group(1)) if kind == "step" else m, t) for pos, kind, m, t in stream
               if kind in ("step", "counter")]
    over_steps = dict(zip([p for p, _ in over], _overflow_steps(over, anchors)))
    return stream, over_steps, bool(over) and not anchors, num_bad, num_ignored


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    stream, over_steps, ordinal, num_bad, num_ignored = _stream(path, skip_bad_lines)
    rows: dict[tuple[int, int], dict] = {}
    first_seen: dict[tuple[int, int], float] = {}
    events: list[tuple[tuple[int, int], dict]] = []
    segment, current, last_t = 0, 0, None
    for pos, kind, m, t in stream:
        if kind in ("step", "counter"):
            step = int(m.group(1)) if kind == "step" else m
            if step < current or (t is not None and last_t is not None and t - last_t > LONG_GAP_S):
                segment += 1
            current = step
        elif kind == "overflow":
            step = over_steps[pos]
        elif kind == "timer":
            step = int(m.group(1))
        else:
            step = current
        last_t = t if t is not None else last_t
        if kind == "counter":
            continue
        if kind == "save":
            tag = re.search(r"global_step(\d+)", m.group(1))
            at = int(tag.group(1)) if tag else current
            events.append(((segment, at), {"event": "checkpoint", "step": at, "path": m.group(1), "time": t}))
            continue
        key = (segment, step)
        first_seen.setdefault(key, pos)
        _apply(rows.setdefault(key, {"step": step, "segment": segment}), kind, m, t)
    keys = sorted(rows)
    # Every line of this format was malformed and skipped: nothing to read, but the skips are counted.
    table = build_table(_columns([rows[k] for k in keys]) if keys else {"step": pa.array([], pa.int64())})
    table = table.append_column("segment", pa.array([k[0] for k in keys], pa.int32()))
    order = np.array(keys, dtype=np.int64).reshape(-1, 2)
    evs = [{**ev, "segment": key[0], "row_index": int(np.searchsorted(order[:, 1], key[1]))} for key, ev in events]
    return ParsedLog(table, evs, num_bad, positions=np.array([first_seen[k] for k in keys]), ordinal_steps=ordinal,
                     num_ignored=num_ignored)


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
    return ParsedLog(pa.concat_tables(tables, promote_options="permissive"), events, skipped,
                     positions=concat_positions(parts), ordinal_steps=any(p.ordinal_steps for p in parts),
                     num_ignored=sum(p.num_ignored for p in parts))
