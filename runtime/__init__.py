"""accrewrite.runtime: what migrated scripts import (docs/torch_xla_conformance.md maps its
torch_xla modules, docs/torchacc_names.md its TorchAcc 1.x names).

Members load on first use, so ``import accrewrite.runtime.xla_model as xm`` does not pay for the
graph compiler or the kernels.
"""

from accrewrite.base.lazy import lazy_attributes

from . import _process_exit  # noqa: F401 - first registered exit handler, so it runs last

__all__, __getattr__ = lazy_attributes(__name__, {
    "xla_model": "xla_model",
    "parallel_loader": "parallel_loader",
    "xla_runtime": "xla_runtime",
    "distributed": "distributed",
    "accelerator": "accelerator",
    "amp": "amp",
    "io": "io",
    "nn": "nn",
    "optim": "optim",
    "hooks": "hooks",
    "activation_checkpoint": "activation_checkpoint",
    "host_memory": "compiler.cpu.host_memory",
    "utils": "utils",
    "compile": "compiler:compile",
    "explain": "compiler:explain",
    "auto_checkpoint": "activation_checkpoint:auto_checkpoint",
    "accelerate": "parallel.accelerate:accelerate",
    "Config": "parallel.config:Config",
    "parallel_config": "parallel.config:parallel_config",
    "save_checkpoint": "parallel.checkpoint:save_checkpoint",
    "load_checkpoint": "parallel.checkpoint:load_checkpoint",
    "export_full_state_dict": "parallel.checkpoint:export_full_state_dict",
    "CheckpointMismatchError": "parallel.checkpoint:CheckpointMismatchError",
})
