"""Detector evaluation: runwatch's findings and rollback advice vs labelled runs and three anchors.

    .venv/bin/python bench/eval_detectors.py            # generate (cached) + score
    .venv/bin/python bench/eval_detectors.py --regenerate
    .venv/bin/python bench/eval_detectors.py --realruns  # the real-log table only
    .venv/bin/python bench/eval_detectors.py --set heldout  # the held-out set (bench/evalruns/heldout.py)
    .venv/bin/python bench/eval_detectors.py --set fresh --seed N [--num-runs R] [--jobs J]  # bench/evalruns/fresh.py

The labelled runs (real tiny CPU training with injected faults, see
bench/evalruns/) are cached under bench/results/<VERSION>/ (the fresh set:
bench/results/fresh-<VERSION>-seed<N>/). Each run is read back through the
real store (``Store.rows`` / ``Store.events`` / ``Store.meta``) and judged by
``runwatch.detectors.analysis.analyze``; the baselines in bench/baselines.py
judge the same rows. The same markdown report for all three sets (per kind:
labelled, found, alarm precision, precision over all findings, recall, median
onset error, false alarms per 1M healthy steps, rollback right) is printed
and saved to bench/results/eval_detectors[-SET].md.
"""

from __future__ import annotations

import argparse
import inspect
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
from evalruns.scoring import (  # noqa: E402
    ALARM,
    EXCURSION,
    MISS_CLASSES,
    FalseAlarms,
    KindScore,
    Pred,
    Row,
    match_run,
    match_window,
    miss_class,
    table,
)
from evalruns.truth import EXCURSION_KINDS  # noqa: E402

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
    return [Pred(f.kind, int(f.onset_step), int(f.end_step), int(f.segment), bool(f.open), bool(f.needs_action),
                 str(f.severity)) for f in report.findings]


def judge(analyze: object) -> object:
    """``analyze`` called with what the store holds for a run; the run's metadata when it takes ``meta=``."""
    takes_meta = "meta" in inspect.signature(analyze).parameters

    def call(store: Store, run: str, rows: pa.Table, events: pa.Table) -> object:
        if takes_meta:
            return analyze(rows, events, now=None, meta=store.meta(run))
        return analyze(rows, events, now=None)

    return call


def _scores() -> dict:
    methods = ("runwatch", *BASELINES)
    return {"strict": {}, "alarms": {}, "false_alarms": FalseAlarms(),
            "family": {m: {} for m in methods}, "family_alarms": {m: {} for m in methods},
            "family_false_alarms": {m: FalseAlarms() for m in methods},
            "rollback": {"needed": 0, "right": 0, "wrong": [], "spurious": [], "not_needed": 0, "ambiguous": 0},
            "history": {"labels": 0, "closed": 0, "still_open": []}, "by_subtype": {}, "by_size": {},
            "dont_care": {}, "misses_by_class": {}, "analyze_seconds": 0.0}


def _score_family(res: dict, name: str, run: str, labels: list[dict], preds: list[Pred], window: int,
                  cols: tuple[np.ndarray, np.ndarray]) -> dict[int, Pred]:
    """The loss_excursion row (spike and divergence merged), where runwatch meets the baselines."""
    kw = {"merge_excursions": True, "kinds": ("loss_excursion",), "window": window}
    match_run(run, labels, [p for p in preds if p.severity in ALARM], res["family_alarms"][name], **kw)
    res["family_false_alarms"][name].add_run(*cols, labels, preds, window, merge_excursions=True)
    return match_run(run, labels, preds, res["family"][name], **kw)


def evaluate(store: Store, info: dict, analyze: object | None) -> dict:
    """Score every labelled run; returns the score tables and the failure lists."""
    res = _scores()
    call = judge(analyze) if analyze is not None else None
    for run_info in info["runs"]:
        run = run_info["run"]
        window = match_window(run_info.get("knobs", {}).get("log_every", 1))
        rows, events = store.rows(run, rank=0), store.events(run)
        # The fresh set's labels already hold the NaNs its faults end in, judged against the twin.
        labels = run_info["labels"] if info.get("labels_from") == "counterfactual" else with_data_labels(
            run_info["labels"], rows)
        cols = (rows["step"].to_numpy(zero_copy_only=False), rows["segment"].to_numpy(zero_copy_only=False))
        for lab in labels:
            if lab.get("dont_care"):
                res["dont_care"][lab["kind"]] = res["dont_care"].get(lab["kind"], 0) + 1
        for name, evs in run_baselines(segment_series(rows)).items():
            _score_family(res, name, run, labels, [Pred("spike", e.onset_step, e.end_step, e.segment) for e in evs],
                          window, cols)
        if call is None:
            continue
        t0 = time.perf_counter()
        report = call(store, run, rows, events)
        res["analyze_seconds"] += time.perf_counter() - t0
        preds = findings_to_preds(report)
        _score_labels_alone(run, labels, preds, window, res)
        found = match_run(run, labels, preds, res["strict"], window=window)
        for i, lab in enumerate(labels):
            if lab["kind"] in EXCURSION and not lab.get("dont_care") and i not in found:
                key = (lab["kind"], miss_class(lab, labels, preds, window))
                res["misses_by_class"][key] = res["misses_by_class"].get(key, 0) + 1
        match_run(run, labels, [p for p in preds if p.severity in ALARM], res["alarms"], window=window)
        res["false_alarms"].add_run(*cols, labels, preds, window)
        _score_history(run, labels, _score_family(res, "runwatch", run, labels, preds, window, cols), res["history"])
        _score_rollback(run, run_info, report, res["rollback"])
    return res


SIZE_BANDS = ((8.0, "8-20"), (20.0, "20-100"), (100.0, ">=100"))  # labelled effect, in the twin's noise sigmas


def _size_band(size: float | None) -> str | None:
    if size is None:
        return None
    band = "<8 (sustained lift)"
    for lo, name in SIZE_BANDS:
        if size >= lo:
            band = name
    return band


def _score_labels_alone(run: str, labels: list[dict], preds: list[Pred], window: int, res: dict) -> None:
    """Found or not, and the onset error, per label on its own: by injected fault and by effect size."""
    for lab in labels:
        if lab.get("dont_care"):
            continue
        hit = match_run(run, [lab], preds, {}, window=window)
        err = abs(hit[0].onset - lab["onset"]) if hit else None
        res["by_subtype"].setdefault((lab["kind"], lab["subtype"]), []).append(err)
        band = _size_band(lab.get("size"))
        if band is not None and lab["kind"] in ("spike", "divergence", "slowdown", "stall"):  # sizes in sigmas
            res["by_size"].setdefault((lab["kind"], band), []).append(err)


def render_miss_classes(misses: dict[tuple[str, str], int]) -> str:
    """Missed labels per kind and class, every class shown (a zero is a finding too)."""
    out = ["| kind | " + " | ".join(MISS_CLASSES) + " |", "|---|" + "---:|" * len(MISS_CLASSES)]
    for kind in EXCURSION:
        out.append(f"| {kind} | " + " | ".join(str(misses.get((kind, c), 0)) for c in MISS_CLASSES) + " |")
    return "\n".join(out)


def render_subtypes(by_subtype: dict[tuple[str, str], list[int | None]], what: str = "injected fault") -> str:
    """Found/labelled and median onset error per injected fault (strict kind, one label at a time)."""
    out = [f"| kind | {what} | found | median onset error (steps) |", "|---|---|---:|---:|"]
    for (kind, sub), errs in sorted(by_subtype.items()):
        found = [e for e in errs if e is not None]
        med = f"{np.median(found):.1f}" if found else "n/a"
        out.append(f"| {kind} | {sub} | {len(found)}/{len(errs)} | {med} |")
    return "\n".join(out)


def _score_history(run: str, labels: list[dict], matched: dict[int, Pred], history: dict) -> None:
    for i, lab in enumerate(labels):
        if not lab["open"] and not lab.get("dont_care"):
            history["labels"] += 1
            if i in matched and not matched[i].open:
                history["closed"] += 1
            elif i in matched:
                history["still_open"].append(f"{run} ({lab['kind']} onset {lab['onset']})")


def _score_rollback(run: str, run_info: dict, report: object, rollback: dict) -> None:
    """Right checkpoint on runs that need action; advice on runs that need none is spurious, except where
    an open dont_care excursion leaves it open whether they do."""
    got = report.rollback.checkpoint_step if report.rollback is not None else None
    doubt = any(lab.get("dont_care") and lab["open"] and lab["kind"] in EXCURSION_KINDS for lab in run_info["labels"])
    if not run_info["needs_action"] and doubt:
        rollback["ambiguous"] += 1
        return
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


def report_rows(res: dict) -> list[Row]:
    rb = res["rollback"]
    kinds = [*KINDS, *sorted(set(res["strict"]) - set(KINDS))]  # a kind no label has (bad_resume) still shows
    rows = [Row("runwatch", kind, res["strict"].get(kind, KindScore()), res["alarms"].get(kind, KindScore()),
                res["false_alarms"].per_million(kind), f"{rb['right']}/{rb['needed']}" if kind == KINDS[0] else "")
            for kind in kinds]
    for name, scores in res["family"].items():
        rows.append(Row(name, "loss_excursion (spike+divergence)", scores.get("loss_excursion", KindScore()),
                        res["family_alarms"][name].get("loss_excursion", KindScore()),
                        res["family_false_alarms"][name].per_million("loss_excursion")))
    return rows


def render(result: dict, info: dict, version: str = VERSION) -> str:
    rb, fa = result["rollback"], result["false_alarms"]
    total_fa = 1e6 * sum(fa.by_kind.values()) / fa.healthy_steps if fa.healthy_steps else float("nan")
    dont_care = ", ".join(f"{k} {n}" for k, n in sorted(result["dont_care"].items())) or "none"
    lines = [f"## Detector evaluation ({version}: {info['num_runs']} runs, {info['num_rows']} logged steps of real "
             "CPU training)", "", table(report_rows(result)), "",
             f"Rollback advice: right checkpoint on {rb['right']}/{rb['needed']} runs that need action; "
             f"advice given on {len(rb['spurious'])}/{rb['not_needed']} runs that need none "
             f"({rb['ambiguous']} runs with only a dont_care excursion not scored).",
             f"False alarms (warning/critical, all kinds): {sum(fa.by_kind.values())} over {fa.healthy_steps} healthy "
             f"logged steps = {total_fa:.1f} per 1M ({fa.after_a_fault} of them in a faulted run after its first "
             "fault, where its twin no longer vouches for it).",
             f"dont_care labels (neither a miss nor a false alarm): {dont_care}.",
             f"Rolled-back faults reported as history (open=false): {result['history']['closed']}/"
             f"{result['history']['labels']}.",
             f"analyze() time over all runs: {result['analyze_seconds']:.2f} s.", "",
             "### By injected fault (runwatch)", "", render_subtypes(result["by_subtype"]), ""]
    if result["by_size"]:
        lines += ["### By labelled effect size (runwatch; sigmas of the clean twin's noise)", "",
                  render_subtypes(result["by_size"], "effect (sigma)"), ""]
    lines += ["### Missed spikes and divergences by class (runwatch; `evalruns.scoring.MISS_CLASSES`)", "",
              render_miss_classes(result["misses_by_class"]), "", "### Failures", ""]
    for kind, sc in sorted(result["strict"].items()):
        lines += [f"- missed {kind}: {m}" for m in sc.misses]
        lines += [f"- false {kind}: {f}" for f in sc.false_alarms]
    lines += [f"- rollback wrong: {w}" for w in rb["wrong"]]
    lines += [f"- rollback spurious: {w}" for w in rb["spurious"]]
    lines += [f"- rolled back but still open: {w}" for w in result["history"]["still_open"]]
    return "\n".join(lines) + "\n"


def _load(args: argparse.Namespace) -> tuple[Path, dict, str, str]:
    """(store root, labels info, set name, report file) of the chosen set, generated on first use."""
    if args.set == "fresh":
        from evalruns.fresh import NUM_RUNS, load_or_generate_fresh, result_name

        name = result_name(args.seed, args.num_runs or NUM_RUNS)
        if args.regenerate:
            shutil.rmtree(RESULTS / name, ignore_errors=True)
        root, info, name = load_or_generate_fresh(RESULTS, args.seed, args.num_runs or NUM_RUNS, jobs=args.jobs)
        return root, info, name, f"eval_detectors-{name}.md"
    if args.set == "heldout":
        from evalruns.heldout import VERSION as version
        from evalruns.heldout import load_or_generate_heldout as loader
        out_name = "eval_detectors-heldout.md"
    else:
        version, loader, out_name = VERSION, load_or_generate, "eval_detectors.md"
    if args.regenerate:
        shutil.rmtree(RESULTS / version, ignore_errors=True)
    root, info = loader(RESULTS)
    return root, info, version, out_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regenerate", action="store_true", help="drop the cached labelled runs and train them again")
    parser.add_argument("--realruns", action="store_true",
                        help="import and check the real logs in ../shared/realruns and print that table only")
    parser.add_argument("--set", choices=("dev", "heldout", "fresh"), default="dev",
                        help="dev: the set the detectors were tuned on; heldout: other seeds, widths, schedules, "
                             "log intervals and fault magnitudes; fresh: a randomised set drawn from --seed "
                             "and labelled by a counterfactual twin")
    parser.add_argument("--seed", type=int, help="the fresh set's seed (required with --set fresh)")
    parser.add_argument("--num-runs", type=int, help="the fresh set's first R runs only (default 150)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="train a fresh set's runs in this many processes, one thread each (default 1)")
    args = parser.parse_args(argv)
    if args.set == "fresh" and args.seed is None:
        parser.error("--set fresh needs --seed N")
    if args.num_runs is not None and args.num_runs < 1:
        parser.error("--num-runs must be at least 1")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.realruns:
        import tempfile

        from evalruns.realruns import realruns_table

        with tempfile.TemporaryDirectory() as tmp:
            text = realruns_table(Path(tmp))
        (RESULTS / "realruns.md").parent.mkdir(parents=True, exist_ok=True)
        (RESULTS / "realruns.md").write_text(text)
        print(text)
        return 0
    root, info, version, out_name = _load(args)
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
