"""multi_apply_multi_stream returns what mmdet's multi_apply returns, sequentially on CPU and on
CUDA streams."""

from functools import partial

import pytest
import torch

from accrewrite.base import accelerator
from accrewrite.runtime.utils import multi_apply_multi_stream
from accrewrite.runtime.utils.misc import multi_apply_multi_stream as from_misc


def mmdet_multi_apply(func, *args, **kwargs):
    """mmdet.core.multi_apply, verbatim semantics: the oracle."""
    pfunc = partial(func, **kwargs) if kwargs else func
    map_results = map(pfunc, *args)
    return tuple(map(list, zip(*map_results)))


def seed_func(t1, t2, t3):  # the migration guide's example
    return t1 * 2.0, t2 + 2.0, t3 - 2.0


def _assert_same(got, want):
    assert isinstance(got, tuple) and len(got) == len(want)
    for got_list, want_list in zip(got, want):
        assert isinstance(got_list, list) and len(got_list) == len(want_list)
        for a, b in zip(got_list, want_list):
            if isinstance(b, torch.Tensor):
                assert torch.equal(a, b)
            else:
                assert a == b


def test_seed_example_matches_multi_apply():
    t1, t2, t3 = (torch.randn(10, 100) * s for s in (1.0, 2.0, 3.0))
    got = multi_apply_multi_stream(seed_func, 2, t1, t2, t3)
    _assert_same(got, mmdet_multi_apply(seed_func, t1, t2, t3))
    assert len(got) == 3 and len(got[0]) == 10  # one list per output, one entry per row
    assert from_misc is multi_apply_multi_stream  # the migration guide imports it from utils.misc


def test_lists_kwargs_shortest_argument_and_empty():
    def head(feature, stride, scale=1):
        return feature * scale, stride, {"stride": stride}

    features = [torch.randn(3), torch.randn(5), torch.randn(2)]
    strides = [8, 16]  # shorter: map stops there
    got = multi_apply_multi_stream(head, 4, features, strides, scale=3)
    _assert_same(got, mmdet_multi_apply(head, features, strides, scale=3))
    assert len(got[0]) == 2
    assert multi_apply_multi_stream(head, 2, [], []) == mmdet_multi_apply(head, [], []) == ()


def test_bad_stream_count():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n_streams"):
            multi_apply_multi_stream(seed_func, bad, [torch.ones(1)], [torch.ones(1)],
                                     [torch.ones(1)])


@pytest.mark.skipif(accelerator.device_type() in ("cpu", "mps"), reason="needs side streams")
def test_accelerator_calls_run_on_side_streams_with_same_results():
    streams_seen = []

    def func(t1, t2, t3):
        streams_seen.append(torch.accelerator.current_stream().stream_id)
        return seed_func(t1 @ t1.T, t2, t3)

    device = accelerator.device_type()
    t1, t2, t3 = (torch.randn(6, 256, 256, device=device) for _ in range(3))
    got = multi_apply_multi_stream(func, 3, t1, t2, t3)
    default = torch.accelerator.current_stream().stream_id
    assert len(set(streams_seen)) == 3 and default not in streams_seen
    streams_seen.clear()
    _assert_same(got, mmdet_multi_apply(func, t1, t2, t3))
