"""Property tests: no input crashes a parser; it parses or raises a clear ValueError."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from runwatch.collectors.importers import (
    csv_log, deepspeed, fairseq_text, hf_trainer, jsonl, llmc, megatron, megatron_golden, metaseq, modded_nanogpt,
    nanogpt, tensorboard, wandb,
)

# Fragments of real lines, so generated text reaches deep into each parser, mixed with junk.
FRAGMENTS = [
    "s:", "trl:", "tel:", "lr:", "norm:", "step:", "/100 ", "train_loss:", "val_loss:", "train_time:", "ms",
    "step_avg:", " iteration ", "[default7]:", " | ", "lm loss: ", "loss scale: ", "grad norm: ", "consumed samples: ",
    "elapsed time per iteration (ms): ", "validation loss at iteration ", "saving checkpoint at iteration ", " to /ck",
    "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: ", ", reducing to ", "[2023-04-18 01:46:53,259] ",
    "[Rank 0] step=", ", skipped=", ", lr=[", "]", "| INFO | train_inner | ", '{"num_updates": ', '"loss": ', "}",
    "step,loss,found_inf\n", "_step,_timestamp,loss\n", '{"lm loss": {"values": {"1": ', '"nan"', "1", "12", "3.5",
    "nan", "inf", "-1e9", "1e400", "abc", ",", ":", "\n", "\t", " ", "é", "\x00", "brain.Event:2",
    "iter ", ": loss ", ", time ", "ms, mfu ", "%", "step 3: train loss ", ", val loss ", "saving checkpoint to out",
    "{'loss': ", "{'eval_loss': ", "'grad_norm': ", "tensor(", "'", "{'train_runtime': ", '"log_history": [',
    " samples/sec: ", "approx flops per GPU: ", "TFLOPS", "lm_loss: ", "validation results at iteration ",
    "| epoch 001", ":    100 / 377 ", "loss=", ", num_updates=", " | num_updates ", " | valid on 'valid' subset",
    "| WARNING: overflow detected, setting loss scale to: ", "2020-10-01 12:00:00 | INFO | train_inner | ", "\r",
    "Saved checkpoint c.pt (epoch 1 @ 5 updates)", "Loaded checkpoint c.pt (epoch 1 @ 5 updates)", "0%",
]
MODULES = [llmc, modded_nanogpt, nanogpt, hf_trainer, megatron, megatron_golden, deepspeed, metaseq, fairseq_text,
           csv_log, wandb, tensorboard, jsonl]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8), st.binary(max_size=4)), max_size=40),
       skip=st.booleans())
def test_no_input_crashes_the_parser(module, parts: list[str | bytes], skip: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.log"
        # Raw bytes too: invalid UTF-8 must give a clear error (or be skipped), never a crash.
        path.write_bytes(b"".join(p if isinstance(p, bytes) else p.encode("utf-8", errors="replace") for p in parts))
        try:
            parsed = module.parse([path], skip_bad_lines=skip)
        except ValueError as err:
            assert str(err)  # a clear message, never an empty one
            return
        assert parsed.metrics.schema.field("step").type == pa.int64()
        assert parsed.metrics["step"].null_count == 0


@settings(max_examples=50, deadline=None)
@given(steps=st.lists(st.integers(0, 10**6), min_size=1, max_size=30),
       losses=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none()), min_size=30, max_size=30))
def test_llmc_round_trip(steps: list[int], losses: list[float | None]) -> None:
    """What llm.c prints, the parser reads back: every step and loss, NaN as NaN."""
    lines = [f"s:{s} trl:{x!r}" if x is not None else f"s:{s} tel:1.0" for s, x in zip(steps, losses)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.log"
        path.write_text("\n".join(lines) + "\n")
        t = llmc.parse([path]).metrics
    got = [(r["step"], r["loss"]) for r in t.to_pylist() if r["loss"] is not None]
    want = [(s, x) for s, x in zip(steps, losses) if x is not None]
    assert len(got) == len(want)
    for (gs, gx), (ws, wx) in zip(got, want):
        assert gs == ws and (gx == wx or (gx != gx and wx != wx))
