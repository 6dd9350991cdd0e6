"""Monitor on a CUDA device: zero host-device syncs per step, checked by CUDA itself.

``torch.cuda.set_sync_debug_mode("error")`` makes every synchronising CUDA
call raise; ``Monitor.step`` would catch it and count an error, so a single
sync anywhere in a step (flushing steps included) shows as ``num_errors``.
Skipped without CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches
from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig
from runwatch.data.store import Store

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CFG = TinyGPTConfig(d_model=64, num_layers=2)


@pytest.mark.parametrize("record_before_update", [False, True])
def test_fp16_training_steps_never_sync(tmp_path: Path, record_before_update: bool) -> None:
    torch.manual_seed(0)
    model = TinyGPT(CFG).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12, growth_interval=5)
    batches = synthetic_batches(CFG, batch_size=8)
    infs = {3, 4, 17}
    losses, used, skipped = [], [], []
    mon = Monitor(tmp_path, "cuda", model=model, scaler=scaler, activation_module=model.blocks[-1],
                  config=MonitorConfig(flush_every_steps=7))

    def record(step: int, loss: torch.Tensor, gn: torch.Tensor) -> None:
        torch.cuda.set_sync_debug_mode("error")
        try:
            mon.step(step, loss=loss, grad_norm=gn, lr=1e-3, tokens=step * 8 * CFG.seq_len,
                     z=torch.ones((), device="cuda", dtype=torch.bfloat16))
        finally:
            torch.cuda.set_sync_debug_mode(0)

    for step in range(30):
        batch = next(batches).cuda()
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if step in infs:
            model.head.weight.grad[0, 0] = float("inf")
        scaler.unscale_(optimizer)
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        scaler.step(optimizer)
        if record_before_update:
            record(step, loss, gn)
        used.append(scaler.get_scale())  # the test's own syncs, outside the monitor
        skipped.append(step in infs)
        losses.append(loss.item())
        scaler.update()
        if not record_before_update:
            record(step, loss, gn)
    mon.close()
    assert mon.num_errors == 0, "a CUDA sync inside Monitor.step raised and was counted"
    with Store(tmp_path) as store:
        rows = store.rows("cuda")
    assert rows["step"].to_pylist() == list(range(30))
    assert rows["loss"].to_pylist() == pytest.approx(losses, rel=1e-6)
    assert rows["loss_scale"].to_pylist() == used and rows["found_inf"].to_pylist() == skipped
    assert rows["act_norm"].null_count == 0 and set(rows["z"].to_pylist()) == {1.0}
