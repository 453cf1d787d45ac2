"""nms and soft_nms: the Triton kernels (interpreter on CPU) against the PyTorch references,
and the references against hand-worked cases and a line-by-line port of mmcv's softnms_cpu.

NMS decisions are exact (same kept indices); the decayed scores of Soft-NMS may differ by the
rounding of exp, hence a tolerance of a few fp32 ulps on them.
"""

import math

import pytest
import torch

from accrewrite.kernels.nms import (
    SOFT_NMS_METHODS,
    nms,
    nms_op,
    nms_reference,
    soft_nms,
    soft_nms_op,
    soft_nms_reference,
)

SCORE_TOLERANCE = dict(atol=1e-6, rtol=1e-5)
INPUT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def random_boxes(n, device, seed=0, dtype=torch.float32):
    """Clustered boxes (so that many overlap), a few duplicates and repeated scores (ties)."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.rand(max(1, n // 8), 2, generator=g) * 60
    xy = centers[torch.randint(len(centers), (n,), generator=g)] + torch.randn(n, 2, generator=g)
    wh = torch.rand(n, 2, generator=g) * 12 + 2
    boxes = torch.cat([xy, xy + wh], dim=1)
    scores = torch.rand(n, generator=g)
    if n > 4:
        boxes[1] = boxes[0]
        scores[2::5] = scores[2]
    return boxes.to(device, dtype), scores.to(device, dtype)


@pytest.fixture
def triton_mode(monkeypatch):
    monkeypatch.setenv("ACCREWRITE_KERNELS", "triton")


# --- greedy NMS -------------------------------------------------------------------------------

def test_reference_greedy_semantics(device):
    # A suppresses B (IoU 2/3). C overlaps B by 2/3 but A by only 3/7, so at 0.5 C survives:
    # B, itself suppressed, suppresses nothing. D's IoU with A is exactly 1/3, and suppression
    # needs IoU *greater than* the threshold. E overlaps nothing.
    boxes = torch.tensor([[0, 0, 10, 10], [2, 0, 12, 10], [4, 0, 14, 10], [-5, 0, 5, 10],
                          [50, 50, 51, 51]], dtype=torch.float32, device=device)
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.1], device=device)
    assert nms_reference(boxes, scores, 0.5).tolist() == [0, 2, 3, 4]
    assert nms_reference(boxes, scores, 1 / 3).tolist() == [0, 3, 4]
    assert nms_reference(boxes, scores, 0.3).tolist() == [0, 4]
    # offset=1 (pixel boxes, one wider): D's IoU with A grows from 1/3 to 66/176 = 0.375
    assert nms_reference(boxes, scores, 0.35).tolist() == [0, 3, 4]
    assert nms_reference(boxes, scores, 0.35, offset=1).tolist() == [0, 4]
    # the output is by decreasing score; equal scores keep their input order
    assert nms_reference(boxes[[4, 0]], torch.tensor([0.5, 0.9], device=device), 0.5).tolist() \
        == [1, 0]
    assert nms_reference(boxes[[4, 0]], torch.tensor([0.5, 0.5], device=device), 0.5).tolist() \
        == [0, 1]


@pytest.mark.usefixtures("triton_mode")
@pytest.mark.parametrize("n", [0, 1, 2, 63, 64, 65, 150])
def test_triton_matches_reference(device, n):
    boxes, scores = random_boxes(n, device, seed=n)
    for threshold in (0.0, 0.2, 0.5, 0.9):
        for offset in (0, 1):
            expected = nms_reference(boxes, scores, threshold, offset)
            got = nms(boxes, scores, threshold, offset)
            assert got.dtype == torch.int64
            assert torch.equal(got, expected), (threshold, offset)


@pytest.mark.usefixtures("triton_mode")
def test_scan_merging_kept_rows_in_several_loads(device, monkeypatch):
    import accrewrite.kernels.nms as module

    monkeypatch.setattr(module, "_SCAN_TILE", 16)  # 150 boxes: 4 words, so 4 rows per load
    boxes, scores = random_boxes(150, device, seed=7)
    for threshold in (0.1, 0.5):
        assert torch.equal(nms(boxes, scores, threshold), nms_reference(boxes, scores, threshold))


@pytest.mark.usefixtures("triton_mode")
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
def test_triton_matches_reference_per_input_dtype(device, dtype):
    boxes, scores = random_boxes(70, device, seed=1, dtype=dtype)
    assert torch.equal(nms(boxes, scores, 0.4), nms_reference(boxes, scores, 0.4))


@pytest.mark.usefixtures("triton_mode")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_degenerate_boxes(device):
    # zero-area and identical boxes: IoU 0/0 is NaN, which suppresses nothing (torchvision)
    boxes = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 4, 4], [0, 0, 4, 4]],
                         dtype=torch.float32, device=device)
    scores = torch.tensor([0.4, 0.3, 0.2, 0.1], device=device)
    assert nms(boxes, scores, 0.5).tolist() == nms_reference(boxes, scores, 0.5).tolist() \
        == [0, 1, 2]


# --- Soft-NMS ---------------------------------------------------------------------------------

def mmcv_softnms_cpu(boxes, scores, iou_threshold, sigma, min_score, method, offset):
    """mmcv/ops/csrc/pytorch/cpu/nms.cpp ``softnms_cpu``, transcribed statement by statement (in
    fp32 via 0-d tensors) as the oracle of the vectorised reference."""
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    x1, y1, x2, y2 = [[f32(v) for v in boxes[:, k].tolist()] for k in range(4)]
    sc = [f32(v) for v in scores.tolist()]
    areas = [(x2[k] - x1[k] + offset) * (y2[k] - y1[k] + offset) for k in range(len(sc))]
    inds = list(range(len(sc)))
    columns = [x1, y1, x2, y2, sc, areas, inds]
    dets = []
    nboxes = len(sc)
    i = 0
    while i < nboxes:
        max_pos = i
        for pos in range(i + 1, nboxes):
            if sc[max_pos] < sc[pos]:
                max_pos = pos
        for column in columns:
            column[i], column[max_pos] = column[max_pos], column[i]
        dets.append([float(c[i]) for c in (x1, y1, x2, y2, sc)])
        pos = i + 1
        while pos < nboxes:
            w = torch.clamp(torch.minimum(x2[i], x2[pos]) - torch.maximum(x1[i], x1[pos])
                            + offset, min=0)
            h = torch.clamp(torch.minimum(y2[i], y2[pos]) - torch.maximum(y1[i], y1[pos])
                            + offset, min=0)
            inter = w * h
            ovr = inter / (areas[i] + areas[pos] - inter)
            weight = f32(1.0)
            if method == 0 and ovr >= iou_threshold:
                weight = f32(0.0)
            elif method == 1 and ovr >= iou_threshold:
                weight = 1 - ovr
            elif method == 2:
                weight = torch.exp(-(ovr * ovr) / sigma)
            sc[pos] = sc[pos] * weight
            if sc[pos] < min_score:
                for column in columns:
                    column[pos] = column[nboxes - 1]
                nboxes -= 1
                pos -= 1
            pos += 1
        i += 1
    return torch.tensor(dets, dtype=torch.float32).reshape(-1, 5), torch.tensor(inds[:nboxes])


@pytest.mark.parametrize("method", list(SOFT_NMS_METHODS))
def test_reference_matches_mmcv_loop(method):
    boxes, scores = random_boxes(40, "cpu", seed=3)
    # min_score high enough that boxes drop out mid-loop and the swap-with-last order matters
    for min_score in (0.001, 0.2):
        for offset in (0, 1):
            args = (0.3, 0.5, min_score, method, offset)
            dets, inds = soft_nms_reference(boxes, scores, *args)
            want_dets, want_inds = mmcv_softnms_cpu(boxes, scores, 0.3, 0.5, min_score,
                                                    SOFT_NMS_METHODS[method], offset)
            assert inds.tolist() == want_inds.tolist(), args
            torch.testing.assert_close(dets, want_dets, **SCORE_TOLERANCE)


def test_labels_act_as_mmcv_class_offsets():
    """Per-label Soft-NMS == mmcv batched_nms's trick: offset each class's boxes so that
    classes never overlap, then run class-agnostic Soft-NMS."""
    boxes, scores = random_boxes(40, "cpu", seed=4)
    labels = torch.arange(40) % 3
    shifted = boxes + (labels.float() * (boxes.max() + 1))[:, None]
    for method in SOFT_NMS_METHODS:
        dets, inds = soft_nms_reference(boxes, scores, 0.3, 0.5, 0.05, method, 0, labels)
        _, want_inds = soft_nms_reference(shifted, scores, 0.3, 0.5, 0.05, method, 0)
        assert inds.tolist() == want_inds.tolist()
        torch.testing.assert_close(dets[:, :4], boxes[inds])


def test_gaussian_decay_value():
    boxes = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 5]])  # IoU 0.5
    dets, inds = soft_nms_reference(boxes, torch.tensor([0.9, 0.8]), method="gaussian", sigma=0.5)
    assert inds.tolist() == [0, 1]
    assert dets[1, 4].item() == pytest.approx(0.8 * math.exp(-0.25 / 0.5))
    dets, _ = soft_nms_reference(boxes, torch.tensor([0.9, 0.8]), iou_threshold=0.3)
    assert dets[1, 4].item() == pytest.approx(0.8 * 0.5)  # linear: 1 - IoU


@pytest.mark.usefixtures("triton_mode")
@pytest.mark.parametrize("method", list(SOFT_NMS_METHODS))
@pytest.mark.parametrize("with_labels", [False, True], ids=["agnostic", "labels"])
def test_triton_soft_nms_matches_reference(device, method, with_labels):
    boxes, scores = random_boxes(45, device, seed=5)
    labels = (torch.arange(45, device=device) % 2) if with_labels else None
    for min_score in (0.001, 0.2):
        args = (0.3, 0.5, min_score, method, 0, labels)
        dets, inds = soft_nms(boxes, scores, *args)
        want_dets, want_inds = soft_nms_reference(boxes, scores, *args)
        assert torch.equal(inds, want_inds)
        torch.testing.assert_close(dets, want_dets, **SCORE_TOLERANCE)


@pytest.mark.usefixtures("triton_mode")
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
def test_triton_soft_nms_input_dtypes(device, dtype):
    boxes, scores = random_boxes(20, device, seed=6, dtype=dtype)
    dets, inds = soft_nms(boxes, scores, method="gaussian")
    want_dets, want_inds = soft_nms_reference(boxes, scores, method="gaussian")
    assert dets.dtype == dtype
    assert torch.equal(inds, want_inds)
    torch.testing.assert_close(dets, want_dets, **SCORE_TOLERANCE)


def test_empty_and_bad_input(device):
    empty = torch.zeros(0, 4, device=device)
    assert nms(empty, torch.zeros(0, device=device), 0.5).shape == (0,)
    dets, inds = soft_nms(empty, torch.zeros(0, device=device))
    assert dets.shape == (0, 5) and inds.shape == (0,)
    boxes, scores = random_boxes(3, device)
    with pytest.raises(ValueError, match=r"\(N, 4\)"):
        nms(boxes[:, :3], scores, 0.5)
    with pytest.raises(ValueError, match="scores"):
        nms(boxes, scores[:2], 0.5)
    with pytest.raises(ValueError, match="offset"):
        nms(boxes, scores, 0.5, offset=2)
    with pytest.raises(TypeError, match="floating"):
        nms(boxes.long(), scores, 0.5)
    with pytest.raises(ValueError, match="method"):
        soft_nms(boxes, scores, method="hard")
    with pytest.raises(ValueError, match="sigma"):
        soft_nms(boxes, scores, method="gaussian", sigma=0)


@pytest.mark.parametrize("mode", ["reference", "triton"])
def test_operators_registration(monkeypatch, mode):
    """Schema and fake implementation: the kept count is a size the data decides."""
    monkeypatch.setenv("ACCREWRITE_KERNELS", mode)
    boxes, scores = random_boxes(40, "cpu")
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(nms_op, (boxes, scores, 0.5, 0), test_utils=checks)
    torch.library.opcheck(soft_nms_op, (boxes, scores, 0.3, 0.5, 1e-3, "gaussian", 1, None),
                          test_utils=checks)
