"""torch.distributed pieces that torch_xla scripts import from ``torch_xla.distributed``."""
