"""Real logs pasted into GitHub issues: `runwatch import auto` then `runwatch check --json` finds what people saw.

The fixtures and their sources are in tests/fixtures/issuelogs/SOURCE.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "issuelogs"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runwatch.app.cli", *args], capture_output=True, text=True, timeout=120)


def _check(tmp_path: Path, name: str) -> dict:
    root = tmp_path / "store"
    imported = _cli("import", "auto", str(FIXTURES / name), "--root", str(root), "--run", "issue")
    assert imported.returncode == 0, imported.stderr
    checked = _cli("check", "--root", str(root), "--run", "issue", "--json")
    assert checked.returncode in (0, 1), checked.stderr
    return json.loads(checked.stdout)


def test_nanogpt_215_nan_from_iter_3010(tmp_path: Path) -> None:
    report = _check(tmp_path, "nanogpt_215_nan.log")
    kinds = [(f["kind"], f["onset_step"]) for f in report["findings"]]
    assert ("nan", 3010) in kinds
    assert report["health"] == "action needed"
    # Only the NaN: the healthy stretch before it (losses 3.88-4.25) is not a spike or a divergence.
    assert {f["kind"] for f in report["findings"]} == {"nan"}
    rollback = report["rollback"]
    # train.py saves ckpt.pt at the top of iteration 3000, before that iteration's update: step 2999.
    assert rollback["checkpoint_step"] == 2999 and rollback["checkpoint_path"] == "out/ckpt.pt"


def test_megatron_deepspeed_396_grad_norm_nan(tmp_path: Path) -> None:
    report = _check(tmp_path, "megatron_deepspeed_396_grad_norm_nan.log")
    nan = [f for f in report["findings"] if f["kind"] == "nan"]
    assert nan and nan[0]["onset_step"] == 5426 and nan[0]["severity"] == "critical"
    assert report["health"] == "action needed"
    # No lm loss is printed at all: no loss finding can be invented from it.
    assert {f["kind"] for f in report["findings"]} == {"nan"}


def test_fairseq_512_loss_scale_collapse(tmp_path: Path) -> None:
    """The overflows follow the log line of update 10198: the first skipped update is 10199, the onset (the
    README's real-events table; it read 10198 until the detectors' rewrite, 1e97bf7, and no test held it)."""
    report = _check(tmp_path, "fairseq_512_min_loss_scale.log")
    [collapse] = [f for f in report["findings"] if f["kind"] == "scaler_collapse"]
    assert (collapse["onset_step"], collapse["severity"]) == (10199, "critical"), collapse
