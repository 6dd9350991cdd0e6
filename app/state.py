"""The dashboard's bridge to the store and the detectors: the root, cached queries, live ticks.

Every page goes through here. The store is one ``st.cache_resource``; query
results are ``st.cache_data`` keyed on a cheap signature of the run's files
(newest mtime and file count), so a new flush or a compaction invalidates
exactly what changed and an idle dashboard costs a directory listing per tick.
UI strings never reach SQL: run names pass ``check_run_name`` and the store
binds every value.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import plotly.graph_objects as go
import pyarrow as pa
import streamlit as st

from runwatch.app import figures, views
from runwatch.app.serve import ROOT_ENV
from runwatch.data.storage import check_run_name, data_files
from runwatch.data.store import Store

LIVE_SECONDS = 5.0  # how often an open page polls for new flushes
STALL_TICK_SECONDS = 15  # how often an unchanged run is re-judged (so "stalled" appears by itself)
CHART_COLUMNS = ("loss", "grad_norm", "loss_scale", "act_norm", "step_time")
NUM_BUCKETS = 2000


def root() -> Path:
    """The root this dashboard serves: ``$RUNWATCH_ROOT`` or ``--root`` after ``--`` on the command line."""
    value = os.environ.get(ROOT_ENV)
    argv = sys.argv[1:]
    if "--root" in argv and argv.index("--root") + 1 < len(argv):
        value = argv[argv.index("--root") + 1]
    if not value:
        raise ValueError(f"no runwatch root: set {ROOT_ENV} or start with `runwatch dashboard --root ROOT`")
    path = Path(value).resolve()
    if not path.is_dir():
        raise ValueError(f"{path}: no such directory (expected a runwatch root)")
    return path


@st.cache_resource
def get_store(root_dir: str) -> Store:
    return Store(root_dir)


def signature(root_dir: str, run: str | None = None) -> tuple[float, int]:
    """Newest mtime and number of committed files: changes on every flush, import or compaction."""
    files = data_files(root_dir, run, "metrics") + data_files(root_dir, run, "events")
    mtimes = [f.stat().st_mtime for f in files if f.exists()]
    return (max(mtimes) if mtimes else 0.0, len(mtimes))


@st.cache_data(max_entries=32, show_spinner=False)
def load_runs(root_dir: str, sig: tuple[float, int]) -> list[dict]:
    return get_store(root_dir).runs().to_pylist()


@st.cache_data(max_entries=64, show_spinner=False)
def load_events(root_dir: str, run: str, sig: tuple[float, int]) -> pa.Table:
    return get_store(root_dir).events(run)


@st.cache_data(max_entries=64, show_spinner=False)
def load_segments(root_dir: str, run: str, sig: tuple[float, int]) -> list[dict]:
    return get_store(root_dir).segments(run).to_pylist()


@st.cache_data(max_entries=64, show_spinner=False)
def load_columns(root_dir: str, run: str, sig: tuple[float, int]) -> list[str]:
    return get_store(root_dir).columns(run)


@st.cache_data(max_entries=128, show_spinner=False)
def load_series(root_dir: str, run: str, sig: tuple[float, int], columns: tuple[str, ...], x: str,
                lo: float | None, hi: float | None) -> dict[str, pa.Table]:
    """Per-bucket first/min/max/last of each chart column over [lo, hi] (full range when None)."""
    return get_store(root_dir).downsample_columns(run, list(columns), x=x, lo=lo, hi=hi, num_buckets=NUM_BUCKETS)


@st.cache_resource
def _reports() -> dict:
    """(root, run) -> (signature, judged_at, seconds it took, report, error); shared by all sessions."""
    return {}


def _judge(root_dir: str, run: str) -> tuple[object | None, str | None, float]:
    from runwatch.app.judge import judge_run

    t0 = time.perf_counter()
    try:
        return judge_run(get_store(root_dir), run), None, time.perf_counter() - t0
    except (ValueError, RuntimeError, OSError, MemoryError) as err:
        # Shown on the page (and cached, so a run too big to judge is not retried every tick).
        return None, f"{type(err).__name__}: {err}", time.perf_counter() - t0


def report_for(root_dir: str, run: str, *, compute: bool = True) -> tuple[object | None, str | None, bool]:
    """(report, error, pending) for a run, judged as of now.

    Re-judged when its files change, and also every ``STALL_TICK_SECONDS``
    while idle so a run that stopped turns "stalled" by itself; a run whose
    analysis is slow (millions of steps) is re-judged at most every 20x its
    cost, so the dashboard never spends its time re-running detectors. With
    ``compute=False`` only a cached (possibly older) result is returned;
    ``pending`` says none exists yet.
    """
    cache, key, sig, now = _reports(), (root_dir, run), signature(root_dir, run), time.time()
    entry = cache.get(key)
    fresh = entry is not None and entry[0] == sig and now - entry[1] < max(STALL_TICK_SECONDS, 20 * entry[2])
    if fresh or (entry is not None and not compute):
        return entry[3], entry[4], False
    if not compute:
        return None, None, True
    try:
        report, error, cost = _judge(root_dir, run)
    except ImportError as err:
        return None, f"detectors unavailable: {err}", False
    cache[key] = (sig, now, cost, report, error)
    return report, error, False


def report_stamp(root_dir: str, run: str) -> float:
    """When the cached report of ``run`` was made (0 when none): part of the chart's cache key."""
    entry = _reports().get((root_dir, run))
    return entry[1] if entry is not None else 0.0


@st.cache_data(max_entries=16, show_spinner=False)
def run_chart(root_dir: str, run: str, sig: tuple[float, int], x: str, lo: float | None, hi: float | None,
              stamp: float, _report: object | None) -> go.Figure:
    """The run page's figure, rebuilt only when the files, the view or the report changed.

    A live page re-runs every few seconds; without this each tick would
    rebuild thousands of points into a new figure for nothing.
    """
    segments = load_segments(root_dir, run, sig)
    wanted = CHART_COLUMNS + (("step",) if x == "tokens" else ())
    series = load_series(root_dir, run, sig, wanted, x, lo, hi)
    to_x = None
    if x == "tokens" and "step" in series:
        main = series["step"].filter(series["step"]["main"])
        to_x = figures.step_mapper(main["first"].to_numpy(), main["x_first"].to_numpy())
    events = load_events(root_dir, run, sig)
    findings = list(getattr(_report, "findings", []) or [])
    last_step = max((s["last_step"] for s in segments), default=0)
    abandoned_from = {s["segment"]: s["abandoned_from"] for s in segments if s["abandoned_from"] is not None}
    fig = figures.run_figure(
        series, x_title=x, bands=views.finding_bands(findings, last_step, to_x, abandoned_from),
        checkpoints=views.event_marks(events, "checkpoint", to_x), resumes=views.event_marks(events, "resume", to_x),
        abandoned_from=abandoned_from,
        x_range=(lo, hi) if lo is not None and hi is not None else None,
    )
    fig.update_layout(uirevision=f"{run}:{x}:{lo}:{hi}")  # keep the user's client-side zoom across live ticks
    return fig


def selected_run(root_dir: str) -> str | None:
    """The run named in the URL (``?run=``), validated: a safe name that exists under the root."""
    name = st.query_params.get("run")
    if not name:
        return None
    try:
        check_run_name(name)
    except ValueError as err:
        st.error(str(err))
        return None
    if not get_store(root_dir).has_run(name):
        st.warning(f"no run named {name!r} under {root_dir}")
        return None
    return name
