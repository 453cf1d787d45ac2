"""``SyncBatchNorm``: ``torch.nn.SyncBatchNorm`` on every device the runtime trains on.

In training, batch normalization over every process's batch: each channel's mean and variance
are those of the batches of all the processes in the group together, as if one process had
normalized their concatenation. torch's own ``SyncBatchNorm`` runs its kernels on CUDA, HPU, XPU
and the out-of-tree device, and raises on any other device once a process group is
initialized (the CPU with gloo among them). This subclass keeps torch's implementation on
those devices and runs a portable one, built from plain tensor operations and
torch.distributed collectives, on the others; it chooses at each forward, by the input's
device.

The portable path gives what torch's does: the outputs, the gradients of the input (the
statistics' gradients summed over the group in the backward), of the weight and the bias (this
process's share, which the gradient all-reduce sums), the running statistics (the unbiased
variance of the whole batch, ``momentum``, or with ``momentum=None`` the cumulative average),
batches of different sizes on different processes (an empty one included), ``process_group``,
channels-last inputs and any number of dimensions from 2 (``(N, C)``, ``(N, C, L)``,
``(N, C, H, W)``, ...). Half-precision inputs are normalized in float32 and returned in their
own dtype, as torch's kernels do. In evaluation, and with one process, it is plain batch
normalization. Each process contributes its batch's mean, its sum of squared deviations from
that mean and its count, which combine without the cancellation that a sum of squares minus
the squared mean suffers when a channel's mean is large beside its spread.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from accrewrite.base import torch_compat as compat

__all__ = ["SyncBatchNorm"]

# The device types torch's SyncBatchNorm runs on, besides the out-of-tree one.
_TORCH_DEVICE_TYPES = ("cuda", "hpu", "xpu")


def runs_torch_implementation(device: torch.device) -> bool:
    """Whether torch's own SyncBatchNorm runs on ``device``."""
    return device.type in _TORCH_DEVICE_TYPES or device.type == compat.privateuse1_backend_name()


class SyncBatchNorm(torch.nn.SyncBatchNorm):
    """``torch.nn.SyncBatchNorm``: the same constructor, parameters, buffers and state_dict
    keys; ``isinstance(m, torch.nn.SyncBatchNorm)`` holds."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if runs_torch_implementation(input.device) or not (self.training and _distributed()):
            return super().forward(input)  # CUDA's kernels, or nothing to synchronise
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        factor = self._average_factor()
        running_mean, running_var = (self.running_mean, self.running_var) if self.track_running_stats else (None, None)
        group = self.process_group or dist.group.WORLD
        if dist.get_world_size(group) == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, True, factor, self.eps)
        return _sync_batch_norm(input, self.weight, self.bias, running_mean, running_var, factor, self.eps, group)

    def _average_factor(self) -> float:
        """Counts a training batch and gives the running statistics' update factor, as torch's
        batch norms do: ``momentum``, or with ``momentum=None`` one over the batches counted."""
        if not self.track_running_stats:
            return 0.0 if self.momentum is None else self.momentum
        self.num_batches_tracked.add_(1)
        return 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, process_group=None) -> torch.nn.Module:
        """``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: every ``BatchNorm*d`` (and torch
        ``SyncBatchNorm``) layer of ``module`` becomes this class, with the same parameters,
        buffers, ``requires_grad``, training flag and ``qconfig``; returns ``module``, or the new
        layer when ``module`` is itself one."""
        converted = module
        if isinstance(module, compat.BatchNormBase):
            # ``bias=`` is a keyword of newer torch, needed only for an affine layer without one.
            no_bias = {"bias": False} if module.affine and module.bias is None else {}
            converted = cls(
                module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                process_group, **no_bias,
            )
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.training = module.training
            if hasattr(module, "qconfig"):
                converted.qconfig = module.qconfig
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return converted


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _sync_batch_norm(input, weight, bias, running_mean, running_var, momentum: float, eps: float, group):
    """Batch normalization of ``input`` (``(N, C, ...)``) with the statistics of the batches of
    every process in ``group``; updates ``running_mean``/``running_var`` (when given) by
    ``momentum``. Every process of the group calls it, in the forward and in the backward."""
    channels = input.size(1)
    shape = (1, channels) + (1,) * (input.dim() - 2)
    dims = [0, *range(2, input.dim())]
    # half precision is normalized in float32, as torch's kernels accumulate
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    count = input.numel() // channels
    if count:
        local_mean = x.mean(dims)
        local_squares = (x - local_mean.view(shape)).square().sum(dims)
    else:  # an empty batch still takes part in the collectives, and contributes nothing
        local_mean = local_squares = x.sum(dims)
    local = torch.cat([local_mean, local_squares, local_mean.new_full((1,), count)])
    means, squares, counts = _AllGather.apply(local, group).split([channels, channels, 1], dim=1)
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    variance = (squares + counts * (means - mean).square()).sum(0) / total
    if running_mean is not None:
        with torch.no_grad():
            running_mean.lerp_(mean.to(running_mean.dtype), momentum)
            unbiased = variance * (total / (total - 1))
            running_var.lerp_(unbiased.to(running_var.dtype), momentum)
    scale = torch.rsqrt(variance + eps)
    if weight is not None:
        scale = scale * weight
    output = (x - mean.view(shape)) * scale.view(shape)
    if bias is not None:
        output = output + bias.view(shape)
    return output.to(input.dtype)


class _AllGather(torch.autograd.Function):
    """Every process's ``tensor``, stacked in rank order; the backward gives each process the
    sum over the group of the gradients of its own row."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, tensor.contiguous(), group=group)
        return torch.stack(gathered)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None
