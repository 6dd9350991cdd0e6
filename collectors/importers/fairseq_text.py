"""fairseq plain-text stdout (``simple``/``tqdm`` progress, ``--no-progress-bar``), old (<= 0.6) and new (>= 0.9).

``runwatch import fairseq`` reads these and also ``--log-format json`` files
(handed to ``metaseq``, whose sniffer runs first, so neither steals the
other's files). Lines read (new ones carry a ``YYYY-MM-DD HH:MM:SS | LEVEL |
logger |`` prefix, whose stamp becomes ``time``, read as UTC; old ones start
with ``| ``):

* train_inner ``epoch 001:    100 / 1000 loss=9.1, ..., num_updates=100, ...``
  -> a row at ``num_updates``: ``loss``, ``gnorm`` -> grad_norm, ``lr``,
  ``loss_scale``; the rest (wps, ups, wpb, bsz, clip, oom, wall, ...) as
  sanitised extras (``clip 0%`` -> 0).
* valid ``epoch 001 | valid on 'valid' subset | loss 8.3 | ... | num_updates
  1000 | best_loss 8.3`` -> ``val_<name>`` (old ``valid_loss`` -> ``val_loss``;
  another subset ``test`` -> ``test_<name>``) at that num_updates.
* end of epoch ``epoch 001 | loss 9.1 | ... | num_updates 1000`` (the
  ``train`` logger): an average over the epoch, so in a file with train_inner
  lines it becomes ``epoch_<name>`` extras folded into the row of that step (as
  the metaseq importer does); in a file without any (tqdm logs print only
  these; the bar, redrawn after carriage returns, is noise) its values fill the main columns, or the run
  would have no loss. (``--log-format none`` prints no progress at all.)
* ``overflow detected, setting loss scale to: S`` (old ``| WARNING:``, new
  ``NOTE: [gradient] overflow detected, [ignoring gradient, ]``): no step is
  printed and fairseq does not count a skipped update, so a burst of them is ONE
  row at the last num_updates + 1 with found_inf, loss_scale = the last scale
  set and ``num_overflows``; when a line at exactly that step follows, the
  burst folds into it (its own loss_scale, the interval's, is kept).
* ``[Ss]aved checkpoint PATH (epoch E @ N updates ...)`` -> checkpoint event at
  N (saved after update N: the state after update N, the record's contract);
  ``[Ll]oaded checkpoint PATH (epoch E @ N updates)`` -> resume at N (new segment).

A line shaped like a progress line whose fields do not parse is an error
naming file and line (or is skipped with ``--skip-bad-lines``).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa

from runwatch.collectors.importers import metaseq
from runwatch.collectors.importers.base import LogFormatError, ParsedLog
from runwatch.collectors.importers.textlog import (
    NUMBER_RE,
    matches,
    merge_same_step,
    parse_each,
    read_text,
    sanitize_name,
)
from runwatch.data.record import metrics_table

# tqdm logs put the bar and the printed line on one physical line, split by \r: read after the last \r.
_START = r"(?:^|\r)"
_PREFIX = (r"(?:(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)? \| [A-Z]+ \| (?P<tag>[\w.]+) \| |\| )")
_EPOCH = _START + _PREFIX + r"epoch (?P<epoch>\d+)"
_INNER = re.compile(_EPOCH + r":\s+(?P<i>\d+) / (?P<n>\d+) (?P<body>.*?)\s*$")
_VALID = re.compile(_EPOCH + r" \| valid on '(?P<subset>[^']*)' subset \| (?P<body>.*?)\s*$")
_SUMMARY = re.compile(_EPOCH + r" \| (?P<body>.*?)\s*$")
# tqdm bars (``| epoch 001:  10%|...``) are noise: only a line with inner's ``I / M`` or a ``|`` claims to be progress.
_CLAIM = _EPOCH + r"(?::\s+\d+ / | \|)"
_OVERFLOW_TEXT = r"overflow detected, (?:ignoring gradient, )?setting loss scale to: "
_OVERFLOW = re.compile(_OVERFLOW_TEXT + rf"(?P<scale>{NUMBER_RE})")
_SAVED = re.compile(r"[Ss]aved checkpoint (\S+) \(epoch (\d+) @ (\d+) updates.*?(?:writing took ([0-9.]+) seconds)?\)?\s*$")
_LOADED = re.compile(r"[Ll]oaded checkpoint (\S+) \(epoch (\d+) @ (\d+) updates\)")
_PROGRESS = r"(?m)" + _EPOCH + r"(?::\s+\d+ / \d+ \w+=| \| (?:valid on '|\w+ ))"
_SNIFF = re.compile(_PROGRESS + r"|^\| WARNING: overflow detected, setting loss scale to: "
                    r"|\| fairseq\.trainer \| NOTE: (?:gradient )?overflow detected, ")
NAMES = {"loss": "loss", "gnorm": "grad_norm", "loss_scale": "loss_scale", "lr": "lr"}
EXPECTED = ("a fairseq progress line ('| epoch N:  I / M key=value, ...', '| epoch N | key value | ...') "
            "with num_updates")


def sniff(head: str) -> bool:
    """True when the head holds a fairseq text progress line or overflow warning (JSON lines go to metaseq)."""
    # A literal test first: the regex would try every line start of a megabytes-long head.
    return ("epoch " in head or "overflow detected, " in head) and _SNIFF.search(head) is not None


def _timestamp(ts: str | None) -> float | None:
    """Unix seconds of a ``YYYY-MM-DD HH:MM:SS`` prefix (UTC); an impossible date is no time, not a bad line."""
    if not ts:
        return None
    y, mo, d, h, mi, sec = int(ts[0:4]), int(ts[5:7]), int(ts[8:10]), int(ts[11:13]), int(ts[14:16]), int(ts[17:19])
    if not (y >= 1 and 1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1] and h < 24 and mi < 60 and sec < 62):
        return None
    return float(calendar.timegm((y, mo, d, h, mi, sec)))  # strptime costs several times more per line


_NUMBER = re.compile(NUMBER_RE)
_name = lru_cache(maxsize=4096)(sanitize_name)  # a log repeats a handful of keys on every line


def _fields(body: str, commas: bool) -> dict[str, float]:
    """``k=v, k=v`` (train_inner) or ``k v | k v`` (summaries) -> numbers; ``0%`` reads as 0."""
    out = {}
    for part in body.split(", " if commas else " | "):
        key, sep, value = part.strip().partition("=" if commas else " ")
        value = value.strip().removesuffix("%")
        if not sep or not key or not _NUMBER.fullmatch(value):
            raise ValueError(f"expected 'key{'=' if commas else ' '}number', got {part.strip()[:80]!r}")
        out[key] = float(value)
    return out


def _row(m: re.Match, kind: str, summaries_main: bool) -> dict:
    """The metric row of one progress line; ``kind`` is inner, valid or summary."""
    values = _fields(m["body"], commas=kind == "inner")
    step = values.pop("num_updates", None)
    if step is None or not 0 <= step <= 2**62 or step != int(step):  # NaN fails the range test
        raise ValueError(f"expected a non-negative integer 'num_updates', got {step!r}")
    row: dict = {"step": int(step)}
    if kind == "valid":
        prefix = "val_" if m["subset"] == "valid" else sanitize_name(m["subset"]) + "_"
        for key, v in values.items():
            name = key[len("valid_"):] if key.startswith("valid_") else key
            row[_name(name, prefix)] = v
        return row
    main = kind == "inner" or summaries_main
    row["time"] = _timestamp(m["ts"]) if main else None
    for key, v in values.items():
        row[(NAMES.get(key) or _name(key)) if main else _name(key, "epoch_")] = v
    if main:  # only on the main row: the valid/summary rows of its step would clash and not fold in
        row["epoch"] = float(m["epoch"])
    return row


class _Rows:
    """Rows in file order, with the pending overflow burst placed when the next step is known."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.last_step = 0
        self.burst: dict | None = None

    def overflow(self, scale: float, t: float | None) -> None:
        if self.burst is None:
            self.burst = {"step": self.last_step + 1, "found_inf": True, "num_overflows": 0.0}
        self.burst.update(loss_scale=scale, time=t)
        self.burst["num_overflows"] += 1.0

    def flush(self) -> None:
        if self.burst is not None:
            self.rows.append(self.burst)
            self.burst = None

    def add(self, row: dict) -> None:
        step = row["step"]
        if self.burst is not None and step == self.burst["step"]:
            merged = {**self.burst, **{k: v for k, v in row.items() if v is not None}}
            self.burst = None
            row = merged
        elif self.burst is not None and step != self.last_step:
            # A summary or valid line repeating the last step lands before the burst; anything else follows it.
            self.flush()
        self.rows.append(row)
        self.last_step = step

    def next_index(self) -> int:
        return len(self.rows) + (self.burst is not None)


def _text_lines(path: Path) -> tuple[list[int], list[str]]:
    lines = read_text(path)[0]
    pattern = f"{_CLAIM}|{_OVERFLOW_TEXT}|[Ss]aved checkpoint |[Ll]oaded checkpoint "
    idx = np.flatnonzero(matches(lines, pattern))
    return idx.tolist(), lines.take(pa.array(idx, pa.int64())).to_pylist()


def _event(line: str, out: _Rows) -> dict | None:
    stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", line)
    t = _timestamp(stamp.group(1)) if stamp else None
    if m := _SAVED.search(line):
        ev = {"event": "checkpoint", "step": int(m.group(3)), "path": m.group(1), "time": t}
        if m.group(4):
            ev["write_seconds"] = float(m.group(4))
        return ev
    if m := _LOADED.search(line):
        return {"event": "resume", "step": int(m.group(3)), "path": m.group(1), "time": t}
    if m := _OVERFLOW.search(line):
        out.overflow(float(m["scale"]), t)
    return None


def parse_text(path: Path, skip_bad_lines: bool) -> ParsedLog:
    idx, texts = _text_lines(path)
    summaries_main = not any(_INNER.search(s) for s in texts)
    out, events, breaks, num_bad = _Rows(), [], set(), 0
    for i, line in zip(idx, texts):
        if (m := _VALID.search(line)) or (m := _INNER.search(line)) or (m := _SUMMARY.search(line)):
            kind = "valid" if m.re is _VALID else "inner" if m.re is _INNER else "summary"
            try:
                out.add(_row(m, kind, summaries_main))
            except ValueError as err:
                if not skip_bad_lines:
                    raise LogFormatError(path, i + 1, f"{err} (in {EXPECTED})") from None
                num_bad += 1
            continue
        if re.search(_CLAIM, line):
            if not skip_bad_lines:
                raise LogFormatError(path, i + 1, f"expected {EXPECTED}, got {line[:200]!r}")
            num_bad += 1
            continue
        ev = _event(line, out)
        if ev is not None:
            if ev["event"] == "resume":
                out.flush()
                breaks.add(len(out.rows))
            events.append({**ev, "row_index": out.next_index()})
    out.flush()
    if not out.rows:
        raise LogFormatError(path, None, f"no fairseq progress lines with num_updates found in {path}")
    return merge_same_step(ParsedLog(metrics_table(out.rows), events, num_bad, breaks))


def parse_file(path: Path, skip_bad_lines: bool) -> ParsedLog:
    """One file: ``--log-format json`` goes to the metaseq parser, anything else is read as text."""
    with open(path, "rb") as f:
        head = f.read(256 * 1024).decode("utf-8", errors="replace")
    # JSON runs print the trainer's overflow NOTEs as text too: only text progress lines make it a text log.
    if metaseq.sniff(head) and not re.search(_PROGRESS, head):
        return metaseq.parse_file(path, skip_bad_lines)
    return parse_text(path, skip_bad_lines)


def parse(paths: Sequence[str | Path], *, skip_bad_lines: bool = False) -> ParsedLog:
    return parse_each(paths, parse_file, skip_bad_lines)
