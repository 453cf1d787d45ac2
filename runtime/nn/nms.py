"""NMS with the interfaces detection code calls (TorchAcc's migration guide, "nms/nms_normal/soft_nms/
batched_soft_nms"), over ``accrewrite.kernels.nms`` (Triton on CUDA, PyTorch elsewhere).

- ``nms(boxes, scores, iou_threshold)``: ``torchvision.ops.nms`` -> kept indices (int64) by
  decreasing score.
- ``nms_normal(boxes, scores, iou_threshold, offset=0, score_threshold=0, max_num=-1)``:
  ``mmcv.ops.nms``, the hard counterpart of ``soft_nms`` with its interface ->
  ``(dets, inds)``, ``dets = [boxes[inds], scores[inds]]`` of shape ``(K, 5)``.
- ``soft_nms(boxes, scores, iou_threshold=0.3, sigma=0.5, min_score=1e-3, method='linear',
  offset=0)``: ``mmcv.ops.soft_nms`` -> ``(dets, inds)``, dets holding the decayed scores.
- ``batched_soft_nms(boxes, scores, idxs, ..., class_agnostic=False)``: ``mmcv.ops.batched_nms``
  with ``nms_cfg=dict(type='soft_nms', ...)`` -> ``(dets, keep)``; boxes of different ``idxs``
  never decay each other.

The mmcv functions accept numpy arrays too and then return numpy arrays, as mmcv does.
"""

import sys
import types

import numpy as np
import torch

from accrewrite.kernels import nms as kernels

__all__ = ["nms", "nms_normal", "soft_nms", "batched_soft_nms"]


def nms(boxes, scores, iou_threshold):
    """``torchvision.ops.nms``: indices of the kept boxes, by decreasing score. A box is
    suppressed by a higher-scoring kept box when their IoU is greater than ``iou_threshold``."""
    return kernels.nms(boxes, scores, iou_threshold)


def nms_normal(boxes, scores, iou_threshold, offset=0, score_threshold=0, max_num=-1):
    """``mmcv.ops.nms``: boxes scoring at most ``score_threshold`` are dropped first, at most
    ``max_num`` boxes are kept (all when not positive). Returns ``(dets, inds)``."""
    boxes_t, scores_t = _tensors(boxes, scores)
    candidates = None
    if score_threshold > 0:
        candidates = torch.nonzero(scores_t > score_threshold).flatten()
        inds = kernels.nms(boxes_t[candidates], scores_t[candidates], iou_threshold, offset)
    else:
        inds = kernels.nms(boxes_t, scores_t, iou_threshold, offset)
    if max_num > 0:
        inds = inds[:max_num]
    if candidates is not None:
        inds = candidates[inds]
    dets = torch.cat((boxes_t[inds], scores_t[inds].reshape(-1, 1).to(boxes_t.dtype)), dim=1)
    return _like_input(boxes, dets, inds)


def soft_nms(boxes, scores, iou_threshold=0.3, sigma=0.5, min_score=1e-3, method="linear",
             offset=0):
    """``mmcv.ops.soft_nms`` (``method`` ``'naive'``, ``'linear'`` or ``'gaussian'``). Returns
    ``(dets, inds)``: kept boxes with their decayed scores, in selection order, and their
    indices in the input."""
    boxes_t, scores_t = _tensors(boxes, scores)
    dets, inds = kernels.soft_nms(boxes_t, scores_t, iou_threshold, sigma, min_score, method,
                                  offset)
    return _like_input(boxes, dets, inds)


def batched_soft_nms(boxes, scores, idxs, iou_threshold=0.3, sigma=0.5, min_score=1e-3,
                     method="linear", offset=0, class_agnostic=False):
    """``mmcv.ops.batched_nms(boxes, scores, idxs, dict(type='soft_nms', ...))``: Soft-NMS within
    each ``idxs`` class (across all of them with ``class_agnostic``). Returns ``(dets, keep)``:
    boxes with decayed scores by decreasing score, and their indices in the input."""
    boxes_t, scores_t = _tensors(boxes, scores)
    idxs_t = torch.as_tensor(idxs, device=boxes_t.device)
    labels = None if class_agnostic else idxs_t
    dets, keep = kernels.soft_nms(boxes_t, scores_t, iou_threshold, sigma, min_score, method,
                                  offset, labels)
    return _like_input(boxes, dets, keep)


def _tensors(boxes, scores):
    for name, value in (("boxes", boxes), ("scores", scores)):
        if not isinstance(value, (torch.Tensor, np.ndarray)):
            raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got "
                            f"{type(value).__name__}")
    return torch.as_tensor(boxes), torch.as_tensor(scores)


def _like_input(boxes, dets, inds):
    if isinstance(boxes, np.ndarray):
        return dets.cpu().numpy(), inds.cpu().numpy()
    return dets, inds


class _NmsModule(types.ModuleType):
    """This module is also callable as ``nms``. ``nms`` is one of the names of
    ``accrewrite.runtime.nn`` (docs/runtime-api.md), and the guide imports the functions from ``...nn.nms``: once this
    module is imported, Python binds ``accrewrite.runtime.nn.nms`` to it, shadowing the function
    of the same name, so ``from accrewrite.runtime.nn import nms; nms(...)`` must still work."""

    def __call__(self, boxes, scores, iou_threshold):
        return nms(boxes, scores, iou_threshold)


sys.modules[__name__].__class__ = _NmsModule
