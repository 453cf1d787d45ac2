"""The accrewrite kernels as ``torch.library`` custom ops, so that compiled graphs can call them.

The kernel-selection pass (``kernel_selection.py``) swaps matched aten subgraphs for these ops.
Inductor does not look inside a custom op: it calls it as an opaque kernel and plans memory and
fusion around it from the op's fake (meta) implementation, registered here next to each op.

Each op calls the kernel's public dispatching function (``accrewrite.kernels.<name>.<name>``),
which picks the Triton kernel for CUDA tensors and the PyTorch reference elsewhere, so the ops
run, with the kernels' own numerics, on every device.

Autograd: every op has a companion ``<name>_backward`` op. It saves only the op's inputs and
recomputes the kernel's forward under autograd in backward, then differentiates it (the
kernel's own ``autograd.Function`` backward). That is one generic backward for every kernel,
whatever the kernel keeps for its backward, and it keeps activation memory to the inputs, which
is what the rematerialising partitioner wants anyway.
"""

import contextlib
import importlib

import torch
from torch import Tensor

_AUTOGRAD_KEYS = (
    torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality)
    | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradOther)
    | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradNestedTensor)
)


@contextlib.contextmanager
def _autograd_enabled():
    """Re-enable autograd inside a custom op's implementation.

    The dispatcher runs custom-op implementations below the autograd keys (they are excluded
    from dispatch, so ``torch.enable_grad()`` alone records nothing). The backward ops need
    autograd to differentiate the kernel, so they restore those keys for their own body.
    """
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set() - _AUTOGRAD_KEYS
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield


def _kernel(module: str):
    """The public dispatching function of ``accrewrite.kernels.<module>``, imported on first
    use so that loading the compiler does not load every kernel."""
    return getattr(importlib.import_module(f"accrewrite.kernels.{module}"), module)


def _vjp(fn, tensors, grad, *constants):
    """Gradients of ``fn(*tensors, *constants)`` with respect to ``tensors`` (recompute and
    differentiate; see the module docstring). Inputs that get no gradient get zeros."""
    with _autograd_enabled():
        leaves = [t.detach().requires_grad_() for t in tensors]
        out = fn(*leaves, *constants)
        grads = torch.autograd.grad(out, leaves, grad, allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads))


# --- layer_norm: y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension ---


def _layer_norm(x, weight, bias, eps):
    return _kernel("layer_norm")(x, x.shape[-1:], weight, bias, eps)


@torch.library.custom_op("accrewrite::layer_norm", mutates_args=())
def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """Layer norm over the last dimension with an affine weight and bias."""
    return _layer_norm(x, weight, bias, eps)


@layer_norm.register_fake
def _(x, weight, bias, eps):
    return torch.empty_like(x)


@torch.library.custom_op("accrewrite::layer_norm_backward", mutates_args=())
def layer_norm_backward(
    grad: Tensor, x: Tensor, weight: Tensor, bias: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`layer_norm` for ``x``, ``weight`` and ``bias``."""
    return _vjp(_layer_norm, (x, weight, bias), grad, eps)


@layer_norm_backward.register_fake
def _(grad, x, weight, bias, eps):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, ctx.eps = inputs
    ctx.save_for_backward(x, weight, bias)


def _layer_norm_grad(ctx, grad):
    return *layer_norm_backward(grad, *ctx.saved_tensors, ctx.eps), None


layer_norm.register_autograd(_layer_norm_grad, setup_context=_layer_norm_setup)


# --- quick_gelu: x * sigmoid(1.702 * x) ---


@torch.library.custom_op("accrewrite::quick_gelu", mutates_args=())
def quick_gelu(x: Tensor) -> Tensor:
    """``x * sigmoid(1.702 * x)``."""
    return _kernel("quick_gelu")(x)


@quick_gelu.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("accrewrite::quick_gelu_backward", mutates_args=())
def quick_gelu_backward(grad: Tensor, x: Tensor) -> Tensor:
    """Gradient of :func:`quick_gelu` for ``x``."""
    return _vjp(_kernel("quick_gelu"), (x,), grad)[0]


@quick_gelu_backward.register_fake
def _(grad, x):
    return torch.empty_like(x)


def _quick_gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _quick_gelu_grad(ctx, grad):
    return quick_gelu_backward(grad, *ctx.saved_tensors)


quick_gelu.register_autograd(_quick_gelu_grad, setup_context=_quick_gelu_setup)
