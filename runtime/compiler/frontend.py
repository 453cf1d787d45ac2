"""``accrewrite.runtime.compile``: what migrated scripts call on their model (rule ACC011)."""

import weakref

import torch
from torch import nn

from accrewrite.base import torch_compat as compat
from accrewrite.runtime.blocks import repeated_blocks
from accrewrite.runtime.compiler.backend import Backend, CompileReport
from accrewrite.runtime.compiler.core.regional import CompiledCalls, batch_norm_blocks, block_names
from accrewrite.runtime.compiler.cpu import host_memory as host_memory_cache

_REGIONAL = ("auto", True, False)
_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_reports: "weakref.WeakKeyDictionary[object, CompileReport]" = weakref.WeakKeyDictionary()


def compile(
    model,
    *,
    regional="auto",
    mode="default",
    dynamic=None,
    memory_budget=None,
    kernels="auto",
    host_memory=None,
):
    """Compile ``model`` (an ``nn.Module``) in place with the ``"accrewrite"`` backend and return
    it; its forward is compiled, and its backward through AOTAutograd. The module keeps its
    class, attributes and ``state_dict`` keys, so checkpoints move between the eager and the
    compiled model unchanged.

    ``regional``: "auto" compiles by region when the model has repeated blocks
    (``nn.ModuleList``/``nn.Sequential`` of one class) that hold no batch norm (see
    ``regional.batch_norm_blocks``): the whole forward is one captured graph, whose blocks are
    compiled once per block class and whose other code is compiled around them (see
    ``regional.py``); else the whole graph is compiled at once. True requires repeated blocks;
    False compiles the whole graph at once. ``mode`` and ``dynamic`` are ``torch.compile``'s.
    ``memory_budget``: None or a fraction in [0, 1] of the activation memory the compiled
    training graph may keep (see ``core/memory_budget.py``). ``kernels``: how each op the compiler
    knows (``ops/``, the kernels' ``COMPILER_OP``) gets its implementation
    (``core/selection.py``): "auto" by the implementations' cost rules for the device and shape,
    "autotune" by timing them on the shapes compiled (once per machine and shape), "accrewrite"
    always by accrewrite's kernels where one takes the op, "inductor" never by them.

    An optimizer (``torch.optim.Optimizer``) may be passed instead of a model, right after it is
    built, so that the optimizer step is not left to per-parameter eager loops: Adam, AdamW and
    SGD switch to their fused implementation, others get their ``step`` compiled.
    ``compile_report(model)`` tells what was compiled and chosen.

    ``host_memory``: True turns on the host memory cache for a model on the CPU
    (``cpu/host_memory.py``): the process keeps the memory its steps free for the next ones
    instead of faulting it in again each step, as CUDA's caching allocator does on a GPU. It is
    a setting of the whole process, so it is opt-in; None leaves it to
    ``ACCREWRITE_HOST_MEMORY_CACHE=1``.
    """
    if regional not in _REGIONAL:
        raise ValueError(f"regional={regional!r}: expected 'auto', True or False")
    if mode not in _MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(_MODES)}")
    if dynamic not in (None, True, False):
        raise ValueError(f"dynamic={dynamic!r}: expected None, True or False")
    if host_memory not in (None, True, False):
        raise ValueError(f"host_memory={host_memory!r}: expected None, True or False")
    if isinstance(model, torch.optim.Optimizer):
        backend = Backend(mode=mode, kernels=kernels, memory_budget=memory_budget)
        return _compile_optimizer(model, backend, dynamic)
    if not isinstance(model, nn.Module):
        raise TypeError(
            "compile() expects an nn.Module or a torch.optim.Optimizer, "
            f"got {type(model).__name__}"
        )

    found = repeated_blocks(model) if regional is not False else []
    if regional is True and not found:
        raise ValueError(
            f"regional=True but {type(model).__name__} has no repeated blocks (an nn.ModuleList or "
            "nn.Sequential of two or more modules of one class); use regional='auto' or False"
        )
    with_batch_norm = batch_norm_blocks(found) if regional == "auto" else []
    backend = Backend(
        mode=mode,
        kernels=kernels,
        memory_budget=memory_budget,
        blocks=block_names([] if with_batch_norm else found),
    )
    if with_batch_norm:
        backend.report.notes.append(
            f"regional='auto': whole model compiled, its blocks ({', '.join(with_batch_norm)}) "
            "hold batch norm, which steps slower compiled by region"
        )
    if host_memory_cache.requested(host_memory) and _on_cpu(model):
        not_cached = host_memory_cache.cache_host_memory()
        backend.report.notes.append(
            f"host memory cache off: {not_cached}" if not_cached
            else "host memory cache on: each step reuses the host memory the last one freed"
        )
    CompiledCalls(backend=backend, dynamic=dynamic).install(model)
    _reports[model] = backend.report
    return model


def _on_cpu(model: nn.Module) -> bool:
    return any(t.device.type == "cpu" for t in (*model.parameters(), *model.buffers()))


# torch.optim classes with a fused implementation (one kernel per parameter group and step).
_FUSABLE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def _compile_optimizer(optimizer, backend, dynamic):
    """Make the whole optimizer step run as few kernels as possible.

    Adam, AdamW and SGD have fused implementations (``fused=True``: one kernel for a whole
    parameter group, CPU and CUDA); switching to it gives the step a compiled step's speed
    without its cold start, which grows with the number of parameters (minutes for a small GPT
    on 2 CPU cores). Other optimizers get their ``step`` compiled with the accrewrite backend.
    """
    if _can_fuse(optimizer):
        for settings in (optimizer.defaults, *optimizer.param_groups):
            settings.update(fused=True, foreach=False)
        optimizer._step_supports_amp_scaling = True  # as the constructor sets for fused=True
        backend.report.notes.append(f"{type(optimizer).__name__}: fused step, not compiled")
    else:
        # The instance attribute shadows the class's step; schedulers that wrap it wrap this.
        optimizer.step = torch.compile(optimizer.step, backend=backend, dynamic=dynamic)
    _reports[optimizer] = backend.report
    return optimizer


def _can_fuse(optimizer) -> bool:
    devices = compat.fused_kernel_devices()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return (
        type(optimizer) in _FUSABLE
        and not optimizer.state  # the fused step keeps its state as the constructor sets it up
        and not any(group.get("differentiable") for group in optimizer.param_groups)
        and all(p.is_floating_point() and p.device.type in devices for p in params)
    )


def compile_report(compiled) -> CompileReport:
    """What ``compile`` did for ``compiled`` (a model or optimizer it returned): the graphs
    compiled so far (compilation happens at the first call) and the kernel-selection matches."""
    try:
        return _reports[compiled]
    except KeyError:
        raise ValueError(
            f"{type(compiled).__name__} was not compiled by accrewrite.runtime.compile"
        ) from None
