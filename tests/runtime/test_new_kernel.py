"""A new fused kernel is three new files: the kernel (``kernels/<op>.py``: its torch.library
operator), its compiler implementation (``runtime/compiler/cuda/<op>.py``) and its rule
(``rules/accNNN_<op>.py``), plus its spelling in the target profile. Nothing else is edited:
the compiler's registry and the rule registry find the new modules by themselves.

The test writes a toy kernel, Mish ``x * tanh(softplus(x))``, as those three files in folders of its
own, adds the folders to the three packages (as if the files were in the source tree) and
checks, in a fresh process (the Triton interpreter must be on before triton is imported), that
the kernel runs eagerly, that a compiled graph calls its operator in place of the code written
as users write it, and that the migration rewrites ``F.mish`` into a call of it.
"""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

KERNEL = '''
"""Mish, ``x * tanh(softplus(x))``: one Triton kernel each way, computed in float32."""

import torch
import torch.nn.functional as F

from accrewrite.kernels.dispatch import KERNEL_DTYPES, triton_available, use_triton

if triton_available():
    import triton
    import triton.language as tl

_BLOCK = 1024


def mish(x):
    return mish_op(x)


def mish_reference(x):
    wide = x.float()
    return (wide * torch.tanh(F.softplus(wide))).to(x.dtype)


def _kernel_takes(x):
    return x.dtype in KERNEL_DTYPES and use_triton(x)


@torch.library.custom_op("accrewrite::mish", mutates_args=())
def mish_op(x: torch.Tensor) -> torch.Tensor:
    if _kernel_takes(x):
        return _launch(x)
    return mish_reference(x)


@torch.library.custom_op("accrewrite::mish_backward", mutates_args=())
def mish_backward_op(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if _kernel_takes(x):
        return _launch(x, dy)
    wide = x.float()
    t = torch.tanh(F.softplus(wide))
    return (dy.float() * (t + wide * (1 - t * t) * torch.sigmoid(wide))).to(x.dtype)


@mish_op.register_fake
def _(x):
    return torch.empty_like(x)


@mish_backward_op.register_fake
def _(dy, x):
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


mish_op.register_autograd(
    lambda ctx, dy: mish_backward_op(dy, *ctx.saved_tensors), setup_context=_setup_context
)


def _launch(x, dy=None):
    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        grid = (triton.cdiv(x.numel(), _BLOCK),)
        if dy is None:
            _forward_kernel[grid](x, out, x.numel(), BLOCK=_BLOCK)
        else:
            _backward_kernel[grid](x, dy.contiguous(), out, x.numel(), BLOCK=_BLOCK)
    return out


if triton_available():

    @triton.jit
    def _tanh_softplus(x):
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # F.softplus's threshold
        e = tl.exp(-2.0 * softplus)  # softplus >= 0: no overflow
        return (1.0 - e) / (1.0 + e)

    @triton.jit
    def _forward_kernel(X, Y, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < n).to(tl.float32)
        tl.store(Y + offs, (x * _tanh_softplus(x)).to(Y.dtype.element_ty), mask=offs < n)

    @triton.jit
    def _backward_kernel(X, DY, DX, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < n).to(tl.float32)
        dy = tl.load(DY + offs, mask=offs < n).to(tl.float32)
        t = _tanh_softplus(x)
        dx = dy * (t + x * (1.0 - t * t) * tl.sigmoid(x))
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=offs < n)
'''

COMPILER = '''
"""mish: the op, written out as YOLOv4's code writes it, and its Triton kernel as the
implementation "triton"."""

import torch
import torch.nn.functional as F

from accrewrite.kernels.mish import mish_op
from accrewrite.runtime.compiler.core.patterns import Pattern
from accrewrite.runtime.compiler.core.registry import Op, inductors_code, register
from accrewrite.runtime.compiler.core.triton_kernels import left_to_inductor, triton_implementation


def reference(x):
    return x * torch.tanh(F.softplus(x))


def _inputs(dtype, grad):
    return [torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad)]


register(Op("mish", "x", reference, patterns=(Pattern("mish", reference, _inputs),)))
register(inductors_code("mish"))
register(triton_implementation("mish", "x", mish_op, left_to_inductor))
'''

RULE = '''
from accrewrite.rule import Example
from accrewrite.rules._constructor_swap import ConstructorSwap


class FusedMish(ConstructorSwap):
    """`F.mish(x)` calls the fused Mish kernel."""

    code = "ACC990"
    name = "fused-mish"
    summary = "F.mish -> the fused Mish kernel"
    swaps = {"torch.nn.functional.mish": "mish"}
    concepts = ("mish",)
    triggers = frozenset({"mish"})
    examples = (
        Example(
            before="""
            import torch.nn.functional as F

            y = F.mish(x)
            """,
            after="""
            import torch.nn.functional as F
            from accrewrite.kernels.mish import mish

            y = mish(x)
            """,
        ),
    )
'''

# The kernel's spelling in rules/targets/runtime.toml: an import line and a concept.
PROFILE_IMPORT = 'mish_kernel = "from accrewrite.kernels.mish import mish"'
PROFILE_CONCEPT = '[concepts.mish]\nexpr = "mish"\nimports = ["mish_kernel"]\n'

# A script with Mish both ways: written out (as YOLOv4's code does), which a compiled graph
# finds, and as F.mish, which the migration rewrites.
SCRIPT = '''
import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 12)

    def forward(self, x):
        h = self.fc(x)
        return h * torch.tanh(F.softplus(h))


class Head(Block):
    def forward(self, x):
        return F.mish(self.fc(x))
'''


@pytest.mark.slow
def test_a_new_kernel_is_three_files(tmp_path):
    pytest.importorskip("triton")
    folders = {}
    for folder, name, text in (("kernels", "mish.py", KERNEL),
                               ("compiler_cuda", "mish.py", COMPILER),
                               ("rules", "acc990_mish.py", RULE)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text(textwrap.dedent(text).lstrip())
        folders[folder] = str(tmp_path / folder)
    env = dict(os.environ, ACCREWRITE_KERNELS="triton")
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
        f"import test_new_kernel as t; t.check_new_kernel({folders!r})"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["eager", "ok", "compiled", "ok", "migrated", "ok"]


def check_new_kernel(folders):
    """The three checks, in a process whose packages also hold ``folders``."""
    import tomllib
    from importlib import resources

    import accrewrite.kernels
    import accrewrite.rules
    import accrewrite.runtime.compiler.cuda
    from accrewrite import targets

    accrewrite.kernels.__path__.append(folders["kernels"])
    accrewrite.runtime.compiler.cuda.__path__.append(folders["compiler_cuda"])
    accrewrite.rules.__path__.append(folders["rules"])
    from accrewrite.kernels import mish as kernel

    def must_not_run(*args):
        raise AssertionError("the reference ran instead of the Triton kernel")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    kernel.mish_reference = must_not_run  # every check below runs the kernel

    def reference(x):
        return x * torch.tanh(torch.nn.functional.softplus(x))

    # eagerly
    x = torch.randn(3, 1025, device=device, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out = kernel.mish(x)
    torch.testing.assert_close(out, reference(x2))
    out.square().sum().backward()
    reference(x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    print("eager ok")

    # under torch.compile: the compiler's registry found the implementation by itself
    from torch._inductor.utils import run_and_get_code

    from accrewrite.runtime.compiler.backend import Backend

    torch._inductor.config.force_disable_caches = True  # the pass runs, whatever ran before
    namespace = {}
    exec(SCRIPT, namespace)
    torch.manual_seed(0)
    eager = namespace["Block"]().to(device)
    backend = Backend(kernels="accrewrite")
    compiled = torch.compile(eager, backend=backend)
    x = torch.randn(5, 12, device=device, requires_grad=True)

    def step(model):
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        return out, [p.grad for p in model.parameters()]

    (out, grads), codes = run_and_get_code(step, compiled)
    expected, expected_grads = step(eager)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grads, expected_grads)
    assert [(m.kernel, m.choice) for m in backend.report.matches
            if m.kernel != "matmul"] == [("mish", "triton")]
    for op in ("mish", "mish_backward"):
        assert f"torch.ops.accrewrite.{op}.default" in "".join(codes)
    print("compiled ok")

    # by the migration: the rule registry found the rule by itself; the profile has the
    # kernel's spelling (the lines a new kernel adds to rules/targets/runtime.toml) and the
    # catalogue its concept (the line it adds to accrewrite/concepts.py)
    from accrewrite.concepts import CATALOGUE, SPELLING, Definition
    from accrewrite.engine import Options, migrate_source

    CATALOGUE["mish"] = Definition("mish", SPELLING, "torch.nn.functional.mish, fused")

    profile = resources.files("accrewrite.rules").joinpath("targets/runtime.toml").read_text()
    profile = profile.replace("[imports]\n", f"[imports]\n{PROFILE_IMPORT}\n") + PROFILE_CONCEPT
    runtime = targets._parse(tomllib.loads(profile), "runtime.toml")
    targets.all_targets()["runtime"] = runtime
    from accrewrite.registry import find_rule

    (example,) = find_rule("fused-mish").examples
    options = Options(select=("ACC990",))
    assert migrate_source(example.before.encode(), options=options).output.decode() == example.after
    result = migrate_source(SCRIPT.encode(), "block.py", options)
    migrated = result.output.decode()
    assert "from accrewrite.kernels.mish import mish" in migrated
    assert "return mish(self.fc(x))" in migrated
    namespace = {}
    exec(migrated, namespace)
    head = namespace["Head"]().to(device)
    head.load_state_dict(eager.state_dict())
    torch.testing.assert_close(head(x), eager(x))
    print("migrated ok")
