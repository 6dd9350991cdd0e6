"""``FrameStore``: the store's questions about one run, answered from rows another engine already read.

Spark (``app/spark_check.py``) reads the Parquet tree itself and hands each
run's rows to a Python worker. To judge them exactly as ``runwatch check``
does, the worker answers ``judge_run``'s questions with the *same* SQL as
``Store`` (segments, rows with the main-line cut, ranks, columns), run by
DuckDB over the handed rows instead of over ``read_parquet($files)``; events
and run metadata are small and are read from the root as usual. Rows must
come with the partition columns typed as the store types them (``run``
string, ``segment`` and ``rank`` int32) and nulls kept apart from NaN.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from runwatch.data.store import _READ, Store, StoreError, query_arrow

_FRAME = "run_frame"


class FrameStore(Store):
    """A ``Store`` whose metrics queries for one run read ``rows`` (an Arrow table) instead of the files."""

    def __init__(self, root: str | Path, run: str, rows: pa.Table) -> None:
        super().__init__(root)
        self.run = run
        data = [c for c in rows.column_names if c not in ("run", "segment", "rank")]
        # The column order read_parquet gives: the files' columns, then the Hive keys in path order.
        self._rows = rows.select([*data, "run", "segment", "rank"]).cast(pa.schema(
            [rows.schema.field(c) for c in data]
            + [pa.field("run", pa.string()), pa.field("segment", pa.int32()), pa.field("rank", pa.int32())]))

    def _query_run(self, sql: str, run: str, params: dict | None = None) -> pa.Table:
        if run != self.run:
            raise ValueError(f"run {run!r} is not the run this frame holds ({self.run!r})")
        con = self._con.cursor()
        try:
            con.register(_FRAME, self._rows)
            return query_arrow(con, sql.replace(_READ, _FRAME), params or {})
        except duckdb.Error as err:
            raise StoreError(f"run {run!r}: query over its rows failed: {err}") from err

    def _generation(self, run: str) -> object:
        return None  # the rows were read once: they cannot change under us

    def has_run(self, run: str) -> bool:
        return run == self.run and self._rows.num_rows > 0

    def run_names(self) -> list[str]:
        return [self.run]
