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
import functools
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
    """Gradients of ``fn(*tensors, *constants)`` with respect to those ``tensors`` that are not
    None (optional inputs), in order (recompute and differentiate; see the module docstring).
    Inputs that get no gradient get zeros."""
    with _autograd_enabled():
        leaves = [None if t is None else t.detach().requires_grad_() for t in tensors]
        out = fn(*leaves, *constants)
        given = [leaf for leaf in leaves if leaf is not None]
        grads = torch.autograd.grad(out, given, grad, allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g for t, g in zip(given, grads))


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


# --- bias_dropout_add: residual + dropout(x + bias, p) ---
#
# The backward op recomputes the forward, dropout included: both draw the keep mask from ``seed``,
# a one-element integer tensor on x's device that the compiled graph draws anew at every call
# (kernel_selection.py), so they drop the same elements and every call a different set.


def _bias_dropout_add(x, bias, residual, p, seed):
    return _kernel("bias_dropout_add")(x, bias, residual, p, seed=seed)


@torch.library.custom_op("accrewrite::bias_dropout_add", mutates_args=())
def bias_dropout_add(
    x: Tensor, bias: Tensor | None, residual: Tensor, p: float, seed: Tensor
) -> Tensor:
    """``residual + dropout(x + bias, p)`` (``bias``, over the last dimension, may be None),
    dropping the elements that ``seed`` selects."""
    return _bias_dropout_add(x, bias, residual, p, seed)


@bias_dropout_add.register_fake
def _(x, bias, residual, p, seed):
    dtypes = [t.dtype for t in (x, bias, residual) if t is not None]
    return torch.empty_like(x, dtype=functools.reduce(torch.promote_types, dtypes))


@torch.library.custom_op("accrewrite::bias_dropout_add_backward", mutates_args=())
def bias_dropout_add_backward(
    grad: Tensor, x: Tensor, bias: Tensor | None, residual: Tensor, p: float, seed: Tensor
) -> list[Tensor]:
    """Gradients of :func:`bias_dropout_add` for ``x`` and ``bias`` (when given)."""
    return list(_vjp(_bias_dropout_add, (x, bias), grad, residual, p, seed))


@bias_dropout_add_backward.register_fake
def _(grad, x, bias, residual, p, seed):
    return [torch.empty_like(t) for t in (x, bias) if t is not None]


def _bias_dropout_add_setup(ctx, inputs, output):
    x, bias, residual, ctx.p, seed = inputs
    ctx.save_for_backward(x, bias, residual, seed)


def _bias_dropout_add_grad(ctx, grad):
    x, bias, residual, seed = ctx.saved_tensors
    dx, *dbias = bias_dropout_add_backward(grad, x, bias, residual, ctx.p, seed)
    # The residual's gradient is the incoming one, passed on here rather than by the op (whose
    # outputs may not alias its inputs: it would have to copy it).
    return dx, dbias[0] if dbias else None, grad, None, None


bias_dropout_add.register_autograd(_bias_dropout_add_grad, setup_context=_bias_dropout_add_setup)


# --- swin_fmha: softmax(attn + relative_pos_bias + attn_mask) over the last dimension ---


@torch.library.custom_op("accrewrite::swin_fmha", mutates_args=())
def swin_fmha(attn: Tensor, relative_pos_bias: Tensor, attn_mask: Tensor | None) -> Tensor:
    """Swin's window attention probabilities (see ``accrewrite.kernels.swin_fmha``). The mask is
    a constant (Swin's is a buffer): it gets no gradient."""
    return _kernel("swin_fmha")(attn, relative_pos_bias, attn_mask)


@swin_fmha.register_fake
def _(attn, relative_pos_bias, attn_mask):
    return torch.empty_like(attn)


@torch.library.custom_op("accrewrite::swin_fmha_backward", mutates_args=())
def swin_fmha_backward(
    grad: Tensor, attn: Tensor, relative_pos_bias: Tensor, attn_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Gradients of :func:`swin_fmha` for ``attn`` and ``relative_pos_bias``."""
    return _vjp(_kernel("swin_fmha"), (attn, relative_pos_bias), grad, attn_mask)


@swin_fmha_backward.register_fake
def _(grad, attn, relative_pos_bias, attn_mask):
    return torch.empty_like(attn), torch.empty_like(relative_pos_bias)


def _swin_fmha_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swin_fmha_grad(ctx, grad):
    return *swin_fmha_backward(grad, *ctx.saved_tensors), None


swin_fmha.register_autograd(_swin_fmha_grad, setup_context=_swin_fmha_setup)
