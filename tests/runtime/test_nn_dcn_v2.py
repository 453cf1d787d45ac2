"""DCN / DCNv2 (TorchAcc's ``torchacc.runtime.nn.dcn_v2``, the ``dcn_v2`` package's interface).

The plain-PyTorch path is held to a per-tap loop (``_deform_loop.py``: bilinear reads, zero
outside the image), forward and backward, and to gradcheck in float64; torchvision's kernel is
held to the plain path where torchvision's compiled ops load in this process, and under the
torch_xla interpreter (whose torchvision loads) together with the plain path on the XLA device.
"""

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from accrewrite.runtime import nn as accnn
from accrewrite.runtime.nn import dcn_v2
from accrewrite.runtime.nn.dcn_v2 import DCN, DCNv2, dcn_v2_conv, deform_conv2d, deform_conv2d_reference
from _deform_loop import deform_conv_loop as _loop

MODULE_FILE = Path(dcn_v2.__file__)

# (batch, channels, height, width, out_channels, kernel, stride, padding, dilation,
#  deformable groups, weight groups, bias, mask)
CASES = {
    "3x3-batch1": (1, 3, 7, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, False),
    "1x1": (2, 2, 5, 6, 3, (1, 1), (1, 1), (0, 0), (1, 1), 1, 1, False, True),
    "5x3-strided-dilated": (2, 4, 9, 8, 5, (5, 3), (2, 1), (2, 1), (1, 2), 2, 1, True, True),
    "3x2-groups": (3, 6, 6, 7, 4, (3, 2), (1, 2), (1, 0), (2, 1), 3, 2, False, True),
    "2x3-one-row": (2, 4, 1, 9, 3, (1, 3), (1, 2), (0, 1), (1, 1), 4, 1, True, False),
}


def _arguments(case, dtype=torch.float64, seed=0):
    (batch, channels, height, width, out_channels, kernel, stride, padding, dilation,
     offset_groups, groups, bias, mask) = case
    generator = torch.Generator().manual_seed(seed)
    out_h = (height + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    out_w = (width + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    taps = kernel[0] * kernel[1]

    def normal(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).to(dtype)

    # Offsets up to a few pixels: many samples fall between pixels, some off the image.
    tensors = {
        "input": normal(batch, channels, height, width),
        "offset": normal(batch, 2 * offset_groups * taps, out_h, out_w, scale=1.5),
        "weight": normal(out_channels, channels // groups, *kernel),
        "bias": normal(out_channels) if bias else None,
        "mask": torch.rand(batch, offset_groups * taps, out_h, out_w, generator=generator,
                           dtype=torch.float64).to(dtype) if mask else None,
    }
    return tensors, {"stride": stride, "padding": padding, "dilation": dilation}


def _call(function, tensors, options):
    return function(tensors["input"], tensors["offset"], tensors["weight"], tensors["bias"],
                    mask=tensors["mask"], **options)


def _differentiable(tensors):
    return {name: None if t is None else t.clone().requires_grad_() for name, t in tensors.items()}


def _gradients(function, tensors, options):
    leaves = _differentiable(tensors)
    output = _call(function, leaves, options)
    output.backward(torch.linspace(-1, 1, output.numel(), dtype=output.dtype).view_as(output))
    return output.detach(), {name: t.grad for name, t in leaves.items() if t is not None}


@pytest.mark.parametrize("name", CASES)
def test_reference_is_the_per_sample_loop_forward_and_backward(name):
    tensors, options = _arguments(CASES[name])
    output, gradients = _gradients(deform_conv2d_reference, tensors, options)
    expected, expected_gradients = _gradients(_loop, tensors, options)
    torch.testing.assert_close(output, expected)
    assert gradients.keys() == expected_gradients.keys()
    for key in gradients:
        torch.testing.assert_close(gradients[key], expected_gradients[key], msg=key)


# Small enough for gradcheck's one evaluation per element: every feature of CASES once.
GRADCHECK_CASES = {
    "3x3-padded": (1, 2, 4, 3, 2, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, False),
    "3x2-strided-dilated-groups": (1, 4, 4, 5, 2, (3, 2), (2, 1), (1, 0), (1, 2), 2, 2, False, True),
    "1x3-one-row-batch2": (2, 2, 1, 5, 2, (1, 3), (1, 2), (0, 1), (1, 1), 2, 1, True, True),
}


@pytest.mark.parametrize("name", GRADCHECK_CASES)
def test_reference_gradcheck_float64(name):
    tensors, options = _arguments(GRADCHECK_CASES[name], seed=1)
    names = [key for key, value in tensors.items() if value is not None]
    leaves = _differentiable(tensors)

    def function(*values):
        return _call(deform_conv2d_reference, {**leaves, **dict(zip(names, values))}, options)

    assert torch.autograd.gradcheck(function, tuple(leaves[key] for key in names))


@pytest.mark.parametrize("name", ["3x3-batch1", "5x3-strided-dilated", "2x3-one-row"])
def test_points_on_pixels_and_on_the_border_take_the_kernels_slopes(name):
    """Whole-pixel offsets (a DCN starts at zero, its padded taps on row and column -1): the
    gradient there is one-sided, from the cell below and to the right, and none at -1."""
    tensors, options = _arguments(CASES[name])
    for offset in (torch.zeros_like(tensors["offset"]), tensors["offset"].round()):
        on_pixels = {**tensors, "offset": offset}
        output, gradients = _gradients(deform_conv2d_reference, on_pixels, options)
        expected, expected_gradients = _gradients(_loop, on_pixels, options)
        torch.testing.assert_close(output, expected)
        for key in gradients:
            torch.testing.assert_close(gradients[key], expected_gradients[key], msg=key)


def test_zero_offsets_without_a_mask_are_a_convolution():
    tensors, options = _arguments(CASES["3x2-groups"])
    zero = torch.zeros_like(tensors["offset"])
    output = deform_conv2d_reference(tensors["input"], zero, tensors["weight"], None, **options)
    torch.testing.assert_close(output, F.conv2d(tensors["input"], tensors["weight"], None, groups=2, **options))


@pytest.mark.parametrize("function", [deform_conv2d_reference, deform_conv2d])
def test_half_precision_computes_in_float32_and_returns_its_dtype(function):
    tensors, options = _arguments(CASES["5x3-strided-dilated"], dtype=torch.float32)
    for dtype in (torch.bfloat16, torch.float16):
        low = {k: None if t is None else t.to(dtype) for k, t in tensors.items()}
        output = _call(function, low, options)
        assert output.dtype == dtype
        # the rounding of the inputs to half precision is the only difference
        exact = _call(deform_conv2d_reference, {k: None if t is None else t.float() for k, t in low.items()}, options)
        torch.testing.assert_close(output, exact.to(dtype))


def test_dcnv2_takes_offsets_and_mask():
    torch.manual_seed(0)
    layer = DCNv2(4, 5, (5, 3), (2, 1), (2, 1), dilation=(1, 2), deformable_groups=2)
    tensors, options = _arguments(CASES["5x3-strided-dilated"], dtype=torch.float32)
    output = layer(tensors["input"], tensors["offset"], tensors["mask"])
    expected = _loop(tensors["input"], tensors["offset"], layer.weight.detach(), layer.bias.detach(),
                     mask=tensors["mask"], **options)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    assert dict(layer.named_parameters()).keys() == {"weight", "bias"}
    assert layer.weight.shape == (5, 4, 5, 3) and torch.all(layer.bias == 0)
    assert layer.weight.abs().max() <= 1 / math.sqrt(4 * 15)


def test_dcn_predicts_offsets_and_a_sigmoid_mask_with_its_own_convolution():
    torch.manual_seed(0)
    layer = DCN(4, 3, 3, 1, 1, dilation=2, deformable_groups=2)
    assert layer.conv_offset_mask.weight.shape == (3 * 2 * 9, 4, 3, 3)
    assert sorted(layer.state_dict()) == ["bias", "conv_offset_mask.bias", "conv_offset_mask.weight", "weight"]
    x = torch.randn(2, 4, 7, 6)
    # Zero-initialised: zero offsets and a mask of sigmoid(0) = 0.5.
    plain = F.conv2d(x, layer.weight, None, padding=1, dilation=2)
    torch.testing.assert_close(layer(x), 0.5 * plain + layer.bias.view(1, -1, 1, 1))
    with torch.no_grad():
        layer.conv_offset_mask.weight.normal_(0, 0.3)
        layer.conv_offset_mask.bias.normal_(0, 0.3)
    predicted = layer.conv_offset_mask(x)
    offset = torch.cat((predicted[:, :18], predicted[:, 18:36]), dim=1)
    mask = torch.sigmoid(predicted[:, 36:])
    expected = _loop(x, offset, layer.weight, layer.bias, (1, 1), (1, 1), (2, 2), mask)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_dcn_learns_its_offsets():
    torch.manual_seed(0)
    layer = DCN(3, 4, 3, 1, 1, bias=False)
    assert layer.bias is None and "bias" not in layer.state_dict()
    x = torch.randn(2, 3, 9, 9)
    layer(x).square().mean().backward()
    assert layer.weight.grad.abs().sum() > 0
    # Through the offsets and the mask: zero-initialised, they are moved by the first step.
    assert layer.conv_offset_mask.weight.grad.abs().sum() > 0


def test_functional_forms_agree():
    tensors, options = _arguments(CASES["3x2-groups"], dtype=torch.float32)
    expected = _call(deform_conv2d_reference, tensors, options)
    torch.testing.assert_close(_call(deform_conv2d, tensors, options), expected)
    no_groups = {**tensors, "weight": tensors["weight"].repeat(1, 2, 1, 1)}
    torch.testing.assert_close(
        dcn_v2_conv(no_groups["input"], no_groups["offset"], no_groups["mask"], no_groups["weight"],
                    None, options["stride"], options["padding"], options["dilation"], 3),
        _call(deform_conv2d_reference, no_groups, options),
    )
    assert accnn.DCN is DCN and accnn.DCNv2 is DCNv2 and accnn.deform_conv2d is deform_conv2d


def test_bad_arguments_say_what_is_wrong():
    tensors, options = _arguments(CASES["3x3-batch1"], dtype=torch.float32)
    x, offset, weight = tensors["input"], tensors["offset"], tensors["weight"]
    with pytest.raises(ValueError, match="offset has 17 channels; expected 2 \\* deformable_groups"):
        deform_conv2d_reference(x, offset[:, :17], weight, **options)
    with pytest.raises(ValueError, match="offset has shape .* expected .*the output's size"):
        deform_conv2d_reference(x, offset[..., :-1], weight, **options)
    with pytest.raises(ValueError, match="mask has shape"):
        deform_conv2d_reference(x, offset, weight, mask=torch.ones(1, 18, 7, 5), **options)
    with pytest.raises(ValueError, match="weight .* does not fit input channels 3"):
        deform_conv2d_reference(x, offset, torch.ones(4, 2, 3, 3), **options)
    with pytest.raises(ValueError, match="stride must be an int or a pair"):
        deform_conv2d_reference(x, offset, weight, stride=(1, 1, 1))
    with pytest.raises(ValueError, match="dcn_v2_conv: offset has 18 channels.*deformable_groups=2"):
        dcn_v2_conv(x, offset, None, weight, None, 1, 1, 1, 2)
    with pytest.raises(ValueError, match="in_channels \\(6\\) must be divisible by deformable_groups \\(4\\)"):
        DCN(6, 4, 3, 1, 1, deformable_groups=4)
    with pytest.raises(ValueError, match="mask has shape"):
        DCNv2(3, 4, 3, 1, 1)(x, offset, torch.ones(1, 9, 7, 4))


# torchvision's kernel ------------------------------------------------------------------------

torchvision_loads = pytest.mark.skipif(
    dcn_v2._torchvision_deform_conv2d() is None,
    reason="torchvision's compiled ops do not load in this process (not installed, or a build for "
           "another torch): DCN runs the plain path here, tested above; the torch_xla interpreter's "
           "test below holds torchvision to it",
)


@torchvision_loads
@pytest.mark.parametrize("name", CASES)
def test_torchvision_path_matches_the_reference(name):
    import torchvision

    tensors, options = _arguments(CASES[name], dtype=torch.float32)
    on_pixels = {**tensors, "offset": tensors["offset"].round()}
    # torchvision's own op off pixels; through deform_conv2d (dcn_v2's slopes) on pixels too
    for function, arguments in ((torchvision.ops.deform_conv2d, tensors), (deform_conv2d, tensors),
                                (deform_conv2d, on_pixels)):
        output, gradients = _gradients(function, arguments, options)
        expected, expected_gradients = _gradients(deform_conv2d_reference, arguments, options)
        torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-4)
        for key in gradients:
            torch.testing.assert_close(gradients[key], expected_gradients[key], rtol=1e-4, atol=1e-4, msg=key)


@torchvision_loads
def test_modules_run_torchvision_where_it_loads(monkeypatch):
    calls = []
    operator = dcn_v2._torchvision_deform_conv2d()
    monkeypatch.setattr(dcn_v2, "_torchvision_deform_conv2d", lambda: lambda *a: calls.append(a) or operator(*a))
    DCN(3, 4, 3, 1, 1)(torch.randn(1, 3, 6, 6))
    assert len(calls) == 1


@pytest.mark.slow
def test_a_torchvision_built_for_another_torch_falls_back_to_the_plain_path(tmp_path):
    """What installing torchvision from the registry next to a CPU torch gives: ``import
    torchvision`` fails in its operator registrations. The runtime imports it only at the first
    call, and then runs the plain path."""
    broken = tmp_path / "torchvision"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    script = textwrap.dedent("""
        import sys
        import torch
        from accrewrite.runtime.nn import DCN
        from accrewrite.runtime.nn.dcn_v2 import _torchvision_deform_conv2d
        layer = DCN(3, 4, 3, 1, 1)
        assert "torchvision" not in sys.modules  # nothing imported before the first call
        y = layer(torch.randn(2, 3, 5, 7))
        assert _torchvision_deform_conv2d() is None and tuple(y.shape) == (2, 4, 5, 7)
        print("plain path")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "plain path"


# Under torch_xla's interpreter: its torchvision loads, and XLA tensors take the plain path.
_XLA_PROBE = """
import importlib.util, json, sys
import torch
import torch_xla.core.xla_model as xm

spec = importlib.util.spec_from_file_location("dcn_v2_under_test", sys.argv[1])
dcn_v2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dcn_v2)
operator = dcn_v2._torchvision_deform_conv2d()
assert operator is not None, "torchvision's ops did not load"
calls = []  # the dtypes torchvision's op was given
dcn_v2._torchvision_deform_conv2d = lambda: lambda *args: calls.append(str(args[0].dtype)) or operator(*args)


def run(function, tensors, options):
    leaves = {key: t.detach().requires_grad_() for key, t in tensors.items() if t is not None}
    y = function(leaves["input"], leaves["offset"], leaves["weight"], leaves.get("bias"),
                 mask=leaves.get("mask"), **options)
    weights = torch.linspace(-1, 1, y.numel(), device=y.device).view_as(y)
    return [t.cpu() for t in (y, *torch.autograd.grad((y * weights).sum(), list(leaves.values())))]


report = {}
for name, (shapes, options, on_pixels) in json.loads(sys.argv[2]).items():
    torch.manual_seed(0)
    tensors = {key: None if shape is None else torch.randn(*shape) for key, shape in shapes.items()}
    tensors["offset"] = tensors["offset"] * 1.5
    if on_pixels:
        tensors["offset"] = tensors["offset"].round()
    if tensors["mask"] is not None:
        tensors["mask"] = torch.sigmoid(tensors["mask"])
    on_xla = {key: None if t is None else t.to(xm.xla_device()) for key, t in tensors.items()}
    reference = run(dcn_v2.deform_conv2d_reference, tensors, options)
    report[name] = {
        path: max((a - b).abs().max().item() for a, b in zip(result, reference))
        for path, result in (("torchvision", run(dcn_v2.deform_conv2d, tensors, options)),
                             ("xla", run(dcn_v2.deform_conv2d, on_xla, options)))
    }
    # bfloat16: torchvision's path too computes in float32; relative to the output's size
    half = {key: None if t is None else t.bfloat16() for key, t in tensors.items()}
    output, reference = (run(function, half, options)[0].float()
                         for function in (dcn_v2.deform_conv2d, dcn_v2.deform_conv2d_reference))
    report[name]["bfloat16"] = ((output - reference).abs().max() / reference.abs().max()).item()
print(json.dumps({"differences": report, "torchvision_calls": calls}))
"""


@pytest.mark.xla
@pytest.mark.slow
def test_torchvision_under_torch_xla_and_the_plain_path_on_the_xla_device(xla_python):
    cases = {}
    for name, case in CASES.items():
        tensors, options = _arguments(case, dtype=torch.float32)
        shapes = {key: list(t.shape) if t is not None else None for key, t in tensors.items()}
        cases[name] = (shapes, options, False)
        cases[f"{name}-on-pixels"] = (shapes, options, True)
    done = subprocess.run([xla_python, "-c", _XLA_PROBE, str(MODULE_FILE), json.dumps(cases)],
                          capture_output=True, text=True, timeout=300,
                          env={"PJRT_DEVICE": "CPU", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    report = printed["differences"]
    assert len(report) == 2 * len(CASES)
    # per case: float32 and bfloat16 (computed in float32) through torchvision, none for XLA tensors
    assert printed["torchvision_calls"] == ["torch.float32"] * 2 * len(report)
    for name, differences in report.items():
        assert differences["torchvision"] < 2e-5, (name, differences)
        assert differences["xla"] < 2e-5, (name, differences)
        assert differences["bfloat16"] < 1e-2, (name, differences)
