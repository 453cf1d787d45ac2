"""The device the runtime trains on is whatever accelerator torch has (``torch.accelerator``), or
the CPU: the choice and what follows from it (collective backend, autocast, memory statistics,
synchronisation, random generators, Triton) with the accelerator faked, then the CPU for real."""

import datetime
import os
import types

import pytest
import torch
import torch.distributed as dist

import accrewrite.runtime.xla_model as xm
import accrewrite.runtime.xla_runtime as xr
from accrewrite.base import torch_compat as compat
from accrewrite.kernels import dispatch
from accrewrite.runtime import accelerator, amp
from accrewrite.runtime.compiler.core import patterns, registry
from accrewrite.runtime.distributed import xla_backend


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "CPU_NUM_DEVICES"):
        monkeypatch.delenv(name, raising=False)


# --- the device and its count ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cuda", "xpu", "mps", "hpu"])
def test_the_device_is_the_accelerators_local_rank_device(fake_accelerator, monkeypatch, kind):
    fake = fake_accelerator(kind, count=2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert xm.xla_device() == torch.device(kind, 1)
    assert fake.calls == [("set_device_index", 1)]  # made the current device
    assert xm.xla_device(n=0) == torch.device(kind, 0)
    assert xr.device_type() == kind.upper()
    assert xr.global_runtime_device_count() == 2


def test_a_local_rank_beyond_the_devices_is_refused(fake_accelerator, monkeypatch):
    fake_accelerator("xpu", count=2)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(RuntimeError, match=r"xla_device: xpu device 2 requested .* only 2 visible"):
        xm.xla_device()


def test_without_an_accelerator_the_device_is_the_cpu(fake_accelerator, monkeypatch):
    fake = fake_accelerator(None)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CPU_NUM_DEVICES", "4")
    assert xm.xla_device() == torch.device("cpu")
    assert (xr.device_type(), xr.global_runtime_device_count()) == ("CPU", 4)
    assert fake.calls == []


def test_a_built_but_unavailable_accelerator_leaves_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)  # no driver, no device
    assert accelerator.device_type() == "cpu"
    assert xm.xla_device() == torch.device("cpu")
    assert accelerator.device_count() == 0


# --- collectives -------------------------------------------------------------------------


@pytest.mark.parametrize("kind, backend", [("cuda", "nccl"), ("xpu", "xccl"), (None, "gloo")])
def test_the_collective_backend_is_the_one_torch_registers_for_the_device(fake_accelerator, kind, backend):
    fake_accelerator(kind)
    assert xm.dist_backend() == backend


def test_a_vendors_backend_is_found_once_its_package_registers_it(fake_accelerator, monkeypatch):
    fake_accelerator("hpu")
    with pytest.raises(RuntimeError, match=r"no backend registered for 'hpu' devices.*init_process_group"):
        xm.dist_backend()
    monkeypatch.setitem(dist.Backend.default_device_backend_map, "hpu", "hccl")
    assert xm.dist_backend() == "hccl"


def test_the_xla_group_is_the_devices_backend(fake_accelerator, monkeypatch):
    """init_process_group('xla') makes the group of the device's backend: a registered
    plugin's through its creator, gloo on the CPU."""
    made = []

    def create(store, rank, size, timeout):
        made.append((rank, size, timeout))
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    timeout = datetime.timedelta(seconds=30)
    fake_accelerator("hpu")
    monkeypatch.setitem(dist.Backend.default_device_backend_map, "hpu", "testccl")
    monkeypatch.setitem(compat.backend_plugins(), "TESTCCL", types.SimpleNamespace(creator_fn=create, extended_api=False))
    group = xla_backend._create_process_group(dist.HashStore(), 0, 1, timeout)
    assert made == [(0, 1, timeout)] and group.size() == 1

    fake_accelerator("xpu")  # torch's own xccl, absent from a CPU build of torch
    with pytest.raises(RuntimeError, match="no 'xccl' backend in this build"):
        xla_backend._create_process_group(dist.HashStore(), 0, 1, timeout)

    fake_accelerator(None)
    assert isinstance(xla_backend._create_process_group(dist.HashStore(), 0, 1, timeout), dist.ProcessGroupGloo)


# --- autocast, memory, synchronisation ---------------------------------------------------


def test_autocast_and_the_scaler_follow_the_device(fake_accelerator):
    fake_accelerator("xpu")
    context = amp.autocast()
    assert (context.device, context.fast_dtype) == ("xpu", torch.get_autocast_dtype("xpu"))
    assert amp.GradScaler()._device == "xpu"
    fake_accelerator("hpu")
    assert amp.autocast().fast_dtype == torch.bfloat16  # each device's own default
    fake_accelerator(None)
    assert (amp.autocast().device, amp.autocast().fast_dtype) == ("cpu", torch.bfloat16)


def test_memory_statistics_come_from_the_accelerators_allocator(fake_accelerator, monkeypatch):
    fake = fake_accelerator("xpu")
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = xm.get_memory_info()
    assert info == {"bytes_used": 5, "bytes_limit": 11, "peak_bytes_used": 7}
    device = torch.device("xpu", 1)
    assert fake.calls == [("set_device_index", 1), ("get_memory_info", device),
                          ("memory_allocated", device), ("max_memory_allocated", device)]
    fake.calls.clear()
    host = xm.get_memory_info("cpu")  # the host's, whatever the accelerator
    assert fake.calls == [] and 0 < host["bytes_used"] <= host["bytes_limit"]


def test_torch_cuda_s_memory_calls_are_the_accelerators_own(fake_accelerator):
    fake = fake_accelerator("cuda")
    device = torch.device("cuda", 1)
    calls = [
        (accelerator.memory_allocated, (device,), 5), (accelerator.max_memory_allocated, (1,), 7),
        (accelerator.memory_reserved, (None,), 13), (accelerator.max_memory_reserved, ("cuda:1",), 17),
        (accelerator.memory_stats, (device,), {"num_ooms": 0}), (accelerator.reset_peak_memory_stats, (device,), None),
        (accelerator.mem_get_info, (device,), (3, 11)),
        (accelerator.memory_summary, (device, True), "the allocator's table"),
        (accelerator.get_device_name, (device,), "a fake GPU"), (accelerator.empty_cache, (), None),
        (accelerator.Event, (True,), "an event"), (accelerator.current_device, (), 1),
        (accelerator.get_device_properties, (1,), "a fake GPU's properties"),
    ]
    assert [call(*args) for call, args, _ in calls] == [result for _, _, result in calls]
    assert [name for name, *_ in fake.calls] == [
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_stats",
        "reset_peak_memory_stats", "get_memory_info", "memory_summary", "get_device_name", "empty_cache", "Event",
        "current_device_index", "get_device_properties",
    ]
    assert fake.calls[10] == ("Event", {"enable_timing": True, "blocking": False, "interprocess": False})
    assert fake.calls[1] == ("max_memory_allocated", 1) and fake.calls[7] == ("memory_summary", device, True)
    fake.calls.clear()
    assert accelerator.memory_allocated("cpu") > 0 and fake.calls == []  # the host's, whatever the accelerator


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compares with CUDA's own numbers")
def test_on_cuda_torch_cuda_s_numbers_are_unchanged():
    held = torch.ones(2**20, device="cuda")
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        assert getattr(accelerator, name)() == getattr(torch.cuda, name)() > 0, name
    current = "allocated_bytes.all.current"
    assert accelerator.memory_stats()[current] == torch.cuda.memory_stats()[current]
    assert accelerator.get_device_name() == torch.cuda.get_device_name()
    assert accelerator.current_device() == torch.cuda.current_device()
    assert accelerator.get_device_properties().total_memory == torch.cuda.get_device_properties().total_memory
    accelerator.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    del held


def test_on_the_cpu_torch_cuda_s_memory_calls_describe_the_process(fake_accelerator):
    fake_accelerator(None)
    base = accelerator.memory_allocated()
    held = torch.ones(64, 1024, 1024, dtype=torch.uint8) + 1  # 64 MiB, touched
    assert accelerator.memory_allocated() - base >= 60 * 2**20
    assert accelerator.memory_reserved() >= accelerator.memory_allocated()  # both the resident set
    assert accelerator.max_memory_allocated() >= accelerator.memory_allocated()
    stats = accelerator.memory_stats(0)  # a CUDA ordinal: the host, where there is no accelerator
    kinds, moments = ("allocated", "reserved"), ("current", "peak")
    assert set(stats) == {f"{kind}_bytes.all.{moment}" for kind in kinds for moment in moments}
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"] >= 64 * 2**20
    assert "resident set" in accelerator.memory_summary() and accelerator.get_device_name()
    free, total = accelerator.mem_get_info()
    assert 0 < free <= total
    properties = accelerator.get_device_properties(accelerator.current_device())
    assert accelerator.current_device() == 0 and properties.total_memory == total
    assert properties.multi_processor_count >= 1 and (properties.major, properties.minor) == (0, 0)
    accelerator.empty_cache()
    del held


def test_on_the_cpu_an_event_takes_the_hosts_time(fake_accelerator, monkeypatch):
    fake_accelerator(None)
    start, end = accelerator.Event(enable_timing=True), accelerator.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="recorded"):
        start.elapsed_time(end)
    clock = iter([1_000_000, 3_500_000])
    monkeypatch.setattr(accelerator.time, "perf_counter_ns", lambda: next(clock))
    start.record()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) == 2.5 and end.query()


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="Linux resets a process's peak memory")
def test_on_the_cpu_the_peak_starts_anew(fake_accelerator):
    fake_accelerator(None)
    held = torch.ones(256, 1024, 1024, dtype=torch.uint8) + 1
    del held
    peak = accelerator.max_memory_allocated()
    accelerator.reset_peak_memory_stats()
    assert accelerator.max_memory_allocated() < peak - 200 * 2**20


def test_wait_device_ops_synchronises_the_accelerator_only(fake_accelerator):
    fake = fake_accelerator("xpu")
    xm.wait_device_ops()
    assert fake.calls == [("synchronize",)]
    fake = fake_accelerator(None)
    xm.wait_device_ops()
    assert fake.calls == []


# --- random generators -------------------------------------------------------------------


def test_rng_state_covers_the_accelerators_generators(fake_accelerator):
    fake = fake_accelerator("xpu")
    xm.set_rng_state(1234)
    assert ("manual_seed_all", 1234) in fake.calls
    assert xm.get_rng_state() == 1234  # nothing drawn since
    torch.rand(3)
    resume = xm.get_rng_state()
    expected = (torch.rand(3), [state.clone() for state in fake.states])
    fake.states = [torch.tensor([9, 9], dtype=torch.uint8)] * 2  # the devices drew too
    xm.set_rng_state(resume)
    assert ("set_rng_state_all",) in fake.calls
    assert torch.equal(torch.rand(3), expected[0])
    assert all(torch.equal(a, b) for a, b in zip(fake.states, expected[1]))


def test_rng_state_does_not_start_an_idle_accelerator(fake_accelerator):
    fake = fake_accelerator("xpu")
    fake.initialized = False
    xm.get_rng_state()
    assert fake.calls == []


# --- streams, Triton, the compiler -------------------------------------------------------


def test_the_host_has_no_side_stream():
    assert accelerator.new_stream("cpu") is None
    assert not accelerator.on_accelerator("cpu")


class _OnDevice(torch.Tensor):
    """A meta tensor that says it lives on ``kind``, to exercise device choices without one."""

    kind = "xpu"

    @property
    def device(self):
        return torch.device(self.kind)


def _on(kind):
    tensor = torch.empty(4, device="meta").as_subclass(_OnDevice)
    tensor.kind = kind
    return tensor


@pytest.mark.parametrize("kind, triton", [("cuda", True), ("xpu", True), ("mps", False), ("hpu", False)])
def test_triton_kernels_run_where_triton_compiles(monkeypatch, kind, triton):
    pytest.importorskip("triton")
    monkeypatch.delenv(dispatch.MODE_ENV, raising=False)
    assert dispatch.use_triton(_on(kind)) is triton
    assert dispatch.use_triton(torch.empty(4)) is False


@pytest.mark.parametrize("kind", ["xpu", "mps"])
def test_a_graph_on_another_accelerator_keeps_its_default_code(kind):
    graph = torch.fx.Graph()
    for tensor in (torch.empty(2), _on(kind)):
        graph.placeholder(f"x{len(graph.nodes)}").meta["val"] = tensor
    assert patterns.graph_device(graph) == kind
    for op in registry.ops():
        assert registry.default(op, kind).kernel is None
        assert not registry.replaceable(op, kind)  # the Triton and C++ kernels are CUDA's and the CPU's


def test_the_xla_name_never_becomes_a_devices_backend(fake_accelerator, monkeypatch):
    """Registered on a device no backend claims yet, 'xla' leaves the claim to the vendor's
    backend (it stands for that backend, and would otherwise create itself)."""
    fake_accelerator("hpu")
    defaults = dict(dist.Backend.default_device_backend_map)
    monkeypatch.setattr(dist.Backend, "default_device_backend_map", defaults)
    monkeypatch.setattr(dist.Backend, "backend_list", [b for b in dist.Backend.backend_list if b != "xla"])
    monkeypatch.setattr(dist.Backend, "backend_capability", dict(dist.Backend.backend_capability))
    monkeypatch.setattr(dist.Backend, "backend_type_map", dict(dist.Backend.backend_type_map))
    monkeypatch.setattr(dist.Backend, "_plugins", dict(dist.Backend._plugins))
    before = defaults.get("hpu")  # torch's test backend may hold it
    xla_backend._register()
    assert dist.Backend.backend_capability["xla"] == ["hpu"]
    assert defaults.get("hpu") == before
