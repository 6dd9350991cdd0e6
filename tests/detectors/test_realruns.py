"""`runwatch check` on real logs from other teams (../shared/realruns), against their SOURCE.md.

Each case imports one real file with the installed CLI (`runwatch import FORMAT`) and checks
`runwatch check --json` on it: the named events must be found with their onset in the stated
range, and the healthy stretches must stay quiet. The cases live in bench/evalruns/realruns.py,
which also prints the README table (`python bench/eval_detectors.py --realruns`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from evalruns.realruns import CASES, REALRUNS, check_case, import_case, passed, relevant  # noqa: E402

pytestmark = pytest.mark.skipif(not REALRUNS.is_dir(), reason=f"real logs not found at {REALRUNS}")

# Events a person sees in the log that runwatch does not catch yet; strict, so a fix turns them green.
KNOWN_MISSES: dict[str, str] = {}


def _param(case):
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[case.name])] if case.name in KNOWN_MISSES else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("realruns")


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_runwatch_check_on_real_log(root: Path, case) -> None:
    import_case(case, root)
    report = check_case(case, root)
    assert report["run"] == case.name
    kinds = [(f["kind"], f["onset_step"]) for f in report["findings"]]
    if case.expect:
        assert passed(case, report), f"{case.event}: no {case.kind} with onset in [{case.lo}, {case.hi}]; findings {kinds}"
        needs_action = any(f["open"] and f["needs_action"] for f in report["findings"])
        assert report["exit_status"] == (1 if needs_action else 0)  # the exit code agrees with the findings
    else:
        assert passed(case, report), f"{case.event}: false alarm {relevant(case, report)}; rollback {report.get('rollback')}"
        if case.actionable_only:
            assert report["exit_status"] == 0
