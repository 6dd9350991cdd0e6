"""Segments: every (re)start of training, its step range, and the steps a later resume abandoned.

Also turns the store's Arrow rows into plain per-column numpy arrays (NaN for
null, with a separate 'present' mask, because a NaN loss is data while a null
loss means "not logged at this step").
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.data.record import segment_cuts
from runwatch.detectors.config import LRConfig
from runwatch.detectors.divergence import trained_level
from runwatch.detectors.finding import SegmentInfo
from runwatch.detectors.registry import PERFORMANCE_KINDS

FLOAT_COLUMNS: tuple[str, ...] = ("time", "loss", "grad_norm", "loss_scale", "act_norm", "lr", "step_time",
                                  "samples", "tokens")


def infos_from_ranges(first: dict[int, int], last: dict[int, int],
                      resume_steps: dict[int, int] | None = None) -> list[SegmentInfo]:
    """Segment records from each segment's step range and resume steps (the record's ``segment_cuts``)."""
    cuts = segment_cuts(first, last, resume_steps or {})
    return [SegmentInfo(segment=k, first_step=first[k], last_step=last[k], abandoned_from=cuts[k]) for k in sorted(first)]


def segment_infos(rows: pa.Table, resume_steps: dict[int, int] | None = None) -> list[SegmentInfo]:
    """Each segment's first and last step and ``abandoned_from`` (see ``segment_cuts``)."""
    if rows.num_rows == 0:
        return []
    seg = rows["segment"].to_numpy(zero_copy_only=False).astype(np.int64) if "segment" in rows.column_names \
        else np.zeros(rows.num_rows, np.int64)
    steps = rows["step"].to_numpy(zero_copy_only=False).astype(np.int64)
    ids = np.unique(seg)
    first = {int(k): int(steps[seg == k].min()) for k in ids}
    last = {int(k): int(steps[seg == k].max()) for k in ids}
    return infos_from_ranges(first, last, resume_steps)


def on_main_line(steps: np.ndarray, segment: int, infos: list[SegmentInfo]) -> np.ndarray:
    """Which of one segment's rows lie on the main line (before the segment's cut)."""
    cut = next((s.abandoned_from for s in infos if s.segment == segment), None)
    return np.ones(len(steps), dtype=bool) if cut is None else steps < cut


def columns(table: pa.Table, shared: bool = False) -> dict[str, np.ndarray]:
    """Plain arrays for the detectors: ``step`` (int64), floats with NaN for null, ``<name>_present`` masks, ``found_inf``.

    With ``shared`` the arrays are read-only and need not be copies: a column without nulls is Arrow's own
    buffer where it can be, and one all-true mask, one NaN column and one all-false mask stand for every column
    that has them (``analyze`` reads them and never writes: 10 fresh 1M-row arrays fewer)."""
    n = table.num_rows
    step = table["step"].to_numpy(zero_copy_only=False)
    out: dict[str, np.ndarray] = {"step": np.asarray(step, dtype=np.int64) if shared else step.astype(np.int64)}
    cache: dict[str, np.ndarray] = {}

    def constant(kind: str) -> np.ndarray:  # a fresh array, or with ``shared`` one read-only array per kind
        if shared and kind in cache:
            return cache[kind]
        arr = np.ones(n, dtype=bool) if kind == "true" else np.zeros(n, dtype=bool) if kind == "false" \
            else np.full(n, np.nan)
        if shared:
            arr.flags.writeable = False
            cache[kind] = arr
        return arr

    for name in FLOAT_COLUMNS:
        if name in table.column_names:
            col = table[name]
            values = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
            if col.null_count == 0:  # the common case: one copy at most, no mask pass
                out[name + "_present"] = constant("true")
                out[name] = np.asarray(values, dtype=np.float64) if shared else np.array(values, dtype=np.float64)
                continue
            out[name + "_present"] = pc.is_valid(col).to_numpy(zero_copy_only=False)
            out[name] = np.where(out[name + "_present"], values.astype(np.float64), np.nan)
        else:
            out[name], out[name + "_present"] = constant("nan"), constant("false")
    if "found_inf" in table.column_names:
        out["found_inf_present"] = pc.is_valid(table["found_inf"]).to_numpy(zero_copy_only=False).astype(bool)
        out["found_inf"] = pc.fill_null(table["found_inf"], False).to_numpy(zero_copy_only=False).astype(bool)
    else:
        out["found_inf"], out["found_inf_present"] = constant("false"), constant("false")
    if shared:
        for arr in out.values():
            if arr.flags.writeable:
                arr.flags.writeable = False
    return out


def split_segments(rows: pa.Table) -> dict[int, dict[str, np.ndarray]]:
    """Each segment's own rows, sorted by step, as column arrays."""
    rows, spans, _ = _segment_spans(rows)
    return {k: columns(rows.slice(a, b - a)) for k, a, b in spans}


def _segment_spans(rows: pa.Table) -> tuple[pa.Table, list[tuple[int, int, int]], bool]:
    """(the rows sorted by segment and step, each segment's (id, first row, end row) in them, whether the rows
    came sorted already)."""
    if rows.num_rows == 0:
        return rows, [], True
    if "segment" not in rows.column_names:
        rows = rows.append_column("segment", pa.array(np.zeros(rows.num_rows, np.int32)))
    seg = rows["segment"].to_numpy(zero_copy_only=False).astype(np.int64)
    steps = rows["step"].to_numpy(zero_copy_only=False)
    ordered = _sorted_by(seg, steps)
    if not ordered:  # Store.rows is already ordered; sorting 1M rows costs 0.1 s
        rows = rows.sort_by([("segment", "ascending"), ("step", "ascending")])
        seg = rows["segment"].to_numpy(zero_copy_only=False).astype(np.int64)
    bounds = np.flatnonzero(np.diff(seg)) + 1
    starts = np.concatenate([[0], bounds])
    stops = np.concatenate([bounds, [len(seg)]])
    return rows, [(int(seg[a]), int(a), int(b)) for a, b in zip(starts, stops)], ordered


def read_rows(rows: pa.Table, resume_steps: dict[int, int] | None = None) \
        -> tuple[dict[int, dict[str, np.ndarray]], list[SegmentInfo], dict[str, np.ndarray]]:
    """``split_segments(rows)``, ``segment_infos(rows, resume_steps)`` and ``main_line(rows, those infos)``, with
    the rows converted to arrays once: the segments' ranges are their sorted steps' ends, and the main line is
    each segment's main rows in turn where the rows came in that order and its steps do not fall back (else it
    is read again from the rows, as ``main_line`` reads it)."""
    if rows.num_rows == 0:
        return {}, [], main_line(rows)
    table, spans, ordered = _segment_spans(rows)
    cols = {k: columns(table.slice(a, b - a), shared=True) for k, a, b in spans}
    infos = infos_from_ranges({k: int(c["step"][0]) for k, c in cols.items()},
                              {k: int(c["step"][-1]) for k, c in cols.items()}, resume_steps)
    if not ordered:
        return cols, infos, main_line(rows, infos)
    flag = pc.fill_null(rows["main"], False) if "main" in rows.column_names else None
    parts = []
    for k, a, b in spans:
        keep = flag.slice(a, b - a).to_numpy(zero_copy_only=False) if flag is not None \
            else on_main_line(cols[k]["step"], k, infos)
        # A segment wholly on the main line is shared, not copied (nothing writes to these arrays).
        parts.append(cols[k] if keep.all() else {name: v[keep] for name, v in cols[k].items()})
    main = dict(parts[0]) if len(parts) == 1 else {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    steps = main["step"]
    if len(steps) > 1 and not np.all(steps[1:] >= steps[:-1]):
        return cols, infos, main_line(rows, infos)
    return cols, infos, main


def _sorted_by(major: np.ndarray, minor: np.ndarray) -> bool:
    if len(major) < 2:
        return True
    dm, dn = np.diff(major), np.diff(minor)
    return bool(np.all((dm > 0) | ((dm == 0) & (dn >= 0))))


def main_line(rows: pa.Table, infos: list[SegmentInfo] | None = None) -> dict[str, np.ndarray]:
    """The main line (for every step, the row of the latest segment covering it), by step.

    Uses the store's ``main`` flag when the rows carry it, else ``infos`` (from ``segment_infos``).
    """
    if rows.num_rows == 0:
        return columns(rows)
    if "main" in rows.column_names:
        rows = rows.filter(pc.fill_null(rows["main"], False))
    else:
        infos = segment_infos(rows) if infos is None else infos
        seg = rows["segment"].to_numpy(zero_copy_only=False) if "segment" in rows.column_names \
            else np.zeros(rows.num_rows, np.int64)
        steps = rows["step"].to_numpy(zero_copy_only=False)
        keep = np.ones(rows.num_rows, dtype=bool)
        for k in np.unique(seg):
            at = seg == k
            keep[at] = on_main_line(steps[at], int(k), infos)
        rows = rows.filter(pa.array(keep))
    steps = rows["step"].to_numpy(zero_copy_only=False)
    if len(steps) > 1 and not np.all(np.diff(steps) >= 0):
        rows = rows.sort_by("step")
    return columns(rows)


HISTORY_OBS = 256
"""Observations of the parent's healthy loss history a resumed segment's detectors start from (16 blocks)."""
LOSS_SERIES = ("step", "loss", "grad_norm", "act_norm", "lr")


def skipped_steps(scale: np.ndarray, found_inf: np.ndarray, prev_scale: float) -> tuple[np.ndarray, float]:
    """Which rows the fp16 scaler skipped (found_inf, or the scale halved there: no optimizer step ran, so an inf
    gradient norm there is no NaN incident and its time no normal step time), and the last logged scale."""
    known = np.concatenate([[prev_scale], scale])
    logged = np.isfinite(scale)
    if logged.all():  # every row logs it (fp16): nothing to fill
        last_logged = known
    elif not logged.any():  # none does (bf16, fp32): the scale before these rows throughout
        last_logged = np.full(len(known), known[0])
    else:
        idx = np.maximum.accumulate(np.where(np.isfinite(known), np.arange(len(known)), 0))
        last_logged = known[idx]  # the last logged scale up to each row (forward fill)
    with np.errstate(invalid="ignore"):
        return found_inf | (scale < last_logged[:-1]), float(last_logged[-1])


def step_times(steps: np.ndarray, time: np.ndarray, skip: np.ndarray,
               logged: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(step, step time) of rows whose time is known, as the slowdown detector reads them: the step time the log
    has (``logged``, where it has one), else the wall time since the previous timed row over the steps between;
    steps the scaler skipped left out."""
    if logged is not None:
        keep = np.isfinite(logged) & (logged > 0) & ~skip
        return steps[keep], logged[keep]
    timed = np.isfinite(time)
    at, t, sk = (steps, time, skip) if timed.all() else (steps[timed], time[timed], skip[timed])
    with np.errstate(invalid="ignore", divide="ignore"):
        per = np.diff(t) / np.diff(at)
    keep = np.isfinite(per) & (per > 0) & ~sk[1:]
    return (at[1:], per) if keep.all() else (at[1:][keep], per[keep])  # no masked copy of a long clean stretch


def parent_history(segment: int, first_step: int, cols: dict[int, dict[str, np.ndarray]], resumes: dict[int, int],
                   findings: list, lrc: LRConfig, step_time_obs: int = 0
                   ) -> tuple[dict[str, dict[str, np.ndarray]], int | None, float]:
    """The parent's healthy observations up to the resume step, by series, for a resumed segment's detectors.

    The parent is the latest earlier segment whose rows cover the step resumed
    from (the resume event's checkpoint step; without one, the step before the
    segment's first). Its loss observations inside any of its loss findings are
    left out, so a parent that was mid-spike at the checkpoint gives the level
    before the spike, against which a bad resume stands out. Its step times
    (the last ``step_time_obs``) outside its slowdowns and stalls are the run's
    normal speed and variability, which a resumed segment would otherwise have
    to learn again: the same job on the same kind of machines (a shared host's
    wander, measured over the parent's hundreds of steps, is known from the first
    step after the resume). With them, the highest LR the run trained at on its
    main line up to the resume (``main_line_trained_lr``). Returns ({series:
    columns}, the resume step, that LR).
    """
    resume_step = resumes.get(segment)
    step = resume_step if resume_step is not None else first_step - 1
    k = _parent(segment, step, cols)
    if k is None:
        return {}, resume_step, -np.inf
    c, out = cols[k], {}
    own, upto = [f for f in findings if f.segment == k], c["step"] <= step
    keep = c["loss_present"] & upto & _outside(c["step"], [
        f for f in own if f.severity != "info" and f.kind not in PERFORMANCE_KINDS])
    idx = np.flatnonzero(keep)[-HISTORY_OBS:]
    if len(idx):
        out["loss"] = {name: c[name][idx] for name in LOSS_SERIES}
    if step_time_obs and upto.any():
        skip, _ = skipped_steps(c["loss_scale"][upto], c["found_inf"][upto], np.nan)
        logged = c["step_time"][upto] if c["step_time_present"].any() else None
        at, per = step_times(c["step"][upto], c["time"][upto], skip, logged)
        normal = _outside(at, [f for f in own if f.kind in PERFORMANCE_KINDS])
        if normal.any():
            out["step_time"] = {"step": at[normal][-step_time_obs:], "step_time": per[normal][-step_time_obs:]}
    return out, step, main_line_trained_lr(segment, step, cols, resumes, lrc)


def _parent(segment: int, step: int, cols: dict[int, dict[str, np.ndarray]]) -> int | None:
    """The latest segment before ``segment`` whose rows cover ``step`` (or end at the step before it), or None."""
    parents = [k for k in cols if k < segment and len(cols[k]["step"])
               and int(cols[k]["step"][0]) <= step <= int(cols[k]["step"][-1]) + 1]
    return max(parents) if parents else None


def main_line_trained_lr(segment: int, step: int, cols: dict[int, dict[str, np.ndarray]], resumes: dict[int, int],
                         lrc: LRConfig) -> float:
    """The highest LR the run trained at (``divergence.trained_level``) on the main line a segment resumed at
    ``step`` continues: its parent's rows up to the step, that parent's parent's up to where the parent resumed,
    and so on back to the run's start. A warm restart returns the LR to the schedule's peak, which a long run
    held long before the history a resumed segment is seeded with (fresh seed 141563's run 112: a peak at
    115-130, a resume at 480 seeded from 225 on, a restart to the peak at 964 read as an LR raised x20)."""
    level = -np.inf
    k = _parent(segment, step, cols)
    while k is not None:
        c = cols[k]
        upto = c["step"] <= step
        level = max(level, trained_level(c["step"][upto], c["lr"][upto], lrc))
        segment, step = k, resumes.get(k, int(c["step"][0]) - 1)
        k = _parent(segment, step, cols)
    return level


def _outside(steps: np.ndarray, findings: list) -> np.ndarray:
    """Which of ``steps`` lie outside every finding's [onset, end]."""
    out = np.ones(len(steps), bool)
    for f in findings:
        out &= (steps < f.onset_step) | (steps > f.end_step)
    return out
