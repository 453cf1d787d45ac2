"""runtime.nn.SyncBatchNorm on 2 real gloo processes, against one process that normalizes the
two batches together; and its convert_sync_batchnorm against torch's.

The two ranks train every case once (module fixture ``ranks``); each case's global batch is
drawn here and on the ranks from the same seed, each rank normalizing its slice. The reference
is torch's SyncBatchNorm in a process without a process group, which is plain batch norm.
"""

import pytest
import torch
import torch.distributed as dist

from accrewrite.runtime.nn import SyncBatchNorm
from accrewrite.runtime.nn import sync_batch_norm as module

from _ranks import run_ranks

# name: per-rank batch sizes, (channels, *spatial), constructor arguments, dtype, channels-last
CASES = {
    "1d": ((4, 4), (7,), {}, torch.float64, False),
    "1d_sequence": ((3, 5), (7, 6), {}, torch.float64, False),
    "2d_channels_last": ((2, 2), (5, 3, 7), {}, torch.float64, True),
    "3d": ((2, 3), (3, 2, 5, 3), {}, torch.float64, False),
    "3d_channels_last": ((2, 1), (3, 2, 5, 3), {}, torch.float64, True),
    "cumulative_average": ((4, 2), (6, 5), {"momentum": None}, torch.float64, False),
    "no_affine": ((3, 3), (5, 4), {"affine": False}, torch.float64, False),
    "no_running_stats": ((3, 2), (5, 4), {"track_running_stats": False}, torch.float64, False),
    "one_rank_empty": ((5, 0), (3, 4), {}, torch.float64, False),
    "large_mean": ((4, 4), (3, 6), {}, torch.float32, False),
    "float32": ((6, 2), (9, 4, 3), {}, torch.float32, False),
    "bfloat16": ((6, 2), (9, 4, 3), {}, torch.bfloat16, False),
}
STEPS = 3
WORLD = 2


def _module(cls, case, **extra):
    _, (channels, *_), kwargs, dtype, _ = CASES[case]
    norm = cls(channels, **kwargs, **extra)
    if norm.affine:
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            norm.weight.copy_(torch.rand(channels, generator=generator) + 0.5)
            norm.bias.copy_(torch.randn(channels, generator=generator))
    return norm.to(torch.float32 if dtype is torch.bfloat16 else dtype)


def _batch(case, step):
    """The global batch of ``step`` and the gradient the loss sends back to it."""
    sizes, shape, _, dtype, channels_last = CASES[case]
    generator = torch.Generator().manual_seed(100 * step + len(case))
    x = torch.randn(sum(sizes), *shape, generator=generator, dtype=torch.float64) * 3 + 1
    if case == "large_mean":
        x = x + 1e4
    upstream = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    x, upstream = x.to(dtype), upstream.to(dtype)
    if channels_last:
        layout = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        x, upstream = x.contiguous(memory_format=layout), upstream.contiguous(memory_format=layout)
    return x, upstream


def _mine(x, rank, case):
    sizes = CASES[case][0]
    start = sum(sizes[:rank])
    return x[start:start + sizes[rank]]


def _train(norm, case, part):
    """``STEPS`` training steps and one evaluation; what each gave."""
    record = []
    for step in range(STEPS):
        x, upstream = (part(t) for t in _batch(case, step))
        x = x.detach().requires_grad_()
        norm.zero_grad()
        out = norm(x)
        (out * upstream).sum().backward()
        record.append({
            "out": out.detach(), "input_grad": x.grad,
            "weight_grad": None if norm.weight is None else norm.weight.grad,
            "bias_grad": None if norm.bias is None else norm.bias.grad,
            "running": [b.clone() for b in norm.buffers()],
            "channels_last": out.is_contiguous(memory_format=torch.channels_last) if out.dim() == 4 else None,
        })
    norm.eval()
    record.append({"out": norm(part(_batch(case, STEPS)[0])).detach()})
    return record


def _worker(rank):
    dist.init_process_group("gloo")
    out = {case: _train(_module(SyncBatchNorm, case), case, lambda t: _mine(t, rank, case)) for case in CASES}
    # a group of this rank alone: its own batch's statistics
    groups = [dist.new_group([r]) for r in range(WORLD)]
    alone = _module(SyncBatchNorm, "3d", process_group=groups[rank])
    out["own_group"] = _train(alone, "3d", lambda t: _mine(t, rank, "3d"))
    try:  # torch's own SyncBatchNorm stops on the CPU in a process group
        torch.nn.SyncBatchNorm(3)(torch.randn(4, 3))
    except ValueError as error:
        out["torch_on_cpu"] = str(error)
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_worker, WORLD)


def _tolerance(case):
    if CASES[case][3] is torch.bfloat16:
        return {"atol": 2e-2, "rtol": 2e-2}
    if case == "large_mean":
        # float32 holds values near 1e4 to about 1e-3, which bounds both sides' error; a sum of
        # squares minus the squared mean would be off by more than the variance itself
        return {"atol": 1e-3, "rtol": 1e-3}
    return {}


@pytest.mark.slow  # two spawned processes
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_normalize_as_one_process_with_the_whole_batch(ranks, case):
    expected = _train(_module(torch.nn.SyncBatchNorm, case), case, lambda t: t)
    close = _tolerance(case)
    for step, want in enumerate(expected[:STEPS]):
        got = [rank[case][step] for rank in ranks]
        torch.testing.assert_close(torch.cat([g["out"] for g in got]), want["out"], **close)
        torch.testing.assert_close(torch.cat([g["input_grad"] for g in got]), want["input_grad"], **close)
        for name in ("weight_grad", "bias_grad"):  # each rank's share; the gradient all-reduce sums them
            if want[name] is not None:
                torch.testing.assert_close(sum(g[name] for g in got), want[name], **close)
        for g in got:
            torch.testing.assert_close(g["running"], want["running"], **close)
            assert g["channels_last"] == want["channels_last"]
    if not CASES[case][2].get("track_running_stats", True):
        return  # evaluated on each rank's batch alone (below)
    evaluated = torch.cat([rank[case][STEPS]["out"] for rank in ranks])
    torch.testing.assert_close(evaluated, expected[STEPS]["out"], **close)


@pytest.mark.slow  # two spawned processes
def test_evaluation_without_running_statistics_normalizes_each_ranks_batch_alone(ranks):
    # as torch's: statistics are synchronised in training only
    for rank in range(WORLD):
        own = _train(_module(torch.nn.SyncBatchNorm, "no_running_stats"), "no_running_stats",
                     lambda t: _mine(t, rank, "no_running_stats"))
        torch.testing.assert_close(ranks[rank]["no_running_stats"][STEPS]["out"], own[STEPS]["out"])


@pytest.mark.slow  # two spawned processes
def test_the_statistics_are_the_whole_batchs_not_each_ranks(ranks):
    sizes = CASES["1d"][0]
    own = _train(_module(torch.nn.SyncBatchNorm, "1d"), "1d", lambda t: t[:sizes[0]])
    assert not torch.allclose(ranks[0]["1d"][0]["out"], own[0]["out"])


@pytest.mark.slow  # two spawned processes
def test_a_process_group_of_its_own_normalizes_each_ranks_batch_alone(ranks):
    for rank in range(WORLD):
        expected = _train(_module(torch.nn.SyncBatchNorm, "3d"), "3d", lambda t: _mine(t, rank, "3d"))
        for got, want in zip(ranks[rank]["own_group"], expected):
            torch.testing.assert_close(got["out"], want["out"])
            if "running" in want:
                torch.testing.assert_close(got["running"], want["running"])


@pytest.mark.slow  # two spawned processes
def test_torchs_own_sync_batch_norm_stops_on_the_cpu_in_a_process_group(ranks):
    assert all("expected input tensor to be on GPU" in rank["torch_on_cpu"] for rank in ranks)


def _one_process(rank):
    dist.init_process_group("gloo")
    return _train(_module(SyncBatchNorm, "2d_channels_last"), "2d_channels_last", lambda t: t)


@pytest.mark.slow  # a spawned process
def test_one_process_in_a_process_group_is_plain_batch_norm():
    (got,) = run_ranks(_one_process, 1)
    expected = _train(_module(torch.nn.BatchNorm2d, "2d_channels_last"), "2d_channels_last", lambda t: t)
    for g, want in zip(got, expected):
        torch.testing.assert_close(g["out"], want["out"])


def test_torchs_implementation_runs_on_the_devices_it_supports():
    assert module.runs_torch_implementation(torch.device("cuda", 1))
    assert module.runs_torch_implementation(torch.device("xpu"))
    assert not module.runs_torch_implementation(torch.device("cpu"))
    assert not module.runs_torch_implementation(torch.device("mps"))


def test_a_forward_on_such_a_device_goes_to_torchs_implementation(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.nn.SyncBatchNorm, "forward", lambda self, x: seen.append(x.device) or x)
    monkeypatch.setattr(module, "_TORCH_DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(module, "_distributed", lambda: True)
    x = torch.randn(4, 3)
    assert SyncBatchNorm(3)(x) is x and seen == [x.device]


# --- convert_sync_batchnorm ----------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
        self.head = torch.nn.BatchNorm1d(4, momentum=None, affine=False)
        self.frozen = torch.nn.BatchNorm3d(2, eps=1e-3, track_running_stats=False)


def _net():
    torch.manual_seed(0)
    net = _Net()
    net.features[1].weight.requires_grad_(False)
    net.features[1].running_mean.normal_()
    net.features[1].num_batches_tracked += 5
    net.head.qconfig = "a qconfig"
    net.frozen.eval()
    return net


def test_convert_sync_batchnorm_converts_as_torchs_does():
    group = object()
    theirs = torch.nn.SyncBatchNorm.convert_sync_batchnorm(_net(), group)
    original = _net()
    weight = original.features[1].weight
    ours = SyncBatchNorm.convert_sync_batchnorm(original, process_group=group)
    assert ours is original and ours.features[1].weight is weight
    pairs = list(zip(ours.named_modules(), theirs.named_modules(), strict=True))
    for (name, mine), (_, torchs) in pairs:
        assert (type(mine) is SyncBatchNorm) == (type(torchs) is torch.nn.SyncBatchNorm), name
        assert mine.training == torchs.training and getattr(mine, "qconfig", None) == getattr(torchs, "qconfig", None)
        if isinstance(mine, SyncBatchNorm):
            assert mine.process_group is group
            assert mine.extra_repr() == torchs.extra_repr()
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    torch.testing.assert_close(ours.state_dict(), theirs.state_dict())
    assert [p.requires_grad for p in ours.parameters()] == [p.requires_grad for p in theirs.parameters()]


def test_convert_sync_batchnorm_of_a_batch_norm_returns_the_new_layer():
    norm = torch.nn.BatchNorm2d(3)
    converted = SyncBatchNorm.convert_sync_batchnorm(norm)
    assert type(converted) is SyncBatchNorm and converted.weight is norm.weight
    assert converted.running_var is norm.running_var
    assert isinstance(converted, torch.nn.SyncBatchNorm)
