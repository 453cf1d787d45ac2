"""Adding nodes to an FX graph from the compiler's passes (``matmul.py``, ``cross_entropy.py``)."""

import torch


def call(graph: torch.fx.Graph, target, *args, **kwargs) -> torch.fx.Node:
    """A node calling ``target``, with its fake value: inductor lays out the nodes that follow
    by their values' shapes and strides."""
    node = graph.call_function(target, args, kwargs)
    values = [arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg for arg in args]
    node.meta["val"] = target(*values, **kwargs)
    return node
