"""``xm``: the torch_xla ``xla_model`` calls that migrated scripts make, on plain PyTorch.

Devices are real PyTorch devices (the accelerator's, ``cuda:LOCAL_RANK`` say, where one is
available, else ``cpu``; see ``accelerator``) and collectives are torch.distributed, on the
backend torch registers for that device (NCCL on CUDA, XCCL on XPU, gloo on CPU). The process
group is the one the script created with ``dist.init_process_group``; a script that never
creates one but runs with ``WORLD_SIZE > 1`` (under ``accrun``/torchrun) gets the default group
initialised on its first collective. With one process a collective needs no process group and
gives what torch_xla gives with one device (mostly a copy of its input).

Every name torch_xla 2.9 also has takes torch_xla's arguments and behaves as torch_xla's does
(tests/runtime/test_xla_conformance.py runs both); what differs on purpose is listed in
docs/torch_xla_conformance.md. Execution is eager, so ``mark_step`` does not compile anything:
it is the step boundary at which step closures run (see ``_closures``).
"""

import atexit
import collections
import hashlib
import os
import sys
from types import MappingProxyType

import torch
import torch.distributed as dist

from accrewrite.base import accelerator, torch_compat
from accrewrite.base.atomic_file import write_atomically

from . import _collectives
from ._closures import STEP_CLOSURES
from ._tensor_tree import map_tensors

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"
_REDUCE_OPS = MappingProxyType({
    REDUCE_SUM: dist.ReduceOp.SUM,
    REDUCE_MUL: dist.ReduceOp.PRODUCT,
    REDUCE_AND: dist.ReduceOp.BAND,
    REDUCE_OR: dist.ReduceOp.BOR,
    REDUCE_MIN: dist.ReduceOp.MIN,
    REDUCE_MAX: dist.ReduceOp.MAX,
})
# NCCL has no bitwise reductions; on booleans, and/or are min/max on every backend.
_BOOLEAN_OPS = MappingProxyType({REDUCE_AND: dist.ReduceOp.MIN, REDUCE_OR: dist.ReduceOp.MAX})


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
    """The device this process trains on: the accelerator's device ``LOCAL_RANK`` (or ``n``),
    ``cuda:0`` say, made the current device, where an accelerator is available; ``cpu``
    otherwise. ``devkind`` is accepted for torch_xla compatibility and ignored."""
    del devkind
    if accelerator.device_type() == "cpu":
        return torch.device("cpu")
    try:
        return accelerator.select(_env_int("LOCAL_RANK", 0) if n is None else n)
    except RuntimeError as error:
        raise RuntimeError(
            f"xla_device: {error}; the device is LOCAL_RANK (as torchrun sets it) or n"
        ) from None


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
    return [torch.random.get_rng_state(), *accelerator.rng_states()]


def _hash(states):
    digest = hashlib.blake2b(digest_size=8)
    for state in states:
        digest.update(state.numpy().tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1  # a non-negative int64


def set_rng_state(seed, device=None):
    """Seed the random generators of the CPU and every accelerator device, or put back the
    state that ``get_rng_state`` returned as ``seed``."""
    del device
    seed = int(seed)
    saved = _SAVED_STATES.get(seed)
    if saved is None:
        accelerator.manual_seed(seed)
        _SEEDED[_hash(_generator_states())] = seed
        return
    torch.random.set_rng_state(saved[0])
    accelerator.set_rng_states(saved[1:])


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
    """The torch.distributed backend for this process's device: the one torch registers for it
    (``nccl`` on CUDA, ``xccl`` on XPU, ...), ``gloo`` on the CPU."""
    return accelerator.dist_backend()


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
    xla_device()  # bind this rank's device before the collective library sees it
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


def _replica_group(groups):
    """``_group_for(groups)`` and that group's size (1 alone); torch_xla's gathers and scatters
    need groups of one size."""
    if groups and len({len(group) for group in groups}) != 1:
        raise ValueError(f"groups={groups}: every replica group must have the same size")
    group = _group_for(groups)
    return group, 1 if group is None else dist.get_world_size(group)


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
    _check_reduce_type("all_reduce", reduce_type)
    single = isinstance(inputs, torch.Tensor)
    if not single and not (isinstance(inputs, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in inputs)):
        raise TypeError("all_reduce: inputs must be a tensor or a list/tuple of tensors")
    if world_size() <= 1:
        return inputs.clone() if single else inputs
    tensors = [inputs.detach().clone()] if single else list(inputs)  # collectives are not differentiable
    op = _reduce_op("all_reduce", reduce_type, tensors, scale)
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


def _check_reduce_type(caller, reduce_type):
    if reduce_type not in _REDUCE_OPS:
        raise ValueError(
            f"{caller}: unknown reduce_type {reduce_type!r}; expected one of {', '.join(_REDUCE_OPS)}"
        )


def _reduce_op(caller, reduce_type, tensors, scale):
    """The torch.distributed op for ``reduce_type`` on ``tensors``, refusing what it cannot do."""
    if scale != 1.0 and any(not (t.is_floating_point() or t.is_complex()) for t in tensors):
        raise ValueError(f"{caller}: scale != 1 needs floating-point tensors")
    if reduce_type not in _BOOLEAN_OPS:
        return _REDUCE_OPS[reduce_type]
    if any(t.is_floating_point() or t.is_complex() for t in tensors):
        raise ValueError(f"{caller}: {reduce_type!r} needs integer or boolean tensors")
    if all(t.dtype == torch.bool for t in tensors):
        return _BOOLEAN_OPS[reduce_type]
    return _REDUCE_OPS[reduce_type]


def _tensor_list(caller, name, value):
    """``value`` as a list of tensors: a tensor, or a list of them (torch_xla takes no tuple)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
        return value
    raise TypeError(f"{caller}: {name} must be a tensor or a list of tensors, not {type(value).__name__}")


def _deliver(caller, results, output, single):
    """``results`` as torch_xla returns them: one tensor for a tensor input, a list for a list;
    copied into ``output`` (of the same form), which is then returned, when there is one."""
    if output is None:
        return results[0] if single else results
    if not single and not (isinstance(output, list) and all(isinstance(o, torch.Tensor) for o in output)):
        raise TypeError(f"{caller}: output must be a list of tensors for a list input, not {type(output).__name__}")
    outputs = [output] if single else output
    if len(outputs) != len(results):
        raise ValueError(f"{caller}: {len(outputs)} outputs for {len(results)} inputs")
    for out, result in zip(outputs, results):
        if out.shape != result.shape:
            raise ValueError(f"{caller}: output of shape {tuple(out.shape)}, the result's is {tuple(result.shape)}")
        out.copy_(result)
    return output


def all_gather(value, dim=0, groups=None, output=None, pin_layout=True, channel_id=None,
               use_global_device_ids=None):
    """Concatenate ``value`` of every process in this rank's group of ``groups`` (all processes
    without it) along ``dim``, in group order. A list of tensors gives a list of results (it
    needs ``pin_layout=False``, as in torch_xla); ``output`` (a tensor, or a list for a list)
    receives the result and is returned. With one process the result is a copy of ``value``.
    ``pin_layout``, ``channel_id`` and ``use_global_device_ids`` (ranks are global device ids
    here) change nothing else."""
    del channel_id, use_global_device_ids
    tensors = _tensor_list("all_gather", "value", value)
    single = isinstance(value, torch.Tensor)
    if pin_layout and not single:
        raise RuntimeError("all_gather: a list of tensors needs pin_layout=False, as in torch_xla")
    group, size = _replica_group(groups)
    return _deliver("all_gather", [_gather(t, dim, group, size) for t in tensors], output, single)


def _gather(tensor, dim, group, size):
    if group is None:
        return tensor.clone()
    # all_gather_into_tensor concatenates along dim 0: ``dim`` goes there and back
    moved = tensor.detach().movedim(dim, 0).contiguous()
    gathered = moved.new_empty((size * moved.size(0), *moved.shape[1:]))
    dist.all_gather_into_tensor(gathered, moved, group=group)
    return gathered.movedim(0, dim).contiguous()


def reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=None, output=None,
                   pin_layout=True, channel_id=None, use_global_device_ids=None):
    """Reduce ``input`` across this rank's group of ``groups`` (all processes without it) with
    ``reduce_type``, split the result into ``shard_count`` shards along ``scatter_dim`` and give
    the i-th process of the group the i-th shard, multiplied by ``scale``. ``shard_count`` is
    the group's size; alone, a process gets the first shard, as with one torch_xla device. A
    list of tensors gives a list of results; ``output`` receives the result and is returned.
    ``pin_layout``, ``channel_id`` and ``use_global_device_ids`` change nothing."""
    del pin_layout, channel_id, use_global_device_ids
    _check_reduce_type("reduce_scatter", reduce_type)
    tensors = _tensor_list("reduce_scatter", "input", input)
    op = _reduce_op("reduce_scatter", reduce_type, tensors, scale)
    group, size = _replica_group(groups)
    results = [_scatter(t, op, scale, scatter_dim, shard_count, group, size) for t in tensors]
    return _deliver("reduce_scatter", results, output, isinstance(input, torch.Tensor))


def _scatter(tensor, op, scale, dim, shard_count, group, size):
    if tensor.size(dim) % shard_count:
        raise ValueError(
            f"reduce_scatter: dimension {dim} of size {tensor.size(dim)} does not split into {shard_count} shards"
        )
    if group is None:
        shard = tensor.narrow(dim, 0, tensor.size(dim) // shard_count)
        return shard * scale if scale != 1.0 else shard.clone()
    if shard_count != size:
        raise ValueError(f"reduce_scatter: shard_count={shard_count} in a group of {size} processes")
    # reduce_scatter_tensor splits along dim 0: ``dim`` goes there and back
    moved = tensor.detach().movedim(dim, 0).contiguous()
    shard = moved.new_empty((moved.size(0) // size, *moved.shape[1:]))
    dist.reduce_scatter_tensor(shard, moved, op=op, group=group)
    if scale != 1.0:
        shard.mul_(scale)
    return shard.movedim(0, dim).contiguous()


def all_to_all(value, split_dimension, concat_dimension, split_count, groups=None, pin_layout=True):
    """XLA's AllToAll: split ``value`` into ``split_count`` blocks along ``split_dimension``,
    send the i-th to the i-th process of this rank's group of ``groups`` (all processes without
    it), and concatenate the blocks received along ``concat_dimension``, in group order.
    ``split_count`` is the group's size; with one process the result is a copy of ``value``.
    ``pin_layout`` is accepted for torch_xla compatibility."""
    del pin_layout
    group, size = _replica_group(groups)
    if split_count != size:
        raise ValueError(f"all_to_all: split_count={split_count} in a group of {size} processes")
    if value.size(split_dimension) % split_count:
        raise ValueError(
            f"all_to_all: dimension {split_dimension} of size {value.size(split_dimension)} does not "
            f"split into {split_count} blocks"
        )
    if group is None:
        return value.clone()
    blocks = torch.stack(value.detach().chunk(split_count, split_dimension))
    received = torch.empty_like(blocks)
    dist.all_to_all_single(received, blocks, group=group)
    return torch.cat(received.unbind(0), concat_dimension)


def collective_permute(value, pairs):
    """XLA's CollectivePermute: for each ``[source, target]`` pair of global ranks, ``source``'s
    ``value`` goes to ``target``. A rank sends at most once and receives at most once; one that
    no pair targets gets zeros."""
    pairs = [(int(source), int(target)) for source, target in pairs]
    count = world_size()
    for end in (0, 1):
        ranks = [pair[end] for pair in pairs]
        if len(set(ranks)) != len(ranks) or not all(0 <= r < count for r in ranks):
            raise ValueError(
                f"collective_permute: pairs={pairs}: each of {count} ranks sends and receives at most once"
            )
    rank = get_ordinal()
    result = torch.zeros_like(value, memory_format=torch.contiguous_format)
    _default_group()  # initialises the process group that the P2P ops use
    ops = []
    for source, target in pairs:
        if source == rank == target:
            result.copy_(value)
        elif source == rank:
            ops.append(dist.P2POp(dist.isend, value.detach().contiguous(), target))
        elif target == rank:
            ops.append(dist.P2POp(dist.irecv, result, source))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return result


# torch_xla's channel ids name a channel, not a peer. A channel joins one sending process with
# one receiving process: each end names itself in the process group's store under the channel
# and its count of uses there, so the n-th send on a channel meets the n-th recv on it.
_CHANNEL_USES = collections.Counter()  # (direction, channel_id) -> uses by this process
_LOOPBACK = collections.defaultdict(collections.deque)  # channel_id -> values sent, one process


def _channel_peer(direction, channel_id):
    store = torch_compat.default_store()
    use = _CHANNEL_USES[direction, channel_id]
    _CHANNEL_USES[direction, channel_id] += 1
    store.set(f"accrewrite.xm.{direction}/{channel_id}/{use}", str(get_ordinal()))
    other = f"accrewrite.xm.{'recv' if direction == 'send' else 'send'}/{channel_id}/{use}"
    peer = int(store.get(other))  # waits for the other end
    store.delete_key(other)  # only this end reads it
    return peer


def send(value, channel_id):
    """Send ``value`` on channel ``channel_id`` to the process that receives on it (``recv``),
    waiting for that process; returns a copy of ``value``, as torch_xla does. With one process,
    ``value`` waits for a ``recv`` on the channel in this process."""
    if _default_group() is None:
        _LOOPBACK[channel_id].append(value.detach().clone())
    else:
        dist.send(value.detach().contiguous(), _channel_peer("send", channel_id))
    return value.detach().clone()


def recv(output, channel_id):
    """Receive what the process sending on channel ``channel_id`` (``send``) sends, as a new
    tensor of the shape and dtype of ``output``, which is left as it is (as in torch_xla)."""
    result = torch.empty_like(output, memory_format=torch.contiguous_format)
    if _default_group() is None:
        if not _LOOPBACK[channel_id]:
            raise RuntimeError(f"recv: nothing was sent on channel {channel_id} and no other process can send")
        result.copy_(_LOOPBACK[channel_id].popleft())
    else:
        dist.recv(result, _channel_peer("recv", channel_id))
    return result


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
    """Wait for queued async step closures and the work queued on the device."""
    del devices
    STEP_CLOSURES.wait()
    accelerator.synchronize()


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
    return _all_objects(payload)


def mesh_reduce(tag, data, reduce_fn):
    """Ends the step (``mark_step``), gathers ``data`` (any picklable object; its tensors move
    to the CPU) from every process, in rank order, and returns ``reduce_fn`` of that list, as in
    ``xm.mesh_reduce("accuracy", accuracy, np.mean)``. With one process: ``reduce_fn([data])``."""
    del tag
    return reduce_fn(_all_objects(map_tensors(lambda t: t.detach().cpu(), data)))


def _all_objects(obj):
    """Ends the step, then every process's ``obj`` (pickled), in rank order."""
    mark_step()
    group = _default_group()
    if group is None:
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def save(data, file_or_path, master_only=True, global_master=False):
    """``torch.save`` of ``data`` with its tensors moved to the CPU, by the master process only
    (of the machine, or of the job with ``global_master``), or by every process when
    ``master_only`` is False. As in torch_xla, the other processes do not wait: a script that
    reads the file on every process calls ``rendezvous`` first.

    A path is replaced atomically (``accrewrite.base.atomic_file``): a process loading the checkpoint
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
    ``bytes_limit`` and ``peak_bytes_used``. On an accelerator these are its allocator's
    allocated, the device's total and the peak allocated bytes; on the CPU, this process's
    resident set, the machine's physical memory and the peak resident set."""
    device = torch.device(xla_device() if device is None else device)
    if accelerator.on_accelerator(device):
        return accelerator.memory_info(device)
    return accelerator.host_memory_info()

