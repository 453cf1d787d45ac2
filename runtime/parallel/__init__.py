"""Distributed policies for models past one device, on torch.distributed (TorchAcc 2.x's
accelerate API):

- ``accelerate.py``: ``accelerate(model, dataloader, config)``: DeviceMesh, FSDP2, tensor
  parallel, activation checkpointing, compilation per block.
- ``config.py``: ``Config``, laid out like TorchAcc 2.x's.
- ``tensor_parallel.py``: tensor-parallel plans applied to a block with DTensor.
- ``tp_plan.py``: the plans derived from what a block computes (its torch.fx trace).
- ``mha.py``: ``nn.MultiheadAttention`` as separate projections that split by head.
- ``checkpoint.py``: ``save_checkpoint``/``load_checkpoint``: sharded, resharding, atomic
  checkpoints through torch.distributed.checkpoint, and the full-state export.
- the torch private names used here are in ``runtime/_torch_compat.py``, with the rest of the
  runtime's.
"""
