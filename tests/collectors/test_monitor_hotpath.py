"""Monitor's hot path on real CPU training: one device operation per step, the loss scale in either call order."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches
from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig
from runwatch.data.store import Store
from tests.collectors.probes import OpCounter, SyncCounter

torch.set_num_threads(1)
CFG = TinyGPTConfig(d_model=32, num_layers=2)


def _scaled_steps(root: Path, run: str, steps: int, *, record_before_update: bool, inject_inf_at: set[int],
                  flush_every: int = 7, warm_steps: int = 0) -> tuple[list[float], list[bool], Monitor]:
    """fp32 training under a GradScaler; return the scale each step used and whether it skipped.

    ``record_before_update`` calls ``Monitor.step`` between ``scaler.step``
    and ``scaler.update`` (else after ``update``). ``warm_steps`` train
    before the monitor exists (a monitor made mid-run).
    """
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_factor=4.0, backoff_factor=0.25,
                                  growth_interval=5)
    batches = synthetic_batches(CFG, batch_size=4)
    used, skipped = [], []
    mon = None
    for step in range(warm_steps + steps):
        if step == warm_steps:
            mon = Monitor(root, run, model=model, scaler=scaler, config=MonitorConfig(flush_every_steps=flush_every))
        batch = next(batches)
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if step in inject_inf_at:
            model.head.weight.grad[0, 0] = float("inf")
        scaler.unscale_(optimizer)
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        scaler.step(optimizer)
        used.append(scaler.get_scale())  # the test's own sync: the scale this step's backward used
        skipped.append(bool(sum(v.item() for v in scaler._per_optimizer_states[id(optimizer)]
                                ["found_inf_per_device"].values())))
        if mon is not None and record_before_update:
            mon.step(step, loss=loss, grad_norm=gn)
        scaler.update()
        if mon is not None and not record_before_update:
            mon.step(step, loss=loss, grad_norm=gn)
    mon.close()
    return used[warm_steps:], skipped[warm_steps:], mon


@pytest.mark.parametrize("record_before_update", [False, True])
def test_loss_scale_is_the_scale_each_step_used_in_either_call_order(tmp_path: Path,
                                                                      record_before_update: bool) -> None:
    infs = {3, 4, 11, 20}  # a back-to-back pair, growth after 5 clean steps, flush boundaries (every 7) crossed
    used, skipped, mon = _scaled_steps(tmp_path, "amp", 30, record_before_update=record_before_update,
                                       inject_inf_at=infs)
    assert mon.num_errors == 0
    with Store(tmp_path) as store:
        rows = store.rows("amp")
        meta = store.meta("amp")
    assert rows["loss_scale"].to_pylist() == used
    assert rows["found_inf"].to_pylist() == skipped == [s in infs for s in range(30)]
    changes = [b / a for a, b in zip(used, used[1:]) if a != b]
    assert 4.0 in changes and 0.25 in changes  # growths and backoffs both happened: the series is not trivial
    assert meta["scaler"] == {"init_scale": 4096.0, "growth_factor": 4.0, "backoff_factor": 0.25,
                              "growth_interval": 5}
    assert meta["precision"] == "float32+GradScaler"


def test_monitor_made_mid_run_records_the_scale_in_effect(tmp_path: Path) -> None:
    used, skipped, _ = _scaled_steps(tmp_path, "mid", 12, record_before_update=False, inject_inf_at={2, 9},
                                     warm_steps=6)
    with Store(tmp_path) as store:
        rows = store.rows("mid")
    assert rows["step"].to_pylist() == list(range(6, 18))
    assert rows["loss_scale"].to_pylist() == used and rows["found_inf"].to_pylist() == skipped


def test_a_step_is_one_device_operation_and_no_sync(tmp_path: Path) -> None:
    """All recorded tensors of a step (loss, grad norm, loss scale, found-inf, act norm, extras) in one copy."""
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    batches = synthetic_batches(CFG, batch_size=4)
    ops_per_step, syncs = [], []
    with Monitor(tmp_path, "ops", model=model, scaler=scaler, activation_module=model.blocks[-1],
                 config=MonitorConfig(flush_every_steps=5)) as mon:
        for step in range(16):
            batch = next(batches)
            loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            scaler.step(optimizer)
            scaler.update()
            z_loss, num_tokens = loss.detach() * 0.5, torch.tensor(128)
            with OpCounter() as ops, SyncCounter() as counter:
                # loss still requires grad: the copy must not join the autograd graph
                mon.step(step, loss=loss, grad_norm=gn, lr=1e-3, tokens=step * 128, z_loss=z_loss,
                         num_tokens=num_tokens)
            ops_per_step.append(ops.ops)
            syncs.append(counter.calls)
    assert syncs == [[]] * 16
    # After the first pass through the buffer (its cell views are made at first use), a step that
    # does not flush is exactly one dispatched operation; a flushing step (4, 9, 14) adds the copy out.
    steady = [ops for step, ops in enumerate(ops_per_step) if step >= 5 and step % 5 != 4]
    assert steady == [["aten._foreach_copy_.default"]] * len(steady)
    with Store(tmp_path) as store:
        rows = store.rows("ops")
    assert rows.num_rows == 16 and rows["act_norm"].null_count == 0 and rows["loss_scale"].null_count == 0
    assert rows["num_tokens"].to_pylist() == [128.0] * 16
    torch.testing.assert_close(torch.tensor(rows["z_loss"].to_pylist()), 0.5 * torch.tensor(rows["loss"].to_pylist()))
    assert mon._pending.buffer._values.grad_fn is None  # the buffer never joined an autograd graph


def test_kinds_of_step_change_and_columns_widen(tmp_path: Path) -> None:
    """Fields come and go between steps, a Python number becomes a tensor, a dozen new extras widen the buffer."""
    expected: list[dict[str, float | None]] = []
    with Monitor(tmp_path, "kinds", config=MonitorConfig(flush_every_steps=4)) as mon:
        for step in range(22):
            loss = torch.tensor(10.0 - step)
            fields: dict = {"loss": loss}
            if step % 3 == 0:
                fields["grad_norm"] = torch.tensor(float(step), dtype=torch.float16)
            fields["lr"] = torch.tensor(0.5 * step, dtype=torch.float64) if step % 2 else 0.25 * step
            if step >= 9:  # 12 tensor extras appear mid-buffer: past the initial 8 columns
                fields.update({f"x{k}": torch.tensor(step * 100 + k, dtype=torch.int32) for k in range(12)})
            if step == 15:
                fields["nan_metric"] = torch.tensor(float("nan"))
            mon.step(step, **fields)
            expected.append({k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in fields.items()})
        assert mon.num_errors == 0
    with Store(tmp_path) as store:
        rows = store.rows("kinds").to_pylist()
    assert [r["step"] for r in rows] == list(range(22))
    for row, want in zip(rows, expected, strict=True):
        for name in ("loss", "grad_norm", "lr", *(f"x{k}" for k in range(12))):
            got = row.get(name)
            if name in want:
                assert got == pytest.approx(want[name]), (row["step"], name)
            else:
                assert got is None, (row["step"], name)
    assert math.isnan(rows[15]["nan_metric"]) and rows[16]["nan_metric"] is None


def test_one_element_tensors_of_any_shape_are_taken(tmp_path: Path) -> None:
    with Monitor(tmp_path, "shapes") as mon:
        for step in range(3):
            mon.step(step, loss=torch.tensor([2.0 + step]), grad_norm=torch.tensor([[0.5]]), act_norm=torch.tensor(1.0))
        with pytest.warns(RuntimeWarning, match="expected a 1-element tensor"):
            mon.step(3, loss=torch.ones(2), grad_norm=torch.tensor(0.25))  # two elements: that field is rejected
    assert mon.num_errors == 1
    with Store(tmp_path) as store:
        rows = store.rows("shapes")
    assert rows["loss"].to_pylist() == [2.0, 3.0, 4.0, None]
    assert rows["grad_norm"].to_pylist() == [0.5, 0.5, 0.5, 0.25]


def test_sync_counter_attributes_syncs_to_their_caller() -> None:
    """The probe the integration tests rely on: runwatch's syncs are counted, the framework's are not."""
    import numpy as np

    from runwatch.collectors.writer import MetricsBatch, batch_table
    from tests.collectors.probes import RUNWATCH_DIR

    batch = MetricsBatch("r", 0, 0, [{"step": 0}], ["loss"], torch.ones(1, 1, dtype=torch.float64),
                         np.ones((1, 1), dtype=bool), None)
    with SyncCounter(only_from=RUNWATCH_DIR) as counter:
        torch.tensor(1.0).item()  # the test's own: not runwatch's
        batch_table(batch)  # the writer (on its own thread in real use) reads the host copy with .numpy()
    assert counter.calls == ["numpy"] and counter.num_other == 1
