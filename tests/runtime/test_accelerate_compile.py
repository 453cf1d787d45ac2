"""``accelerate`` with activation checkpointing and compilation per block (one process: the
compiler's cold start is the cost here, not the ranks)."""

import pytest
from torch.utils.data import DataLoader

from accrewrite.runtime import Config, accelerate

from test_accelerate import GLOBAL_BATCH, Block, tiny_gpt, token_dataset, train


@pytest.mark.slow
def test_one_process_with_checkpointing_and_compile_trains_as_the_plain_model(fresh_compiles):
    config = Config()
    config.memory.gc = True
    config.compute.compile = True
    config.dist.fsdp.wrap_layer_cls = {Block}
    model = accelerate(tiny_gpt(blocks=2), config=config)
    assert all(type(block.forward).__name__ == "_Checkpointed" for block in model.h)
    losses = train(model, DataLoader(token_dataset(batches=3), batch_size=GLOBAL_BATCH), steps=3)
    want = train(tiny_gpt(blocks=2), DataLoader(token_dataset(batches=3), batch_size=GLOBAL_BATCH), steps=3)
    assert losses == pytest.approx(want, abs=1e-5)
