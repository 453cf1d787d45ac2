"""``config.memory`` in ``accelerate``: ``gc_cnt`` checkpoints only the first N wrapped blocks and
``cpu_offload`` keeps FSDP2's shards and optimizer step on the host; on real gloo ranks both
train as one process does (losses and final parameters within 1e-5)."""

import pytest
from torch.distributed.fsdp import CPUOffloadPolicy
from torch.utils.data import DataLoader

from accrewrite.runtime import Config, accelerate
from accrewrite.runtime.activation_checkpoint import _Checkpointed

from _ranks import run_ranks
from test_accelerate import GLOBAL_BATCH, _assert_matches, full_state, tiny_gpt, token_dataset, train


def checkpointed(model) -> list[bool]:
    return [isinstance(block.__dict__.get("forward"), _Checkpointed) for block in model.h]


def memory_config(gc_cnt=None, cpu_offload=False, fsdp=1) -> Config:
    config = Config()
    config.memory.gc = gc_cnt is not None
    config.memory.gc_cnt = gc_cnt
    config.memory.cpu_offload = cpu_offload
    config.dist.fsdp.size = fsdp
    return config


@pytest.mark.parametrize("gc_cnt, blocks", [(0, [False] * 3), (2, [True, True, False]), (5, [True] * 3)])
def test_gc_cnt_checkpoints_the_first_blocks(gc_cnt, blocks):
    assert checkpointed(accelerate(tiny_gpt(blocks=3), config=memory_config(gc_cnt))) == blocks


@pytest.mark.parametrize("settings, message", [
    ({"gc_cnt": -1}, r"how many modules to checkpoint, got -1"),
    ({"gc_cnt": True}, r"how many modules to checkpoint, got True"),
    ({"cpu_offload": True}, r"offloads FSDP2's shards: set config.dist.fsdp.size > 1"),
])
def test_memory_settings_that_cannot_be_honoured_say_what_to_change(settings, message):
    config = memory_config(**{"gc_cnt": 1, **settings})
    with pytest.raises(ValueError, match=message):
        accelerate(tiny_gpt(), config=config)


def test_gc_cnt_without_gc_asks_for_gc():
    config = Config()
    config.memory.gc_cnt = 1
    with pytest.raises(ValueError, match=r"set config.memory.gc = True too"):
        accelerate(tiny_gpt(), config=config)


def _memory_rank(rank, cases):
    results = []
    for gc_cnt, cpu_offload in cases:
        loader = DataLoader(token_dataset(), batch_size=GLOBAL_BATCH // 2)
        model, loader = accelerate(tiny_gpt(), loader, memory_config(gc_cnt, cpu_offload, fsdp=2))
        offloaded = isinstance(model.h[0]._get_fsdp_state()._fsdp_param_group.offload_policy, CPUOffloadPolicy)
        results.append((checkpointed(model), offloaded, (train(model, loader), full_state(model))))
    return results


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_gc_cnt_and_cpu_offload_on_two_fsdp_ranks_match_one_process():
    cases = [(1, False), (None, True), (1, True)]
    results = run_ranks(_memory_rank, 2, cases)[0]
    for (gc_cnt, cpu_offload), (blocks, offloaded, result) in zip(cases, results):
        assert blocks == [gc_cnt == 1, False]  # tiny_gpt's two blocks
        assert offloaded == cpu_offload
        _assert_matches(result, "separate")
