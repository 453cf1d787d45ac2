"""Sharded checkpoints through torch.distributed.checkpoint (DCP), and the full-state export.

``save_checkpoint(path, model, optimizer, **extra)`` writes the model's and the optimizer's
state, each rank its own shards, into a DCP directory; ``load_checkpoint(path, model,
optimizer)`` reads it back into a model set up by ``accelerate`` on any number of ranks and any
``Config`` (DCP reshards: saved at 4 ranks, loaded at 2), and returns ``extra`` (a step count,
a scheduler's state...; written by rank 0 with ``torch.save``). A plain model on one process
reads and writes the same checkpoints.

Writes are atomic. ``path`` is a symbolic link to a sibling directory
``.<name>.<token>.dcp``: the ranks write a new such directory, and rank 0 then swaps the link
(``os.replace``) in one step. A process killed while saving leaves ``path`` on the previous
checkpoint, and a reader sees the old checkpoint or the new one, never a mix. Each save keeps
the checkpoint it replaces (a reader that resolved the link just before the swap still finds
its directory) and removes the older ones and the directories of saves that never finished; a
reader on its own outrun by two saves reads the newest. A save that fails (a full disk) removes
what it wrote on every rank, leaves ``path`` as it was and raises an ``OSError`` with the
system's errno (``ENOSPC``), or a ``RuntimeError``, naming ``path``.

``load_checkpoint`` is strict by default, as ``nn.Module.load_state_dict`` is: the model's keys
must be the checkpoint's, and the optimizer's state must be in it, else it raises
``CheckpointMismatchError`` (a ``ValueError``) before reading anything; ``strict=False`` loads
what matches and leaves the rest (the state of parameters the checkpoint lacks) as it is.

``export_full_state_dict(path, model)`` writes what ``model.state_dict()`` would be without
sharding, as one file from rank 0 (atomically), for a plain
``model.load_state_dict(torch.load(path))`` anywhere.

DTensors whose local shard is not one block of the full tensor (the per-head split of a fused
q/k/v projection) are stored whole, since DCP stores each shard as a block.
"""

import contextlib
import errno
import os
import re
import secrets
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from accrewrite.base.atomic_file import write_atomically

from accrewrite.base.torch_compat import StridedShard, flatten_state_dict

_EXTRA = "extra.pt"
_SHOWN = 5  # keys a mismatch names


class CheckpointMismatchError(ValueError):
    """The checkpoint's keys are not the model's (or lack the optimizer's state). The keys are
    DCP's flat names: ``model.<parameter>``, ``optimizer.state.<parameter>.<state>``."""

    def __init__(self, message, missing_keys=(), unexpected_keys=()):
        super().__init__(message)
        self.missing_keys, self.unexpected_keys = list(missing_keys), list(unexpected_keys)


def save_checkpoint(path, model, optimizer=None, **extra) -> None:
    """Save ``model`` and ``optimizer`` (may be None) sharded at ``path``, with ``extra``;
    collective: every rank calls it. A failed save removes what it wrote and raises an
    ``OSError`` (``ENOSPC`` for a full disk) or a ``RuntimeError``; ``path`` is left as it was."""
    model_state, optimizer_state = get_state_dict(model, _optimizers(optimizer))
    state = _blocks_only({"model": model_state, "optimizer": optimizer_state})
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    if os.path.lexists(path) and not os.path.islink(path):
        raise FileExistsError(f"{path} exists and was not written by save_checkpoint; choose another "
                              f"path or remove it")
    staging = os.path.join(directory, f".{name}.{_agreed(secrets.token_hex(6))}.dcp")
    failure = previous = None
    try:
        dcp.save(state, storage_writer=_Writer(staging))
        if _rank() == 0:
            previous = _publish(staging, path, extra)
    except (Exception, dcp.CheckpointException) as error:  # DCP's derives from BaseException
        failure = error
    # Also a barrier: once every rank is here, none still writes into ``staging``.
    reasons = [reason for reason in _gathered(_reason(failure)) if reason is not None]
    if reasons:
        _remove(staging)  # on every rank: node-local disks have each their own staging directory
        _remove(f"{staging}.link")
        raise _save_error(path, *reasons[0]) from failure
    if _rank() == 0:
        _fsync_directory(directory)
        keep = {os.path.basename(staging), previous}
        ours = re.compile(rf"\.{re.escape(name)}\.[0-9a-f]{{12}}\.dcp(\.link)?")
        for entry in os.listdir(directory):
            if ours.fullmatch(entry) and entry not in keep:
                _remove(os.path.join(directory, entry))
    _barrier()  # no rank goes on before the checkpoint is in place


def load_checkpoint(path, model, optimizer=None, *, strict=True) -> dict:
    """Load the checkpoint at ``path`` into ``model`` and ``optimizer`` (may be None), resharded
    to their current layout; returns the ``extra`` it was saved with. Collective. ``strict``:
    raise ``CheckpointMismatchError`` unless the checkpoint has exactly the model's keys and the
    optimizer's state; ``strict=False`` loads the keys both have and leaves the others as they
    are."""
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    optimizers = _optimizers(optimizer)
    model_state, optimizer_state = get_state_dict(model, optimizers)
    state = {"model": model_state, "optimizer": optimizer_state}
    while True:
        real = _agreed(os.path.realpath(path))  # every rank reads the same save, even mid-swap
        whole = _blocks_only(state)
        try:
            if strict:
                _check_keys(path, whole, FileSystemReader(real).read_metadata().state_dict_metadata)
            dcp.load(whole, checkpoint_id=real, planner=DefaultLoadPlanner(allow_partial_load=not strict))
            extra = torch.load(os.path.join(real, _EXTRA), weights_only=False)
            break
        except (FileNotFoundError, dcp.CheckpointException):
            # A lone reader (an evaluator beside the training) outrun by two saves, which
            # removed the one it was reading, reads the newest instead.
            if dist.is_initialized() or os.path.realpath(path) == real:
                raise
    _redistribute_like(whole, state)
    set_state_dict(model, optimizers, model_state_dict=whole["model"], optim_state_dict=whole["optimizer"])
    return extra


def export_full_state_dict(path, model) -> None:
    """Write ``model``'s unsharded ``state_dict`` to the file ``path`` from rank 0, for a plain
    ``torch.load``. Collective."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if _rank() == 0:
        write_atomically(path, lambda file: torch.save(state, file))
    _barrier()


class _Writer(FileSystemWriter):
    """DCP's file writer, failing with the OSError under a failed write: ``torch.save`` reports a
    full disk as a RuntimeError with the OSError as its context, which DCP drops when it sends
    the failure to the other ranks."""

    def write_data(self, plan, planner):
        try:
            return super().write_data(plan, planner)
        except RuntimeError as error:
            if isinstance(error.__context__, OSError):
                raise error.__context__ from error
            raise


def _publish(staging, path, extra):
    """Point ``path`` at ``staging`` in one step; returns the directory it pointed at."""
    write_atomically(os.path.join(staging, _EXTRA), lambda file: torch.save(extra, file))
    link = f"{staging}.link"
    os.symlink(os.path.basename(staging), link)
    previous = os.readlink(path) if os.path.islink(path) else None
    os.replace(link, path)
    return previous


def _reason(failure):
    """``(errno or None, what failed)`` of ``failure``, None for none: the first OSError in it,
    in each rank's failure DCP gathered or in their causes; else the first failure not DCP's."""
    errors, pending = [], [failure]
    while pending:
        error = pending.pop(0)
        if error is None or any(error is seen for seen in errors):
            continue
        errors.append(error)
        if isinstance(error, dcp.CheckpointException):
            pending += [wrapped for wrapped, _ in error.failures.values()]
        pending += [error.__cause__, error.__context__]
    for error in errors:
        if isinstance(error, OSError) and error.errno:
            return error.errno, error.strerror or str(error)
    if not errors:
        return None
    error = next((e for e in errors if not isinstance(e, dcp.CheckpointException)), errors[0])
    return None, f"{type(error).__name__}: {error}"


def _save_error(path, number, what):
    kept = f"this save's files are removed and {path} still holds the previous checkpoint, if any"
    if number in (errno.ENOSPC, errno.EDQUOT):
        return OSError(number, f"could not save the checkpoint {path}: the disk is full ({what}); "
                               f"{kept}; free space and save again")
    message = f"could not save the checkpoint {path}: {what}; {kept}"
    return OSError(number, message) if number else RuntimeError(message)


def _check_keys(path, state, saved) -> None:
    """Raise ``CheckpointMismatchError`` unless ``saved`` (DCP's metadata) has every key of
    ``state`` and no model key more."""
    flat = flatten_state_dict(state)[0]
    missing = [key for key in flat if key not in saved]
    # The checkpoint's optimizer state follows its model keys; one loaded without an optimizer
    # (an evaluation) is no mismatch.
    unexpected = [key for key in saved if key.startswith("model.") and key not in flat]
    if missing or unexpected:
        raise CheckpointMismatchError(
            f"the checkpoint at {path} does not match the model"
            f"{' and optimizer' if state['optimizer'] else ''}: missing from the checkpoint: "
            f"{_few(missing)}; unexpected in the checkpoint: {_few(unexpected)}. Load it into the "
            f"model (and optimizer) it was saved from, or pass strict=False to load the keys both "
            f"have and leave the rest as they are",
            missing, unexpected,
        )


def _few(keys) -> str:
    if not keys:
        return "none"
    more = ", ..." if len(keys) > _SHOWN else ""
    return f"{len(keys)} key{'s' if len(keys) > 1 else ''} ({', '.join(keys[:_SHOWN])}{more})"


def _optimizers(optimizer):
    return [] if optimizer is None else list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]


def _is_block(tensor: DTensor) -> bool:
    """Whether each rank's shard of ``tensor`` is one block of the full tensor: a strided split
    is, only when later mesh dimensions split the same tensor dimension into as many parts (the
    layout FSDP2 gives a tensor-parallel shard that it shards again)."""
    placements, mesh = tensor.placements, tensor.device_mesh
    for i, placement in enumerate(placements):
        if isinstance(placement, StridedShard):
            later = 1
            for j in range(i + 1, len(placements)):
                if placements[j].is_shard(placement.dim):
                    later *= mesh.size(j)
            if later != placement.split_factor:
                return False
    return True


def _blocks_only(state):
    """``state`` with the DTensors DCP cannot store (see ``_is_block``) made whole."""
    if isinstance(state, dict):
        return {key: _blocks_only(value) for key, value in state.items()}
    if isinstance(state, list):
        return [_blocks_only(value) for value in state]
    if isinstance(state, DTensor) and not _is_block(state):
        return state.full_tensor()
    return state


def _redistribute_like(loaded, template):
    """Split the whole tensors of ``loaded`` again as the DTensors of ``template`` are."""
    if isinstance(loaded, dict):
        pairs = [(key, value, template[key]) for key, value in loaded.items()]
    else:  # the checkpoint's list of a param group's parameter names may be a larger model's
        pairs = zip(range(len(loaded)), loaded, template)
    for key, value, like in pairs:
        if isinstance(value, (dict, list)):
            _redistribute_like(value, like)
        elif isinstance(like, DTensor) and not isinstance(value, DTensor):
            loaded[key] = distribute_tensor(value, like.device_mesh, like.placements)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _agreed(value):
    """Rank 0's ``value`` on every rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gathered(value) -> list:
    """Every rank's ``value``."""
    if not dist.is_initialized():
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _remove(entry: str) -> None:
    if os.path.isdir(entry) and not os.path.islink(entry):
        shutil.rmtree(entry, ignore_errors=True)  # other ranks may remove the same files
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry)


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
