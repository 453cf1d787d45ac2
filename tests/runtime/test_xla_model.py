"""xm in one process: devices, the process world from the environment, single-process
collectives, optimizer_step, step closures and save. (Two-process collectives:
test_collectives.py.)"""

import io
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

import pytest
import torch

import accrewrite.runtime.xla_model as xm
from accrewrite.base import accelerator

import _forked


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    yield
    xm.mark_step(wait=True)  # leave no closure queued for the next test


# --- devices and the world ---------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_xla_device_is_cpu_without_cuda():
    assert xm.xla_device() == torch.device("cpu")
    xm.set_replication(xm.xla_device(), [xm.xla_device()])
    assert xm.dist_backend() == "gloo"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_xla_device_is_the_local_rank_gpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert xm.xla_device() == torch.device("cuda", 0)
    assert xm.dist_backend() == "nccl"


def test_set_replication_rejects_a_foreign_device():
    with pytest.raises(ValueError, match="not one of"):
        xm.set_replication(torch.device("cpu"), [torch.device("meta")])


def test_world_defaults_to_one_process():
    assert (xm.world_size(), xm.xrt_world_size(), xm.get_ordinal(), xm.get_local_ordinal()) == (1, 1, 0, 0)
    assert xm.is_master_ordinal() and xm.is_master_ordinal(local=False)


def test_world_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert (xm.world_size(), xm.xrt_world_size(), xm.get_ordinal(), xm.get_local_ordinal()) == (4, 4, 3, 0)
    # torch_xla: is_master_ordinal is per machine unless local=False
    assert xm.is_master_ordinal() and not xm.is_master_ordinal(local=False)


def test_bad_environment_is_reported(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        xm.world_size()


def test_master_print_prints_on_the_master_only(monkeypatch):
    out = io.StringIO()
    xm.master_print("hello", 3, fd=out, flush=True)
    assert out.getvalue() == "hello 3\n"
    monkeypatch.setenv("RANK", "1")
    xm.master_print("hidden", fd=out)
    xm.master_print("machine master", fd=out, local=True)  # LOCAL_RANK is still 0
    assert out.getvalue() == "hello 3\nmachine master\n"


def test_master_print_writes_to_the_standard_output_by_default():
    # torch_xla's default is the sys.stdout of import time, which pytest replaces: a fresh process
    code = "import accrewrite.runtime.xla_model as xm; xm.master_print('to stdout', 1)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout) == (0, "to stdout 1\n"), run.stderr


def test_get_memory_info_reports_this_process_on_the_cpu():
    before = xm.get_memory_info()
    held = torch.ones(64, 1024, 1024, dtype=torch.uint8) + 1  # 64 MiB, touched
    after = xm.get_memory_info("cpu")
    assert set(after) == {"bytes_used", "bytes_limit", "peak_bytes_used"}
    assert after["bytes_used"] - before["bytes_used"] >= 60 * 2**20
    assert after["bytes_used"] <= after["peak_bytes_used"] <= after["bytes_limit"]
    del held


def test_get_memory_info_peak_is_never_below_the_use(monkeypatch):
    # The kernel's peak resident set lags the current one by a few pages at times.
    lagging = type("Usage", (), {"ru_maxrss": 1})()
    monkeypatch.setattr(accelerator.resource, "getrusage", lambda who: lagging)
    info = xm.get_memory_info("cpu")
    assert info["peak_bytes_used"] == info["bytes_used"] > 1024


def test_set_rng_state_makes_runs_repeat():
    xm.set_rng_state(1234)
    assert xm.get_rng_state() == 1234
    first = torch.randn(5)
    xm.set_rng_state(1234)
    assert torch.equal(torch.randn(5), first)


def test_get_rng_state_resumes_the_stream_where_it_was_taken():
    xm.set_rng_state(7)
    torch.randn(3)
    state = xm.get_rng_state()
    assert state != 7 and isinstance(state, int)
    expected = torch.randn(4)
    torch.randn(10)
    xm.set_rng_state(state)
    assert torch.equal(torch.randn(4), expected)


# --- collectives with one process ----------------------------------------------------------


def test_all_reduce_single_process_changes_nothing():
    # torch_xla: with one process a tensor comes back as a copy and a list as itself, unscaled
    t = torch.tensor([2.0, 4.0])
    out = xm.all_reduce(xm.REDUCE_SUM, t, scale=0.5)
    assert out.data_ptr() != t.data_ptr() and torch.equal(out, t)
    grads = [torch.ones(2), torch.full((3,), 3.0)]
    assert xm.all_reduce(xm.REDUCE_MUL, grads, scale=2.0) is grads
    assert torch.equal(grads[1], torch.full((3,), 3.0))


def test_all_reduce_single_process_gives_a_copy_of_a_loss():
    loss = (torch.ones(2, requires_grad=True) * 3).sum()
    reduced = xm.all_reduce("sum", loss, scale=0.5)
    assert reduced is not loss and reduced.item() == 6.0
    loss.backward()  # the graph is untouched


def test_all_reduce_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown reduce_type 'avg'"):
        xm.all_reduce("avg", torch.ones(1))
    with pytest.raises(TypeError, match="tensor or a list"):
        xm.all_reduce("sum", [1.0, 2.0])



def test_gathers_and_scatters_single_process_give_torch_xlas_one_device_results():
    t = torch.arange(6.0).reshape(2, 3)
    gathered = xm.all_gather(t, dim=1)
    assert gathered is not t and torch.equal(gathered, t)
    # alone, a process gets the first of shard_count shards, scaled
    assert torch.equal(xm.reduce_scatter(xm.REDUCE_SUM, t, 0.5, 1, 3), t[:, :1] * 0.5)
    assert torch.equal(xm.all_to_all(t, 1, 0, 1, groups=[[0]]), t)
    assert torch.equal(xm.collective_permute(t, [[0, 0]]), t)
    assert torch.equal(xm.collective_permute(t, []), torch.zeros(2, 3))
    output = torch.zeros(2, 3)
    assert xm.reduce_scatter(xm.REDUCE_MAX, [t], 2.0, 0, 1, output=[output])[0] is output
    assert torch.equal(output, t * 2)


def test_gathers_and_scatters_reject_what_torch_xla_cannot_do():
    t = torch.ones(2, 3)
    for call, error, message in [
        (lambda: xm.all_gather([t]), RuntimeError, "pin_layout=False"),
        (lambda: xm.all_gather((t,), pin_layout=False), TypeError, "not tuple"),
        (lambda: xm.all_gather(t, output=torch.zeros(4, 3)), ValueError, "shape"),
        (lambda: xm.all_gather(t, groups=[[0], [1, 2]]), ValueError, "same size"),
        (lambda: xm.reduce_scatter(xm.REDUCE_SUM, t, 1.0, 1, 2), ValueError, "does not split"),
        (lambda: xm.reduce_scatter(xm.REDUCE_SUM, t.long(), 0.5, 0, 1), ValueError, "scale"),
        (lambda: xm.reduce_scatter("avg", t, 1.0, 0, 1), ValueError, "reduce_type"),
        (lambda: xm.all_to_all(t, 0, 0, 2), ValueError, "split_count=2"),
        (lambda: xm.collective_permute(t, [[0, 1]]), ValueError, "pairs"),
    ]:
        with pytest.raises(error, match=message):
            call()


def test_send_and_recv_single_process_loop_back_on_their_channel():
    sent = torch.tensor([1.0, 2.0])
    returned = xm.send(sent, 5)
    assert returned is not sent and torch.equal(returned, sent)
    template = torch.zeros(2)
    received = xm.recv(template, 5)
    assert torch.equal(received, sent) and torch.equal(template, torch.zeros(2))
    with pytest.raises(RuntimeError, match="nothing was sent on channel 5"):
        xm.recv(template, 5)


def test_mesh_reduce_single_process_ends_the_step_and_reduces_a_list_of_one():
    ran = []
    xm.add_step_closure(lambda: ran.append(1))
    assert xm.mesh_reduce("accuracy", 0.75, lambda values: (ran == [1], values)) == (True, [0.75])


def _tiny_problem():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    return model, x, y


def test_optimizer_step_single_process_is_optimizer_step_and_ends_the_step_with_barrier():
    model, x, y = _tiny_problem()
    reference = torch.nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    ran = []
    for step in range(3):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
        xm.add_step_closure(ran.append, args=(step,))
        xm.optimizer_step(opt, barrier=step == 2)
        ref_opt.step()
        # as in torch_xla, only barrier=True ends the step (a device loader does otherwise)
        assert ran == ([] if step < 2 else [0, 1, 2])
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


def test_optimizer_step_passes_optimizer_args_and_returns_the_loss():
    model, x, y = _tiny_problem()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=2)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    loss = xm.optimizer_step(opt, optimizer_args={"closure": closure})
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0


# --- step closures -------------------------------------------------------------------------


def test_sync_closures_run_in_order_at_mark_step_only():
    seen = []
    for i in range(5):
        xm.add_step_closure(lambda i, tag: seen.append((tag, i)), args=(i, "s"))
    assert seen == []
    xm.mark_step()
    assert seen == [("s", i) for i in range(5)]
    xm.mark_step()
    assert len(seen) == 5


def test_sync_closure_error_propagates_and_drops_the_rest_of_the_step():
    seen = []

    def boom():
        raise KeyError("bad closure")

    xm.add_step_closure(boom)
    xm.add_step_closure(seen.append, args=(1,))
    with pytest.raises(KeyError, match="bad closure"):
        xm.mark_step()
    xm.mark_step()
    assert seen == []


def test_async_closures_run_in_order_without_blocking_the_step():
    release = threading.Event()
    seen = []

    def slow(i):
        assert release.wait(10), "the step blocked on the async closure"
        seen.append((i, threading.current_thread() is threading.main_thread()))

    for i in range(20):
        xm.add_step_closure(slow, args=(i,), run_async=True)
    xm.mark_step()  # returns while every closure is still waiting for `release`
    assert seen == []
    release.set()
    xm.mark_step(wait=True)
    assert seen == [(i, False) for i in range(20)]


def test_async_closures_keep_order_across_steps():
    seen = []
    for step in range(10):
        xm.add_step_closure(seen.append, args=(step,), run_async=True)
        xm.mark_step()
    xm.wait_device_ops()
    assert seen == list(range(10))


def _failing_log_closure(step):
    raise RuntimeError(f"log failed at step {step}")


def test_async_closure_error_surfaces_at_the_next_step_with_its_traceback():
    seen = []
    xm.add_step_closure(_failing_log_closure, args=(7,), run_async=True)
    xm.add_step_closure(seen.append, args=("after the failure",), run_async=True)
    xm.mark_step()
    xm.STEP_CLOSURES._runner.wait()  # the worker has run (and failed)
    with pytest.raises(RuntimeError, match="log failed at step 7") as info:
        xm.mark_step()
    text = "".join(traceback.format_exception(info.value))
    assert "_failing_log_closure" in text and "async step closure" in text
    assert seen == []  # dropped: it was queued behind the failure
    # the error is raised once; later steps run normally
    xm.add_step_closure(seen.append, args=("next",), run_async=True)
    xm.mark_step(wait=True)
    assert seen == ["next"]


def test_add_step_closure_rejects_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        xm.add_step_closure("print")
    with pytest.raises(TypeError, match="tuple or list"):
        xm.add_step_closure(print, args="abc")


# --- save ----------------------------------------------------------------------------------


def test_save_moves_tensors_to_cpu_and_keeps_structure(tmp_path):
    model = torch.nn.Linear(2, 2)
    path = tmp_path / "ckpt.pt"
    xm.save({"model": model.state_dict(), "step": 3, "extra": (torch.ones(1, requires_grad=True),)}, path)
    loaded = torch.load(path)
    assert loaded["step"] == 3 and set(loaded["model"]) == {"weight", "bias"}
    assert torch.equal(loaded["model"]["weight"], model.weight.detach())
    assert loaded["extra"][0].device.type == "cpu" and not loaded["extra"][0].requires_grad


def test_save_writes_on_the_master_only(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    xm.save({"a": torch.ones(1)}, tmp_path / "not_master.pt")
    assert not (tmp_path / "not_master.pt").exists()
    xm.save({"a": torch.ones(1)}, tmp_path / "everyone.pt", master_only=False)
    assert (tmp_path / "everyone.pt").exists()
    # the local master of a machine that is not the first writes unless global_master
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "2")
    xm.save({"a": torch.ones(1)}, tmp_path / "local.pt")
    xm.save({"a": torch.ones(1)}, tmp_path / "global.pt", global_master=True)
    assert (tmp_path / "local.pt").exists() and not (tmp_path / "global.pt").exists()


def test_save_to_a_file_object():
    buffer = io.BytesIO()
    xm.save([torch.arange(3)], buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer)[0], torch.arange(3))


def save_versions(path, stop):
    """Save checkpoints whose every tensor holds their version number until ``stop`` is set."""
    version = 0
    while not stop.is_set():
        version += 1
        tensors = {f"t{i}": torch.full((1 << 18,), version) for i in range(4)}  # 2 MiB each
        xm.save({"version": version, **tensors}, path)


@pytest.mark.timeout(60)
def test_a_load_during_saves_reads_one_whole_checkpoint(tmp_path):
    """Another process (an evaluator) loads the checkpoint while it is saved again and again:
    every load reads one whole version, never a half-written or mixed file."""
    path = tmp_path / "ckpt.pt"
    stop = _forked.CONTEXT.Event()
    writer = _forked.start(save_versions, path, stop)
    try:
        while not path.exists():
            assert writer.is_alive(), "the writer ended before its first save"
            time.sleep(0.01)
        versions = set()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            checkpoint = torch.load(path)
            version = checkpoint.pop("version")
            assert all((t == version).all() for t in checkpoint.values()), version
            versions.add(version)
    finally:
        stop.set()
        writer.join(timeout=30)
        writer.kill()
    assert writer.exitcode == 0
    assert len(versions) > 2  # the loads overlapped the saves
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


class Interrupt:
    """Pickled inside ``xm.save``: the saving process is killed there, or waits there for
    ``release`` (a save in progress)."""

    def __init__(self, release=None):
        self.release = release

    def __reduce__(self):
        if self.release is None:
            os.kill(os.getpid(), signal.SIGKILL)
        self.release.wait()
        return (Interrupt, ())


def hidden_files(directory):
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


@pytest.mark.timeout(60)
def test_save_removes_the_temporary_of_a_killed_save_but_not_of_a_running_one(tmp_path):
    path = tmp_path / "ckpt.pt"
    release = _forked.CONTEXT.Event()
    running = _forked.start(xm.save, {"b": torch.ones(1), "wait": Interrupt(release)}, path)
    try:
        while not hidden_files(tmp_path):
            assert running.is_alive(), "the save ended before it wrote"
            time.sleep(0.01)
        [in_progress] = hidden_files(tmp_path)  # its temporary, next to the checkpoint
        killed = _forked.start(xm.save, {"a": torch.ones(1), "stop": Interrupt()}, path)
        killed.join(timeout=30)
        assert killed.exitcode == -signal.SIGKILL
        assert len(hidden_files(tmp_path)) == 2
        xm.save({"c": torch.ones(1)}, path)
        assert hidden_files(tmp_path) == [in_progress]  # the killed save's temporary is gone
        assert set(torch.load(path)) == {"c"}
    finally:
        release.set()
        running.join(timeout=30)
        running.kill()
    assert running.exitcode == 0 and hidden_files(tmp_path) == []
    assert set(torch.load(path, weights_only=False)) == {"b", "wait"}


def test_mark_step_is_cheap_without_closures():
    # a behavioural check, not a timing: nothing is created or started by an empty step
    threads = threading.active_count()
    for _ in range(1000):
        xm.mark_step()
    assert threading.active_count() == threads
