"""FusedSwinFmha.apply with the signature of TorchAcc's migration guide, against Swin's eager
WindowAttention code."""

import pytest
import torch

from accrewrite.runtime.nn import FusedSwinFmha


def _eager_swin(attn, bias, mask, num_head, window_len):
    attn = attn + bias.unsqueeze(0)
    if mask is not None:
        nw = mask.shape[0]
        attn = attn.view(-1, nw, num_head, window_len, window_len) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, num_head, window_len, window_len)
    return torch.softmax(attn, dim=-1)


@pytest.mark.parametrize("shifted", [True, False])
def test_matches_eager_swin_with_gradients(shifted):
    batch, nw, heads, n = 2, 4, 3, 16
    attn = torch.randn(batch * nw, heads, n, n, requires_grad=True)
    bias = torch.randn(heads, n, n, requires_grad=True)
    mask = torch.randint(0, 2, (nw, n, n)).float() * -100.0 if shifted else None
    attn_ref = attn.detach().clone().requires_grad_()
    bias_ref = bias.detach().clone().requires_grad_()

    probs = FusedSwinFmha.apply(attn, bias, mask, batch, nw, heads, n)
    probs_ref = _eager_swin(attn_ref, bias_ref, mask, heads, n)
    torch.testing.assert_close(probs, probs_ref)
    grad = torch.randn_like(probs)
    probs.backward(grad)
    probs_ref.backward(grad)
    torch.testing.assert_close(attn.grad, attn_ref.grad)
    torch.testing.assert_close(bias.grad, bias_ref.grad)


def test_signature_arguments_are_checked():
    attn = torch.randn(8, 3, 16, 16)
    with pytest.raises(ValueError, match="batch_size"):
        FusedSwinFmha.apply(attn, torch.randn(3, 16, 16), None, 3, 4, 3, 16)
    with pytest.raises(ValueError, match="window_num"):
        FusedSwinFmha.apply(attn, torch.randn(3, 16, 16), torch.zeros(2, 16, 16), 2, 4, 3, 16)
