"""The operators' PyTorch path (what compiled graphs run off CUDA; eager calls there take the
reference directly) has a backward of its own, written by hand beside the Triton one: gradcheck
it in float64."""

import pytest
import torch

from accrewrite.kernels.bias_dropout_add import bias_dropout_add_op
from accrewrite.kernels.layer_norm import layer_norm_op
from accrewrite.kernels.quick_gelu import quick_gelu_op
from accrewrite.kernels.swin_fmha import swin_fmha_op
from accrewrite.kernels.window_process import window_shuffle_op


@pytest.fixture(autouse=True)
def _reference(monkeypatch):
    monkeypatch.setenv("ACCREWRITE_KERNELS", "reference")


def t(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


CASES = {
    "quick_gelu": (quick_gelu_op, lambda: (t(3, 7),)),
    "layer_norm": (lambda x, w, b: layer_norm_op(x, [7], w, b, 1e-5)[0],
                   lambda: (t(3, 7), t(7), t(7))),
    "layer_norm_2d_weight_only": (lambda x, w: layer_norm_op(x, [2, 3], w, None, 1e-5)[0],
                                  lambda: (t(4, 2, 3), t(2, 3))),
    "layer_norm_no_affine": (lambda x: layer_norm_op(x, [5], None, None, 1e-5)[0],
                             lambda: (t(2, 3, 5),)),
    "bias_dropout_add": (lambda x, b, r: bias_dropout_add_op(x, b, r, 0.3, torch.tensor(11)),
                         lambda: (t(4, 6), t(6), t(4, 6))),
    "swin_fmha": (lambda a, b: swin_fmha_op(a, b, None)[0], lambda: (t(4, 2, 5, 5), t(2, 5, 5))),
    "swin_fmha_masked": (lambda a, b, m: swin_fmha_op(a, b, m)[0],
                         lambda: (t(4, 2, 5, 5), t(2, 5, 5), t(2, 5, 5))),
    "window_process": (lambda x: window_shuffle_op(x, [2, 4, 4, 3], -1, 2, True),
                       lambda: (t(2, 4, 4, 3),)),
    "window_process_reverse": (lambda w: window_shuffle_op(w, [2, 4, 4, 3], -1, 2, False),
                               lambda: (t(8, 2, 2, 3),)),
}


@pytest.mark.parametrize("name", CASES)
def test_reference_path_backward(name):
    fn, inputs = CASES[name]
    torch.manual_seed(0)
    assert torch.autograd.gradcheck(fn, inputs())
