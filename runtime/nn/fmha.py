"""``FusedSwinFmha``: the migration guide's call signature over ``accrewrite.kernels.swin_fmha``.

    attn = FusedSwinFmha.apply(attn, relative_pos_bias, attn_mask, batch_size, window_num,
                               num_head, window_len)

replaces, in Swin's ``WindowAttention.forward``, the lines from
``attn = attn + relative_position_bias.unsqueeze(0)`` to ``attn = self.softmax(attn)``:
``attn`` is the scaled ``q @ k.transpose(-2, -1)`` of shape ``(batch_size * window_num,
num_head, window_len, window_len)`` (``window_len`` = tokens per window), ``attn_mask`` the
shifted-window mask ``(window_num, window_len, window_len)`` or None. Returns the attention
probabilities in ``attn``'s shape and dtype.
"""

from accrewrite.kernels.swin_fmha import swin_fmha

__all__ = ["FusedSwinFmha"]


class FusedSwinFmha:
    """``softmax(attn + relative_pos_bias + attn_mask)``, fused (Triton on CUDA)."""

    @staticmethod
    def apply(attn, relative_pos_bias, attn_mask, batch_size, window_num, num_head, window_len):
        expected = (batch_size * window_num, num_head, window_len, window_len)
        if attn.numel() != batch_size * window_num * num_head * window_len**2:
            raise ValueError(
                f"FusedSwinFmha.apply: attn of shape {tuple(attn.shape)} does not match "
                f"batch_size * window_num, num_head, window_len, window_len = {expected}"
            )
        if attn_mask is not None and attn_mask.numel() != window_num * window_len**2:
            raise ValueError(
                f"FusedSwinFmha.apply: attn_mask of shape {tuple(attn_mask.shape)} is not "
                f"(window_num, window_len, window_len) = {(window_num, window_len, window_len)}"
            )
        probs = swin_fmha(attn.reshape(expected), relative_pos_bias, attn_mask)
        return probs.view(attn.shape)
