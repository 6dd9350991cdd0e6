"""Which module is the final layer, found by structure when the caller does not say."""

from __future__ import annotations

from torch import nn

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig
from runwatch.collectors.signals import final_layer


class MoEBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(8))  # longer than the stack of blocks


class MoEModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(MoEBlock() for _ in range(2))
        self.head = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 10))  # a Sequential beside the stack


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.act, self.second = nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)


def test_final_layer_by_structure() -> None:
    tiny = TinyGPT(TinyGPTConfig(d_model=16, num_layers=3))
    assert final_layer(tiny) is tiny.blocks[2]
    moe = MoEModel()
    assert final_layer(moe) is moe.model.layers[1]  # the shallowest ModuleList, not the experts
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert final_layer(mlp) is mlp[2]
    plain = TwoLinears()
    assert final_layer(plain) is plain.second  # no stack: the last module holding parameters
    bare = nn.ReLU()
    assert final_layer(bare) is bare
