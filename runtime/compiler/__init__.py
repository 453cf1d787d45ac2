"""The graph compiler (``accrewrite.runtime.compile``), built on torch.compile, with a registry
of kernel implementations per op and device (RAF's operator dialects).

- ``frontend.py``: ``compile(model, ...)``, the entry point, and ``compile_report``.
- ``backend.py``: the dynamo backend ``"accrewrite"`` (AOTAutograd, our passes, inductor) and
  the compile report.
- ``graph_breaks.py``: ``explain(model, *inputs)``, the graph breaks with file:line and reason.
- ``core/``: the registry, the selector and autotuning, the passes that find ops in graphs,
  regional compilation, the activation-memory budget.
- ``ops/``: the ops that are not accrewrite's kernels, one module each: how they are found and
  their default implementation. accrewrite's kernels declare theirs in their own modules
  (``accrewrite.kernels.compiler_op``).
- ``cpu/``: implementations for the CPU (C++ kernels, oneDNN) and the host memory cache.
- ``cuda/``: implementations for CUDA (the Triton kernels' declared ops, causal attention).
"""

from accrewrite.runtime.compiler.graph_breaks import explain
from accrewrite.runtime.compiler.frontend import compile, compile_report

__all__ = ["compile", "compile_report", "explain"]
