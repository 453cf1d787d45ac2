import fcntl
import functools
import multiprocessing
import os
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from accrewrite.runtime.io import PreprocessCache
from accrewrite.runtime.io.cache import CacheCorruptionWarning
from accrewrite.runtime.io.fingerprint import fingerprint

import _forked

DATA = list(range(1, 21))


def preprocess(x, scale=1):
    """Every kind of leaf the cache stores: tensors of several dtypes and shapes, arrays, values."""
    return {
        "ids": torch.arange(x) * scale,
        "half": torch.full((2, x), x / 3, dtype=torch.float16),
        "bf16": torch.tensor([x / 7], dtype=torch.bfloat16),
        "mask": torch.arange(x) % 2 == 0,
        "scalar": torch.tensor(float(x)),
        "empty": torch.zeros(0, 3),
        "array": np.arange(x, dtype=np.int32).reshape(1, x),
        "meta": (x, f"doc-{x}", [x, None]),
    }


def assert_same_sample(actual, expected):
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert actual[key].dtype == value.dtype and torch.equal(actual[key], value), key
        elif isinstance(value, np.ndarray):
            assert actual[key].dtype == value.dtype and np.array_equal(actual[key], value), key
        else:
            assert actual[key] == value, key


class Counting:
    """A preprocess function that counts its calls (its state is not part of its fingerprint)."""

    calls = 0

    def __call__(self, x, scale=1):
        type(self).calls += 1
        return preprocess(x, scale)


@pytest.fixture
def counting():
    Counting.calls = 0
    return Counting()


def test_builds_once_then_reads_from_disk(tmp_path, counting):
    first = PreprocessCache(DATA, counting, tmp_path, fn_kwargs={"scale": 3})
    assert first.status == "built" and Counting.calls == len(DATA)
    second = PreprocessCache(DATA, counting, tmp_path, fn_kwargs={"scale": 3})
    assert second.status == "hit" and Counting.calls == len(DATA)
    assert len(second) == len(DATA)
    for i, x in enumerate(DATA):
        assert_same_sample(second[i], preprocess(x, 3))
    assert_same_sample(second[-1], preprocess(DATA[-1], 3))
    assert Counting.calls == len(DATA)


def test_reads_are_safe_to_modify(tmp_path):
    cache = PreprocessCache(DATA, preprocess, tmp_path)
    sample = cache[4]
    sample["ids"] += 100
    sample["array"] += 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # each read has a buffer of its own: no checksum failure
        assert_same_sample(cache[4], preprocess(DATA[4]))


def double(x):
    return x * 2


def triple(x):
    return x * 3


def uses_helper(x):
    return helper(x)


def helper(x):
    return x + 1


OFFSET = 10


def uses_constant(x):
    return x + OFFSET


def add(x, amount):
    return x + amount


def closure(amount):
    def fn(x):
        return x + amount
    return fn


def test_fingerprint_follows_code_arguments_and_dataset():
    def key(fn, kwargs=None, dataset=DATA, dataset_id=None):
        return fingerprint(dataset, fn, kwargs or {}, dataset_id)

    base = key(double)
    assert key(double) == base
    variants = [
        key(triple),
        key(double, {"scale": 2}),
        key(functools.partial(add, amount=1)),
        key(closure(1)),
        key(uses_helper),
        key(uses_constant),
        key(double, dataset=DATA[:-1]),
        key(double, dataset=DATA[:-1] + [99]),
        key(double, dataset_id="v1"),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert key(functools.partial(add, amount=1)) != key(functools.partial(add, amount=2))
    assert key(closure(1)) != key(closure(2))
    assert key(double, dataset_id="v1") != key(double, dataset_id="v2")


def test_fingerprint_sees_changes_in_called_helpers_and_constants():
    """Functions made by exec, as if the user edited the module between two runs."""

    def build(source):
        namespace = {"__name__": "user_preprocessing"}
        exec(source, namespace)
        return namespace["fn"]

    original = "def helper(x): return x + 1\nLIMIT = 5\ndef fn(x): return helper(x)[:LIMIT]"
    same = build(original)
    helper_changed = build(original.replace("x + 1", "x + 2"))
    constant_changed = build(original.replace("LIMIT = 5", "LIMIT = 6"))
    comment_added = build("# edited\n" + original)
    keys = [fingerprint(DATA, fn, {}) for fn in (same, helper_changed, constant_changed)]
    assert len(set(keys)) == 3
    assert fingerprint(DATA, comment_added, {}) == keys[0] == fingerprint(DATA, build(original), {})


def test_changed_function_invalidates_the_cache(tmp_path):
    first = PreprocessCache(DATA, double, tmp_path)
    second = PreprocessCache(DATA, triple, tmp_path)
    assert first.status == second.status == "built"
    assert first.path != second.path
    assert second[3] == 12 and PreprocessCache(DATA, double, tmp_path)[3] == 8


def test_hugging_face_fingerprint_and_dataset_id_identify_the_dataset(tmp_path):
    class HubDataset(list):
        _fingerprint = "abc123"

    keyed = fingerprint(HubDataset(DATA), double, {})
    assert keyed != fingerprint(DATA, double, {})
    changed = HubDataset(DATA)
    changed._fingerprint = "def456"
    assert fingerprint(changed, double, {}) != keyed
    assert fingerprint(DATA, double, {}, "v1") == fingerprint(DATA[::-1], double, {}, "v1")


def flip_last_record_byte(cache):
    offset, length, _ = cache._file.index[-1]
    return int(offset + length - 1)


def damage(path, position, new_bytes=None, truncate=None):
    if truncate is not None:
        os.truncate(path, truncate)
        return
    with open(path, "r+b") as handle:
        handle.seek(position)
        old = handle.read(len(new_bytes))
        handle.seek(position)
        handle.write(bytes(a ^ b for a, b in zip(old, new_bytes)))


def test_corrupt_record_is_detected_at_read_rebuilt_and_reported(tmp_path, counting):
    cache = PreprocessCache(DATA, counting, tmp_path)
    inode = os.stat(cache.path).st_ino
    damage(cache.path, flip_last_record_byte(cache), b"\x01")
    reader = PreprocessCache(DATA, counting, tmp_path)
    assert reader.status == "hit"  # the header, footer and index are intact
    assert_same_sample(reader[0], preprocess(DATA[0]))
    with pytest.warns(CacheCorruptionWarning, match=f"record {len(DATA) - 1} fails its checksum"):
        sample = reader[-1]
    assert_same_sample(sample, preprocess(DATA[-1]))
    assert reader.status == "rebuilt" and os.stat(cache.path).st_ino != inode
    assert Counting.calls == 2 * len(DATA)
    # The old reader now meets the rebuilt file as a replacement and only reopens it.
    with pytest.warns(CacheCorruptionWarning):
        assert_same_sample(cache[-1], preprocess(DATA[-1]))
    assert Counting.calls == 2 * len(DATA)
    assert PreprocessCache(DATA, counting, tmp_path).status == "hit"


@pytest.mark.parametrize(
    "harm, reason",
    [
        (lambda path, size: damage(path, 0, b"\xff"), "bad header"),
        (lambda path, size: damage(path, size - 5, b"\x01"), "fingerprint|bad footer"),
        (lambda path, size: damage(path, size - 70, b"\x01"), "index fails its checksum"),
        (lambda path, size: damage(path, None, truncate=size - 7), "bad footer"),
        (lambda path, size: damage(path, None, truncate=size // 2), "bad footer"),
        (lambda path, size: damage(path, None, truncate=3), "truncated"),
    ],
    ids=["header", "footer", "index", "truncated-tail", "truncated-half", "truncated-to-nothing"],
)
def test_damaged_file_is_rebuilt_on_open(tmp_path, counting, harm, reason):
    cache = PreprocessCache(DATA, counting, tmp_path)
    harm(cache.path, os.path.getsize(cache.path))
    with pytest.warns(CacheCorruptionWarning, match=reason):
        rebuilt = PreprocessCache(DATA, counting, tmp_path)
    assert rebuilt.status == "rebuilt" and Counting.calls == 2 * len(DATA)
    for i, x in enumerate(DATA):
        assert_same_sample(rebuilt[i], preprocess(x))


def pages(x):
    """A sample of many memory pages: truncating the file leaves whole records past its end."""
    return torch.full((1 << 14,), x)


def read_after_truncation(cache_dir):
    """Runs in a child process: a crash there (SIGBUS) shows as its exit code."""
    cache = PreprocessCache(DATA, pages, cache_dir)
    assert cache.status == "hit"
    os.truncate(cache.path, os.path.getsize(cache.path) // 2)  # in place, while the cache holds it
    with pytest.warns(CacheCorruptionWarning, match="truncated"):
        for i, x in enumerate(DATA):
            assert torch.equal(cache[i], pages(x))
    assert cache.status == "rebuilt"


@pytest.mark.timeout(60)
def test_a_file_truncated_while_open_is_reported_and_rebuilt_not_a_crash(tmp_path):
    PreprocessCache(DATA, pages, tmp_path)
    reader = _forked.start(read_after_truncation, tmp_path)
    reader.join(timeout=30)
    reader.kill()
    assert reader.exitcode == 0, f"the reader ended with exit code {reader.exitcode}"


def failing_at(x, at):
    if x == at:
        raise RuntimeError("preprocessing failed")
    return x


def test_a_failed_build_leaves_no_file_behind(tmp_path):
    with pytest.raises(RuntimeError, match="preprocessing failed"):
        PreprocessCache(DATA, failing_at, tmp_path, fn_kwargs={"at": 7})
    assert not [name for name in os.listdir(tmp_path) if not name.endswith(".lock")]
    assert PreprocessCache(DATA, failing_at, tmp_path, fn_kwargs={"at": -1})[6] == 7


def keep(sample):
    return sample


def test_dataloader_workers_read_the_cache_and_can_build_it(tmp_path, counting):
    built = PreprocessCache(DATA, counting, tmp_path, num_workers=2)
    assert built.status == "built"
    fresh = PreprocessCache(DATA, preprocess, tmp_path / "b")
    for cache in (built, fresh):
        loader = DataLoader(cache, batch_size=None, num_workers=2, collate_fn=keep)
        for x, sample in zip(DATA, loader, strict=True):
            assert_same_sample(sample, preprocess(x))


def slow_square(x, log_dir):
    import time

    with open(os.path.join(log_dir, f"calls-{os.getpid()}"), "a") as log:
        log.write(f"{x}\n")
    time.sleep(0.02)
    return torch.tensor([x * x])


def rank_main(rank, cache_dir, log_dir, barrier, results):
    barrier.wait()  # both ranks ask for the cache at the same moment
    cache = PreprocessCache(DATA, slow_square, cache_dir, fn_kwargs={"log_dir": log_dir})
    results.put((rank, cache.status, [int(cache[i]) for i in range(len(cache))]))


@pytest.mark.slow  # two spawned interpreters importing torch
@pytest.mark.timeout(120)
def test_two_ranks_share_one_build(tmp_path):
    cache_dir, log_dir = tmp_path / "cache", tmp_path / "log"
    log_dir.mkdir()
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    ranks = [context.Process(target=rank_main, args=(rank, str(cache_dir), str(log_dir), barrier, results))
             for rank in range(2)]
    for process in ranks:
        process.start()
    outcomes = sorted(results.get(timeout=100) for _ in ranks)
    for process in ranks:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert sorted(status for _, status, _ in outcomes) == ["built", "hit"]
    assert all(values == [x * x for x in DATA] for _, _, values in outcomes)
    logs = os.listdir(log_dir)
    assert len(logs) == 1  # one process preprocessed, the other waited and read
    assert sorted(map(int, open(log_dir / logs[0]).read().split())) == DATA


def building_files(cache_dir):
    return [name for name in os.listdir(cache_dir) if name.startswith(".building-")]


@pytest.mark.timeout(60)
def test_a_build_killed_midway_leaves_no_temporary_behind(tmp_path):
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    cache_dir = tmp_path / "cache"
    build = functools.partial(PreprocessCache, DATA, slow_square, cache_dir,
                              fn_kwargs={"log_dir": log_dir})
    builder = _forked.start(build)
    try:
        while not (cache_dir.exists() and building_files(cache_dir)):
            assert builder.is_alive(), "the builder ended before it began writing"
            time.sleep(0.01)
    finally:
        builder.kill()
        builder.join(timeout=30)
    assert len(building_files(cache_dir)) == 1
    cache = build()
    assert cache.status == "built" and building_files(cache_dir) == []
    assert [int(cache[i]) for i in range(len(DATA))] == [x * x for x in DATA]


def test_wait_timeout_when_another_process_holds_the_build(tmp_path):
    key = fingerprint(DATA, double, {})
    with open(tmp_path / f"{key}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another open file: conflicts even in this process
        with pytest.raises(TimeoutError, match="another process"):
            PreprocessCache(DATA, double, tmp_path, wait_timeout=0.2)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(DATA)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((Stream(), double), {}, TypeError, "map-style"),
        ((DATA, "double"), {}, TypeError, "callable"),
        ((DATA, double), {"fn_kwargs": [1]}, TypeError, "fn_kwargs"),
    ],
)
def test_bad_arguments(tmp_path, args, kwargs, error, match):
    with pytest.raises(error, match=match):
        PreprocessCache(*args, tmp_path, **kwargs)


def test_index_out_of_range(tmp_path):
    cache = PreprocessCache(DATA, double, tmp_path)
    with pytest.raises(IndexError, match="out of range"):
        cache[len(DATA)]


def test_no_warnings_on_a_healthy_cache(tmp_path):
    PreprocessCache(DATA, double, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache = PreprocessCache(DATA, double, tmp_path)
        assert [cache[i] for i in range(len(DATA))] == [2 * x for x in DATA]
