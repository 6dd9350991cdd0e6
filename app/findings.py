"""Stored judgements: each run's findings as JSONL beside its data, so an archived run is judged once.

``runwatch check --all`` (either engine) writes ``ROOT/run=<id>/findings.jsonl``
(outside ``segment=*/rank=*``, with no ``.parquet`` suffix: neither the
metrics glob nor the events listing can match it). The first line is the
run's verdict, every further line one finding (the objects of ``check
--json``), each stamped with:

* ``detector_version``: runwatch's version and a digest of the detectors'
  source, so any change to a detector or a threshold makes every stored
  judgement stale;
* ``run_last_modified`` and ``run_num_files``: the run's files when it was
  judged (newest modification time, number of data files): the dashboard's
  own signature of a run (``state.signature``), so a run whose files are
  newer is judged again.

The dashboard's overview starts from these instead of judging every archived
run again (``state.report_for``); a live run is still looked at again when
time alone could change its verdict. The file is data for other engines too
(``read_json('ROOT/*/findings.jsonl')`` in DuckDB, Spark's ``read.json``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from functools import cache
from importlib import metadata
from pathlib import Path

from runwatch.data.roots import Root, is_url, open_root
from runwatch.data.storage import run_dir, write_bytes_atomic
from runwatch.detectors.analysis import Report
from runwatch.detectors.finding import Finding, Rollback, SegmentInfo

FINDINGS_FILE = "findings.jsonl"


@cache
def detector_version() -> str:
    """``<runwatch version>+<digest of the detectors' source>``: changes whenever any detector does."""
    from runwatch import detectors

    digest = hashlib.sha256()
    for path in sorted(Path(detectors.__path__[0]).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    try:
        version = metadata.version("runwatch")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"{version}+{digest.hexdigest()[:12]}"


def signature_of(root: Root, run: str) -> tuple[float, int]:
    """(newest modification time, number of data files) of a run: the dashboard's signature."""
    files = root.files(run, "metrics") + root.files(run, "events")
    return (max((f.mtime for f in files), default=0.0), len(files))


def findings_lines(run: str, report: dict, sig: tuple[float, int], *, judged_at: float, live: bool,
                   cost: float, engine: str) -> bytes:
    """The JSONL of one run's judgement (see the module docstring)."""
    stamp = {"run": run, "detector_version": detector_version(), "run_last_modified": sig[0],
             "run_num_files": sig[1], "judged_at": judged_at}
    head = {"record": "run", **stamp, "health": report["health"], "live": live, "cost_seconds": cost,
            "engine": engine, "segments": report["segments"], "rollback": report["rollback"]}
    lines = [head] + [{"record": "finding", **stamp, **f} for f in report["findings"]]
    return "".join(json.dumps(line, allow_nan=False) + "\n" for line in lines).encode()


def write_findings(root: str | Path, run: str, data: bytes) -> None:
    """Put a run's findings file (one atomic rename on disk, one PUT on an object store)."""
    if is_url(root):
        from runwatch.data.objstore import ObjectRoot

        ObjectRoot(str(root), create=True).put(f"run={run}/{FINDINGS_FILE}", data)
    else:
        write_bytes_atomic(data, run_dir(root, run) / FINDINGS_FILE)


@dataclasses.dataclass(frozen=True)
class Stored:
    """A run's judgement as read back from its findings file."""

    report: Report
    sig: tuple[float, int]
    judged_at: float
    live: bool
    cost: float


def _fields(cls: type, record: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in record.items() if k in names}


def parse_findings(data: bytes) -> Stored | None:
    """A findings file's judgement, or None when it is unreadable or made by other detectors."""
    try:
        records = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        head = records[0]
        if head.get("record") != "run" or head.get("detector_version") != detector_version():
            return None
        findings = [Finding(**_fields(Finding, r)) for r in records[1:] if r.get("record") == "finding"]
        segments = [SegmentInfo(**_fields(SegmentInfo, s)) for s in head["segments"]]
        rollback = Rollback(**_fields(Rollback, head["rollback"])) if head["rollback"] else None
        report = Report(findings, segments, rollback, head["health"])
        return Stored(report, (float(head["run_last_modified"]), int(head["run_num_files"])),
                      float(head["judged_at"]), bool(head.get("live")), float(head.get("cost_seconds") or 0.0))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def read_findings(root: str | Path, run: str) -> Stored | None:
    """The stored judgement of ``run`` (None when there is none, or it is stale by detector version)."""
    location = open_root(root)
    path = location.full(f"run={run}/{FINDINGS_FILE}") if is_url(root) else str(run_dir(root, run) / FINDINGS_FILE)
    try:
        return parse_findings(location.read_bytes(path))
    except (FileNotFoundError, OSError):
        return None


def judge_and_store(store: object, run: str, *, engine: str, now: float | None = None) -> dict:
    """Judge one run (``judge_run``), write its findings file, return the ``check --json`` object (with each
    finding's acknowledgement and the silence in force: ``check.to_json``)."""
    from runwatch.app.check import to_json
    from runwatch.app.judge import is_live, judge_run
    from runwatch.app.oncall import read_oncall

    sig = signature_of(store.location, run)  # before judging: files that land meanwhile make it stale
    t0 = time.perf_counter()
    judged = judge_run(store, run, now=now)
    report = judged.to_dict(run)
    cost = time.perf_counter() - t0
    events = store.events(run)
    clock = time.time() if now is None else now
    write_findings(store.root, run, findings_lines(run, report, sig, judged_at=clock, live=is_live(store.meta(run), events),
                                                   cost=cost, engine=engine))
    return to_json(run, judged, read_oncall(events), clock)
