"""io.Prefetcher: TorchAcc's loop-driven prefetcher (prefetch_CPU / prefetch_GPU)."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import accrewrite.runtime.xla_model as xm
from accrewrite.runtime.io import Prefetcher
from accrewrite.runtime.io.prefetcher import Prefetcher as SeedPathPrefetcher


class CountingLoader:
    """An iterable of dict batches that records how many batches were taken from it."""

    def __init__(self, n):
        self.n = n
        self.loaded = 0

    def __len__(self):
        return self.n

    def __iter__(self):
        self.loaded = 0
        for i in range(self.n):
            self.loaded += 1
            yield {"x": torch.full((2,), float(i)), "id": i}


def test_seed_import_path():
    assert SeedPathPrefetcher is Prefetcher


def test_seed_loop_loads_on_prefetch_cpu_and_moves_on_prefetch_gpu():
    loader = CountingLoader(4)
    preprocessed = []

    def preprocess(batch):
        assert batch["x"].device.type == "meta"  # preprocessing runs on the device
        preprocessed.append(batch["id"])
        return {**batch, "x": batch["x"] * 2}

    prefetcher = Prefetcher(loader, preprocess, device="meta")
    assert prefetcher.device == torch.device("meta") and len(prefetcher) == 4
    seen = []
    for step, samples in enumerate(prefetcher):
        seen.append(samples["id"])
        assert samples["x"].device.type == "meta"
        assert loader.loaded == step + 1 and preprocessed == list(range(step + 1))
        prefetcher.prefetch_CPU()
        prefetcher.prefetch_CPU()  # once per batch
        assert loader.loaded == min(step + 2, 4) and len(preprocessed) == step + 1
        prefetcher.prefetch_GPU()
        prefetcher.prefetch_GPU()
        assert preprocessed == list(range(min(step + 2, 4)))
    assert seen == [0, 1, 2, 3]


def test_values_without_any_prefetch_calls_and_a_second_epoch():
    data = TensorDataset(torch.arange(10.0).view(5, 2), torch.arange(5))
    loader = DataLoader(data, batch_size=2)
    prefetcher = Prefetcher(loader, lambda batch: [t + 1 for t in batch])
    for _ in range(2):
        got = list(prefetcher)
        assert len(got) == 3
        for (x, y), (ex, ey) in zip(got, loader):
            assert torch.equal(x, ex + 1) and torch.equal(y, ey + 1)
            assert x.device == xm.xla_device()


def test_prefetch_gpu_alone_loads_first():
    loader = CountingLoader(3)
    prefetcher = iter(Prefetcher(loader))
    assert next(prefetcher)["id"] == 0
    prefetcher.prefetch_GPU()
    assert loader.loaded == 2
    assert [next(prefetcher)["id"] for _ in range(2)] == [1, 2]
    with pytest.raises(StopIteration):
        next(prefetcher)
    prefetcher.prefetch_CPU()  # harmless after the end
    prefetcher.prefetch_GPU()


def test_bad_use_is_reported():
    with pytest.raises(TypeError, match="preprocess_fn must be callable"):
        Prefetcher([], preprocess_fn="normalize")
    with pytest.raises(TypeError, match="iter"):
        next(Prefetcher([torch.ones(1)]))


def test_loader_errors_surface_at_the_call_that_loads():
    def broken():
        yield torch.ones(1)
        raise OSError("disk gone")

    prefetcher = iter(Prefetcher(broken()))
    next(prefetcher)
    with pytest.raises(OSError, match="disk gone"):
        prefetcher.prefetch_CPU()
