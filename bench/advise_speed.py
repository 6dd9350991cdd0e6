"""`runwatch advise` speed on a big run, beside `runwatch check` (its anchor: advise judges the run first).

The dashboard benchmark's synthetic 1M-step run (two segments, an abandoned
branch) plus a checkpoint every 1,000 steps without ``write_seconds`` (each
cost estimated from its step gap). Times, median over ``--repeat`` on a fresh
Store each: ``judge_run`` (what ``check`` does), ``checkpoint_advice`` given
that report (the extra read of rows and events, and the arithmetic), and the
arithmetic alone (``measure`` + ``advise_checkpoints`` on columns in memory).

    .venv/bin/python bench/advise_speed.py [--steps 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dashboard_speed import synthetic_run, timed  # noqa: E402

from runwatch.app.advise import checkpoint_advice, skip_windows  # noqa: E402
from runwatch.app.judge import judge_run  # noqa: E402
from runwatch.data.record import resume_steps_of  # noqa: E402
from runwatch.data.storage import StagedWrite  # noqa: E402
from runwatch.data.store import Store  # noqa: E402
from runwatch.detectors.advisor import checkpoints_from_events  # noqa: E402
from runwatch.detectors.segments import split_segments  # noqa: E402
from runwatch.economics.advice import advise_checkpoints  # noqa: E402
from runwatch.economics.measure import measure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, run = Path(tmp), "big"
        synthetic_run(root, run, args.steps)
        resume = int(args.steps * 0.7)
        with StagedWrite(root) as staged:
            staged.add_events(run, 1, 0, [{"event": "checkpoint", "step": s, "path": f"ckpt/{s}.pt"}
                                          for s in range(resume + 1000, args.steps, 1000)])

        def judge() -> object:
            with Store(root) as store:
                return judge_run(store, run)

        t_judge, report = timed(judge, args.repeat)

        def advise() -> object:
            with Store(root) as store:
                return checkpoint_advice(store, run, report)

        t_advise, advice = timed(advise, args.repeat)
        with Store(root) as store:
            rows, events = store.rows(run), store.events(run)
        listed, segments = events.to_pylist(), split_segments(rows)
        ckpts = checkpoints_from_events(events)

        def arithmetic() -> object:
            measured = measure(segments, ckpts, resume_steps_of(listed), skip_windows(listed), report.findings)
            return advise_checkpoints(measured, segments, report.findings, report.rollback)

        t_math, _ = timed(arithmetic, args.repeat)
    d = advice.to_dict()
    print(f"{args.steps:,} steps, {len(advice.measured.checkpoints)} checkpoints, "
          f"{d['interruptions']} interruptions, {d['lost_steps']:,} steps lost")
    print(f"judge_run (runwatch check):            {t_judge:.3f} s")
    print(f"checkpoint_advice given the report:    {t_advise:.3f} s  ({t_advise / t_judge:.2f}x check)")
    print(f"  of which the arithmetic in memory:   {t_math:.3f} s")


if __name__ == "__main__":
    main()
