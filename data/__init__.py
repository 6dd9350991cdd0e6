"""runwatch.data: the run record, the Parquet tree, and the DuckDB store over it."""

from runwatch.data.compact import CompactResult, compact
from runwatch.data.locks import RunBusy, RunLock
from runwatch.data.record import EVENTS_SCHEMA, METRIC_COLUMNS, METRICS_SCHEMA, SCHEMA_VERSION
from runwatch.data.staging import StagedRun
from runwatch.data.storage import StagedWrite
from runwatch.data.store import Store, StoreError

__all__ = ["EVENTS_SCHEMA", "METRIC_COLUMNS", "METRICS_SCHEMA", "SCHEMA_VERSION", "CompactResult", "RunBusy",
           "RunLock", "StagedRun", "StagedWrite", "Store", "StoreError", "compact"]
