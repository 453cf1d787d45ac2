"""Deformable convolution with the interface of the ``dcn_v2`` package (DCNv2 of detection code:
CenterNet, FairMOT), as TorchAcc's migration guide imports it: ``from torchacc.runtime.nn.dcn_v2
import DCN, DCNv2``.

- ``DCNv2(in_channels, out_channels, kernel_size, stride, padding, dilation=1,
  deformable_groups=1)``: ``forward(input, offset, mask)``, modulated deformable convolution
  with offsets ``(N, 2 * deformable_groups * kh * kw, H_out, W_out)`` (a ``(dy, dx)`` pair per
  kernel tap) and a mask ``(N, deformable_groups * kh * kw, H_out, W_out)`` given by the caller.
- ``DCN(...)``, the same constructor: ``forward(input)``. An internal ``conv_offset_mask``
  (zero-initialised, so training starts from a plain convolution scaled by 0.5) predicts both;
  its output's first two thirds are the offsets, the last third passes through a sigmoid into
  the mask.
- ``dcn_v2_conv(input, offset, mask, weight, bias, stride, padding, dilation,
  deformable_groups)``: the package's functional form.

Parameters and state_dict keys are the package's (``weight``, ``bias``,
``conv_offset_mask.weight``, ``conv_offset_mask.bias``), so its checkpoints load. ``bias=False``
(keyword) leaves the bias out.

Each call runs ``torchvision.ops.deform_conv2d`` where torchvision's compiled ops load in this
process (imported at the first call, not before) and the tensors are on the CPU or CUDA;
everything else (no torchvision, a torchvision built for another torch, XLA tensors) runs
``deform_conv2d_reference``, plain PyTorch: each tap's sampling point is read by bilinear
interpolation of its four neighbouring pixels (gathered), zero outside the image, and the taps
are reduced by one matrix product. Both compute half-precision inputs in float32, since
coordinates in float16 would land on the wrong pixels, and both give the gradients dcn_v2's
kernel gives, also for points exactly on a pixel or on the image's edge, where a DCN starts.
"""

import functools
import importlib.util
import math

import torch

__all__ = ["DCN", "DCNv2", "dcn_v2_conv", "deform_conv2d", "deform_conv2d_reference"]

_TORCHVISION_DEVICES = ("cpu", "cuda")
# Computed in float32: coordinates in half precision would land on the wrong pixels.
_HALF = (torch.float16, torch.bfloat16)


def deform_conv2d(input, offset, weight, bias=None, stride=1, padding=0, dilation=1, mask=None):
    """``torchvision.ops.deform_conv2d``'s interface: ``mask=None`` is deformable convolution
    (DCNv1), a mask modulates each sample (DCNv2). Deformable groups are
    ``offset.shape[1] // (2 * kh * kw)`` and weight groups ``input.shape[1] // weight.shape[1]``."""
    operator = _torchvision_deform_conv2d()
    if operator is None or input.device.type not in _TORCHVISION_DEVICES:
        return deform_conv2d_reference(input, offset, weight, bias, stride, padding, dilation, mask)
    dtype = input.dtype
    input, offset, weight, bias, mask, (stride, padding, dilation), (offset_groups, _, _) = _arguments(
        input, offset, weight, bias, stride, padding, dilation, mask)
    if offset.requires_grad:
        y, x = _points(offset.detach(), offset_groups, weight.shape[2:], stride, padding, dilation)
        height, width = input.shape[2:]
        off_image = ((y <= -1) | (y >= height) | (x <= -1) | (x >= width)).view(
            offset.shape[0], -1, 1, *offset.shape[2:]).expand(-1, -1, 2, -1, -1).reshape(offset.shape)
        offset = _NoSlopeOffImage.apply(offset, off_image)
    return operator(input, offset, weight, bias, stride, padding, dilation, mask).to(dtype)


def deform_conv2d_reference(input, offset, weight, bias=None, stride=1, padding=0, dilation=1,
                            mask=None):
    """``deform_conv2d`` in plain PyTorch: the oracle the tests hold torchvision to, and the path
    for devices torchvision has no kernel for (XLA)."""
    dtype = input.dtype
    input, offset, weight, bias, mask, (stride, padding, dilation), (offset_groups, out_h, out_w) = (
        _arguments(input, offset, weight, bias, stride, padding, dilation, mask))
    batch, channels, height, width = input.shape
    out_channels, group_channels, kernel_h, kernel_w = weight.shape
    taps = kernel_h * kernel_w
    positions = out_h * out_w

    y, x = _points(offset.to(input.dtype), offset_groups, (kernel_h, kernel_w), stride, padding, dilation)
    y = y.reshape(batch * offset_groups, 1, taps * positions)
    x = x.reshape(batch * offset_groups, 1, taps * positions)
    # A point on or past row/column -1 or the side's length reads nothing, and has no slope
    # towards the image either (dcn_v2's rule; a padded tap of a DCN starts exactly on -1).
    weight_of_point = ((y > -1) & (y < height) & (x > -1) & (x < width)).to(input.dtype)
    if mask is not None:
        weight_of_point = weight_of_point * mask.reshape(y.shape).to(input.dtype)
    sampled = _bilinear(input.reshape(batch * offset_groups, channels // offset_groups, height * width),
                        height, width, y, x, weight_of_point)
    sampled = sampled.view(batch, offset_groups, channels // offset_groups, taps, positions)

    groups = channels // group_channels
    columns = sampled.reshape(batch, groups, group_channels * taps, positions)
    kernel = weight.reshape(groups, out_channels // groups, group_channels * taps)
    output = torch.matmul(kernel, columns).reshape(batch, out_channels, out_h, out_w)
    if bias is not None:
        output = output + bias.view(1, out_channels, 1, 1)
    return output.to(dtype)


def _points(offset, offset_groups, kernel, stride, padding, dilation):
    """Where each tap reads, ``(y, x)``, each ``(N, offset_groups, kh * kw, H_out, W_out)``:
    the tap's place in the dilated kernel at the output pixel's stride, moved by its offsets."""
    batch, _, out_h, out_w = offset.shape
    taps = kernel[0] * kernel[1]
    arange = functools.partial(torch.arange, device=offset.device, dtype=offset.dtype)
    tap_y = (arange(kernel[0]) * dilation[0]).repeat_interleave(kernel[1]).view(taps, 1, 1)
    tap_x = (arange(kernel[1]) * dilation[1]).repeat(kernel[0]).view(taps, 1, 1)
    pairs = offset.reshape(batch, offset_groups, taps, 2, out_h, out_w)
    y = tap_y + (arange(out_h) * stride[0] - padding[0]).view(1, out_h, 1) + pairs[:, :, :, 0]
    x = tap_x + (arange(out_w) * stride[1] - padding[1]).view(1, 1, out_w) + pairs[:, :, :, 1]
    return y, x


class _NoSlopeOffImage(torch.autograd.Function):
    """The offsets as they are, whose gradient is dropped at points on or past the image's edge
    (row or column -1, or the side's length). dcn_v2's kernel gives such a point no slope;
    torchvision's gives one on -1 exactly, where a padded tap of a DCN starts (zero offsets)."""

    @staticmethod
    def forward(ctx, offset, off_image):
        ctx.save_for_backward(off_image)
        return offset.view_as(offset)

    @staticmethod
    def backward(ctx, grad):
        (off_image,) = ctx.saved_tensors
        return grad.masked_fill(off_image, 0), None


def _bilinear(image, height, width, y, x, weight_of_point):
    """``image`` ``(G, C, height * width)`` read at the points ``(y, x)`` (each ``(G, 1, P)``) ->
    ``(G, C, P)``: the four neighbouring pixels, weighted by the distances, those off the image
    0. ``floor`` picks the cell, so a point on a pixel takes its slope from the cell below and to
    the right, as torchvision's and dcn_v2's kernels do (``grid_sample``'s normalised
    coordinates would round some points into the cell before)."""
    y0, x0 = torch.floor(y), torch.floor(x)
    sampled = 0
    for row, row_weight in ((y0, y0 + 1 - y), (y0 + 1, y - y0)):
        for column, column_weight in ((x0, x0 + 1 - x), (x0 + 1, x - x0)):
            on_image = (row >= 0) & (row < height) & (column >= 0) & (column < width)
            index = (row.clamp(0, height - 1) * width + column.clamp(0, width - 1)).long()
            pixels = torch.gather(image, 2, index.expand(-1, image.shape[1], -1))
            sampled = sampled + pixels * (row_weight * column_weight * on_image * weight_of_point)
    return sampled


def dcn_v2_conv(input, offset, mask, weight, bias, stride, padding, dilation, deformable_groups):
    """The ``dcn_v2`` package's functional form (its argument order); ``deformable_groups`` must
    agree with the offsets' channels."""
    taps = weight.shape[2] * weight.shape[3] if weight.dim() == 4 else 0
    if offset.dim() == 4 and offset.shape[1] != 2 * deformable_groups * taps:
        raise ValueError(
            f"dcn_v2_conv: offset has {offset.shape[1]} channels, expected 2 * deformable_groups * "
            f"kh * kw = {2 * deformable_groups * taps} for deformable_groups={deformable_groups} and a "
            f"{tuple(weight.shape[2:])} kernel"
        )
    return deform_conv2d(input, offset, weight, bias, stride, padding, dilation, mask)


class DCNv2(torch.nn.Module):
    """Modulated deformable convolution; ``forward(input, offset, mask)``."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation=1,
                 deformable_groups=1, *, bias=True):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels),
                            ("deformable_groups", deformable_groups)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be a positive int, got {value!r}")
        if in_channels % deformable_groups:
            raise ValueError(
                f"{type(self).__name__}: in_channels ({in_channels}) must be divisible by "
                f"deformable_groups ({deformable_groups}): each group of channels shares its offsets"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        self.dilation = _pair(dilation, "dilation")
        self.deformable_groups = deformable_groups
        self.weight = torch.nn.Parameter(torch.empty(out_channels, in_channels, *self.kernel_size))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """As dcn_v2: weights uniform in +-1/sqrt(fan_in), bias zero."""
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size[0] * self.kernel_size[1])
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, input, offset, mask):
        return deform_conv2d(input, offset, self.weight, self.bias, self.stride, self.padding,
                             self.dilation, mask)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"deformable_groups={self.deformable_groups}, bias={self.bias is not None}")


class DCN(DCNv2):
    """Modulated deformable convolution whose offsets and mask a convolution of the input
    predicts; ``forward(input)``."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation=1,
                 deformable_groups=1, *, bias=True):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         deformable_groups, bias=bias)
        taps = self.kernel_size[0] * self.kernel_size[1]
        # dcn_v2 leaves the dilation out of this convolution, so with a dilation above 1 its
        # offsets no longer match the output (its kernel does not check their size); with it,
        # they do, from the same parameters.
        self.conv_offset_mask = torch.nn.Conv2d(
            in_channels, 3 * deformable_groups * taps, self.kernel_size, self.stride, self.padding,
            self.dilation, bias=True,
        )
        self.init_offset()

    def init_offset(self):
        """Zero offsets and a mask of 0.5 everywhere, as dcn_v2 starts."""
        with torch.no_grad():
            self.conv_offset_mask.weight.zero_()
            self.conv_offset_mask.bias.zero_()

    def forward(self, input):
        dy_dx_1, dy_dx_2, mask = torch.chunk(self.conv_offset_mask(input), 3, dim=1)
        offset = torch.cat((dy_dx_1, dy_dx_2), dim=1)
        return deform_conv2d(input, offset, self.weight, self.bias, self.stride, self.padding,
                             self.dilation, torch.sigmoid(mask))


@functools.cache
def _torchvision_deform_conv2d():
    """``torchvision.ops.deform_conv2d`` where torchvision's compiled ops load, else None. A
    torchvision built for another torch fails at import (``operator torchvision::nms does not
    exist``)."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        from torchvision.ops import deform_conv2d as operator

        torch.ops.torchvision.deform_conv2d  # noqa: B018 - raises where the C++ ops did not load
    except Exception:  # noqa: BLE001 - any failure to load means the plain path
        return None
    return operator


def _arguments(input, offset, weight, bias, stride, padding, dilation, mask):
    """The arguments checked against each other, half precision computed in float32: the five
    tensors, then (stride, padding, dilation) as pairs and (offset groups, out_h, out_w)."""
    stride, padding, dilation = (_pair(stride, "stride"), _pair(padding, "padding"),
                                 _pair(dilation, "dilation"))
    shapes = _shapes(input, offset, weight, bias, stride, padding, dilation, mask)
    tensors = (input, offset, weight, bias, mask)
    if input.dtype in _HALF:
        tensors = tuple(None if t is None else t.float() for t in tensors)
    return (*tensors, (stride, padding, dilation), shapes)


def _pair(value, name):
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise ValueError(f"deform_conv2d: {name} must be an int or a pair of ints, got {value!r}")


def _shapes(input, offset, weight, bias, stride, padding, dilation, mask):
    """Check the arguments against each other; returns (offset groups, out_h, out_w)."""
    for name, tensor in (("input", input), ("offset", offset), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"deform_conv2d: {name} must be a 4-d tensor, got {shape}")
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ValueError(f"deform_conv2d: stride {stride} and dilation {dilation} must be >= 1, "
                         f"padding {padding} >= 0")
    batch, channels, height, width = input.shape
    out_channels, group_channels, kernel_h, kernel_w = weight.shape
    if group_channels == 0 or channels % group_channels or out_channels % (channels // group_channels):
        raise ValueError(
            f"deform_conv2d: weight {tuple(weight.shape)} does not fit input channels {channels}: "
            f"weight.shape[1] must divide them and the groups must divide weight.shape[0]"
        )
    taps = kernel_h * kernel_w
    if offset.shape[1] == 0 or offset.shape[1] % (2 * taps) or channels % (offset.shape[1] // (2 * taps)):
        raise ValueError(
            f"deform_conv2d: offset has {offset.shape[1]} channels; expected 2 * deformable_groups * "
            f"{kernel_h} * {kernel_w} for the {kernel_h}x{kernel_w} kernel, with deformable_groups "
            f"dividing the {channels} input channels"
        )
    offset_groups = offset.shape[1] // (2 * taps)
    out_h = (height + 2 * padding[0] - dilation[0] * (kernel_h - 1) - 1) // stride[0] + 1
    out_w = (width + 2 * padding[1] - dilation[1] * (kernel_w - 1) - 1) // stride[1] + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"deform_conv2d: a {height}x{width} input is smaller than the dilated "
                         f"{kernel_h}x{kernel_w} kernel with padding {padding}")
    if tuple(offset.shape) != (batch, 2 * offset_groups * taps, out_h, out_w):
        raise ValueError(f"deform_conv2d: offset has shape {tuple(offset.shape)}, expected "
                         f"{(batch, 2 * offset_groups * taps, out_h, out_w)} (the output's size)")
    if mask is not None and tuple(mask.shape) != (batch, offset_groups * taps, out_h, out_w):
        raise ValueError(f"deform_conv2d: mask has shape {tuple(mask.shape)}, expected "
                         f"{(batch, offset_groups * taps, out_h, out_w)}: one weight per offset pair")
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise ValueError(f"deform_conv2d: bias has shape {tuple(bias.shape)}, expected ({out_channels},)")
    return offset_groups, out_h, out_w
