"""A tiny GPT and its training step, for the demo, the tests and the benchmarks.

Not a model anyone should train for real: a few pre-norm transformer blocks
on synthetic tokens from a fixed random Markov chain, so the loss falls
quickly on a CPU and a run of a few hundred steps shows a real learning curve
that ``Monitor`` records. ``model.blocks[-1]`` is the final layer whose output
``Monitor`` hooks for the activation norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(kw_only=True, frozen=True)
class TinyGPTConfig:
    """Shape of the tiny GPT."""

    vocab_size: int = 64
    """Number of distinct tokens."""
    seq_len: int = 32
    """Context length (tokens per sequence)."""
    d_model: int = 64
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads per block; must divide ``d_model``."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "num_layers", "num_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"TinyGPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(self.ln1(x_BTD)).split(D, dim=2)
        # (B, T, D) -> (B, H, T, D/H)
        q, k, v = (t.view(B, T, self.num_heads, D // self.num_heads).transpose(1, 2) for t in (q, k, v))
        att_BHTd = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x_BTD = x_BTD + self.proj(att_BHTd.transpose(1, 2).reshape(B, T, D))
        return x_BTD + self.mlp(self.ln2(x_BTD))


class TinyGPT(nn.Module):
    """Token and position embeddings, ``blocks``, a final norm and an LM head."""

    def __init__(self, cfg: TinyGPTConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or TinyGPTConfig()
        self.tok_emb = nn.Embedding(self.cfg.vocab_size, self.cfg.d_model)
        self.pos_emb = nn.Embedding(self.cfg.seq_len, self.cfg.d_model)
        self.blocks = nn.ModuleList(Block(self.cfg) for _ in range(self.cfg.num_layers))
        self.ln_f = nn.LayerNorm(self.cfg.d_model)
        self.head = nn.Linear(self.cfg.d_model, self.cfg.vocab_size, bias=False)

    def forward(self, idx_BT: torch.Tensor) -> torch.Tensor:
        pos_T = torch.arange(idx_BT.shape[1], device=idx_BT.device)
        x_BTD = self.tok_emb(idx_BT) + self.pos_emb(pos_T)
        for block in self.blocks:
            x_BTD = block(x_BTD)
        return self.head(self.ln_f(x_BTD))  # (B, T, V) logits


def synthetic_batches(cfg: TinyGPTConfig, batch_size: int, seed: int = 0) -> Iterator[torch.Tensor]:
    """Endless (B, T+1) token batches from a fixed sparse random Markov chain.

    Each token has 4 likely successors, so a model can get well below the
    uniform loss ln(vocab_size): the curve has something to learn.
    """
    gen = torch.Generator().manual_seed(seed)
    logits_VV = torch.full((cfg.vocab_size, cfg.vocab_size), -4.0)
    likely = torch.randint(0, cfg.vocab_size, (cfg.vocab_size, 4), generator=gen)
    logits_VV.scatter_(1, likely, 2.0)
    probs_VV = logits_VV.softmax(dim=1)
    while True:
        tok_B = torch.randint(0, cfg.vocab_size, (batch_size,), generator=gen)
        seq = [tok_B]
        for _ in range(cfg.seq_len):
            tok_B = torch.multinomial(probs_VV[tok_B], 1, generator=gen).squeeze(1)
            seq.append(tok_B)
        yield torch.stack(seq, dim=1)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch_BT: torch.Tensor,
    *,
    scaler: torch.amp.GradScaler | None = None,
    clip: float | None = 1.0,
    after_backward: Callable[[nn.Module], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step; returns (loss, grad norm) as 0-dim tensors, no host sync.

    ``after_backward`` runs right after backward (before unscaling and
    clipping): tests use it to inject an Inf into a gradient.
    """
    inputs, targets = batch_BT[:, :-1], batch_BT[:, 1:]
    logits_BTV = model(inputs)
    loss = F.cross_entropy(logits_BTV.reshape(-1, logits_BTV.shape[-1]), targets.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if after_backward is not None:
        after_backward(model)
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    grad_norm = None
    if clip is not None:
        # foreach=True keeps the norm a tensor; error_if_nonfinite=False avoids a sync.
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return loss.detach(), grad_norm


def cosine_lr(step: int, *, base_lr: float, warmup: int, total: int) -> float:
    """Linear warm-up then cosine decay to 10% of ``base_lr``."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
