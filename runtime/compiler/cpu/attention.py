"""Causal self-attention on the CPU by accrewrite's C++ kernel (``cpu_kernels.cpp``): the
implementation "cpp" of the op causal_attention (``ops/causal_attention.py``), the alternative to
ATen's fused CPU attention kernel.

ATen's kernel runs its small products through MKL's sgemm, one call per tile, and gains little
from the causal mask at short sequences: at (16, 4, 128, 64) it took 2.3 ms forward and 4.9 ms
backward on 2 Zen 4 cores, 33 and 51 GFLOP/s on 1 core. The kernel works through one
(batch, head) pair at a time, skips the masked blocks of scores and runs its products on
oneDNN's micro-kernel (``cpublas::brgemm``, about 200 GFLOP/s on those tiles): forward and
backward took 0.50-0.86x ATen's time from 64 to 1024 tokens, head sizes 32 to 128 (float32;
two runs of ``benchmarks/cpu_kernels.py``).

The kernel is built at run time (``cpu_kernels.py``). The compiled graphs call it through two
operators, ``accrewrite::causal_attention`` (the output and each query's log-sum-exp) and
``accrewrite::causal_attention_backward`` (which recomputes the probabilities from the
log-sum-exp, as flash attention does), each with a fake implementation for inductor and the
pair joined by autograd for the joint graph that the pattern is traced to.
"""

import functools

import torch
from torch import Tensor

from accrewrite.runtime.compiler.core.custom_ops import define
from accrewrite.runtime.compiler.core.registry import Cost, Implementation, never, register
from accrewrite.runtime.compiler.cpu import cpu_kernels
from accrewrite.runtime.compiler.ops import causal_attention as op


def _block(tokens: int) -> int:
    """Queries per block: blocks of 32 skip more of the masked scores, 64 keep the products
    larger. At (16, 4, 128, 64) blocks of 32 took 0.90-0.95x the time of blocks of 64, from 256
    to 512 tokens they were even, at 1024 tokens 1.05x."""
    return 32 if tokens <= 512 else 64


@functools.cache
def unavailable() -> str | None:
    """Why the kernel cannot run in this process, or None; asked once."""

    def trial():
        q = torch.randn(1, 2, 3, 8)
        causal_attention_backward(q, q, q, q, *causal_attention(q, q, q))

    return cpu_kernels.why_unavailable("attention", trial)


def _attention_like(q: Tensor) -> Tensor:
    """An empty (batch, heads, tokens, head size) tensor laid out (batch, tokens, heads, head
    size), as ATen's kernel lays out its output: the heads' outputs are then one (batch, tokens,
    heads * head size) view, which the projection after attention reads."""
    batch, heads, tokens, dim = q.shape
    return q.new_empty(batch, tokens, heads, dim).transpose(1, 2)


def _strides(*tensors: Tensor) -> Tensor:
    return torch.tensor([s for t in tensors for s in t.stride()[:3]], dtype=torch.int64)


def _check(q: Tensor, *others: Tensor) -> None:
    """That q and the ``others`` (k and v; the gradient and output in the backward) are float32
    tensors on the CPU of one shape (batch, heads, tokens, head size), which the kernel assumes."""
    if q.dim() != 4 or any(t.shape != q.shape for t in others):
        shapes = ", ".join(str(list(t.shape)) for t in (q, *others))
        raise ValueError(
            f"causal_attention takes tensors of one shape (batch, heads, tokens, head size); "
            f"got {shapes}"
        )
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in (q, *others)):
        raise ValueError("causal_attention takes float32 tensors on the CPU")


def _forward(q, k, v):
    _check(q, k, v)
    q, k, v = map(cpu_kernels.contiguous_rows, (q, k, v))
    batch, heads, tokens, dim = q.shape
    out, lse = _attention_like(q), q.new_empty(batch, heads, tokens)
    cpu_kernels.library().accrewrite_attention_forward(
        q, k, v, out, lse, _strides(q, k, v, out), batch, heads, tokens, dim, dim**-0.5,
        _block(tokens), torch.get_num_threads(),
    )
    return out, lse


def _backward(grad, q, k, v, out, lse):
    _check(q, k, v, grad, out)
    if lse.shape != q.shape[:3] or lse.dtype != torch.float32:
        raise ValueError(f"lse {list(lse.shape)} {lse.dtype} is not float32 {list(q.shape[:3])}")
    grad, q, k, v, out = map(cpu_kernels.contiguous_rows, (grad, q, k, v, out))
    dq, dk, dv = _attention_like(q), _attention_like(q), _attention_like(q)
    batch, heads, tokens, dim = q.shape
    cpu_kernels.library().accrewrite_attention_backward(
        grad, q, k, v, out, lse.contiguous(), dq, dk, dv,
        _strides(q, k, v, out, grad, dq, dk, dv), batch, heads, tokens, dim, dim**-0.5,
        _block(tokens), torch.get_num_threads(),
    )
    return dq, dk, dv


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)
    ctx.mark_non_differentiable(output[1])


def _gradients(ctx, grad, _grad_lse):
    return causal_attention_backward(grad, *ctx.saved_tensors)


_backward_op = define(
    "causal_attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, "
    "Tensor lse) -> (Tensor, Tensor, Tensor)",
    {"CPU": _backward},
    lambda grad, q, k, v, out, lse: (_attention_like(q), _attention_like(q), _attention_like(q)),
)
_forward_op = define(
    "causal_attention(Tensor q, Tensor k, Tensor v) -> (Tensor, Tensor)",
    {"CPU": _forward},
    lambda q, k, v: (_attention_like(q), q.new_empty(q.shape[:3])),
    backward=_gradients,
    setup_context=_setup_context,
)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` for float32 ``q``, ``k`` and
    ``v`` of one shape (batch, heads, tokens, head size) on the CPU, and the log-sum-exp of each
    query's scaled scores (batch, heads, tokens), which the backward takes."""
    return _forward_op(q, k, v)


def causal_attention_backward(grad, q, k, v, out, lse) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of q, k and v for ``grad``, the gradient of :func:`causal_attention`'s
    ``out``."""
    return _backward_op(grad, q, k, v, out, lse)


# The kernel took 0.50-0.86x the time of ATen's for a training step of the attention alone (64
# to 1024 tokens, head sizes 32 to 128, float32, 2 cores). Its blocks of scores (32 or 64
# queries x all tokens) were not measured beyond 1024 tokens, where ATen's kernel, which works
# through keys in blocks, stays.
_MAX_TOKENS = 1024


def _cost(args) -> Cost:
    tokens = args["q"].shape[-2]
    if tokens > _MAX_TOKENS:
        return never(f"{tokens} tokens, over the {_MAX_TOKENS} it is measured at")
    return Cost(0.7, "accrewrite's C++ kernel: 0.50-0.86x ATen's time on the CPU")


def _unsupported(args) -> str | None:
    shape = args["q"].shape[-2:]
    if not all(isinstance(size, int) for size in shape):
        return f"the number of tokens or the head size ({list(shape)}) is symbolic"
    return unavailable()


def _kernel(q, k, v):
    return causal_attention(q, k, v)[0]


register(Implementation(
    "causal_attention", "cpp", ("cpu",), (torch.float32,), _cost, kernel=_kernel,
    unsupported=lambda args: op.unsupported(args) or _unsupported(args), ours=True,
))
