"""What the runtime, the kernels and the engine share, importing none of them: the device layer
(``accelerator.py``), torch's private names (``torch_compat.py``, the one module that names
them), lazy package attributes (``lazy.py``), atomic file writes (``atomic_file.py``) and the
``--parallel`` kinds (``parallel_kinds.py``, torch-free: the codemod reads them)."""
