"""xm collectives on 2 real gloo processes, and their bucketing and compression helpers.

The two ranks run every scenario once (module fixture ``ranks``), recording what they saw; the
tests below check those records against values computed here.
"""

import os

import pytest
import torch
import torch.distributed as dist

import accrewrite.runtime.xla_model as xm
from accrewrite.runtime import _collectives

from _ranks import run_ranks

WORLD = 2


class _CountingAllReduce:
    """Wraps dist.all_reduce to count collectives and record their wire dtypes."""

    def __init__(self, monkey_target):
        self.calls = []
        self._real = monkey_target.all_reduce
        self._target = monkey_target

    def __enter__(self):
        def counting(tensor, *args, **kwargs):
            self.calls.append((tensor.dtype, tensor.numel()))
            return self._real(tensor, *args, **kwargs)

        self._target.all_reduce = counting
        return self

    def __exit__(self, *exc):
        self._target.all_reduce = self._real


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def _rank_data(rank):
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(4, 5, generator=generator), torch.randn(4, 3, generator=generator)


def _local_grads(rank):
    model = _model()
    x, y = _rank_data(rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return model, [p.grad.clone() for p in model.parameters()]


def _worker(rank, save_path):
    out = {"initialized_before": dist.is_initialized()}
    value = torch.tensor([1.0 + rank, 10.0 - rank, -3.0 * rank])

    # single tensors: a new tensor, the input untouched; lazily creates the process group
    out["sum"] = xm.all_reduce("sum", value, scale=0.5)
    out["initialized_after"] = dist.is_initialized()
    out["input_after"] = value
    out["world"] = (xm.world_size(), xm.xrt_world_size(), xm.get_ordinal(), xm.is_master_ordinal())
    for reduce_type in ("mul", "min", "max"):
        out[reduce_type] = xm.all_reduce(reduce_type, value)
    out["int_max"] = xm.all_reduce("max", torch.tensor([rank, 5 - rank]))
    # bitwise on integers (gloo), logical on booleans (min/max on every backend)
    out["int_and"] = xm.all_reduce(xm.REDUCE_AND, torch.tensor([6, 7]) - rank)
    out["int_or"] = xm.all_reduce(xm.REDUCE_OR, torch.tensor([4, 1]) * (rank + 1))
    out["bool_and"] = xm.all_reduce(xm.REDUCE_AND, torch.tensor([True, rank == 0]))
    out["bool_or"] = xm.all_reduce(xm.REDUCE_OR, torch.tensor([False, rank == 0]))
    out["errors"] = []
    for bad in (lambda: xm.all_reduce("sum", [torch.ones(2, dtype=torch.int64)], scale=0.5),
                lambda: xm.all_reduce("and", torch.ones(2)),
                lambda: xm.all_reduce("sum", torch.ones(2), groups=[[1 - rank]])):
        try:
            bad()
        except ValueError as error:
            out["errors"].append(str(error))

    # lists: in place, bucketed
    tensors = [torch.full((i % 7 + 1, 3), float(rank + i)) for i in range(100)]
    with _CountingAllReduce(dist) as default_cap:
        returned = xm.all_reduce("sum", tensors, scale=0.25)
    out["list_is_inputs"] = returned is tensors
    out["list"] = tensors
    out["default_cap_calls"] = default_cap.calls

    small = [torch.ones(256) * (rank + 1) for _ in range(10)]  # 1 KiB each
    with _CountingAllReduce(dist) as tiny_cap:
        xm.all_reduce("sum", small, bucket_cap_mb=3 * 1024 / 2**20)
    out["tiny_cap_calls"] = tiny_cap.calls
    out["tiny_cap_values"] = small

    mixed = [torch.ones(3), torch.ones(2, dtype=torch.float64), torch.ones(4), torch.ones(1, dtype=torch.int64)]
    with _CountingAllReduce(dist) as mixed_calls:
        xm.all_reduce("sum", mixed)
    out["mixed_calls"] = mixed_calls.calls
    out["mixed"] = mixed

    # wire compression: by argument, then by environment variable
    precise = [torch.full((3,), 1.0 + 2.0**-12 * (rank + 1)), torch.full((2,), 0.5 * rank, dtype=torch.bfloat16)]
    with _CountingAllReduce(dist) as compressed:
        xm.all_reduce("sum", precise, compress="bf16")
    out["bf16_calls"] = compressed.calls
    out["bf16"] = precise
    os.environ[_collectives.COMPRESS_ENV] = "fp16"
    env_tensors = [torch.full((3,), 1.0 + rank)]
    with _CountingAllReduce(dist) as env_compressed:
        xm.all_reduce("sum", env_tensors, scale=0.5)
    del os.environ[_collectives.COMPRESS_ENV]
    out["fp16_env_calls"] = env_compressed.calls
    out["fp16_env"] = env_tensors

    # replica groups: singletons reduce with nobody, the pair with each other
    out["groups_single"] = xm.all_reduce("sum", value, groups=[[0], [1]])
    out["groups_pair"] = xm.all_reduce("sum", value, groups=[[0, 1]])

    # gradients
    model, local = _local_grads(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out["fetched_are_grads"] = all(
        g is p.grad for g, p in zip(xm._fetch_gradients(optimizer), model.parameters())
    )
    xm.reduce_gradients(optimizer)
    out["local_grads"] = local
    out["reduced_grads"] = [p.grad.clone() for p in model.parameters()]

    out["rendezvous"] = xm.rendezvous("test", payload=f"rank{rank}".encode())
    xm.save({"rank": torch.tensor(rank), "nested": [torch.ones(2) * rank]}, save_path)
    # DDP's broadcast, as ACC005 writes it where the wrapper goes
    torch.manual_seed(100 + rank)
    replica = torch.nn.BatchNorm1d(3)
    replica.running_mean.add_(rank)
    xm.broadcast_master_param(replica)
    out["broadcast"] = replica.state_dict()
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    save_path = tmp_path_factory.mktemp("save") / "checkpoint.pt"
    results = run_ranks(_worker, WORLD, str(save_path))
    return results, save_path


def _values(rank):
    return torch.tensor([1.0 + rank, 10.0 - rank, -3.0 * rank])


@pytest.mark.slow  # two spawned processes
def test_process_group_is_created_lazily_from_the_environment(ranks):
    results, _ = ranks
    for rank, out in enumerate(results):
        assert not out["initialized_before"] and out["initialized_after"]
        assert out["world"] == (2, 2, rank, rank == 0)


@pytest.mark.slow  # two spawned processes
def test_single_tensor_reductions_return_new_tensors(ranks):
    results, _ = ranks
    both = torch.stack([_values(0), _values(1)])
    for rank, out in enumerate(results):
        torch.testing.assert_close(out["sum"], both.sum(0) * 0.5)
        torch.testing.assert_close(out["mul"], both.prod(0))
        torch.testing.assert_close(out["min"], both.min(0).values)
        torch.testing.assert_close(out["max"], both.max(0).values)
        torch.testing.assert_close(out["input_after"], _values(rank))
        assert out["int_max"].tolist() == [1, 5]
        assert out["int_and"].tolist() == [6 & 5, 7 & 6] and out["int_or"].tolist() == [4 | 8, 1 | 2]
        assert out["bool_and"].tolist() == [True, False] and out["bool_or"].tolist() == [False, True]
        assert [e.split(":")[1].split()[0] for e in out["errors"]] == ["scale", "'and'", "rank"], out["errors"]


@pytest.mark.slow  # two spawned processes
def test_lists_are_reduced_in_place_with_one_collective_per_bucket(ranks):
    results, _ = ranks
    for out in results:
        assert out["list_is_inputs"]
        for i, tensor in enumerate(out["list"]):
            torch.testing.assert_close(tensor, torch.full((i % 7 + 1, 3), (2.0 * i + 1) * 0.25))
        assert len(out["default_cap_calls"]) == 1  # 100 tensors, one bucket
        assert out["default_cap_calls"][0] == (torch.float32, sum((i % 7 + 1) * 3 for i in range(100)))
        # a 3 KiB cap holds three 1 KiB tensors: 10 tensors -> 4 buckets
        assert [n for _, n in out["tiny_cap_calls"]] == [768, 768, 768, 256]
        for tensor in out["tiny_cap_values"]:
            torch.testing.assert_close(tensor, torch.full((256,), 3.0))
        # one bucket per dtype
        assert sorted(str(d) for d, _ in out["mixed_calls"]) == ["torch.float32", "torch.float64", "torch.int64"]
        assert [t.dtype for t in out["mixed"]] == [torch.float32, torch.float64, torch.float32, torch.int64]
        assert all(bool((t == 2).all()) for t in out["mixed"])


@pytest.mark.slow  # two spawned processes
def test_wire_compression_by_argument_and_environment(ranks):
    results, _ = ranks
    for out in results:
        # float32 travels as bfloat16; a bf16 tensor is not widened or re-compressed
        assert sorted(str(d) for d, _ in out["bf16_calls"]) == ["torch.bfloat16", "torch.bfloat16"]
        fp32, bf16 = out["bf16"]
        assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
        # 1 + 2^-12 is not representable in bf16 (8 bits of mantissa): the wire rounded it
        exact = (1.0 + 2.0**-12) + (1.0 + 2.0**-11)
        assert not torch.equal(fp32, torch.full((3,), exact))
        torch.testing.assert_close(fp32, torch.full((3,), exact), atol=1e-2, rtol=0)
        torch.testing.assert_close(bf16, torch.full((2,), 0.5, dtype=torch.bfloat16))
        assert [d for d, _ in out["fp16_env_calls"]] == [torch.float16]
        torch.testing.assert_close(out["fp16_env"][0], torch.full((3,), 1.5))


@pytest.mark.slow  # two spawned processes
def test_replica_groups(ranks):
    results, _ = ranks
    for rank, out in enumerate(results):
        torch.testing.assert_close(out["groups_single"], _values(rank))
        torch.testing.assert_close(out["groups_pair"], _values(0) + _values(1))


@pytest.mark.slow  # two spawned processes
def test_reduce_gradients_gives_every_rank_the_mean_gradient(ranks):
    results, _ = ranks
    expected = [(a + b) / 2 for a, b in zip(results[0]["local_grads"], results[1]["local_grads"])]
    assert not torch.allclose(results[0]["local_grads"][0], results[1]["local_grads"][0])
    for out in results:
        assert out["fetched_are_grads"]
        for got, want in zip(out["reduced_grads"], expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    for a, b in zip(results[0]["reduced_grads"], results[1]["reduced_grads"]):
        assert torch.equal(a, b)


@pytest.mark.slow  # two spawned processes
def test_rendezvous_and_save_on_master_only(ranks):
    results, save_path = ranks
    for out in results:
        assert out["rendezvous"] == [b"rank0", b"rank1"]
    saved = torch.load(save_path)
    assert saved["rank"].item() == 0 and torch.equal(saved["nested"][0], torch.zeros(2))


# --- helpers, one process -----------------------------------------------------------------


def test_make_buckets_splits_by_dtype_and_cap():
    a, b, c = torch.ones(4), torch.ones(4), torch.ones(100)
    d = torch.ones(2, dtype=torch.float16)
    buckets = _collectives.make_buckets([a, d, b, c], cap_bytes=32)
    assert [[id(t) for t in bucket] for bucket in buckets] == [[id(a), id(b)], [id(d)], [id(c)]]


@pytest.mark.parametrize(
    "value, expected",
    [("bf16", torch.bfloat16), ("FP16", torch.float16), ("none", None), (torch.float16, torch.float16)],
)
def test_wire_dtype_choices(value, expected):
    assert _collectives.wire_dtype(value) is expected


def test_wire_dtype_rejects_unknown_names(monkeypatch):
    with pytest.raises(ValueError, match="compress='int8'"):
        _collectives.wire_dtype("int8")
    with pytest.raises(ValueError, match="compress=torch.float32"):
        _collectives.wire_dtype(torch.float32)
    monkeypatch.setenv(_collectives.COMPRESS_ENV, "fp8")
    with pytest.raises(ValueError, match=_collectives.COMPRESS_ENV):
        _collectives.wire_dtype()


def test_bucket_cap_from_environment(monkeypatch):
    assert _collectives.bucket_cap_bytes() == 25 * 2**20
    monkeypatch.setenv(_collectives.BUCKET_MB_ENV, "0.5")
    assert _collectives.bucket_cap_bytes() == 2**19
    monkeypatch.setenv(_collectives.BUCKET_MB_ENV, "lots")
    with pytest.raises(ValueError, match="megabytes"):
        _collectives.bucket_cap_bytes()


def test_broadcast_master_param_copies_rank_0s_parameters_and_buffers(ranks):
    results, _ = ranks
    torch.manual_seed(100)
    expected = torch.nn.BatchNorm1d(3).state_dict()
    for rank_result in results:
        for key, value in rank_result["broadcast"].items():
            assert torch.equal(value, expected[key]), key
