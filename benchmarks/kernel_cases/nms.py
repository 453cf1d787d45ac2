"""nms cases: greedy NMS (suppression bitmask + on-device scan) and Soft-NMS (Triton decay step)
against their PyTorch references (eager, torch.compile) and, where installed, torchvision's
CUDA nms. NMS has no backward: each callable is one call.

No goal is set for NMS; these show where the kernels stand.
"""

import torch

from accrewrite.kernels.nms import nms, nms_reference, soft_nms, soft_nms_reference

from . import Case

# (boxes, iou threshold): detector outputs before NMS (e.g. the top-k of RPN proposals)
NMS_SHAPES = [(1000, 0.7), (4000, 0.5)]
SOFT_NMS_SHAPES = [1000]
SMOKE_NMS_SHAPES = [(30, 0.5)]
SMOKE_SOFT_NMS_SHAPES = [20]


def random_detections(n, device):
    """Boxes clustered around n / 20 objects, as a detector proposes them."""
    g = torch.Generator().manual_seed(0)
    centers = torch.rand(max(1, n // 20), 2, generator=g) * 800
    jitter = torch.randn(n, 2, generator=g) * 8
    xy = centers[torch.randint(len(centers), (n,), generator=g)] + jitter
    wh = torch.rand(n, 2, generator=g) * 60 + 20
    return torch.cat([xy, xy + wh], dim=1).to(device), torch.rand(n, generator=g).to(device)


def cases(device, *, smoke=False, compile=torch.compile):
    nms_shapes = SMOKE_NMS_SHAPES if smoke else NMS_SHAPES
    soft_nms_shapes = SMOKE_SOFT_NMS_SHAPES if smoke else SOFT_NMS_SHAPES
    return ([_nms_case(n, threshold, device, compile) for n, threshold in nms_shapes]
            + [_soft_nms_case(n, device, compile) for n in soft_nms_shapes])


def _nms_case(n, threshold, device, compile):
    boxes, scores = random_detections(n, device)
    others = {}
    try:
        from torchvision.ops import nms as torchvision_nms
    except ImportError:
        pass
    else:
        others["torchvision"] = lambda: torchvision_nms(boxes, scores, threshold)
    compiled = compile(nms_reference)
    return Case(
        name=f"nms {n} boxes, IoU {threshold}",
        ours=lambda: nms(boxes, scores, threshold),
        eager=lambda: nms_reference(boxes, scores, threshold),
        compiled=lambda: compiled(boxes, scores, threshold),
        others=others,
    )


def _soft_nms_case(n, device, compile):
    boxes, scores = random_detections(n, device)
    compiled = compile(soft_nms_reference)
    return Case(
        name=f"soft_nms gaussian {n} boxes",
        ours=lambda: soft_nms(boxes, scores, method="gaussian"),
        eager=lambda: soft_nms_reference(boxes, scores, method="gaussian"),
        compiled=lambda: compiled(boxes, scores, method="gaussian"),
    )
