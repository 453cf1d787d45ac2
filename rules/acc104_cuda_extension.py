import libcst as cst

from accrewrite.nodes import string_value
from accrewrite.rule import Example, Rule, excerpt

_CPP_EXTENSION = "torch.utils.cpp_extension."
_CUDA_SOURCES = (".cu", ".cuh")


class CudaExtension(Rule):
    """Report custom CUDA extensions: they do not run on an XLA device.

    `torch.utils.cpp_extension.load`/`load_inline`, `CUDAExtension`/`BuildExtension` in
    a setup script, and `.cu` sources build kernels for CUDA tensors. On XLA (torch_xla,
    TorchAcc) the tensors live on the XLA device and the kernel cannot take them; the lazy graph
    cannot include it either, and torch.compile treats an opaque extension call as a graph break.

    What to do: express the op in PyTorch (the compiler fuses it), use the target's fused
    replacement where one exists (`accrewrite.runtime.nn`: FusedLayerNorm, QuickGelu,
    dropout_add_fused_train, WindowProcess, FusedSwinFmha, nms, and DCN/DCNv2 for the dcn_v2
    package, whose imports ACC026 re-points; `accrewrite.kernels` has Triton versions), or
    register it as a custom op with a PyTorch reference
    (`torch.library.custom_op` with a CPU/reference implementation). Reported wherever it is.
    """

    code = "ACC104"
    name = "cuda-extension"
    summary = "custom CUDA extensions (torch.utils.cpp_extension, .cu sources) have no XLA kernel"
    triggers = frozenset(
        {"cpp_extension", "load", "load_inline", "CUDAExtension", "CppExtension", "BuildExtension", ".cu",
         "load_library"}
    )
    examples = (
        Example(
            before="""
            import torch
            from torch.utils.cpp_extension import load

            fused = load(name="fused_ops", sources=["fused_ops.cpp", "fused_ops_kernel.cu"])
            torch.ops.load_library("build/libmyops.so")
            """,
            diagnostics=("ACC104:4", "ACC104:5"),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._extension_calls = 0

    def visit_Call(self, node: cst.Call) -> None:
        callee = self.ctx.facts.file.qualname(node.func) or ""
        if callee.startswith(_CPP_EXTENSION):
            self._extension_calls += 1

    def leave_Call(self, original_node, updated_node):
        callee = self.ctx.facts.file.qualname(original_node.func) or ""
        if callee.startswith(_CPP_EXTENSION):
            self._extension_calls -= 1
            what = callee[len(_CPP_EXTENSION):]
            self.ctx.diagnose(
                original_node,
                f"`{excerpt(what)}` builds a custom CUDA/C++ kernel",
                "Such a kernel cannot take XLA tensors nor be part of a compiled graph. Write the op in "
                "PyTorch, use an accrewrite.runtime.nn fused module where one fits, or register a "
                "torch.library custom op with a reference implementation.",
            )
        elif callee == "torch.ops.load_library":
            self.ctx.diagnose(
                original_node,
                "`torch.ops.load_library` loads compiled custom kernels",
                "Compiled kernels have no XLA implementation. Give each op a PyTorch implementation "
                "(torch.library) or replace it.",
            )
        return updated_node

    def leave_SimpleString(self, original_node, updated_node):
        text = string_value(original_node)
        if self._extension_calls == 0 and text and text.endswith(_CUDA_SOURCES):
            self.ctx.diagnose(
                original_node,
                f"`{excerpt(text)}` is the source of a custom CUDA kernel",
                "A custom CUDA kernel has no XLA implementation and cannot be part of a compiled graph. "
                "Write the op in PyTorch or register a torch.library custom op with a reference "
                "implementation.",
            )
        return updated_node
