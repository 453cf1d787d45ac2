"""A small transformer trained 30 steps with the fused modules (FusedLayerNorm, QuickGelu,
dropout_add_fused_train, FusedAdamW; the reference path on the CPU) matches the same model built
from plain torch modules, loss for loss.

Both models draw the same dropout masks (the reference path is torch's dropout, called in the
same order), so the only differences are float32 rounding from the reordered Adam arithmetic:
the losses agree to rtol 1e-4 over 30 steps.
"""

import pytest
import torch
import torch.nn.functional as F

from accrewrite.runtime.nn import FusedLayerNorm, QuickGelu, dropout_add_fused_train
from accrewrite.runtime.optim import FusedAdamW

VOCAB, DIM, HEADS, SEQ, BATCH, DROP = 64, 32, 4, 12, 8, 0.1


class _PlainQuickGelu(torch.nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class _Block(torch.nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        norm = FusedLayerNorm if fused else torch.nn.LayerNorm
        self.fused = fused
        self.norm1, self.norm2 = norm(DIM), norm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(DIM, 4 * DIM),
            QuickGelu() if fused else _PlainQuickGelu(),
            torch.nn.Linear(4 * DIM, DIM),
        )

    def _residual(self, branch, residual):
        if self.fused:
            return dropout_add_fused_train(branch, residual, DROP)
        return residual + F.dropout(branch, DROP, training=True)

    def forward(self, x):
        q, k, v = self.qkv(self.norm1(x)).view(BATCH, SEQ, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = self._residual(self.proj(attn.transpose(1, 2).reshape(BATCH, SEQ, DIM)), x)
        return self._residual(self.mlp(self.norm2(x)), x)


class _TinyTransformer(torch.nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.Sequential(_Block(fused), _Block(fused))
        self.norm = FusedLayerNorm(DIM) if fused else torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        return self.head(self.norm(self.blocks(self.embed(tokens))))


def _losses(fused: bool, steps: int = 30) -> list[float]:
    torch.manual_seed(0)
    model = _TinyTransformer(fused)
    optimizer_class = FusedAdamW if fused else torch.optim.AdamW
    optimizer = optimizer_class(model.parameters(), lr=3e-3, weight_decay=0.01)
    data = torch.Generator().manual_seed(1)
    # a learnable task: predict the next token of sequences that count up modulo VOCAB
    starts = torch.randint(0, VOCAB, (steps, BATCH, 1), generator=data)
    sequences = (starts + torch.arange(SEQ + 1)) % VOCAB
    losses = []
    for batch in sequences:
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.fixture
def one_thread():
    """The tensors are tiny: on a busy shared CPU, intra-op threads only add waiting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_fused_model_trains_like_the_plain_one(one_thread):
    plain, fused = _losses(fused=False), _losses(fused=True)
    torch.testing.assert_close(torch.tensor(fused), torch.tensor(plain), rtol=1e-4, atol=0)
    assert plain[-1] < 0.6 * plain[0]  # it did learn: the comparison is not between flat lines
