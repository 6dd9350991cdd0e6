"""The ``key: value | key: value`` fields of Megatron lines, and its checkpoint/resume lines.

Split from ``megatron.py`` so each stays small: this module turns the field
text of many lines into record columns in a few vectorised passes (one C++
split on ``|``, fields cut at their colon by position, one cast of all values
with the number regex only for non-finite ones, keys handled once per distinct
key, one scatter into a line x key grid) and finds events (literal byte search
of the raw file, RE2 only on the hit lines).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runwatch.collectors.importers.base import LogFormatError
from runwatch.collectors.importers.textlog import (
    NUMBER_RE,
    ints_or_error,
    lines_containing,
    offsets,
    sanitize_name,
    spans,
)

# Field keys with all whitespace removed (hard-wrapping can drop or keep a space) -> (column, scale).
TRAIN_KEYS: dict[str, tuple[str, float]] = {
    "lmloss": ("loss", 1.0),
    "lm_loss": ("loss", 1.0),  # GPT-NeoX
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
# Evaluation keys -> column after the line's prefix (``val_``, ``test_``, ``val_<set>_``).
VAL_KEYS: dict[str, tuple[str, float]] = {
    "lmlossvalue": ("loss", 1.0),
    "lmlossppl": ("ppl", 1.0),
    "lm_lossvalue": ("loss", 1.0),  # GPT-NeoX "validation results at iteration N | lm_loss value: X"
    "lm_loss_pplvalue": ("ppl", 1.0),
}
# GPT-NeoX prints its FLOP rate human-readable ("150.3TFLOPS"): the prefix scales it to FLOP/s.
_FLOPS = r"^\s*(?P<num>[0-9.]+(?:[eE][+-]?\d+)?)\s*(?P<prefix>[KMGTPE]?)FLOPS\s*$"
_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_VALUE = rf"^\s*{NUMBER_RE}$"
_INT_COLUMNS = ("samples", "tokens")
_HAS_NAME = re.compile(r"[A-Za-z)]")


def _column_name(norm_key: str, raw_key: str, prefix: str) -> tuple[str, float]:
    if prefix and norm_key in VAL_KEYS:
        name, scale = VAL_KEYS[norm_key]
        return prefix + name, scale
    if not prefix and norm_key in TRAIN_KEYS:
        return TRAIN_KEYS[norm_key]
    return sanitize_name(raw_key, prefix), 1.0


def split_pieces(texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Every ``|``-separated piece of every line, untrimmed, and each line's piece offsets (from 0)."""
    lists = pc.split_pattern(texts, "|")
    loff = offsets(lists)
    return pc.list_flatten(lists), loff - loff[0]


def _fields(flat: pa.Array, loff: np.ndarray, lines_ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pieces that are fields (not a line's head, not blank, on a good line) and the good-line row of each."""
    counts = np.diff(loff)
    parent = np.repeat(np.arange(len(counts)), counts)
    blank = (np.diff(offsets(flat)) == 0) | pc.utf8_is_space(flat).to_numpy(zero_copy_only=False)
    keep = ~blank & lines_ok[parent]
    keep[loff[:-1][counts > 0]] = False  # the head before the first '|'
    kept = np.flatnonzero(keep)
    row = np.cumsum(lines_ok) - 1
    return kept, row[parent[kept]]


def _split_fields(flat: pa.Array, kept: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """Each kept ``key: value`` piece cut at its first colon (no colon: all key, empty value).

    Keys keep their outer whitespace (normalised once per distinct key);
    values lose trailing whitespace as the trimmed field would.
    """
    off = offsets(flat)
    colon = pc.find_substring(flat, ":").to_numpy(zero_copy_only=False).astype(np.int64)[kept]
    start, stop = off[kept], off[kept + 1]
    cut = np.where(colon >= 0, start + colon, stop)
    return spans(flat, start, cut), pc.utf8_rtrim_whitespace(spans(flat, np.minimum(cut + 1, stop), stop))


def head_columns(heads: pa.Array, pattern: str, step_end: str | None, idx: np.ndarray,
                 path: Path) -> tuple[pa.Array, pa.Array | None]:
    """Step (and rank text, where a ``[defaultN]:`` prefix gives one) of good heads, by position, not regex groups."""
    off = offsets(heads)
    start = off[:-1] + pc.find_substring(heads, "iteration").to_numpy(zero_copy_only=False) + len("iteration")
    stop = off[:-1] + pc.find_substring(heads, step_end).to_numpy(zero_copy_only=False) if step_end else off[1:]
    step = ints_or_error(pc.utf8_trim_whitespace(spans(heads, start, stop)), idx + 1, path, "iteration")
    has = pc.match_substring(heads, "[default").to_numpy(zero_copy_only=False)
    if not has.any():
        return step, None
    rank = pc.extract_regex(heads.filter(pa.array(has)), pattern).field("rank")
    return step, pc.replace_with_mask(pa.array(np.full(len(heads), ""), rank.type), pa.array(has), rank)


def _key_columns(keys: pa.Array, ok: np.ndarray, prefix: str) -> tuple[np.ndarray, np.ndarray, list[tuple[str, float]]]:
    """Per field: whether its key names a value, and its column's number (into the returned names)."""
    encoded = pc.dictionary_encode(keys)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    dictionary = pc.utf8_ltrim_whitespace(encoded.dictionary)
    raws = dictionary.to_pylist()
    named = np.array([_HAS_NAME.search(raw) is not None for raw in raws], dtype=bool)
    ok = ok & named[codes]
    # Keys are compared without case or whitespace; the first good field of a key names its column.
    norms = pc.replace_substring_regex(pc.utf8_lower(dictionary), r"\s+", "").to_pylist()
    # First good field of each key: written backwards, the earliest position lands last.
    first = np.full(len(raws), -1, dtype=np.int64)
    good_at = np.flatnonzero(ok)
    first[codes[good_at][::-1]] = good_at[::-1]
    order = sorted((int(first[code]), code) for code in np.flatnonzero(first >= 0))
    col_of_norm: dict[str, int] = {}
    names: list[tuple[str, float]] = []
    col_of_code = np.full(len(raws), -1, dtype=np.int64)
    for _, code in order:
        norm = norms[code]
        if norm not in col_of_norm:
            col_of_norm[norm] = len(names)
            names.append(_column_name(norm, " ".join(raws[code].split()), prefix))
        col_of_code[code] = col_of_norm[norm]
    return ok, col_of_code[codes], names


def _regex_ok(values: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.match_substring_regex(values, _VALUE), False).to_numpy(zero_copy_only=False)


def _numbers(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Which values are numbers as ``NUMBER_RE`` spells them, and their floats (NaN where not).

    Arrow's cast accepts every finite number the regex does and nothing else
    finite; it is laxer only for NaN/Inf spellings (``NAN``, ``nan(1)``). So
    the regex runs only on non-finite results, or on all when the cast fails.
    """
    trimmed = pc.utf8_ltrim(values, characters=" \t\n\f\r")
    try:
        floats = pc.cast(trimmed, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ok = _regex_ok(values)
        floats = np.full(len(values), np.nan)
        if ok.any():
            floats[ok] = pc.cast(trimmed.filter(pa.array(ok)), pa.float64()).to_numpy(zero_copy_only=False)
        return ok, floats
    ok = np.ones(len(values), dtype=bool)
    odd = np.flatnonzero(~np.isfinite(floats))
    if len(odd):
        ok[odd] = _regex_ok(values.take(pa.array(odd)))
    return ok, floats


def _unit_values(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Values with a ``FLOPS`` unit as bare numbers, and the factor to FLOP/s per value (1 elsewhere)."""
    scale = np.ones(len(values))
    has = pc.fill_null(pc.match_substring(values, "FLOPS"), False).to_numpy(zero_copy_only=False)
    if not has.any():
        return values, scale
    at = np.flatnonzero(has)
    parts = pc.extract_regex(values.take(pa.array(at)), _FLOPS)  # no match -> null: stays junk, fails as such
    good = pc.is_valid(parts).to_numpy(zero_copy_only=False)
    at, parts = at[good], parts.filter(pa.array(good))
    scale[at] = [_SI[p] for p in parts.field("prefix").to_pylist()]
    mask = np.zeros(len(values), dtype=bool)
    mask[at] = True
    return pc.replace_with_mask(values, pa.array(mask), parts.field("num").cast(values.type)), scale


def fields_to_columns(flat: pa.Array, loff: np.ndarray, lines_ok: np.ndarray, heads: pa.Array,
                      head: tuple[str, str | None], idx: np.ndarray, path: Path, skip: bool,
                      prefix: str) -> tuple[dict[str, pa.Array], np.ndarray]:
    """Record columns of the good lines (``lines_ok``; ``idx`` their line indices) from their pieces.

    ``heads`` are the good lines' head pieces, ``head`` their (pattern, step
    end). Returns the columns (only good lines) and the mask of lines whose
    fields parse; with ``skip`` false the first malformed field raises.
    """
    n = len(idx)
    good = np.ones(n, dtype=bool)
    kept, parent = _fields(flat, loff, lines_ok)
    keys, values = _split_fields(flat, kept)
    values, unit_scale = _unit_values(values)
    ok, floats = _numbers(values)
    floats = floats * unit_scale
    ok, column, names = _key_columns(keys, ok, prefix)
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        if not skip:
            text = pc.utf8_trim_whitespace(flat.slice(int(kept[bad]), 1))[0].as_py()
            raise LogFormatError(path, int(idx[parent[bad]]) + 1,
                                 f"expected 'key: number' fields between '|', got {text[:120]!r}")
        good[parent[~ok]] = False
    # One scatter into a line x key grid (a key twice on a line: the later one wins), then keys -> columns.
    grid = np.full((n, len(names)), np.nan)
    seen = np.zeros((n, len(names)), dtype=bool)
    grid[parent[ok], column[ok]] = floats[ok]
    seen[parent[ok], column[ok]] = True
    step, rank = head_columns(heads, head[0], head[1], idx, path)
    out: dict[str, pa.Array] = {"step": step}
    for number, (name, scale) in enumerate(names):
        here = seen[:, number]
        if name in out:  # a second key for the same column: its values win where present
            col = out[name].to_numpy(zero_copy_only=False).copy()
            col[here] = grid[here, number] * scale
            out[name] = pa.array(col, mask=~(here | pc.is_valid(out[name]).to_numpy(zero_copy_only=False)))
        else:
            out[name] = pa.array(np.where(here, grid[:, number] * scale, np.nan), mask=~here)
    for name in _INT_COLUMNS:
        if name in out:
            out[name] = _as_int(out[name], idx, path, name)
    if "skipped_iterations" in out:
        out["found_inf"] = pc.greater(out["skipped_iterations"], 0.0)
    if rank is not None and pc.any(pc.not_equal(rank, "")).as_py():
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


def _matches(lines: pa.Array, cand: np.ndarray, literal: str, pattern: str) -> tuple[np.ndarray, pa.StructArray]:
    """Lines among ``cand`` holding ``literal`` and matching ``pattern``, with its groups."""
    idx = cand
    for check in (lambda sub: pc.match_substring(sub, literal), lambda sub: pc.match_substring_regex(sub, pattern)):
        if len(idx):
            idx = idx[pc.fill_null(check(lines.take(pa.array(idx))), False).to_numpy(zero_copy_only=False)]
    return idx, pc.extract_regex(lines.take(pa.array(idx, pa.int64())), pattern)


def find_events(lines: pa.Array, row_lines: np.ndarray, raw: bytes | None = None) -> tuple[list[dict], set[int]]:
    """Checkpoint saves and loads; ``row_lines`` are the line indices of the metric rows, ``raw`` the file bytes."""
    found: list[tuple[int, dict]] = []
    # Every pattern below has "checkpoint" then a space or a colon: two scans of the file instead of four.
    after_space, after_colon = (lines_containing(lines, raw, f"checkpoint{c}") for c in " :")
    idx, parts = _matches(lines, after_space, "saving checkpoint", r"(?:^|\s)saving checkpoint at iteration\s+(?P<step>\d+)\s+to\s+(?P<path>\S+)")
    for i, p in zip(idx, parts.to_pylist()):
        found.append((int(i), {"event": "checkpoint", "step": int(p["step"]), "path": p["path"]}))
    idx, parts = _matches(lines, after_colon, "Saving model checkpoint", r"Saving model checkpoint:\s+(?P<path>\S*global_step(?P<step>\d+)\S*)")
    by_step = {ev["step"]: ev for _, ev in found}
    for i, p in zip(idx, parts.to_pylist()):
        step = int(p["step"])
        if step in by_step:
            by_step[step].setdefault("file", p["path"])
        else:
            by_step[step] = {"event": "checkpoint", "step": step, "path": p["path"]}
            found.append((int(i), by_step[step]))
    found.sort(key=lambda x: x[0])
    idx, parts = _matches(lines, after_colon, "save-checkpoint", r"save-checkpoint:\s*(?P<ms>[0-9.]+)")
    for i, p in zip(idx, parts.to_pylist()):
        before = [ev for line, ev in found if line < i]
        if before:
            before[-1]["write_seconds"] = float(p["ms"]) / 1000.0
    breaks: set[int] = set()
    idx, parts = _matches(lines, after_space, "loaded checkpoint", r"loaded checkpoint from\s+(?P<path>\S+).*?at iteration\s+(?P<step>\d+)")
    for i, p in zip(idx, parts.to_pylist()):
        pos = int(np.searchsorted(row_lines, i))
        found.append((int(i), {"event": "resume", "step": int(p["step"]), "path": p["path"]}))
        breaks.add(pos)
    found.sort(key=lambda x: x[0])
    events = [{**ev, "row_index": int(np.searchsorted(row_lines, line))} for line, ev in found]
    return events, breaks
