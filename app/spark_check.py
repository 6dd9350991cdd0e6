"""``runwatch check --all --engine spark``: every run of the tree judged on a Spark cluster.

Spark reads the committed Parquet parts (the list runwatch resolves, so an
object store's op records are honoured: no compaction is ever seen half
done), groups the rows by run, and ``applyInPandas`` hands each run to a
Python worker, which judges it with the same ``judge_run`` and the same
queries as ``runwatch check`` (``data.framestore.FrameStore``), writes the
run's findings file and returns the ``check --json`` object.

Pandas has no null for floats, so a null cell (not measured) would come
back as NaN (a real NaN loss is a finding): each column travels with a null
mask, and the worker rebuilds the exact Arrow column. Spark on ``s3://``
roots reads through ``s3a://`` and the cluster's own ``hadoop-aws`` jars
(the pip-installed PySpark has none); the workers reach the same root
through fsspec for events and metadata.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa

from runwatch.data.roots import is_url, open_root

_NULL = "__isnull__"
_RESULT_SCHEMA = "run string, result string"


def _spark_path(path: str) -> str:
    """Where Spark reads a part: ``s3a://`` for S3 (Hadoop's connector), a plain path on disk."""
    return "s3a://" + path[len("s3://"):] if path.startswith("s3://") else path


def _session(master: str | None) -> tuple[object, bool]:
    """The Spark session to judge in, and whether this call started it (then it stops it too)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as err:
        raise ImportError("--engine spark needs PySpark: pip install 'runwatch[spark]'") from err
    ours = SparkSession.getActiveSession() is None
    builder = SparkSession.builder.appName("runwatch check --all")
    master = master or os.environ.get("SPARK_MASTER") or "local[*]"
    builder = builder.master(master)
    if master.startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable  # local workers: this interpreter, which has runwatch
    # Run names such as "123" must stay strings; segment and rank are cast below.
    session = (builder.config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    return session, ours


def _arrow_type(spark_type: object) -> pa.DataType:
    from pyspark.sql.types import BooleanType, IntegerType, LongType

    if isinstance(spark_type, LongType):
        return pa.int64()
    if isinstance(spark_type, IntegerType):
        return pa.int32()
    if isinstance(spark_type, BooleanType):
        return pa.bool_()
    return pa.float64()


def rows_from_pandas(pdf: object, types: dict[str, pa.DataType]) -> pa.Table:
    """The run's Arrow rows from a pandas group: each column rebuilt with its null mask (see the docstring)."""
    arrays, fields = [], []
    for name, dtype in types.items():
        mask = pdf[_NULL + name].to_numpy(dtype=bool)
        values = pdf[name]
        if pa.types.is_string(dtype):
            arr = pa.array(values.astype(object).where(~mask, None).tolist(), pa.string())
        elif pa.types.is_boolean(dtype):
            arr = pa.array(values.fillna(False).to_numpy(dtype=bool), pa.bool_(), mask=mask)
        elif pa.types.is_integer(dtype):
            arr = pa.array(values.fillna(0).to_numpy(dtype="int64"), pa.int64(), mask=mask).cast(dtype)
        else:
            arr = pa.array(values.to_numpy(dtype="float64"), pa.float64(), mask=mask)
        arrays.append(arr)
        fields.append(pa.field(name, dtype))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def judge_group(root: str, types: dict[str, pa.DataType], now: float | None):
    """The ``applyInPandas`` function: one run's rows in, one row (run, JSON result) out."""

    def judge(pdf):
        import pandas as pd

        from runwatch.app.findings import judge_and_store
        from runwatch.data.framestore import FrameStore
        from runwatch.detectors.segment_scan import THREADS_ENV

        os.environ[THREADS_ENV] = "1"  # Spark already runs a task per core
        run = str(pdf["run"].iloc[0])
        try:
            with FrameStore(root, run, rows_from_pandas(pdf, types)) as store:
                result = judge_and_store(store, run, engine="spark", now=now)
        except (ValueError, RuntimeError, OSError, ArithmeticError, MemoryError) as err:
            result = {"run": run, "error": f"{type(err).__name__}: {' '.join(str(err).split())}"}
        return pd.DataFrame({"run": [run], "result": [json.dumps(result, allow_nan=False)]})

    return judge


def check_all_spark(root: str | Path, *, master: str | None = None, now: float | None = None) -> list[dict]:
    """Judge every run with Spark; returns each run's ``check --json`` object (or ``{"run", "error"}``)."""
    from pyspark.sql import functions as F

    location = open_root(root)
    files = [_spark_path(f.path) for f in location.files(None, "metrics")]
    if not files:
        return []
    base = _spark_path(location.url if is_url(root) else str(Path(root).resolve()))
    spark, ours = _session(master)
    try:
        spark.sparkContext.setLogLevel("ERROR")
        frame = (spark.read.option("basePath", base).option("mergeSchema", "true").parquet(*files)
                 .withColumn("segment", F.col("segment").cast("int")).withColumn("rank", F.col("rank").cast("int")))
        types = {f.name: (pa.string() if f.name == "run" else _arrow_type(f.dataType)) for f in frame.schema.fields}
        masked = frame.select(*frame.columns, *[F.isnull(c).alias(_NULL + c) for c in frame.columns])
        now = time.time() if now is None else now  # one clock for every run
        where = str(root) if is_url(root) else str(Path(root).resolve())  # the workers' view of the root
        judged = masked.groupBy("run").applyInPandas(judge_group(where, types, now), schema=_RESULT_SCHEMA)
        return [json.loads(row["result"]) for row in judged.collect()]
    finally:
        if ours:  # a session the caller already had (a notebook's) stays theirs to stop
            spark.stop()
