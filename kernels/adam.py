"""Adam / AdamW step over a whole parameter group: one multi-tensor Triton launch, or the reference.

``adam_step`` is the update that ``torch.optim.Adam`` and ``torch.optim.AdamW`` apply (same
formulas, same state: ``exp_avg``, ``exp_avg_sq`` and a float32 ``step`` tensor per parameter),
with the two extras that an AMP training step needs without a host sync:

- ``grad_scale``: gradients are divided by it (a tensor on the device) as they are read; the
  ``.grad`` tensors themselves are left as they are.
- ``found_inf``: a float tensor, nonzero when the scaler found an overflow. Then nothing changes
  (parameters, moments, steps). It is decided on the device: there is no ``.item()`` anywhere.

It serves ``FusedAdam``/``FusedAdamW`` and the syncfree optimizers alike, as one operator,
``accrewrite::adam_step`` (``adam_step_op``), that declares what it updates in place: the
parameters, both moments and the steps.

The arithmetic is done in float32 whatever the parameter dtype (as ``torch.optim.Adam(fused=True)``
does) and stored back in each tensor's own dtype. Complex parameters are updated as pairs of
reals (as torch.optim does).

On the Triton path a parameter the kernel cannot take (a non-dense view, float64, a step held on
another device) is updated by the reference instead, so every input torch.optim accepts works.
"""

from __future__ import annotations

import functools
import math
from types import MappingProxyType
from typing import Optional

import torch

from accrewrite.base import accelerator
from accrewrite.base import torch_compat as compat
from accrewrite.kernels.dispatch import triton_available, use_triton

if triton_available():
    import triton
    import triton.language as tl


def adam_step(
    params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor], *, lr: float | torch.Tensor, **options,
) -> None:
    """Apply one Adam (``decoupled_weight_decay=False``) or AdamW step in place.

    All lists are parallel, one entry per parameter; ``steps`` holds each parameter's float32
    scalar step count (``state["step"]``), incremented here unless ``found_inf`` is nonzero.
    ``lr`` may be a float or a scalar tensor. ``options``, as ``adam_step_op`` takes them:
    ``beta1``, ``beta2``, ``eps``, ``weight_decay``, ``decoupled_weight_decay`` and, optional,
    ``maximize``, ``grad_scale``, ``found_inf``.
    """
    tensors = _check_lists(params, grads, exp_avgs, exp_avg_sqs, steps)
    if not params:
        return
    tensors = _local_shards(tensors)
    if tensors is None:  # DTensors laid out unlike their parameters: DTensor's own dispatch
        adam_step_reference(params, grads, exp_avgs, exp_avg_sqs, steps, lr=lr, **options)
        return
    lr_is_tensor = isinstance(lr, torch.Tensor)
    adam_step_op(*tensors, lr=0.0 if lr_is_tensor else float(lr), lr_tensor=lr if lr_is_tensor else None,
                 **{"maximize": False, "grad_scale": None, "found_inf": None, **options})


def _local_shards(tensors):
    """The lists with DTensors (FSDP2, tensor parallel) as their local shards, which the op
    updates in place: the step is elementwise, so each rank updates its own shard where a
    parameter's gradient and moments are laid out as it is. None where they are not."""
    params, grads, exp_avgs, exp_avg_sqs, steps = tensors
    dtensor = compat.dtensor_class()
    if dtensor is None or not any(isinstance(p, dtensor) for p in params):
        return tensors
    layout = [(p.device_mesh, p.placements) if isinstance(p, dtensor) else None for p in params]
    for parts in (grads, exp_avgs, exp_avg_sqs):
        if [(t.device_mesh, t.placements) if isinstance(t, dtensor) else None for t in parts] != layout:
            return None
    local = [[compat.local_shard(t) if isinstance(t, dtensor) else t for t in parts]
             for parts in (params, grads, exp_avgs, exp_avg_sqs)]
    return (*local, steps)


@torch.library.custom_op(
    "accrewrite::adam_step", mutates_args=("params", "exp_avgs", "exp_avg_sqs", "steps")
)
def adam_step_op(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    lr: float,
    lr_tensor: Optional[torch.Tensor],
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled_weight_decay: bool,
    maximize: bool,
    grad_scale: Optional[torch.Tensor],
    found_inf: Optional[torch.Tensor],
) -> None:
    """``adam_step`` on real tensors, the learning rate a float or (``lr_tensor``) a tensor."""
    step = _adam_step_triton if use_triton(*params) else adam_step_reference
    step(
        params, grads, exp_avgs, exp_avg_sqs, steps,
        lr=lr if lr_tensor is None else lr_tensor, beta1=beta1, beta2=beta2, eps=eps,
        weight_decay=weight_decay, decoupled_weight_decay=decoupled_weight_decay,
        maximize=maximize, grad_scale=grad_scale, found_inf=found_inf,
    )


@adam_step_op.register_fake
def _(params, grads, exp_avgs, exp_avg_sqs, steps, lr, lr_tensor, beta1, beta2, eps,
      weight_decay, decoupled_weight_decay, maximize, grad_scale, found_inf):
    return None


def adam_step_reference(
    params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, weight_decay,
    decoupled_weight_decay, maximize=False, grad_scale=None, found_inf=None,
) -> None:
    """The PyTorch reference of ``adam_step``: one parameter at a time, in float32 (float64 for
    float64 parameters)."""
    # A skipped step is chosen with torch.where rather than a Python `if`, so that the decision
    # stays on the device.
    keep = None if found_inf is None else found_inf == 0
    for param, grad, exp_avg, exp_avg_sq, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        dtype = torch.promote_types(param.dtype, torch.float32)
        p = param.to(dtype)
        g = grad.to(dtype)
        if grad_scale is not None:
            g = g / grad_scale
        if maximize:
            g = -g
        if weight_decay != 0:
            if decoupled_weight_decay:
                p = p * (1 - lr * weight_decay)
            else:
                g = g + weight_decay * p
        new_step = step + 1
        m = exp_avg.to(dtype).lerp(g, 1 - beta1)
        v = exp_avg_sq.to(dtype) * beta2 + (1 - beta2) * g * g
        # Bias corrections in float64, as torch.optim computes them (Python floats): in float32
        # 1 - beta ** step loses digits that show as a drift of ~1e-6 over tens of steps.
        wide_step = new_step.to(torch.float64)
        step_size = (lr / (1 - beta1 ** wide_step)).to(dtype)
        bias_correction2_sqrt = (1 - beta2 ** wide_step).sqrt().to(dtype)
        p = p - step_size * m / (v.sqrt() / bias_correction2_sqrt + eps)
        for target, value in ((param, p), (exp_avg, m), (exp_avg_sq, v), (step, new_step)):
            target.copy_(value if keep is None else torch.where(keep, value, target))


def _check_lists(params, grads, exp_avgs, exp_avg_sqs, steps):
    """Validate the parallel lists; return them with complex tensors viewed as real pairs."""
    lists = (params, grads, exp_avgs, exp_avg_sqs, steps)
    if len({len(x) for x in lists}) != 1:
        raise ValueError(
            "adam_step: params, grads, exp_avgs, exp_avg_sqs and steps must have the same length, "
            f"got {[len(x) for x in lists]}"
        )
    for i, (p, g, m, v, s) in enumerate(zip(*lists)):
        if not (p.shape == g.shape == m.shape == v.shape):
            raise ValueError(
                f"adam_step: parameter {i} has shape {tuple(p.shape)} but its grad/exp_avg/"
                f"exp_avg_sq have {tuple(g.shape)}/{tuple(m.shape)}/{tuple(v.shape)}"
            )
        if g.is_sparse:
            raise RuntimeError("adam_step does not support sparse gradients; use SparseAdam")
        if s.numel() != 1 or not s.is_floating_point():
            raise ValueError(f"adam_step: steps[{i}] must be a floating-point scalar tensor")
    if any(p.is_complex() for p in params):
        real = [[torch.view_as_real(t) if t.is_complex() else t for t in x] for x in lists[:4]]
        lists = real + [steps]
    return lists


# ---------------------------------------------------------------------------------------------
# Triton path
#
# Layout: one launch per (device, dtypes) bucket -- in practice one per param group. Every
# tensor is cut into CHUNK-element chunks and each program updates one chunk. The program finds
# its tensor through a device-side table: the addresses of every parameter, grad and moment, the
# address of its step and its element count (the pattern of Triton's grouped-GEMM tutorial).
#
# The steps are incremented by one foreach add *before* the launch: chunks of one tensor run in
# any order, so none of them may write the step that the others still have to read.

_CHUNK = 16384
_BLOCK = 1024

_TRITON_DTYPES: dict = MappingProxyType({})

if triton_available():
    _TRITON_DTYPES = {
        torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
    }

    @triton.jit
    def _adam_kernel(
        table_ptr, n_tensors, lr_ptr, lr, beta1, beta2, log2_beta1, log2_beta2, eps, weight_decay,
        grad_scale_ptr, found_inf_ptr,
        PARAM_TY: tl.constexpr, GRAD_TY: tl.constexpr, STATE_TY: tl.constexpr,
        LR_IS_TENSOR: tl.constexpr, DECOUPLED: tl.constexpr, MAXIMIZE: tl.constexpr,
        HAS_GRAD_SCALE: tl.constexpr, HAS_FOUND_INF: tl.constexpr,
        CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    ):
        # table rows (each n_tensors long): param, grad, exp_avg, exp_avg_sq, step addresses,
        # numels; then per program: tensor index, chunk start.
        pid = tl.program_id(0)
        t = tl.load(table_ptr + 6 * n_tensors + 2 * pid)
        start = tl.load(table_ptr + 6 * n_tensors + 2 * pid + 1)
        param_ptr = tl.load(table_ptr + t).to(tl.pointer_type(PARAM_TY))
        grad_ptr = tl.load(table_ptr + n_tensors + t).to(tl.pointer_type(GRAD_TY))
        exp_avg_ptr = tl.load(table_ptr + 2 * n_tensors + t).to(tl.pointer_type(STATE_TY))
        exp_avg_sq_ptr = tl.load(table_ptr + 3 * n_tensors + t).to(tl.pointer_type(STATE_TY))
        step_ptr = tl.load(table_ptr + 4 * n_tensors + t).to(tl.pointer_type(tl.float32))
        numel = tl.load(table_ptr + 5 * n_tensors + t)

        step = tl.load(step_ptr)
        if LR_IS_TENSOR:
            lr = tl.load(lr_ptr).to(tl.float32)
        bias_correction1 = 1.0 - tl.exp2(step * log2_beta1)
        bias_correction2_sqrt = tl.sqrt(1.0 - tl.exp2(step * log2_beta2))
        step_size = lr / bias_correction1
        if HAS_FOUND_INF:
            # A skipped step has nothing to update: the loop below does not run.
            numel = tl.where(tl.load(found_inf_ptr) == 0, numel, 0)
        inv_scale = 1.0
        if HAS_GRAD_SCALE:
            inv_scale = 1.0 / tl.load(grad_scale_ptr).to(tl.float32)

        for i in range(0, tl.minimum(numel - start, CHUNK), BLOCK):
            offs = start + i + tl.arange(0, BLOCK)
            mask = offs < numel
            p = tl.load(param_ptr + offs, mask=mask).to(tl.float32)
            g = tl.load(grad_ptr + offs, mask=mask).to(tl.float32) * inv_scale
            m = tl.load(exp_avg_ptr + offs, mask=mask).to(tl.float32)
            v = tl.load(exp_avg_sq_ptr + offs, mask=mask).to(tl.float32)
            if MAXIMIZE:
                g = -g
            if DECOUPLED:
                p = p * (1.0 - lr * weight_decay)
            else:
                g = g + weight_decay * p
            m = m + (1.0 - beta1) * (g - m)
            v = beta2 * v + (1.0 - beta2) * g * g
            p = p - step_size * m / (tl.sqrt(v) / bias_correction2_sqrt + eps)
            tl.store(param_ptr + offs, p.to(PARAM_TY), mask=mask)
            tl.store(exp_avg_ptr + offs, m.to(STATE_TY), mask=mask)
            tl.store(exp_avg_sq_ptr + offs, v.to(STATE_TY), mask=mask)


def _adam_step_triton(
    params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, weight_decay,
    decoupled_weight_decay, maximize=False, grad_scale=None, found_inf=None,
) -> None:
    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                 decoupled_weight_decay=decoupled_weight_decay, maximize=maximize,
                 grad_scale=grad_scale, found_inf=found_inf)
    buckets: dict[tuple, list[int]] = {}
    for i, tensors in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, steps)):
        if _kernel_takes(*tensors):
            p, g, m, _, _ = tensors
            buckets.setdefault((p.device, p.dtype, g.dtype, m.dtype), []).append(i)
        else:
            adam_step_reference(*([t] for t in tensors), **hyper)

    for (device, p_dtype, g_dtype, state_dtype), index in buckets.items():
        bucket_steps = [steps[i] for i in index]
        if found_inf is None:
            compat.foreach_add_(bucket_steps, 1.0)
        else:
            compat.foreach_add_(bucket_steps, (found_inf == 0).to(device, torch.float32))
        addresses = tuple(
            tensors[i].data_ptr()
            for tensors in (params, grads, exp_avgs, exp_avg_sqs, steps)
            for i in index
        )
        numels = tuple(params[i].numel() for i in index)
        table, n_chunks = _table(addresses, numels, device)
        lr_is_tensor = isinstance(lr, torch.Tensor)
        _adam_kernel[(n_chunks,)](
            table, len(index),
            lr if lr_is_tensor else table, 0.0 if lr_is_tensor else float(lr),
            beta1, beta2, _log2(beta1), _log2(beta2), eps, weight_decay,
            table if grad_scale is None else grad_scale,
            table if found_inf is None else found_inf,
            PARAM_TY=_TRITON_DTYPES[p_dtype], GRAD_TY=_TRITON_DTYPES[g_dtype],
            STATE_TY=_TRITON_DTYPES[state_dtype],
            LR_IS_TENSOR=lr_is_tensor, DECOUPLED=decoupled_weight_decay, MAXIMIZE=maximize,
            HAS_GRAD_SCALE=grad_scale is not None, HAS_FOUND_INF=found_inf is not None,
            CHUNK=_CHUNK, BLOCK=_BLOCK,
        )


def _kernel_takes(param, grad, exp_avg, exp_avg_sq, step) -> bool:
    """Whether the kernel can update this parameter: the tensors walk alike from their data_ptr,
    in dtypes it handles, with a float32 step on the same device."""
    # (runs for every parameter at every step: cheap tests first)
    return (
        step.dtype == torch.float32
        and step.get_device() == param.get_device()
        and param.dtype in _TRITON_DTYPES
        and grad.dtype in _TRITON_DTYPES
        and exp_avg.dtype in _TRITON_DTYPES
        and exp_avg_sq.dtype == exp_avg.dtype
        and _same_dense_layout(param, grad, exp_avg, exp_avg_sq)
    )


@functools.lru_cache(maxsize=8)
def _table(addresses: tuple[int, ...], numels: tuple[int, ...], device: torch.device):
    """The kernel's device-side table and its number of chunks (= programs).

    Rows: the parameter, grad, exp_avg, exp_avg_sq and step addresses, the numels, then one
    (tensor, start) pair per chunk. Cached on the addresses: while the tensors stay where they
    are (the usual case from one step to the next) no table is uploaded at all; otherwise the
    upload is asynchronous, from pinned memory, so the host does not wait for the device.
    """
    pairs = [value for t, numel in enumerate(numels) for start in range(0, numel, _CHUNK)
             for value in (t, start)]
    host = torch.tensor(addresses + numels + tuple(pairs), dtype=torch.int64)
    if accelerator.on_accelerator(device):
        host = host.pin_memory()
    return host.to(device, non_blocking=True), len(pairs) // 2


def _log2(beta: float) -> float:
    # beta == 0 (no momentum) is allowed: beta ** step is then 0 = 2 ** -inf.
    return math.log2(beta) if beta > 0 else -math.inf


def _same_dense_layout(*tensors: torch.Tensor) -> bool:
    """True when the tensors cover dense, non-overlapping memory laid out alike, so that element
    k of one is element k of the others in a flat walk from data_ptr."""
    if all(t.is_contiguous() for t in tensors):
        return True
    first = tensors[0]
    if any(t.stride() != first.stride() for t in tensors[1:]):
        return False
    expected = 1
    for size, stride in sorted(zip(first.shape, first.stride()), key=lambda dim: dim[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def new_state(param: torch.Tensor) -> dict:
    """A parameter's Adam state before its first step, under torch.optim's keys."""
    return {
        "step": torch.zeros((), dtype=torch.float32, device=param.device),
        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
    }


def step_param_group(state, group, params, *, decoupled_weight_decay, grad_scale=None, found_inf=None) -> None:
    """One ``adam_step`` over ``params`` of the torch.optim-style param ``group``, with the
    per-parameter state kept under torch.optim's keys (``step``, ``exp_avg``, ``exp_avg_sq``)
    in ``state`` and created on first use; shared by FusedAdam(W) and syncfree Adam(W)."""
    for param in params:
        if not state[param]:
            state[param].update(new_state(param))
    states = [state[param] for param in params]
    beta1, beta2 = (float(beta) for beta in group["betas"])
    adam_step(
        params,
        [param.grad for param in params],
        [s["exp_avg"] for s in states],
        [s["exp_avg_sq"] for s in states],
        [s["step"] for s in states],
        lr=group["lr"],
        beta1=beta1,
        beta2=beta2,
        eps=group["eps"],
        weight_decay=group["weight_decay"],
        decoupled_weight_decay=decoupled_weight_decay,
        maximize=group["maximize"],
        grad_scale=grad_scale,
        found_inf=found_inf,
    )
