"""The README's Accelerate recipe (examples/accelerate_recipe.py), run for real: in-process and under accelerate launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runwatch.data.store import Store
from tests.collectors.probes import RUNWATCH_DIR, SyncCounter

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "accelerate_recipe.py"


def _load_recipe() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("accelerate_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recipe_in_process_never_syncs(tmp_path: Path) -> None:
    from accelerate.state import AcceleratorState

    recipe = _load_recipe()
    args = recipe.parse_args(["--root", str(tmp_path / "store"), "--run", "acc", "--ckpt", str(tmp_path / "ckpt"),
                              "--steps", "8", "--save-every", "4"])
    try:
        with SyncCounter(only_from=RUNWATCH_DIR) as syncs:
            mon = recipe.train(args)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert syncs.calls == [] and mon.num_errors == 0
    with Store(tmp_path / "store") as store:
        rows = store.rows("acc")
        events = store.events("acc").to_pylist()
    assert rows["step"].to_pylist() == list(range(1, 9)) and rows["act_norm"].null_count == 0
    assert [(e["event"], e["step"]) for e in events] == [("checkpoint", 4), ("checkpoint", 8)]


def _launch(tmp_path: Path, *extra: str) -> None:
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(RECIPE),
           "--root", "store", "--run", "acc", *extra]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="exercises Accelerate's multi-CPU (gloo) path")
def test_accelerate_launch_two_processes_and_resume(tmp_path: Path) -> None:
    _launch(tmp_path, "--steps", "10", "--save-every", "5")
    _launch(tmp_path, "--steps", "8", "--resume-from", "ckpt/step-5")
    with Store(tmp_path / "store") as store:
        rows = store.rows("acc", rank=None)
        events = store.events("acc").to_pylist()
        main = store.main_line("acc", rank=None)
    by_rank = {r: [row for row in rows.to_pylist() if row["rank"] == r] for r in (0, 1)}
    for rank, got in by_rank.items():
        first = [row for row in got if row["segment"] == 0]
        assert [row["step"] for row in first] == list(range(1, 11)), rank
        assert [row["step"] for row in got if row["segment"] == 1] == [6, 7, 8], rank
    # Real data parallelism: each rank saw its own batches (different losses) but the all-reduced
    # gradients are the same, so the recorded gradient norms agree across ranks.
    losses = [[row["loss"] for row in by_rank[r] if row["segment"] == 0] for r in (0, 1)]
    norms = [[row["grad_norm"] for row in by_rank[r] if row["segment"] == 0] for r in (0, 1)]
    assert losses[0] != losses[1]
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)
    resumes = [(e["rank"], e["segment"], e["step"], json.loads(e["payload"])["checkpoint"]) for e in events
               if e["event"] == "resume"]
    assert sorted(resumes) == [(0, 1, 5, "ckpt/step-5"), (1, 1, 5, "ckpt/step-5")]
    checkpoints = sorted((e["rank"], e["step"]) for e in events if e["event"] == "checkpoint")
    assert checkpoints == [(0, 5), (0, 10), (1, 5), (1, 10)]
    assert sorted(set(main["step"].to_pylist())) == list(range(1, 9))
