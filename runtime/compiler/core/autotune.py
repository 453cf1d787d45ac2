"""kernels="autotune": time the implementations that take a match on its shapes, keep the
fastest, and remember it per machine and shape (RAF's dialect dispatch measured, not guessed).

Each implementation runs on random tensors of the match's shapes: its kernel, or for the op's
default implementation the op's PyTorch reference (what the graph has), compiled by inductor
where the implementation is inductor's code; forward and, for a training graph, backward; the
fastest of ``_RUNS`` runs after a warm-up (on a shared machine the others wait their turns).
The times go to a JSON file (``ACCREWRITE_AUTOTUNE_CACHE``, else ``autotune.json`` in inductor's
cache directory) under a key of the machine, the op, its arguments' shapes and dtypes and the
phase, so that a later compile on this machine reads them instead of timing again.
"""

import contextlib
import inspect
import json
import os
import pathlib
import platform
import time
import types

import torch

from accrewrite.base import torch_compat as compat
from accrewrite.base import accelerator

ENV = "ACCREWRITE_AUTOTUNE_CACHE"
_RUNS = 7


def fastest(op, implementations, args: dict, training: bool):
    """(the fastest of ``implementations`` of ``op`` on ``args``, why), or None where the shapes
    are symbolic (then the cost rules decide)."""
    # the op's arguments only: a match's may hold more (the incoming gradient of a joint graph)
    args = {name: args[name] for name in inspect.signature(op.reference).parameters if name in args}
    if not all(_concrete(value) for value in args.values()):
        return None
    key = _key(op, args, training)
    cache = _read()
    times = cache.get(key, {})
    names = [i.name for i in implementations]
    cached = all(name in times for name in names)
    if not cached:
        for implementation in implementations:
            times[implementation.name] = _time(op, implementation, args, training)
        cache[key] = times
        _write(cache)
    best = min(implementations, key=lambda i: times[i.name])
    measured = ", ".join(f"{name} {times[name] * 1e3:.3g} ms" for name in names)
    return best, f"autotuned{' (cached)' if cached else ''}: {measured}"


def cache_path() -> pathlib.Path:
    if os.environ.get(ENV):
        return pathlib.Path(os.environ[ENV])
    return pathlib.Path(compat.inductor_cache_dir()) / "autotune.json"


def _concrete(value) -> bool:
    if isinstance(value, torch.Tensor):
        return all(isinstance(size, int) for size in value.shape)
    return not isinstance(value, torch.SymInt | torch.SymFloat)


def _key(op, args: dict, training: bool) -> str:
    described = [
        f"{name}={list(v.shape)}:{str(v.dtype).removeprefix('torch.')}:{v.device.type}"
        if isinstance(v, torch.Tensor) else f"{name}={v!r}"
        for name, v in sorted(args.items())
    ]
    phase = "training" if training else "inference"
    return f"{_machine()}|torch {torch.__version__}|{op.name}|{' '.join(described)}|{phase}"


def _machine() -> str:
    kind = accelerator.device_type()
    name = getattr(torch.get_device_module(kind), "get_device_name", None)  # cuda, xpu, hpu
    if kind != "cpu" and name is not None:
        return name()
    return f"{platform.machine()} {platform.processor() or _cpu_model()} x{os.cpu_count()}"


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _read() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _write(cache: dict) -> None:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(cache, indent=1, sort_keys=True))
    temporary.replace(path)  # a concurrent reader sees the old file or the new, whole


def _time(op, implementation, args: dict, training: bool) -> float:
    """The time in seconds of one run of ``implementation`` on tensors like ``args``."""
    # This runs inside the compilation of a graph: inductor compiles what it times without the
    # passes that compilation set (which would autotune the same op again), on real tensors.
    passes = dict(joint_custom_pre_pass=None, post_grad_custom_post_pass=None)
    with (
        compat.inductor_config.patch(passes),
        compat.own_compile_metrics(),
        compat.unset_fake_temporarily(),
        torch.enable_grad(),
    ):
        # an op found as a node is in a forward or backward graph: that node alone is timed
        backward = training and op.nodes is None
        real = {name: _like(value, backward) for name, value in args.items()}
        function = implementation.kernel or op.reference
        if implementation.generated:
            function = _compiled(function)
        on_device = accelerator.on_accelerator(real[op.input].device)
        sync = accelerator.synchronize if on_device else lambda: None

        def run():
            out = function(**real)
            out = out[0] if isinstance(out, tuple | list) else out
            if backward and out.requires_grad:
                out.backward(torch.ones_like(out))
            sync()

        run()  # warm-up (and, for inductor, compilation)
        times = []
        for _ in range(_RUNS):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    return min(times)


def _compiled(reference):
    """``reference`` compiled by inductor alone: the code the graph would run for the op. On a
    copy of its code, which dynamo's compiled code and recompilation count are kept with, so
    that timing an op at many shapes does not run into dynamo's recompilation limit."""
    copy = types.FunctionType(
        reference.__code__.replace(), reference.__globals__, reference.__name__,
        reference.__defaults__, reference.__closure__,
    )
    return torch.compile(copy, backend="inductor", dynamic=False)


def _like(value, training: bool):
    """A real tensor like the fake ``value`` (random floats; integers 0, a valid index), or
    ``value`` itself."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point():
        tensor = torch.randn(value.shape, dtype=value.dtype, device=value.device)
        return tensor.requires_grad_(training)
    return torch.zeros(value.shape, dtype=value.dtype, device=value.device)
