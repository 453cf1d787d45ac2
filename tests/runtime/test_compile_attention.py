"""Causal attention in blocks of queries (compiler/attention.py) and its choice by kernel
selection: it equals ATen's attention, replaces it when forced (``kernels="auto"`` keeps ATen's
kernel and says why), and leaves alone the attention it does not compute (a mask, a scale of its
own, dropout, no causal mask)."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from accrewrite.runtime.compiler.attention import BLOCK, causal_attention
from accrewrite.runtime.compiler.backend import Backend

FLASH = "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default("


def qkv(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=g, dtype=dtype, requires_grad=True) for _ in range(3)]


def forward_backward(fn, q, k, v):
    """fn's output and the gradients of q, k and v."""
    out = fn(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    return out.detach(), grads


@pytest.mark.parametrize(
    "shape",
    [(2, 3, 1, 8), (2, 3, BLOCK - 1, 8), (1, 2, BLOCK, 24), (2, 1, BLOCK + 1, 8),
     (1, 2, 2 * BLOCK + 3, 24), (3, 2 * BLOCK + 5, 16)],
    ids=lambda s: "x".join(map(str, s)),
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocks_equal_atens_causal_attention(shape, dtype):
    q, k, v = qkv(*shape, dtype=dtype)
    out, grads = forward_backward(causal_attention, q, k, v)
    expected, expected_grads = forward_backward(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v
    )
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out, expected, **tol)
    torch.testing.assert_close(grads, expected_grads, **tol)


def compile_and_run(fn, q, k, v, training=True, kernels="auto"):
    """(output, gradients or None, generated code, kernel-selection matches) of ``fn``
    compiled with the accrewrite backend."""
    backend = Backend(kernels=kernels)
    compiled = torch.compile(fn, backend=backend)
    if training:
        (out, grads), codes = run_and_get_code(forward_backward, compiled, q, k, v)
    else:
        with torch.no_grad():
            out, codes = run_and_get_code(compiled, q, k, v)
        grads = None
    return out, grads, "\n".join(codes), backend.report.matches


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.usefixtures("fresh_compiles")
def test_forced_causal_attention_runs_in_blocks_and_matches_eager():
    q, k, v = qkv(2, 3, 2 * BLOCK + 2, 32)
    out, grads, code, matches = compile_and_run(causal, q, k, v, kernels="accrewrite")

    assert [str(m) for m in matches] == [
        "causal_attention [2, 3, 130, 32] float32 on cpu (training): accrewrite "
        "(kernels='accrewrite')"
    ]
    assert FLASH not in code and "extern_kernels.bmm(" in code
    expected, expected_grads = forward_backward(causal, q, k, v)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("fresh_compiles")
def test_on_cpu_auto_lists_causal_attention_and_keeps_atens_kernel():
    q, k, v = qkv(1, 2, 2 * BLOCK + 2, 32)
    out, grads, code, matches = compile_and_run(causal, q, k, v)

    assert [(m.kernel, m.choice) for m in matches] == [("causal_attention", "inductor")]
    assert "add seconds of compilation" in matches[0].reason
    assert FLASH in code
    expected, expected_grads = forward_backward(causal, q, k, v)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-5, atol=1e-5)


MASK = torch.rand(2 * BLOCK, 2 * BLOCK, generator=torch.Generator().manual_seed(1)) > 0.5
OTHER_ATTENTION = {
    "mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=MASK | MASK.T),
    "scale": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
    "not causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
}


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize("kind", OTHER_ATTENTION)
def test_attention_the_blocks_do_not_compute_is_not_matched(kind):
    # kernels="accrewrite" would replace any match: none is made
    fn = OTHER_ATTENTION[kind]
    q, k, v = qkv(1, 2, 2 * BLOCK, 32)
    out, grads, code, matches = compile_and_run(fn, q, k, v, kernels="accrewrite")

    assert matches == []
    assert FLASH in code
    expected, expected_grads = forward_backward(fn, q, k, v)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("fresh_compiles")
def test_attention_with_dropout_is_not_matched():
    def dropout(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.5)

    *_, matches = compile_and_run(dropout, *qkv(1, 2, 2 * BLOCK, 32), kernels="accrewrite")
    assert matches == []


@pytest.mark.usefixtures("fresh_compiles")
def test_forced_blocks_in_an_inference_graph():
    q, k, v = qkv(2, 2, 2 * BLOCK, 64)
    out, _, code, matches = compile_and_run(causal, q, k, v, training=False, kernels="accrewrite")

    assert [(m.training, m.choice) for m in matches] == [(False, "accrewrite")]
    assert FLASH not in code
    torch.testing.assert_close(out, causal(q, k, v).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("fresh_compiles")
def test_a_symbolic_number_of_tokens_keeps_atens_kernel():
    backend = Backend(kernels="accrewrite")
    compiled = torch.compile(causal, backend=backend, dynamic=True)
    for tokens in (BLOCK + 3, 2 * BLOCK + 1):
        q, k, v = qkv(2, 2, tokens, 32)
        out, grads = forward_backward(compiled, q, k, v)
        expected, expected_grads = forward_backward(causal, q, k, v)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grads, expected_grads, rtol=1e-5, atol=1e-5)

    assert backend.report.matches and all(
        m.choice == "inductor" and "is symbolic" in m.reason for m in backend.report.matches
    )
