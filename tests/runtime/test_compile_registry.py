"""The registry of kernel implementations (compiler/core/registry.py) and the selector: every op
has its implementations with devices, dtypes and cost rules; a new implementation is picked up
by registering alone; inductor's cache key follows the registered modules; causal attention on
CUDA chooses between SDPA's flash kernel and inductor's code (fake CUDA tensors, as the CUDA
rules of the Triton kernels are tested)."""

import importlib
import pathlib
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F

from accrewrite.runtime.compiler.core import registry
from accrewrite.runtime.compiler.core.selection_pass import NodeSelectionPass
from accrewrite.runtime.compiler.core.patterns import KernelSelectionPass
from accrewrite.runtime.compiler.core.registry import Cost, Implementation
from accrewrite.runtime.compiler.core.selection import select
from accrewrite.runtime.compiler.cuda import attention as cuda_attention

OPS = {
    "layer_norm": ["inductor", "triton"],
    "quick_gelu": ["inductor", "triton"],
    "bias_dropout_add": ["inductor", "triton"],
    "swin_fmha": ["inductor", "triton"],
    "causal_attention": ["aten", "cpp", "inductor"],  # the default first, then by name
    "cross_entropy": ["inductor", "cpp"],
    "matmul": ["aten", "onednn"],
}


def test_every_op_with_its_implementations():
    assert {op: [i.name for i in registry.implementations(op)] for op in registry.ops()} == OPS


@pytest.mark.parametrize("device", ["cpu", "cuda", "xpu"])
def test_each_op_has_one_default_per_device(device):
    for op in OPS:
        defaults = [i for i in registry.implementations(op, device) if i.kernel is None]
        assert len(defaults) == 1, op


def test_each_implementation_declares_devices_dtypes_and_a_cost_rule():
    for op in OPS:
        for implementation in registry.implementations(op):
            devices = implementation.devices
            if devices is registry.EVERY_DEVICE:  # a default: the graph's code as it is
                assert implementation.kernel is None
            else:
                assert set(devices) <= {"cpu", "cuda"} and devices
            assert implementation.dtypes and all(
                isinstance(d, torch.dtype) for d in implementation.dtypes
            )
            assert callable(implementation.cost)


def test_the_pattern_set_of_a_device_holds_the_ops_replaced_there():
    replaced = {device: {op for op in OPS if registry.replaceable(op, device)}
                for device in ("cpu", "cuda")}
    assert replaced["cpu"] == set(OPS)
    assert replaced["cuda"] == set(OPS) - {"cross_entropy", "matmul"}


@pytest.fixture
def registered():
    """Register implementations for the test, and remove them after it."""
    added = []

    def add(implementation):
        registry.register(implementation)
        added.append(implementation)

    yield add
    for implementation in added:
        registry._IMPLEMENTATIONS[implementation.op].remove(implementation)


def test_a_registered_implementation_is_chosen_by_its_cost(registered):
    def twice(x):
        return x * torch.sigmoid(1.702 * x)

    x = torch.empty(4, 8)
    assert select("quick_gelu", {"x": x}, "auto")[0].name == "inductor"
    registered(Implementation("quick_gelu", "test", ("cpu",), (torch.float32,),
                              lambda args: Cost(0.5, "half the time"), kernel=twice))
    implementation, reason = select("quick_gelu", {"x": x}, "auto")
    assert (implementation.name, reason) == ("test", "half the time")
    # its dtypes bound it
    implementation, reason = select("quick_gelu", {"x": x.bfloat16()}, "auto")
    assert implementation.name == "inductor"
    assert "test does not take it: bfloat16, not float32" in reason
    # and the module that registered it is part of inductor's cache key
    assert __file__ in registry.source_files()


def test_a_new_implementation_is_one_new_module(tmp_path):
    """A module dropped into cpu/ (or cuda/) is loaded, registered, chosen by its rule and part
    of the cache key, with no other file edited."""
    module = tmp_path / "sigmoid_gelu.py"
    module.write_text(textwrap.dedent("""
        import torch

        from accrewrite.runtime.compiler.core import registry

        registry.register(registry.Implementation(
            "quick_gelu", "sigmoid_gelu", ("cpu",), (torch.float32,),
            lambda args: registry.Cost(0.5, "the new module's rule"),
            kernel=lambda x: x * torch.sigmoid(1.702 * x),
        ))
    """))
    package = importlib.import_module("accrewrite.runtime.compiler.cpu")
    path, package.__path__ = package.__path__, [*package.__path__, str(tmp_path)]
    registry.load.cache_clear()
    try:
        implementation, reason = select("quick_gelu", {"x": torch.empty(4, 8)}, "auto")
        assert (implementation.name, reason) == ("sigmoid_gelu", "the new module's rule")
        assert str(module) in registry.source_files()
    finally:
        package.__path__ = path
        registry._IMPLEMENTATIONS["quick_gelu"] = [
            i for i in registry._IMPLEMENTATIONS["quick_gelu"] if i.name != "sigmoid_gelu"
        ]
        registry._FILES.discard(str(module))
        sys.modules.pop(f"{package.__name__}.sigmoid_gelu", None)
        vars(package).pop("sigmoid_gelu", None)
        registry.load.cache_clear()
    assert select("quick_gelu", {"x": torch.empty(4, 8)}, "auto")[0].name == "inductor"


def test_on_a_tie_the_default_stays(registered):
    registered(Implementation("quick_gelu", "test", ("cpu",), registry.FLOATS,
                              lambda args: Cost(1.0, "as fast"), kernel=torch.sigmoid))
    implementation, reason = select("quick_gelu", {"x": torch.empty(3)}, "auto")
    assert implementation is registry.default("quick_gelu", "cpu")
    assert sorted(reason.split("; ")) == ["as fast", "on cpu the kernel is its PyTorch reference"]


def test_the_cache_key_follows_the_registered_modules(tmp_path, monkeypatch):
    def keys():
        return KernelSelectionPass("auto", []).uuid(), NodeSelectionPass("auto", []).uuid()

    before = keys()
    module = tmp_path / "implementation.py"
    module.write_text("# an implementation's module\n")
    monkeypatch.setattr(registry, "_FILES", {*registry._FILES, str(module)})  # as register does
    after = keys()
    assert after[0] != before[0] and after[1] != before[1]
    assert KernelSelectionPass("auto", []).uuid() != KernelSelectionPass("inductor", []).uuid()


def test_source_files_are_the_core_and_the_registering_modules():
    files = registry.source_files()
    names = {f.split("/compiler/", 1)[1] for f in files if "/compiler/" in f}
    assert {"core/registry.py", "core/patterns.py", "core/selection_pass.py", "ops/matmul.py",
            "cpu/attention.py", "cpu/onednn.py", "cuda/attention.py",
            "cuda/triton_kernels.py"} <= names
    assert "cpu/host_memory.py" not in names  # registers nothing
    kernels = {pathlib.Path(f).name for f in files if pathlib.Path(f).parent.name == "kernels"}
    assert kernels == {"bias_dropout_add.py", "layer_norm.py", "quick_gelu.py", "swin_fmha.py"}


# --- causal attention on CUDA ---


class _Cuda(torch.Tensor):
    """A meta tensor that says it lives on CUDA, to exercise the CUDA rules without a GPU."""

    @property
    def device(self):
        return torch.device("cuda")


def cuda_qkv(*shape, dtype):
    q = torch.empty(*shape, dtype=dtype, device="meta").as_subclass(_Cuda)
    return {"q": q, "k": q, "v": q}


@pytest.mark.parametrize(
    "shape, dtype, policy, expected, reason",
    [
        ((8, 12, 2048, 64), torch.bfloat16, "auto", "aten",
         "SDPA's flash kernel takes bfloat16 heads of 64"),
        ((8, 12, 256, 64), torch.float16, "auto", "aten",
         "SDPA's flash kernel takes float16 heads of 64"),
        ((8, 12, 256, 64), torch.float32, "auto", "inductor",
         "no flash kernel for it; 256 tokens fit inductor's fused softmax"),
        ((8, 4, 512, 512), torch.bfloat16, "auto", "inductor",
         "no flash kernel for it; 512 tokens fit inductor's fused softmax"),
        ((8, 12, 4096, 64), torch.float32, "auto", "aten",
         "4096 tokens: scores too long for one fused softmax (> 1024)"),
        ((8, 12, 256, 64), torch.float32, "inductor", "aten", "kernels='inductor'"),
        ((8, 12, 256, 64), torch.float32, "accrewrite", "aten", "no accrewrite kernel for it"),
    ],
)
def test_cuda_causal_attention_by_the_rule(shape, dtype, policy, expected, reason):
    implementation, why = select("causal_attention", cuda_qkv(*shape, dtype=dtype), policy)
    assert (implementation.name, why) == (expected, reason)


def test_cuda_causal_attention_that_inductor_cannot_take_stays_sdpas():
    q = cuda_qkv(2, 4, 128, 64, dtype=torch.float32)["q"]
    k = torch.empty(2, 4, 256, 64, device="meta").as_subclass(_Cuda)
    implementation, why = select("causal_attention", {"q": q, "k": k, "v": k}, "auto")
    assert implementation.name == "aten"
    assert why == "inductor does not take it: q [2, 4, 128, 64], k [2, 4, 256, 64] and v " \
        "[2, 4, 256, 64] differ in shape"


@pytest.mark.parametrize("shape", [(1, 1, 1, 8), (2, 3, 17, 24), (1, 2, 130, 40)])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5),
                                        (torch.bfloat16, 2e-2)])
def test_the_written_out_attention_is_sdpas(shape, dtype, tol):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g, dtype=dtype, requires_grad=True) for _ in "qkv")
    out = cuda_attention._written_out(q, k, v)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad),
                         torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(got, want, rtol=tol * 10, atol=tol * 10)

