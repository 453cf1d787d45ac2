"""``save_checkpoint``/``load_checkpoint`` (DCP) and ``export_full_state_dict``: resharding from
4 ranks to 2 is bit-exact, the export reads with a plain ``torch.load``, a save killed midway
leaves the previous checkpoint loadable while a reader keeps reading, a save on a full disk
leaves nothing behind, and a checkpoint of another model is refused unless ``strict=False``."""

import contextlib
import errno
import io
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.utils.data import DataLoader

from accrewrite.runtime import (
    CheckpointMismatchError,
    Config,
    accelerate,
    export_full_state_dict,
    load_checkpoint,
    save_checkpoint,
)

import _forked
from _ranks import run_ranks
from test_accelerate import GLOBAL_BATCH, tiny_gpt, token_dataset


def _full(model, optimizer):
    model_state, optimizer_state = get_state_dict(
        model, [optimizer], options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return model_state, optimizer_state


def _setup(fsdp, tp):
    config = Config()
    config.dist.fsdp.size, config.dist.tp.size = fsdp, tp
    model = accelerate(tiny_gpt("gpt2"), config=config)  # gpt2: a fused q/k/v split by head
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _save_rank(rank, directory, fsdp, tp):
    model, optimizer = _setup(fsdp, tp)
    loader = DataLoader(token_dataset(batches=3), batch_size=GLOBAL_BATCH)
    for tokens, targets in loader:  # every rank the same batches: the states differ by layout only
        optimizer.zero_grad()
        model(tokens, targets).backward()
        optimizer.step()
    save_checkpoint(os.path.join(directory, "ckpt"), model, optimizer, step=3, note="four ranks")
    export_full_state_dict(os.path.join(directory, "full.pt"), model)
    return _full(model, optimizer)


def _load_rank(rank, directory, fsdp, tp):
    model, optimizer = _setup(fsdp, tp)
    extra = load_checkpoint(os.path.join(directory, "ckpt"), model, optimizer)
    return extra, _full(model, optimizer)


def _assert_equal(got, want):
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            _assert_equal(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _assert_equal(a, b)
    elif isinstance(want, torch.Tensor):
        assert torch.equal(got, want)
    else:
        assert got == want


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_saved_at_four_ranks_loads_at_two_bit_exact_and_exports_a_plain_state_dict(tmp_path):
    saved = run_ranks(_save_rank, 4, str(tmp_path), 2, 2)[0]  # FSDP 2 x TP 2
    for fsdp, tp in [(2, 1), (1, 2)]:
        extra, loaded = run_ranks(_load_rank, 2, str(tmp_path), fsdp, tp)[0]
        assert extra == {"step": 3, "note": "four ranks"}
        _assert_equal(loaded, saved)

    plain = tiny_gpt("gpt2")
    plain.load_state_dict(torch.load(tmp_path / "full.pt"))  # one process, no runtime involved
    _assert_equal(plain.state_dict(), saved[0])


def test_one_process_round_trip_and_the_training_resumes_alike(tmp_path):
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(token_dataset(batches=4), batch_size=GLOBAL_BATCH)
    batches = list(loader)
    for tokens, targets in batches[:2]:
        optimizer.zero_grad()
        model(tokens, targets).backward()
        optimizer.step()
    save_checkpoint(tmp_path / "ckpt", model, optimizer, step=2)

    resumed = tiny_gpt()
    torch.nn.init.zeros_(resumed.lm_head.weight)  # differs from what was saved until loaded
    resumed_optimizer = torch.optim.SGD(resumed.parameters(), lr=0.1, momentum=0.9)
    assert load_checkpoint(tmp_path / "ckpt", resumed, resumed_optimizer) == {"step": 2}
    want = train_from(model, optimizer, batches[2:])
    assert train_from(resumed, resumed_optimizer, batches[2:]) == want


def train_from(model, optimizer, batches):
    losses = []
    for tokens, targets in batches:
        optimizer.zero_grad()
        loss = model(tokens, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_a_path_not_written_by_save_checkpoint_is_left_alone(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(FileExistsError, match="choose another path or remove it"):
        save_checkpoint(tmp_path / "ckpt", tiny_gpt())
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing", tiny_gpt())


# -- atomicity ------------------------------------------------------------------------------------

WIDE = 1 << 21  # 8 MB of parameters: a save takes long enough to be killed in the middle


class Versioned(torch.nn.Module):
    def __init__(self, version=0.0):
        super().__init__()
        self.a = torch.nn.Parameter(torch.full((WIDE,), version))
        self.b = torch.nn.Parameter(torch.full((WIDE,), version))


def _save_forever(path):
    version = 1
    while True:
        save_checkpoint(path, Versioned(float(version)), version=version)
        version += 1


def _read(path):
    model = Versioned()
    version = load_checkpoint(path, model)["version"]
    assert torch.all(model.a == version) and torch.all(model.b == version), "a checkpoint of mixed saves"
    return version


def _unfinished(path):
    """The save directories of ``path`` still being written (no extra file yet)."""
    return {e for e in os.listdir(path.parent) if e.startswith(f".{path.name}.") and e.endswith(".dcp")
            and not (path.parent / e / "extra.pt").exists()}


def test_a_save_killed_midway_leaves_the_previous_checkpoint_and_readers_never_see_a_mix(tmp_path):
    path = tmp_path / "ckpt"
    save_checkpoint(path, Versioned(0.0), version=0)
    writer = _forked.start(_save_forever, path)
    try:
        versions = []
        deadline = time.monotonic() + 60
        while len(set(versions)) < 4 and time.monotonic() < deadline:
            versions.append(_read(path))  # concurrent with the saves
        assert versions == sorted(versions) and len(set(versions)) >= 4
        unfinished = set()
        while not unfinished and time.monotonic() < deadline:  # kill until a save is caught midway
            os.kill(writer.pid, signal.SIGSTOP)
            unfinished = _unfinished(path)
            if not unfinished:
                os.kill(writer.pid, signal.SIGCONT)
        assert unfinished, "never caught a save in progress"
        last = _read(path)
    finally:
        writer.kill()
        writer.join()
    assert _read(path) == last >= versions[-1]
    save_checkpoint(path, Versioned(-1.0), version=-1)  # the next save clears what the killed one left
    assert _read(path) == -1
    assert not any((tmp_path / entry).exists() for entry in unfinished)


# -- a full disk ----------------------------------------------------------------------------------

class Filled(torch.nn.Module):
    def __init__(self, value=0.0, size=1 << 16):  # 256 KB
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((size,), value))


def _value(path):
    model = Filled()
    load_checkpoint(path, model)
    return model.weight[0].item()


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: a disk that fills up for real."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command to mount a tmpfs")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def _assert_full_disk_error(error, path):
    assert isinstance(error.value, OSError) and error.value.errno == errno.ENOSPC
    assert f"could not save the checkpoint {path}: the disk is full" in str(error.value)
    assert "free space and save again" in str(error.value)
    assert error.value.__cause__ is not None


def test_a_save_on_a_full_disk_removes_what_it_wrote_and_the_next_save_succeeds(small_disk):
    path = small_disk / "ckpt"
    save_checkpoint(path, Filled(1.0))
    before = sorted(os.listdir(small_disk))
    room = os.statvfs(small_disk)
    with open(small_disk / "filler", "wb") as filler:  # 100 KB left: less than a save
        filler.write(bytes(room.f_bavail * room.f_frsize - 100_000))
    for _ in range(3):
        with pytest.raises(OSError) as error:
            save_checkpoint(path, Filled(2.0))
        _assert_full_disk_error(error, path)
        assert sorted(os.listdir(small_disk)) == sorted([*before, "filler"])
        assert _value(path) == 1.0
    os.unlink(small_disk / "filler")
    save_checkpoint(path, Filled(2.0))
    assert _value(path) == 2.0


class _SmallFile(io.FileIO):
    """A file on a disk with ``room`` bytes left (shared by all files), then ENOSPC."""

    room = None

    def write(self, data):
        size = memoryview(data).nbytes
        if size > type(self).room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        type(self).room -= size
        return super().write(data)


@contextlib.contextmanager
def _disk_with_room(monkeypatch, room):
    """DCP's files as if the disk had ``room`` bytes left."""
    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with _SmallFile(path, mode) as stream:
            yield stream

    with monkeypatch.context() as patched:
        patched.setattr(_SmallFile, "room", room)
        patched.setattr(FileSystem, "create_stream", create_stream)
        yield


def test_a_save_failing_partway_removes_what_it_wrote_and_the_next_save_succeeds(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    save_checkpoint(path, Filled(1.0))
    before = sorted(os.listdir(tmp_path))
    for _ in range(3):
        with _disk_with_room(monkeypatch, 100_000), pytest.raises(OSError) as error:
            save_checkpoint(path, Filled(2.0))
        _assert_full_disk_error(error, path)
        assert sorted(os.listdir(tmp_path)) == before
        assert _value(path) == 1.0
    save_checkpoint(path, Filled(2.0))
    assert _value(path) == 2.0


def test_a_save_whose_extra_cannot_be_written_says_so_and_removes_what_it_wrote(tmp_path):
    path = tmp_path / "ckpt"
    save_checkpoint(path, Filled(1.0))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(RuntimeError, match=f"could not save the checkpoint {path}: .*lambda"):
        save_checkpoint(path, Filled(2.0), schedule=lambda step: step)  # not picklable
    assert sorted(os.listdir(tmp_path)) == before
    assert _value(path) == 1.0


def _full_disk_rank(rank, directory):
    model, optimizer = _setup(2, 1)  # FSDP: each rank writes its own shards
    path = os.path.join(directory, "ckpt")
    save_checkpoint(path, model, optimizer, step=1)
    before = sorted(os.listdir(directory))
    for _ in range(3):
        # Only rank 1's disk is full: rank 0 fails too, and removes nothing rank 1 still writes.
        with (_disk_with_room(pytest.MonkeyPatch(), 0 if rank == 1 else 1 << 30),
              pytest.raises(OSError) as error):
            save_checkpoint(path, model, optimizer, step=2)
        _assert_full_disk_error(error, path)
        assert sorted(os.listdir(directory)) == before
    assert load_checkpoint(path, model, optimizer) == {"step": 1}
    save_checkpoint(path, model, optimizer, step=3)
    assert load_checkpoint(path, model, optimizer) == {"step": 3}
    return sorted(os.listdir(directory))


@pytest.mark.launches_ranks
@pytest.mark.slow
def test_a_full_disk_on_one_rank_fails_the_save_on_every_rank_and_leaves_nothing(tmp_path):
    listings = run_ranks(_full_disk_rank, 2, str(tmp_path))
    # the link, the checkpoint and the one it replaced
    assert listings[0] == listings[1] and len(listings[0]) == 3


# -- a checkpoint of another model ----------------------------------------------------------------

def _stack(depth, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(depth)])
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


@pytest.fixture
def four_layers(tmp_path):
    """A checkpoint of a 4-layer model trained one step with Adam; the model and its optimizer."""
    model, optimizer = _stack(4, seed=1)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    save_checkpoint(tmp_path / "ckpt", model, optimizer, step=1)
    return tmp_path / "ckpt", model, optimizer


def _mismatch(path, depth, with_optimizer):
    model, optimizer = _stack(depth)
    want = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as error:
        load_checkpoint(path, model, optimizer if with_optimizer else None)
    assert isinstance(error.value, ValueError)
    message = str(error.value)
    assert f"the checkpoint at {path} does not match the model" in message
    assert "pass strict=False to load the keys both have" in message
    assert all(torch.equal(value, want[key]) for key, value in model.state_dict().items())  # untouched
    return error.value, message


@pytest.mark.parametrize("with_optimizer", [True, False])
def test_a_smaller_model_is_refused_naming_the_keys_it_lacks(four_layers, with_optimizer):
    error, message = _mismatch(four_layers[0], 2, with_optimizer)
    assert error.missing_keys == []
    assert error.unexpected_keys == ["model.2.weight", "model.2.bias", "model.3.weight", "model.3.bias"]
    assert ("missing from the checkpoint: none; unexpected in the checkpoint: 4 keys (model.2.weight, "
            "model.2.bias, model.3.weight, model.3.bias)") in message


@pytest.mark.parametrize("with_optimizer", [True, False])
def test_a_larger_model_is_refused_naming_the_keys_the_checkpoint_lacks(four_layers, with_optimizer):
    error, message = _mismatch(four_layers[0], 6, with_optimizer)
    model_keys = ["model.4.weight", "model.4.bias", "model.5.weight", "model.5.bias"]
    optimizer_keys = [f"optimizer.state.{layer}.{name}.{state}" for layer in (4, 5)
                      for name in ("weight", "bias") for state in ("step", "exp_avg", "exp_avg_sq")]
    assert error.missing_keys == model_keys + (optimizer_keys if with_optimizer else [])
    assert error.unexpected_keys == []
    shown = ", ".join(model_keys + optimizer_keys[:1]) + ", ..." if with_optimizer else ", ".join(model_keys)
    assert f"missing from the checkpoint: {len(error.missing_keys)} keys ({shown}); unexpected" in message


def test_a_checkpoint_without_the_optimizers_state_is_refused_with_the_optimizer(tmp_path):
    model, optimizer = _stack(2)
    save_checkpoint(tmp_path / "ckpt", model)
    # each parameter's state and each param group's settings
    missing = r"missing from the checkpoint: 24 keys \(optimizer\.state\.0\.weight\.step"
    with pytest.raises(CheckpointMismatchError, match=missing):
        load_checkpoint(tmp_path / "ckpt", model, optimizer)
    assert load_checkpoint(tmp_path / "ckpt", model) == {}


@pytest.mark.parametrize("depth", [2, 6])
def test_strict_false_loads_the_layers_both_have_and_leaves_the_others(four_layers, depth):
    path, saved, saved_optimizer = four_layers
    model, optimizer = _stack(depth)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    assert load_checkpoint(path, model, optimizer, strict=False) == {"step": 1}
    saved_state = saved.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved_state[key] if key in saved_state else before[key]), key
    for layer in range(min(depth, 4)):
        got, want = optimizer.state[model[layer].weight], saved_optimizer.state[saved[layer].weight]
        assert torch.equal(got["exp_avg"], want["exp_avg"]) and torch.equal(got["step"], want["step"])
    for layer in range(4, depth):  # no saved state: as a fresh optimizer's
        assert not optimizer.state[model[layer].weight]["exp_avg"].any()
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()  # trains on
