"""accrewrite.runtime.compile: arguments, regional compilation, and compiled training vs eager."""

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

from accrewrite.runtime import compile
from accrewrite.runtime.compiler import compile_report
from accrewrite.runtime.compiler.core.regional import Region


pytestmark = pytest.mark.usefixtures("fresh_compiles")


class Block(nn.Module):
    """A pre-norm GPT block: causal self-attention and an MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        # written out rather than scaled_dot_product_attention, whose CPU lowering takes
        # inductor twice as long to compile
        scores = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=64, d=32, heads=2, blocks=2, seq=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(blocks)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def gpt_batch(step):
    # two batches in turn: random tokens have nothing else to learn, these can be memorised
    g = torch.Generator().manual_seed(step % 2)
    tokens = torch.randint(0, 64, (4, 17), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def gpt_loss(model, batch):
    idx, target = batch
    return F.cross_entropy(model(idx).flatten(0, 1), target.flatten())


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            # no conv bias before BatchNorm, which cancels it (its gradient would be float noise)
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.classifier = nn.Linear(16, 10)

    def forward(self, x):
        return self.classifier(self.features(x))


def cnn_batch(step):
    g = torch.Generator().manual_seed(step % 2)
    return torch.randn(8, 3, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)


def cnn_loss(model, batch):
    x, target = batch
    return F.cross_entropy(model(x), target)


LR = 1e-2


def train(model, loss_fn, batch_fn, steps, compile_optimizer):
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    if compile_optimizer:
        optimizer = compile(optimizer)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model, batch_fn(step))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# --- arguments ---


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"regional": "yes"}, "regional='yes'"),
        ({"mode": "fast"}, "mode='fast'"),
        ({"dynamic": "maybe"}, "dynamic='maybe'"),
        ({"kernels": "triton"}, "kernels='triton'"),
        ({"memory_budget": 1.5}, "memory_budget=1.5"),
        ({"memory_budget": "low"}, "memory_budget='low'"),
        ({"host_memory": "yes"}, "host_memory=.yes."),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compile(nn.Linear(2, 2), **kwargs)


def test_rejects_what_is_neither_model_nor_optimizer():
    with pytest.raises(TypeError, match="nn.Module or a torch.optim.Optimizer, got int"):
        compile(3)


def test_regional_true_needs_repeated_blocks():
    with pytest.raises(ValueError, match="no repeated blocks"):
        compile(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), regional=True)


def test_report_of_a_model_not_compiled_is_an_error():
    with pytest.raises(ValueError, match="not compiled by accrewrite"):
        compile_report(nn.Linear(2, 2))


# --- regional compilation ---


class Residual(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x))


class TwoStacks(nn.Module):
    """Two stacks of repeated blocks of two classes, one of them built-in (nn.Sequential)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.encoder = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4)])
        self.decoder = nn.ModuleList([Residual(8) for _ in range(3)])

    def forward(self, x):
        x = self.stem(x)
        for block in self.encoder:
            x = block(x)
        for block in self.decoder:
            x = block(x)
        return x


def compiles(model, *inputs):
    """How many graphs AOTAutograd compiled to run ``model(*inputs)`` without gradients."""
    counters.clear()
    with torch.no_grad():  # forward graphs only: the count is the same, the test is faster
        model(*inputs)
    return counters["aot_autograd"]["total"]


def regions(model):
    return [(r.cls, r.blocks) for r in compile_report(model).graphs if isinstance(r, Region)]


def test_regional_compiles_each_block_class_once():
    model = compile(TwoStacks())
    assert compile_report(model).graphs == []  # compilation happens at the first call

    # 7 blocks of 2 classes: one graph per class, shared by its instances, and the stem's.
    assert compiles(model, torch.randn(2, 5, 8)) == 3
    assert regions(model) == [
        ("Sequential", ["encoder.0", "encoder.1", "encoder.2", "encoder.3"]),
        ("Residual", ["decoder.0", "decoder.1", "decoder.2"]),
    ]
    assert 'glue: "' in str(compile_report(model).graphs[0])  # the stem, a Linear
    # the model is one compiled call; its blocks are not compiled calls of their own
    assert model._compiled_call_impl is not None
    assert all(block._compiled_call_impl is None for block in [*model.encoder, *model.decoder])


class BrokenStacks(TwoStacks):
    def forward(self, x):
        for block in self.encoder:
            x = block(x)
        torch._dynamo.graph_break()
        for block in self.decoder:
            x = block(x)
        return x


def test_blocks_in_graphs_split_by_a_graph_break_share_their_compiled_region():
    model = compile(BrokenStacks())
    # The break splits the forward in two graphs; each block class still compiles once.
    assert compiles(model, torch.randn(2, 5, 8)) == 2
    assert [cls for cls, _ in regions(model)] == ["Sequential", "Residual"]
    assert compiles(model, torch.randn(2, 5, 8)) == 0


def test_a_graph_traced_again_reuses_its_regions():
    model = compile(TwoStacks())
    assert compiles(model, torch.randn(2, 5, 8)) == 3
    torch._dynamo.reset()  # dynamo traces the forward again; the regions are the model's
    assert compiles(model, torch.randn(2, 5, 8)) == 1  # the stem's glue only
    assert [len(blocks) for _, blocks in regions(model)] == [4, 3]


@pytest.mark.slow
def test_glue_without_matmul_runs_as_traced():
    model = compile(GPT())  # its glue before the blocks: an embedding lookup plus positions
    assert compiles(model, torch.randint(0, 64, (2, 16))) == 2  # the blocks and the head
    assert "glue run as traced" in str(compile_report(model))


class DropoutBlock(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, self.training)


class DropoutStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([DropoutBlock(), DropoutBlock()])

    def forward(self, x):
        return [block(x) for block in self.blocks]


def test_blocks_sharing_compiled_code_draw_masks_of_their_own():
    model = compile(DropoutStack())
    first, second = model(torch.ones(1000))
    assert regions(model) == [("DropoutBlock", ["blocks.0", "blocks.1"])]
    assert not torch.equal(first == 0, second == 0)


@pytest.mark.slow
def test_regions_with_dynamic_shapes():
    torch.manual_seed(0)
    eager = GPT()
    model = compile(copy.deepcopy(eager), dynamic=True)
    for length in (16, 12, 8):
        idx = torch.randint(0, 64, (2, length))
        torch.testing.assert_close(model(idx), eager(idx), rtol=1e-5, atol=1e-5)
    assert [cls for cls, _ in regions(model)] == ["Block"]  # one compile for every length


@pytest.mark.slow
def test_checkpointed_blocks_share_their_region_and_keep_eager_gradients():
    from accrewrite.runtime.activation_checkpoint import auto_checkpoint

    torch.manual_seed(0)
    eager = GPT()
    model = compile(auto_checkpoint(copy.deepcopy(eager)))
    gpt_loss(model, gpt_batch(0)).backward()
    gpt_loss(eager, gpt_batch(0)).backward()
    # each block's checkpointed body is a subgraph of its own, alike in structure
    assert regions(model) == [("Block", ["blocks.0", "blocks.1"])]
    for compiled, expected in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(compiled.grad, expected.grad, rtol=1e-4, atol=1e-5)


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.ModuleList(
            [
                nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
                for _ in range(3)
            ]
        )

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return x


@pytest.mark.slow
def test_auto_compiles_whole_a_model_whose_blocks_hold_batch_norm():
    model = compile(ResNet())
    with torch.no_grad():
        model(torch.randn(2, 3, 6, 6))
    report = compile_report(model)
    assert len(report.graphs) == 1 and "in forward" in report.graphs[0], report.graphs
    assert model._compiled_call_impl is not None
    assert all(block._compiled_call_impl is None for block in model.blocks)
    assert "blocks (blocks) hold batch norm" in str(report)


def test_compiled_model_keeps_class_and_state_dict_keys():
    eager = GPT()
    keys = list(eager.state_dict())
    model = compile(copy.deepcopy(eager), regional=False)
    assert type(model) is GPT and list(model.state_dict()) == keys


# --- correctness: compiled training (forward, backward, optimizer) matches eager ---


@pytest.mark.slow
def test_gpt_training_regional_and_full_match_eager():
    torch.manual_seed(0)
    eager = GPT()
    regional, full = copy.deepcopy(eager), copy.deepcopy(eager)

    expected = train(eager, gpt_loss, gpt_batch, 20, compile_optimizer=False)
    got_regional = train(compile(regional), gpt_loss, gpt_batch, 20, compile_optimizer=True)
    got_full = train(compile(full, regional=False), gpt_loss, gpt_batch, 20, False)

    assert expected[-1] < 0.8 * expected[0]  # it trains: a comparison of flat curves proves little
    # fp32; inductor reorders reductions, so differences of ~1e-6 per step compound over 20 steps.
    torch.testing.assert_close(got_regional, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_full, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_regional, got_full, rtol=1e-4, atol=1e-4)
    # AdamW moves every parameter by about lr per step whatever the gradient's size, so where a
    # gradient is ~0 its sign is float noise: parameters may differ by a step or two of lr.
    for a, b in zip(regional.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=2 * LR)


@pytest.mark.slow
def test_cnn_training_compiles_whole_model_and_matches_eager():
    torch.manual_seed(0)
    eager = CNN()
    compiled = copy.deepcopy(eager)

    expected = train(eager, cnn_loss, cnn_batch, 20, compile_optimizer=False)
    got = train(compile(compiled), cnn_loss, cnn_batch, 20, compile_optimizer=False)
    # no repeated blocks (the nn.Sequential mixes classes): the whole model is one graph
    assert compiled._compiled_call_impl is not None
    assert len(compile_report(compiled).graphs) == 1

    assert expected[-1] < 0.8 * expected[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # BatchNorm running statistics are updated by the compiled graph too (tolerance: as above).
    torch.testing.assert_close(compiled.state_dict(), eager.state_dict(), rtol=0, atol=2 * LR)


# --- the optimizer step ---


def test_adamw_switches_to_its_fused_step():
    model = nn.Linear(3, 2)
    optimizer = compile(torch.optim.AdamW(model.parameters(), lr=LR))
    assert all(group["fused"] and not group["foreach"] for group in optimizer.param_groups)
    assert compile_report(optimizer).notes == ["AdamW: fused step, not compiled"]

    reference_model = copy.deepcopy(model)
    reference = torch.optim.AdamW(reference_model.parameters(), lr=LR, foreach=False)
    for m, opt in ((model, optimizer), (reference_model, reference)):
        for step in range(3):
            opt.zero_grad()
            m(torch.full((4, 3), float(step + 1))).square().sum().backward()
            opt.step()
    for a, b in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(a, b)


def test_optimizer_with_state_or_without_fused_step_is_compiled():
    param = nn.Parameter(torch.ones(5))
    optimizer = compile(torch.optim.RMSprop([param], lr=0.1))
    reference_param = nn.Parameter(torch.ones(5))
    reference = torch.optim.RMSprop([reference_param], lr=0.1)
    for p, opt in ((param, optimizer), (reference_param, reference)):
        for step in range(2):
            p.grad = torch.arange(5.0) * (step + 1)
            opt.step()

    assert len(compile_report(optimizer).graphs) >= 1
    torch.testing.assert_close(param, reference_param)

    stepped = torch.optim.Adam([reference_param])  # has state after a step: not fusable
    stepped.step()
    assert not compile(stepped).param_groups[0]["fused"]
