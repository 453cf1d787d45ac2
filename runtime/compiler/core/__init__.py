"""The compiler's machinery, for every device: the registry of ops and implementations
(``registry.py``), the selector (``selection.py``, measuring with ``autotune.py``), the passes
that find ops in graphs (``patterns.py`` on the joint graph, ``selection_pass.py`` on each lowered graph),
how kernels become operators (``custom_ops.py``), regional compilation (``regional.py``) and the
activation-memory budget (``memory_budget.py``)."""
