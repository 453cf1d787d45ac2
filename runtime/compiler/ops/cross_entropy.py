"""cross_entropy: ``F.cross_entropy(logits, target)`` with its defaults (mean over the targets
that are not -100) on (rows, classes) logits. A class weight, label smoothing, another reduction
or ignore_index trace to other graphs and do not match."""

import torch
import torch.nn.functional as F

from accrewrite.runtime.compiler.core.patterns import Pattern
from accrewrite.runtime.compiler.core.registry import Op, inductors_code, register


def reference(logits, target):
    return F.cross_entropy(logits, target)


def _inputs(dtype, grad):
    return [torch.empty(4, 5, dtype=dtype, requires_grad=grad), torch.zeros(4, dtype=torch.long)]


register(Op("cross_entropy", "logits", reference,
            patterns=(Pattern("cross_entropy", reference, _inputs),)))
register(inductors_code("cross_entropy", "inductor's code"))
