import pytest


@pytest.fixture
def fresh_compiles():
    """Every compile traces anew: no on-disk cache hit, no dynamo cache left by another test."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()


@pytest.fixture
def fake_accelerator(monkeypatch):
    """``fake_accelerator(kind, count=2)``: torch reports an available accelerator of type
    ``kind`` with ``count`` devices (``kind=None``: none at all). Returns a recorder: ``calls``
    holds the device selections, synchronisations and memory-statistic calls that reached
    ``torch.accelerator`` or the device module; ``module`` is ``kind``'s device module, whose random generator
    states (``states``) the runtime reads and writes, and ``initialized`` says whether the
    device has started."""
    torch = pytest.importorskip("torch")

    class Recorder:
        def __init__(self):
            self.calls = []
            self.module = self
            self.initialized = True
            self.states = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]

        # the device module's generator calls
        def is_initialized(self):
            return self.initialized

        def get_rng_state_all(self):
            self.calls.append(("get_rng_state_all",))
            return [state.clone() for state in self.states]

        def set_rng_state_all(self, states):
            self.calls.append(("set_rng_state_all",))
            self.states = [state.clone() for state in states]

        def manual_seed_all(self, seed):
            self.calls.append(("manual_seed_all", seed))

        # the device module's calls that torch.accelerator lacks
        def memory_summary(self, device, abbreviated):
            self.calls.append(("memory_summary", device, abbreviated))
            return "the allocator's table"

        def get_device_name(self, device):
            self.calls.append(("get_device_name", device))
            return "a fake GPU"

        def get_device_properties(self, device):
            self.calls.append(("get_device_properties", device))
            return "a fake GPU's properties"

        def Event(self, **flags):
            self.calls.append(("Event", flags))
            return "an event"

    def install(kind, count=2):
        recorder = Recorder()
        real_module = torch.get_device_module
        monkeypatch.setattr(torch.accelerator, "current_accelerator",
                            lambda check_available=False: None if kind is None else torch.device(kind))
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: kind is not None)
        monkeypatch.setattr(torch.accelerator, "device_count", lambda: 0 if kind is None else count)
        monkeypatch.setattr(torch, "get_device_module",
                            lambda device=None: recorder if str(device) == kind else real_module(device))
        for name, result in [("set_device_index", None), ("synchronize", None), ("memory_allocated", 5),
                             ("max_memory_allocated", 7), ("get_memory_info", (3, 11)), ("memory_reserved", 13),
                             ("max_memory_reserved", 17), ("memory_stats", {"num_ooms": 0}),
                             ("reset_peak_memory_stats", None), ("empty_cache", None), ("current_device_index", 1)]:
            def record(*args, name=name, result=result):
                recorder.calls.append((name, *args))
                return result
            monkeypatch.setattr(torch.accelerator, name, record)
        return recorder

    return install
