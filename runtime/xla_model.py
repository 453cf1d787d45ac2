"""``xm``: the torch_xla ``xla_model`` calls that migrated scripts make, on plain PyTorch.

Devices are real PyTorch devices (``cuda:LOCAL_RANK`` where CUDA is present, else ``cpu``) and
collectives are torch.distributed (NCCL on CUDA, gloo on CPU). The process group is the one the
script created with ``dist.init_process_group``; a script that never creates one but runs with
``WORLD_SIZE > 1`` (under ``accrun``/torchrun) gets the default group initialised on its first
collective. With one process every collective is a local no-op (apart from ``scale``) and needs
no process group.

Where this module is silent, the semantics are torch_xla's for the same call. Execution is
eager, so ``mark_step`` does not compile anything: it is the step boundary at which step
closures run (see ``_closures``).
"""

import atexit
import os
import sys

import torch
import torch.distributed as dist

from accrewrite.atomic_file import write_atomically

from . import _collectives
from ._closures import STEP_CLOSURES
from ._tensor_tree import map_tensors

REDUCE_SUM = "sum"
REDUCE_MEAN = "mean"
REDUCE_MIN = "min"
REDUCE_MAX = "max"
_REDUCE_OPS = {
    REDUCE_SUM: dist.ReduceOp.SUM,
    REDUCE_MEAN: dist.ReduceOp.SUM,  # divided by the group size afterwards
    REDUCE_MIN: dist.ReduceOp.MIN,
    REDUCE_MAX: dist.ReduceOp.MAX,
}


# --- devices and the process world -------------------------------------------------------


def _env_int(name, default):
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def xla_device(n=None, devkind=None):
    """The device this process trains on: ``cuda:LOCAL_RANK`` (or ``cuda:n``) when CUDA is
    available, made the current CUDA device; ``cpu`` otherwise. ``devkind`` is accepted for
    torch_xla compatibility and ignored."""
    del devkind
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = _env_int("LOCAL_RANK", 0) if n is None else n
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise RuntimeError(
            f"xla_device: CUDA device {index} requested (LOCAL_RANK or n) but only {count} visible"
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def set_replication(device, devices):
    """torch_xla binds the replication devices of the thread here; with one process per device
    there is nothing to bind, so this only checks that ``device`` is among ``devices``."""
    device = torch.device(device)
    if devices and device not in [torch.device(d) for d in devices]:
        raise ValueError(f"set_replication: {device} is not one of {list(devices)}")


def set_rng_state(seed, device=None):
    """Seed the random generators of every device (``torch.manual_seed``)."""
    del device
    torch.manual_seed(int(seed))


def get_rng_state(device=None):
    """The seed set by ``set_rng_state`` (``torch.initial_seed``)."""
    del device
    return torch.initial_seed()


def dist_backend():
    """The torch.distributed backend for this machine: ``nccl`` with CUDA, else ``gloo``."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def world_size(defval=1):
    """Number of processes: the process group's size, else ``WORLD_SIZE`` (torchrun), else
    ``defval``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", defval)


xrt_world_size = world_size


def get_ordinal(defval=0):
    """This process's global rank: the process group's, else ``RANK``, else ``defval``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK", defval)


def get_local_ordinal(defval=0):
    """This process's rank on its machine (``LOCAL_RANK``), else ``defval``."""
    return _env_int("LOCAL_RANK", defval)


def is_master_ordinal(local=True):
    """Whether this is the master process of the machine (``local=True``, torch_xla's default)
    or of the whole job."""
    return (get_local_ordinal() if local else get_ordinal()) == 0


def master_print(*args, fd=None, finalizer=None):
    """``print`` to ``fd`` (default: the current ``sys.stdout``) on the global master only."""
    if is_master_ordinal(local=False):
        print(*args, file=fd if fd is not None else sys.stdout, flush=True)
        if finalizer is not None:
            finalizer()


# --- process groups ----------------------------------------------------------------------

_SUBGROUPS = {}  # tuple of replica groups -> this rank's group


def _default_group():
    """The default process group, initialised here when the script did not (WORLD_SIZE > 1);
    None with one process."""
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD if dist.get_world_size() > 1 else None
    if world_size() <= 1:
        return None
    xla_device()  # bind this rank's CUDA device before NCCL sees it
    dist.init_process_group(backend=dist_backend())
    # A group left to the interpreter's teardown can abort the process ("terminate called
    # without an active exception"): the runtime closes the one it opened.
    atexit.register(_close_own_group)
    return dist.group.WORLD


def _close_own_group():
    STEP_CLOSURES.run_at_exit()  # the last closures may still use the group
    if dist.is_initialized():
        dist.destroy_process_group()


def _group_for(groups):
    """The process group of this rank for torch_xla ``groups`` (a list of lists of ranks, or
    None for all ranks); None when this rank reduces with nobody else."""
    if not groups:
        return _default_group()
    key = tuple(tuple(int(r) for r in group) for group in groups)
    if key not in _SUBGROUPS:
        rank = get_ordinal()
        mine = [group for group in key if rank in group]
        if len(mine) != 1:
            raise ValueError(f"groups={groups}: rank {rank} must be in exactly one group")
        if world_size() <= 1:
            _SUBGROUPS[key] = None
        else:
            _default_group()
            # Every rank creates every group, in the same order, as torch.distributed requires.
            subgroup, _ = dist.new_subgroups_by_enumeration([list(g) for g in key])
            _SUBGROUPS[key] = subgroup if len(mine[0]) > 1 else None
    return _SUBGROUPS[key]


# --- collectives -------------------------------------------------------------------------


def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True, *, compress=None,
               bucket_cap_mb=None):
    """Reduce ``inputs`` across processes with ``reduce_type`` (sum, mean, min, max), then
    multiply by ``scale``.

    As in torch_xla, a single tensor gives a new tensor with the result and a list or tuple of
    tensors is reduced in place and returned. Lists are bucketed (one collective per bucket,
    see ``_collectives``); ``compress`` selects a bf16/fp16 wire format. ``pin_layout`` is
    accepted for torch_xla compatibility.
    """
    del pin_layout
    if reduce_type not in _REDUCE_OPS:
        raise ValueError(
            f"all_reduce: unknown reduce_type {reduce_type!r}; expected one of {', '.join(_REDUCE_OPS)}"
        )
    single = isinstance(inputs, torch.Tensor)
    if single:
        tensors = [inputs.detach().clone()]  # collectives are not differentiable
    elif isinstance(inputs, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in inputs):
        tensors = list(inputs)
    else:
        raise TypeError("all_reduce: inputs must be a tensor or a list/tuple of tensors")
    group = _group_for(groups)
    size = 1 if group is None else dist.get_world_size(group)
    factor = scale / size if reduce_type == REDUCE_MEAN else scale
    if factor != 1.0 and any(not (t.is_floating_point() or t.is_complex()) for t in tensors):
        raise ValueError("all_reduce: mean and scale != 1 need floating-point tensors")
    wire = _collectives.wire_dtype(compress)
    cap = _collectives.bucket_cap_bytes(bucket_cap_mb)
    if group is None:
        if factor != 1.0:
            torch._foreach_mul_(tensors, factor)
    else:
        _collectives.all_reduce_(tensors, _REDUCE_OPS[reduce_type], factor, group, wire, cap)
    return tensors[0] if single else inputs


def _fetch_gradients(optimizer):
    """The ``.grad`` of every parameter of ``optimizer`` that has one, in parameter order."""
    return [
        param.grad
        for group in optimizer.param_groups
        for param in group["params"]
        if param.grad is not None
    ]


def reduce_gradients(optimizer, groups=None, pin_layout=True, *, compress=None):
    """Average the gradients of ``optimizer`` across the processes (of this rank's group in
    ``groups``), in place; nothing with one process."""
    if world_size() > 1:
        all_reduce(REDUCE_MEAN, _fetch_gradients(optimizer), groups=groups,
                   pin_layout=pin_layout, compress=compress)


def optimizer_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):  # noqa: B006 - torch_xla's signature
    """Reduce the gradients, run ``optimizer.step(**optimizer_args)`` and end the step
    (``mark_step``: step closures run). Returns what ``optimizer.step`` returned.

    ``barrier`` is accepted for torch_xla compatibility: execution is eager, so the step
    boundary is always marked.
    """
    del barrier
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**optimizer_args)
    mark_step()
    return loss


# --- steps -------------------------------------------------------------------------------


def add_step_closure(closure, args=(), run_async=False):
    """Run ``closure(*args)`` at the next step boundary; with ``run_async`` on a worker thread,
    in order, without blocking the step (see ``_closures``)."""
    STEP_CLOSURES.add(closure, args, run_async)


def mark_step(wait=False, reset_scope=True):
    """The step boundary: runs the pending step closures and raises the error of an earlier
    async closure. With ``wait``, also waits for the async closures and the device.
    ``reset_scope`` is accepted for torch_xla compatibility (there is no IR scope here)."""
    del reset_scope
    STEP_CLOSURES.run()
    if wait:
        wait_device_ops()


def broadcast_master_param(model):
    """Copy the master process's parameters and buffers to every process, in place, as
    torch_xla does (what DistributedDataParallel's constructor did); a no-op with one."""
    group = _default_group()
    if group is None:
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0, group=group)


def wait_device_ops(devices=()):
    """Wait for queued async step closures and pending CUDA work."""
    del devices
    STEP_CLOSURES.wait()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def rendezvous(tag, payload=b"", replicas=()):
    """A barrier of all processes (a no-op with one); returns every process's ``payload``
    as torch_xla does. ``replicas`` other than all processes are not supported."""
    if replicas:
        raise NotImplementedError("rendezvous: a replicas subset is not supported")
    group = _default_group()
    if group is None:
        return [payload]
    payloads = [None] * dist.get_world_size()
    dist.all_gather_object(payloads, payload)
    return payloads


def save(data, file_or_path, master_only=True, global_master=False):
    """``torch.save`` of ``data`` with its tensors moved to the CPU, by the master process only
    (of the machine, or of the job with ``global_master``), or by every process when
    ``master_only`` is False. All processes wait for the write (a rendezvous), as torch_xla.

    A path is replaced atomically (``accrewrite.atomic_file``): a process loading the checkpoint
    while it is saved reads the previous one or the new one, and a save killed midway leaves
    the previous one. A file object is written directly."""
    if master_only is False or is_master_ordinal(local=not global_master):
        data = map_tensors(lambda t: t.detach().cpu(), data)
        if isinstance(file_or_path, (str, os.PathLike)):
            write_atomically(file_or_path, lambda handle: torch.save(data, handle))
        else:
            torch.save(data, file_or_path)
    rendezvous("accrewrite.save")
