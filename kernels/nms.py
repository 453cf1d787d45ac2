"""Non-maximum suppression: greedy NMS and Soft-NMS (TorchAcc's migration guide, "nms/nms_normal/soft_nms/
batched_soft_nms"). accrewrite.runtime.nn.nms gives them torchvision's and mmcv's interfaces.

Boxes are ``(x1, y1, x2, y2)``; a box is ``x2 - x1 + offset`` wide (``offset`` 0 as torchvision,
or 1 as old mmdet/mmcv pixel boxes). Coordinates and scores are computed in fp32, whatever the
input dtype, so every dtype gets the same decisions.

``nms``: greedy NMS. Boxes are visited by decreasing score (a stable sort: ties keep their input
order) and each kept box removes every later box whose IoU with it is *greater than* the
threshold (torchvision and mmcv). Returns the kept indices, int64, by decreasing score. Triton
path, as torchvision's CUDA kernel: one kernel computes the suppression bitmask (for every box,
a bit per later box that it would suppress, in 64-box words, one program per 64x64 tile), a
second kernel, a single program, does the inherently sequential greedy scan over that bitmask
on the device, 64 boxes at a time: the sequential part touches only registers, and each block's
kept rows are merged into the removed set with one vectorised load.

``soft_nms``: mmcv's Soft-NMS (its ``softnms_cpu``, the one mmcv implementation). Repeatedly
take the highest remaining score (the first one on ties), then decay every remaining score by
``naive``: 0 if IoU >= threshold; ``linear``: ``1 - IoU`` if IoU >= threshold; ``gaussian``:
``exp(-IoU**2 / sigma)``; a box whose score falls below ``min_score`` is dropped by moving the
last remaining box into its place (this order decides later ties, so it is kept exactly).
Returns ``dets`` ``(K, 5)`` (box and decayed score, in selection order) and the kept input
indices. With ``labels``, boxes of different labels have IoU 0 (they never decay each other),
which is what mmcv's ``batched_nms`` gets from offsetting each class's boxes, minus the loss of
precision of those offsets. The selection loop is shared; the Triton path runs the decay of
each step (IoU, weight, threshold test over all remaining boxes) as a kernel.

Each is one operator, ``accrewrite::nms`` and ``accrewrite::soft_nms`` (``nms_op``,
``soft_nms_op``), whose output size depends on the data (its fake implementation says so).
Neither has a gradient (the indices are not differentiable; torchvision's nms has none either).
"""

from types import MappingProxyType
from typing import Optional

import torch

from accrewrite.kernels.dispatch import triton_available, use_triton

if triton_available():  # without triton only the reference path exists
    import triton
    import triton.language as tl

__all__ = ["nms", "nms_reference", "soft_nms", "soft_nms_reference", "SOFT_NMS_METHODS"]

SOFT_NMS_METHODS = MappingProxyType({"naive": 0, "linear": 1, "gaussian": 2})
_WORD = 64  # boxes per suppression-bitmask word (int64)
_SCAN_TILE = 4096  # bitmask words the greedy scan loads at once (registers of one program)


def nms(boxes, scores, iou_threshold, offset=0):
    """Greedy NMS: the Triton bitmask kernels when ``use_triton`` says so, else the reference."""
    boxes, scores = check_boxes(boxes, scores, offset)
    return nms_op(boxes, scores, float(iou_threshold), offset)


def nms_reference(boxes, scores, iou_threshold, offset=0):
    """Greedy NMS, the plain loop in PyTorch."""
    boxes, scores = check_boxes(boxes, scores, offset)
    return _nms_loop(boxes, scores, iou_threshold, offset)


def soft_nms(boxes, scores, iou_threshold=0.3, sigma=0.5, min_score=1e-3, method="linear",
             offset=0, labels=None):
    """mmcv Soft-NMS -> ``(dets, inds)``; the decay step in Triton when ``use_triton`` says so."""
    _check_soft_nms(boxes, scores, sigma, method, offset, labels)
    return soft_nms_op(boxes, scores, float(iou_threshold), float(sigma), float(min_score),
                       method, offset, labels)


@torch.library.custom_op("accrewrite::nms", mutates_args=())
def nms_op(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float,
           offset: int) -> torch.Tensor:
    """``nms`` on checked fp32 ``boxes`` and ``scores``."""
    greedy = _nms_triton if use_triton(boxes, scores) else _nms_loop
    return greedy(boxes, scores, iou_threshold, offset)


@nms_op.register_fake
def _(boxes, scores, iou_threshold, offset):
    return boxes.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64)


@torch.library.custom_op("accrewrite::soft_nms", mutates_args=())
def soft_nms_op(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float, sigma: float,
                min_score: float, method: str, offset: int,
                labels: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``soft_nms`` on checked arguments."""
    decay = _decay_triton if use_triton(boxes, scores) else _decay_reference
    return _soft_nms_loop(boxes, scores, iou_threshold, sigma, min_score, method, offset, labels,
                          decay)


@soft_nms_op.register_fake
def _(boxes, scores, iou_threshold, sigma, min_score, method, offset, labels):
    kept = torch.library.get_ctx().new_dynamic_size()
    return boxes.new_empty((kept, 5)), boxes.new_empty(kept, dtype=torch.int64)


def soft_nms_reference(boxes, scores, iou_threshold=0.3, sigma=0.5, min_score=1e-3,
                       method="linear", offset=0, labels=None):
    """mmcv Soft-NMS in PyTorch -> ``(dets, inds)``."""
    _check_soft_nms(boxes, scores, sigma, method, offset, labels)
    return _soft_nms_loop(boxes, scores, iou_threshold, sigma, min_score, method, offset, labels,
                          _decay_reference)


def check_boxes(boxes, scores, offset):
    """Validate ``(N, 4)`` boxes and ``(N,)`` scores; return both as fp32 tensors."""
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes must have shape (N, 4), got {tuple(boxes.shape)}")
    if scores.dim() != 1 or scores.shape[0] != boxes.shape[0]:
        raise ValueError(
            f"scores must have shape (N,) = ({boxes.shape[0]},), got {tuple(scores.shape)}"
        )
    if offset not in (0, 1):
        raise ValueError(f"offset must be 0 or 1, got {offset!r}")
    if not (boxes.is_floating_point() and scores.is_floating_point()):
        raise TypeError(f"boxes and scores must be floating point, got {boxes.dtype}, "
                        f"{scores.dtype}")
    return boxes.float(), scores.float()


def _iou(box, boxes, offset):
    """IoU of one box with each of ``boxes``, the operation order of torchvision and mmcv."""
    w = (torch.minimum(box[2], boxes[:, 2]) - torch.maximum(box[0], boxes[:, 0]) + offset)
    h = (torch.minimum(box[3], boxes[:, 3]) - torch.maximum(box[1], boxes[:, 1]) + offset)
    inter = w.clamp(min=0) * h.clamp(min=0)
    area = (box[2] - box[0] + offset) * (box[3] - box[1] + offset)
    areas = (boxes[:, 2] - boxes[:, 0] + offset) * (boxes[:, 3] - boxes[:, 1] + offset)
    return inter / (area + areas - inter)


def _sorted_by_score(boxes, scores):
    order = torch.sort(scores, descending=True, stable=True).indices
    return order, boxes[order].contiguous()


def _nms_loop(boxes, scores, iou_threshold, offset):
    order, boxes = _sorted_by_score(boxes, scores)
    suppressed = torch.zeros(len(order), dtype=torch.bool, device=boxes.device)
    keep = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed[i + 1:] |= _iou(boxes[i], boxes[i + 1:], offset) > iou_threshold
    return order[torch.tensor(keep, dtype=torch.long, device=boxes.device)]


def _nms_triton(boxes, scores, iou_threshold, offset):
    order, boxes = _sorted_by_score(boxes, scores)
    n = len(order)
    if n == 0:
        return order
    words = triton.cdiv(n, _WORD)
    bitmask = torch.empty((n, words), dtype=torch.int64, device=boxes.device)
    _suppression_bitmask_kernel[(words, words)](
        boxes, bitmask, n, words, float(iou_threshold), float(offset), BLOCK=_WORD,
        enable_fp_fusion=False,
    )
    kept = torch.empty(n, dtype=torch.int8, device=boxes.device)
    padded_words = triton.next_power_of_2(words)
    _greedy_scan_kernel[(1,)](bitmask, kept, n, words, WORDS=padded_words,
                              ROWS=max(1, min(_WORD, _SCAN_TILE // padded_words)))
    return order[kept.bool()]


def _check_soft_nms(boxes, scores, sigma, method, offset, labels):
    """Validate Soft-NMS's arguments."""
    if method not in SOFT_NMS_METHODS:
        raise ValueError(f"method must be one of {', '.join(SOFT_NMS_METHODS)}, got {method!r}")
    if method == "gaussian" and not sigma > 0:
        raise ValueError(f"sigma must be positive for the gaussian method, got {sigma!r}")
    check_boxes(boxes, scores, offset)
    if labels is not None and labels.shape != scores.shape:
        raise ValueError(f"labels must have shape {tuple(scores.shape)}, got "
                         f"{tuple(labels.shape)}")


def _soft_nms_loop(boxes, scores, iou_threshold, sigma, min_score, method, offset, labels,
                   decay):
    out_dtype = boxes.dtype
    boxes, scores = check_boxes(boxes, scores, offset)
    # Working copies that the loop permutes, as mmcv's loop does in place.
    boxes = boxes.clone()
    scores = scores.clone()
    inds = torch.arange(len(scores), device=boxes.device)
    labels = labels.clone() if labels is not None else None
    columns = [t for t in (boxes, scores, inds, labels) if t is not None]
    params = (float(iou_threshold), float(sigma), float(min_score),
              SOFT_NMS_METHODS[method], float(offset))

    n, i = len(scores), 0
    while i < n:
        best = i + int(torch.argmax(scores[i:n]))  # first maximum, as mmcv's strict '<' scan
        if best != i:
            for column in columns:
                column[[i, best]] = column[[best, i]]
        if i + 1 < n:
            survives = decay(boxes, scores, labels, i, n, *params)
            n = i + 1 + _compact(columns, survives, i + 1)
        i += 1
    dets = torch.cat([boxes[:n], scores[:n, None]], dim=1).to(out_dtype)
    return dets, inds[:n]


def _compact(columns, survives, start):
    """Drop the boxes that did not survive from ``column[start:]`` the way mmcv does (each one is
    replaced by the current last box), so later ties resolve as in mmcv. Returns the count."""
    kept = int(survives.sum())
    front_holes = torch.nonzero(~survives[:kept]).flatten()
    back_survivors = torch.nonzero(survives[kept:]).flatten() + kept
    order = torch.arange(kept, device=survives.device)
    order[front_holes] = back_survivors.flip(0)
    for column in columns:
        column[start:start + kept] = column[start:][order]
    return kept


def _decay_reference(boxes, scores, labels, i, n, iou_threshold, sigma, min_score, method,
                     offset):
    """Decay ``scores[i+1:n]`` in place by their overlap with box ``i``; returns survivors."""
    iou = _iou(boxes[i], boxes[i + 1:n], offset)
    if labels is not None:
        iou = torch.where(labels[i + 1:n] == labels[i], iou, 0.0)
    if method == SOFT_NMS_METHODS["naive"]:
        weight = torch.where(iou >= iou_threshold, 0.0, 1.0)
    elif method == SOFT_NMS_METHODS["linear"]:
        weight = torch.where(iou >= iou_threshold, 1.0 - iou, 1.0)
    else:
        weight = torch.exp(-(iou * iou) / sigma)
    scores[i + 1:n] *= weight
    return scores[i + 1:n] >= min_score


def _decay_triton(boxes, scores, labels, i, n, iou_threshold, sigma, min_score, method, offset):
    """The Triton version of ``_decay_reference``."""
    count = n - i - 1
    survives = torch.empty(count, dtype=torch.bool, device=boxes.device)
    block = min(1024, triton.next_power_of_2(count))
    _soft_nms_decay_kernel[(triton.cdiv(count, block),)](
        boxes, scores, labels if labels is not None else scores, survives, i, n,
        iou_threshold, sigma, min_score, offset,
        METHOD=method, HAS_LABELS=labels is not None, BLOCK=block, enable_fp_fusion=False,
    )
    return survives


if triton_available():

    @triton.jit
    def _iou_tile(x1, y1, x2, y2, bx1, by1, bx2, by2, offset):
        """IoU of boxes (x1..y2, column vectors) with boxes (bx1..by2, row vectors): the same
        operations as ``_iou`` with IEEE division and (launched with ``enable_fp_fusion=False``)
        no fused multiply-adds, so that the GPU makes exactly the reference's decisions."""
        w = tl.minimum(x2, bx2) - tl.maximum(x1, bx1) + offset
        h = tl.minimum(y2, by2) - tl.maximum(y1, by1) + offset
        inter = tl.maximum(w, 0.0) * tl.maximum(h, 0.0)
        area = (x2 - x1 + offset) * (y2 - y1 + offset)
        areas = (bx2 - bx1 + offset) * (by2 - by1 + offset)
        return tl.math.div_rn(inter, area + areas - inter)

    @triton.jit
    def _suppression_bitmask_kernel(boxes, bitmask, n, words, iou_threshold, offset,
                                    BLOCK: tl.constexpr):
        # Tile (row block, column block): bit j of word [row, column block] is set when box
        # `row` (sorted by score) would suppress the later box `column block * 64 + j`.
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        row_ok = rows < n
        col_ok = cols < n
        # Padding boxes are unit squares, so that their (discarded) IoUs stay finite.
        x1 = tl.load(boxes + rows * 4 + 0, mask=row_ok, other=0.0)[:, None]
        y1 = tl.load(boxes + rows * 4 + 1, mask=row_ok, other=0.0)[:, None]
        x2 = tl.load(boxes + rows * 4 + 2, mask=row_ok, other=1.0)[:, None]
        y2 = tl.load(boxes + rows * 4 + 3, mask=row_ok, other=1.0)[:, None]
        bx1 = tl.load(boxes + cols * 4 + 0, mask=col_ok, other=0.0)[None, :]
        by1 = tl.load(boxes + cols * 4 + 1, mask=col_ok, other=0.0)[None, :]
        bx2 = tl.load(boxes + cols * 4 + 2, mask=col_ok, other=1.0)[None, :]
        by2 = tl.load(boxes + cols * 4 + 3, mask=col_ok, other=1.0)[None, :]
        iou = _iou_tile(x1, y1, x2, y2, bx1, by1, bx2, by2, offset)
        hit = (iou > iou_threshold) & (cols[None, :] > rows[:, None]) & col_ok[None, :]
        bits = tl.full((BLOCK,), 1, tl.int64) << (cols % BLOCK).to(tl.int64)
        word = tl.sum(tl.where(hit, bits[None, :], 0), axis=1)  # distinct bits: sum == or
        tl.store(bitmask + rows.to(tl.int64) * words + tl.program_id(1), word, mask=row_ok)

    @triton.jit
    def _bitwise_or(a, b):
        return a | b

    @triton.jit
    def _greedy_scan_kernel(bitmask, kept, n, words, WORDS: tl.constexpr, ROWS: tl.constexpr):
        # One program walks the boxes by score, 64 at a time. Inside a block the walk is
        # sequential but stays in registers: box j is kept unless bit j of `current` (the
        # block's word of the removed set) is set, and a kept box ors in its own word of the
        # block. Then the kept boxes' whole rows are or-ed into `removed`, ROWS rows per load.
        word_ids = tl.arange(0, WORDS)
        word_ok = word_ids < words
        lanes = tl.arange(0, 64)
        removed = tl.zeros((WORDS,), dtype=tl.int64)
        for block in range(words):
            rows = block * 64 + lanes
            own = tl.load(bitmask + rows.to(tl.int64) * words + block, mask=rows < n, other=0)
            current = tl.sum(tl.where(word_ids == block, removed, 0))
            for j in range(64):
                own_j = tl.sum(tl.where(lanes == j, own, 0))
                current = tl.where(((current >> j) & 1) == 0, current | own_j, current)
            keep = ((current >> lanes.to(tl.int64)) & 1) == 0
            tl.store(kept + rows, keep.to(tl.int8), mask=rows < n)
            for first in range(0, 64, ROWS):
                sub = first + tl.arange(0, ROWS)
                sub_rows = block * 64 + sub
                sub_keep = (((current >> sub.to(tl.int64)) & 1) == 0) & (sub_rows < n)
                tile = tl.load(bitmask + sub_rows.to(tl.int64)[:, None] * words + word_ids[None, :],
                               mask=sub_keep[:, None] & word_ok[None, :], other=0)
                removed = removed | tl.reduce(tile, 0, _bitwise_or)

    @triton.jit
    def _soft_nms_decay_kernel(boxes, scores, labels, survives, i, n, iou_threshold, sigma,
                               min_score, offset, METHOD: tl.constexpr,
                               HAS_LABELS: tl.constexpr, BLOCK: tl.constexpr):
        pos = i + 1 + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = pos < n
        iou = _iou_tile(
            tl.load(boxes + i * 4 + 0), tl.load(boxes + i * 4 + 1),
            tl.load(boxes + i * 4 + 2), tl.load(boxes + i * 4 + 3),
            tl.load(boxes + pos * 4 + 0, mask=ok, other=0.0),
            tl.load(boxes + pos * 4 + 1, mask=ok, other=0.0),
            tl.load(boxes + pos * 4 + 2, mask=ok, other=1.0),
            tl.load(boxes + pos * 4 + 3, mask=ok, other=1.0),
            offset,
        )
        if HAS_LABELS:
            same = tl.load(labels + pos, mask=ok) == tl.load(labels + i)
            iou = tl.where(same, iou, 0.0)
        if METHOD == 0:
            weight = tl.where(iou >= iou_threshold, 0.0, 1.0)
        elif METHOD == 1:
            weight = tl.where(iou >= iou_threshold, 1.0 - iou, 1.0)
        else:
            weight = tl.exp(-(iou * iou) / sigma)
        score = tl.load(scores + pos, mask=ok) * weight
        tl.store(scores + pos, score, mask=ok)
        tl.store(survives + pos - i - 1, score >= min_score, mask=ok)
