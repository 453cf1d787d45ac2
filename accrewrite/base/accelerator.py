"""The device the runtime trains on, and everything that depends on which device that is.

"The device" is the accelerator torch was built for (``torch.accelerator.current_accelerator``:
cuda, xpu, mps, or an out-of-tree one such as hpu) when it is available, one device per process;
the CPU otherwise. Runtime and kernel modules ask here rather than naming a device type: the
torch.distributed backend for it (the one torch registers for the device: nccl, xccl, hccl, ...;
gloo on the CPU), side streams and events for copies that overlap compute, the random generators'
states, synchronisation, memory statistics, and whether Triton can run there.

torch.cuda's memory calls (``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``,
``max_memory_reserved``, ``reset_peak_memory_stats``, ``memory_stats``, ``memory_summary``,
``empty_cache``, ``mem_get_info``), ``current_device``, ``get_device_name``,
``get_device_properties`` and ``Event`` are here under their names,
for the device: a migrated script calls them where it called torch.cuda's, which fail or read 0 off
CUDA. On an accelerator they are torch's (``torch.accelerator``'s, or the device module's), so
CUDA's numbers are unchanged; on the CPU, where no allocator keeps statistics, they describe
the process's resident memory (below).
"""

import dataclasses
import os
import platform
import resource
import sys
import time

import torch
import torch.distributed as dist

# Triton's NVIDIA and AMD backends run on torch's "cuda" devices, Intel's on "xpu".
_TRITON_DEVICE_TYPES = ("cuda", "xpu")


def device_type() -> str:
    """The type of the device the runtime trains on: the accelerator's where it is available
    (a device is visible and its driver loads), else ``"cpu"``."""
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or not torch.accelerator.is_available():
        return "cpu"
    return accelerator.type


def device_count() -> int:
    """The accelerator's visible devices; 0 without one."""
    return torch.accelerator.device_count() if device_type() != "cpu" else 0


def on_accelerator(device) -> bool:
    """Whether ``device`` (a torch.device or its name) is one of the accelerator's devices."""
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and torch.device(device).type == accelerator.type


def select(index: int) -> torch.device:
    """The accelerator's device ``index``, made the current device of this thread (so that
    work without an explicit device, and collective libraries, use it)."""
    kind = device_type()
    count = torch.accelerator.device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"{kind} device {index} requested but only {count} visible")
    torch.accelerator.set_device_index(index)
    return torch.device(kind, index)


def dist_backend(kind: str | None = None) -> str:
    """The torch.distributed backend for devices of type ``kind`` (default: the device's), as
    torch registers it: gloo for the CPU, nccl for CUDA, xccl for XPU, or whatever a vendor's
    package registered for its device."""
    kind = kind or device_type()
    try:
        backend = dist.get_default_backend_for_device(kind)
    except ValueError:
        backend = None
    # torch's test backend ("fake", which does nothing) claims devices no real backend has
    if backend not in (None, "fake"):
        return backend
    raise RuntimeError(
        f"torch.distributed has no backend registered for {kind!r} devices: import the "
        f"package that registers one (the device vendor's collective library for torch) "
        f"before the first collective, or call dist.init_process_group(backend=...) yourself"
    )


def synchronize() -> None:
    """Wait for the work queued on the current accelerator device (nothing on the CPU, nor
    before the accelerator has started)."""
    if device_type() != "cpu":
        torch.accelerator.synchronize()


def new_stream(device) -> torch.Stream | None:
    """A stream of its own on ``device``, for work that overlaps the current stream's; None on
    the host and on devices with a single queue (mps), where work runs in order anyway."""
    if not on_accelerator(device):
        return None
    try:
        return torch.Stream(device=device)
    except RuntimeError:  # the backend creates no streams besides its default one
        return None


def current_stream(device) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device(device))


def _module():
    return torch.get_device_module(device_type())


def manual_seed(seed: int) -> None:
    """Seed the CPU's generator and those of every accelerator device: ``torch.manual_seed``
    reaches the accelerators built into torch, the device module an out-of-tree one too."""
    torch.manual_seed(seed)
    if device_type() != "cpu":
        module = _module()
        (getattr(module, "manual_seed_all", None) or module.manual_seed)(seed)


def rng_states() -> list[torch.Tensor]:
    """The accelerator's random generators' states, one per device; none before it has started
    (reading them would start it) and none on the CPU (whose state torch.random holds)."""
    if device_type() == "cpu":
        return []
    module = _module()
    if not getattr(module, "is_initialized", lambda: True)():
        return []
    if hasattr(module, "get_rng_state_all"):
        return list(module.get_rng_state_all())
    return [module.get_rng_state()]


def set_rng_states(states: list[torch.Tensor]) -> None:
    """Put back what ``rng_states`` returned."""
    if not states:
        return
    module = _module()
    if hasattr(module, "set_rng_state_all"):
        module.set_rng_state_all(states)
    else:
        module.set_rng_state(states[0])


def memory_info(device) -> dict[str, int]:
    """An accelerator device's memory in torch_xla's form: the allocator's allocated bytes
    (``bytes_used``) and their peak (``peak_bytes_used``), and the device's total memory
    (``bytes_limit``)."""
    device = torch.device(device)
    _, total = torch.accelerator.get_memory_info(device)
    return {
        "bytes_used": torch.accelerator.memory_allocated(device),
        "bytes_limit": total,
        "peak_bytes_used": torch.accelerator.max_memory_allocated(device),
    }


def host_memory_info() -> dict[str, int]:
    """This process's memory in torch_xla's form: its resident set (``bytes_used``), the
    machine's physical memory (``bytes_limit``) and the peak resident set since the process
    started or since ``reset_peak_memory_stats`` (``peak_bytes_used``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    try:
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no procfs
        used = peak
    # The kernel counts the two apart and syncs them lazily: the peak may lag the current use
    # by a few pages.
    peak = max(peak, used)
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"bytes_used": used, "bytes_limit": limit, "peak_bytes_used": peak}


# torch.cuda's calls for the device. ``device`` is what torch.cuda takes: None (the current
# device), an index, a name or a torch.device; an index, or a device of the accelerator's type,
# means the accelerator's device where there is one, and the host where there is none. On the
# host, "allocated" and "reserved" memory are both the process's resident set.


def _on_host(device) -> bool:
    if device_type() == "cpu":
        return True
    return not (device is None or isinstance(device, int) or on_accelerator(device))


def memory_allocated(device=None) -> int:
    """The allocator's bytes in use on the device; on the host, the resident set."""
    return host_memory_info()["bytes_used"] if _on_host(device) else torch.accelerator.memory_allocated(device)


def max_memory_allocated(device=None) -> int:
    """Their peak since the start or ``reset_peak_memory_stats``; on the host, the resident
    set's."""
    if _on_host(device):
        return host_memory_info()["peak_bytes_used"]
    return torch.accelerator.max_memory_allocated(device)


def memory_reserved(device=None) -> int:
    """The allocator's bytes held on the device, in use or cached; on the host, the resident set."""
    return host_memory_info()["bytes_used"] if _on_host(device) else torch.accelerator.memory_reserved(device)


def max_memory_reserved(device=None) -> int:
    """Their peak; on the host, the resident set's."""
    if _on_host(device):
        return host_memory_info()["peak_bytes_used"]
    return torch.accelerator.max_memory_reserved(device)


def reset_peak_memory_stats(device=None) -> None:
    """Start the peaks anew. On the host, the kernel's peak of this process's resident set is
    reset (Linux's ``/proc/self/clear_refs``); where that cannot be done the peak stays the
    process's whole life's."""
    if not _on_host(device):
        torch.accelerator.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def memory_stats(device=None) -> dict:
    """The allocator's statistics (torch's keys). On the host, those of the resident set:
    ``allocated_bytes.all.current``/``.peak`` and ``reserved_bytes.all.current``/``.peak``."""
    if not _on_host(device):
        return torch.accelerator.memory_stats(device)
    info = host_memory_info()
    return {
        f"{kind}_bytes.all.{moment}": info[key]
        for kind in ("allocated", "reserved")
        for moment, key in (("current", "bytes_used"), ("peak", "peak_bytes_used"))
    }


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """The allocator's statistics as a table where the device module has one (CUDA's);
    elsewhere, and on the host, the allocated and reserved memory and their peaks."""
    table = None if _on_host(device) else getattr(_module(), "memory_summary", None)
    if table is not None:
        return table(device, abbreviated)
    kind = "cpu (this process's resident set)" if _on_host(device) else device_type()
    allocated, peak = memory_allocated(device) / 2**20, max_memory_allocated(device) / 2**20
    reserved, reserved_peak = memory_reserved(device) / 2**20, max_memory_reserved(device) / 2**20
    return (f"memory of {kind}: allocated {allocated:.1f} MiB (peak {peak:.1f} MiB), "
            f"reserved {reserved:.1f} MiB (peak {reserved_peak:.1f} MiB)")


def empty_cache() -> None:
    """Give the allocator's cached, unused memory back to the device; nothing on the host."""
    if device_type() != "cpu":
        torch.accelerator.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """The device's free and total bytes; on the host, the machine's free and physical memory."""
    if not _on_host(device):
        return torch.accelerator.get_memory_info(device)
    page = os.sysconf("SC_PAGE_SIZE")
    return page * os.sysconf("SC_AVPHYS_PAGES"), page * os.sysconf("SC_PHYS_PAGES")


def get_device_name(device=None) -> str:
    """The device's name; on the host, the processor's."""
    if _on_host(device):
        return platform.processor() or platform.machine()
    return _module().get_device_name(device)


def current_device() -> int:
    """The index of the device this thread trains on (the one ``xla_device`` made current); 0
    on the host, its only device."""
    return torch.accelerator.current_device_index() if device_type() != "cpu" else 0


def get_device_properties(device=None):
    """The device's properties (CUDA's: ``name``, ``total_memory``, ``multi_processor_count``,
    ``major``, ``minor``, ...); on the host, a ``HostProperties``."""
    if _on_host(device):
        page = os.sysconf("SC_PAGE_SIZE")
        return HostProperties(get_device_name(device), page * os.sysconf("SC_PHYS_PAGES"), os.cpu_count() or 1)
    return _module().get_device_properties(device)


@dataclasses.dataclass(frozen=True)
class HostProperties:
    """The host's properties under CUDA's names: the processor's name, the machine's physical
    memory, its processors as the multiprocessors, and compute capability 0.0, which no check for
    a CUDA feature (``major >= 8`` for bfloat16) passes."""

    name: str
    total_memory: int
    multi_processor_count: int
    major: int = 0
    minor: int = 0


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
    """torch.cuda.Event for the device: the accelerator's own event (``torch.cuda.Event`` on
    CUDA); on the host, one that takes the time when it is recorded, the host's work being done
    by then."""
    if device_type() == "cpu":
        return HostEvent()
    event = getattr(_module(), "Event", None)
    if event is None:
        return torch.Event(device_type(), enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
    return event(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


class HostEvent:
    """An event of the host's work: ``record`` takes the time; ``elapsed_time`` is in
    milliseconds, as CUDA's events give it; there is nothing to wait for."""

    def __init__(self):
        self._recorded = None

    def record(self, stream=None) -> None:
        self._recorded = time.perf_counter_ns()

    def elapsed_time(self, end_event: "HostEvent") -> float:
        if self._recorded is None or end_event._recorded is None:
            raise RuntimeError("both events must be recorded before their elapsed time is asked for")
        return (end_event._recorded - self._recorded) / 1e6

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass


def supports_triton(device) -> bool:
    """Whether Triton kernels can run on ``device`` (Triton compiles for GPUs only)."""
    return torch.device(device).type in _TRITON_DEVICE_TYPES


def multiprocessor_count(device) -> int:
    """The number of units a GPU kernel's programs spread over: CUDA's streaming
    multiprocessors, XPU's Xe cores."""
    properties = torch.get_device_module(torch.device(device).type).get_device_properties(device)
    count = getattr(properties, "multi_processor_count", None)
    return count if count is not None else properties.gpu_subslice_count
