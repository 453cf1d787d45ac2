"""Causal attention by accrewrite's C++ kernel (compiler/cpu/attention.py, cpu_kernels.cpp) and
its choice by kernel selection: the kernel equals ATen's attention, forward and backward, over odd
shapes and the strided layouts models hand it; on the CPU ``kernels="auto"`` replaces ATen's
kernel with it up to the tokens it is measured at and says why; and the attention it does not
compute (a mask, a scale of its own, dropout, no causal mask, other dtypes, symbolic sizes) is
left to ATen."""

import pathlib

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from accrewrite.runtime.compiler.cpu import attention, cpp_library, cpu_kernels
from accrewrite.runtime.compiler.backend import Backend

FLASH = "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default("
KERNEL = "torch.ops.accrewrite.causal_attention.default("


def qkv(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=g, dtype=dtype, requires_grad=True) for _ in range(3)]


def forward_backward(fn, q, k, v):
    """fn's output and the gradients of q, k and v."""
    out = fn(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    return out.detach(), grads


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def kernel(q, k, v):
    return attention.causal_attention(q, k, v)[0]


@pytest.mark.parametrize(
    "shape",
    # around the blocks of 32 queries (and of 64 over 512 tokens): partial blocks, a last block
    # of one query
    [(2, 3, 1, 8), (2, 3, 31, 8), (1, 2, 32, 24), (2, 1, 33, 8), (1, 2, 67, 24),
     (2, 2, 100, 40), (1, 1, 192, 128), (1, 2, 577, 16)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_kernel_equals_atens_causal_attention(shape):
    q, k, v = qkv(*shape)
    out, grads = forward_backward(kernel, q, k, v)
    expected, expected_grads = forward_backward(causal, q, k, v)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-5, atol=1e-5)


def test_log_sum_exp_is_atens():
    q, k, v = (t.detach() for t in qkv(2, 3, 71, 16))
    _, lse = attention.causal_attention(q, k, v)
    expected = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[1]
    torch.testing.assert_close(lse, expected, rtol=1e-5, atol=1e-5)


def test_strided_inputs_as_a_model_hands_them():
    # q, k, v: heads of one (batch, tokens, 3 * hidden) projection; the output gradient is
    # non-contiguous, and one input's last dimension is strided (copied for the kernel)
    batch, tokens, heads, dim = 2, 73, 3, 16
    g = torch.Generator().manual_seed(0)
    qkv_proj = torch.randn(batch, tokens, 3 * heads * dim, generator=g, requires_grad=True)
    q, k, v = (
        t.view(batch, tokens, heads, dim).transpose(1, 2)
        for t in qkv_proj.split(heads * dim, dim=-1)
    )
    v = v.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert v.stride(-1) != 1
    grad = torch.randn(batch, tokens, heads, dim, generator=g).transpose(1, 2)

    out = kernel(q, k, v)
    (grad_qkv,) = torch.autograd.grad(out, qkv_proj, grad)
    expected = causal(q, k, v)
    (expected_grad,) = torch.autograd.grad(expected, qkv_proj, grad)

    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_qkv, expected_grad, rtol=1e-5, atol=1e-5)
    # laid out as ATen's kernel lays out its output: the heads side by side in each token's row
    assert out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize(
    "args, message",
    [((torch.ones(2, 3, 4, 8, dtype=torch.float64),) * 3, "float32"),
     ((torch.ones(3, 4, 8),) * 3, "(batch, heads, tokens, head size)"),
     ((torch.ones(1, 2, 4, 8), torch.ones(1, 2, 5, 8), torch.ones(1, 2, 5, 8)), "one shape")],
    ids=["float64", "3d", "shapes differ"],
)
def test_kernel_rejects_what_it_does_not_compute(args, message):
    with pytest.raises(ValueError, match=message):
        attention.causal_attention(*args)


def test_backward_rejects_a_gradient_of_another_shape():
    q, k, v = (t.detach() for t in qkv(1, 2, 5, 8))
    out, lse = attention.causal_attention(q, k, v)
    with pytest.raises(ValueError, match="one shape"):
        attention.causal_attention_backward(out[:, :, :4], q, k, v, out, lse)
    with pytest.raises(ValueError, match="lse"):
        attention.causal_attention_backward(out, q, k, v, out, lse[:, :, :4])


def test_an_error_inside_the_kernel_is_raised_not_an_abort():
    # brgemm refuses float32 in VNNI layout: this build of the kernel fails inside its
    # OpenMP region, where an escaping C++ exception would abort the process
    source = pathlib.Path(attention.__file__).with_name("cpu_kernels.cpp").read_text()
    failing = source.replace("a, b, c, false);", "a, b, c, true);")
    assert failing != source
    name = "accrewrite_attention_forward"
    kernels = cpp_library.load_functions(failing, {name: cpu_kernels.FUNCTIONS[name]})
    q = torch.randn(1, 2, 3, 8)
    out, lse = attention._attention_like(q), q.new_empty(1, 2, 3)
    with pytest.raises(RuntimeError, match="vnni"):
        kernels.accrewrite_attention_forward(
            q, q, q, out, lse, attention._strides(q, q, q, out), 1, 2, 3, 8, 0.35, 32, 2
        )


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


@pytest.mark.usefixtures("fresh_compiles")
def test_on_cpu_auto_runs_causal_attention_on_the_kernel_and_matches_eager():
    q, k, v = qkv(2, 3, 130, 32)
    out, grads, code, matches = compile_and_run(causal, q, k, v)

    assert [str(m) for m in matches] == [
        "causal_attention [2, 3, 130, 32] float32 on cpu (training): cpp "
        "(accrewrite's C++ kernel: 0.50-0.86x ATen's time on the CPU)"
    ]
    assert FLASH not in code and KERNEL in code
    assert "torch.ops.accrewrite.causal_attention_backward.default(" in code
    expected, expected_grads = forward_backward(causal, q, k, v)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("fresh_compiles")
def test_in_an_inference_graph():
    q, k, v = qkv(2, 2, 128, 64)
    out, _, code, matches = compile_and_run(causal, q, k, v, training=False)

    assert [(m.training, m.choice) for m in matches] == [(False, "cpp")]
    assert FLASH not in code and KERNEL in code
    torch.testing.assert_close(out, causal(q, k, v).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize(
    "shape, dtype, kernels, reason",
    [((1, 1, 1025, 8), torch.float32, "auto", "1025 tokens, over the 1024 it is measured at"),
     ((1, 2, 64, 16), torch.bfloat16, "accrewrite", "cpp does not take it: bfloat16, not float32"),
     ((1, 2, 64, 16), torch.float32, "inductor", "kernels='inductor'")],
    ids=["long", "bfloat16", "kernels=inductor"],
)
def test_attention_left_to_atens_kernel_says_why(shape, dtype, kernels, reason):
    q, k, v = qkv(*shape, dtype=dtype)
    out, grads, code, matches = compile_and_run(causal, q, k, v, kernels=kernels)

    assert [m.choice for m in matches] == ["aten"] and reason in matches[0].reason
    assert FLASH in code and KERNEL not in code
    expected, expected_grads = forward_backward(causal, q, k, v)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out, expected, **tol)
    torch.testing.assert_close(grads, expected_grads, **tol)


@pytest.mark.usefixtures("fresh_compiles")
def test_where_the_kernel_cannot_run_atens_is_kept(monkeypatch):
    monkeypatch.setattr(attention, "unavailable", lambda: "RuntimeError: no C++ compiler")
    q, k, v = qkv(1, 2, 64, 16)
    out, grads, code, matches = compile_and_run(causal, q, k, v)

    assert [(m.choice, m.reason) for m in matches] == [
        ("aten", "cpp does not take it: RuntimeError: no C++ compiler")
    ]
    assert FLASH in code and KERNEL not in code


MASK = torch.rand(128, 128, generator=torch.Generator().manual_seed(1)) > 0.5
OTHER_ATTENTION = {
    "mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=MASK | MASK.T),
    "scale": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
    "not causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
}


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize("kind", OTHER_ATTENTION)
def test_attention_the_kernel_does_not_compute_is_not_matched(kind):
    # kernels="accrewrite" would replace any match: none is made
    fn = OTHER_ATTENTION[kind]
    q, k, v = qkv(1, 2, 128, 32)
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

    *_, matches = compile_and_run(dropout, *qkv(1, 2, 128, 32), kernels="accrewrite")
    assert matches == []


@pytest.mark.usefixtures("fresh_compiles")
def test_a_symbolic_number_of_tokens_keeps_atens_kernel():
    backend = Backend(kernels="accrewrite")
    compiled = torch.compile(causal, backend=backend, dynamic=True)
    for tokens in (67, 129):
        q, k, v = qkv(2, 2, tokens, 32)
        out, grads = forward_backward(compiled, q, k, v)
        expected, expected_grads = forward_backward(causal, q, k, v)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grads, expected_grads, rtol=1e-5, atol=1e-5)

    assert backend.report.matches and all(
        m.choice == "aten" and "is symbolic" in m.reason for m in backend.report.matches
    )
