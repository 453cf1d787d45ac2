import pytest

torch = pytest.importorskip("torch")
from torch import nn

from accrewrite.runtime.blocks import repeated_blocks


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.single = nn.ModuleList([nn.Linear(2, 2)])


def test_finds_outer_repeated_blocks_only():
    net = Net()
    assert repeated_blocks(net) == [("blocks", net.blocks)]


def test_mixed_classes_are_not_repeated_blocks():
    assert repeated_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []
