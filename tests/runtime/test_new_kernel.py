"""A new fused kernel is three new files, its kernel (``kernels/<op>.py``: its torch.library
operator and, beside it, its op as the graph compiler knows it, ``COMPILER_OP``), its nn module
(``runtime/nn/<op>.py``) and its rule (``rules/accNNN_<op>.py``, which defines its concept,
``defines``), plus its spelling in the target profile (one line). Nothing else is edited: the
compiler's registry, the nn package's exports and the rule registry find the new modules by
themselves, and the profile's spelling is checked against the rule's definition.

The test copies the package as it installs into a temporary folder, adds a toy kernel there,
Mish ``x * tanh(softplus(x))``, and checks which files of the copy differ from the source, then,
in a fresh process that imports the copy (the Triton interpreter must be on before triton is
imported), that the kernel matches its reference, that the registry and ``runtime.nn`` picked it
up, and that the migration rewrites ``nn.Mish()`` into the fused module.
"""

import filecmp
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
# the source folders as they install (setup.py's mapping)
LAYOUT = {"accrewrite": "accrewrite", "rules": "accrewrite/rules",
          "runtime": "accrewrite/runtime", "kernels": "accrewrite/kernels"}

KERNEL = '''
"""Mish, ``x * tanh(softplus(x))``: one Triton kernel each way, computed in float32."""

import torch
import torch.nn.functional as F

from accrewrite.kernels.compiler_op import CompilerOp, Pattern, left_to_inductor
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


# The op as YOLOv4's code writes it out, which a compiled graph finds.
def _written(x):
    return x * torch.tanh(F.softplus(x))


def _example_inputs(dtype, grad):
    return [torch.empty(2, 3, 8, dtype=dtype, requires_grad=grad)]


COMPILER_OP = CompilerOp(
    "mish", "x", _written, patterns=(Pattern("mish", _written, _example_inputs),),
    kernel=mish_op, cost=left_to_inductor,
)


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

NN_MODULE = '''
"""``Mish``: ``nn.Mish`` on the fused kernel."""

import torch

from accrewrite.kernels.mish import mish

__all__ = ["Mish"]


class Mish(torch.nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return mish(input)
'''

RULE = '''
from accrewrite.concepts import SPELLING, Definition
from accrewrite.rule import Example

from ._constructor_swap import ConstructorSwap


class FusedMish(ConstructorSwap):
    """`nn.Mish()` becomes the fused Mish module."""

    code = "ACC990"
    name = "fused-mish"
    summary = "nn.Mish -> the fused Mish module"
    swaps = {"torch.nn.Mish": "mish"}
    concepts = ("mish",)
    defines = (Definition("mish", SPELLING, "torch.nn.Mish, fused"),)
    triggers = frozenset({"Mish"})
    examples = (
        Example(
            before="""
            from torch import nn

            act = nn.Mish()
            """,
            after="""
            from torch import nn
            from accrewrite.runtime.nn import Mish

            act = Mish()
            """,
        ),
    )
'''

NEW_FILES = {
    "accrewrite/kernels/mish.py": KERNEL,
    "accrewrite/runtime/nn/mish.py": NN_MODULE,
    "accrewrite/rules/acc990_mish.py": RULE,
}
# The one edit to an existing file: the kernel's spelling in the runtime's profile, one line
# with its import line.
PROFILE = "accrewrite/rules/targets/runtime.toml"
PROFILE_SLOT = "[concepts]\n"
PROFILE_LINE = 'mish = { expr = "Mish", imports = ["from accrewrite.runtime.nn import Mish"] }\n'

# nn.Mish in a model, which the migration rewrites, and Mish written out (as YOLOv4's code does),
# which a compiled graph finds
SCRIPT = '''
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 12)
        self.act = nn.Mish()

    def forward(self, x):
        return self.act(self.fc(x))


class WrittenOut(Block):
    def forward(self, x):
        h = self.fc(x)
        return h * torch.tanh(F.softplus(h))
'''


def _copy_with_the_new_kernel(root: pathlib.Path) -> None:
    """The package as it installs, under ``root``, with Mish added."""
    ignore = shutil.ignore_patterns("__pycache__")
    for folder, installed in LAYOUT.items():
        shutil.copytree(REPOSITORY / folder, root / installed, ignore=ignore, dirs_exist_ok=True)
    for name, text in NEW_FILES.items():
        (root / name).write_text(textwrap.dedent(text).lstrip())
    profile = root / PROFILE
    profile.write_text(profile.read_text().replace(PROFILE_SLOT, PROFILE_SLOT + PROFILE_LINE))


def _source(name: str) -> pathlib.Path:
    """The source file of an installed path, by the innermost folder of the layout it is in."""
    for folder, installed in sorted(LAYOUT.items(), key=lambda item: -len(item[1])):
        if name.startswith(installed + "/"):
            return REPOSITORY / folder / name.removeprefix(installed + "/")
    raise AssertionError(f"{name} is outside the package")


def _changes(root: pathlib.Path) -> tuple[set[str], dict[str, int]]:
    """The files of the copy that the source does not have, and the edited ones with the number
    of lines each gained."""
    created, edited = set(), {}
    for path in root.rglob("*"):
        name = path.relative_to(root).as_posix()
        if not path.is_file() or "__pycache__" in name:
            continue
        source = _source(name)
        if not source.exists():
            created.add(name)
        elif not filecmp.cmp(path, source, shallow=False):
            edited[name] = len(path.read_text().splitlines()) - len(source.read_text().splitlines())
    return created, edited


def _run(root: pathlib.Path, check: str) -> str:
    env = dict(os.environ, ACCREWRITE_KERNELS="triton", PYTHONPATH=str(root))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    code = (f"import sys; sys.path.insert(1, {os.path.dirname(__file__)!r}); "
            f"import test_new_kernel as t; t.{check}()")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=600, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture
def package_with_mish(tmp_path):
    pytest.importorskip("triton")
    _copy_with_the_new_kernel(tmp_path)
    return tmp_path


def test_a_new_kernel_is_three_new_files_and_its_spelling(package_with_mish):
    created, edited = _changes(package_with_mish)
    assert created == set(NEW_FILES)
    assert edited == {PROFILE: 1}
    assert _run(package_with_mish, "check_new_kernel").split() == [
        "eager", "ok", "registry", "ok", "nn", "ok", "migrated", "ok",
    ]


@pytest.mark.slow
def test_a_compiled_graph_calls_the_new_kernel(package_with_mish):
    assert _run(package_with_mish, "check_compiled").split() == ["compiled", "ok"]


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _reference(x):
    return x * torch.tanh(torch.nn.functional.softplus(x))


def _kernel_only():
    """The new kernel's module, its reference made to fail: every check below runs the kernel."""
    import accrewrite

    assert pathlib.Path(accrewrite.__file__).parent == pathlib.Path.cwd() / "accrewrite"
    from accrewrite.kernels import mish as kernel

    def must_not_run(*args):
        raise AssertionError("the reference ran instead of the Triton kernel")

    kernel.mish_reference = must_not_run
    return kernel


def check_new_kernel():
    """In a process that imports the copy: the kernel, the registry, runtime.nn, the migration."""
    kernel = _kernel_only()
    device = _device()

    x = torch.randn(3, 1025, device=device, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out = kernel.mish(x)
    torch.testing.assert_close(out, _reference(x2))
    out.square().sum().backward()
    _reference(x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    print("eager ok")

    from accrewrite.runtime.compiler.core import registry

    assert [p.search for p in registry.ops()["mish"].patterns] == [kernel._written]
    assert [i.name for i in registry.implementations("mish")] == ["inductor", "triton"]
    triton = registry.implementations("mish")[1]
    torch.testing.assert_close(triton.kernel(x.detach()), _reference(x.detach()))
    assert kernel.__file__ in registry.source_files()  # part of inductor's cache key
    print("registry ok")

    import accrewrite.runtime.nn

    assert "Mish" in accrewrite.runtime.nn.__all__
    from accrewrite.runtime.nn import Mish

    torch.testing.assert_close(Mish()(x.detach()), torch.nn.Mish()(x.detach()))
    print("nn ok")

    from accrewrite.engine import Options, migrate_source
    from accrewrite.registry import find_rule

    (example,) = find_rule("fused-mish").examples
    options = Options(select=("ACC990",))
    assert migrate_source(example.before.encode(), options=options).output.decode() == example.after
    migrated = migrate_source(SCRIPT.encode(), "block.py", options).output.decode()
    assert "from accrewrite.runtime.nn import Mish" in migrated
    assert "self.act = Mish()" in migrated
    original, namespace = {}, {}
    exec(SCRIPT, original)
    exec(migrated, namespace)
    before, after = original["Block"]().to(device), namespace["Block"]().to(device)
    after.load_state_dict(before.state_dict())
    inputs = torch.randn(5, 12, device=device)
    torch.testing.assert_close(after(inputs), before(inputs))
    print("migrated ok")


def check_compiled():
    """In a process that imports the copy: a compiled graph calls the kernel's operator where
    the model writes Mish out."""
    _kernel_only()
    from torch._inductor.utils import run_and_get_code

    from accrewrite.runtime.compiler.backend import Backend

    device = _device()
    torch._inductor.config.force_disable_caches = True  # the pass runs, whatever ran before
    namespace = {}
    exec(SCRIPT, namespace)
    torch.manual_seed(0)
    eager = namespace["WrittenOut"]().to(device)
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
