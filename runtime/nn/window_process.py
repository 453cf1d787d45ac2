"""``WindowProcess`` / ``WindowProcessReverse``: the migration guide's call signatures over
``accrewrite.kernels.window_process`` (Triton on CUDA, ``torch.roll`` + ``window_partition``
elsewhere, bit-exact either way).

    x_windows = WindowProcess.apply(x, B, H, W, C, -shift_size, window_size)
    x = WindowProcessReverse.apply(attn_windows, B, H, W, C, shift_size, window_size)

``shift_size`` is signed, as given to ``torch.roll``: the forward call of a shifted block passes
``-shift_size`` and the reverse call ``+shift_size``, exactly as Swin's fused kernel.
"""

from accrewrite.kernels.window_process import window_process, window_process_reverse

__all__ = ["WindowProcess", "WindowProcessReverse"]


class WindowProcess:
    """Cyclic shift + window partition of ``x`` ``(B, H, W, C)`` -> ``(B * nW, ws, ws, C)``."""

    @staticmethod
    def apply(x, B, H, W, C, shift_size, window_size):
        if tuple(x.shape) != (B, H, W, C):
            raise ValueError(
                f"WindowProcess.apply: x has shape {tuple(x.shape)} but B, H, W, C = "
                f"{(B, H, W, C)}"
            )
        return window_process(x, shift_size, window_size)


class WindowProcessReverse:
    """Window merge + reverse cyclic shift of ``windows`` ``(B * nW, ws, ws, C)`` ->
    ``(B, H, W, C)``."""

    @staticmethod
    def apply(windows, B, H, W, C, shift_size, window_size):
        if windows.numel() != B * H * W * C or windows.shape[-1] != C:
            raise ValueError(
                f"WindowProcessReverse.apply: windows of shape {tuple(windows.shape)} do not "
                f"hold B, H, W, C = {(B, H, W, C)}"
            )
        return window_process_reverse(windows, H, W, shift_size, window_size)
