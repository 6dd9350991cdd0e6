"""Where a run is in its life (live, finished, stalled, archived) and what "last update" and "last step" mean.

Pure functions of a run's metadata, events, segments and judgement (``as_listed`` reads them from a store for
``runwatch runs``), shared by the overview, the run page and ``runwatch runs``:

- **state**: ``archived`` for an import (a log of a run that ended elsewhere),
  ``finished`` for a run that recorded its own end, ``stalled`` for a live run
  the detectors call stalled, else ``live``. Only a live run can stall
  (``judge.is_live``: the same rule the judgement uses).
- **last update**: the run's own clock, the newest ``time`` in its rows (an
  import's is the log's last time, not when it was imported; ``compact``,
  which rewrites files, leaves it alone). A live run whose rows carry no time
  falls back to its files' newest change; an archive without a clock has none.
- **last step**: the main line's, never an abandoned branch's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa

from runwatch.app.judge import ended_health, is_live

STATES: tuple[str, ...] = ("live", "stalled", "finished", "archived")
STATE_COLORS = {"live": "blue", "stalled": "violet", "finished": "green", "archived": "gray"}
STATE_ICONS = {"live": "●", "stalled": "⏸", "finished": "✓", "archived": "▣"}
"""Shapes as well as colours: the state reads without colour vision."""


def base_state(meta: Mapping, events: pa.Table) -> str:
    """The state that needs no judgement: archived, finished or live."""
    if str(meta.get("source") or "").startswith("import"):
        return "archived"
    return "live" if is_live(dict(meta), events) else "finished"


def run_state(base: str, health: str | None) -> str:
    """A live run the detectors call stalled is stalled; an ended run stays what it is."""
    return "stalled" if base == "live" and health == "stalled" else base


def display_health(health: str, state: str) -> str:
    """The health a reader sees (``judge.ended_health``): a verdict stored before the run ended, or by a version
    that said "watching" for an ended run, reads as ``judge_run`` says it now."""
    return ended_health(health, live=state not in ("archived", "finished"))


def last_update(last_time: float | None, file_mtime: float | None, state: str) -> float | None:
    """The run's own clock (its newest row ``time``); see the module docstring for the fallbacks."""
    if last_time is not None:
        return float(last_time)
    return None if state == "archived" else file_mtime


def main_last_step(segments: Iterable[Mapping]) -> int | None:
    """The main line's last step: the last step of the segments no later resume cut (``abandoned_from`` null)."""
    kept = [int(s["last_step"]) for s in segments if s.get("abandoned_from") is None and s.get("last_step") is not None]
    return max(kept, default=None)


def as_listed(row: Mapping, store: object) -> dict:
    """A ``Store.runs()`` row as ``runwatch runs`` lists it, by the rules above: the main line's last step and
    tokens (a run of several segments may have an abandoned branch past them), the state that needs no judgement, and the last
    update by the run's own clock (``row['last_update']`` is its files' newest change)."""
    run = row["run"]
    state = base_state(store.meta(run), store.events(run))
    one = row["num_segments"] == 1
    last_step = row["last_step"] if one else main_last_step(store.segments(run).to_pylist())
    tokens = row["tokens"] if one or row["tokens"] is None else store.main_tokens(run)
    return {**row, "state": state, "last_step": last_step, "tokens": tokens,
            "last_update": last_update(row["last_time"], row["last_update"], state)}


def state_label(state: str) -> str:
    """Markdown: a coloured shape and the state word, e.g. ``:gray[▣ archived]``."""
    return f":{STATE_COLORS.get(state, 'gray')}[{STATE_ICONS.get(state, '●')} {state}]"
