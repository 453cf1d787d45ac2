"""``memory_budget``: how much activation memory the compiled training graph may keep.

AOTAutograd splits the joint graph into forward and backward with the min-cut
rematerialisation partitioner: every activation the backward needs is either saved by the
forward or recomputed by the backward. Its budget (``torch._functorch.config
.activation_memory_budget``) is the fraction of the activation memory of the default plan that
may be saved: 1.0 is the runtime-optimal plan, lower values recompute more (matmuls included,
cheapest recomputation first) and 0.0 keeps as little as possible, as RAF's rematerialisation
trades compute for a larger batch.
"""

import contextlib

from accrewrite.base import torch_compat as compat


def check_budget(budget) -> float | None:
    """``budget`` validated: None (the partitioner's default) or a number in [0, 1]."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget <= 1:
        raise ValueError(
            f"memory_budget={budget!r}: expected None or a fraction of activation memory "
            "between 0.0 (recompute as much as possible) and 1.0 (the fastest plan)"
        )
    return float(budget)


@contextlib.contextmanager
def activation_budget(budget: float | None):
    """Partition the graphs compiled inside this block with ``budget`` (None: unchanged)."""
    if budget is None:
        yield
        return
    with compat.functorch_config.patch(activation_memory_budget=budget):
        yield
