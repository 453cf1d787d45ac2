"""The operators' PyTorch path (CPU tensors, float64, ``ACCREWRITE_KERNELS=reference``) has a
backward of its own, written by hand beside the Triton one: gradcheck it in float64."""

import pytest
import torch

from accrewrite.kernels import bias_dropout_add as bda
from accrewrite.kernels import layer_norm as ln
from accrewrite.kernels import quick_gelu as qg
from accrewrite.kernels import swin_fmha as fmha
from accrewrite.kernels import window_process as wp


@pytest.fixture(autouse=True)
def _reference(monkeypatch):
    monkeypatch.setenv("ACCREWRITE_KERNELS", "reference")


def t(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


CASES = {
    "quick_gelu": (qg.quick_gelu, lambda: (t(3, 7),)),
    "layer_norm": (lambda x, w, b: ln.layer_norm(x, 7, w, b), lambda: (t(3, 7), t(7), t(7))),
    "layer_norm_2d_weight_only": (lambda x, w: ln.layer_norm(x, (2, 3), w),
                                  lambda: (t(4, 2, 3), t(2, 3))),
    "layer_norm_no_affine": (lambda x: ln.layer_norm(x, 5), lambda: (t(2, 3, 5),)),
    "bias_dropout_add": (lambda x, b, r: bda.bias_dropout_add(x, b, r, 0.3, seed=11),
                         lambda: (t(4, 6), t(6), t(4, 6))),
    "swin_fmha": (fmha.swin_fmha, lambda: (t(4, 2, 5, 5), t(2, 5, 5))),
    "swin_fmha_masked": (fmha.swin_fmha, lambda: (t(4, 2, 5, 5), t(2, 5, 5), t(2, 5, 5))),
    "window_process": (lambda x: wp.window_process(x, -1, 2), lambda: (t(2, 4, 4, 3),)),
    "window_process_reverse": (lambda w: wp.window_process_reverse(w, 4, 4, 1, 2),
                               lambda: (t(8, 2, 2, 3),)),
}


@pytest.mark.parametrize("name", CASES)
def test_reference_path_backward(name):
    fn, inputs = CASES[name]
    torch.manual_seed(0)
    assert torch.autograd.gradcheck(fn, inputs())
