"""swin_fmha cases: the fused bias + mask + softmax kernel against Swin's eager
``WindowAttention`` code (and torch.compile of it), Swin-T shapes at batch 128.

The eager baseline is the code users run today: under autocast ``attn`` is bf16 while the
relative position bias and the mask are fp32, so eager adds and normalises in fp32 and returns
fp32 probabilities; ours computes in fp32 and returns them in ``attn``'s dtype.

Goal: forward + backward at least 1.25x eager.
"""

import torch

from accrewrite.kernels.swin_fmha import swin_fmha

from . import Case, forward_backward

# (images, windows per image, heads, tokens per window, shifted, attn dtype): Swin-T stage 1
# (56x56 map in 7x7 windows, 3 heads) and stage 3 (14x14, 12 heads), shifted blocks.
SHAPES = [(128, 64, 3, 49, torch.bfloat16), (128, 4, 12, 49, torch.bfloat16),
          (128, 64, 3, 49, torch.float32)]
SMOKE_SHAPES = [(2, 2, 2, 9, torch.float32)]


def eager_swin(attn, bias, mask):
    """Swin's WindowAttention.forward, from the bias add to the softmax."""
    windows, heads, n, _ = attn.shape
    nw = mask.shape[0]
    attn = attn + bias.unsqueeze(0)
    attn = attn.view(windows // nw, nw, heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
    return torch.softmax(attn.view(-1, heads, n, n), dim=-1)


def cases(device, *, smoke=False, compile=torch.compile):
    result = []
    for images, nw, heads, n, dtype in SMOKE_SHAPES if smoke else SHAPES:
        attn = torch.randn(images * nw, heads, n, n, device=device, dtype=dtype,
                           requires_grad=True)
        bias = torch.randn(heads, n, n, device=device, requires_grad=True)
        mask = torch.randint(0, 2, (nw, n, n), device=device).float() * -100.0
        inputs = (attn, bias, mask)
        grad_out = torch.randn(attn.shape, device=device)
        result.append(Case(
            name=f"swin_fmha {str(dtype).removeprefix('torch.')} "
                 f"{images}x{nw} windows, {heads} heads, N={n}",
            ours=forward_backward(swin_fmha, inputs, grad_out.to(dtype)),
            eager=forward_backward(eager_swin, inputs, grad_out),
            compiled=forward_backward(compile(eager_swin), inputs, grad_out),
        ))
    return result
