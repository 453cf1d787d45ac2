"""Compiling modules in place, and regional compilation inside one graph (as Accelerate's regional compilation).

A transformer spends most of its compile time tracing and optimising N copies of one block.
Regional compilation compiles one block of each repeated kind and runs every copy on that code.

Accelerate's ``compile_regions`` gets there by compiling each block's forward on its own and
leaving the code around the blocks (embeddings, head, loss) eager, where a step pays the most
for the lack of fusion: on a 4-block GPT on CPU it stepped at 1.06x a full ``torch.compile``.
Here dynamo captures the whole forward as one graph (tracing is cheap next to compiling) and
the backend splits that graph where the repeated blocks begin and end (:func:`compile_by_region`):

- each block is a region; regions of one structure, same operations on inputs of the same
  shapes, are compiled once and run on one compiled function, so the compiled code is per block
  class, not per instance;
- the code between blocks is compiled too where it holds a matmul, convolution or attention (a
  model's head and loss); other glue (an embedding lookup plus a position table) runs as traced,
  since compiling it costs more at the first step than it saves.

Not ``torch.compiler.nested_compile_region``, which would keep the whole model in one graph
with each block class traced once: with inductor (torch 2.13, CPU) it gives a GPT block wrong
gradients (21 of its model's 26 parameter gradients differ from eager's, where the
``aot_eager`` backend agrees with eager). Inductor's buffer reuse is the cause
(``allow_buffer_reuse=False`` makes them right), and even then its cold start on a 12-block GPT
was 0.6x a full compile's.
"""

import contextlib
import dataclasses
import functools
import types
import unittest.mock

import torch
from torch import fx, nn
from torch.fx.passes.split_module import split_module
from torch.utils.flop_counter import FlopCounterMode

from accrewrite.base import torch_compat as compat


def call_module(module: nn.Module, *args, **kwargs):
    """The frame that gets compiled for a module: calling it, hooks included.

    ``nn.Module.compile`` compiles ``module._call_impl`` itself, and dynamo does not trace a
    top-level frame inside torch.nn, so a built-in model (an ``nn.Sequential`` of layers) would
    silently stay eager. This frame is user code for dynamo, which inlines the call below; and
    since the module is an argument, one compiled function serves every module of one class.
    """
    return module._call_impl(*args, **kwargs)


class CompiledCalls:
    """``torch.compile`` of :func:`call_module`, one per module class, installed on modules.

    Dynamo keeps its compiled code, and counts recompilations against its limit of 8, per code
    object. Each class therefore gets its own copy of ``call_module``'s code, named after the
    class (it reads well in dynamo's logs), so that models of different classes do not use up
    each other's recompilations.
    """

    def __init__(self, **compile_kwargs):
        self._compile_kwargs = compile_kwargs
        self._by_class = {}

    def install(self, module: nn.Module) -> None:
        """Make ``module(...)`` run compiled, keeping the module object, its class and its
        state_dict keys."""
        cls = type(module)
        if cls not in self._by_class:
            name = f"call_{cls.__name__}"
            code = call_module.__code__.replace(co_name=name, co_qualname=name)
            fn = types.FunctionType(code, call_module.__globals__, code.co_name)
            self._by_class[cls] = torch.compile(fn, **self._compile_kwargs)
        module._compiled_call_impl = functools.partial(self._by_class[cls], module)


def batch_norm_blocks(found: list[tuple[str, nn.Module]]) -> list[str]:
    """The names of the repeated-block containers in ``found`` (``repeated_blocks``) whose
    blocks hold batch norm layers.

    In a block's graph of its own, inductor's kernel for training-mode batch norm statistics
    took 7.6 ms a call for a small ResNet on CPU, against 1.4 ms for the same work inside the
    whole-model graph: compiled by region, the model stepped at 1.38x a full compile (1.21x
    eager). So ``regional="auto"`` compiles such models whole.
    """
    return [
        name
        for name, container in found
        if any(isinstance(layer, nn.modules.batchnorm._BatchNorm) for layer in container.modules())
    ]


def block_names(found: list[tuple[str, nn.Module]]) -> dict[str, str]:
    """Each block of the containers in ``found`` by its qualified name, with its class name."""
    return {
        f"{name}.{child}" if name else child: type(block).__name__
        for name, container in found
        for child, block in container.named_children()
    }


@dataclasses.dataclass
class Region:
    """One compiled region: the blocks (qualified names) that run its compiled code."""

    cls: str
    blocks: list[str]

    def __str__(self):
        first, last = self.blocks[0], self.blocks[-1]
        blocks = first if first == last else f"{first} .. {last}"
        return f"region: {len(self.blocks)} {self.cls} ({blocks}) on one compiled graph"


class RegionCache:
    """The regions compiled for one model, by structure, kept across its dynamo graphs (a
    recompilation or a graph break gives more graphs, whose blocks reuse the same code)."""

    def __init__(self, blocks: dict[str, str]):
        self.blocks = blocks
        self.compiled: dict[object, tuple] = {}  # structure -> (compiled function, Region)


def compile_by_region(gm: fx.GraphModule, example_inputs, cache: RegionCache, compile_graph,
                      report) -> fx.GraphModule:
    """Compile dynamo's graph ``gm`` block by block (see the module docstring); return the
    graph that calls the compiled parts in turn. ``compile_graph(gm, inputs)`` compiles one
    part; ``report`` (a ``CompileReport``) gets a line for each compiled part."""
    owners = _owners(gm, cache.blocks)
    if not any(owners.values()) or _under_ddp_optimizer():
        report.graphs.append(compile_origin(gm))
        return compile_graph(gm, example_inputs)

    parts, part, previous = {}, -1, object()
    for node, owner in owners.items():  # a new part wherever the owning block changes
        if owner != previous:
            part, previous = part + 1, owner
        parts[node] = part
    split = split_module(gm, None, lambda node: parts[node], keep_original_order=True)
    # split_module names the part numbered N "submod_N"
    owner_of_part = {f"submod_{parts[node]}": owner for node, owner in owners.items()}
    _PartCompiler(split, example_inputs, cache, compile_graph, report, owner_of_part).run(
        *example_inputs
    )
    split.recompile()
    return split


def _owners(gm: fx.GraphModule, blocks: dict[str, str]) -> dict[fx.Node, str | None]:
    """For each operation of ``gm``, the block it belongs to (a key of ``blocks``) or None.

    Dynamo records on each node the modules it was traced in, as paths from the compiled
    frame's module (``L['module'].blocks.0.fc``); their first component names that argument.
    """
    owners = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        owners[node] = None
        for path, _ in (node.meta.get("nn_module_stack") or {}).values():
            name = path.partition(".")[2]
            if name in blocks:
                owners[node] = name
                break
    return owners


def _under_ddp_optimizer() -> bool:
    # DDPOptimizer has already split the graph into gradient buckets and expects one
    # AOTAutograd graph per bucket; a bucket is compiled whole.
    context = compat.TracingContext.try_get()
    return context is not None and context.ddp_optimizer_ctx is not None


class _PartCompiler(fx.Interpreter):
    """Runs the split graph on fake tensors, compiling each part on the way (its inputs are
    the fake outputs of the parts before it), and puts the compiled part in its place."""

    def __init__(self, split, example_inputs, cache, compile_graph, report, owner_of_part):
        super().__init__(split)
        fake_mode = compat.dynamo_utils.detect_fake_mode(example_inputs)
        self.fake_mode = fake_mode or compat.FakeTensorMode()
        self.cache, self.compile_graph, self.report = cache, compile_graph, report
        self.owner_of_part = owner_of_part

    def run_node(self, node):
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        args = tuple(
            compat.dynamo_utils.to_fake_tensor(a, self.fake_mode)
            if isinstance(a, torch.Tensor) and not isinstance(a, compat.FakeTensor)
            else a
            for a in args
        )
        if node.op != "call_module":
            return getattr(self, node.op)(node.target, args, kwargs)
        part = self.fetch_attr(node.target)
        single = _outputs_as_tuple(part)
        owner = self.owner_of_part[node.target]
        # Only glue is compiled or not by its FLOPs: a block's part runs without the counter.
        flops = FlopCounterMode(display=False) if owner is None else contextlib.nullcontext()
        # A part's constants (get_attr) are real tensors.
        with self.fake_mode, unittest.mock.patch.object(
            self.fake_mode, "allow_non_fake_inputs", True
        ), flops:
            outputs = part(*args)
        if owner is not None:
            compiled = self._region(part, args, owner)
        elif flops.get_total_flops():
            compiled = self._compile(part, args)
            self.report.graphs.append(f"glue: {compile_origin(part)}")
        else:
            compiled = part
            note = "glue run as traced (no matmul, convolution or attention): "
            note += compile_origin(part)
            if note not in self.report.notes:  # recompilations trace the same glue again
                self.report.notes.append(note)
        self.module.delete_submodule(node.target)
        self.module.add_submodule(node.target, _Part(compiled, single))
        return outputs[0] if single else outputs

    def _region(self, part, args, owner):
        key = _structure(part, args)
        if key not in self.cache.compiled:
            region = Region(self.cache.blocks[owner], [])
            self.cache.compiled[key] = (self._compile(part, args), region)
            self.report.graphs.append(region)
        compiled, region = self.cache.compiled[key]
        if owner not in region.blocks:  # a recompiled graph meets its blocks again
            region.blocks.append(owner)
        return compiled

    def _compile(self, part, args):
        # AOTAutograd compiles a backward graph at its first call, with the forward metadata
        # the tracing context holds then: that of the last part compiled. Compile each part's
        # backward with its forward instead.
        with compat.functorch_config.patch(force_non_lazy_backward_lowering=True):
            return self.compile_graph(part, list(args))


def _outputs_as_tuple(part: fx.GraphModule) -> bool:
    """Make ``part`` return a tuple, as AOTAutograd requires; True if it returned one value."""
    output = next(node for node in part.graph.nodes if node.op == "output")
    single = not isinstance(output.args[0], tuple)
    if single:
        output.args = ((output.args[0],),)
        part.recompile()
    return single


class _Part(nn.Module):
    """A compiled part in the split graph, returning what the traced part returned."""

    def __init__(self, compiled, single: bool):
        super().__init__()
        self.compiled, self.single = compiled, single

    def forward(self, *args):
        outputs = self.compiled(*args)
        return outputs[0] if self.single else outputs


def _structure(part: fx.GraphModule, args) -> tuple:
    """What makes two parts one compiled function: their operations, wired alike, with
    constants alike, on inputs of the same shapes, strides, dtypes and devices that alike need
    gradients or not (so a first block fed the batch itself, which needs none, compiles apart
    from the blocks after it)."""
    inputs = tuple(
        (str(a.shape), str(a.stride()), a.dtype, a.device, a.requires_grad)
        if isinstance(a, torch.Tensor)
        else str(a)
        for a in args
    )
    return _operations(part), inputs


def _operations(gm: fx.GraphModule) -> tuple:
    """``gm``'s operations, each with its inputs by position. A subgraph that an operation
    runs (the body of a higher-order op, such as activation checkpointing's) counts by its own
    operations, not by its name, which differs from block to block."""
    index = {}
    operations = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        wiring = fx.node.map_arg((node.args, node.kwargs), lambda arg: ("%", index[arg]))
        if node.op == "placeholder":
            target = ""
        elif node.op == "get_attr" and isinstance(getattr(gm, node.target), fx.GraphModule):
            target = _operations(getattr(gm, node.target))
        else:
            target = str(node.target)
        operations.append((node.op, target, repr(wiring)))
    return tuple(operations)


def compile_origin(gm: fx.GraphModule) -> str:
    """Where a graph came from: the outermost traced frame of the model's own code, as
    'file, line, function'; for a graph of torch.nn modules only (whose frames dynamo does not
    record), the classes of those modules."""
    classes = {}
    for node in gm.graph.nodes:
        for line in node.meta.get("stack_trace", "").splitlines():
            line = line.strip()
            if line.startswith("File ") and f'"{__file__}"' not in line:
                return line.removeprefix("File ")
        for _, cls in (node.meta.get("nn_module_stack") or {}).values():
            classes.setdefault(cls.__name__)
    return f"torch.nn modules {', '.join(classes)}" if classes else "<unknown>"
