"""Deformable convolution written as its definition, one image, channel group and kernel tap at
a time, each sample read by bilinear interpolation of its four neighbours: the oracle of the
DCN tests (and of the original script in the ACC026 run test, standing in for dcn_v2's CUDA
kernel)."""

import torch


def _bilinear(image, y, x):
    """``image[:, y, x]`` at real coordinates ``y, x`` (each ``(L,)``): the four neighbouring
    pixels weighted, those off the image 0, and nothing at all at -1 or past the last pixel."""
    _, height, width = image.shape
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    y0, x0 = torch.floor(y).detach(), torch.floor(x).detach()
    total = 0
    for row, row_weight in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for column, column_weight in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            valid = inside & (row >= 0) & (row < height) & (column >= 0) & (column < width)
            pixels = image[:, row.clamp(0, height - 1).long(), column.clamp(0, width - 1).long()]
            total = total + pixels * (row_weight * column_weight * valid)
    return total


def deform_conv_loop(input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None):
    """Deformable convolution one image, channel group and kernel tap at a time."""
    batch, channels, _, _ = input.shape
    out_channels, group_channels, kernel_h, kernel_w = weight.shape
    taps = kernel_h * kernel_w
    offset_groups = offset.shape[1] // (2 * taps)
    per_group = channels // offset_groups
    groups = channels // group_channels
    out_h, out_w = offset.shape[2:]
    rows = torch.arange(out_h, dtype=input.dtype).repeat_interleave(out_w) * stride[0] - padding[0]
    columns = torch.arange(out_w, dtype=input.dtype).repeat(out_h) * stride[1] - padding[1]
    images = []
    for b in range(batch):
        sampled = []  # per channel group and tap: (per_group, out_h * out_w)
        for g in range(offset_groups):
            for tap in range(taps):
                i, j = divmod(tap, kernel_w)
                y = rows + i * dilation[0] + offset[b, 2 * (g * taps + tap)].flatten()
                x = columns + j * dilation[1] + offset[b, 2 * (g * taps + tap) + 1].flatten()
                value = _bilinear(input[b, g * per_group:(g + 1) * per_group], y, x)
                sampled.append(value if mask is None else value * mask[b, g * taps + tap].flatten())
        # (groups, taps, per_group, L) -> channel-major (channels * taps, L), as the weight's
        columns_of = torch.stack(sampled).view(offset_groups, taps, per_group, -1).transpose(1, 2)
        columns_of = columns_of.reshape(groups, group_channels * taps, -1)
        kernel = weight.reshape(groups, out_channels // groups, group_channels * taps)
        images.append((kernel @ columns_of).reshape(out_channels, out_h, out_w))
    output = torch.stack(images)
    return output if bias is None else output + bias.view(1, -1, 1, 1)
