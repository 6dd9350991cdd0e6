"""Pure helpers of the per-rank view and of the alerts: the heat map (ECharts), findings by rank, the OPT checklist.

No Streamlit here (``rank_view`` renders these). The checklist is the
procedure the OPT-175B logbook settled on for a hung or misbehaving node:
pause, run diagnostics on the flagged hosts, cordon them, resume from the
newest healthy checkpoint on healthy nodes, with the exact resume arguments
(``detectors.advisor.resume_hint``: the checkpoint path shell-quoted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from runwatch.app import escape
from runwatch.detectors.advisor import resume_hint
from runwatch.detectors.registry import FLEET_KINDS

CHECKLIST_KINDS = ("stall", "rank_disagreement")
"""A run that is stalled or whose replicas disagree gets the OPT procedure."""
RANK_KINDS = (*FLEET_KINDS, "stall", "nan")


def checklist_findings(findings: Iterable[object]) -> list:
    """The open findings that call for the OPT procedure: a live stall, a disagreeing replica."""
    return [f for f in findings if getattr(f, "open", False) and f.kind in CHECKLIST_KINDS
            and (f.kind != "stall" or f.evidence.get("live"))]


def _flagged_hosts(findings: Sequence[object]) -> list[str]:
    return sorted({f"{f.host} (rank {f.rank})" if f.host else f"rank {f.rank}"
                   for f in findings if getattr(f, "rank", None) is not None})


def resume_checkpoint(report: object, checkpoints: Sequence[Mapping] | None = None) -> str | None:
    """The newest healthy checkpoint: the advisor's when a replica disagreed (before the damage), else the
    newest one still retained (a hang leaves the model as it was)."""
    rollback = getattr(report, "rollback", None)
    if rollback is not None and any(f.kind == "rank_disagreement" for f in checklist_findings(report.findings)):
        return rollback.checkpoint_path
    kept = [c for c in checkpoints or [] if c.get("path") and not c.get("deleted")]
    if kept:
        return str(max(kept, key=lambda c: c["step"])["path"])
    return rollback.checkpoint_path if rollback is not None else None


def resume_line(report: object, meta: Mapping | None = None, checkpoints: Sequence[Mapping] | None = None) -> str:
    """The exact resume command: the run's own command (or a placeholder) with ``resume_hint``'s arguments."""
    path = resume_checkpoint(report, checkpoints)
    base = str((meta or {}).get("command") or "python train.py")
    hint = resume_hint(path, None)
    return f"{base} {hint}" if hint else f"{base}  # no checkpoint recorded: resume from your newest one"


def opt_checklist(report: object, findings: Sequence[object] | None = None, meta: Mapping | None = None,
                  checkpoints: Sequence[Mapping] | None = None) -> list[str] | None:
    """The OPT procedure for a stalled or disagreeing run, as steps; None when neither applies."""
    relevant = checklist_findings(findings if findings is not None else getattr(report, "findings", []))
    if not relevant:
        return None
    hosts = _flagged_hosts(relevant)
    where = ", ".join(hosts) if hosts else "every host of the job (no single rank is to blame)"
    return [
        "pause the job: stop its launcher so no more steps run on a suspect node",
        f"run diagnostics on {where}: dmesg for Xid/ECC errors, nvidia-smi -q, dcgmi diag -r 3",
        f"cordon {', '.join(hosts) if hosts else 'any host that fails them'}: scontrol update nodename=HOST "
        "state=drain reason=runwatch (Slurm) or kubectl cordon HOST",
        f"resume from the newest healthy checkpoint on healthy nodes: {resume_line(report, meta, checkpoints)}",
    ]


def rank_rows(findings: Iterable[object]) -> list[dict]:
    """Findings about one rank (and the fleet kinds), by rank then onset: the table of the per-rank view."""
    rows = []
    for f in sorted(findings, key=lambda f: (f.rank is None, f.rank or 0, f.onset_step)):
        if f.rank is None and f.kind not in FLEET_KINDS:
            continue
        rows.append({"rank": f.rank, "host": f.host or "-", "kind": f.kind, "severity": f.severity,
                     "status": "OPEN" if f.open else ("recovered" if f.self_recovered else "closed"),
                     "onset": f.onset_step, "end": f.end_step, "message": f.message})
    return rows


def heatmap_option(buckets: pa.Table, hosts: Mapping[int, str], *, title: str) -> tuple[dict, str]:
    """Rank x step heat map from ``Store.rank_buckets`` as an ECharts option (the run page's one chart
    library) and its one-line description (the chart's accessible text): each cell's colour is the bucket's
    maximum (a slow step is never averaged away, as the charts keep min and max); the tooltip gives min and
    max. Host names come from run.json: set as plain text (``escape.echarts``), never as a template."""
    if buckets.num_rows == 0:
        return {"title": {"text": escape.echarts(title)}}, f"{title}: no timings yet"
    rank = buckets["rank"].to_numpy(zero_copy_only=False).astype(int)
    bucket = buckets["bucket"].to_numpy(zero_copy_only=False).astype(int)
    ranks, cols = np.unique(rank), np.unique(bucket)
    r_at, c_at = np.searchsorted(ranks, rank), np.searchsorted(cols, bucket)
    hi = buckets["max"].to_numpy(zero_copy_only=False).astype(float) * 1e3
    lo = buckets["min"].to_numpy(zero_copy_only=False).astype(float) * 1e3
    x = np.zeros(len(cols), dtype=np.int64)
    x[c_at] = buckets["x_first"].to_numpy(zero_copy_only=False).astype(np.int64)
    labels = [escape.echarts(f"rank {r}" + (f" · {hosts[r]}" if r in hosts else "")) for r in ranks]
    finite = np.isfinite(hi)
    cells = [[int(c), int(r), round(float(h), 4), round(float(m), 4) if np.isfinite(m) else None]
             for c, r, h, m, ok in zip(c_at, r_at, hi, lo, finite) if ok]
    top = float(hi[finite].max()) if finite.any() else 1.0
    bottom = float(hi[finite].min()) if finite.any() else 0.0
    option = {
        "animation": False, "title": {"text": escape.echarts(title), "textStyle": {"fontSize": 14}},
        "grid": {"left": 10, "right": 90, "top": 40, "bottom": 40, "containLabel": True},
        "xAxis": {"type": "category", "name": "step", "data": [str(v) for v in x.tolist()]},
        "yAxis": {"type": "category", "inverse": True, "data": labels},
        "visualMap": {"type": "continuous", "min": bottom, "max": max(top, bottom + 1e-9), "calculable": False,
                      "orient": "vertical", "right": 0, "top": "middle", "text": ["ms", ""],
                      "inRange": {"color": ["#ffffcc", "#fd8d3c", "#bd0026"]}},
        "tooltip": {"trigger": "item"},
        "series": [{"type": "heatmap", "name": "ms (max in the bucket, then min)", "data": cells,
                    "dimensions": ["from step", "rank", "max ms", "min ms"], "encode": {"x": 0, "y": 1, "value": 2},
                    "progressive": 0}],
    }
    worst = int(np.argmax(np.where(finite, hi, -np.inf)))
    alt = (f"{title}: {len(ranks)} ranks ({'; '.join(labels)}) by {len(cols)} step buckets; the slowest cell "
           f"{hi[worst]:.3g} ms, {labels[r_at[worst]]} from step {x[c_at[worst]]}")
    return option, alt
