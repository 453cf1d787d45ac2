"""``pl``: torch_xla's device loaders (``MpDeviceLoader``, ``ParallelLoader``) on plain PyTorch.

Batches are loaded where iterating the wrapped loader itself would load them, so that the global
random generator (torch's, drawn from by datasets, samplers and the training loop alike) is
consumed in the same order as by plain iteration and runs repeat:

* the wrapped loader's ``iter()`` is called on the training loop's thread when the device
  loader's iteration starts (a DataLoader draws its seeds there);
* a DataLoader with ``num_workers > 0`` loads in its worker processes, whose generators are
  their own: a background thread takes its batches and moves them to the device ahead of the
  loop, through a bounded queue (``device_prefetch_size`` batches, default 8);
* anything else (a DataLoader without workers, a list, a generator) is loaded on the loop's
  thread when the loop asks for the next batch; reading ahead would change the random numbers.

On an accelerator (CUDA, XPU, ...) each batch is pinned (unless the loader already pinned it)
and copied with ``non_blocking=True`` on a side stream; the training stream waits for that copy
before it uses the batch, so the copy still overlaps the work queued before it. Batches may
nest tensors in dicts, lists, tuples, namedtuples, dataclasses and mappings such as HF
``BatchEncoding`` (see ``_tensor_tree``).

An exception raised while loading reaches the training loop as itself, with the loader's
traceback; a DataLoader worker that died (killed by a signal, say) is named as torch names it,
in a RuntimeError caused by the error met while loading. Breaking out of the loop or dropping the
iterator stops the background thread, if any, and drops the wrapped loader's iterator (ending its
workers). As in torch_xla, fetching a batch marks the step (``xm.mark_step``) every
``batches_per_execution`` batches, so step closures also run there, and iterating an
``MpDeviceLoader`` again closes its previous iteration.

One process drives one device (torchrun style): ``ParallelLoader`` takes a single device.
``batchdim``, ``loader_prefetch_size``, ``host_to_device_transfer_threads`` and
``input_sharding`` are accepted for torch_xla compatibility and have no effect.
"""

import atexit
import multiprocessing.connection
import queue
import signal
import threading
import weakref

import torch
from torch.utils.data import DataLoader

from . import xla_model as xm
from ._transfer import DeviceMover

_POLL_S = 0.05  # how often a blocked producer checks that it has been asked to stop
_JOIN_S = 2.0  # how long close() waits for the producer to finish the batch it is loading
_EXIT_GRACE_S = 0.25  # see _naming_a_dead_worker


class _End:
    """Queue item after the last batch."""


class _Failure:
    """Queue item carrying an exception raised while loading."""

    def __init__(self, error):
        self.error = error


# Prefetchers whose thread may still run at exit: a thread busy in torch while the interpreter
# tears down can abort the process ("terminate called without an active exception"), so they
# are stopped first.
_OPEN: "weakref.WeakSet[_Prefetcher]" = weakref.WeakSet()


@atexit.register
def _close_open_loaders():
    for prefetcher in list(_OPEN):
        prefetcher.close()


class _OnDemand:
    """Loads and moves each batch on the calling thread when it is asked for."""

    def __init__(self, iterator, move):
        self._iterator = iterator
        self._move = move

    def next(self):
        """``(moved batch, event)``; None once the loader is exhausted, failed or closed."""
        if self._iterator is None:
            return None
        try:
            return self._move(next(self._iterator))
        except StopIteration:
            self.close()
            return None
        except Exception as error:
            self.close()
            error.add_note("(raised while loading a batch for the device loader)")
            raise

    def close(self):
        self._iterator = None


def _produce(iterator, move, out, stop):
    """Thread body: load, move and enqueue batches until the loader ends or ``stop`` is set.

    It holds no reference to its _Prefetcher, so dropping that object (a ``break`` out of the
    training loop) lets its ``__del__`` stop this thread.
    """

    def put(item):
        while not stop.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    try:
        for batch in iterator:
            if stop.is_set() or not put(move(batch)):
                return
    except BaseException as error:  # noqa: BLE001 - handed to the training loop
        put(_Failure(_naming_a_dead_worker(iterator, error)))
        return
    put(_End())


def _naming_a_dead_worker(iterator, error):
    """``error``, or when a DataLoader worker died, a RuntimeError that names it as torch does.

    torch names a worker killed by a signal from its SIGCHLD handler, which raises on the main
    thread; this thread meets the death first, as a broken connection to the worker or "exited
    unexpectedly", and the handler may run too late to name it. A dead worker's exit follows
    the closing of its connections by a moment: ``_EXIT_GRACE_S`` bounds the wait for it, paid
    by any loading error of a loader with workers.
    """
    # torch private: the worker processes of a DataLoader iterator with num_workers > 0
    workers = getattr(iterator, "_workers", None)
    if not workers:
        return error
    ended = multiprocessing.connection.wait([w.sentinel for w in workers], timeout=_EXIT_GRACE_S)
    deaths = []
    for worker in workers:
        if worker.sentinel in ended:
            worker.join(_EXIT_GRACE_S)
            if worker.exitcode:  # 0: an iterable dataset's worker that ran out of data
                deaths.append(_death(worker))
    if not deaths:
        return error
    named = RuntimeError(" ".join(deaths))
    named.__cause__ = error
    return named


def _death(worker):
    """How a dead DataLoader worker ended, in torch's words."""
    name = f"DataLoader worker (pid {worker.pid})"
    if worker.exitcode < 0:
        return f"{name} is killed by signal: {signal.strsignal(-worker.exitcode)}."
    return f"{name} exited unexpectedly with exit code {worker.exitcode}."


class _Prefetcher:
    """Loads and moves batches ahead of the loop in a background thread (started here)."""

    def __init__(self, iterator, move, size):
        self._queue = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_produce,
            args=(iterator, move, self._queue, self._stop),
            name="accrewrite-device-loader",
            daemon=True,
        )
        self._thread.start()
        _OPEN.add(self)

    def next(self):
        """``(moved batch, event)``; None once the loader is exhausted, failed or closed."""
        if self._stop.is_set():
            return None
        item = self._queue.get()
        if isinstance(item, _End):
            self.close()
            return None
        if isinstance(item, _Failure):
            self.close()
            item.error.add_note("(raised while loading in the device loader's background thread)")
            raise item.error
        return item

    def close(self):
        """Stop the background thread and drop the prefetched batches."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)

    def __del__(self):
        if hasattr(self, "_thread"):
            self.close()


class ParallelLoader:
    """Feeds ``cpu_loader``'s batches to ``devices[0]``; its iteration (``iter(cpu_loader)``)
    starts here."""

    def __init__(self, cpu_loader, devices, batchdim=0, batches_per_execution=1,
                 loader_prefetch_size=16, device_prefetch_size=8,
                 host_to_device_transfer_threads=1, input_sharding=None):
        del batchdim, loader_prefetch_size, host_to_device_transfer_threads, input_sharding
        devices = [torch.device(d) for d in devices]
        if len(devices) != 1:
            raise ValueError(
                f"ParallelLoader drives one device per process (torchrun style), got {devices}"
            )
        if batches_per_execution < 1 or device_prefetch_size < 1:
            raise ValueError("batches_per_execution and device_prefetch_size must be at least 1")
        self._loader = cpu_loader
        self._device = devices[0]
        self._batches_per_execution = batches_per_execution
        self._mover = DeviceMover(self._device)
        iterator = iter(cpu_loader)
        if isinstance(cpu_loader, DataLoader) and cpu_loader.num_workers > 0:
            # the workers draw from generators of their own: loading ahead changes no number
            self._source = _Prefetcher(iterator, self._mover, device_prefetch_size)
        else:
            self._source = _OnDemand(iterator, self._mover)

    def per_device_loader(self, device):
        return PerDeviceLoader(self, torch.device(device))

    def per_device_samples(self):
        return len(self._loader)

    def next_item(self, device):
        """The next batch on ``device``; None once the loader is exhausted, failed or closed."""
        if torch.device(device) != self._device:
            raise ValueError(f"ParallelLoader: asked for a batch on {device}, it feeds {self._device}")
        item = self._source.next()
        return None if item is None else self._mover.hand_over(*item)

    @property
    def batches_per_execution(self):
        return self._batches_per_execution

    def close(self):
        """Stop loading (the background thread, if any) and drop the prefetched batches."""
        self._source.close()


class PerDeviceLoader:
    """The iterator over ``device``'s batches of ``loader`` (a ParallelLoader). It marks the step
    where torch_xla's does: on fetching batch ``k * batches_per_execution`` (counting from 1;
    every batch with the default of 1) and at the end."""

    def __init__(self, loader, device):
        self._loader = loader
        self._device = device
        self._fetches_between_marks = loader.batches_per_execution - 1
        self._fetched_since_mark = 0

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()

    def __len__(self):
        return self._loader.per_device_samples()

    def next(self):
        if self._fetched_since_mark >= self._fetches_between_marks:
            self._fetched_since_mark = 0
            xm.mark_step()
        else:
            self._fetched_since_mark += 1
        batch = self._loader.next_item(self._device)
        if batch is None:
            xm.mark_step()
            raise StopIteration
        return batch

    def close(self):
        self._loader.close()


def _forward(name):
    return property(lambda self: getattr(self._loader, name), doc=f"The wrapped loader's ``{name}``.")


class MpDeviceLoader:
    """``pl.MpDeviceLoader(loader, device, **kwargs)``: iterate it like ``loader``, get batches
    already on ``device``. Every ``iter()`` closes the previous iteration and starts a fresh
    prefetching ``ParallelLoader`` (kwargs go to it). ``len()`` is the wrapped loader's, and so
    are ``.dataset``, ``.sampler``, ``.batch_sampler`` and ``.batch_size`` (an extension of
    torch_xla's: ``loader.sampler.set_epoch(epoch)`` keeps working where the migration rebinds
    the loader's name)."""

    def __init__(self, loader, device, **kwargs):
        self._loader = loader
        self._device = torch.device(device)
        self._parallel_loader_kwargs = kwargs
        # weak: an iteration that is dropped (a `break`) still ends its thread on its own
        self._previous = lambda: None

    def __iter__(self):
        previous = self._previous()
        if previous is not None:
            previous.close()
        loader = ParallelLoader(self._loader, [self._device], **self._parallel_loader_kwargs)
        self._previous = weakref.ref(loader)
        return loader.per_device_loader(self._device)

    def __len__(self):
        return len(self._loader)

    dataset = _forward("dataset")
    sampler = _forward("sampler")
    batch_sampler = _forward("batch_sampler")
    batch_size = _forward("batch_size")
