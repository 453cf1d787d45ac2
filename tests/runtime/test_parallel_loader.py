"""pl.MpDeviceLoader / ParallelLoader: device placement of nested batches, where batches are
loaded (and so how the global random stream is consumed), background prefetch of multi-worker
DataLoaders, loader attributes, errors and thread cleanup.

Batches are moved to the ``meta`` device where a test must see that every tensor was moved
(on the CPU a move to ``cpu`` is the identity)."""

import collections
import dataclasses
import gc
import itertools
import multiprocessing
import os
import signal
import threading
import time
import traceback

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

import accrewrite.runtime.parallel_loader as pl
import accrewrite.runtime.xla_model as xm
from accrewrite.base import accelerator

import _forked

THREAD_NAME = "accrewrite-device-loader"
Pair = collections.namedtuple("Pair", "inputs labels")


@dataclasses.dataclass(frozen=True)
class Sample:
    pixels: torch.Tensor
    meta: dict
    name: str = "x"


class Encoding(collections.UserDict):
    """Like HF BatchEncoding: a UserDict with state of its own next to the data."""

    def __init__(self, data=None, encodings=None):
        super().__init__(data)
        self.encodings = encodings


def loader_threads():
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    gc.collect()
    assert wait_until(lambda: not loader_threads()), "a device loader thread outlived its test"


def test_nested_batches_are_moved_with_their_types():
    batches = [
        torch.ones(2),
        {"a": torch.ones(1), "b": [torch.zeros(2), (torch.ones(3), 7)], "c": "text"},
        Pair(torch.ones(2), torch.zeros(2, dtype=torch.long)),
        Sample(torch.ones(2, 2), {"id": torch.arange(2)}),
        Encoding({"input_ids": torch.ones(2, 4, dtype=torch.long)}, encodings=["enc"]),
        [None, 3.5],
    ]
    got = list(pl.MpDeviceLoader(batches, "meta"))
    assert len(got) == len(batches)
    plain, mapping, pair, sample, encoding, leaves = got
    assert plain.device.type == "meta"
    assert mapping["a"].device.type == "meta" and mapping["b"][0].device.type == "meta"
    assert isinstance(mapping["b"][1], tuple) and mapping["b"][1][1] == 7 and mapping["c"] == "text"
    assert mapping["b"][1][0].device.type == "meta"
    assert type(pair) is Pair and pair.labels.dtype == torch.long and pair.inputs.device.type == "meta"
    assert type(sample) is Sample and sample.pixels.device.type == "meta"
    assert sample.meta["id"].device.type == "meta" and sample.name == "x"
    assert type(encoding) is Encoding and encoding.encodings == ["enc"]
    assert encoding["input_ids"].device.type == "meta"
    assert leaves == [None, 3.5]
    # the source batches are left alone
    assert batches[1]["a"].device.type == "cpu" and batches[4]["input_ids"].device.type == "cpu"


def test_values_and_order_of_a_dataloader_on_cpu():
    data = TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    loader = DataLoader(data, batch_size=3)
    device = xm.xla_device()
    for epoch in range(2):  # every iter() starts over
        got = list(pl.MpDeviceLoader(loader, device))
        expected = list(loader)
        assert len(got) == len(expected) == 4
        for (x, y), (ex, ey) in zip(got, expected):
            assert torch.equal(x, ex) and torch.equal(y, ey) and x.device == device


def test_len_and_loader_attributes_are_the_wrapped_loaders():
    data = TensorDataset(torch.arange(10.0))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=2, sampler=sampler)
    device_loader = pl.MpDeviceLoader(loader, "cpu")
    assert len(device_loader) == len(loader) == 3
    assert device_loader.dataset is data and device_loader.sampler is sampler
    assert device_loader.batch_sampler is loader.batch_sampler and device_loader.batch_size == 2
    device_loader.sampler.set_epoch(5)
    assert sampler.epoch == 5
    assert [b[0].tolist() for b in device_loader] == [b[0].tolist() for b in loader]
    iterator = iter(device_loader)
    assert len(iterator) == 3
    iterator.close()


def test_a_plain_iterable_is_read_only_when_the_loop_asks():
    produced = []

    def endless():
        for i in itertools.count():
            produced.append(i)
            yield torch.tensor([i])

    iterator = iter(pl.MpDeviceLoader(endless(), "cpu"))
    assert produced == []
    assert next(iterator).item() == 0 and produced == [0]
    assert next(iterator).item() == 1 and produced == [0, 1]
    assert not loader_threads()


class CountingLoader(DataLoader):
    """A DataLoader whose iterator counts, in this process, the batches it hands out."""

    def __iter__(self):
        self.iterator = CountingIterator(super().__iter__())
        return self.iterator


class CountingIterator:
    def __init__(self, iterator):
        self.iterator, self.handed_out = iterator, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.iterator)
        self.handed_out += 1
        return batch


def test_a_multi_worker_loader_is_prefetched_in_the_background_with_a_bounded_queue():
    loader = CountingLoader(TensorDataset(torch.arange(64.0)), batch_size=1, num_workers=1)
    iterator = iter(pl.MpDeviceLoader(loader, "cpu", device_prefetch_size=3))
    assert next(iterator)[0].item() == 0
    # without another next(), the thread fills the queue (3) and holds one more batch ready
    assert wait_until(lambda: loader.iterator.handed_out >= 5)
    time.sleep(0.2)
    assert loader.iterator.handed_out == 5, "the prefetch queue is not bounded"
    assert [next(iterator)[0].item() for _ in range(4)] == [1, 2, 3, 4]
    del iterator


class RandomItems(Dataset):
    """Items drawn from torch's global generator (of the process that loads them)."""

    def __len__(self):
        return 12

    def __getitem__(self, index):
        return index, torch.rand(3)


def loop_draws(loader):
    """Every batch a training loop over ``loader`` sees, and the noise it draws, from seed 0."""
    torch.manual_seed(0)
    iterator = iter(loader)
    seen = [torch.randn(2)]  # between iter() and the first batch
    for index, items in iterator:
        seen += [index, items, torch.randn(2)]
    return seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_global_random_stream_is_consumed_as_by_plain_iteration(num_workers):
    loader = DataLoader(RandomItems(), batch_size=2, shuffle=True, num_workers=num_workers)
    expected = [t.tolist() for t in loop_draws(loader)]
    assert len(expected) == 1 + 3 * 6
    for _ in range(3):
        assert [t.tolist() for t in loop_draws(pl.MpDeviceLoader(loader, "cpu"))] == expected


def test_the_thread_count_is_left_alone():
    def thread_counts():
        """torch's intra-op thread count as seen here and by a thread started now (which picks
        up the process-wide setting)."""
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        return torch.get_num_threads(), seen[0]

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for num_workers in (0, 1):
            data = TensorDataset(torch.arange(8.0))
            loader = DataLoader(data, batch_size=2, num_workers=num_workers)
            for _ in pl.MpDeviceLoader(loader, "cpu"):
                assert thread_counts() == (2, 2)
            assert thread_counts() == (2, 2)
    finally:
        torch.set_num_threads(before)


def _failing_getitem(index):
    if index == 3:
        raise ValueError(f"corrupt sample {index}")
    return torch.tensor([index])


class FailingDataset(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, index):
        return _failing_getitem(index)


class FailingLoader(DataLoader):
    """A multi-worker DataLoader (loaded in the background) whose iterator fails in this
    process: a worker's failure would cost seconds of worker shutdown."""

    def __iter__(self):
        return map(_failing_getitem, range(len(self.dataset)))


@pytest.mark.parametrize("make_loader, num_workers", [(DataLoader, 0), (FailingLoader, 1)])
def test_a_loader_exception_reaches_the_loop_with_its_traceback(make_loader, num_workers):
    seen = []
    loader = make_loader(FailingDataset(), batch_size=1, num_workers=num_workers)
    with pytest.raises(ValueError, match="corrupt sample 3") as info:
        for batch in pl.MpDeviceLoader(loader, "cpu"):
            seen.append(batch.item())
    assert seen == [0, 1, 2]
    text = "".join(traceback.format_exception(info.value))
    assert "_failing_getitem" in text and "device loader" in text
    assert not loader_threads()


class DiesAt(Dataset):
    """Its DataLoader worker is killed (SIGKILL, as by the OOM killer) when it loads item
    ``at``, after writing its pid to ``pid_file``."""

    def __init__(self, at, pid_file):
        self.at = at
        self.pid_file = pid_file

    def __len__(self):
        return 64

    def __getitem__(self, index):
        if index == self.at:
            self.pid_file.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([index])


def loop_until_a_worker_dies(pid_file, sigchld, results):
    """A training process: what its loop over the device loader raises goes to ``results``."""
    if sigchld == "late":
        # torch names a dead worker from a SIGCHLD handler on the main thread; on a loaded
        # machine it can run after the loop has already met the death. Held off here until exit.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    loader = DataLoader(DiesAt(10, pid_file), batch_size=2, num_workers=2)
    start = time.monotonic()
    try:
        for _ in pl.MpDeviceLoader(loader, "cpu"):
            pass
        results.put(("no error", "", time.monotonic() - start))
    except Exception as error:  # noqa: BLE001 - reported to the test
        results.put((type(error).__name__, str(error), time.monotonic() - start))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sigchld", ["prompt", "late"])
def test_a_killed_worker_is_named_as_a_plain_dataloader_names_it(tmp_path, sigchld):
    """Not a bare ConnectionResetError from the background thread, whether torch's SIGCHLD
    handler names the worker first (as for a plain DataLoader) or the device loader must."""
    results = _forked.CONTEXT.Queue()
    pid_file = tmp_path / "worker.pid"
    process = _forked.start(loop_until_a_worker_dies, pid_file, sigchld, results)
    try:
        kind, message, seconds = results.get(timeout=30)
    finally:
        process.join(timeout=10)
        process.kill()
    # what a plain DataLoader raises (from its SIGCHLD handler)
    expected = f"DataLoader worker (pid {pid_file.read_text()}) is killed by signal: Killed."
    assert (kind, message.strip()) == ("RuntimeError", expected)
    assert seconds < 10  # without the handler torch sees a dead worker in 5 s, at its next check


def test_exhausted_loader_keeps_raising_stop_iteration():
    iterator = iter(pl.MpDeviceLoader([torch.ones(1)], "cpu"))
    assert list(iterator) == [torch.ones(1)]
    with pytest.raises(StopIteration):
        next(iterator)


def test_breaking_out_of_the_loop_leaves_no_thread_or_worker():
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=2, num_workers=1)
    for i, _ in enumerate(pl.MpDeviceLoader(loader, "cpu")):
        if i == 2:
            assert len(loader_threads()) == 1 and multiprocessing.active_children()
            break
    gc.collect()
    assert wait_until(lambda: not loader_threads())
    assert wait_until(lambda: not multiprocessing.active_children())


def test_deleting_the_loader_mid_epoch_stops_thread_and_workers():
    loader = pl.MpDeviceLoader(DataLoader(TensorDataset(torch.arange(64.0)), batch_size=2, num_workers=1), "cpu")
    iterator = iter(loader)
    next(iterator)
    assert len(loader_threads()) == 1 and multiprocessing.active_children()
    del iterator, loader
    gc.collect()
    assert wait_until(lambda: not loader_threads())
    assert wait_until(lambda: not multiprocessing.active_children())


def test_fetching_a_batch_marks_the_step():
    ran = []
    iterator = iter(pl.MpDeviceLoader([torch.ones(1)] * 3, "cpu"))
    next(iterator)
    xm.add_step_closure(ran.append, args=("logged",))
    assert ran == []
    next(iterator)
    assert ran == ["logged"]
    xm.add_step_closure(ran.append, args=("last",))
    assert list(iterator) and ran == ["logged", "last"]


def test_batches_per_execution_marks_every_nth_batch():
    ran, after_each_fetch = [], []
    iterator = iter(pl.MpDeviceLoader([torch.ones(1)] * 6, "cpu", batches_per_execution=3))
    for fetch in range(1, 7):
        xm.add_step_closure(ran.append, args=(fetch,))
        next(iterator)
        after_each_fetch.append(len(ran))
    # as torch_xla: the step is marked as fetches 3 and 6 begin
    assert after_each_fetch == [0, 0, 3, 3, 3, 6]


def test_parallel_loader_checks_devices():
    with pytest.raises(ValueError, match="one device per process"):
        pl.ParallelLoader([], ["cpu", "meta"])
    parallel = pl.ParallelLoader([torch.ones(2)], ["cpu"])
    with pytest.raises(ValueError, match="feeds cpu"):
        next(parallel.per_device_loader("meta"))
    assert list(parallel.per_device_loader("cpu"))[0].shape == (2,)
    with pytest.raises(RuntimeError):
        pl.MpDeviceLoader([], "not-a-device")


@pytest.mark.skipif(accelerator.device_type() == "cpu", reason="needs an accelerator")
def test_accelerator_batches_are_pinned_and_copied_non_blocking():
    batches = [{"x": torch.randn(64, 64), "y": torch.arange(64)} for _ in range(5)]
    got = list(pl.MpDeviceLoader(batches, xm.xla_device()))
    for batch, ref in zip(got, batches):
        assert batch["x"].device == xm.xla_device() and torch.equal(batch["x"].cpu(), ref["x"])
        assert torch.equal(batch["y"].cpu(), ref["y"])


@pytest.mark.parametrize("workers", [0, 1])
def test_iterating_again_closes_the_previous_iteration(workers):
    # torch_xla's MpDeviceLoader closes the ParallelLoader of its previous iter()
    device_loader = pl.MpDeviceLoader(DataLoader(list(range(64)), batch_size=2, num_workers=workers), "cpu")
    first = iter(device_loader)
    next(first)
    second = iter(device_loader)
    with pytest.raises(StopIteration):
        next(first)
    assert len(list(second)) == 32
