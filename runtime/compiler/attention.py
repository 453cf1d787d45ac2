"""Causal self-attention from matmuls, in blocks of queries: the kernel-selection pass's
alternative to ATen's fused CPU attention kernel (``kernel_selection.py`` chooses).

ATen's fused CPU kernel works through small tiles of queries and keys, and at short sequences
its causal form gains nothing from the masked half (a training step of 64 tokens: 7.0 ms causal,
6.5 ms without the mask). Written out in blocks of ``BLOCK`` queries, each block attends only to
the keys up to its last query, so the matmuls skip much of the masked half of the scores (half of
it at 128 tokens, 15/16 at 1024), run as batched GEMMs, and inductor fuses the mask and softmax
(and their backward) around them. Training keeps each block's probabilities for the backward:
about T / 2 scores per query, where the fused kernel keeps one log-sum-exp (see
``kernel_selection`` for when the blocks are chosen).
"""

import torch

BLOCK = 64  # queries per block: measured best of 32, 64 and 128 at 64 to 1024 tokens


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` for ``q``, ``k`` and ``v`` of
    one shape (..., T, D): query i attends to keys 0..i."""
    tokens, scale = q.shape[-2], q.shape[-1] ** -0.5
    outputs = []
    for start in range(0, tokens, BLOCK):
        stop = min(start + BLOCK, tokens)
        scores = q[..., start:stop, :] @ k[..., :stop, :].transpose(-2, -1) * scale
        # key j is masked for the block's row r (query start + r) where j > start + r
        mask = torch.full((stop - start, stop), float("-inf"), dtype=q.dtype, device=q.device)
        scores = scores + mask.triu(start + 1)
        outputs.append(scores.softmax(-1) @ v[..., :stop, :])
    return torch.cat(outputs, dim=-2)
