"""Activation checkpointing of a model's repeated blocks (seed 001, "Gradient checkpointing").

``model = auto_checkpoint(model)`` (TorchAcc: ``torchacc.auto_checkpoint(model)``) finds the
repeated blocks of ``model`` (:func:`accrewrite.runtime.blocks.repeated_blocks`: the layers of a
transformer, the units of a ResNet stage) and runs each under non-reentrant
``torch.utils.checkpoint``: a block keeps only its inputs during the forward and recomputes its
activations during the backward. Gradients are those of the plain model (the RNG state is
replayed, so dropout masks match).

``budget`` trades memory for recomputation: the peak memory of forward + backward should be at
most ``budget`` times the un-checkpointed peak. ``None`` checkpoints every block (the most memory
saved). With a budget, the first training forward runs with every block checkpointed and
measures, with saved-tensor hooks, what each block and the rest of the model keep for the
backward; a timeline of the backward then estimates the peak for checkpointing the first ``k``
blocks (the earliest blocks hold memory longest), and the smallest ``k`` within budget is kept.
That forward runs the first block of each repeated group once more, uncheckpointed, to measure
it (the RNG is forked around it; a block that updates buffers in its forward, as BatchNorm does,
updates them once more, as checkpoint recomputation does anyway).

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
from torch.utils.checkpoint import checkpoint

from .blocks import repeated_blocks

logger = logging.getLogger(__name__)


def auto_checkpoint(model: nn.Module, budget: float | None = None) -> nn.Module:
    """Checkpoint ``model``'s repeated blocks in place (see the module docstring); returns it.

    ``budget``: ``None`` for every block, else a fraction in ``(0, 1]`` of the un-checkpointed
    peak memory of forward + backward. The chosen plan is ``model.checkpoint_plan`` once known.
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
    for group in groups:
        for block in group:
            _checkpoint_block(block, True)
    plan = CheckpointPlan(groups=groups, budget=budget)
    model.checkpoint_plan = plan
    if budget is not None:
        _Calibration.install(model, plan)
    return model


@dataclass
class CheckpointPlan:
    """Which blocks run under checkpoint, and the memory estimates that chose them."""

    groups: list[list[nn.Module]]
    budget: float | None
    checkpointed: int | None = None  # blocks checkpointed (the first ones run); None: undecided
    estimated_ratio: float | None = None  # estimated peak / un-checkpointed peak
    estimates: list[float] = field(default_factory=list)  # estimated peak bytes for k = 0..n

    def __post_init__(self):
        if self.budget is None:
            self.checkpointed = sum(map(len, self.groups))


def _checkpoint_block(block: nn.Module, enabled: bool) -> None:
    current = block.__dict__.get("forward")
    original = current.original if isinstance(current, _Checkpointed) else current
    if enabled:
        block.forward = _Checkpointed(block, original)
    elif original is None:
        block.__dict__.pop("forward", None)  # back to the class's forward
    else:
        block.forward = original


class _Checkpointed:
    """A block's forward, run under non-reentrant checkpoint when gradients are recorded.

    ``original`` is a forward set on the instance before ours (None: the class's). The module is
    held rather than its bound ``forward`` so that pickling and deepcopy do not follow a bound
    method back to this object.
    """

    def __init__(self, module: nn.Module, original):
        self.module = module
        self.original = original
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
        return checkpoint(self.run, *args, use_reentrant=False, **kwargs)


class _SavedBytes(saved_tensors_hooks):
    """Counts the bytes of distinct storages saved for backward, parameters excluded."""

    def __init__(self, excluded: set[int]):
        self.bytes = 0
        self._seen = set(excluded)

        def pack(tensor):
            self.bytes += _new_bytes(tensor, self._seen)
            return tensor

        super().__init__(pack, lambda tensor: tensor)


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
    flat, _ = torch.utils._pytree.tree_flatten(values)
    return sum(_new_bytes(value, seen) for value in flat)


def _grad_bytes(parameters) -> int:
    return sum(p.numel() * p.element_size() for p in parameters if p.requires_grad)


class _Calibration:
    """The first training forward of a budgeted model: measure, then choose the plan."""

    def __init__(self, model: nn.Module, plan: CheckpointPlan):
        self.model = model
        self.plan = plan
        self.original = model.__dict__.get("forward")
        self.order: list[tuple[nn.Module, int]] = []  # blocks as called, with their input bytes
        self.activations: dict[int, int] = {}  # group index -> bytes one block saves
        self.group_of = {id(block): g for g, group in enumerate(plan.groups) for block in group}
        self.parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    @classmethod
    def install(cls, model: nn.Module, plan: CheckpointPlan) -> None:
        calibration = cls(model, plan)
        model.forward = calibration

    def __call__(self, *args, **kwargs):
        forward = self.original or functools.partial(type(self.model).forward, self.model)
        if not (torch.is_grad_enabled() and self.model.training):
            return forward(*args, **kwargs)
        wrappers = [block.forward for group in self.plan.groups for block in group]
        for wrapper in wrappers:
            wrapper.observer = self.observe
        outside_blocks = _SavedBytes(self.parameter_storages)
        try:
            with outside_blocks:
                output = forward(*args, **kwargs)
        finally:
            for wrapper in wrappers:
                wrapper.observer = None
        self.decide(outside_blocks.bytes + _tensor_bytes(output))
        return output

    def observe(self, wrapper: _Checkpointed, args, kwargs) -> None:
        group = self.group_of[id(wrapper.module)]
        self.order.append((wrapper.module, _tensor_bytes((args, kwargs))))
        if group in self.activations:
            return
        devices = sorted({t.device.index or 0 for t in torch.utils._pytree.tree_leaves((args, kwargs))
                          if isinstance(t, torch.Tensor) and t.is_cuda})
        saved = _SavedBytes(self.parameter_storages)
        with torch.random.fork_rng(devices=devices), saved:
            wrapper.run(*args, **kwargs)  # output dropped: its graph and activations go with it
        self.activations[group] = saved.bytes

    def decide(self, other_bytes: int) -> None:
        """Keep checkpointing the first ``k`` blocks called, the smallest ``k`` within budget."""
        plan = self.plan
        blocks = [block for block, _ in self.order]
        inputs = [size for _, size in self.order]
        activations = [self.activations[self.group_of[id(block)]] for block in blocks]
        block_grads = [_grad_bytes(block.parameters()) for block in blocks]
        other_grads = _grad_bytes(self.model.parameters()) - sum(block_grads)
        plan.estimates = [
            _estimate_peak(k, other_bytes, other_grads, inputs, activations, block_grads)
            for k in range(len(blocks) + 1)
        ]
        ratios = [peak / plan.estimates[0] for peak in plan.estimates]
        within = [k for k, ratio in enumerate(ratios) if ratio <= plan.budget]
        plan.checkpointed = within[0] if within else len(blocks)
        plan.estimated_ratio = ratios[plan.checkpointed]
        if not within:
            logger.warning("auto_checkpoint: budget %.2f is below the %.2f estimated with every "
                           "block checkpointed; checkpointing all", plan.budget, ratios[-1])
        for position, block in enumerate(blocks):
            _checkpoint_block(block, position < plan.checkpointed)
        _restore_forward(self.model, self.original)
        logger.info("auto_checkpoint: %d of %d blocks checkpointed, estimated peak %.2fx",
                    plan.checkpointed, len(blocks), plan.estimated_ratio)


def _restore_forward(model: nn.Module, original) -> None:
    if original is None:
        model.__dict__.pop("forward", None)
    else:
        model.forward = original


def _estimate_peak(k, other, other_grads, inputs, activations, block_grads) -> float:
    """Estimated peak bytes of forward + backward with the first ``k`` blocks checkpointed.

    Forward: everything outside the blocks (``other``, with the output) stays saved; a
    checkpointed block keeps its inputs, another its activations. Backward, block by block from
    the last: the blocks before it still hold what they saved, it holds its activations
    (recomputed or saved) and the gradients flowing in and out, and the parameter gradients of
    the blocks after it (and of the rest of the model) exist.
    """
    n = len(inputs)
    saved = [inputs[i] if i < k else activations[i] for i in range(n)]
    peak = other + sum(saved)
    grads = other_grads
    held = sum(saved)
    for j in reversed(range(n)):
        held -= saved[j]
        peak = max(peak, other + held + activations[j] + 2 * inputs[j] + grads)
        grads += block_grads[j]
    return max(peak, other + grads, 1)
