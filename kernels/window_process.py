"""Swin Transformer's window processing: cyclic shift fused with window partition, and window
merge fused with the reverse shift (TorchAcc's migration guide, "WindowProcess").

Unfused, a shifted-window block does ``torch.roll`` (one full copy of the feature map) and then
``window_partition`` (a permute + ``contiguous``, a second copy); on the way back
``window_reverse`` and another ``torch.roll``. Both directions are pure data movement, so one
kernel computes, for every token of the feature map, where it lands among the windows and copies
it there once. The result is bit-exact with the reference.

Sign convention (Swin's fused kernel and TorchAcc's migration guide): ``shift_size`` is the signed shift given to
``torch.roll``. A shifted block calls ``window_process(x, -s, ws)`` on the way in and
``window_process_reverse(windows, H, W, s, ws)`` on the way out.

Both directions move a token between its place in the ``(B, H, W, C)`` image and its place in
the ``(B * nW, ws, ws, C)`` windows; they are the same index map read in opposite directions,
so each is the other's backward and one kernel serves all four (two forwards, two backwards):
one operator, ``accrewrite::window_shuffle`` (``window_shuffle_op``), whose backward is itself
in the other direction. Where the Triton kernel does not run (``dispatch.use_triton``) eager
calls run the reference directly, and the operator the same.
"""

import math

import torch

from accrewrite.kernels.dispatch import triton_available, use_triton

if triton_available():  # without triton only the reference path exists
    import triton
    import triton.language as tl

__all__ = [
    "window_process",
    "window_process_reverse",
    "window_process_reference",
    "window_process_reverse_reference",
]


def window_partition(x: torch.Tensor, window_size: int) -> torch.Tensor:
    """Swin's ``window_partition``: ``(B, H, W, C)`` -> ``(B * nW, ws, ws, C)``."""
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows: torch.Tensor, window_size: int, H: int, W: int) -> torch.Tensor:
    """Swin's ``window_reverse``: ``(B * nW, ws, ws, C)`` -> ``(B, H, W, C)``."""
    C = windows.shape[-1]
    x = windows.reshape(-1, H // window_size, W // window_size, window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


def window_process_reference(x: torch.Tensor, shift_size: int, window_size: int) -> torch.Tensor:
    """``window_partition(torch.roll(x, (shift_size, shift_size), (1, 2)), window_size)``."""
    _check_image(x, window_size)
    if shift_size:
        x = torch.roll(x, shifts=(shift_size, shift_size), dims=(1, 2))
    return window_partition(x, window_size)


def window_process_reverse_reference(
    windows: torch.Tensor, height: int, width: int, shift_size: int, window_size: int
) -> torch.Tensor:
    """``torch.roll(window_reverse(windows, window_size, H, W), (shift, shift), (1, 2))`` with
    ``shift = shift_size``."""
    _check_windows(windows, height, width, window_size)
    x = window_reverse(windows, window_size, height, width)
    if shift_size:
        x = torch.roll(x, shifts=(shift_size, shift_size), dims=(1, 2))
    return x


def window_process(x: torch.Tensor, shift_size: int, window_size: int) -> torch.Tensor:
    """Cyclic shift by ``shift_size`` then window partition: ``(B, H, W, C)`` ->
    ``(B * nW, ws, ws, C)``. The Triton kernel when ``use_triton(x)``, else the reference."""
    if not use_triton(x):
        return window_process_reference(x, shift_size, window_size)
    _check_image(x, window_size)
    B, H, W, C = x.shape
    out = window_shuffle_op(x, [B, H, W, C], shift_size, window_size, True)
    return out.view(-1, window_size, window_size, C)


def window_process_reverse(
    windows: torch.Tensor, height: int, width: int, shift_size: int, window_size: int
) -> torch.Tensor:
    """Window merge then cyclic shift by ``shift_size``: ``(B * nW, ws, ws, C)`` (or any shape of
    the same size whose last dimension is C) -> ``(B, H, W, C)``."""
    if not use_triton(windows):
        return window_process_reverse_reference(windows, height, width, shift_size, window_size)
    _check_windows(windows, height, width, window_size)
    C = windows.shape[-1]
    B = windows.numel() // (height * width * C)
    # Merging with shift s reads the windows at the token that partitioning with -s wrote.
    out = window_shuffle_op(windows, [B, height, width, C], -shift_size, window_size, False)
    return out.view(B, height, width, C)


def _check_image(x, window_size):
    if x.dim() != 4:
        raise ValueError(f"window_process expects x of shape (B, H, W, C), got {tuple(x.shape)}")
    _check_grid(x.shape[1], x.shape[2], window_size)


def _check_windows(windows, height, width, window_size):
    _check_grid(height, width, window_size)
    C = windows.shape[-1] if windows.dim() else 0
    tokens = height * width * C
    if windows.dim() < 2 or tokens == 0 or windows.numel() % tokens:
        raise ValueError(
            f"window_process_reverse: windows of shape {tuple(windows.shape)} do not hold whole "
            f"{height}x{width} images with C={C} channels (expected (B * nW, {window_size}, "
            f"{window_size}, C))"
        )


def _check_grid(height, width, window_size):
    if window_size <= 0 or height % window_size or width % window_size:
        raise ValueError(
            f"window_size={window_size} must be positive and divide H={height} and W={width} "
            "(pad the feature map first, as Swin does)"
        )


@torch.library.custom_op("accrewrite::window_shuffle", mutates_args=())
def window_shuffle_op(
    src: torch.Tensor, image: list[int], shift: int, window_size: int, to_windows: bool
) -> torch.Tensor:
    """``src``'s tokens moved from the image layout (``image`` = B, H, W, C) to the windows'
    (``to_windows``) or back, flat; ``shift`` is the one of partitioning."""
    if use_triton(src):
        return _launch(src, *image, shift, window_size, to_windows)
    B, H, W, C = image
    if to_windows:
        out = window_process_reference(src.reshape(B, H, W, C), shift, window_size)
    else:
        windows = src.reshape(-1, window_size, window_size, C)
        out = window_process_reverse_reference(windows, H, W, -shift, window_size)
    out = out.reshape(-1)
    # the reference returns its input itself where nothing moves (one unshifted window)
    return out.clone() if out.data_ptr() == src.data_ptr() else out


@window_shuffle_op.register_fake
def _(src, image, shift, window_size, to_windows):
    return src.new_empty(math.prod(image))


def _setup_context(ctx, inputs, output):
    src, ctx.image, ctx.shift, ctx.window_size, ctx.to_windows = inputs
    ctx.src_shape = src.shape


def _grad(ctx, grad):
    grad_src = window_shuffle_op(grad, ctx.image, ctx.shift, ctx.window_size, not ctx.to_windows)
    return grad_src.view(ctx.src_shape), None, None, None, None


window_shuffle_op.register_autograd(_grad, setup_context=_setup_context)


def _launch(src, B, H, W, C, shift, window_size, to_windows):
    src = src.contiguous()
    dst = torch.empty(B * H * W * C, dtype=src.dtype, device=src.device)
    tokens = B * H * W
    if dst.numel() == 0:
        return dst
    block_c = min(triton.next_power_of_2(C), 128)
    block_t = max(1, 4096 // block_c)
    grid = (triton.cdiv(tokens, block_t), triton.cdiv(C, block_c))
    _window_shuffle_kernel[grid](
        src, dst, tokens, H, W, C,
        shift % H, shift % W,  # torch.roll wraps, so a shift is only defined modulo H and W
        window_size, to_windows,
        BLOCK_T=block_t, BLOCK_C=block_c,
    )
    return dst


if triton_available():

    @triton.jit
    def _window_shuffle_kernel(
        src, dst, tokens, H, W, C, shift_h, shift_w, window_size,
        TO_WINDOWS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        # Image token (b, h, w) sits at (h + shift_h, w + shift_w) of the rolled map, i.e. at
        # window (b, hs // ws, ws_ // ws), position (hs % ws, ws_ % ws) inside it.
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        t = t.to(tl.int64)
        w = t % W
        h = (t // W) % H
        b = t // (H * W)
        hs = (h + shift_h) % H
        wss = (w + shift_w) % W
        windows_per_row = W // window_size
        window = (b * (H // window_size) + hs // window_size) * windows_per_row + wss // window_size
        inside = (hs % window_size) * window_size + wss % window_size
        t_win = window * window_size * window_size + inside

        mask = (t[:, None] < tokens) & (c[None, :] < C)
        image_offsets = t[:, None] * C + c[None, :]
        window_offsets = t_win[:, None] * C + c[None, :]
        if TO_WINDOWS:
            values = tl.load(src + image_offsets, mask=mask)
            tl.store(dst + window_offsets, values, mask=mask)
        else:
            values = tl.load(src + window_offsets, mask=mask)
            tl.store(dst + image_offsets, values, mask=mask)
