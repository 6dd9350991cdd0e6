"""The ``key: value | key: value`` fields of Megatron lines, and its checkpoint/resume lines.

Split from ``megatron.py`` so each stays small: this module turns the field
text of many lines into record columns in a few vectorised passes (split on
``|``, one RE2 extract, one pivot per distinct key) and finds events.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError
from runwatch.collectors.importers.textlog import NUMBER_RE, sanitize_name, select, to_int

# Field keys with all whitespace removed (hard-wrapping can drop or keep a space) -> (column, scale).
TRAIN_KEYS: dict[str, tuple[str, float]] = {
    "lmloss": ("loss", 1.0),
    "loss": ("loss", 1.0),
    "gradnorm": ("grad_norm", 1.0),
    "lossscale": ("loss_scale", 1.0),
    "learningrate": ("lr", 1.0),
    "consumedsamples": ("samples", 1.0),
    "consumedtokens": ("tokens", 1.0),
    "elapsedtimeperiteration(ms)": ("step_time", 1e-3),
    "elapsedtimeperiteration(s)": ("step_time", 1.0),
    "numberofskippediterations": ("skipped_iterations", 1.0),
    "numberofnaniterations": ("nan_iterations", 1.0),
    "globalbatchsize": ("global_batch_size", 1.0),
    "numzeros": ("num_zeros", 1.0),
    "samplespersecond": ("samples_per_second", 1.0),
    "tflops": ("tflops", 1.0),
}
VAL_KEYS: dict[str, tuple[str, float]] = {
    "lmlossvalue": ("val_loss", 1.0),
    "lmlossppl": ("val_ppl", 1.0),
}
_FIELD = rf"^(?P<key>[^:]*[A-Za-z)][^:]*?)\s*:\s*(?P<val>{NUMBER_RE})$"
_INT_COLUMNS = ("samples", "tokens")


def _column_name(norm_key: str, raw_key: str, prefix: str) -> tuple[str, float]:
    table = VAL_KEYS if prefix else TRAIN_KEYS
    if norm_key in table:
        return table[norm_key]
    return sanitize_name(raw_key, prefix), 1.0


def fields_to_columns(parts: pa.StructArray, idx: np.ndarray, path: Path, skip: bool,
                      prefix: str) -> tuple[dict[str, pa.Array], np.ndarray]:
    """Record columns of ``len(idx)`` lines from their ``step``, ``rank`` and ``rest`` groups.

    Returns the columns (only good lines) and the mask of good lines; with
    ``skip`` false the first malformed field raises naming its line.
    """
    n = len(idx)
    good = np.ones(n, dtype=bool)
    lists = pc.split_pattern(parts.field("rest"), "|")
    flat = pc.utf8_trim_whitespace(pc.list_flatten(lists))
    parent = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    nonempty = pc.not_equal(flat, "").to_numpy(zero_copy_only=False)
    flat, parent = flat.filter(pa.array(nonempty)), parent[nonempty]
    kv = pc.extract_regex(flat, _FIELD)
    ok = pc.is_valid(kv).to_numpy(zero_copy_only=False)
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        if not skip:
            raise LogFormatError(path, int(idx[parent[bad]]) + 1,
                                 f"expected 'key: number' fields between '|', got {flat[bad].as_py()[:120]!r}")
        good[parent[~ok]] = False
    keys, values = kv.field("key"), kv.field("val")
    norm = pc.replace_substring_regex(pc.utf8_lower(keys), r"\s+", "")
    floats = pc.cast(pc.if_else(pa.array(ok), values, pa.scalar("nan")), pa.float64()).to_numpy(zero_copy_only=False)
    columns: dict[str, np.ndarray] = {}
    valid: dict[str, np.ndarray] = {}
    encoded = pc.dictionary_encode(norm)
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    for code, key in enumerate(encoded.dictionary.to_pylist()):
        sel = ok & (codes == code)
        if key is None or not sel.any():
            continue
        raw = keys.filter(pa.array(sel))[0].as_py()
        name, scale = _column_name(key, " ".join(raw.split()), prefix)
        col = columns.setdefault(name, np.full(n, np.nan))
        val = valid.setdefault(name, np.zeros(n, dtype=bool))
        col[parent[sel]] = floats[sel] * scale
        val[parent[sel]] = True
    out: dict[str, pa.Array] = {"step": to_int(parts.field("step"), idx + 1, path, "iteration")}
    for name, col in columns.items():
        out[name] = pa.array(col, mask=~valid[name])
    for name in _INT_COLUMNS:
        if name in out:
            out[name] = _as_int(out[name], idx, path, name)
    if "skipped_iterations" in out:
        out["found_inf"] = pc.greater(out["skipped_iterations"], 0.0)
    rank = parts.field("rank")
    if pc.any(pc.not_equal(rank, "")).as_py():
        out["rank"] = pc.cast(pc.if_else(pc.equal(rank, ""), "0", rank), pa.int32())
    mask = pa.array(good)
    return {k: v.filter(mask) for k, v in out.items()}, good


def _as_int(values: pa.Array, idx: np.ndarray, path: Path, name: str) -> pa.Array:
    """Counters (consumed samples/tokens) must be whole numbers."""
    arr = values.to_numpy(zero_copy_only=False)
    valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        bad = valid & (~np.isfinite(arr) | (arr != np.floor(arr)) | (np.abs(arr) > 2**62))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise LogFormatError(path, int(idx[i]) + 1, f"expected an integer for {name!r}, got {arr[i]!r}")
    return pc.cast(values, pa.int64())


def _matches(lines: pa.Array, literal: str, pattern: str) -> tuple[np.ndarray, pa.StructArray]:
    idx = select(lines, literal, pattern)
    return idx, pc.extract_regex(lines.take(pa.array(idx)), pattern)


def find_events(lines: pa.Array, row_lines: np.ndarray) -> tuple[list[dict], set[int]]:
    """Checkpoint saves and loads; ``row_lines`` are the line indices of the metric rows."""
    found: list[tuple[int, dict]] = []
    idx, parts = _matches(lines, "saving checkpoint", r"(?:^|\s)saving checkpoint at iteration\s+(?P<step>\d+)\s+to\s+(?P<path>\S+)")
    for i, p in zip(idx, parts.to_pylist()):
        found.append((int(i), {"event": "checkpoint", "step": int(p["step"]), "path": p["path"]}))
    idx, parts = _matches(lines, "Saving model checkpoint", r"Saving model checkpoint:\s+(?P<path>\S*global_step(?P<step>\d+)\S*)")
    by_step = {ev["step"]: ev for _, ev in found}
    for i, p in zip(idx, parts.to_pylist()):
        step = int(p["step"])
        if step in by_step:
            by_step[step].setdefault("file", p["path"])
        else:
            by_step[step] = {"event": "checkpoint", "step": step, "path": p["path"]}
            found.append((int(i), by_step[step]))
    found.sort(key=lambda x: x[0])
    idx, parts = _matches(lines, "save-checkpoint", r"save-checkpoint:\s*(?P<ms>[0-9.]+)")
    for i, p in zip(idx, parts.to_pylist()):
        before = [ev for line, ev in found if line < i]
        if before:
            before[-1]["write_seconds"] = float(p["ms"]) / 1000.0
    breaks: set[int] = set()
    idx, parts = _matches(lines, "loaded checkpoint", r"loaded checkpoint from\s+(?P<path>\S+).*?at iteration\s+(?P<step>\d+)")
    for i, p in zip(idx, parts.to_pylist()):
        pos = int(np.searchsorted(row_lines, i))
        found.append((int(i), {"event": "resume", "step": int(p["step"]), "path": p["path"]}))
        breaks.add(pos)
    found.sort(key=lambda x: x[0])
    events = [{**ev, "row_index": int(np.searchsorted(row_lines, line))} for line, ev in found]
    return events, breaks
