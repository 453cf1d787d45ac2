"""Tensor-parallel plans derived from what a block computes (``parallel/tp_plan.py``), the
``nn.MultiheadAttention`` conversion (``parallel/mha.py``), and the layouts of ``_tp_layouts``
trained split over real gloo ranks as one process trains them: tensor parallel over 2 ranks, and
FSDP over 2 x tensor parallel over 2 on 4, 10 steps each, losses and final parameters within
1e-5 (float32)."""

import copy
import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import _tp_layouts as layouts
from _ranks import run_ranks
from accrewrite.runtime import Config, accelerate
from accrewrite.runtime.parallel.mha import SplitQKVMultiheadAttention
from accrewrite.runtime.parallel.tensor_parallel import parallelize_block
from accrewrite.runtime.parallel.tp_plan import IN_OUT, OUT_IN, derive_plan, projection_layout
from test_accelerate import GLOBAL_BATCH, full_state, token_dataset, train

STEPS = 10
ATTENTION = {"attn": "heads"}
PLANS = {
    "mha_batch_first": {**ATTENTION, "mlp.0": "colwise", "mlp.2": "rowwise"},
    "mha_seq_first_weights": {**ATTENTION, "mlp.0": "colwise", "mlp.3": "rowwise"},
    "conv1d_fused": {"": "heads", "mix": "colwise_fused", "back": "rowwise", "widen": "colwise", "narrow": "rowwise"},
    "llama_gqa": {"": "heads", "wq": "colwise", "wk": "colwise", "wv": "colwise", "wo": "rowwise",
                  "gate": "colwise", "up": "colwise", "down": "rowwise"},
    "bert": {"attention.self": "heads", "attention.self.query": "colwise", "attention.self.key": "colwise",
             "attention.self.value": "colwise", "attention.output.dense": "rowwise",
             "intermediate.dense": "colwise", "output.dense": "rowwise"},
}
ENCODER = {"self_attn": "heads", "linear1": "colwise", "linear2": "rowwise"}
DECODER = {**ENCODER, "multihead_attn": "heads"}


def _first_blocks(model):
    from accrewrite.runtime.blocks import repeated_blocks

    return [container[0] for _, container in repeated_blocks(model)]


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_plans_follow_the_data_not_the_names(layout):
    blocks = _first_blocks(layouts.build(layout))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every projection of these layouts is split
        plans = [derive_plan(block) for block in blocks]
    assert plans == ([ENCODER, DECODER] if layout.startswith("encoder") else [PLANS[layout]])


class _LinearByHand(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.zeros(3, 4)), nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


@pytest.mark.parametrize("module, layout", [
    (nn.Linear(4, 3), OUT_IN), (layouts.Conv1D(3, 4), IN_OUT), (_LinearByHand(), OUT_IN),
    (nn.Embedding(4, 3), None), (nn.LayerNorm(4), None), (nn.Conv2d(2, 2, 1), None),
])
def test_projections_are_told_apart_by_what_they_compute(module, layout):
    assert projection_layout(module) == layout


# -- nn.MultiheadAttention as separate projections ----------------------------------------------


def _attention_inputs(batch_first, kdim, generator):
    def tensor(length, width):
        shape = (3, length, width) if batch_first else (length, 3, width)
        return torch.randn(shape, generator=generator, requires_grad=True)

    return tensor(5, 16), tensor(7, kdim or 16), tensor(7, kdim or 16)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kdim", [None, 12])
@pytest.mark.parametrize("call", [
    {}, {"need_weights": False}, {"average_attn_weights": False, "attn_mask": "per_head"},
    {"attn_mask": "bool", "key_padding_mask": "bool"}, {"attn_mask": "float", "need_weights": False},
    {"attn_mask": "bool", "need_weights": False, "is_causal": True},
])
def test_multihead_attention_converts_with_the_same_outputs_and_gradients(batch_first, kdim, call):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, kdim=kdim, vdim=kdim, batch_first=batch_first)
    converted = SplitQKVMultiheadAttention.from_module(mha)
    torch.testing.assert_close(converted.q_proj.weight, mha.in_proj_weight[:16] if kdim is None else mha.q_proj_weight,
                               rtol=0, atol=0)
    generator = torch.Generator().manual_seed(1)
    masks = {"bool": torch.ones(5, 7, dtype=torch.bool).triu(1), "float": torch.randn(5, 7, generator=generator),
             "per_head": torch.randn(3 * 4, 5, 7, generator=generator)}
    kwargs = {k: masks[v] if k == "attn_mask" else v for k, v in call.items()}
    if kwargs.get("key_padding_mask") == "bool":
        kwargs["key_padding_mask"] = torch.tensor([[False] * 7, [False] * 5 + [True] * 2, [False] * 6 + [True]])
    results = []
    for module in (mha, converted):
        inputs = _attention_inputs(batch_first, kdim, torch.Generator().manual_seed(2))
        out, weights = module(*inputs, **kwargs)
        (out.square().sum() + (0 if weights is None else weights.sum())).backward()
        results.append((out, weights, [i.grad for i in inputs]))
    (want, want_weights, want_grads), (got, got_weights, got_grads) = results
    torch.testing.assert_close(got, want)
    assert (got_weights is None) == (want_weights is None) == (call.get("need_weights") is False)
    if want_weights is not None:
        torch.testing.assert_close(got_weights, want_weights)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(converted.out_proj.weight.grad, mha.out_proj.weight.grad)
    packed = mha.in_proj_weight.grad if kdim is None else mha.q_proj_weight.grad
    torch.testing.assert_close(converted.q_proj.weight.grad, packed[:16])


def test_unbatched_attention_and_the_encoder_layers_inference_path_keep_their_results():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4)
    x = torch.randn(5, 16)
    torch.testing.assert_close(SplitQKVMultiheadAttention.from_module(mha)(x, x, x), mha(x, x, x))
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    converted = copy.deepcopy(layer)
    converted.self_attn = SplitQKVMultiheadAttention.from_module(layer.self_attn)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():  # the fast path is chosen for the original, the plain path for ours
        torch.testing.assert_close(converted(x), layer(x))


def test_attention_with_learned_extra_keys_is_refused():
    with pytest.raises(ValueError, match="add_bias_kv or add_zero_attn.*config.dist.tp.plan without it"):
        SplitQKVMultiheadAttention.from_module(nn.MultiheadAttention(16, 4, add_bias_kv=True))


# -- what cannot be split --------------------------------------------------------------------------


class _NormedMLP(nn.Module):
    """An MLP normalized between its projections (NormFormer), optionally after an attention."""

    def __init__(self, attention=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True) if attention else None
        self.fc1, self.norm, self.fc2 = nn.Linear(16, 64), nn.LayerNorm(64), nn.Linear(64, 16)

    def forward(self, x):
        if self.attn is not None:
            x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.fc2(self.norm(F.gelu(self.fc1(x))))


class _ScaledMLP(nn.Module):
    """A learned per-feature scale of the intermediate features: not split with them."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.scale = nn.Linear(16, 64), nn.Linear(64, 16), nn.Parameter(torch.ones(64))

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)) * self.scale)


class _ReturnsHidden(nn.Module):
    """An MLP that also returns its intermediate features."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        hidden = self.fc1(x)
        return self.fc2(F.gelu(hidden)), hidden


class _FusedGateUp(nn.Module):
    """Gate and up in one projection, chunked in two (Phi-3's MLP)."""

    def __init__(self):
        super().__init__()
        self.gate_up, self.down = nn.Linear(16, 128), nn.Linear(64, 16)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class _ViewedQKV(nn.Module):
    """q, k and v viewed out of one projection: whether it is laid out (3, heads, dim) or
    (heads, 3 * dim) is in the sizes, not the graph."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 4, 4).permute(2, 0, 3, 1, 4).unbind(0)
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, 16))


@pytest.mark.parametrize("block, message", [
    (_NormedMLP(), r"cannot derive a tensor-parallel plan for _NormedMLP: fc1 reaches fc2, but norm \(LayerNorm\) "
                   r"mixes the features a split divides\. Shard it with config.dist.fsdp.size instead of splitting "
                   r"it, or give in config.dist.tp.plan a split you know is sound"),
    (_ScaledMLP(), r"for _ScaledMLP: fc1 reaches fc2, but mul combines them with a tensor that is not split with them"),
    (_ReturnsHidden(), r"for _ReturnsHidden: fc1 reaches fc2, but the block's output gets them, where they would be "
                       r"one rank's slice"),
    (_FusedGateUp(), r"for _FusedGateUp: gate_up's output is split in 2 parts, which only a fused q/k/v projection "
                     r"in three can be"),
    (_ViewedQKV(), r"for _ViewedQKV: q, k and v all come from qkv, but not by a split or chunk of its output"),
    (nn.Sequential(nn.Embedding(8, 16), nn.LayerNorm(16)), r"for Sequential: it has no projections"),
])
def test_a_block_with_no_safe_split_names_the_op_and_the_fix(block, message):
    with pytest.raises(ValueError, match=message):
        derive_plan(block)


def test_the_safe_part_of_a_block_is_split_and_the_rest_named():
    with pytest.warns(UserWarning, match=r"leaves part of _NormedMLP whole on every tp rank: fc1 reaches fc2, but "
                                         r"norm \(LayerNorm\) mixes"):
        assert derive_plan(_NormedMLP(attention=True)) == ATTENTION


class _NanoGPTAttention(nn.Module):
    """nanoGPT's: its views take the width from the input (``B, T, C = x.size()``), the whole
    width on every rank, where a split attention holds a slice."""

    def __init__(self):
        super().__init__()
        self.n_head, self.n_embd = 4, 16
        self.c_attn, self.c_proj = nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class _NanoGPTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(16), _NanoGPTAttention(), nn.LayerNorm(16)
        self.mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def test_attention_sized_from_its_unsplit_input_stays_whole_and_says_so():
    with pytest.warns(UserWarning, match=r"attn.c_attn reaches attn.c_proj, but .view\(\) sizes them from ln_1 "
                                         r"\(LayerNorm\)'s last dimension, which the split does not divide"):
        assert derive_plan(_NanoGPTBlock()) == {"mlp.0": "colwise", "mlp.2": "rowwise"}


# -- real ranks ------------------------------------------------------------------------------------


class _OddHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(12, 3)

    def forward(self, x):
        return x + self.attn(x, x, x)[0]


def _attention_weights_differences(mesh) -> list[float]:
    """How far a head-split attention's returned weights and outputs are from the unsplit one's."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(layouts.WIDTH, layouts.HEADS)
    holder = nn.ModuleDict({"attn": copy.deepcopy(mha)})
    parallelize_block(holder, ATTENTION, mesh)
    x = torch.randn(layouts.CONTEXT, 3, layouts.WIDTH, generator=torch.Generator().manual_seed(1))
    differences = []
    for average in (True, False):
        (want, want_weights), (got, got_weights) = (module(x, x, x, average_attn_weights=average)
                                                    for module in (mha, holder["attn"]))
        differences += [(got - want).abs().max().item(), (got_weights - want_weights).abs().max().item()]
    return differences


def _layouts_rank(rank, names, fsdp, tp):
    results = {}
    for layout in names:
        config = Config()
        config.dist.fsdp.size, config.dist.tp.size = fsdp, tp
        data_ranks = int(os.environ["WORLD_SIZE"]) // tp
        loader = DataLoader(token_dataset(batches=STEPS), batch_size=GLOBAL_BATCH // data_ranks)
        model, loader = accelerate(layouts.build(layout), loader, config)
        results[layout] = (train(model, loader, steps=STEPS), full_state(model))
    if fsdp == 1:
        results["attention weights"] = _attention_weights_differences(model.accelerate_mesh["tp"])
        config = Config()
        config.dist.tp.size = tp
        try:
            accelerate(nn.Sequential(_OddHeads(), _OddHeads()), config=config)
        except ValueError as error:
            results["odd heads"] = str(error)
    return results


def _assert_matches_one_process(results):
    for layout in layouts.LAYOUTS:
        losses, state = results[layout]
        model = layouts.build(layout)
        want_losses = train(model, DataLoader(token_dataset(batches=STEPS), batch_size=GLOBAL_BATCH), steps=STEPS)
        want_state = layouts.split_packed_attention(model.state_dict())
        assert losses == pytest.approx(want_losses, abs=1e-5), layout
        assert state.keys() == want_state.keys(), layout
        for key, value in want_state.items():
            torch.testing.assert_close(state[key], value, rtol=0, atol=1e-5, msg=f"{layout}: {key}")


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_every_layout_split_over_two_ranks_trains_as_one_process():
    results = run_ranks(_layouts_rank, 2, list(layouts.LAYOUTS), 1, 2)[0]
    _assert_matches_one_process(results)
    assert max(results["attention weights"]) < 1e-6
    assert results["odd heads"] == (
        "cannot split _OddHeads.attn (MultiheadAttention) by head: its num_heads = 3 is not divisible by "
        "config.dist.tp.size = 2; choose a tp size that divides 3, or give config.dist.tp.plan without "
        "_OddHeads.attn's projections")


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_every_layout_sharded_over_two_and_split_over_two_trains_as_one_process():
    _assert_matches_one_process(run_ranks(_layouts_rank, 4, list(layouts.LAYOUTS), 2, 2)[0])
