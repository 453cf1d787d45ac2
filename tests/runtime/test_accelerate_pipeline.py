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


def _accelerated_rank(rank, cases):
    results = []
    for name, sizes in cases:
        config = Config()
        for section, size in sizes.items():
            getattr(config.dist, section).size = size
        data_ranks = int(os.environ["WORLD_SIZE"]) // (sizes.get("tp", 1) * sizes.get("pp", 1))
        model, loader = accelerate(models.build(name), models.loader(name, models.GLOBAL_BATCH // data_ranks), config)
        losses = models.train(model, loader, models.backward_step)
        losses = [_data_parallel_mean(loss, model.accelerate_mesh) for loss in losses]
        results.append((losses, get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))))
    return results


def _assert_matches(result, name):
    losses, state = result
    want_losses, want_state = models.reference(name)
    # tensor parallel splits nn.MultiheadAttention's packed q/k/v into projections
    state, want_state = split_packed_attention(state), split_packed_attention(want_state)
    assert losses == pytest.approx(want_losses, abs=1e-5)
    assert state.keys() == want_state.keys()
    for key, value in want_state.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=1e-5, msg=key)


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_tensor_parallel_splits_models_with_parameters_of_their_own():
    cases = [("gpt", {"tp": 2}), ("vit", {"tp": 2})]
    results = run_ranks(_accelerated_rank, 2, cases)[0]
    for (name, _), result in zip(cases, results):
        _assert_matches(result, name)
