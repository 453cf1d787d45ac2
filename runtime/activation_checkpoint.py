"""Activation checkpointing of a model's repeated blocks (TorchAcc's migration guide, "Gradient checkpointing").

``model = auto_checkpoint(model)`` (TorchAcc: ``torchacc.auto_checkpoint(model)``) finds the
repeated blocks of ``model`` (:func:`accrewrite.runtime.blocks.repeated_blocks`: the layers of a
transformer, the units of a ResNet stage) and runs each under non-reentrant
``torch.utils.checkpoint``: a block keeps little during the forward and recomputes its
activations during the backward. Gradients are those of the plain model (the RNG state is
replayed, so dropout masks match).

Selective by default: a checkpointed block still keeps the outputs that are dearest to recompute
per byte kept, attention (``scaled_dot_product_attention``) and down-projections (matmuls whose
contraction is at least twice their output width, as a transformer MLP's second linear), and
recomputes the rest (normalisations, activations, up-projections) from its input. That skips
most of the recomputation time for a small part of the memory. ``selective=False`` recomputes
everything (plain ``torch.utils.checkpoint``, the least memory).

``budget`` trades memory for recomputation: the peak memory of forward + backward should be at
most ``budget`` times the un-checkpointed peak. ``None`` checkpoints every block. With a budget,
the first training forward runs with every block fully checkpointed (the safest memory) and
measures, with saved-tensor hooks, what each block and the rest of the model keep for the
backward (the rest split at the last block: what is saved after it, as a head's, is freed
before the blocks' backward); a timeline of the backward, which starts with the output's
gradient beside everything saved, then estimates the peak of each plan on a ladder from
cheap to lean (checkpoint the first ``k`` blocks selectively, k = 0..n, then recompute the first
``j`` of them fully), and the first plan within budget is kept. The earliest blocks go first:
their memory is held longest. That forward runs the first block of each repeated group once
more, uncheckpointed, to measure it (the RNG is forked around it; a block that updates buffers in
its forward, as BatchNorm does, updates them once more, as checkpoint recomputation does anyway).

The blocks' ``forward`` is replaced on the instances, so module names, ``state_dict`` keys and
hooks stay as they were; calling ``auto_checkpoint`` again replaces the previous plan. Without
gradients (``torch.no_grad``, evaluation) blocks run plainly.
"""

import functools
import logging
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

from accrewrite.base import torch_compat as compat
from accrewrite.base import accelerator
from .blocks import repeated_blocks

logger = logging.getLogger(__name__)

PLAIN, SELECTIVE, FULL = "plain", "selective", "full"


def auto_checkpoint(model: nn.Module, budget: float | None = None, *, selective: bool = True) -> nn.Module:
    """Checkpoint ``model``'s repeated blocks in place (see the module docstring); returns it.

    ``budget``: ``None`` for every block, else a fraction in ``(0, 1]`` of the un-checkpointed
    peak memory of forward + backward. ``selective``: keep attention and down-projection outputs
    in checkpointed blocks (False: recompute everything). The plan is ``model.checkpoint_plan``;
    with a budget it is decided at the first training forward.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"auto_checkpoint needs an nn.Module, got {type(model).__name__}")
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)):
            raise TypeError(f"budget must be a number or None, got {budget!r}")
        if not 0 < budget <= 1:
            raise ValueError(f"budget is a fraction of the un-checkpointed peak, in (0, 1]; got {budget}")
    groups = [list(container) for _, container in repeated_blocks(model)]
    if not groups:
        raise ValueError(
            f"{type(model).__name__} has no repeated blocks to checkpoint (an nn.ModuleList or "
            f"nn.Sequential of two or more modules of one class)"
        )
    pending = model.__dict__.get("forward")
    if isinstance(pending, _Calibration):  # applied again before the first training forward
        _restore_forward(model, pending.original)
    plan = CheckpointPlan(groups=groups, budget=budget, selective=selective)
    everything = SELECTIVE if selective and budget is None else FULL
    for group in groups:
        for block in group:
            _set_mode(block, everything)
    model.checkpoint_plan = plan
    if budget is None:
        plan.modes = [everything] * sum(map(len, groups))
    else:
        _Calibration.install(model, plan)
    return model


def checkpoint_modules(modules, *, selective: bool = True) -> None:
    """Checkpoint each of ``modules`` as ``auto_checkpoint`` does a block without a budget
    (for callers that choose the modules themselves, as ``accelerate``'s ``gc_cls``)."""
    for module in modules:
        _set_mode(module, SELECTIVE if selective else FULL)


@dataclass
class CheckpointPlan:
    """How each block runs, in call order, and the memory estimates that chose it."""

    groups: list[list[nn.Module]]
    budget: float | None
    selective: bool
    modes: list[str] | None = None  # PLAIN, SELECTIVE or FULL per block called; None: undecided
    estimated_ratio: float | None = None  # estimated peak / un-checkpointed peak
    ladder: list[tuple[list[str], float]] = field(default_factory=list)  # plans tried, peak bytes

    @property
    def checkpointed(self) -> int | None:
        """How many blocks run under checkpoint (None until decided)."""
        return None if self.modes is None else sum(mode != PLAIN for mode in self.modes)


def _set_mode(block: nn.Module, mode: str) -> None:
    current = block.__dict__.get("forward")
    original = current.original if isinstance(current, _Checkpointed) else current
    if mode != PLAIN:
        block.forward = _Checkpointed(block, original, selective=mode == SELECTIVE)
    elif original is None:
        block.__dict__.pop("forward", None)  # back to the class's forward
    else:
        block.forward = original


# -- the selective policy ---------------------------------------------------------------------

_aten = torch.ops.aten
_ATTENTION = frozenset({
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
})
_MATMULS = frozenset({_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default})


def _keeps(op, args) -> bool:
    """Whether a selective checkpoint keeps this op's output rather than recomputing it:
    attention, and matmuls whose contraction is at least twice their output width (recompute
    cost per byte kept grows with the contraction)."""
    if op in _ATTENTION:
        return True
    if op in _MATMULS:
        left, right = args[-2], args[-1]  # addmm/baddbmm lead with the bias
        return left.shape[-1] >= 2 * right.shape[-1]
    return False


def _policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if _keeps(op, args) else CheckpointPolicy.PREFER_RECOMPUTE


_selective_contexts = functools.partial(create_selective_checkpoint_contexts, _policy)


class _Checkpointed:
    """A block's forward, run under non-reentrant checkpoint when gradients are recorded.

    ``original`` is a forward set on the instance before ours (None: the class's). The module is
    held rather than its bound ``forward`` so that pickling and deepcopy do not follow a bound
    method back to this object.
    """

    def __init__(self, module: nn.Module, original, selective: bool):
        self.module = module
        self.original = original
        self.selective = selective
        self.observer = None  # set during calibration

    def run(self, *args, **kwargs):
        if self.original is not None:
            return self.original(*args, **kwargs)
        return type(self.module).forward(self.module, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.run(*args, **kwargs)
        if self.observer is not None:
            self.observer(self, args, kwargs)
        context_fn = _selective_contexts if self.selective else noop_context_fn
        return checkpoint(self.run, *args, use_reentrant=False, context_fn=context_fn, **kwargs)


# -- measuring --------------------------------------------------------------------------------


class _SavedBytes(saved_tensors_hooks):
    """Counts the bytes of distinct storages saved for backward, parameters excluded."""

    def __init__(self, excluded: set[int]):
        self.bytes = 0
        self._seen = set(excluded)

        def pack(tensor):
            self.bytes += _new_bytes(tensor, self._seen)
            # Not the tensor itself: an op's saved output would hold its own graph node, a cycle
            # that keeps the graph (a probed block's, whose output is dropped) alive for good.
            return tensor.detach()

        super().__init__(pack, lambda tensor: tensor)


class _KeptBytes(compat.TorchDispatchMode):
    """Counts the bytes of the op outputs that a selective checkpoint would keep."""

    def __init__(self):
        super().__init__()
        self.bytes = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        if _keeps(func, args):
            leaves = compat.tree_leaves(output)
            self.bytes += sum(_new_bytes(value, self._seen) for value in leaves)
        return output


def _new_bytes(tensor, seen: set[int]) -> int:
    """Bytes of ``tensor``'s storage if not in ``seen`` (then added to it)."""
    if not isinstance(tensor, torch.Tensor) or tensor.is_meta:
        return 0
    storage = tensor.untyped_storage()
    if storage.data_ptr() in seen:
        return 0
    seen.add(storage.data_ptr())
    return storage.nbytes()


def _tensor_bytes(values) -> int:
    seen: set[int] = set()
    return sum(_new_bytes(value, seen) for value in compat.tree_leaves(values))


def _grad_bytes(parameters) -> int:
    return sum(p.numel() * p.element_size() for p in parameters if p.requires_grad)


@dataclass
class _BlockCost:
    """Bytes one block call holds: its inputs, what it saves plain, what selective keeps."""

    inputs: int
    activations: int
    kept: int
    grads: int

    def saved(self, mode: str) -> int:
        return {PLAIN: self.activations, SELECTIVE: self.inputs + self.kept, FULL: self.inputs}[mode]


@dataclass
class _Outside:
    """Bytes the model saves outside its blocks: ``before`` its last block's call (held through
    the blocks' backward), ``after`` it (freed before the blocks' backward), and its ``output``."""

    before: int
    after: int
    output: int


class _Calibration:
    """The first training forward of a budgeted model: measure, then choose the plan."""

    def __init__(self, model: nn.Module, plan: CheckpointPlan):
        self.model = model
        self.plan = plan
        self.original = model.__dict__.get("forward")
        self.calls: list[tuple[nn.Module, int]] = []  # blocks as called, with their input bytes
        self.outside: _SavedBytes | None = None  # what the model saves outside its blocks
        self.outside_before_last = 0  # of which, saved before the last block's call
        self.probed: dict[int, tuple[int, int]] = {}  # group -> (activations, kept) of one block
        self.group_of = {id(block): g for g, group in enumerate(plan.groups) for block in group}
        self.parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    @classmethod
    def install(cls, model: nn.Module, plan: CheckpointPlan) -> None:
        model.forward = cls(model, plan)

    def __call__(self, *args, **kwargs):
        forward = self.original or functools.partial(type(self.model).forward, self.model)
        if not (torch.is_grad_enabled() and self.model.training):
            return forward(*args, **kwargs)
        wrappers = [block.forward for group in self.plan.groups for block in group]
        for wrapper in wrappers:
            wrapper.observer = self.observe
        self.outside = _SavedBytes(self.parameter_storages)
        try:
            with self.outside:
                output = forward(*args, **kwargs)
        finally:
            for wrapper in wrappers:
                wrapper.observer = None
        self.decide(_Outside(self.outside_before_last, self.outside.bytes - self.outside_before_last,
                             _tensor_bytes(output)))
        return output

    def observe(self, wrapper: _Checkpointed, args, kwargs) -> None:
        group = self.group_of[id(wrapper.module)]
        self.calls.append((wrapper.module, _tensor_bytes((args, kwargs))))
        self.outside_before_last = self.outside.bytes
        if group in self.probed:
            return
        devices = sorted({t.device.index or 0 for t in compat.tree_leaves((args, kwargs))
                          if isinstance(t, torch.Tensor) and accelerator.on_accelerator(t.device)})
        saved, kept = _SavedBytes(self.parameter_storages), _KeptBytes()
        with torch.random.fork_rng(devices=devices, device_type=accelerator.device_type()), saved, kept:
            wrapper.run(*args, **kwargs)  # output dropped: its graph and activations go with it
        self.probed[group] = (saved.bytes, kept.bytes)

    def decide(self, outside: _Outside) -> None:
        """Keep the first plan of the ladder whose estimated peak is within budget."""
        plan = self.plan
        blocks = [block for block, _ in self.calls]
        costs = [_BlockCost(size, *self.probed[self.group_of[id(block)]], _grad_bytes(block.parameters()))
                 for block, size in self.calls]
        other_grads = _grad_bytes(self.model.parameters()) - sum(cost.grads for cost in costs)
        plan.ladder = [(modes, _estimate_peak(modes, costs, outside, other_grads))
                       for modes in _ladder(len(blocks), plan.selective)]
        plain_peak = plan.ladder[0][1]
        within = [(modes, peak) for modes, peak in plan.ladder if peak <= plan.budget * plain_peak]
        plan.modes, peak = within[0] if within else plan.ladder[-1]
        plan.estimated_ratio = peak / plain_peak
        if not within:
            logger.warning("auto_checkpoint: budget %.2f is below the %.2f estimated with every "
                           "block recomputed; recomputing all", plan.budget, plan.estimated_ratio)
        for block, mode in zip(blocks, plan.modes):
            _set_mode(block, mode)
        _restore_forward(self.model, self.original)
        logger.info("auto_checkpoint: %d of %d blocks checkpointed, estimated peak %.2fx",
                    plan.checkpointed, len(blocks), plan.estimated_ratio)


def _ladder(n: int, selective: bool) -> list[list[str]]:
    """Plans from the cheapest in time to the leanest in memory, earliest blocks first."""
    if not selective:
        return [[FULL] * k + [PLAIN] * (n - k) for k in range(n + 1)]
    return ([[SELECTIVE] * k + [PLAIN] * (n - k) for k in range(n + 1)]
            + [[FULL] * j + [SELECTIVE] * (n - j) for j in range(1, n + 1)])


def _restore_forward(model: nn.Module, original) -> None:
    if original is None:
        model.__dict__.pop("forward", None)
    else:
        model.forward = original


def _estimate_peak(modes: list[str], costs: list[_BlockCost], outside: _Outside, other_grads: int) -> int:
    """Estimated peak bytes of forward + backward with the blocks run as ``modes``.

    The backward starts with everything saved held (what the blocks keep by their mode and what
    the model saves outside them) and the output's gradient. Then, block by block from the last:
    what the model saved after the blocks is gone, the blocks before this one still hold what
    they saved, it holds its activations (recomputed or saved) and the gradients flowing in and
    out, and the parameter gradients of the blocks after it (and of the rest of the model) exist.
    """
    saved = [cost.saved(mode) for cost, mode in zip(costs, modes)]
    held = sum(saved)
    peak = outside.before + outside.after + outside.output + held + outside.output
    grads = other_grads
    for j in reversed(range(len(costs))):
        held -= saved[j]
        peak = max(peak, outside.before + held + costs[j].activations + 2 * costs[j].inputs + grads)
        grads += costs[j].grads
    return max(peak, outside.before + grads, 1)
