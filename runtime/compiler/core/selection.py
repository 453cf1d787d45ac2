"""The selector: which of an op's implementations (``registry.py``) runs a match, by the
``kernels`` policy, and the record of that choice for the compile report.

- "auto": the implementation whose cost rule gives the lowest cost (the default one on a tie);
- "autotune": the fastest on the match's shapes, measured once per machine and shape
  (``autotune.py``);
- "accrewrite": accrewrite's own kernel wherever one takes the match;
- "inductor": always the default, the graph as the user wrote it.
"""

import dataclasses

import torch

from accrewrite.runtime.compiler.core import autotune, registry

POLICIES = ("auto", "autotune", "accrewrite", "inductor")


@dataclasses.dataclass(frozen=True)
class KernelMatch:
    """One matched op and the implementation chosen for it."""

    kernel: str  # the op
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    training: bool
    choice: str  # the implementation's name
    reason: str

    def __str__(self):
        phase = "training" if self.training else "inference"
        dtype = str(self.dtype).removeprefix("torch.")
        return (
            f"{self.kernel} {list(self.shape)} {dtype} on {self.device} ({phase}): "
            f"{self.choice} ({self.reason})"
        )


def check_policy(policy) -> str:
    """``policy`` (the ``kernels`` option) validated."""
    if policy not in POLICIES:
        raise ValueError(f"kernels={policy!r}: expected one of {', '.join(map(repr, POLICIES))}")
    return policy


def select(op_name: str, args: dict, policy: str, training: bool = True):
    """(the implementation, why) for the op ``op_name`` on ``args`` (fake tensors and scalars
    by argument name) under ``policy``."""
    op = registry.ops()[op_name]
    x = args[op.input]
    default = registry.default(op_name, x.device.type)
    if policy == "inductor":
        return default, "kernels='inductor'"
    takers, refusals = [default], []
    for implementation in registry.implementations(op_name, x.device.type):
        if implementation is default:
            continue
        why = implementation.why_not(args, x)
        if why:
            refusals.append(f"{implementation.name} does not take it: {why}")
        else:
            takers.append(implementation)
    if policy == "accrewrite":
        ours = [i for i in takers if i.ours]
        if ours:
            return _cheapest(ours, args)[0], "kernels='accrewrite'"
        return default, "; ".join(refusals) or "no accrewrite kernel for it"
    if policy == "autotune" and len(takers) > 1:
        tuned = autotune.fastest(op, takers, args, training)
        if tuned:
            return tuned
    best, costs = _cheapest(takers, args)
    if best is not default:
        return best, costs[best.name].reason
    rivals = [costs[i.name].reason for i in takers if i is not default]
    return default, "; ".join(rivals + refusals) or costs[default.name].reason


def _cheapest(implementations, args):
    """The implementation of lowest cost (the first of equals), and every one's ``Cost``."""
    costs = {i.name: i.cost(args) for i in implementations}
    return min(implementations, key=lambda i: costs[i.name].relative), costs


def record(op_name: str, args: dict, policy: str, training: bool, matches: list):
    """``select`` for a match, recorded in ``matches`` (the report's); returns the
    implementation."""
    op = registry.ops()[op_name]
    implementation, reason = select(op_name, args, policy, training)
    x = args[op.input]
    matches.append(KernelMatch(
        op_name, op.shape_of(args), x.dtype, str(x.device), training, implementation.name, reason
    ))
    return implementation
