import libcst as cst

from accrewrite.nodes import dotted, holds, walk
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.toolbox import placement_arguments
from accrewrite.values import read_chains

_SYNCHRONIZE = frozenset({"torch.cuda.synchronize"})
# CUDA's memory statistics: they read 0 where CUDA is not initialised, but these fail without it.
_MEMORY_READS = frozenset(
    f"torch.cuda.{name}"
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_stats")
)
_MEMORY_FAILS = frozenset({"torch.cuda.reset_peak_memory_stats", "torch.cuda.memory_summary", "torch.cuda.mem_get_info"})
_MEMORY = _MEMORY_READS | _MEMORY_FAILS
# CUDA's device, named, described or timed: they fail without CUDA.
_CUDA_ONLY = frozenset({
    "torch.cuda.get_device_name", "torch.cuda.get_device_properties", "torch.cuda.current_device", "torch.cuda.Event",
})
_CURRENT_DEVICE = "torch.cuda.current_device"
# CUDA streams, which prefetchers use to copy the next batch while the step runs.
_STREAMS = frozenset(f"torch.cuda.{name}" for name in ("Stream", "stream", "current_stream", "default_stream"))
# The calls a target's device layer may have under the same names (`device_call`).
_DEVICE_CALLS = _MEMORY | _CUDA_ONLY | {"torch.cuda.empty_cache"}
_FAILS = "It fails where CUDA is absent (a TPU host, PJRT's CPU): remove it, or guard it with torch.cuda.is_available()."
_QUERIES = frozenset({"torch.cuda.is_available", "torch.cuda.device_count"})
_DEVICE_COUNTS = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})
_CUDNN = "torch.backends.cudnn."


class CudaApi(Rule):
    """CUDA runtime calls -> the target's device-agnostic calls, or a diagnostic.

    - `torch.cuda.synchronize()` (timing code, benchmarks) becomes the target's wait for the
      device (`xm.wait_device_ops()`): it raises where CUDA is absent, and on an XLA device it
      would not wait for the device's work.
    - CUDA's memory statistics and device calls (`torch.cuda.memory_allocated()`,
      `max_memory_allocated()`, `memory_reserved()`, `max_memory_reserved()`, `memory_stats()`,
      `reset_peak_memory_stats()`, `memory_summary()`, `empty_cache()`, `mem_get_info()`,
      `current_device()`, `get_device_name()`, `get_device_properties()`, and
      `torch.cuda.Event(enable_timing=True)` for timing) become the same call of the target's
      device layer where it has one (`runtime`: `accrt.accelerator.max_memory_allocated()`,
      ...): CUDA's own on CUDA; on the CPU, the process's resident memory, the host's name,
      memory and processors, its one device, and events that take the host's time, where
      torch.cuda's read 0 (the statistics), raise (`reset_peak_memory_stats`, `memory_summary`,
      `mem_get_info`, `current_device`, `get_device_name`, `get_device_properties`, `Event`) or
      do nothing. `torch.cuda.current_device()` where it names the device (`device=...`,
      `.cuda(...)`) is left to ACC002, which makes it the target's device.
    - On a target whose device is not a CUDA device (torchacc, torch_xla), these are reported,
      not changed, because they no longer describe the training device:
      `torch.cuda.memory_allocated()`/`max_memory_allocated()`/`memory_reserved()`... (0
      where CUDA is not initialised; `reset_peak_memory_stats()`, `memory_summary()` and
      `mem_get_info()` fail without CUDA; the device's memory is `xm.get_memory_info(device)`),
      `torch.cuda.current_device()`, `get_device_name()`, `get_device_properties()` and
      `torch.cuda.Event()` (they fail without CUDA), CUDA streams (`torch.cuda.Stream()`,
      `torch.cuda.stream(...)`, `current_stream()`: a prefetcher's side stream, which the
      target's device loader replaces),
      `torch.cuda.is_available()`/`device_count()` outside the device selection that
      ACC002 rewrites (False/0 on TPU or CPU hosts, where the code they gate takes its CPU path),
      and `torch.backends.cudnn.*` settings (no effect: the target does not run cuDNN).
      On `runtime`, which trains on CUDA itself where CUDA is present, the queries and cuDNN
      settings are right as they are.
    - `torch.cuda.device_count()` and `torch.accelerator.device_count()` count the devices a
      script runs a process on (`world_size = torch.cuda.device_count()` before `mp.spawn`,
      `if torch.cuda.device_count() < 2: sys.exit(...)`). They become the target's count of
      the devices the job trains on (`xr.global_runtime_device_count()`: on `runtime` CUDA's
      count, torchrun's processes, or `CPU_NUM_DEVICES` on the CPU). Where the target's
      launcher owns the devices (torch_xla's `torch_xla.launch` refuses to start once its
      runtime has been asked anything), a count in the launching process, before the launch,
      is left as it is and reported; the launched processes read the target's count (ACC004).
    """

    code = "ACC010"
    name = "cuda-api"
    summary = "torch.cuda.synchronize/memory_allocated/is_available, torch.backends.cudnn.* -> target calls or a diagnostic"
    concepts = ("synchronize",)
    triggers = frozenset({
        "synchronize", "is_available", "device_count", "cudnn",
        *(name.rpartition(".")[2] for name in _DEVICE_CALLS | _STREAMS),
    })
    examples = (
        Example(  # a prefetcher's side stream: reported on the XLA targets
            target="torch_xla",
            before="""
            import torch

            class Prefetcher:
                def __init__(self, loader):
                    self.loader, self.stream = iter(loader), torch.cuda.Stream()

                def next(self):
                    with torch.cuda.stream(self.stream):
                        batch = next(self.loader).cuda(non_blocking=True)
                    torch.cuda.current_stream().wait_stream(self.stream)
                    return batch
            """,
            diagnostics=("ACC010:5", "ACC010:8", "ACC010:10"),
        ),
        Example(
            before="""
            import time
            import torch

            torch.cuda.synchronize()
            t0 = time.time()
            """,
            after="""
            import time
            import torch
            import accrewrite.runtime.xla_model as xm

            xm.wait_device_ops()
            t0 = time.time()
            """,
        ),
        Example(
            before="""
            import torch

            for epoch in range(epochs):
                torch.cuda.reset_peak_memory_stats()
                train_one_epoch(model, loader)
                print(f"max mem {torch.cuda.max_memory_allocated() / 2**20:.0f} MB")
            """,
            after="""
            import torch
            import accrewrite.runtime as accrt

            for epoch in range(epochs):
                accrt.accelerator.reset_peak_memory_stats()
                train_one_epoch(model, loader)
                print(f"max mem {accrt.accelerator.max_memory_allocated() / 2**20:.0f} MB")
            """,
        ),
        Example(
            before="""
            import torch

            properties = torch.cuda.get_device_properties(torch.cuda.current_device())
            if properties.total_memory < 40 * 2**30:
                args.batch_size //= 2
            mask = torch.ones(8, device=torch.cuda.current_device())
            """,
            after="""
            import torch
            import accrewrite.runtime as accrt

            properties = accrt.accelerator.get_device_properties(accrt.accelerator.current_device())
            if properties.total_memory < 40 * 2**30:
                args.batch_size //= 2
            mask = torch.ones(8, device=torch.cuda.current_device())
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            torch.backends.cudnn.benchmark = True
            for batch in loader:
                loss = step(batch)
                torch.cuda.synchronize(device)
                peak = torch.cuda.max_memory_allocated() / 2**30
            """,
            after="""
            import torch
            import torch_xla.core.xla_model as xm

            torch.backends.cudnn.benchmark = True
            for batch in loader:
                loss = step(batch)
                xm.wait_device_ops()
                peak = torch.cuda.max_memory_allocated() / 2**30
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            """,
            after="""
            import torch
            import torchacc.torch_xla.core.xla_model as xm

            if torch.cuda.is_available():
                xm.wait_device_ops()
            """,
        ),
        Example(
            before="""
            import sys
            import torch

            if torch.cuda.device_count() < 2:
                sys.exit("this example needs 2 GPUs")
            """,
            after="""
            import sys
            import torch
            import accrewrite.runtime.xla_runtime as xr

            if xr.global_runtime_device_count() < 2:
                sys.exit("this example needs 2 GPUs")
            """,
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Depth inside device-selection expressions (ACC002's): nothing is reported there.
        self._selecting = 0
        # ``torch.cuda.current_device()`` calls that name a device, which ACC002 replaces: those
        # in a device variable's value, and those found as the walk reaches the calls they are
        # arguments of.
        self._asks_current_device = _CURRENT_DEVICE in ctx.facts.file.called
        self._placing: set[cst.Call] = set()
        if self._asks_current_device:
            for value in ctx.facts.device_values:
                self._placing.update(self._current_devices_in(value))

    def _selects_device(self, node) -> bool:
        facts = self.ctx.facts
        return node in facts.device_values or facts.is_cuda_device(node)

    def visit_IfExp(self, node) -> None:
        self._selecting += self._selects_device(node)

    def leave_IfExp(self, original_node, updated_node):
        self._selecting -= self._selects_device(original_node)
        return updated_node

    def visit_Call(self, node) -> None:
        self._selecting += self._selects_device(node)
        if self._asks_current_device:
            self._placing.update(self._current_devices_placing(node))

    def _current_devices_placing(self, call: cst.Call) -> list[cst.Call]:
        """The ``torch.cuda.current_device()`` calls that name where ``call`` puts tensors
        (``torch.ones(n, device=torch.cuda.current_device())``, ``f"cuda:{...}"``), which ACC002
        makes the target's device whole."""
        facts = self.ctx.facts
        found = []
        for value in placement_arguments(facts, call):
            if isinstance(value, cst.Call) and facts.file.qualname(value.func) == _CURRENT_DEVICE:
                found.append(value)
            elif facts.is_cuda_device(value):
                found += self._current_devices_in(value)
        return found

    def _current_devices_in(self, value: cst.BaseExpression) -> list[cst.Call]:
        found = []
        walk(value, lambda node: found.append(node) if isinstance(node, cst.Call)
             and self.ctx.facts.file.qualname(node.func) == _CURRENT_DEVICE else None)
        return found

    def leave_Call(self, original_node, updated_node):
        self._selecting -= self._selects_device(original_node)
        if original_node in self._placing:
            return updated_node
        callee = self.ctx.facts.file.qualname(original_node.func)
        if callee in _SYNCHRONIZE:
            self.ctx.fix(original_node, "torch.cuda.synchronize() -> the target's wait for the device")
            return self.ctx.expr("synchronize")
        if callee in _DEVICE_COUNTS and self.ctx.target.has("device_count") and not self._selecting:
            return self._device_count(original_node, updated_node, callee)
        if callee in _DEVICE_CALLS and self.ctx.target.has("device_call"):
            replacement = self.ctx.expr("device_call", name=callee.rpartition(".")[2])
            self.ctx.fix(original_node, f"{callee}() -> {self.ctx.code(replacement)}(), for the device the target trains on")
            return updated_node.with_changes(func=replacement)
        if not self.ctx.target.has("device_type"):
            return updated_node
        if callee in _MEMORY:
            memory = self.ctx.concept("memory_info").render_expr(device="device")
            runs = _FAILS if callee in _MEMORY_FAILS else "It reads 0 where CUDA is not initialised; left as it is."
            self.ctx.diagnose(
                original_node,
                f"{callee}() measures CUDA's memory, not this target's device",
                f"{runs} For device memory use {memory}.",
            )
        elif callee in _CUDA_ONLY:
            self.ctx.diagnose(original_node, f"{callee}() needs a CUDA device, which this target's device is not", _FAILS)
        elif callee in _STREAMS:
            self.ctx.diagnose(
                original_node, f"{callee}() is a CUDA stream, which this target's device has not",
                "It fails where CUDA is absent (a TPU host, PJRT's CPU). A prefetcher that copies the next batch on "
                "a side stream is what the target's device loader does: drop the stream (and its `with` block's "
                "context), or use the loader plainly on this target.",
            )
        elif callee in _QUERIES and not self._selecting:
            self.ctx.diagnose(
                original_node,
                f"{callee}() describes CUDA, not this target's device",
                "It is False/0 on TPU or CPU hosts, so the code it gates takes its CPU path there; left as "
                "it is. If it chooses the device or CUDA-only features, decide by the target device instead.",
            )
        return updated_node

    def _device_count(self, call: cst.Call, updated_node: cst.Call, callee: str):
        ctx = self.ctx
        if ctx.facts.in_launcher(ctx.scopes) and ctx.target.has("spawn_owns_devices"):
            if not self._tested(call):
                return updated_node  # it sizes the spawn, whose processes count again (ACC004)
            launcher = ctx.concept("spawn").render_expr()
            ctx.diagnose(
                call, f"{callee}() counts CUDA devices before {launcher}: left as it is",
                f"{launcher} starts one process per device and refuses to once the launching process has asked "
                f"for a device or a device count, so the count cannot be asked here. The launched processes "
                f"read it ({ctx.concept('device_count').render_expr()}); a check on this one (enough GPUs?) "
                "fails where there is no CUDA: move it into the launched function.",
            )
            return updated_node
        ctx.fix(call, f"{callee}() -> the target's count of the devices the job trains on")
        return ctx.expr("device_count")

    def _tested(self, call: cst.Call) -> bool:
        """Whether a count is compared (``assert n_gpus >= 2``), itself or through the name the
        statement assigns it to, in the function (or module) that holds it."""
        statement = self.ctx.statement
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        names = {dotted(t.target) for t in small.targets} if isinstance(small, cst.Assign) and small.value is call else set()
        found = False

        def enter(node):
            nonlocal found
            if isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node is not self.ctx.scope:
                return False
            if isinstance(node, cst.Comparison) and (names & read_chains(node) or holds(node, call)):
                found = True
            return not found

        walk(self.ctx.scope or self.ctx.module, enter)
        return found

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if not self.ctx.target.has("device_type"):
            return updated_node
        for small in original_node.body:
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
                targets = [small.target]
            else:
                continue
            for target in targets:
                name = self.ctx.facts.file.qualname(target) if dotted(target) else None
                if name and name.startswith(_CUDNN):
                    self.ctx.diagnose(
                        original_node,
                        f"{excerpt(name, 50)} has no effect on this target",
                        "The target does not run cuDNN; left as it is. Remove it, or keep it for the "
                        "script's CUDA path.",
                    )
        return updated_node
