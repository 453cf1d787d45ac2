"""Compiling modules in place, whole or by region (seed 003's regional compilation).

A transformer spends most of its compile time tracing and optimising N copies of one block.
Regional compilation compiles the repeated blocks only, and dynamo reuses the first block's
compiled code for the others: parameters are graph inputs (dynamo's
``inline_inbuilt_nn_modules``), so the guards check the block's class and the shapes, not its
identity, and one cache entry fits every instance. The code around the blocks (embeddings, head,
loss) stays eager, as in Accelerate's ``compile_regions`` and PyTorch's regional compilation
recipe.

Not ``torch.compiler.nested_compile_region``, which would keep the whole model in one graph
with each block class traced once: with inductor (torch 2.13, CPU) it gives a GPT block wrong
gradients (21 of its model's 26 parameter gradients differ from eager's, where the
``aot_eager`` backend agrees with eager). Inductor's buffer reuse is the cause
(``allow_buffer_reuse=False`` makes them right), and even then its cold start on a 12-block GPT
was 0.6x a full compile's, against 0.3x here; so each block class is a graph of its own.
"""

import functools
import types

import torch
from torch import nn



def call_module(module: nn.Module, *args, **kwargs):
    """The frame that gets compiled for a module: calling it, hooks included.

    ``nn.Module.compile`` compiles ``module._call_impl`` itself, and dynamo does not trace a
    top-level frame inside torch.nn, so a built-in block (an ``nn.Sequential`` of layers) would
    silently stay eager. This frame is user code for dynamo, which inlines the call below; and
    since the module is an argument, one compiled function serves every module of one class.
    """
    return module._call_impl(*args, **kwargs)


class CompiledCalls:
    """``torch.compile`` of :func:`call_module`, one per module class, installed on modules.

    Dynamo keeps its compiled code, and counts recompilations against its limit of 8, per code
    object. Each class therefore gets its own copy of ``call_module``'s code, named after the
    class (it reads well in dynamo's logs), so that models and block classes do not use up each
    other's recompilations.
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


def compile_regions(found: list[tuple[str, nn.Module]], calls: CompiledCalls) -> list[str]:
    """Compile in place every block of the repeated-block containers in ``found``
    (``repeated_blocks``); return the containers' names (none: nothing was compiled)."""
    for _, container in found:
        for block in container:
            calls.install(block)
    return [name for name, _ in found]
