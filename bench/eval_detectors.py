"""Detector evaluation: runwatch's findings and rollback advice vs labelled runs and three anchors.

    .venv/bin/python bench/eval_detectors.py            # generate (cached) + score
    .venv/bin/python bench/eval_detectors.py --regenerate
    .venv/bin/python bench/eval_detectors.py --realruns  # the real-log table only
    .venv/bin/python bench/eval_detectors.py --set heldout  # the held-out set (bench/evalruns/heldout.py)

The labelled runs (real tiny CPU training with injected faults, see
bench/evalruns/) are cached under bench/results/<VERSION>/. Each run is read
back through the real store (``Store.rows`` / ``Store.events``) and judged by
``runwatch.detectors.analysis.analyze``; the baselines in bench/baselines.py
judge the same rows. The markdown table and the per-kind failures (run ids)
are printed and saved to bench/results/eval_detectors.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from baselines import BASELINES, run_baselines  # noqa: E402
from evalruns.generate import VERSION, load_or_generate  # noqa: E402
from evalruns.scenarios import KINDS  # noqa: E402
from evalruns.scoring import KindScore, Pred, match_run, table  # noqa: E402

from runwatch.data.store import Store  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def segment_series(rows: pa.Table) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]:
    """Each segment's own rows (main line and abandoned branch alike) as numpy arrays."""
    seg = rows["segment"].to_numpy(zero_copy_only=False)
    steps = rows["step"].to_numpy(zero_copy_only=False)
    loss = rows["loss"].to_numpy(zero_copy_only=False).astype(float)
    gn = rows["grad_norm"].to_numpy(zero_copy_only=False).astype(float) if "grad_norm" in rows.column_names else None
    out = []
    for s in np.unique(seg):
        m = seg == s
        out.append((int(s), steps[m], loss[m], None if gn is None else gn[m]))
    return out


def with_data_labels(labels: list[dict], rows: pa.Table) -> list[dict]:
    """Add the NaN a fault ends in (a divergence that overflows to inf/NaN) as a ``nan`` label.

    Non-finite values are unambiguous in the data, so their first step per
    segment is ground truth even where no NaN was injected.
    """
    out = list(labels)
    seg = rows["segment"].to_numpy(zero_copy_only=False)
    steps = rows["step"].to_numpy(zero_copy_only=False)
    bad = ~np.isfinite(rows["loss"].to_numpy(zero_copy_only=False).astype(float))
    if "grad_norm" in rows.column_names:
        bad |= ~np.isfinite(rows["grad_norm"].to_numpy(zero_copy_only=False).astype(float))
    if "found_inf" in rows.column_names:
        # An inf gradient the GradScaler skipped is an ordinary fp16 overflow, not a NaN event.
        bad &= ~rows["found_inf"].fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    for s in np.unique(seg[bad]):
        if any(lab["kind"] == "nan" and lab["segment"] == s for lab in labels):
            continue
        first = int(steps[(seg == s) & bad].min())
        cause = next((lab for lab in labels if lab["segment"] == s and lab["onset"] <= first), None)
        out.append({"kind": "nan", "subtype": f"after_{cause['subtype'] if cause else 'nothing'}", "onset": first,
                    "end": int(steps[seg == s].max()), "segment": int(s),
                    "needs_action": True, "open": cause["open"] if cause else True})
    return out


def findings_to_preds(report: object) -> list[Pred]:
    return [Pred(f.kind, int(f.onset_step), int(f.end_step), int(f.segment), bool(f.open), bool(f.needs_action))
            for f in report.findings]


def evaluate(store: Store, info: dict, analyze: object | None) -> dict:
    """Score every labelled run; returns the score tables and the failure lists."""
    strict: dict[str, KindScore] = {}
    family: dict[str, dict[str, KindScore]] = {"runwatch": {}, **{name: {} for name in BASELINES}}
    rollback = {"needed": 0, "right": 0, "wrong": [], "spurious": [], "not_needed": 0}
    history = {"labels": 0, "closed": 0, "still_open": []}
    by_subtype: dict[tuple[str, str], list[int | None]] = {}  # (kind, subtype) -> onset error or None (missed)
    seconds = 0.0
    for run_info in info["runs"]:
        run = run_info["run"]
        rows, events = store.rows(run, rank=0), store.events(run)
        labels = with_data_labels(run_info["labels"], rows)
        for name, evs in run_baselines(segment_series(rows)).items():
            preds = [Pred("spike", e.onset_step, e.end_step, e.segment) for e in evs]
            match_run(run, labels, preds, family[name], merge_excursions=True, kinds=("loss_excursion",))
        if analyze is None:
            continue
        t0 = time.perf_counter()
        report = analyze(rows, events, now=None)
        seconds += time.perf_counter() - t0
        preds = findings_to_preds(report)
        for i, lab in enumerate(labels):
            hit = match_run(run, [lab], preds, {})
            err = abs(hit[0].onset - lab["onset"]) if hit else None
            by_subtype.setdefault((lab["kind"], lab["subtype"]), []).append(err)
        match_run(run, labels, preds, strict)
        matched = match_run(run, labels, preds, family["runwatch"], merge_excursions=True, kinds=("loss_excursion",))
        _score_history(run, labels, matched, history)
        _score_rollback(run, run_info, report, rollback)
    return {"strict": strict, "family": family, "rollback": rollback, "history": history,
            "by_subtype": by_subtype, "analyze_seconds": seconds}


def render_subtypes(by_subtype: dict[tuple[str, str], list[int | None]]) -> str:
    """Found/labelled and median onset error per injected fault (strict kind, one label at a time)."""
    out = ["| kind | injected fault | found | median onset error (steps) |", "|---|---|---:|---:|"]
    for (kind, sub), errs in sorted(by_subtype.items()):
        found = [e for e in errs if e is not None]
        med = f"{np.median(found):.1f}" if found else "n/a"
        out.append(f"| {kind} | {sub} | {len(found)}/{len(errs)} | {med} |")
    return "\n".join(out)


def _score_history(run: str, labels: list[dict], matched: dict[int, Pred], history: dict) -> None:
    for i, lab in enumerate(labels):
        if not lab["open"]:
            history["labels"] += 1
            if i in matched and not matched[i].open:
                history["closed"] += 1
            elif i in matched:
                history["still_open"].append(f"{run} ({lab['kind']} onset {lab['onset']})")


def _score_rollback(run: str, run_info: dict, report: object, rollback: dict) -> None:
    got = report.rollback.checkpoint_step if report.rollback is not None else None
    if run_info["needs_action"]:
        rollback["needed"] += 1
        if got == run_info["rollback_step"]:
            rollback["right"] += 1
        else:
            rollback["wrong"].append(f"{run} (expected checkpoint {run_info['rollback_step']}, got {got})")
    else:
        rollback["not_needed"] += 1
        if got is not None:
            rollback["spurious"].append(f"{run} (advised checkpoint {got}, no action needed)")


def render(result: dict, info: dict, version: str = VERSION) -> str:
    rb = result["rollback"]
    rows = []
    for kind in KINDS:
        sc = result["strict"].get(kind, KindScore())
        rb_cell = f"{rb['right']}/{rb['needed']}" if kind == KINDS[0] else ""
        rows.append(("runwatch", kind, sc, rb_cell))
    for name, scores in result["family"].items():
        rows.append((name, "loss_excursion (spike+divergence)", scores.get("loss_excursion", KindScore()), ""))
    lines = [f"## Detector evaluation ({version}: {info['num_runs']} runs, {info['num_rows']} steps of real CPU training)",
             "", table(rows), "",
             f"Rollback advice: right checkpoint on {rb['right']}/{rb['needed']} runs that need action; "
             f"advice given on {len(rb['spurious'])}/{rb['not_needed']} runs that need none.",
             f"Rolled-back faults reported as history (open=false): {result['history']['closed']}/"
             f"{result['history']['labels']}.",
             f"analyze() time over all runs: {result['analyze_seconds']:.2f} s.", "",
             "### By injected fault (runwatch)", "", render_subtypes(result["by_subtype"]), "", "### Failures", ""]
    for kind, sc in sorted(result["strict"].items()):
        for m in sc.misses:
            lines.append(f"- missed {kind}: {m}")
        for fa in sc.false_alarms:
            lines.append(f"- false {kind}: {fa}")
    lines += [f"- rollback wrong: {w}" for w in rb["wrong"]]
    lines += [f"- rollback spurious: {w}" for w in rb["spurious"]]
    lines += [f"- rolled back but still open: {w}" for w in result["history"]["still_open"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regenerate", action="store_true", help="drop the cached labelled runs and train them again")
    parser.add_argument("--realruns", action="store_true",
                        help="import and check the real logs in ../shared/realruns and print that table only")
    parser.add_argument("--set", choices=("dev", "heldout"), default="dev",
                        help="dev: the set the detectors were tuned on; heldout: other seeds, widths, schedules, "
                             "log intervals and fault magnitudes (saved to eval_detectors-heldout.md)")
    args = parser.parse_args(argv)
    if args.realruns:
        import tempfile

        from evalruns.realruns import realruns_table

        with tempfile.TemporaryDirectory() as tmp:
            text = realruns_table(Path(tmp))
        (RESULTS / "realruns.md").parent.mkdir(parents=True, exist_ok=True)
        (RESULTS / "realruns.md").write_text(text)
        print(text)
        return 0
    if args.set == "heldout":
        from evalruns.heldout import VERSION as version
        from evalruns.heldout import load_or_generate_heldout as loader
        out_name = "eval_detectors-heldout.md"
    else:
        version, loader, out_name = VERSION, load_or_generate, "eval_detectors.md"
    if args.regenerate:
        shutil.rmtree(RESULTS / version, ignore_errors=True)
    root, info = loader(RESULTS)
    try:
        from runwatch.detectors.analysis import analyze
    except ImportError as err:  # the detectors land in parallel; score the baselines meanwhile
        print(f"runwatch.detectors.analysis not importable ({err}); scoring baselines only", file=sys.stderr)
        analyze = None
    with Store(root) as store:
        result = evaluate(store, info, analyze)
    text = render(result, info, version)
    (RESULTS / out_name).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
