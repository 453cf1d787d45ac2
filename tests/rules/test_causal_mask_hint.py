"""ACC034 beyond its example: the encoder given the hint computes what it computed, without
reading the mask on the host; a mask that cannot be shown causal is left as it is."""

import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from accrewrite.engine import Options, migrate_source

MODEL = '''
import math
import torch
from torch import nn


class TransformerModel(nn.Transformer):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers):
        super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers, dropout=0.0)
        self.src_mask = None
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.decoder = nn.Linear(ninp, ntoken)

    def _generate_square_subsequent_mask(self, sz):
        return torch.log(torch.tril(torch.ones(sz, sz)))

    def forward(self, src, has_mask=True):
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                mask = self._generate_square_subsequent_mask(len(src)).to(device)
                self.src_mask = mask
        else:
            self.src_mask = None
        output = self.encoder(self.input_emb(src), mask=self.src_mask)
        return self.decoder(output)


class Tutorial(nn.Module):
    def __init__(self, ntoken, d_model):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, 2, 32, 0.0)
        self.transformer_encoder = nn.TransformerEncoder(layer, 2)
        self.embedding = nn.Embedding(ntoken, d_model)

    def forward(self, src):
        src_mask = nn.Transformer.generate_square_subsequent_mask(len(src))
        return self.transformer_encoder(self.embedding(src), src_mask)
'''


def migrated(source: str) -> str:
    result = migrate_source(source.encode(), "model.py", Options(target="torch_xla", select=("ACC034",)))
    assert result.error is None
    return result.output.decode()


class _HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def _load(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "model.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("name, args", [("TransformerModel", (50, 16, 2, 32, 2)), ("Tutorial", (50, 16))])
def test_the_hinted_encoder_computes_the_same_without_reading_the_mask(name, args):
    output = migrated(MODEL)
    assert output.count("is_causal=") == 2
    src = torch.randint(0, 50, (12, 3))
    results = {}
    for label, source in (("original", MODEL), ("migrated", output)):
        torch.manual_seed(0)
        model = _load(source)[name](*args)
        with _HostReads() as reads:
            logits = model(src)
            logits.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.eval()
        with torch.no_grad():
            evaluated = model(src)
        results[label] = (logits.detach(), grads, evaluated, reads.count)
    (logits, grads, evaluated, original_reads), (m_logits, m_grads, m_evaluated, migrated_reads) = results.values()
    torch.testing.assert_close(m_logits, logits)
    torch.testing.assert_close(m_evaluated, evaluated)
    for got, want in zip(m_grads, grads):
        torch.testing.assert_close(got, want)
    assert original_reads > 0 and migrated_reads == 0


@pytest.mark.parametrize("change", [
    # not causal: every position sees every other
    ("torch.log(torch.tril(torch.ones(sz, sz)))", "torch.zeros(sz, sz)"),
    # a mask the caller passes in
    ("mask=self.src_mask)", "mask=self.mask_of(src))"),
    # told already
    ("mask=self.src_mask)", "mask=self.src_mask, is_causal=False)"),
    # a mask assigned otherwise too
    ("self.src_mask = None\n        self.input_emb", "self.src_mask = torch.zeros(4, 4)\n        self.input_emb"),
])
def test_a_mask_not_shown_causal_is_left(change):
    source = MODEL.split("class Tutorial")[0].replace(*change)
    assert change[1] in source
    assert migrated(source) == source
