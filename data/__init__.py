"""runwatch.data: the run record, the Parquet tree, and the DuckDB store over it."""

from runwatch.data.record import EVENTS_SCHEMA, METRIC_COLUMNS, METRICS_SCHEMA, SCHEMA_VERSION
from runwatch.data.storage import StagedWrite, compact
from runwatch.data.store import Store, StoreError

__all__ = ["EVENTS_SCHEMA", "METRIC_COLUMNS", "METRICS_SCHEMA", "SCHEMA_VERSION", "StagedWrite", "Store", "StoreError", "compact"]
