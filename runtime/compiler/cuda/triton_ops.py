"""The Triton kernels of ``accrewrite.kernels`` as operators that compiled graphs call
(``core/custom_ops.py``): layer_norm, quick_gelu, bias_dropout_add and swin_fmha, with the
implementations that put them in graphs in ``triton.py``.

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

from accrewrite.runtime import _torch_compat as compat
from accrewrite.runtime.compiler.core.custom_ops import define

_ANY_DEVICE = "CompositeExplicitAutograd"


@contextlib.contextmanager
def _autograd_enabled():
    """Re-enable autograd inside an op's implementation.

    The dispatcher runs op implementations below the autograd keys (they are excluded from
    dispatch, so ``torch.enable_grad()`` alone records nothing). The backward ops need autograd
    to differentiate the kernel, so they restore those keys for their own body.
    """
    include = compat.dispatch_include_set()
    exclude = compat.dispatch_exclude_set() - compat.autograd_keys()
    with compat.ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
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


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


# --- layer_norm: y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension ---


def _layer_norm(x, weight, bias, eps):
    return _kernel("layer_norm")(x, x.shape[-1:], weight, bias, eps)


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, ctx.eps = inputs
    ctx.save_for_backward(x, weight, bias)


layer_norm_backward = define(
    "layer_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor bias, float eps) "
    "-> (Tensor, Tensor, Tensor)",
    {_ANY_DEVICE: lambda grad, x, weight, bias, eps: _vjp(
        _layer_norm, (x, weight, bias), grad, eps
    )},
    lambda grad, x, weight, bias, eps: tuple(map(torch.empty_like, (x, weight, bias))),
)
layer_norm = define(
    "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> Tensor",
    {_ANY_DEVICE: _layer_norm},
    lambda x, weight, bias, eps: torch.empty_like(x),
    backward=lambda ctx, grad: (*layer_norm_backward(grad, *ctx.saved_tensors, ctx.eps), None),
    setup_context=_layer_norm_setup,
)


# --- quick_gelu: x * sigmoid(1.702 * x) ---

quick_gelu_backward = define(
    "quick_gelu_backward(Tensor grad, Tensor x) -> Tensor",
    {_ANY_DEVICE: lambda grad, x: _vjp(_kernel("quick_gelu"), (x,), grad)[0]},
    lambda grad, x: torch.empty_like(x),
)
quick_gelu = define(
    "quick_gelu(Tensor x) -> Tensor",
    {_ANY_DEVICE: lambda x: _kernel("quick_gelu")(x)},
    lambda x: torch.empty_like(x),
    backward=lambda ctx, grad: quick_gelu_backward(grad, *ctx.saved_tensors),
    setup_context=_save_inputs,
)


# --- bias_dropout_add: residual + dropout(x + bias, p) ---
#
# ``bias``, over the last dimension, may be None. The backward op recomputes the forward,
# dropout included: both draw the keep mask from ``seed``, a one-element integer tensor on x's
# device that the compiled graph draws anew at every call (triton.py), so they drop the same
# elements and every call a different set.


def _bias_dropout_add(x, bias, residual, p, seed):
    return _kernel("bias_dropout_add")(x, bias, residual, p, seed=seed)


def _bias_dropout_add_fake(x, bias, residual, p, seed):
    dtypes = [t.dtype for t in (x, bias, residual) if t is not None]
    return torch.empty_like(x, dtype=functools.reduce(torch.promote_types, dtypes))


def _bias_dropout_add_setup(ctx, inputs, output):
    x, bias, residual, ctx.p, seed = inputs
    ctx.save_for_backward(x, bias, residual, seed)


def _bias_dropout_add_grad(ctx, grad):
    x, bias, residual, seed = ctx.saved_tensors
    dx, *dbias = bias_dropout_add_backward(grad, x, bias, residual, ctx.p, seed)
    # The residual's gradient is the incoming one, passed on here rather than by the op (whose
    # outputs may not alias its inputs: it would have to copy it).
    return dx, dbias[0] if dbias else None, grad, None, None


bias_dropout_add_backward = define(
    "bias_dropout_add_backward(Tensor grad, Tensor x, Tensor? bias, Tensor residual, float p, "
    "Tensor seed) -> Tensor[]",
    {_ANY_DEVICE: lambda grad, x, bias, residual, p, seed: list(
        _vjp(_bias_dropout_add, (x, bias), grad, residual, p, seed)
    )},
    lambda grad, x, bias, residual, p, seed: [
        torch.empty_like(t) for t in (x, bias) if t is not None
    ],
)
bias_dropout_add = define(
    "bias_dropout_add(Tensor x, Tensor? bias, Tensor residual, float p, Tensor seed) -> Tensor",
    {_ANY_DEVICE: _bias_dropout_add},
    _bias_dropout_add_fake,
    backward=_bias_dropout_add_grad,
    setup_context=_bias_dropout_add_setup,
)


# --- swin_fmha: softmax(attn + relative_pos_bias + attn_mask) over the last dimension ---
#
# Swin's window attention probabilities (see ``accrewrite.kernels.swin_fmha``). The mask is a
# constant (Swin's is a buffer): it gets no gradient.

swin_fmha_backward = define(
    "swin_fmha_backward(Tensor grad, Tensor attn, Tensor relative_pos_bias, Tensor? attn_mask) "
    "-> (Tensor, Tensor)",
    {_ANY_DEVICE: lambda grad, attn, relative_pos_bias, attn_mask: _vjp(
        _kernel("swin_fmha"), (attn, relative_pos_bias), grad, attn_mask
    )},
    lambda grad, attn, relative_pos_bias, attn_mask: (
        torch.empty_like(attn), torch.empty_like(relative_pos_bias)
    ),
)
swin_fmha = define(
    "swin_fmha(Tensor attn, Tensor relative_pos_bias, Tensor? attn_mask) -> Tensor",
    {_ANY_DEVICE: lambda attn, relative_pos_bias, attn_mask: _kernel("swin_fmha")(
        attn, relative_pos_bias, attn_mask
    )},
    lambda attn, relative_pos_bias, attn_mask: torch.empty_like(attn),
    backward=lambda ctx, grad: (*swin_fmha_backward(grad, *ctx.saved_tensors), None),
    setup_context=_save_inputs,
)
