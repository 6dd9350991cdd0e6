"""The store: DuckDB over the Parquet tree, answering what detectors and the dashboard ask.

Every query reads the committed files directly, binds values as parameters,
and returns Arrow tables. SQL text lives in the module constants below; the
only interpolated identifier is a metric column name, checked against the
files' own schema and quoted by ``quote_ident``.

Writers switch whole trees in while we read (``compact``, ``--replace``): a
query whose listed files were switched away lists them again, and a call whose
run directory was exchanged under it runs again, so a caller sees the old run
or the new one, never a mix and never an error. One unreadable file fails only
its own run: ``runs()`` summarises each run on its own and reports the failure
in that run's ``error`` column.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from runwatch.data.downsample import envelopes
from runwatch.data.record import EVENTS_SCHEMA, resume_steps_of, segment_cuts
from runwatch.data.roots import FileInfo, Root, is_url, local_path, open_root, run_of, segment_rank


def query_arrow(con: duckdb.DuckDBPyConnection, sql: str, params: dict) -> pa.Table:
    """Run ``sql`` with bound ``params`` and return Arrow; pass a cursor per thread."""
    rel = con.sql(sql, params=params)
    # DuckDB 1.4 renamed .arrow() (which now streams) to .to_arrow_table().
    return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


class StoreError(RuntimeError):
    """A query over the store failed (unreadable file, bad column)."""


_ATTEMPTS = 5
"""How often a read is retried when a writer switched the files under it (each switch is one rename)."""

RUNS_SCHEMA = pa.schema([
    pa.field("run", pa.string()), pa.field("first_step", pa.int64()), pa.field("last_step", pa.int64()),
    pa.field("num_segments", pa.int64()), pa.field("num_ranks", pa.int64()), pa.field("last_time", pa.float64()),
    pa.field("tokens", pa.int64()), pa.field("num_rows", pa.int64()), pa.field("last_update", pa.float64()),
    pa.field("error", pa.string()),
])
"""``Store.runs()``: one row per run; ``error`` is null, or why the run cannot be read (naming the file)."""


def _consistent(method: Callable) -> Callable:
    """Run ``method(self, run, ...)`` again when the run's directory was switched while it ran."""

    @functools.wraps(method)
    def wrapper(self: "Store", run: str, *args: object, **kwargs: object) -> object:
        for _ in range(_ATTEMPTS):
            before = self._generation(run)
            result = method(self, run, *args, **kwargs)
            if self._generation(run) == before:
                return result
        return result

    return wrapper


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_READ = (
    "read_parquet($files, hive_partitioning=1, union_by_name=1, "
    "hive_types={'run': VARCHAR, 'segment': INTEGER, 'rank': INTEGER})"
)

# Per-segment step and time ranges; where a later segment cut each one off is the
# record's rule (``segment_cuts``), applied in Python and bound into the row queries.
_SEGMENTS_SQL = f"""
SELECT segment, min(step) AS first_step, max(step) AS last_step,
       min(time) AS first_time, max(time) AS last_time, count(*) AS num_rows
FROM {_READ} GROUP BY segment ORDER BY segment
"""

# The (segment, cut step) pairs of ``segment_cuts``, as a table to join on.
_CUTS = "cut AS (SELECT unnest($cut_segments::INTEGER[]) AS segment, unnest($cut_steps::BIGINT[]) AS cut_step)"

_MAIN = "(cut.cut_step IS NULL OR m.step < cut.cut_step)"
"""A row ``m`` joined to its segment's ``cut`` is on the main line: the SQL form of ``segment_cuts``' rule."""

_ROWS_SQL = f"""
WITH m AS (SELECT * EXCLUDE (run) FROM {_READ} WHERE ($rank IS NULL OR rank = $rank)), {_CUTS}
SELECT m.*, {_MAIN} AS main
FROM m LEFT JOIN cut USING (segment)
WHERE ($lo IS NULL OR m.step >= $lo) AND ($hi IS NULL OR m.step <= $hi)
ORDER BY m.segment, m.rank, m.step
"""

_RUNS_SQL = f"""
SELECT run, min(step) AS first_step, max(step) AS last_step, count(DISTINCT segment) AS num_segments,
       count(DISTINCT rank) AS num_ranks, max(time) AS last_time, max(tokens) AS tokens, count(*) AS num_rows
FROM {_READ} GROUP BY run ORDER BY run
"""

# The columns a chart needs, with the main-line flag (the per-bucket envelopes are ``downsample.py``'s).
_CHART_ROWS_SQL = f"""
WITH m AS (SELECT segment, rank, step, time, __COLS__ FROM {_READ} WHERE ($rank IS NULL OR rank = $rank)), {_CUTS}
SELECT m.*, {_MAIN} AS main
FROM m LEFT JOIN cut USING (segment)
"""

# The tokens the main line reached (an abandoned branch may have run further before the resume cut it).
_MAIN_TOKENS_SQL = f"""
WITH m AS (SELECT segment, step, tokens FROM {_READ}), {_CUTS}
SELECT max(m.tokens) AS tokens FROM m LEFT JOIN cut USING (segment) WHERE {_MAIN}
"""


def derived_step_time(rows: pa.Table) -> np.ndarray:
    """Seconds per step from consecutive rows of each segment and rank (NaN where it cannot be told)."""
    seg = rows["segment"].to_numpy(zero_copy_only=False).astype(np.int64)
    rank = rows["rank"].to_numpy(zero_copy_only=False).astype(np.int64)
    step = rows["step"].to_numpy(zero_copy_only=False).astype(np.int64)
    t = np.asarray(pc.fill_null(rows["time"], np.nan).to_numpy(zero_copy_only=False), dtype=float)
    order = np.lexsort((step, rank, seg))
    same = (seg[order][1:] == seg[order][:-1]) & (rank[order][1:] == rank[order][:-1])
    d_step = np.diff(step[order]).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_step = np.where(same & (d_step != 0), np.diff(t[order]) / d_step, np.nan)
    out = np.full(step.size, np.nan)
    out[order[1:]] = per_step
    return out


def unreadable(run: str, files: list[str], err: Exception, root: Root | None = None) -> str:
    """One line saying why ``run`` cannot be read, naming the first file Parquet itself rejects."""
    for f in files:
        try:
            if root is None:
                pq.read_metadata(f)
            else:
                with root.open(f) as fh:
                    pq.read_metadata(fh)
        except FileNotFoundError:
            continue
        except (OSError, pa.ArrowException) as bad:
            return f"run {run!r}: cannot read {f}: {_one_line(bad)}"
    return f"run {run!r}: query failed: {_one_line(err)}"


def _key(stats: list[FileInfo]) -> tuple:
    """What identifies a run's files: a new, removed, rewritten or switched file changes it."""
    return tuple((f.path, f.ident, f.size) for f in stats)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def _read_events(path: str, data: bytes) -> list[dict]:
    """The events of one JSONL part; a malformed line is a ``StoreError`` naming path:line."""
    segment, rank = segment_rank(path)
    records = []
    for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as err:
            raise StoreError(f"{path}:{lineno}: not a JSON event ({err})") from err
        if not (isinstance(ev, dict) and isinstance(ev.get("event"), str) and isinstance(ev.get("step"), int)
                and not isinstance(ev.get("step"), bool)):
            raise StoreError(f"{path}:{lineno}: expected an event object with 'event' and an integer 'step'")
        time_ = ev.get("time")
        records.append({"segment": segment, "rank": rank, "event": ev["event"], "step": ev["step"],
                        "time": time_ if isinstance(time_, (int, float)) and not isinstance(time_, bool) else None,
                        "payload": json.dumps(ev.get("payload") or {})})
    return records


# Per rank and bucket of steps on the main line: min and max of the rank's time before the first collective
# (input wait + forward pass, __VALUE__) or, for runs that did not time it, the step time from consecutive rows.
_RANK_BUCKETS_SQL = f"""
WITH m AS (SELECT rank, segment, step, time, __COLS__ FROM {_READ}), {_CUTS},
v AS (
  SELECT m.rank, m.step, __VALUE__ AS v
  FROM m LEFT JOIN cut USING (segment)
  WHERE {_MAIN}
  WINDOW w AS (PARTITION BY m.rank, m.segment ORDER BY m.step)
),
r AS (SELECT min(step) AS lo, max(step) AS hi FROM v),
b AS (SELECT v.*, least(CAST(floor((step - lo) * $num_buckets / greatest(hi - lo, 1)) AS BIGINT), $num_buckets - 1)
      AS bucket FROM v, r WHERE v IS NOT NULL AND isfinite(v))
SELECT rank, bucket, min(step) AS x_first, max(step) AS x_last, min(v) AS min, max(v) AS max, count(*) AS num_rows
FROM b GROUP BY rank, bucket ORDER BY rank, bucket
"""
_PRE_COLLECTIVE = "m.forward_time + coalesce(m.data_time, 0)"
_STEP_TIME = "(m.time - lag(m.time) OVER w) / nullif(m.step - lag(m.step) OVER w, 0)"


class Store:
    """Read-only view of one runwatch root: a directory, or an object-store URL (``roots.open_root``)."""

    def __init__(self, root: str | Path) -> None:
        self.location = open_root(root)
        # A URL stays a string (``Path`` would fold ``s3://`` into ``s3:/``).
        self.root: Path | str = str(root).rstrip("/") if is_url(root) else local_path(root)
        self._con = duckdb.connect(":memory:")
        if is_url(root):  # DuckDB reads the parts through the same fsspec filesystem
            self._con.register_filesystem(self.location.fs)
        self._summaries: dict[str, tuple[tuple, dict]] = {}

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, params: dict) -> pa.Table:
        try:
            return query_arrow(self._con.cursor(), sql, params)
        except duckdb.Error as err:
            raise StoreError(f"query over {self.root} failed: {err}") from err

    def _query_run(self, sql: str, run: str, params: dict | None = None) -> pa.Table:
        """``sql`` over the run's files (bound as ``$files``); listed again if a writer switched them away."""
        for attempt in range(_ATTEMPTS):
            files = self._run_files(run)
            try:
                return query_arrow(self._con.cursor(), sql, {"files": files, **(params or {})})
            except duckdb.Error as err:
                if attempt + 1 < _ATTEMPTS and not all(self.location.exists(f) for f in files):
                    continue  # compact or --replace switched the tree between listing and reading
                raise StoreError(unreadable(run, files, err, self.location)) from err
        raise AssertionError("unreachable")

    def _generation(self, run: str) -> object:
        """Identity of the run's tree: a whole-run switch (``--replace``) changes it."""
        return self.location.generation(run)

    def _files(self, run: str | None = None) -> list[str]:
        return [f.path for f in self.location.files(run, "metrics")]

    def run_names(self) -> list[str]:
        return self.location.runs()

    def runs(self) -> pa.Table:
        """One row per run with metrics (``RUNS_SCHEMA``): step range, segments, ranks, last time,
        tokens, rows, last file update, and ``error`` when the run cannot be read.

        A summary is reused while the run's files (names, sizes, mtimes) are
        unchanged. The changed runs are summarised in one query when that
        succeeds; when it fails, each on its own, so a corrupt file fails only
        its run.
        """
        stats: dict[str, list[FileInfo]] = {}
        for f in self.location.files(None, "metrics"):  # one listing of the root (one LIST on a bucket)
            stats.setdefault(run_of(f.path), []).append(f)
        stats = dict(sorted(stats.items()))
        stale = [run for run, st in stats.items() if self._summaries.get(run, (None,))[0] != _key(st)]
        if len(stale) > 1:
            self._summarise_together(stale, stats)
        for run in stale:
            if self._summaries.get(run, (None,))[0] != _key(stats[run]):
                self._summarise(run, stats[run])
        return pa.Table.from_pylist([self._summaries[run][1] for run in stats], schema=RUNS_SCHEMA)

    def _stats(self, run: str) -> list[FileInfo]:
        return self.location.files(run, "metrics")  # listed again by the root when a switch overtook it

    def _summarise_together(self, runs: list[str], stats: dict[str, list[FileInfo]]) -> None:
        """Summaries of several runs from one query; on any failure none is kept (each is then tried alone)."""
        try:
            table = query_arrow(self._con.cursor(), _RUNS_SQL, {"files": [f.path for r in runs for f in stats[r]]})
        except duckdb.Error:
            return
        for row in table.to_pylist():
            run = row["run"]
            if run in stats:
                row.update(error=None, last_update=max(f.mtime for f in stats[run]))
                self._summaries[run] = (_key(stats[run]), row)

    def _summarise(self, run: str, stats: list[FileInfo]) -> None:
        try:
            row = {**self._query_run(_RUNS_SQL, run).to_pylist()[0], "run": run, "error": None}
        except StoreError as err:
            row = {"run": run, "error": str(err)}
        row["last_update"] = max(f.mtime for f in stats)
        self._summaries[run] = (_key(stats), row)

    def last_update(self, run: str) -> float | None:
        """Modification time of the run's newest file (a cheap liveness signal)."""
        return max((f.mtime for f in self._stats(run)), default=None)

    def meta(self, run: str) -> dict:
        return self.location.meta(run)

    def has_run(self, run: str) -> bool:
        return self.location.has_run(run)

    def _run_files(self, run: str) -> list[str]:
        files = self._files(run)
        if not files:
            raise ValueError(f"run {run!r} has no metrics under {self.root}")
        return files

    @_consistent
    def segments(self, run: str) -> pa.Table:
        """Each segment's step and time range, and ``abandoned_from``: the first of its steps a later
        segment replaced (``segment_cuts``), or null."""
        table = self._query_run(_SEGMENTS_SQL, run)
        cuts = self._cuts(run, table)
        return table.append_column("abandoned_from", pa.array([cuts[s] for s in table["segment"].to_pylist()],
                                                              pa.int64()))

    def _cuts(self, run: str, segments: pa.Table | None = None) -> dict[int, int | None]:
        segments = self._query_run(_SEGMENTS_SQL, run) if segments is None else segments
        seg = segments["segment"].to_pylist()
        return segment_cuts(dict(zip(seg, segments["first_step"].to_pylist())),
                            dict(zip(seg, segments["last_step"].to_pylist())),
                            resume_steps_of(self.events(run).to_pylist()))

    def _cut_params(self, run: str) -> dict:
        cuts = {seg: cut for seg, cut in self._cuts(run).items() if cut is not None}
        return {"cut_segments": list(cuts), "cut_steps": list(cuts.values())}

    @_consistent
    def rows(self, run: str, rank: int | None = 0, lo: int | None = None, hi: int | None = None) -> pa.Table:
        """All rows of a run (all segments), with ``segment``, ``rank`` and ``main``.

        ``main`` is true where the row is on the main line: no later segment
        replaced it (``segment_cuts``: a resume from step s replaces the rows after s). ``rank=None`` returns every rank.
        """
        params = {"rank": rank, "lo": lo, "hi": hi, **self._cut_params(run)}
        return self._query_run(_ROWS_SQL, run, params)

    @_consistent
    def main_tokens(self, run: str) -> int | None:
        """The most tokens a main-line row records (None when the run records none)."""
        if "tokens" not in self.columns(run):
            return None
        return self._query_run(_MAIN_TOKENS_SQL, run, self._cut_params(run))["tokens"][0].as_py()

    def main_line(self, run: str, rank: int | None = 0) -> pa.Table:
        rows = self.rows(run, rank)
        return rows.filter(rows["main"])

    def branches(self, run: str, rank: int | None = 0) -> pa.Table:
        rows = self.rows(run, rank)
        return rows.filter(pc.invert(rows["main"]))

    def ranks(self, run: str) -> list[int]:
        table = self._query_run(f"SELECT DISTINCT rank FROM {_READ} ORDER BY rank", run)
        return table["rank"].to_pylist()

    @_consistent
    def events(self, run: str) -> pa.Table:
        """The run's events (segment, rank, event, step, time, payload as JSON text), by step."""
        for attempt in range(_ATTEMPTS):
            try:
                records = [r for f in self.location.files(run, "events")
                           for r in _read_events(f.path, self.location.read_bytes(f.path))]
                break
            except FileNotFoundError:
                if attempt + 1 == _ATTEMPTS:
                    raise
        records.sort(key=lambda r: (r["step"], r["segment"]))
        schema = pa.schema([pa.field("segment", pa.int32()), pa.field("rank", pa.int32()), *EVENTS_SCHEMA])
        return pa.Table.from_pylist(records, schema=schema)

    def rank_buckets(self, run: str, num_buckets: int = 400) -> tuple[pa.Table, str]:
        """Per rank and bucket of main-line steps: first/last step, min and max of the time each rank spent
        before the first collective (input wait + forward pass: the part of a synchronous step that differs
        between ranks) when the run timed it, else of the step time. Returns (table, which of the two)."""
        if num_buckets < 1:
            raise ValueError("num_buckets must be >= 1")
        names = set(self.columns(run))
        timed = "forward_time" in names
        cols = ["forward_time"] + (["data_time"] if "data_time" in names else []) if timed else []
        value = _PRE_COLLECTIVE if timed else _STEP_TIME
        if timed and "data_time" not in names:
            value = "m.forward_time"
        sql = _RANK_BUCKETS_SQL.replace("__COLS__", ", ".join(quote_ident(c) for c in cols) or "NULL AS _none")
        table = self._query_run(sql.replace("__VALUE__", value), run,
                                {"num_buckets": int(num_buckets), **self._cut_params(run)})
        return table, "pre_collective" if timed else "step_time"

    def columns(self, run: str) -> list[str]:
        """Metric columns present in the run's files (record columns and extras)."""
        table = self._query_run(f"DESCRIBE SELECT * FROM {_READ}", run)
        return [c for c in table["column_name"].to_pylist() if c not in ("run", "segment", "rank")]

    def downsample(
        self, run: str, column: str, *, x: str = "step", num_buckets: int = 2000,
        lo: float | None = None, hi: float | None = None, rank: int | None = 0,
    ) -> pa.Table:
        """Per-bucket first/last/min/max of ``column`` over ``x`` in [lo, hi], per segment and branch.

        A range holding fewer rows than buckets comes back at full resolution
        (one row per bucket), so zooming in always reaches the raw values.
        """
        if column not in self.columns(run) and column != "step_time":
            raise ValueError(f"run {run!r} has no column {column!r}")
        result = self.downsample_columns(run, [column], x=x, num_buckets=num_buckets, lo=lo, hi=hi, rank=rank)
        return result.get(column, pa.table({}))

    @_consistent
    def downsample_columns(
        self, run: str, columns: list[str], *, x: str = "step", num_buckets: int = 2000,
        lo: float | None = None, hi: float | None = None, rank: int | None = 0,
    ) -> dict[str, pa.Table]:
        """``downsample`` for several columns from one read of the run (the dashboard's run page).

        Reads only the needed columns once. ``step_time`` is accepted even when
        not stored: seconds per step from consecutive rows of each segment.
        Columns the run lacks are left out of the result.
        """
        names = set(self.columns(run))
        if x not in names:
            raise ValueError(f"run {run!r} has no column {x!r}")
        if num_buckets < 1:
            raise ValueError("num_buckets must be >= 1")
        wanted = [c for c in dict.fromkeys(columns) if c in names or c == "step_time"]
        stored = [c for c in dict.fromkeys([x, *wanted]) if c in names and c not in ("segment", "rank", "step", "time")]
        sql = _CHART_ROWS_SQL.replace("__COLS__", ", ".join(quote_ident(c) for c in stored) or "NULL AS _none")
        rows_tbl = self._query_run(sql, run, {"rank": rank, **self._cut_params(run)})
        if "step_time" not in names:  # seconds per step between logged rows, when the run does not store it
            rows_tbl = rows_tbl.append_column("step_time", pa.array(derived_step_time(rows_tbl)))
        if lo is None or hi is None:
            lo = pc.min(rows_tbl[x]).as_py() if lo is None else lo
            hi = pc.max(rows_tbl[x]).as_py() if hi is None else hi
        if lo is None or hi is None:
            return {}
        return envelopes(rows_tbl, x, wanted, lo=float(lo), hi=float(hi), num_buckets=int(num_buckets))
