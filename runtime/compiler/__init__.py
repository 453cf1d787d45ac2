"""The graph compiler (``accrewrite.runtime.compile``), built on torch.compile.

- ``frontend.py``: ``compile(model, ...)``, the entry point, and ``compile_report``.
- ``backend.py``: the dynamo backend ``"accrewrite"`` (AOTAutograd, our passes, inductor).
- ``kernel_selection.py``: the pass that swaps aten subgraphs for accrewrite kernels.
- ``ops.py``: those kernels as ``torch.library`` custom ops.
- ``matmul.py``: the pass that runs CPU matmuls on oneDNN's GEMM where it is faster than ATen's.
- ``memory.py``: the activation-memory budget of the rematerialising partitioner.
- ``regional.py``: regional compilation of repeated blocks.
- ``explain.py``: ``explain(model, *inputs)``, the graph breaks with file:line and reason.
"""

from accrewrite.runtime.compiler.explain import explain
from accrewrite.runtime.compiler.frontend import compile, compile_report

__all__ = ["compile", "compile_report", "explain"]
