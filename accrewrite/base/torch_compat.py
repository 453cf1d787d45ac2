"""The torch private names the runtime and the kernels rely on, in one place, so that a torch
upgrade that moves them breaks here and nowhere else.

Supported torch: from ``SUPPORTED[0]`` up to, not including, ``SUPPORTED[1]`` (what the
compiler's passes and the parallel layouts are tested with); ``check_version`` says why a
version is not. Each name loads on first use, so that the parallel layouts do not load inductor
and the compiler does not load torch.distributed.
"""

import contextlib
import functools
import importlib
from types import MappingProxyType

import torch

SUPPORTED = ((2, 13), (2, 14))

# name: "module:attribute" (or "module" for the module itself)
_NAMES = MappingProxyType({
    # graph capture and lowering (compiler/backend.py, compiler/core)
    "register_backend": "torch._dynamo:register_backend",
    "dynamo_utils": "torch._dynamo.utils",
    "dynamo_explain": "torch._dynamo:explain",
    "TracingContext": "torch._guards:TracingContext",
    "functorch_config": "torch._functorch.config",
    "inductor_config": "torch._inductor.config",
    "list_mode_options": "torch._inductor:list_mode_options",
    "compile_fx": "torch._inductor.compile_fx:compile_fx",
    "compile_fx_inner": "torch._inductor.compile_fx:compile_fx_inner",
    "pattern_matcher": "torch._inductor.pattern_matcher",
    "CustomGraphPass": "torch._inductor.custom_graph_pass:CustomGraphPass",
    "CustomInferenceAwareGraphPass":
        "torch._inductor.custom_graph_pass:CustomInferenceAwareGraphPass",
    "get_hash_for_files": "torch._inductor.custom_graph_pass:get_hash_for_files",
    "early_patterns": "torch._inductor.fx_passes.joint_graph:early_patterns",
    "remove_noop_ops": "torch._inductor.fx_passes.post_grad:remove_noop_ops",
    "FakeTensor": "torch._subclasses.fake_tensor:FakeTensor",
    "FakeTensorMode": "torch._subclasses.fake_tensor:FakeTensorMode",
    "unset_fake_temporarily": "torch._subclasses.fake_tensor:unset_fake_temporarily",
    "inductor_cache_dir": "torch._inductor.runtime.cache_dir_utils:cache_dir",
    # inductor's C++ builds (compiler/cpu/cpp_library.py)
    "async_compile": "torch._inductor.async_compile",
    "CppPythonBindingsCodeCache": "torch._inductor.codecache:CppPythonBindingsCodeCache",
    # optimizers with a fused step (compiler/frontend.py)
    "fused_kernel_devices": "torch.utils._foreach_utils:_get_fused_kernels_supported_devices",
    # the step counts of a bucket of parameters, in one launch (kernels/adam.py)
    "foreach_add_": "torch:_foreach_add_",
    # nested containers' tensors, and ops intercepted as they dispatch (activation_checkpoint.py, utils/misc.py)
    "tree_leaves": "torch.utils._pytree:tree_leaves",
    "tree_flatten": "torch.utils._pytree:tree_flatten",
    "TorchDispatchMode": "torch.utils._python_dispatch:TorchDispatchMode",
    # A DTensor placement for a dimension split into ``split_factor`` equal parts, each sharded
    # across the mesh: the layout of a fused q/k/v projection split by attention head (parallel/).
    "StridedShard": "torch.distributed.tensor.placement_types:_StridedShard",
    # DCP's flat keys of a nested state dict, as in a checkpoint's metadata (parallel/checkpoint.py)
    "flatten_state_dict": "torch.distributed.checkpoint._nested_dict:flatten_state_dict",
    # the default process group's key-value store, where xm.send/recv find their peer
    "default_store": "torch.distributed.distributed_c10d:_get_default_store",
    # the base of BatchNorm1d/2d/3d and SyncBatchNorm, which convert_sync_batchnorm converts, and
    # the out-of-tree device that torch's SyncBatchNorm also runs on (nn/sync_batch_norm.py)
    "BatchNormBase": "torch.nn.modules.batchnorm:_BatchNorm",
    "privateuse1_backend_name": "torch._C:_get_privateuse1_backend_name",
})


def __getattr__(name):
    try:
        module, _, attribute = _NAMES[name].partition(":")
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = importlib.import_module(module)
    value = getattr(value, attribute) if attribute else value
    globals()[name] = value  # loaded once
    return value


@contextlib.contextmanager
def own_compile_metrics():
    """A compilation inside another's (autotuning's) records its metrics apart: dynamo keeps
    one record per thread and refuses a metric set twice in it."""
    utils = importlib.import_module("torch._dynamo.utils")
    local = utils._metrics_context_tls
    outer = getattr(local, "metrics_context", None)
    local.metrics_context = utils.MetricsContext(on_exit=utils.record_compilation_metrics)
    try:
        yield
    finally:
        if outer is None:
            del local.metrics_context
        else:
            local.metrics_context = outer


def backend_plugins() -> dict:
    """The torch.distributed backends that packages registered (``Backend.register_backend``),
    by upper-case name, each with its ``creator_fn`` and ``extended_api``."""
    return importlib.import_module("torch.distributed").Backend._plugins


def builtin_backend(name: str, store, rank: int, size: int, timeout):
    """Backend ``name`` built into torch with an options object (nccl, xccl), made as
    ``init_process_group`` makes it: the timeout goes in the options' private ``_timeout``."""
    group = getattr(importlib.import_module("torch.distributed"), f"ProcessGroup{name.upper()}", None)
    if group is None:
        raise RuntimeError(f"torch.distributed has no {name!r} backend in this build of torch")
    options = group.Options()
    options._timeout = timeout
    return group(store, rank, size, options)


@functools.cache  # read once: the optimizer asks at every step
def dtensor_class():
    """``DTensor``, or None where torch is built without torch.distributed."""
    if not importlib.import_module("torch.distributed").is_available():
        return None
    return importlib.import_module("torch.distributed.tensor").DTensor


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor itself (``to_local()`` gives a view through autograd), so that an
    in-place update of it updates the DTensor."""
    return tensor._local_tensor


def reshape_mesh(mesh, shape: tuple[int, ...], names: tuple[str, ...]):
    """DeviceMesh ``mesh``'s ranks, in its order, as a mesh of ``shape`` with dims ``names``
    (``DeviceMesh._flatten``, where it has several dims, then ``_unflatten``; collective: every
    rank calls it)."""
    flat = mesh if mesh.ndim == 1 else mesh._flatten("_".join(mesh.mesh_dim_names))
    return flat._unflatten(0, shape, names)


class _Ring:
    """torch's ring attention engine (``torch.distributed.tensor.experimental._context_parallel``):
    ``forward(group, seq_dim, op, q, k, v, is_causal=, **op_kwargs)`` gives ``(out, logsumexp,
    *rest)`` of an SDPA kernel ``op`` run over the keys and values of each rank of ``group``;
    ``backward(group, seq_dim, op, grad_out, grad_out_name, q, k, v, out, logsumexp, is_causal,
    **op_kwargs)`` the gradients of q, k and v. ``load_balanced(on)`` sets, for the calls inside
    it, whether the sequence is laid out head-tail (torch's one global option, which its ring
    reads at each call)."""

    def __init__(self, module):
        self.forward = module._templated_ring_attention
        self.backward = module._templated_ring_attention_backward
        self._options = module._cp_options

    @contextlib.contextmanager
    def load_balanced(self, on: bool):
        before = self._options.enable_load_balance
        self._options.enable_load_balance = on
        try:
            yield
        finally:
            self._options.enable_load_balance = before


_RING_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"


@functools.cache
def ring_attention() -> _Ring:
    """torch's ring attention (``_Ring``); raises saying what to give instead where this torch
    has it elsewhere or not at all."""
    try:
        return _Ring(importlib.import_module(_RING_MODULE))
    except (ImportError, AttributeError) as error:
        raise RuntimeError(f"ring attention runs on torch's own ring ({_RING_MODULE}: _templated_ring_attention, "
                           f"_templated_ring_attention_backward, _cp_options), which torch {torch.__version__} does "
                           f"not have ({error}); use config.dist.sp.mode = \"ulysses\"") from None


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as "2.13.0+cpu"."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_version(version: str = torch.__version__) -> str | None:
    """Why torch ``version`` is outside the supported range, or None."""
    low, high = SUPPORTED
    if low <= version_tuple(version) < high:
        return None
    return (
        f"torch {version} is outside the range the runtime is tested with "
        f"(>= {low[0]}.{low[1]}, < {high[0]}.{high[1]})"
    )


def trace_forward(module: torch.nn.Module, is_leaf, inputs=None) -> "torch.fx.Graph":
    """``module.forward`` as a torch.fx graph traced without inputs, the submodules for which
    ``is_leaf(submodule, default)`` holds kept as calls (``default``: fx's own choice, torch.nn's
    modules). Arguments with a default are fixed to it, but those named in ``inputs``: the plain
    path is traced, not the branches taken on a mask's dtype. torch.nn's transformer layers pick their inference fast
    path from the input's shape, which a symbolic trace cannot read: the fast path is off while
    tracing (raises what fx raises on code it cannot trace)."""
    import inspect

    import torch.fx

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m, qualified_name):
            return is_leaf(m, super().is_leaf_module(m, qualified_name))

    parameters = inspect.signature(module.forward).parameters.values()
    given = set(inputs or ())
    fixed = {p.name: p.default for p in parameters
             if p.default is not inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD and p.name not in given}
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        return Tracer().trace(module, concrete_args=fixed)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


__all__ = [
    *_NAMES, "SUPPORTED", "backend_plugins", "builtin_backend", "check_version", "dtensor_class",
    "local_shard", "own_compile_metrics", "ring_attention", "trace_forward", "version_tuple",
]
