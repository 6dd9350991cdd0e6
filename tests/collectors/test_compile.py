"""Monitor around a torch.compile'd model: no graph break, no recompile, the same numbers as eager.

Graph breaks and recompiles are decided by Dynamo, before any backend, so the
test compiles with ``aot_eager`` (Dynamo plus AOT autograd, no C++ build):
the hook's operations are traced into the forward graph and its backward
exactly as with inductor, in a second instead of half a minute.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig
from runwatch.data.store import Store

torch.set_num_threads(1)
CFG = TinyGPTConfig(d_model=32, num_layers=2)
STEPS = 12


def _train(root: Path | None, *, compiled: bool) -> tuple[list[torch.Tensor], dict[str, dict[str, int]]]:
    """Train STEPS steps (with a Monitor when ``root`` is given); the losses and Dynamo's counters."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    run_model = torch.compile(model, backend="aot_eager") if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = synthetic_batches(CFG, batch_size=4)
    mon = None
    if root is not None:
        mon = Monitor(root, "compiled" if compiled else "eager", model=model, activation_module=model.blocks[-1],
                      config=MonitorConfig(flush_every_steps=5))
    losses = []
    for step in range(STEPS):
        loss, grad_norm = train_step(run_model, optimizer, next(batches))
        if mon is not None:
            mon.step(step, loss=loss, grad_norm=grad_norm, lr=3e-3)
        losses.append(loss.detach())
    if mon is not None:
        mon.close()
        assert mon.num_errors == 0
    return losses, {k: dict(v) for k, v in counters.items()}


def test_monitor_adds_no_graph_break_or_recompile(tmp_path: Path) -> None:
    _, bare = _train(None, compiled=True)
    losses, watched = _train(tmp_path, compiled=True)
    eager_losses, _ = _train(tmp_path, compiled=False)
    assert watched.get("graph_break", {}) == {} == bare.get("graph_break", {})
    assert watched.get("recompiles", {}) == {} == bare.get("recompiles", {})
    assert watched["frames"] == bare["frames"] == {"total": 1, "ok": 1}  # one frame, compiled once
    assert watched["stats"]["unique_graphs"] == bare["stats"]["unique_graphs"] == 1
    # The hook was traced into the graph (more calls captured), not run beside it.
    assert watched["stats"]["calls_captured"] > bare["stats"]["calls_captured"]
    with Store(tmp_path) as store:
        compiled_rows, eager_rows = store.rows("compiled"), store.rows("eager")
    # The compiled run trained as the eager one did, and recorded the same activation norms.
    torch.testing.assert_close(torch.stack(losses), torch.stack(eager_losses))
    for name in ("loss", "grad_norm", "act_norm"):
        assert compiled_rows[name].null_count == 0
        torch.testing.assert_close(torch.tensor(compiled_rows[name].to_pylist()),
                                   torch.tensor(eager_rows[name].to_pylist()), rtol=1e-5, atol=1e-6)
