"""``xmp.spawn`` (what ``mp.spawn`` becomes on the runtime target) and the device count that sizes
it: each process is told its device as torchrun tells it."""

import json
import os

import pytest

import accrewrite.runtime.distributed.xla_multiprocessing as xmp
import accrewrite.runtime.xla_runtime as xr


def _where(index, outdir):
    place = {"index": index, "local_rank": os.environ["LOCAL_RANK"], "local_world": os.environ["LOCAL_WORLD_SIZE"]}
    with open(os.path.join(outdir, f"{index}.json"), "w") as out:
        json.dump(place, out)


@pytest.fixture
def cpu_only(monkeypatch, fake_accelerator):
    for name in ("WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CPU_NUM_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    fake_accelerator(None)


def test_the_device_count_on_a_cpu_is_cpu_num_devices(cpu_only, monkeypatch):
    assert xr.global_runtime_device_count() == 1
    monkeypatch.setenv("CPU_NUM_DEVICES", "3")
    assert xr.global_runtime_device_count() == 3
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun: its processes
    assert xr.global_runtime_device_count() == 2


def test_the_device_count_with_an_accelerator_is_its_count(cpu_only, monkeypatch, fake_accelerator):
    fake_accelerator("cuda", count=4)
    monkeypatch.setenv("CPU_NUM_DEVICES", "3")
    assert xr.global_runtime_device_count() == 4


@pytest.mark.slow
def test_spawn_tells_each_process_its_device(cpu_only, monkeypatch, tmp_path):
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    assert xmp.spawn(_where, args=(str(tmp_path),)) is None  # nprocs=None: one per device
    found = sorted(list(json.loads(path.read_text()).values()) for path in tmp_path.glob("*.json"))
    assert found == [[0, "0", "2"], [1, "1", "2"]]
