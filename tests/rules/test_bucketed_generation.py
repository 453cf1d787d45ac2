"""Generation padded to bucket lengths (ACC028) samples what the original samples: the causal GPT
of tests/rules/fixtures/generate_bucketed.in.py (a lower-triangular mask, and
scaled_dot_product_attention with is_causal=True), migrated with ACC028 alone (plain torch, so
it runs on this CPU), gives each step's logits of the unpadded model and the same tokens, while
its model sees only power-of-two lengths; the models it cannot show causal keep their loops, and
ACC103 says why. Under torch_xla the migrated script compiles a few graphs for many tokens."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from accrewrite.engine import Options, migrate_source

FIXTURE = Path(__file__).parent / "fixtures" / "generate_bucketed.in.py"
SOURCE = FIXTURE.read_bytes()


def _module(source: bytes, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.device = "cpu"
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def _migrated(*codes: str):
    return migrate_source(SOURCE, "generate_bucketed.py", Options(target="torch_xla", select=codes))


def _generated(module, flash: bool, state, lengths=None):
    model = module.CausalGPT(flash=flash).eval()
    model.load_state_dict(state)
    if lengths is not None:
        model.register_forward_pre_hook(lambda _, args: lengths.add(args[0].size(1)))
    steps = []
    torch.manual_seed(7)
    tokens = model.generate(torch.zeros((2, 1), dtype=torch.long), 20, temperature=0.8, steps=steps)
    return tokens, steps


@pytest.mark.parametrize("flash", [False, True], ids=["tril-mask", "sdpa-is-causal"])
def test_padded_context_gives_every_step_the_unpadded_logits(flash):
    result = _migrated("ACC028")
    assert result.error is None and b"torch_xla" not in result.output
    original, migrated = _module(SOURCE, "original"), _module(result.output, "migrated")
    torch.manual_seed(0)
    state = original.CausalGPT(flash=flash).state_dict()
    lengths: set[int] = set()
    tokens, steps = _generated(original, flash, state)
    padded_tokens, padded_steps = _generated(migrated, flash, state, lengths)
    assert torch.equal(tokens, padded_tokens) and tokens.shape == (2, 21)
    assert len(steps) == len(padded_steps) == 20
    for unpadded, padded in zip(steps, padded_steps):
        torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-6)
    assert lengths == {1, 2, 4, 8}  # 20 tokens, a context cropped to 8: four lengths


def test_models_not_shown_causal_keep_their_loops():
    result = _migrated("ACC028", "ACC103")
    output = result.output.decode()
    assert output.count("idx = idx.cpu()") == 1  # CausalGPT's loop only
    for name in ("LastPositionGPT", "OpenGPT"):
        start = SOURCE.decode().index(f"class {name}")
        original = SOURCE.decode()[start:].split("\n\n\n")[0]
        assert original in output
    reasons = {d.line: d.help for d in result.diagnostics if d.code == "ACC103"}
    assert sorted(reasons) == [94, 113]
    assert "the model returns only its last position's logits" in reasons[94]
    assert "scaled_dot_product_attention` is not given is_causal=True" in reasons[113]


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_samples_many_tokens_with_few_compilations(tmp_path, xla_python):
    """The causal GPT samples 64 tokens, a context cropped to 8: about four model graphs (one per
    length) and the first steps' small ones, not one per token."""
    script = tmp_path / "generate.py"
    script.write_bytes(migrate_source(SOURCE, "generate.py", Options(target="torch_xla")).output)
    driver = (
        "import torch, torch_xla, generate, torch_xla.debug.metrics as met\n"
        "generate.device = torch_xla.device()\n"
        "model = generate.CausalGPT().to(generate.device).eval()\n"
        "tokens = generate.sample(model, 64)\n"
        "print(tokens.shape[1], met.metric_data('CompileTime')[0])\n"
    )
    done = subprocess.run([xla_python, "-c", driver], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stderr[-3000:]
    length, compiles = map(int, done.stdout.split()[-2:])
    assert length == 65 and compiles <= 12


_MODEL = '''
import torch
from torch import nn
from torch.nn import functional as F

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.register_buffer("tril", torch.tril(torch.ones(8, 8)))

    def forward(self, x):
        T = x.size(1)
        q, k, v = self.qkv(x).split(16, dim=2)
        wei = (q @ k.transpose(-2, -1)).masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        return F.softmax(wei, dim=-1) @ v

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(11, 16)
        self.attn = Attention()
        self.head = nn.Linear(16, 11)

    def forward(self, idx):
        return self.head(self.attn(self.tok(idx)))

    def generate(self, idx, max_new_tokens):
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -8:]
            logits = self(idx_cond)
            idx_next = torch.multinomial(F.softmax(logits[:, -1, :], dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
'''


@pytest.mark.parametrize("change, reason", [
    (("== 0", "== 1"), "`Attention` attends to every position"),
    (("self.attn = Attention()", "self.attn = nn.MultiheadAttention(16, 2)"), "`MultiheadAttention` may read"),
    (("self.attn = Attention()", "self.attn = attention_layer()"), "`attention_layer` builds a layer"),
    # `self` in generate may be a subclass's, which builds another layer
    (("        return idx\n", "        return idx\n\nclass OpenGPT(GPT):\n    def __init__(self):\n"
      "        super().__init__()\n        self.attn = nn.TransformerEncoderLayer(16, 2)\n"), "`TransformerEncoderLayer` may read"),
    (("idx_cond = idx[:, -8:]", "idx_cond = idx if idx.size(1) < 99 else idx[:, -8:]"), "not the last tokens"),
    (("idx_cond = idx[:, -8:]", "idx_cond = idx"), "not the last tokens"),
    (("        return self.head(self.attn(self.tok(idx)))\n",
      "        assert idx.size(1) <= 8\n        return self.head(self.attn(self.tok(idx)))\n"), None),
    (("logits[:, -1, :]", "logits[:, -2, :]"), "read elsewhere than at the last position"),
    (("idx = torch.cat((idx, idx_next), dim=1)", "idx = torch.cat((idx, idx_next), dim=1)\n"
      "            if idx_next.item() == 0:\n                return idx"), "returns from inside"),
    (("logits = self(idx_cond)", "logits = self(idx_cond, idx)"), "more than its context"),
    (("logits = self(idx_cond)", "if True: logits = self(idx_cond)"), "one-line suite"),
])
def test_loops_that_padding_could_change_are_left_with_the_reason(change, reason):
    source = _MODEL.replace(*change)
    if reason is None:  # the whole sequence given to a model of a fixed number of positions
        source = source.replace("idx_cond = idx[:, -8:]\n            logits = self(idx_cond)", "logits = self(idx)")
        reason = "positions up to a fixed length"
    assert source != _MODEL
    result = migrate_source(source.encode(), "gpt.py", Options(target="torch_xla", select=("ACC028", "ACC103")))
    assert result.output == source.encode()
    [left] = [d for d in result.diagnostics if d.code == "ACC103"]
    assert reason in left.help


def test_the_model_itself_is_padded():
    result = migrate_source(_MODEL.encode(), "gpt.py", Options(target="torch_xla", select=("ACC028", "ACC103")))
    assert b"idx = idx.cpu()" in result.output and not result.diagnostics


@pytest.mark.parametrize("target, mark", [("torch_xla", "torch_xla.sync()"), ("torchacc", "xm.mark_step()")])
def test_a_one_line_generation_loop_ends_each_token_on_its_line(target, mark):
    one_line = ("        for _ in range(max_new_tokens): logits = self(idx[:, -8:]); "
                "idx = torch.cat((idx, torch.multinomial(F.softmax(logits[:, -1, :], dim=-1), 1)), dim=1)\n")
    start = _MODEL.index("        for _ in range(max_new_tokens):")
    source = _MODEL[:start] + one_line + _MODEL[_MODEL.index("        return idx\n"):]
    result = migrate_source(source.encode(), "gpt.py", Options(target=target))
    assert result.error is None
    assert f"dim=1); {mark}\n" in result.output.decode()
    again = migrate_source(result.output, "gpt.py", Options(target=target))
    assert again.output == result.output
