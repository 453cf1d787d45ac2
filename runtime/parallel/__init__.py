"""Distributed policies for models past one device, on torch.distributed (TorchAcc 2.x's
accelerate API):

- ``accelerate.py``: ``accelerate(model, dataloader, config)``: checks the config, builds the
  mesh and applies the parts in order.
- ``config.py``: ``Config``, laid out like TorchAcc 2.x's; ``parallel_config``.
- ``parallel_dims.py``: ``ParallelDims``: the ``dp``, ``fsdp``, ``pp``, ``sp`` and ``tp`` degrees checked
  against the world, the DeviceMesh in the order of ``topology`` and the slices of it that the
  parts take.
- ``apply.py``: ``apply_pp``, ``apply_tp``, ``apply_sp``, ``apply_ac``, ``apply_compile``, ``apply_fsdp``, each
  usable on its own, and ``PARTS``, the order ``accelerate`` applies them in.
- ``pipeline.py``: the model's traced forward cut into stages; ``PipelineModel``, one stage on
  torch.distributed.pipelining's 1F1B schedule.
- ``tensor_parallel.py``: tensor-parallel plans applied to a block with DTensor.
- ``context_parallel.py``: context parallel by Ulysses: a block on its part of the sequence,
  its attention on its part of the heads.
- ``tp_plan.py``: the plans derived from what a block computes (its torch.fx trace).
- ``mha.py``: ``nn.MultiheadAttention`` as separate projections that split by head.
- ``loader.py``: the dataloader split over the data-parallel ranks.
- ``bucketing.py``: the loader whose batches are padded up to the nearest bucket length.
- ``checkpoint.py``: ``save_checkpoint``/``load_checkpoint``: sharded, resharding, atomic
  checkpoints through torch.distributed.checkpoint, and the full-state export.
- the kinds of ``migrate --parallel`` and the sizes each sets are ``accrewrite.base.parallel_kinds``
  (torch-free: the codemod reads them too); the torch private names used here are in
  ``accrewrite.base.torch_compat``, with the rest of the runtime's.
"""
