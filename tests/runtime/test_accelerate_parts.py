"""The parts of ``accelerate`` (``runtime/parallel/apply.py``): each ``apply_*`` used on its own
on a real gloo mesh trains as one process does, and a new part (one function, one config field,
one entry in ``PARTS``) is applied by ``accelerate`` in its place in the order, with its config
section and the ``ParallelDims``, without a change to ``accelerate``."""

from dataclasses import dataclass, field

import pytest
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

from accrewrite.runtime import Config, accelerate
from accrewrite.runtime.parallel import apply
from accrewrite.runtime.parallel.apply import Part, apply_ac, apply_fsdp, apply_tp
from accrewrite.runtime.parallel.config import ComputeConfig, FSDPConfig, MemoryConfig, TensorParallelConfig

from _ranks import run_ranks
from test_accelerate import GLOBAL_BATCH, _assert_matches, full_state, tiny_gpt, token_dataset, train


def _halves(loader, rank):
    """Rank ``rank``'s half of each global batch."""
    half = GLOBAL_BATCH // 2
    for tokens, targets in loader:
        yield tokens[rank * half:(rank + 1) * half], targets[rank * half:(rank + 1) * half]


def _each_part_alone_rank(rank):
    dist.init_process_group("gloo")
    split = tiny_gpt()
    apply_tp(split, list(split.h), TensorParallelConfig(), init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
    split_losses = train(split, DataLoader(token_dataset(), batch_size=GLOBAL_BATCH))  # both ranks: every row
    sharded = tiny_gpt()
    apply_ac(sharded, list(sharded.h), MemoryConfig(gc=True))
    apply_fsdp(sharded, list(sharded.h), FSDPConfig(), ComputeConfig(),
               init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "fsdp")))
    sharded_losses = train(sharded, _halves(DataLoader(token_dataset(), batch_size=GLOBAL_BATCH), rank))
    return (split_losses, full_state(split)), (sharded_losses, full_state(sharded))


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_tensor_parallel_and_fsdp_with_checkpointing_each_on_their_own_mesh_match_one_process():
    split, sharded = run_ranks(_each_part_alone_rank, 2)[0]
    _assert_matches(split, "separate")
    _assert_matches(sharded, "separate")


def test_checkpointing_alone_wraps_the_layers_it_is_given():
    model = tiny_gpt()
    apply_ac(model, [model.h[1]], MemoryConfig(gc=True))
    assert [type(block.forward).__name__ for block in model.h] == ["method", "_Checkpointed"]
    apply_ac(model, list(model.h), MemoryConfig(gc=True, gc_cls={"LayerNorm"}))
    assert all(type(norm.forward).__name__ == "_Checkpointed" for norm in (model.ln_f, model.h[0].ln_1))


# -- a new part: scaling each layer's output, standing for a new parallelism ----------------------


@dataclass
class OutputScaleConfig:
    scale: float = 1.0


@dataclass
class ConfigWithOutputScale(Config):
    output_scale: OutputScaleConfig = field(default_factory=OutputScaleConfig)


def apply_output_scale(layers: list[nn.Module], section: OutputScaleConfig) -> None:
    for layer in layers:
        layer.register_forward_hook(lambda module, args, output: output * section.scale)


SEEN = []  # per accelerate call: what the new part was given


def _apply_output_scale_part(model, layers, config, dims):
    first = next(layers[0].parameters())
    SEEN.append((isinstance(first, DTensor), isinstance(model, FSDPModule), dims.shape, dims.mesh.mesh_dim_names))
    apply_output_scale(layers, config.output_scale)


OUTPUT_SCALE = Part("output scaling (config.output_scale.scale != 1)",
                    wanted=lambda config, dims: config.output_scale.scale != 1,
                    apply=_apply_output_scale_part)


def _new_part_rank(rank, cases):
    apply.PARTS.insert([part.name for part in apply.PARTS].index("FSDP2"), OUTPUT_SCALE)
    results = []
    for fsdp, tp in cases:
        config = ConfigWithOutputScale()
        config.dist.fsdp.size, config.dist.tp.size = fsdp, tp
        config.output_scale.scale = 0.5
        loader = DataLoader(token_dataset(), batch_size=GLOBAL_BATCH // fsdp)
        model, loader = accelerate(tiny_gpt(), loader, config)
        losses = train(model, loader)
        results.append((SEEN.pop(), isinstance(model, FSDPModule), (losses, full_state(model))))
    return results


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_a_new_part_in_parts_is_applied_in_its_place_with_its_config_and_the_dims():
    results = run_ranks(_new_part_rank, 2, [(2, 1), (1, 2)])[0]
    scaled = tiny_gpt()
    apply_output_scale(list(scaled.h), OutputScaleConfig(scale=0.5))
    want_losses = train(scaled, DataLoader(token_dataset(), batch_size=GLOBAL_BATCH))
    names = ("dp", "fsdp", "sp", "pp", "tp")
    # after tensor parallel (its DTensors), before FSDP2 (not yet an FSDPModule)
    assert [(seen, wrapped) for seen, wrapped, _ in results] == [
        ((False, False, (1, 2, 1, 1, 1), names), True), ((True, False, (1, 1, 1, 1, 2), names), False)]
    for _, _, (losses, state) in results:
        assert losses == pytest.approx(want_losses, abs=1e-5)
        for key, value in scaled.state_dict().items():
            assert (state[key] - value).abs().max() < 1e-5, key
    assert want_losses != pytest.approx(train(tiny_gpt(), DataLoader(token_dataset(), batch_size=GLOBAL_BATCH)),
                                        abs=1e-3)  # the part did change the computation


def test_a_model_without_layers_names_the_parts_that_need_them():
    config = ConfigWithOutputScale()
    config.output_scale.scale = 2.0
    config.memory.gc = True
    apply.PARTS.append(OUTPUT_SCALE)
    try:
        with pytest.raises(ValueError, match=r"for activation checkpointing \(config.memory.gc\), output scaling "
                                             r"\(config.output_scale.scale != 1\); name its layer classes"):
            accelerate(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), config=config)
    finally:
        apply.PARTS.remove(OUTPUT_SCALE)
