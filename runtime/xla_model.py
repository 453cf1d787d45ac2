"""``xm``: the torch_xla ``xla_model`` calls that migrated scripts make, on plain PyTorch.

Devices are real PyTorch devices (``cuda:LOCAL_RANK`` where CUDA is present, else ``cpu``) and
collectives are torch.distributed (NCCL on CUDA, gloo on CPU). The process group is the one the
script created with ``dist.init_process_group``; a script that never creates one but runs with
``WORLD_SIZE > 1`` (under ``accrun``/torchrun) gets the default group initialised on its first
collective. With one process a collective returns its input (a copy of a single tensor) and
needs no process group.

Every name torch_xla 2.9 also has takes torch_xla's arguments and behaves as torch_xla's does
(tests/runtime/test_xla_conformance.py runs both); what differs on purpose is listed in
docs/torch_xla_conformance.md. Execution is eager, so ``mark_step`` does not compile anything:
it is the step boundary at which step closures run (see ``_closures``).
"""

import atexit
import collections
import hashlib
import os
import resource
import sys

import torch
import torch.distributed as dist

from accrewrite.atomic_file import write_atomically

from . import _collectives
from ._closures import STEP_CLOSURES
from ._tensor_tree import map_tensors

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"
_REDUCE_OPS = {
    REDUCE_SUM: dist.ReduceOp.SUM,
    REDUCE_MUL: dist.ReduceOp.PRODUCT,
    REDUCE_AND: dist.ReduceOp.BAND,
    REDUCE_OR: dist.ReduceOp.BOR,
    REDUCE_MIN: dist.ReduceOp.MIN,
    REDUCE_MAX: dist.ReduceOp.MAX,
}
# NCCL has no bitwise reductions; on booleans, and/or are min/max on every backend.
_BOOLEAN_OPS = {REDUCE_AND: dist.ReduceOp.MIN, REDUCE_OR: dist.ReduceOp.MAX}


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


# ``set_rng_state(get_rng_state())`` resumes the stream, as in torch_xla, where the state is an
# int. torch's generator state is not: get_rng_state names it by a hash and keeps the last few.
_SAVED_STATES = collections.OrderedDict()  # value returned -> generator states
_SAVED_STATES_KEPT = 64
_SEEDED = {}  # hash of the states right after set_rng_state(seed) -> seed


def _generator_states():
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def _hash(states):
    digest = hashlib.blake2b(digest_size=8)
    for state in states:
        digest.update(state.numpy().tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1  # a non-negative int64


def set_rng_state(seed, device=None):
    """Seed the random generators of every device (``torch.manual_seed``), or put back the
    state that ``get_rng_state`` returned as ``seed``."""
    del device
    seed = int(seed)
    saved = _SAVED_STATES.get(seed)
    if saved is None:
        torch.manual_seed(seed)
        _SEEDED[_hash(_generator_states())] = seed
        return
    torch.random.set_rng_state(saved[0])
    if len(saved) > 1:
        torch.cuda.set_rng_state_all(saved[1:])


def get_rng_state(device=None):
    """The generators' state as an int: the seed itself while nothing has been drawn since
    ``set_rng_state(seed)``, else a value that ``set_rng_state`` resumes from."""
    del device
    states = _generator_states()
    value = _hash(states)
    if value in _SEEDED:
        return _SEEDED[value]
    _SAVED_STATES[value] = states
    _SAVED_STATES.move_to_end(value)
    if len(_SAVED_STATES) > _SAVED_STATES_KEPT:
        _SAVED_STATES.popitem(last=False)
    return value


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


def get_local_ordinal():
    """This process's rank on its machine (``LOCAL_RANK``; 0 without it)."""
    return _env_int("LOCAL_RANK", 0)


def is_master_ordinal(local=True):
    """Whether this is the master process of the machine (``local=True``, torch_xla's default)
    or of the whole job."""
    return (get_local_ordinal() if local else get_ordinal()) == 0


def master_print(*args, fd=sys.stdout, local=False, flush=False):
    """``print(*args, file=fd, flush=flush)`` on the master process of the job (of the machine
    with ``local``)."""
    if is_master_ordinal(local=local):
        print(*args, file=fd, flush=flush)


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
    """Reduce ``inputs`` across processes with ``reduce_type`` (``REDUCE_SUM``, ``_MUL``, ``_AND``,
    ``_OR``, ``_MIN``, ``_MAX``), then multiply by ``scale``.

    As in torch_xla, a single tensor gives a new tensor with the result and a list or tuple of
    tensors is reduced in place and returned; with one process nothing is reduced or scaled.
    Lists are bucketed (one collective per bucket, see ``_collectives``); ``compress`` selects a
    bf16/fp16 wire format. ``pin_layout`` is accepted for torch_xla compatibility.
    """
    del pin_layout
    if reduce_type not in _REDUCE_OPS:
        raise ValueError(
            f"all_reduce: unknown reduce_type {reduce_type!r}; expected one of {', '.join(_REDUCE_OPS)}"
        )
    single = isinstance(inputs, torch.Tensor)
    if not single and not (isinstance(inputs, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in inputs)):
        raise TypeError("all_reduce: inputs must be a tensor or a list/tuple of tensors")
    if world_size() <= 1:
        return inputs.clone() if single else inputs
    tensors = [inputs.detach().clone()] if single else list(inputs)  # collectives are not differentiable
    if scale != 1.0 and any(not (t.is_floating_point() or t.is_complex()) for t in tensors):
        raise ValueError("all_reduce: scale != 1 needs floating-point tensors")
    op = _reduce_op(reduce_type, tensors)
    group = _group_for(groups)
    if group is None:  # a group of one
        if scale != 1.0:
            for tensor in tensors:
                tensor.mul_(scale)
    else:
        wire = _collectives.wire_dtype(compress)
        cap = _collectives.bucket_cap_bytes(bucket_cap_mb)
        _collectives.all_reduce_(tensors, op, scale, group, wire, cap)
    return tensors[0] if single else inputs


def _reduce_op(reduce_type, tensors):
    if reduce_type not in _BOOLEAN_OPS:
        return _REDUCE_OPS[reduce_type]
    if any(t.is_floating_point() or t.is_complex() for t in tensors):
        raise ValueError(f"all_reduce: {reduce_type!r} needs integer or boolean tensors")
    if all(t.dtype == torch.bool for t in tensors):
        return _BOOLEAN_OPS[reduce_type]
    return _REDUCE_OPS[reduce_type]


def _fetch_gradients(optimizer):
    """The ``.grad`` of every parameter of ``optimizer`` that has one, in parameter order."""
    return [
        param.grad
        for group in optimizer.param_groups
        for param in group["params"]
        if param.grad is not None
    ]


def reduce_gradients(optimizer, groups=None, pin_layout=True, *, compress=None):
    """Average the gradients of ``optimizer`` over the processes, in place, as torch_xla does:
    summed (within this rank's group in ``groups``) and divided by the number of processes.
    Nothing with one process."""
    count = world_size()
    if count > 1:
        all_reduce(REDUCE_SUM, _fetch_gradients(optimizer), scale=1.0 / count, groups=groups,
                   pin_layout=pin_layout, compress=compress)


def optimizer_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):  # noqa: B006 - torch_xla's signature
    """Reduce the gradients and run ``optimizer.step(**optimizer_args)``; with ``barrier``, also
    end the step (``mark_step``), which a device loader otherwise does as it fetches the next
    batch. Returns what ``optimizer.step`` returned."""
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**optimizer_args)
    if barrier:
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


def wait_device_ops(devices=[]):  # noqa: B006 - torch_xla's signature
    """Wait for queued async step closures and pending CUDA work."""
    del devices
    STEP_CLOSURES.wait()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def rendezvous(tag, payload=b"", replicas=[]):  # noqa: B006 - torch_xla's signature
    """Ends the step (``mark_step``), then waits for every process and returns every process's
    ``payload`` (bytes), in rank order. ``replicas``, if given, must name every process."""
    del tag
    if not isinstance(payload, bytes):
        raise TypeError(f"rendezvous: payload must be bytes, not {type(payload).__name__}")
    if replicas and len(replicas) != world_size():
        raise ValueError(
            f"rendezvous: only a rendezvous of all {world_size()} processes is supported, got replicas={replicas}"
        )
    mark_step()
    group = _default_group()
    if group is None:
        return [payload]
    payloads = [None] * dist.get_world_size()
    dist.all_gather_object(payloads, payload)
    return payloads


def save(data, file_or_path, master_only=True, global_master=False):
    """``torch.save`` of ``data`` with its tensors moved to the CPU, by the master process only
    (of the machine, or of the job with ``global_master``), or by every process when
    ``master_only`` is False. As in torch_xla, the other processes do not wait: a script that
    reads the file on every process calls ``rendezvous`` first.

    A path is replaced atomically (``accrewrite.atomic_file``): a process loading the checkpoint
    while it is saved reads the previous one or the new one, and a save killed midway leaves
    the previous one. A file object is written directly."""
    if master_only is False or is_master_ordinal(local=not global_master):
        data = map_tensors(lambda t: t.detach().cpu(), data)
        if isinstance(file_or_path, (str, os.PathLike)):
            write_atomically(file_or_path, lambda handle: torch.save(data, handle))
        else:
            torch.save(data, file_or_path)


def get_memory_info(device=None):
    """The memory of ``device`` (default: this process's) in torch_xla's form: ``bytes_used``,
    ``bytes_limit`` and ``peak_bytes_used``. On CUDA these are the caching allocator's
    allocated, the device's total and the peak allocated bytes; on the CPU, this process's
    resident set, the machine's physical memory and the peak resident set."""
    device = torch.device(xla_device() if device is None else device)
    if device.type == "cuda":
        return {
            "bytes_used": torch.cuda.memory_allocated(device),
            "bytes_limit": torch.cuda.get_device_properties(device).total_memory,
            "peak_bytes_used": torch.cuda.max_memory_allocated(device),
        }
    return _host_memory_info()


def _host_memory_info():
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    try:
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no procfs
        used = peak
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"bytes_used": used, "bytes_limit": limit, "peak_bytes_used": peak}
