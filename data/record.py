"""The run record: the Arrow schemas every stage agrees on.

Collectors and importers produce tables in these schemas, storage writes them,
the store reads them back. Column names are a public contract: other engines
(DuckDB, Spark, Trino) query the Parquet tree by these names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import pyarrow as pa

SCHEMA_VERSION = 1

# Per step and rank. NaN and Inf are data and are stored as they are; null
# means "not measured at this step".
METRIC_FIELDS: tuple[pa.Field, ...] = (
    pa.field("step", pa.int64(), nullable=False),
    pa.field("time", pa.float64()),  # unix seconds
    pa.field("tokens", pa.int64()),  # tokens consumed so far (data position)
    pa.field("samples", pa.int64()),  # samples (sequences) consumed so far
    pa.field("loss", pa.float64()),
    pa.field("grad_norm", pa.float64()),
    pa.field("loss_scale", pa.float64()),  # absent for bf16/fp32
    pa.field("act_norm", pa.float64()),  # final layer's activation norm
    pa.field("lr", pa.float64()),
    pa.field("found_inf", pa.bool_()),  # the scaler skipped this step
)
METRICS_SCHEMA = pa.schema(METRIC_FIELDS, metadata={"runwatch.schema_version": str(SCHEMA_VERSION)})
METRIC_COLUMNS: tuple[str, ...] = tuple(f.name for f in METRIC_FIELDS)
FLOAT_METRICS: tuple[str, ...] = ("loss", "grad_norm", "loss_scale", "act_norm", "lr")

# Hive partition columns: they live in the path, never inside a file.
PARTITION_COLUMNS: tuple[str, ...] = ("run", "segment", "rank")
RESERVED_NAMES = frozenset(METRIC_COLUMNS) | frozenset(PARTITION_COLUMNS) | {"event", "payload"}

ONCALL_KINDS: tuple[str, ...] = ("ack", "silence")
"""Events the on-call engineer writes (the dashboard, ``runwatch ack`` / ``silence``, or a JSONL import):
``ack`` acknowledges one finding, ``silence`` mutes a run's alerts until a time (``check_oncall_event``)."""
EVENT_KINDS: tuple[str, ...] = ("checkpoint", "resume", "config", "note", *ONCALL_KINDS)
EVENT_FIELDS: tuple[pa.Field, ...] = (
    pa.field("event", pa.string(), nullable=False),
    pa.field("step", pa.int64(), nullable=False),
    pa.field("time", pa.float64()),
    pa.field("payload", pa.string()),  # a JSON object; its keys depend on the kind
)
EVENTS_SCHEMA = pa.schema(EVENT_FIELDS, metadata={"runwatch.schema_version": str(SCHEMA_VERSION)})


def is_valid_extra_name(name: str) -> bool:
    """True for a free-form scalar name that cannot collide with the record."""
    return bool(name) and name not in RESERVED_NAMES and name.replace("_", "a").replace(".", "a").replace("/", "a").replace("-", "a").isalnum()


def metrics_table(rows: Iterable[Mapping[str, object]]) -> pa.Table:
    """Build a metrics table from row dicts: record columns first, extras as float64.

    Missing record fields become null; keys not in the record become extra
    float64 columns (bools as 0/1); ``segment`` and ``rank`` (where an importer
    knows them) stay as int32 placement columns. Raises ``ValueError`` for a row
    without a step or an extra whose name collides with the record.
    """
    rows = list(rows)
    columns: dict[str, list] = {name: [] for name in METRIC_COLUMNS}
    extras: dict[str, list] = {}
    placement = {key: [row.get(key) for row in rows] for key in ("segment", "rank") if any(key in row for row in rows)}
    for i, row in enumerate(rows):
        if row.get("step") is None:
            raise ValueError(f"row {i}: 'step' is required")
        for key in row:
            if key not in columns and key not in extras and key not in placement:
                if not is_valid_extra_name(key):
                    raise ValueError(f"row {i}: {key!r} is not a valid extra scalar name")
                extras[key] = [None] * i
        for key, values in columns.items():
            values.append(row.get(key))
        for key, values in extras.items():
            value = row.get(key)
            values.append(None if value is None else float(value))
    arrays = [pa.array(columns[f.name], type=f.type) for f in METRIC_FIELDS]
    fields = list(METRIC_FIELDS)
    for key, values in extras.items():
        arrays.append(pa.array(values, type=pa.float64()))
        fields.append(pa.field(key, pa.float64()))
    for key, values in placement.items():
        arrays.append(pa.array(values, type=pa.int32()))
        fields.append(pa.field(key, pa.int32()))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=METRICS_SCHEMA.metadata))


def conform_metrics(table: pa.Table) -> pa.Table:
    """Cast a table to the record: record columns in order with their types, extras as float64."""
    if "step" not in table.column_names:
        raise ValueError("metrics table has no 'step' column")
    arrays, fields = [], []
    for f in METRIC_FIELDS:
        if f.name in table.column_names:
            arrays.append(table[f.name].cast(f.type))
        else:
            arrays.append(pa.nulls(table.num_rows, f.type))
        fields.append(f)
    for name in table.column_names:
        if name in METRIC_COLUMNS or name in PARTITION_COLUMNS:
            continue
        if not is_valid_extra_name(name):
            raise ValueError(f"{name!r} is not a valid extra scalar name")
        arrays.append(table[name].cast(pa.float64()))
        fields.append(pa.field(name, pa.float64()))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=METRICS_SCHEMA.metadata))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_oncall_event(ev: Mapping[str, object]) -> None:
    """The shape of an ``ack`` or ``silence`` event, checked wherever one is written or imported.

    ``ack``: ``{"finding": {"kind": str, "segment": int >= 0, "onset_step": int}, "by": str, "note": str}``
    names the finding by what identifies it across judgements (its kind, segment and onset).
    ``silence``: ``{"until": unix seconds, "by": str, "note": str}``. ``by`` is required, ``note`` may be
    left out (an empty note). Raises ``ValueError`` naming the field.
    """
    kind = ev.get("event")
    if kind not in ONCALL_KINDS:
        return
    by, note = ev.get("by"), ev.get("note", "")
    if not isinstance(by, str) or not by.strip():
        raise ValueError(f"an {kind} event needs 'by': who (a non-empty string), got {by!r}")
    if not isinstance(note, str):
        raise ValueError(f"'note' must be a string, got {note!r}")
    if kind == "ack":
        finding = ev.get("finding")
        if not (isinstance(finding, Mapping) and isinstance(finding.get("kind"), str) and finding["kind"]
                and _is_int(finding.get("segment")) and finding["segment"] >= 0
                and _is_int(finding.get("onset_step"))):
            raise ValueError("an ack needs 'finding': {\"kind\": str, \"segment\": int >= 0, \"onset_step\": int}, "
                             f"got {finding!r}")
    else:
        until = ev.get("until")
        if isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until):
            raise ValueError(f"a silence needs 'until': unix seconds (a finite number), got {until!r}")


def json_safe(value: object) -> object:
    """Non-finite floats as the strings 'NaN', 'Infinity', '-Infinity' so the JSON stays strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def segment_cuts(first_steps: Mapping[int, int], last_steps: Mapping[int, int],
                 resume_steps: Mapping[int, int]) -> dict[int, int | None]:
    """The main-line rule of the record, written once: per segment, the first step a later segment replaced.

    A segment that resumed from the checkpoint of step s (its ``resume`` event
    carries s) replaces every older row after s, even when its own first
    logged step is later (skipped batches advance the step counter); without a
    resume event a segment replaces from its first step. For segment k the cut
    is the smallest such step over the later segments; k's rows at or after
    the cut are an abandoned branch, and ``None`` means none of k's rows is.
    """
    starts = {seg: min(first, resume_steps[seg] + 1) if seg in resume_steps else first
              for seg, first in first_steps.items()}
    out: dict[int, int | None] = {}
    for seg in sorted(first_steps):
        later = [start for other, start in starts.items() if other > seg]
        cut = min(later) if later else None
        # A cut before the segment's first step abandons all of it, from its first step.
        out[seg] = max(cut, first_steps[seg]) if cut is not None and cut <= last_steps[seg] else None
    return out


def resume_steps_of(events: Iterable[Mapping[str, object]]) -> dict[int, int]:
    """Segment -> the checkpoint step it resumed from, from ``resume`` events (segment, event, step)."""
    out: dict[int, int] = {}
    for ev in events:
        if ev.get("event") == "resume" and ev.get("segment") is not None and ev.get("step") is not None:
            seg, step = int(ev["segment"]), int(ev["step"])
            out[seg] = min(step, out.get(seg, step))
    return out


def rank_hosts(meta: Mapping[str, object], segment: int) -> dict[int, str]:
    """Rank -> host of one segment, the record's rule for ``run.json``'s ``hosts``.

    Every rank registers itself when it starts: ``"hosts": {"<segment>": {"<rank>": "<host>"}}``. A segment
    that registered nobody (an import, an older record) takes the nearest earlier segment's map, and rank 0
    falls back to the run's ``host``.
    """
    hosts = meta.get("hosts")
    found: dict[int, str] = {}
    if isinstance(hosts, Mapping):
        earlier = [int(k) for k in hosts if str(k).isdigit() and int(k) <= segment]
        if earlier:
            entry = hosts.get(str(max(earlier)))
            if isinstance(entry, Mapping):
                found = {int(r): str(h) for r, h in entry.items() if str(r).isdigit()}
    if 0 not in found and isinstance(meta.get("host"), str):
        found[0] = meta["host"]
    return found


def segment_members(meta: Mapping[str, object], segment: int) -> list[int] | None:
    """The ranks that registered in exactly this segment (None when none did: go by the ranks with rows)."""
    hosts = meta.get("hosts")
    entry = hosts.get(str(segment)) if isinstance(hosts, Mapping) else None
    if not isinstance(entry, Mapping) or not entry:
        return None
    return sorted(int(r) for r in entry if str(r).isdigit())
