"""Every importer on the real logs in shared/realruns: counts and values from their SOURCE.md."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from runwatch.collectors.importers import (
    auto,
    deepspeed,
    detect_format,
    llmc,
    megatron,
    megatron_golden,
    modded_nanogpt,
)
from tests.realruns import BLOCKS
from tests.realruns import REALRUNS as REAL

pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason="shared/realruns fixtures not present")


def _count(table: pa.Table, column: str) -> int:
    return table.num_rows - table[column].null_count


def _row(table: pa.Table, step: int) -> dict:
    rows = table.filter(pc.equal(table["step"], step)).to_pylist()
    assert len(rows) == 1, f"expected one row at step {step}, got {len(rows)}"
    return rows[0]


def test_llmc_train_and_val_counts() -> None:
    t = llmc.parse([REAL / "llmc-gpt2-124m" / "raw.log"]).metrics
    assert _count(t, "loss") == 19560 and _count(t, "val_loss") == 80
    assert _row(t, 0)["val_loss"] == 11.0092 and _row(t, 0)["loss"] == 11.0091
    assert _row(t, 7435)["grad_norm"] == 1.44 and _row(t, 9025)["grad_norm"] == 2.02
    assert (np.diff(t["step"].to_numpy()) > 0).all()  # val lines fold into their step: no false restart


def test_llmc_old_format() -> None:
    t = llmc.parse([REAL / "llmc-gpt2-124m" / "raw_2024-06-06_AdamW_baseline.log"]).metrics
    assert _count(t, "loss") == 9536 and _count(t, "val_loss") == 76
    assert t["grad_norm"].null_count == t.num_rows


def test_modded_nanogpt_counts_and_timing() -> None:
    t = modded_nanogpt.parse([REAL / "modded-nanogpt-1p5b" / "raw.log"]).metrics
    assert _count(t, "loss") == 20344 and _count(t, "val_loss") == 164
    assert _row(t, 1)["loss"] == 22.6211 and _row(t, 0)["val_loss"] == 22.6137
    assert _row(t, 11)["step_avg"] is None  # 'step_avg:nanms' is a missing measurement
    assert _row(t, 2)["step_time"] == pytest.approx(83.639 - 81.991)
    # No wall clock in the log: its training seconds are an extra, and `time` (unix seconds) stays null.
    assert _row(t, 2)["train_time"] == 83.639 and t["time"].null_count == t.num_rows
    assert _row(t, 20344)["val_loss"] == 2.7737 and _row(t, 20344)["loss"] == 2.8204
    assert not pc.any(pc.is_nan(t["loss"])).as_py()


def test_megatron_golden_values() -> None:
    t = megatron_golden.parse([REAL / "megatron-lm-gpt3-15b-8t" / "raw_dgx_h100.json"]).metrics
    assert _count(t, "loss") == 10173 and _count(t, "step_time") == 507
    assert pc.max(t["step"]).as_py() == 50860  # trailing "nan" padding is not data
    assert not pc.any(pc.is_nan(t["loss"])).as_py()
    assert _row(t, 1)["loss"] == 12.95636 and _row(t, 2100)["step_time"] == 6.0787
    assert _count(t, "num_zeros") == 10173
    a100 = megatron_golden.parse([REAL / "megatron-lm-gpt3-15b-8t" / "raw_lts_dgx_a100.json"]).metrics
    assert _count(a100, "loss") == 10173


def test_megatron_bloom_spike() -> None:
    t = megatron.parse([BLOCKS / "tr11-176B-ml__chronicles__L202-213.log"]).metrics
    r = _row(t, 31219)
    assert r["grad_norm"] == 960.351 and r["loss"] == 5.098124 and r["step_time"] == 106.36
    assert r["tokens"] == 97850851328 and r["samples"] == 47778736 and r["tflops"] == 147.43
    assert "rank" not in t.column_names and r["loss_scale"] is None  # bf16: no scale


def test_megatron_hard_wrapped_lines() -> None:
    t = megatron.parse([BLOCKS / "tr8b-104B__chronicles__L256-260.log"]).metrics
    assert t["step"].to_pylist() == [13251, 14000]
    r = _row(t, 13251)
    assert r["lr"] == 5.996e-05 and r["loss"] == 2.924229 and r["loss_scale"] == 524288.0
    assert r["skipped_iterations"] == 0 and r["nan_iterations"] == 0
    t = megatron.parse([BLOCKS / "tr11-176B-ml__chronicles__L257-271.log"]).metrics
    assert t["step"].to_pylist() == [42780, 42781, 42782, 42783, 42784]
    assert _row(t, 42783)["step_time"] == 110.17 and _row(t, 42784)["tflops"] == 141.09
    assert _count(t, "nan_iterations") == 5 and _count(t, "lr") == 5
    t = megatron.parse([BLOCKS / "tr11-176B-ml__README__L661-663.log"]).metrics
    assert _row(t, 85376)["step_time"] == 104.70 and _row(t, 85376)["tflops"] == 149.77


def test_megatron_missing_lm_loss_is_null() -> None:
    t = megatron.parse([BLOCKS / "tr8-104B-wide__chronicles__L940-943.log"]).metrics
    r = _row(t, 9027)
    assert r["loss"] is None and r["loss_scale"] == 8192.0
    t = megatron.parse([REAL / "bigscience-megatron-perf-runs" / "meg_gpt2_base_n4_dp1_tp4_pp4-1809579.out"]).metrics
    r = _row(t, 10)
    assert r["loss"] is None and r["skipped_iterations"] == 10 and r["found_inf"] is True
    assert _count(t, "loss") == 19 and t.num_rows == 20


def test_megatron_msft_loss_scale_doubling_and_validation() -> None:
    t = megatron.parse([REAL / "msft-megatron-ds-gpt3-125m-fp16" / "raw.log"]).metrics
    assert _count(t, "loss") == 213 and _count(t, "val_loss") == 21
    scales = t["loss_scale"].to_numpy()
    assert scales[0] == 2048 and scales[-1] == 32768
    assert sorted(set(scales.tolist())) == [2048, 4096, 8192, 16384, 32768]
    assert (np.diff(scales) >= 0).all()
    assert _row(t, 100)["val_loss"] == 9.082616 and _row(t, 100)["val_ppl"] == pytest.approx(8800.958)
    assert _row(t, 10)["step_time"] == pytest.approx(0.8496)


def test_megatron_overflow_lines_mark_found_inf() -> None:
    t = megatron.parse([BLOCKS / "tr8b-104B__chronicles__L446-460.log"]).metrics
    flags = dict(zip(t["step"].to_pylist(), t["found_inf"].to_pylist()))
    assert [s for s, f in flags.items() if f] == [17062, 17063, 17064, 17065, 17067, 17068]
    assert _row(t, 17068)["loss_scale"] == 32768.0 and _row(t, 17066)["grad_norm"] == 879946.622


def test_megatron_checkpoint_event() -> None:
    p = megatron.parse([BLOCKS / "tr1-13B-base__chronicles__L207-216.log"])
    (ev,) = p.events
    assert ev["event"] == "checkpoint" and ev["step"] == 33241
    assert ev["path"].endswith("tr1-13B/checkpoints") and ev["write_seconds"] == pytest.approx(57.51453)


def test_megatron_all_chronicle_blocks() -> None:
    # Every iteration line prints a learning rate; validation-only rows do not.
    total = sum(_count(megatron.parse([p]).metrics, "lr") for p in sorted(BLOCKS.glob("*.log")))
    assert total == 91  # SOURCE.md: 91 iteration lines in 34 blocks


def test_megatron_noisy_perf_runs() -> None:
    counts = {p.name: megatron.parse([p]).metrics.num_rows for p in (REAL / "bigscience-megatron-perf-runs").glob("*.out")}
    assert counts == {"meg_ds_3d_gpt2_perf_n16-ds-off.out": 62, "meg_ds_zero_gpt2_perf_n16-1999616.out": 4,
                      "meg_gpt2_base_n4_dp1_tp4_pp4-1809579.out": 20, "meg_gpt2_base_n8_dp1_tp4_pp8-1809562.out": 20}
    t = megatron.parse([REAL / "bigscience-megatron-perf-runs" / "meg_ds_3d_gpt2_perf_n16-ds-off.out"]).metrics
    assert _row(t, 3)["loss"] == pytest.approx(44.24266) and _row(t, 3)["grad_norm"] == 77.479


def test_deepspeed_reward_model_scale_collapse() -> None:
    t = deepspeed.parse([REAL / "deepspeed-chat-opt" / "step2_reward_model_finetuning__opt-350m_globalBatchSize-64.log"]).metrics
    flagged = t.filter(pc.fill_null(t["found_inf"], False))
    assert flagged.num_rows == 20 and pc.min(t["loss_scale"]).as_py() == 8.0
    # Startup: 10 overflows, then 'step=10, skipped=10': steps 1..10, scale 65536 -> 64.
    assert flagged["step"].to_pylist()[:10] == list(range(1, 11))
    assert flagged["loss_scale"].to_pylist()[:10] == [32768.0 / 2**k for k in range(10)]
    scale8 = flagged.filter(pc.equal(flagged["loss_scale"], 8.0))
    assert 480 <= scale8["step"][0].as_py() <= 570 and scale8["attempted_loss_scale"][0].as_py() == 16.0
    assert (np.diff(t["step"].to_numpy()) > 0).all()


def test_deepspeed_sft_sawtooth() -> None:
    t = deepspeed.parse([REAL / "deepspeed-chat-opt" / "step1_supervised_finetuning__opt-1.3b-globalBatchSize128.log"]).metrics
    assert pc.sum(pc.fill_null(t["found_inf"], False)).as_py() == 139
    assert _row(t, 7360)["skipped_steps"] == 139 and _row(t, 0)["val_ppl"] == pytest.approx(4998.29638671875)
    assert pc.count(pc.filter(t["attempted_loss_scale"], pc.equal(t["attempted_loss_scale"], 65536.0))).as_py() >= 67


@pytest.mark.parametrize("path, fmt", [
    ("llmc-gpt2-124m/raw.log", "llmc"),
    ("llmc-gpt2-124m/raw_2024-06-06_AdamW_baseline.log", "llmc"),
    ("modded-nanogpt-1p5b/raw.log", "modded-nanogpt"),
    ("megatron-lm-gpt3-15b-8t/raw_dgx_h100.json", "megatron-golden"),
    # Megatron-DeepSpeed stdouts: Megatron's iteration lines and DeepSpeed's step= reports, both read.
    ("msft-megatron-ds-gpt3-125m-fp16/raw.log", "megatron+deepspeed"),
    ("bigscience-megatron-perf-runs/meg_ds_zero_gpt2_perf_n16-1999616.out", "megatron+deepspeed"),
    ("bigscience-chronicles-excerpts/blocks/tr8b-104B__chronicles__L256-260.log", "megatron"),
    ("deepspeed-chat-opt/step1_supervised_finetuning__opt-1.3b-globalBatchSize128.log", "deepspeed"),
    ("deepspeed-chat-opt/step3_rlhf_finetuning__actor_opt-1.3b_critic_opt-350m_globalBatchSize64.log", "deepspeed"),
])
def test_auto_detects_real_files(path: str, fmt: str) -> None:
    assert detect_format(REAL / path) == fmt


def test_auto_joins_deepspeed_clock_onto_megatron_msft() -> None:
    """The real Megatron-DeepSpeed 125M stdout: Megatron's losses and scales stay, DeepSpeed adds its wall clock."""
    name, parsed = auto.read([REAL / "msft-megatron-ds-gpt3-125m-fp16" / "raw.log"])
    t = parsed.metrics
    alone = megatron.parse([REAL / "msft-megatron-ds-gpt3-125m-fp16" / "raw.log"]).metrics
    assert name == "megatron+deepspeed" and _count(t, "loss") == _count(alone, "loss") == 213
    assert t["loss_scale"].to_pylist()[1:] == alone["loss_scale"].to_pylist()  # row 0: DeepSpeed's step=0
    assert _row(t, 10)["time"] == 1667000938.641 and _row(t, 10)["loss"] == pytest.approx(10.69056)
    assert _count(t, "time") == 214 and _row(t, 0)["loss"] is None


def test_auto_places_bigscience_overflows_on_iteration_steps() -> None:
    """No step= line in this excerpt: Megatron's iteration lines are the counters DeepSpeed's overflows take."""
    name, parsed = auto.read([BLOCKS / "tr8b-104B__chronicles__L446-460.log"])
    t = parsed.metrics
    attempted = {r["step"]: r["attempted_loss_scale"] for r in t.to_pylist() if r["attempted_loss_scale"]}
    assert name == "megatron+deepspeed"
    assert attempted == {17062: 1048576.0, 17063: 1048576.0, 17064: 524288.0, 17065: 262144.0, 17067: 131072.0,
                         17068: 65536.0}
    flags = [r["step"] for r in t.to_pylist() if r["found_inf"]]
    assert flags == [17062, 17063, 17064, 17065, 17067, 17068]  # Megatron's own flags, unchanged


def test_glm_notes_are_not_a_metric_log() -> None:
    with pytest.raises(ValueError, match="could not detect"):
        detect_format(REAL / "glm-130b-training-notes" / "raw.md")
