"""runwatch: flight recorder and on-call assistant for long training runs.

Stages, in the direction data flows: ``runwatch.collectors`` (torch hooks,
log importers) -> ``runwatch.data`` (the record, Parquet storage, DuckDB
store) -> ``runwatch.detectors`` (findings, segments, rollback advice) ->
``runwatch.app`` (CLI, dashboard).
"""

__version__ = "0.1.0"
