"""What context parallel (``context_parallel.py``) refuses, and why, before anything is computed
wrong: in one process, the layers split over a fake process group (no data moves); on two real
ranks, the layers that mix tokens outside attention. That the split trains as one process does
is ``test_accelerate_pipeline.py``'s, on real ranks.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from accrewrite.base import torch_compat
from accrewrite.runtime import Config, accelerate
from accrewrite.runtime.parallel import apply
from accrewrite.runtime.parallel.apply import apply_sp, find_layers
from accrewrite.runtime.parallel.config import SequenceParallelConfig
from accrewrite.runtime.parallel.context_parallel import SequenceLayout
from accrewrite.runtime.parallel.parallel_dims import ParallelDims

import _parallel_models as models
from _ranks import run_ranks


@pytest.fixture
def sp_mesh():
    """``sp_mesh(size)``: a 1-D ``sp`` mesh of ``size`` ranks over a fake process group, as rank 0."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def make(size):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
        return init_device_mesh("cpu", (size,), mesh_dim_names=("sp",))

    yield make
    if dist.is_initialized():
        dist.destroy_process_group()


def _split(model, mesh):
    apply_sp(model, find_layers(model, None, "config.dist.fsdp.wrap_layer_cls"), mesh)
    return model


def _inputs(name, length=models.CONTEXT):
    tokens, targets = models.dataset(name)[:2]
    return tokens[:, :length], targets[:, :length]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"sp.mode": "rings"}, r"config.dist.sp.mode = 'rings': context parallel runs 'ulysses', 'ring', '2d'"),
        ({"sp.ulysses_size": 2}, r"config.dist.sp.ulysses_size = 2 with config.dist.sp.mode = 'ulysses': the size of "
                                 r"the Ulysses groups is given with mode \"2d\", and only there"),
        ({"sp.mode": "2d"}, r"ulysses_size = None with config.dist.sp.mode = '2d'"),
        ({"sp.mode": "2d", "sp.ulysses_size": 4, "sp.size": 6},
         r"ulysses_size = 4 does not split config.dist.sp.size = 6 ranks into Ulysses groups of 2 or more and a ring "
         r"of 2 or more; give one of \[2, 3\]"),
        ({"sp.mode": "2d", "sp.ulysses_size": 2}, r"give a size of 4 or more that is not prime, or mode \"ring\""),
        ({"pp.size": 2, "pp.num_micro_batches": 2}, r"does not combine with config.dist.pp.size > 1 yet"),
        ({"tp.size": 2}, r"does not combine with config.dist.tp.size > 1 yet"),
        ({"compute.compile": True}, r"does not combine with config.compute.compile yet"),
    ],
)
def test_settings_context_parallel_does_not_honour_are_refused_before_anything_runs(settings, message):
    config = Config()
    config.dist.sp.size = 2
    for path, value in settings.items():
        section, field = path.rsplit(".", 1)
        owner = getattr(config, section) if section in ("memory", "compute") else getattr(config.dist, section)
        setattr(owner, field, value)
    dims = ParallelDims.from_config(config, 12)
    with pytest.raises(ValueError, match=message):
        for part in apply.PARTS:
            part.check(config, dims)


def test_wrapped_layers_inside_one_another_are_refused():
    model = models.build("gpt")
    with pytest.raises(ValueError, match=r"cuts each wrapped layer's sequence once, but Attention is inside GPTBlock"):
        apply_sp(model, find_layers(model, {"GPTBlock", "Attention"}, "config.dist.fsdp.wrap_layer_cls"), None)


def test_a_layer_whose_first_argument_is_not_its_hidden_states_is_refused(sp_mesh):
    class KeywordBlock(models.GPTBlock):
        def forward(self, x=None):
            return super().forward(x)

    model = nn.Sequential(KeywordBlock(), KeywordBlock())
    _split(model, sp_mesh(2))
    with pytest.raises(ValueError, match=r"splits the hidden states a KeywordBlock gets as its first argument, but "
                                         r"it got none"):
        model[0](x=torch.randn(2, 4, models.WIDTH))


def test_a_sequence_the_ranks_do_not_divide_asks_for_padding(sp_mesh):
    model = _split(models.build("gpt"), sp_mesh(2))
    with pytest.raises(ValueError, match=r"sequence of length 7 does not split over config.dist.sp.size = 2 ranks; "
                                         r"pad it to a multiple of 2"):
        model(*_inputs("gpt", 7))


def test_a_sequence_a_ring_does_not_cut_into_two_chunks_per_rank_asks_for_padding(sp_mesh):
    model = models.build("gpt")
    apply_sp(model, list(model.h), sp_mesh(2), SequenceParallelConfig(size=2, mode="ring"))
    with pytest.raises(ValueError, match=r"sequence of length 6 does not split over config.dist.sp.size = 2 ranks "
                                         r"\(two chunks per ring rank\); pad it to a multiple of 4"):
        model(*_inputs("gpt", 6))


def test_a_ring_lays_the_sequence_out_head_tail_and_gathers_it_back_in_order(sp_mesh):
    mesh = sp_mesh(2)  # rank 0 of a ring of 2: chunks 0 and 3 of 4
    layout = SequenceLayout.build(mesh, "ring")
    assert layout.positions(8).tolist() == [0, 1, 6, 7]
    assert layout.order(8).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert layout.whole(torch.tensor([[0, 1, 6, 7, 2, 3, 4, 5]]), 1).tolist() == [list(range(8))]
    assert SequenceLayout.build(mesh, "ulysses").positions(8).tolist() == [0, 1, 2, 3]


def test_ring_attention_with_dropout_is_refused(sp_mesh):
    class DropoutBlock(models.ViTBlock):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(models.WIDTH, models.HEADS, dropout=0.1, batch_first=True)

    model = nn.Sequential(DropoutBlock(), DropoutBlock())
    apply_sp(model, list(model), sp_mesh(2), SequenceParallelConfig(size=2, mode="ring"))
    with pytest.raises(ValueError, match=r"ring attention \(config.dist.sp.mode = \"ring\" or \"2d\"\) runs SDPA "
                                         r"without dropout; give dropout_p=0.0, or config.dist.sp.mode = \"ulysses\""):
        model(torch.randn(2, 4, models.WIDTH))


def test_a_torch_without_the_ring_engine_is_told_to_use_ulysses(monkeypatch):
    monkeypatch.setattr(torch_compat, "_RING_MODULE", "torch.distributed.tensor.experimental._no_such_module")
    torch_compat.ring_attention.cache_clear()
    config = Config()
    config.dist.sp.size, config.dist.sp.mode = 2, "ring"
    try:
        with pytest.raises(RuntimeError, match=r"ring attention runs on torch's own ring .*which torch .* does not "
                                               r"have .*; use config.dist.sp.mode = \"ulysses\""):
            apply._check_context_parallel(config, ParallelDims.from_config(config, 2))
    finally:
        torch_compat.ring_attention.cache_clear()


def test_heads_the_ranks_do_not_divide_ask_for_another_size(sp_mesh):
    model = _split(models.build("gpt"), sp_mesh(8))  # 4 heads
    with pytest.raises(ValueError, match=r"attention's 4 heads do not split over config.dist.sp.size = 8 ranks"):
        model(*_inputs("gpt"))


def test_an_attention_mask_built_for_one_part_of_the_sequence_is_refused(sp_mesh):
    class MaskedAttention(models.Attention):
        def forward(self, x, rotation=None):
            q, k, v = (proj(x).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
                       for proj in (self.q_proj, self.k_proj, self.v_proj))
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
            return self.o_proj(F.scaled_dot_product_attention(q, k, v, mask).transpose(1, 2).flatten(2))

    model = models.build("gpt")
    for block in model.h:
        block.attn = MaskedAttention()
    _split(model, sp_mesh(2))
    with pytest.raises(ValueError, match=r"an attn_mask built for one part does not cover; use is_causal=True"):
        model(*_inputs("gpt"))


def test_multihead_attention_asked_for_its_weights_is_refused(sp_mesh):
    class WeightsBlock(models.ViTBlock):
        def forward(self, x):
            h = self.norm1(x)
            return x + self.attn(h, h, h)[0]  # need_weights=True, nn.MultiheadAttention's default

    model = nn.Sequential(WeightsBlock(), WeightsBlock())
    _split(model, sp_mesh(2))
    assert not any(isinstance(m, nn.MultiheadAttention) for m in model.modules())  # split into projections
    with pytest.raises(ValueError, match=r"cannot return nn.MultiheadAttention's attention weights.*need_weights="):
        model(torch.randn(2, 4, models.WIDTH))


class MatmulAttention(models.Attention):
    """Attention written out, as nanoGPT's slow path: the matmul sees one rank's part only."""

    def forward(self, x, rotation=None):
        q, k, v = (proj(x).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        scores = (q @ k.transpose(-2, -1)) * self.head_dim ** -0.5
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return self.o_proj((weights @ v).transpose(1, 2).flatten(2))


class PositionsInside(nn.Module):
    """Positions numbered from the layer's input length: 0 on every rank's part."""

    def __init__(self):
        super().__init__()
        self.block, self.positions = models.GPTBlock(), nn.Embedding(models.CONTEXT, models.WIDTH)

    def forward(self, x):
        return self.block(x + self.positions(torch.arange(x.shape[1])))


def _mixing_gpt(kind):
    model = models.build("gpt")
    for index, block in enumerate(model.h):
        if kind == "matmul":
            block.attn = MatmulAttention()
        else:
            model.h[index] = PositionsInside()
    return model


def _first_forward_error(rank, kinds):
    errors = []
    for kind in kinds:
        config = Config()
        config.dist.sp.size = 2
        model = accelerate(_mixing_gpt(kind), config=config)
        try:
            model(*_inputs("gpt"))
        except ValueError as error:
            errors.append(str(error))
    return errors


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_a_layer_that_mixes_tokens_outside_attention_is_refused_at_its_first_forward():
    for errors in run_ranks(_first_forward_error, 2, ["matmul", "positions"]):
        assert errors == [
            f"context parallel computes {layer} on parts of the sequence, and it gives another result than on the "
            f"whole: it mixes tokens outside F.scaled_dot_product_attention (an attention written with matmul and "
            f"softmax, positions from its input's length, a convolution over the sequence), or an input is not "
            f"cut along its sequence; write its attention with F.scaled_dot_product_attention and take positions "
            f"before the layers, or leave config.dist.sp.size at 1"
            for layer in ("GPTBlock", "PositionsInside")
        ]
