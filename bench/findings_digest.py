"""Every finding and the advice of every cached evaluation run, as JSON lines: a change meant to leave the
detectors' output alone (a speed-up) is checked by diffing two digests.

    .venv/bin/python bench/findings_digest.py bench/results/labelled-v6 bench/results/fresh-v5-seed446183 > a.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runwatch.data.store import Store
from runwatch.detectors.analysis import analyze


def digest(root: Path) -> None:
    store = Store(root / "store")
    for run in store.run_names():
        report = analyze(store.rows(run), store.events(run), now=None, meta=store.meta(run))
        print(json.dumps({"root": root.name, **report.to_dict(run)}, sort_keys=True))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        digest(Path(arg))
