"""The dashboard's bridge to the store and the detectors: the root, cached queries, live ticks.

Every page goes through here. The store is one ``st.cache_resource``; query
results are ``st.cache_data`` keyed on a cheap signature of the run's files
(newest mtime and file count), so a new flush or a compaction invalidates
exactly what changed. An open page ticks every few seconds, so the tick is
kept proportional to what changed, not to the root: a run's files are listed
again only when one of its directories changed (``signatures``), its row of
the runs table is read again only when its files changed (``run_summaries``),
and it is judged again only when its files changed or time alone could change
its verdict (``is_stale``). Judging goes through a ``RunFollower`` (one
``st.cache_resource``), the code ``runwatch watch`` runs: it follows the root's files (watchdog) and judges each run with the
streaming analyser, reading each new file once.
UI strings never reach SQL: run names pass ``check_run_name`` and the store
binds every value.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import streamlit as st

from runwatch.app import escape, lifecycle
from runwatch.app.findings import read_findings, signature_of
from runwatch.app.follow import RunFollower
from runwatch.app.oncall import read_oncall
from runwatch.app.serve import ROOT_ENV
from runwatch.data.changes import listed_signatures
from runwatch.data.roots import is_url, open_root
from runwatch.data.storage import check_run_name, data_files, list_runs, run_dir
from runwatch.data.store import Store

LIVE_SECONDS = 5.0  # how often an open page polls for new flushes
STALL_TICK_SECONDS = 15.0  # the soonest an unchanged live run is judged again (so "stalled" appears by itself)
STALL_LATENESS = 0.1  # ... and at most this share of its silence late (see is_stale)
RACY_SECONDS = 2.0  # a directory younger than this may change again within one timestamp tick (see _dir_stamp)
NUM_BUCKETS = 1000  # about one per pixel of a chart's width: each keeps its min and max, so no spike is lost


def root() -> Path | str:
    """The root this dashboard serves: ``$RUNWATCH_ROOT`` or ``--root`` after ``--`` on the command line
    (a directory, or an object-store URL, kept as it is).

    A local root may not exist yet (a training job about to create it): the
    pages say so and how to fill it, and pick it up once it appears.
    """
    value = os.environ.get(ROOT_ENV)
    argv = sys.argv[1:]
    if "--root" in argv and argv.index("--root") + 1 < len(argv):
        value = argv[argv.index("--root") + 1]
    if not value:
        raise ValueError(f"no runwatch root: set {ROOT_ENV} or start with `runwatch dashboard --root ROOT`")
    if is_url(value):
        open_root(value)  # a missing bucket or prefix is one clear error on the page
        return value.rstrip("/")
    path = Path(value).resolve()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path}: not a directory (expected a runwatch root)")
    return path


def root_exists(root_dir: str) -> bool:
    """Whether there is a root to list (an object-store URL was checked when the dashboard started)."""
    return is_url(root_dir) or Path(root_dir).is_dir()


def how_to_fill(root_dir: str) -> str:
    """Markdown: an empty or missing root, and the ways to put runs in it."""
    where = escape.markdown(root_dir)
    missing = "" if root_exists(root_dir) else " (the directory does not exist yet; it is created by the first run)"
    return (f"No runs under {where} yet{missing}. To fill it: record a run with `Monitor(root, run=...)` in a "
            "training loop (it appears here within seconds), import an archived log on the **Import** page or with "
            f"`runwatch import auto LOG --root {where} --run NAME`, or record the demo runs with "
            f"`runwatch demo --root {where} --no-dashboard`.")


@st.cache_resource
def get_store(root_dir: str) -> Store:
    return Store(root_dir)


@st.cache_resource
def get_follower(root_dir: str) -> RunFollower:
    """The root followed file by file (watchdog) and judged by the streaming analyser, as ``runwatch watch``
    does; shared by every session of this dashboard."""
    follower = RunFollower(root_dir)
    follower.start()
    return follower


def signature(root_dir: str, run: str | None = None) -> tuple[float, int]:
    """Newest mtime and number of committed files: changes on every flush, import or compaction."""
    if is_url(root_dir):
        return signature_of(get_store(root_dir).location, run)
    mtimes = []
    for f in data_files(root_dir, run, "metrics") + data_files(root_dir, run, "events"):
        try:
            mtimes.append(f.stat().st_mtime)
        except FileNotFoundError:  # compacted or replaced since it was listed
            continue
    return (max(mtimes) if mtimes else 0.0, len(mtimes))


def _dir_stamp(top: Path) -> tuple[int, float] | None:
    """A digest of (path, inode, mtime) of every directory under ``top``, or None when it may still be moving.

    Files land by rename and leave by unlink, so a new, compacted or swapped
    file always changes its directory: an unchanged stamp means unchanged
    files, and only a changed run is listed again. A directory changed in the
    last ``RACY_SECONDS`` could change again within the same timestamp on a
    coarse filesystem, so it gives no stamp (git's "racily clean" rule).
    """
    entries, stack, newest = [], [str(top)], 0.0
    while stack:
        path = stack.pop()
        try:
            info = os.stat(path)
            with os.scandir(path) as it:
                stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            continue
        entries.append((path, info.st_ino, info.st_mtime_ns))
        newest = max(newest, info.st_mtime)
    return None if time.time() - newest < RACY_SECONDS else (hash(tuple(sorted(entries))), newest)


@st.cache_resource
def _listed() -> dict[str, dict[str, tuple[tuple[int, float] | None, tuple[float, int]]]]:
    """root -> run -> (its directory stamp, its signature); shared by all sessions."""
    return {}


def signatures(root_dir: str) -> dict[str, tuple[float, int]]:
    """Every run's ``signature`` (runs with committed files only); what the overview does each tick.

    A run's files are listed again only when its directory stamp changed, so
    an idle root of hundreds of runs costs a walk of its directories.
    """
    if is_url(root_dir):  # no directory stamps on an object store: one listing of the root per tick
        return listed_signatures(get_store(root_dir).location)
    known = _listed().setdefault(root_dir, {})
    runs = list_runs(root_dir)
    for gone in set(known) - set(runs):
        known.pop(gone, None)
    out = {}
    for run in runs:
        stamp = _dir_stamp(run_dir(root_dir, run))
        if stamp is None or run not in known or known[run][0] != stamp:
            known[run] = (stamp, signature(root_dir, run))
        if known[run][1][1]:
            out[run] = known[run][1]
    return out


@st.cache_resource
def _summaries() -> dict[str, dict[str, tuple[tuple[float, int], dict | None, str | None]]]:
    """root -> run -> (signature, its row of the runs table, or None and why it could not be read); all sessions."""
    return {}


def _summary(store: Store, run: str) -> dict:
    """One run's row of the runs table from queries over that run's files alone, with its main line's last
    step (``lifecycle.main_last_step``) and the state that needs no judgement (``lifecycle.base_state``)."""
    segments = store.segments(run).to_pylist()
    last_step = lifecycle.main_last_step(segments)
    tail = store.rows(run, rank=None, lo=last_step, hi=last_step)
    tail = tail.filter(tail["main"])
    tokens = [t for t in (tail["tokens"].to_pylist() if "tokens" in tail.column_names else []) if t is not None]
    return {"run": run, "first_step": min(s["first_step"] for s in segments), "last_step": last_step,
            "num_segments": len(segments), "num_ranks": len(store.ranks(run)),
            "last_time": max((s["last_time"] for s in segments if s["last_time"] is not None), default=None),
            "tokens": max(tokens, default=None), "num_rows": sum(s["num_rows"] for s in segments),
            **_facts(store, run)}


def _facts(store: Store, run: str) -> dict:
    """What the overview shows beside a run's numbers, from its metadata and events (read when they change):
    its state before judgement, and its acknowledgements and silences."""
    events = store.events(run)
    return {"base_state": lifecycle.base_state(store.meta(run), events), "oncall": read_oncall(events)}


def _read_summary(root_dir: str, run: str, sig: tuple[float, int]) -> tuple[tuple[float, int], dict | None, str | None]:
    try:
        return sig, _summary(get_store(root_dir), run), None
    except (ValueError, RuntimeError, OSError) as err:
        return sig, None, f"{type(err).__name__}: {err}"


def run_summary(root_dir: str, run: str, sig: tuple[float, int]) -> tuple[dict, str | None]:
    """One run's row of the runs table (read again only when its files changed), and why it failed, if it did."""
    known = _summaries().setdefault(root_dir, {})
    if run not in known or known[run][0] != sig:
        known[run] = _read_summary(root_dir, run, sig)
    _, row, error = known[run]
    row = row or {"run": run}
    state = row.get("base_state", "live")
    return {**row, "last_update": lifecycle.last_update(row.get("last_time"), sig[0], state)}, error


def run_summaries(root_dir: str, sigs: dict[str, tuple[float, int]]) -> tuple[list[dict], dict[str, str]]:
    """The runs table (``Store.runs()`` rows, by run) and run -> why it could not be read.

    Only runs whose files changed are read again, so one live run flushing
    costs a query over that run, not over the whole root. When many changed
    (the first open), one scan of the root is cheaper than a query per run.
    A run that cannot be read (a corrupt file) is reported against itself;
    the others still list.
    """
    known = _summaries().setdefault(root_dir, {})
    for gone in set(known) - set(sigs):
        known.pop(gone, None)
    stale = [run for run, sig in sigs.items() if run not in known or known[run][0] != sig]
    if len(stale) > max(8, len(sigs) // 4):
        try:
            scanned = {r["run"]: r for r in get_store(root_dir).runs().to_pylist()}
        except (ValueError, RuntimeError, OSError):
            scanned = {}  # one bad file fails the whole scan: read run by run, so it is pinned on its run
        store = get_store(root_dir)
        for run in stale:  # a run with one segment has no branch: its scanned row is its main line's
            if run in scanned and scanned[run].get("num_segments") == 1 and not scanned[run].get("error"):
                try:
                    facts = _facts(store, run)
                except (ValueError, RuntimeError, OSError):
                    continue  # read on its own below, so the failure is pinned on it
                known[run] = (sigs[run], {**scanned[run], **facts}, None)
    rows, errors = [], {}
    for run in sorted(sigs):
        row, error = run_summary(root_dir, run, sigs[run])
        rows.append(row)
        if error is not None:
            errors[run] = error
    return rows, errors


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


@dataclass(frozen=True)
class Judged:
    """A run's cached verdict and what decides when it is stale."""

    sig: tuple[float, int]
    """The run's file signature when it was judged."""
    judged_at: float
    """Clock time of the judgement (unix seconds)."""
    cost: float
    """Seconds the judgement took."""
    live: bool
    """Whether the run can still stall (``judge.is_live``): only then can time alone change the verdict."""
    report: object | None
    error: str | None


@st.cache_resource
def _reports() -> dict[tuple[str, str], Judged]:
    """(root, run) -> its latest judgement; shared by all sessions."""
    return {}


def _judge(root_dir: str, run: str) -> tuple[object | None, str | None, bool]:
    """The run judged by the follower's streaming analyser (what ``runwatch watch`` alerts on): the files its
    watcher reported are taken in, and the run's directory is listed once more, so a file whose event has not
    arrived yet is not missed; only new files are read. An object-store root has no file events to follow:
    its runs are judged by ``judge_run`` over the store."""
    try:
        if is_url(root_dir):
            from runwatch.app.judge import is_live, judge_run

            store = get_store(root_dir)
            return judge_run(store, run), None, is_live(store.meta(run), store.events(run))
        follower = get_follower(root_dir)
        follower.sync_paths(follower.drain(timeout=0))
        follower.sync([run])
        error = follower.errors.get(run)
        if error:
            return None, error, False
        return follower.report(run), None, follower.is_live(run)
    except (ValueError, RuntimeError, OSError, MemoryError) as err:
        # Shown on the page (and cached, so a run that cannot be judged is not retried until its files change).
        return None, f"{type(err).__name__}: {err}", False


def is_stale(entry: Judged | None, sig: tuple[float, int], now: float, *, detail: bool = False) -> bool:
    """Whether a run must be judged again: its files changed, or time alone may have changed its verdict.

    Time matters only for a live run: it turns "stalled" when it stays
    silent. The stall rule lives in the detectors, so instead of guessing
    its threshold, a silent run is looked at again after a tenth of the
    silence it had when last judged (at least ``STALL_TICK_SECONDS``): a
    verdict that flips at silence T shows at most ~T/10 late, and a run
    silent for days costs a few judgements a day, not one per tick. Once it
    is "stalled", only new files can change that; ``detail`` (the run page)
    still refreshes it on the same schedule, since its message says how long
    the silence is. A slow analysis (millions of steps) waits at least 20x
    its cost.
    """
    if entry is None or entry.sig != sig:
        return True
    if not entry.live or (not detail and getattr(entry.report, "health", None) == "stalled"):
        return False
    silence = max(0.0, entry.judged_at - sig[0])
    return now - entry.judged_at >= max(STALL_TICK_SECONDS, STALL_LATENESS * silence, 20 * entry.cost)


def report_for(root_dir: str, run: str, *, compute: bool = True, sig: tuple[float, int] | None = None,
               detail: bool = False) -> tuple[object | None, str | None, bool]:
    """(report, error, pending) for a run, judged as of now (see ``is_stale`` for when it is judged again).

    With ``compute=False`` only a cached (possibly older) result is returned;
    ``pending`` says none exists yet. ``sig``: the run's signature when the
    caller already has it (the overview lists the whole root once per tick).
    ``detail``: the caller shows the findings' messages (see ``is_stale``).
    """
    cache, key, now = _reports(), (root_dir, run), time.time()
    sig = signature(root_dir, run) if sig is None else sig
    entry = cache.get(key)
    if entry is None:  # judged before by `check --all`, on these very files and detectors? (findings.py)
        entry = _stored(root_dir, run, sig)
        if entry is not None:
            cache[key] = entry
    if entry is not None and (not compute or not is_stale(entry, sig, now, detail=detail)):
        return entry.report, entry.error, False
    if not compute:
        return None, None, True
    t0 = time.perf_counter()
    try:
        report, error, live = _judge(root_dir, run)
    except ImportError as err:
        return None, f"detectors unavailable: {err}", False
    cache[key] = Judged(sig, now, time.perf_counter() - t0, live, report, error)
    return report, error, False


def _stored(root_dir: str, run: str, sig: tuple[float, int]) -> Judged | None:
    """The run's stored judgement as a cache entry, when it was made from exactly these files."""
    stored = read_findings(root_dir, run)
    if stored is None or stored.sig != sig:
        return None
    return Judged(sig, stored.judged_at, stored.cost, stored.live, stored.report, None)


def report_stamp(root_dir: str, run: str) -> float:
    """When the cached report of ``run`` was made (0 when none): part of the chart's cache key."""
    entry = _reports().get((root_dir, run))
    return entry.judged_at if entry is not None else 0.0


def peek_report(root_dir: str, run: str, sig: tuple[float, int], *, detail: bool = False) -> tuple[object | None, bool]:
    """The cached report of ``run`` without judging (None when there is none) and whether it is still current.

    The run page draws its charts with this first, so a first visit never
    waits for the detectors; it judges afterwards when the report is stale.
    """
    entry = _reports().get((root_dir, run))
    if entry is None:
        return None, False
    return entry.report, not is_stale(entry, sig, time.time(), detail=detail)


def check_run(root_dir: str, name: str) -> str | None:
    """Why ``name`` (from a URL) cannot be shown, naming the runs that exist; None when it can."""
    try:
        check_run_name(name)
    except ValueError as err:
        return str(err)
    if root_exists(root_dir) and get_store(root_dir).has_run(name):
        return None
    names = sorted(signatures(root_dir)) if root_exists(root_dir) else []
    listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return f"no run named {name!r} under {root_dir}; runs there: {listed or 'none'}"
