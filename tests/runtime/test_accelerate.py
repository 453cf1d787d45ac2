"""``accelerate``/``Config`` (TorchAcc 2.x's accelerate API): FSDP2, tensor parallel and both
at once train, in real gloo processes, as one process does on the same global batch.

Each case trains a tiny GPT for 20 SGD steps with momentum (gradient clipping included) with the
dataloader split by ``accelerate``; the per-step losses must be within 1e-5 of one process
reading the whole global batch, and the final parameters (gathered full) as close.
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader, TensorDataset

from accrewrite.runtime import Config, accelerate, parallel_config
from accrewrite.runtime.parallel.parallel_dims import ParallelDims
from accrewrite.runtime.parallel.tensor_parallel import derive_plan, parallelize_block

from _ranks import run_ranks
from _tp_layouts import Conv1D

VOCAB, WIDTH, HEADS, CONTEXT, BLOCKS = 32, 16, 4, 8, 2
STEPS, GLOBAL_BATCH = 20, 8


class Attention(nn.Module):
    """q/k/v/o as separate projections (Llama, BERT-like layouts)."""

    def __init__(self):
        super().__init__()
        self.num_heads, self.head_dim = HEADS, WIDTH // HEADS
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x):
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k, v = (proj(x).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(*x.shape[:-1], -1))


class GPT2Attention(nn.Module):
    """GPT-2's: one fused q/k/v ``Conv1D`` (``c_attn``), split by ``split_size``."""

    def __init__(self):
        super().__init__()
        self.num_heads, self.split_size = HEADS, WIDTH
        self.c_attn, self.c_proj = Conv1D(3 * WIDTH, WIDTH), Conv1D(WIDTH, WIDTH)

    def forward(self, x):
        q, k, v = self.c_attn(x).split(self.split_size, dim=2)
        B, T, C = q.shape
        q, k, v = (t.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up_proj, self.down_proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return self.down_proj(F.gelu(self.up_proj(x)))


class GPT2MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(4 * WIDTH, WIDTH), Conv1D(WIDTH, 4 * WIDTH)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(WIDTH, 3 * WIDTH, bias=False), nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.down_proj = nn.Linear(3 * WIDTH, WIDTH, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


LAYOUTS = {"separate": (Attention, MLP), "gpt2": (GPT2Attention, GPT2MLP), "llama": (Attention, LlamaMLP)}


class Block(nn.Module):
    def __init__(self, layout):
        super().__init__()
        attention, mlp = LAYOUTS[layout]
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(WIDTH), attention(), nn.LayerNorm(WIDTH), mlp()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, layout="separate", blocks=BLOCKS):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.h = nn.ModuleList(Block(layout) for _ in range(blocks))
        self.ln_f, self.lm_head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def tiny_gpt(layout="separate", blocks=BLOCKS):
    torch.manual_seed(0)
    return TinyGPT(layout, blocks)


def token_dataset(batches=STEPS, batch=GLOBAL_BATCH):
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(VOCAB, (batches * batch, CONTEXT + 1), generator=generator)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def train(model, loader, steps=STEPS):
    """Per-step losses (averaged over the ranks) of SGD with momentum and gradient clipping."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ranks = dist.get_world_size() if dist.is_initialized() else 1
    losses = []
    for _, (tokens, targets) in zip(range(steps), loader):
        optimizer.zero_grad()
        loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss = loss.detach().clone()
        if ranks > 1:  # tensor-parallel ranks hold equal losses: the mean over all is the dp mean
            dist.all_reduce(loss)
        losses.append(loss.item() / ranks)
    return losses


def full_state(model):
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def _accelerated_rank(rank, cases):
    results = []
    for layout, fsdp, tp, *plan in cases:
        config = Config()
        config.dist.fsdp.size, config.dist.tp.size = fsdp, tp
        config.dist.tp.plan = plan[0] if plan else None
        data_ranks = int(os.environ["WORLD_SIZE"]) // tp
        loader = DataLoader(token_dataset(), batch_size=GLOBAL_BATCH // data_ranks)
        model, loader = accelerate(tiny_gpt(layout), loader, config)
        losses = train(model, loader)
        results.append((losses, full_state(model)))
    return results


def _reference(layout):
    model = tiny_gpt(layout)
    losses = train(model, DataLoader(token_dataset(), batch_size=GLOBAL_BATCH))
    return losses, model.state_dict()


def _assert_matches(result, layout):
    losses, state = result
    want_losses, want_state = _reference(layout)
    assert losses == pytest.approx(want_losses, abs=1e-5)
    assert state.keys() == want_state.keys()
    for key, value in want_state.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=1e-5, msg=key)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_two_ranks_fsdp_and_tensor_parallel_match_one_process():
    by_hand = {"mlp.up_proj": "colwise", "mlp.down_proj": "rowwise"}  # the MLPs only
    cases = [("separate", 2, 1), ("separate", 1, 2), ("gpt2", 1, 2), ("llama", 1, 2), ("separate", 1, 2, by_hand)]
    results = run_ranks(_accelerated_rank, 2, cases)[0]
    for (layout, *_), result in zip(cases, results):
        _assert_matches(result, layout)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_four_ranks_fsdp_and_fsdp_by_tensor_parallel_match_one_process():
    cases = [("separate", 4, 1), ("separate", 2, 2), ("gpt2", 2, 2), ("llama", 1, 2)]  # last: dp 2 x tp 2
    results = run_ranks(_accelerated_rank, 4, cases)[0]
    for (layout, *_), result in zip(cases, results):
        _assert_matches(result, layout)


def _rank_dependent_weights_rank(rank):
    torch.manual_seed(rank)  # as scripts with a per-rank random state build their models
    config = Config()
    config.dist.fsdp.size = 2
    return full_state(accelerate(TinyGPT(), config=config))


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_every_rank_starts_from_rank_zeros_weights_as_with_ddp():
    state = run_ranks(_rank_dependent_weights_rank, 2)[0]
    torch.manual_seed(0)
    for key, value in TinyGPT().state_dict().items():
        assert torch.equal(state[key], value), key


def _different_inputs_rank(rank):
    config = Config()
    config.dist.tp.size = 2
    model = accelerate(tiny_gpt(), config=config)
    tokens, targets = token_dataset()[rank * GLOBAL_BATCH:(rank + 1) * GLOBAL_BATCH]
    try:
        model(tokens, targets)
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_tensor_parallel_ranks_fed_different_batches_are_told_so():
    for message in run_ranks(_different_inputs_rank, 2):
        assert message is not None and "tensor-parallel ranks got different inputs" in message


def _bf16_rank(rank):
    config = Config()
    config.dist.fsdp.size = 2
    config.compute.bf16 = True
    loader = DataLoader(token_dataset(batches=5), batch_size=GLOBAL_BATCH // 2)
    model, loader = accelerate(tiny_gpt(), loader, config)
    computed = []
    model.h[0].attn.q_proj.register_forward_hook(lambda module, args, out: computed.append(out.dtype))
    losses = train(model, loader, steps=5)
    return losses, computed[0], {p.dtype for p in model.parameters()}


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_bf16_computes_in_bf16_keeps_float32_parameters_and_follows_the_float32_losses():
    losses, computed, kept = run_ranks(_bf16_rank, 2)[0]
    assert computed == torch.bfloat16 and kept == {torch.float32}
    want = train(tiny_gpt(), DataLoader(token_dataset(batches=5), batch_size=GLOBAL_BATCH), steps=5)
    assert losses == pytest.approx(want, abs=3e-2)  # bf16 rounding, not a different computation


# -- one process: plans, layouts and what a wrong config says -------------------------------------


@pytest.mark.parametrize(
    "layout, plan",
    [
        ("separate", {"attn.q_proj": "colwise", "attn.k_proj": "colwise", "attn.v_proj": "colwise",
                      "attn.o_proj": "rowwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise",
                      "attn": "heads"}),
        ("gpt2", {"attn.c_attn": "colwise_fused", "attn.c_proj": "rowwise", "mlp.c_fc": "colwise",
                  "mlp.c_proj": "rowwise", "attn": "heads"}),
        ("llama", {"attn.q_proj": "colwise", "attn.k_proj": "colwise", "attn.v_proj": "colwise",
                   "attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                   "mlp.down_proj": "rowwise", "attn": "heads"}),
    ],
)
def test_plans_are_derived_from_the_block_layout(layout, plan):
    assert derive_plan(Block(layout)) == plan


class _Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.a(x)) if x.sum() > 0 else x  # a branch on the values: fx cannot trace it


def test_a_block_fx_cannot_trace_and_of_unknown_names_asks_for_a_plan():
    with pytest.raises(ValueError, match=r"torch.fx cannot trace it \(TraceError.*give one in config.dist.tp.plan"):
        derive_plan(_Branching())


def test_a_plan_that_names_modules_the_block_lacks_lists_what_it_has():
    with pytest.raises(ValueError, match=r"names \['attn.query'\], which Block lacks; its projections are "
                                         r"\['attn.q_proj'"):
        parallelize_block(Block("separate"), {"attn.query": "colwise"}, mesh=None)


def _config(**sizes):
    config = Config()
    for name, size in sizes.items():
        getattr(config.dist, name).size = size
    return config


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"fsdp": 3}, r"pp.size \* sp.size \* tp.size = 3 \* 1 \* 1 \* 1 does not divide the world size 4"),
        ({"dp": 2, "fsdp": 4}, r"= 8, but the world size is 4"),
        ({"tp": 0}, "config.dist.tp.size must be a positive int"),
        ({"sp": 0}, "config.dist.sp.size must be a positive int"),
        ({"fsdp": 2, "sp": 4}, r"sp.size \* tp.size = 2 \* 1 \* 4 \* 1 does not divide the world size 4"),
    ],
)
def test_sizes_that_do_not_fit_the_world_say_what_to_change(sizes, message):
    with pytest.raises(ValueError, match=message):
        ParallelDims.from_config(_config(**sizes), 4)


def test_sizes_default_data_parallel_to_what_is_left():
    assert ParallelDims.from_config(_config(tp=2), 8).shape == (4, 1, 1, 1, 2)
    dims = ParallelDims.from_config(_config(fsdp=2, tp=2, dp=2), 8)
    assert dims.shape == (2, 2, 1, 1, 2) and dims.data_parallel_size == 4
    assert dims.fsdp_enabled and dims.tp_enabled
    alone = ParallelDims.from_config(_config(), 1)
    assert not alone.fsdp_enabled and not alone.tp_enabled and alone.build_mesh("cpu") is None


def test_a_layer_class_that_matches_nothing_names_the_classes_there():
    config = Config()
    config.dist.fsdp.wrap_layer_cls = {"LlamaDecoderLayer"}
    with pytest.raises(ValueError, match=r"wrap_layer_cls = \['LlamaDecoderLayer'\] matches no module.*'Block'"):
        accelerate(tiny_gpt(), config=config)


def test_a_model_without_repeated_blocks_asks_for_its_layer_classes():
    config = Config()
    config.memory.gc = True
    with pytest.raises(ValueError, match=r"for activation checkpointing \(config.memory.gc\); name its layer "
                                         r"classes in config.dist.fsdp.wrap_layer_cls"):
        accelerate(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), config=config)


def test_both_half_precisions_is_an_error():
    config = Config()
    config.compute.bf16 = config.compute.fp16 = True
    with pytest.raises(ValueError, match="choose one"):
        accelerate(tiny_gpt(), config=config)
    config.compute.fp16 = False
    with pytest.raises(ValueError, match="in one process leave them off and use accrewrite.runtime.amp.autocast"):
        accelerate(tiny_gpt(), config=config)


@pytest.mark.parametrize(
    "kind, environment, sizes",
    [("fsdp", {"WORLD_SIZE": "4"}, (1, 4, 1, 1, 1)), ("tp", {"WORLD_SIZE": "4"}, (1, 1, 1, 1, 4)),
     ("fsdp,tp", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, (1, 2, 1, 1, 4)),
     # with stages, the topology is pp, dp, fsdp, (sp,) tp: a stage per machine, two on one machine
     ("pp", {"WORLD_SIZE": "4"}, (4, 1, 1, 1, 1)), ("fsdp,pp", {"WORLD_SIZE": "4"}, (2, 1, 2, 1, 1)),
     ("tp,pp", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, (2, 1, 1, 1, 4)),
     ("fsdp,tp,pp", {"WORLD_SIZE": "8"}, (2, 1, 1, 1, 4)),
     ("fsdp,tp,pp", {"WORLD_SIZE": "32", "LOCAL_WORLD_SIZE": "8"}, (4, 1, 1, 1, 8)),
     ("fsdp,tp,pp", {"WORLD_SIZE": "1"}, (1, 1, 1, 1, 1)),
     # context parallel: dp, fsdp, sp, pp, tp; a group per machine, two ranks on one machine
     ("cp", {"WORLD_SIZE": "4"}, (1, 1, 4, 1, 1)), ("fsdp,cp", {"WORLD_SIZE": "4"}, (1, 2, 2, 1, 1)),
     ("fsdp,cp", {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, (1, 2, 8, 1, 1)),
     ("fsdp,cp", {"WORLD_SIZE": "1"}, (1, 1, 1, 1, 1))],
)
def test_the_configs_that_migrate_parallel_writes(kind, environment, sizes, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    config = parallel_config(kind)
    assert ParallelDims.from_config(config, int(environment["WORLD_SIZE"])).shape == sizes
    assert config.dist.pp.num_micro_batches == config.dist.pp.size  # the fewest that 1F1B takes
    with pytest.raises(ValueError, match="expected one of fsdp, tp, fsdp,tp, pp"):
        parallel_config("zero3")


def test_the_config_reads_the_kinds_without_the_codemod():
    code = ("import sys, accrewrite.runtime.parallel.config\n"
            "print(sorted(name for name in sys.modules if name.startswith('accrewrite.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {name.strip("[]',") for name in done.stdout.split()}
    assert {name for name in loaded if not name.startswith("accrewrite.runtime")} == {
        "accrewrite.base", "accrewrite.base.lazy", "accrewrite.base.parallel_kinds",
    }
