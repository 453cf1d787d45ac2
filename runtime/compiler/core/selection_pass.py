"""The kernel-selection pass on each forward, backward and inference graph: finds the ops that
are aten nodes (an op with ``Op.nodes``, such as matmul) and lets the selector choose each
one's implementation.

Inductor runs it as its ``post_grad_custom_post_pass``, on the graphs it is about to lower, so
the nodes are those that reach the lowering (AOTAutograd's decompositions and the joint-graph
pass are done). A node on a device where the op has no implementation but its default is left
alone and not listed.
"""

import torch

from accrewrite.base import torch_compat as compat
from accrewrite.runtime.compiler.core import registry, selection


class NodeSelectionPass(compat.CustomInferenceAwareGraphPass):
    """Each node of an op found by its ``nodes`` gets the implementation the selector gives;
    the choices are appended to ``matches``."""

    def __init__(self, policy: str, matches: list):
        self.policy = selection.check_policy(policy)
        self.matches = matches

    def __call__(self, graph: torch.fx.Graph, is_inference: bool) -> None:
        for op in registry.ops().values():
            if op.nodes is None:
                continue
            for node, arg_nodes in list(op.nodes(graph)):
                args = {
                    name: value.meta["val"] if isinstance(value, torch.fx.Node) else value
                    for name, value in arg_nodes.items()
                }
                if not registry.replaceable(op.name, args[op.input].device.type):
                    continue
                implementation = selection.record(
                    op.name, args, self.policy, not is_inference, self.matches
                )
                if implementation.kernel is not None:
                    _replace(graph, node, implementation, arg_nodes)

    def uuid(self):
        # Part of inductor's cache key: the code of the passes and of every implementation.
        return compat.get_hash_for_files(tuple(registry.source_files())), self.policy


def _replace(graph, node, implementation, arg_nodes) -> None:
    with graph.inserting_before(node):
        replacement = implementation.insert(graph, **arg_nodes)
    replacement.meta.update(node.meta)
    node.replace_all_uses_with(replacement)
    graph.erase_node(node)
