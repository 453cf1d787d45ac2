"""``accelerate`` on models that hold parameters of their own at the top (``_parallel_models.py``:
a GPT's positional embedding, a ViT's ``cls_token`` and ``pos_embed``), on real gloo processes:
tensor parallel, pipeline parallel and their combinations with FSDP train as one process does
on the same global batch: 10 SGD steps, losses and final parameters within 1e-5.
"""

import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from accrewrite.runtime import Config, accelerate

import _parallel_models as models
from _ranks import run_ranks
from _tp_layouts import split_packed_attention


def _data_parallel_mean(loss, mesh):
    """The loss averaged over the ranks that read different batches."""
    loss = loss.detach().clone()
    if mesh is not None:
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
    return loss.item()


def _pipeline_step(model, inputs):
    return model.forward_backward(*inputs)


def _accelerated_rank(rank, cases):
    results = []
    for name, sizes in cases:
        config = Config()
        for section, size in sizes.items():
            getattr(config.dist, section).size = size
        config.dist.pp.num_micro_batches = 2
        data_ranks = int(os.environ["WORLD_SIZE"]) // (sizes.get("tp", 1) * sizes.get("pp", 1))
        model, loader = accelerate(models.build(name), models.loader(name, models.GLOBAL_BATCH // data_ranks), config)
        losses = models.train(model, loader, _pipeline_step if "pp" in sizes else models.backward_step)
        losses = [_data_parallel_mean(loss, model.accelerate_mesh) for loss in losses]
        results.append((losses, get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))))
    return results


def _assert_matches(rank_results, name):
    """Every rank's losses are one process's; the stages' parameters together are its own."""
    want_losses, want_state = models.reference(name)
    # tensor parallel splits nn.MultiheadAttention's packed q/k/v into projections
    want_state = split_packed_attention(want_state)
    state = {}
    for losses, stage_state in rank_results:
        assert losses == pytest.approx(want_losses, abs=1e-5)
        state.update(split_packed_attention(stage_state))
    assert state.keys() == want_state.keys()
    for key, value in want_state.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=1e-5, msg=key)


def _run(cases, ranks):
    per_rank = run_ranks(_accelerated_rank, ranks, cases)
    for index, (name, _) in enumerate(cases):
        _assert_matches([results[index] for results in per_rank], name)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_tensor_parallel_splits_models_with_parameters_of_their_own():
    _run([("gpt", {"tp": 2}), ("vit", {"tp": 2})], 2)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_pipeline_parallel_over_two_ranks_matches_one_process():
    _run([("gpt", {"pp": 2}), ("llama", {"pp": 2}), ("vit", {"pp": 2})], 2)
