"""cpp_library: the C++ kernels of a compiled graph built as one library per compile thread."""

import logging

import pytest

torch = pytest.importorskip("torch")
import torch._inductor.async_compile as async_compile
from torch._inductor import config as inductor_config
from torch._inductor.codecache import CppPythonBindingsCodeCache
from torch._inductor.cpp_builder import CppBuilder

from accrewrite.runtime.compiler.cpu import cpp_library
from accrewrite.runtime.compiler.cpu.cpp_library import LibraryAsyncCompile, batched

pytestmark = pytest.mark.usefixtures("fresh_compiles")

PREFIX = "#include <torch/csrc/inductor/cpp_prefix.h>\n"
SCALE = PREFIX + (
    'extern "C" void kernel(const float* in_ptr0, float* out_ptr0, int64_t n, float scale)\n'
    "{ for (int64_t i = 0; i < n; ++i) out_ptr0[i] = in_ptr0[i] * scale; }\n"
)
INCREMENT = PREFIX + 'extern "C"  void  kernel(float* in_out_ptr0) { in_out_ptr0[0] += 1; }\n'
# an include after the code: not a kernel that a library can take
LATE_INCLUDE = PREFIX + (
    'extern "C" void kernel(float* in_out_ptr0) { in_out_ptr0[0] *= 3; }\n#include <cmath>\n'
)


@pytest.fixture
def libraries(monkeypatch):
    """The sources of the C++ libraries built, as a list filled while the test runs."""
    built = []
    load_async = CppPythonBindingsCodeCache.load_async.__func__

    def spy(cls, main_code, *args, **kwargs):
        built.append(main_code)
        return load_async(cls, main_code, *args, **kwargs)

    monkeypatch.setattr(CppPythonBindingsCodeCache, "load_async", classmethod(spy))
    return built


def define(kernels):
    """``kernels`` ({name: (argtypes, source)}) defined as a graph module defines them, with
    one compile thread: as one library where batched."""
    compile_ = LibraryAsyncCompile()
    with inductor_config.patch(compile_threads=1):
        scope = {name: compile_.cpp_pybinding(*kernel) for name, kernel in kernels.items()}
        compile_.wait(scope)
    return scope


def test_each_kernel_of_a_library_is_called_with_its_own_arguments(libraries):
    with batched():
        scope = define({
            "scale": (["const float*", "float*", "int64_t", "float"], SCALE),
            "increment": (["float*"], INCREMENT),
            "late_include": (["float*"], LATE_INCLUDE),
        })
    x, out = torch.arange(6.0), torch.zeros(6)
    scope["scale"](x, out, 5, 2.5)
    assert out.tolist() == [0.0, 2.5, 5.0, 7.5, 10.0, 0.0]
    counter = torch.tensor([41.0])
    scope["increment"](counter)
    assert counter.item() == 42.0
    scope["late_include"](counter)
    assert counter.item() == 126.0
    with pytest.raises(RuntimeError, match="requires 4 args"):
        scope["scale"](x, out, 5)
    # scale and increment as one library, late_include on its own
    together = [source for source in libraries if "accrewrite_kernel_1" in source]
    assert len(together) == 1 and "accrewrite_kernel_2" not in together[0]
    assert any("*= 3" in source and "accrewrite_kernel" not in source for source in libraries)


def test_kernels_are_left_to_inductor_outside_batched(libraries):
    scope = define({"increment": (["float*"], INCREMENT)})
    counter = torch.tensor([1.0])
    scope["increment"](counter)
    assert counter.item() == 2.0
    assert libraries and not any("accrewrite_kernel" in source for source in libraries)


@pytest.mark.parametrize("source", [
    INCREMENT.replace("kernel(", "other("),  # no entry point "kernel"
    INCREMENT + 'extern "C" void helper() {}\n',  # a second C-linkage function
    LATE_INCLUDE,
])
def test_sources_that_a_library_cannot_take(source):
    assert cpp_library._kernel(["float*"], source) is None


def test_a_library_that_fails_builds_its_kernels_one_by_one(libraries, monkeypatch, caplog):
    library_source = cpp_library.library_source
    monkeypatch.setattr(
        cpp_library, "library_source", lambda kernels: library_source(kernels) + "\n#error no\n"
    )
    with batched(), caplog.at_level(logging.WARNING, cpp_library.__name__):
        scope = define({
            "scale": (["const float*", "float*", "int64_t", "float"], SCALE),
            "increment": (["float*"], INCREMENT),
        })
    out = torch.zeros(2)
    scope["scale"](torch.ones(2), out, 2, 3.0)
    assert out.tolist() == [3.0, 3.0]
    assert "built one by one" in caplog.text
    assert sum("accrewrite_kernel" not in source for source in libraries) == 2


def _three_kernels(x, w):
    # the matmuls are ATen's: the sine, the tanh and the softmax are three C++ kernels
    return ((x.sin() @ w).tanh() @ w).softmax(-1)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernels_of_a_graph_make_one_library_per_compile_thread(libraries, threads):
    """Forward and backward (which AOTAutograd compiles at the first backward)."""
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, 16)
    with inductor_config.patch(compile_threads=threads):
        compiled = torch.compile(_three_kernels, backend="accrewrite")(x, w)
        (grad,) = torch.autograd.grad(compiled.pow(2).sum(), x)
    eager = _three_kernels(x, w)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(grad, torch.autograd.grad(eager.pow(2).sum(), x)[0])
    kernels = [source.count("namespace accrewrite_kernel_") for source in libraries]
    assert len(kernels) == 2 * threads and all(kernels), kernels
    assert sum(kernels) == 6  # 3 forward, 3 backward


def test_inductor_alone_builds_a_library_per_kernel(libraries):
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    torch.compile(_three_kernels, backend="inductor")(x, w)
    assert len(libraries) == 3


def test_a_warm_start_builds_nothing(monkeypatch):
    """The libraries are in inductor's on-disk cache: a new process (here: dynamo and the
    in-memory caches cleared) that loads the graphs from inductor's caches builds no C++,
    forward or backward."""
    builds = []
    build = CppBuilder.build
    monkeypatch.setattr(CppBuilder, "build", lambda self: builds.append(self) or build(self))

    def step():
        x = torch.linspace(-1, 1, 64).view(8, 8).requires_grad_()
        w = torch.linspace(1, 2, 64).view(8, 8)
        torch.compile(_three_kernels, backend="accrewrite")(x, w).pow(2).sum().backward()
        return x.grad

    with inductor_config.patch(force_disable_caches=False), torch._inductor.utils.fresh_cache():
        cold = step()
        assert builds
        builds.clear()
        torch._dynamo.reset()
        CppPythonBindingsCodeCache.cache_clear()
        warm = step()
    assert builds == []
    assert cold is not None
    torch.testing.assert_close(warm, cold)


def test_batched_restores_inductors_async_compile():
    original = async_compile.AsyncCompile
    with batched():
        assert async_compile.AsyncCompile is LibraryAsyncCompile
        with batched():
            pass
        assert async_compile.AsyncCompile is LibraryAsyncCompile  # the inner one restores it
    assert async_compile.AsyncCompile is original
