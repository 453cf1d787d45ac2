"""runtime.nn nms family: torchvision's nms interface and mmcv's nms / soft_nms / batched_nms
interfaces and return values (the reference path; tests/kernels/test_nms.py checks Triton).

Imported as TorchAcc's migration guide does (``from torchacc.runtime.nn.nms import nms, nms_normal``)."""

import numpy as np
import pytest
import torch

from accrewrite.runtime.nn.nms import batched_soft_nms, nms, nms_normal, soft_nms

# mmcv.ops.nms's docstring example: 3 boxes survive at IoU 0.6.
MMCV_NMS_BOXES = np.array([[49.1, 32.4, 51.0, 35.9], [49.3, 32.9, 51.0, 35.3],
                           [49.2, 31.8, 51.0, 35.4], [35.1, 11.5, 39.1, 15.7],
                           [35.6, 11.8, 39.3, 14.2], [35.3, 11.5, 39.9, 14.5],
                           [35.2, 11.7, 39.7, 15.7]], dtype=np.float32)
MMCV_NMS_SCORES = np.array([0.9, 0.9, 0.5, 0.5, 0.5, 0.4, 0.3], dtype=np.float32)


def test_nms_is_torchvision_interface():
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]])
    keep = nms(boxes, torch.tensor([0.5, 0.9, 0.7]), 0.5)
    assert keep.dtype == torch.int64
    assert keep.tolist() == [1, 2]


def test_package_level_nms_stays_callable_after_the_submodule_import():
    import accrewrite.runtime.nn as runtime_nn
    import accrewrite.runtime.nn.nms  # noqa: F401  binds runtime_nn.nms to the submodule

    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11]])
    assert runtime_nn.nms(boxes, torch.tensor([0.5, 0.9]), 0.5).tolist() == [1]
    assert runtime_nn.nms.soft_nms is soft_nms


def test_nms_normal_is_mmcv_nms():
    dets, inds = nms_normal(MMCV_NMS_BOXES, MMCV_NMS_SCORES, 0.6)
    assert isinstance(dets, np.ndarray) and isinstance(inds, np.ndarray)
    assert inds.tolist() == [0, 3, 4]
    np.testing.assert_array_equal(dets[:, :4], MMCV_NMS_BOXES[inds])
    np.testing.assert_array_equal(dets[:, 4], MMCV_NMS_SCORES[inds])

    boxes, scores = torch.from_numpy(MMCV_NMS_BOXES), torch.from_numpy(MMCV_NMS_SCORES)
    dets_t, inds_t = nms_normal(boxes, scores, 0.6)
    assert isinstance(dets_t, torch.Tensor) and dets_t.shape == (3, 5)
    # score_threshold drops boxes scoring at most it before NMS; max_num caps the output
    assert nms_normal(boxes, scores, 0.6, score_threshold=0.5)[1].tolist() == [0]
    assert nms_normal(boxes, scores, 0.6, max_num=2)[1].tolist() == [0, 3]
    assert nms_normal(boxes, scores, 0.99, score_threshold=0.45)[1].tolist() == [0, 1, 2, 3, 4]


def test_soft_nms_is_mmcv_soft_nms():
    # mmcv.ops.soft_nms's docstring example: 5 of 6 boxes are left
    boxes = np.array([[4., 3., 5., 3.], [4., 3., 5., 4.], [3., 1., 3., 1.], [3., 1., 3., 1.],
                      [3., 1., 3., 1.], [3., 1., 3., 1.]], dtype=np.float32)
    scores = np.array([0.9, 0.9, 0.5, 0.5, 0.4, 0.0], dtype=np.float32)
    dets, inds = soft_nms(boxes, scores, 0.6, sigma=0.5)
    assert isinstance(dets, np.ndarray) and dets.shape == (5, 5)
    assert inds.tolist() == [0, 1, 2, 3, 4]

    boxes = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 5], [20, 20, 30, 30]])
    dets, inds = soft_nms(boxes, torch.tensor([0.8, 0.9, 0.3]), iou_threshold=0.3)
    # the 0.8 box overlaps the 0.9 box by IoU 0.5 and decays to 0.8 * (1 - 0.5), still above 0.3
    assert inds.tolist() == [1, 0, 2]
    torch.testing.assert_close(dets[:, 4], torch.tensor([0.9, 0.4, 0.3]))
    torch.testing.assert_close(dets[:, :4], boxes[inds])


def test_batched_soft_nms_keeps_classes_apart():
    boxes = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 9]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    idxs = torch.tensor([0, 1, 0])
    dets, keep = batched_soft_nms(boxes, scores, idxs, iou_threshold=0.5, min_score=0.05)
    # box 1 (class 1) is untouched by the identical class-0 box; box 2 decays by 1 - 0.9
    assert keep.tolist() == [0, 1, 2]
    torch.testing.assert_close(dets[:, 4], torch.tensor([0.9, 0.8, 0.07]))
    dets, keep = batched_soft_nms(boxes, scores, idxs, iou_threshold=0.5, min_score=0.05,
                                  class_agnostic=True)
    assert keep.tolist() == [0, 2]  # box 1 (IoU 1) decays to 0; box 2 to 0.07


def test_bad_input_types():
    with pytest.raises(TypeError, match="boxes"):
        soft_nms([[0, 0, 1, 1]], torch.tensor([1.0]))
