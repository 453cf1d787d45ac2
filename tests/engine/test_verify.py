"""``accrewrite verify``: the original and the migrated script run side by side on the CPU, and the
verdict is the exit code (0 match, 1 diverge or the migrated side fails, 2 the original cannot run).
What a side may touch and how its processes end: test_verify_isolation.py."""

import inspect
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
import types
from pathlib import Path

import pytest

from accrewrite.cli import main
from accrewrite.verify import graphs as profile, preflight, probe
from accrewrite.verify.report import check_graphs
from accrewrite.verify.sides import Side, environment, read_records
from accrewrite.verify.verdict import ROUNDING, compare, tolerance

TRAIN = """\
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), {activation}, nn.Linear(16, 1)).to(device)
optimizer = torch.optim.{optimizer}(model.parameters(), lr=1e-2)
data = torch.utils.data.TensorDataset(torch.randn(64, 8) * {scale}, torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
for step, (x, y) in enumerate(loader):
    x, y = x.to(device), y.to(device)
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {{step}} loss {{loss.item():.4f}}")
    if step + 1 == args.steps:
        break
torch.save(model.state_dict(), "model.pt")
"""




def script(activation="nn.ReLU()", optimizer="AdamW", scale=2):
    return TRAIN.format(activation=activation, optimizer=optimizer, scale=scale)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The test's folder, with a temporary folder of its own for verify's workspace (beside the
    project, not in it), so that nothing else can remove the workspace under it."""
    (tmp_path / "project").mkdir()
    (tmp_path / "temp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "temp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path / "project"


def write(project, name, text):
    path = project / name
    path.write_text(text)
    return path


def verify(capsys, *args):
    code = main(["verify", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_a_faithful_migration_matches_run_to_the_end_with_the_noise_floor_shown(project, capsys):
    write(project, "train.py", script())
    code, out, err = verify(capsys, "train.py", "--", "--steps", "6")
    assert code == 0, out + err
    assert "match: 6 steps within their tolerances (10x the drift of a rerun nudged by 1e-06" in out
    assert "both ran to the script's end" in out
    assert "loss tol" in out and "checksum tol" in out
    assert "original-nudged-1: 6 steps" in err


@pytest.mark.slow
def test_a_numerics_change_under_two_percent_is_caught_by_the_measured_noise(project, capsys):
    # GELU -> QuickGELU on a small, calm model: every deviation of these two steps is under 2%,
    # which a fixed tolerance of 2% passed; reruns nudged by 1e-6 drift by far less.
    write(project, "train.py", script("nn.GELU()", "SGD", 0.25))
    code, out, _ = verify(capsys, "train.py", "--steps", "2")
    assert code == 0 and "stopped after 2 steps as asked (--steps): the rest of the script was not run" in out
    code, out, _ = verify(capsys, "train.py", "--steps", "2", "--unsafe-fixes")
    assert code == 1
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("diverge: the loss differs by 0.0") and "at step 1" in verdict, verdict
    assert "3 reruns nudged by 1e-06" in verdict
    deviations = [float(cell.strip().rstrip("%")) for line in out.splitlines() if line.startswith("│")
                  for cell in line.split("│")[4:8:2]]
    assert deviations and max(deviations) < 2.0  # what a fixed 2% let through


BROKEN = """\
import sys
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
migrated = "accrewrite.runtime" in sys.modules
model = torch.nn.Linear(2, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.ones(4, 2).to(device)).sum()
    if step == 2 and "--nan" in sys.argv and (migrated or "--both" in sys.argv):
        loss = loss * float("{value}")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 1 and "--exit" in sys.argv:
        sys.exit(3)
    if step == 1 and "--raise" in sys.argv and migrated:
        raise RuntimeError("only the migrated side fails here")
if "--crash-at-the-end" in sys.argv and migrated:
    raise RuntimeError("generation failed after training")
"""


@pytest.mark.parametrize("value", ["nan", pytest.param("inf", marks=pytest.mark.slow)])
def test_a_non_finite_loss_is_a_divergence_naming_the_step_and_the_side(project, capsys, value):
    write(project, "broken.py", BROKEN.format(value=value))
    code, out, _ = verify(capsys, "broken.py", "--", "--nan")
    assert code == 1 and "diverge: the loss of runtime is not finite (NaN or inf) at step 3" in out
    code, out, _ = verify(capsys, "broken.py", "--", "--nan", "--both")
    assert code == 1 and "the loss of original and runtime are not finite (NaN or inf) at step 3" in out


@pytest.mark.slow
def test_an_original_that_exits_early_cannot_run_with_its_status(project, capsys):
    write(project, "broken.py", BROKEN.format(value="nan"))
    code, out, err = verify(capsys, "broken.py", "--", "--exit")
    assert code == 2 and "match" not in out
    assert "original cannot run: it exited with status 3 after 2 steps" in err


def test_a_migrated_side_that_raises_is_a_divergence_with_its_error(project, capsys):
    write(project, "broken.py", BROKEN.format(value="nan"))
    code, out, err = verify(capsys, "broken.py", "--", "--raise")
    assert code == 1
    assert "diverge: runtime exited with status 1 after 2 steps, where original made 5 steps" in out
    assert "RuntimeError: only the migrated side fails here" in err


@pytest.mark.slow
def test_a_crash_after_the_last_step_fails_and_steps_say_what_was_not_run(project, capsys):
    write(project, "broken.py", BROKEN.format(value="nan"))
    code, out, err = verify(capsys, "broken.py", "--", "--crash-at-the-end")
    assert code == 1 and "runtime exited with status 1 after 5 steps" in out
    assert "generation failed after training" in err
    code, out, _ = verify(capsys, "broken.py", "--steps", "3", "--", "--crash-at-the-end")
    assert code == 0 and "the rest of the script was not run" in out


@pytest.mark.parametrize("option, value", [("--rtol", "nan"), ("--rtol", "-1"), ("--rtol", "inf"), ("--steps", "0"),
                                           ("--timeout", "-1"), ("--nproc", "0"), ("--steps", "x")])
def test_argument_values_are_validated(project, capsys, option, value):
    with pytest.raises(SystemExit) as exit:
        main(["verify", "train.py", option, value])
    assert exit.value.code == 2
    assert option in capsys.readouterr().err


@pytest.mark.slow
def test_a_missing_script_or_target_package_is_said_before_anything_runs(project, capsys, tmp_path):
    code, _, err = verify(capsys, "nowhere.py")
    assert code == 2 and "nowhere.py: no such file" in err
    write(project, "train.py", script())
    code, out, err = verify(capsys, "train.py", "--target", "torch_xla", "--python", f"torch_xla={sys.executable}")
    if code == 0:
        pytest.skip("this interpreter has torch_xla")
    assert code == 2 and "original:" not in err and "workspace:" not in err  # nothing ran
    assert f"torch_xla: {sys.executable} cannot import torch_xla (ModuleNotFoundError" in err
    assert "--python torch_xla=PATH" in err
    code, _, err = verify(capsys, "train.py", "--python", "original=/no/such/python")
    assert code == 2 and "original: no interpreter at /no/such/python" in err
    code, _, err = verify(capsys, "train.py", "--python", "tpu=/usr/bin/python3")
    assert code == 2 and "no side 'tpu'" in err


# What an interpreter answered on its last line of output: nothing failed to import.
PRINTING_SITECUSTOMIZE = """\
import atexit, sys
print("site: start")
print("site: start", file=sys.stderr)
atexit.register(lambda: print("{}"))
atexit.register(lambda: print("site: exit", file=sys.stderr))
"""


@pytest.mark.slow
def test_an_environment_that_prints_at_start_and_exit_is_not_read_as_an_answer(project, capsys, tmp_path,
                                                                                 monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    write(site, "sitecustomize.py", PRINTING_SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    printed = subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True)
    assert printed.stdout.splitlines() == ["site: start", "{}"]  # the test's premise
    assert preflight.problems([("original", None, sys.executable)]) == []
    failed = preflight.failed_imports(sys.executable, ["torch", "no_such_module"])
    assert list(failed) == ["no_such_module"] and failed["no_such_module"].startswith("ModuleNotFoundError")
    write(project, "train.py", script())
    code, out, err = verify(capsys, "train.py", "--", "--steps", "3")
    assert code == 0, out + err
    assert "match: 3 steps within their tolerances" in out


@pytest.mark.slow
def test_nudged_reruns_move_parameters_by_one_part_in_a_million_each_its_own_way(project):
    write(project, "train.py", script())
    runs = {}
    for nudge in ("0", "1", "2"):
        env = {**os.environ, probe.NUDGE: nudge, probe.RECORDS: str(project / f"records{nudge}"), probe.STEPS: "4",
               "PYTHONPATH": str(Path(probe.__file__).with_name("hooks"))}
        subprocess.run([sys.executable, "train.py"], env=env, check=True, capture_output=True)
        runs[nudge] = read_records(project / f"records{nudge}")[0][0]
    plain = runs["0"]
    assert len(plain) == 4 and plain[0]["loss"] != runs["1"][0]["loss"]  # nudged before the first forward
    assert runs["1"] != runs["2"]  # each seed nudges its own way
    for nudged in (runs["1"], runs["2"]):
        for a, b in zip(plain, nudged):
            assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"])
            assert abs(a["checksum"] - b["checksum"]) <= 1e-4 * a["change"]


def side(name, steps, rank=0):
    # Checksums of changes whose norm is the checksum itself: deviations relative to it.
    return Side(name, records={rank: [{"step": i + 1, "loss": loss, "checksum": total, "change": total}
                                      for i, (loss, total) in enumerate(steps)]})


def test_each_step_is_held_to_ten_times_what_the_nudged_reruns_drift_there():
    ours = side("original", [(1.0, 0.5), (0.9, 0.6), (0.8, 0.7)])
    theirs = side("torch_xla", [(1.0, 0.5), (0.9, 0.6), (0.7, 0.7)])  # 12.5% at step 3
    calm = side("original-nudged-1", [(1.0, 0.5), (0.9, 0.6), (0.799, 0.7)])  # this nudge alone: 0.13%
    chaotic = side("original-nudged-2", [(1.0, 0.5), (0.9, 0.6), (0.785, 0.7)])  # this one: 1.9%
    found = compare(ours, theirs, (calm, chaotic), rtol=None)
    assert found.over is None and found.rows[2].tolerances[0] == pytest.approx(0.1875)
    assert found.chaotic_from is None  # 1.9% is sensitive, not chaotic
    assert compare(ours, theirs, (side("original-nudged-3", [(1.0, 0.5), (0.7, 0.6), (0.8, 0.7)]),),
                   rtol=None).chaotic_from == 2
    assert found.rows[0].tolerances == (ROUNDING, ROUNDING)  # no drift there: rounding alone
    found = compare(ours, theirs, (calm,), rtol=None)
    assert found.over[:3] == (3, 0, "loss") and found.over[4] == pytest.approx(0.0125)
    assert compare(ours, theirs, (calm, chaotic), rtol=0.02).over[:3] == (3, 0, "loss")  # --rtol caps it
    checksums = side("runtime", [(1.0, 0.5), (0.9, 0.66), (0.8, 0.7)])
    assert compare(ours, checksums, (calm,), rtol=None).over[:3] == (2, 0, "checksum")


def test_a_nan_is_beyond_every_tolerance():
    ours = side("original", [(1.0, 0.5)])
    assert compare(ours, side("runtime", [(float("nan"), 0.5)]), (), rtol=None).over is not None
    assert tolerance(None, None) == ROUNDING and tolerance(0.5, 0.02) == 0.02


def test_what_a_side_needs_of_its_target_comes_from_the_profiles_verify_table(tmp_path, monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    xla = environment(Side("torch_xla", "torch_xla"), tmp_path, None, 1)
    assert xla["PJRT_DEVICE"] == "CPU" and xla[probe.HOST_RANDOM] == "xla"
    assert xla[probe.EXECUTIONS] == "torch_xla.debug.metrics:CompileTime:ExecuteTime:TransferFromDeviceTime"
    assert xla[probe.DEVICE_WAIT] == "torch_xla.core.xla_model:wait_device_ops"
    assert xla[probe.ANALYSIS_FILE] == "PT_XLA_DEBUG_FILE" and xla["PT_XLA_DEBUG_LEVEL"] == "1"
    assert xla[probe.PACED_LOADER] == "torch_xla.distributed.parallel_loader:ParallelLoader"
    assert xla[probe.DEVICE_FINDERS] == "lightning.fabric.accelerators.xla:XLAAccelerator"
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert environment(Side("torch_xla", "torch_xla"), tmp_path, None, 1)["PJRT_DEVICE"] == "TPU"  # the user's
    plain = environment(Side("runtime", "runtime"), tmp_path, None, 1)
    assert probe.HOST_RANDOM not in plain and probe.EXECUTIONS not in plain and probe.PACED_LOADER not in plain
    assert probe.DEVICE_WAIT not in plain and probe.ANALYSIS_FILE not in plain
    assert probe.DEVICE_FINDERS not in plain


def test_the_probe_counts_graphs_through_the_targets_metrics_once_the_script_imports_its_package(
        monkeypatch, tmp_path):
    counts = {"Compiled": (3, 0.5), "Executed": (7, 1.5), "Moved": (2, 0.1)}
    waits = []
    metrics = types.ModuleType("vendor.metrics")
    metrics.metric_data = counts.get
    metrics.wait = lambda: waits.append(True)
    monkeypatch.setenv(probe.EXECUTIONS, "vendor.metrics:Compiled:Executed:Moved")
    monkeypatch.setenv(probe.DEVICE_WAIT, "vendor.metrics:wait")
    monkeypatch.setitem(sys.modules, "vendor.metrics", metrics)
    graphs = probe.Graphs.from_environment(str(tmp_path))
    assert graphs.before_reads() is None  # the script has not imported vendor: nothing is asked of it
    assert not waits
    monkeypatch.setitem(sys.modules, "vendor", types.ModuleType("vendor"))
    own = {"compiles": 0, "executions": 0, "transfers": 0}
    assert graphs.before_reads() == {"compiles": 3, "executions": 7, "transfers": 2, "probe": own}
    counts.update({"Compiled": (4, 0.6), "Executed": (9, 1.6), "Moved": (4, 0.2)})  # the probe's reads
    graphs.after_reads()
    counts.update({"Executed": (10, 1.7), "Moved": (5, 0.3)})  # the script's next step
    assert graphs.before_reads() == {"compiles": 3, "executions": 8, "transfers": 3,
                                     "probe": {"compiles": 1, "executions": 2, "transfers": 2}}
    assert len(waits) == 3  # before and after the reads: the target counts an execution when it has run


# torch_xla 2.9's debug analysis (PT_XLA_DEBUG_LEVEL=1) of two compilations, as written to PT_XLA_DEBUG_FILE.
ANALYSIS = """
Compilation Analysis: ================================================================================
Compilation Analysis: Compilation Cause
Compilation Analysis:   user torch_xla.sync
Compilation Analysis: Graph Info: 
Compilation Analysis:   Graph Hash: 1f0199c167bc150ca2f6028ea5c65ede
Compilation Analysis:   Number of Graph Inputs: 6
Compilation Analysis:   Number of Graph Outputs: 8
Compilation Analysis: Python Frame Triggered Execution: 
Compilation Analysis:   sync (/venv/lib/python3.11/site-packages/torch_xla/torch_xla.py:87)
Compilation Analysis:   mark_step (/venv/lib/python3.11/site-packages/torch_xla/core/xla_model.py:1032)
Compilation Analysis:   <module> (/work/train.py:33)
Compilation Analysis: --------------------------------------------------------------------------------
Compilation Analysis: ================================================================================

Computation hash: 6af663d32048f7a5061bfcef1c7e2c8a

Post Compilation Analysis: ================================================================================
Post Compilation Analysis: Graph input size: 0.000001 GB
Post Compilation Analysis: --------------------------------------------------------------------------------

Compilation Analysis: ================================================================================
Compilation Analysis: Compilation Cause
Compilation Analysis:   most likely user code trying to access tensor value before torch_xla.sync
Compilation Analysis: Python Frame Triggered Execution: 
Compilation Analysis:   __torch_function__ (/work/accrewrite/verify/probe.py:365)
Compilation Analysis:   step (/work/train.py:20)
Compilation Analysis:   <module> (/work/train.py:40)
Compilation Analysis: --------------------------------------------------------------------------------
"""


# The HLO of a step's graph (XLA_IR_DEBUG, XLA_HLO_DEBUG): each operation with the line that made it.
HLO = """\
HloModule IrToHlo.48, entry_computation_layout={(f32[40,4]{1,0})->(f32[2,4]{1,0})}

ENTRY %IrToHlo.48 (p4.7: f32[40,4]) -> (f32[2,4]) {
  %p4.7 = f32[40,4]{1,0} parameter(4), metadata={op_type="xla__device_data" source_file="/w/train.py" source_line=5}
  %slice.8 = f32[8,4]{1,0} slice(f32[40,4]{1,0} %p4.7), slice={[0:8], [0:4]}, metadata={op_type="xla__select" \
op_name="xla__select" source_file="/w/train.py" source_line=7}
  %tanh.9 = f32[8,4]{1,0} tanh(f32[8,4]{1,0} %slice.8), metadata={op_type="aten__tanh" source_file="/w/train.py" \
source_line=8}
  %transpose.29 = f32[4,8]{0,1} transpose(f32[8,4]{1,0} %tanh.9), dimensions={1,0}, metadata={op_type="aten__permute" \
op_name="aten__permute.3" source_file="/venv/torch/nn/modules/linear.py" source_line=134}
}
"""


def test_where_a_steps_graph_differs_from_the_previous_steps_the_lines_that_made_it_are_named(monkeypatch):
    printed, hashed = {}, {}
    functions = types.ModuleType("vendor_graphs")
    functions.hash, functions.text = (lambda tensors: hashed["now"]), (lambda tensors: printed["now"])
    monkeypatch.setitem(sys.modules, "vendor_graphs", functions)
    monkeypatch.setattr(probe, "_LIBRARIES", ("/venv/",))
    graphs = probe.Graphs("vendor.metrics", [], "", "", "vendor_graphs:hash,vendor_graphs:text")
    graphs.total = {}  # as before_reads leaves it once the script has imported the package

    def step(key, text):
        hashed["now"], printed["now"] = key, text
        return graphs.changed(["parameter"])

    assert step(1, HLO) == []  # the first graph: nothing to compare with
    assert step(1, "not printed again: the same hash") == []
    # The slice at another offset, the numbers in names and the metadata's op names differ:
    # only the slice's line changed the graph; the tanh of its result is no new operation.
    moved = HLO.replace("[0:8]", "[1:9]").replace(".29", ".31").replace("aten__permute.3", "aten__permute.5")
    assert step(2, moved) == ["/w/train.py:7"]
    grown = moved.replace("[1:9]", "[1:10]").replace("f32[8,4]", "f32[9,4]").replace("f32[4,8]", "f32[4,9]")
    assert step(3, grown) == ["/w/train.py:7", "/w/train.py:8"]  # in the graph's order; linear.py's is a library's


def test_a_call_the_host_random_mode_passes_through_is_made_from_its_callers_line():
    # What records the Python frame that made an operation (XLA_IR_DEBUG) sees the script's line,
    # not the mode's: the mode's handler is the frame between.
    def handler(func):
        return probe._pass(func, (), {})

    made = handler(lambda: sys._getframe(1))  # the frame that called func
    line = inspect.currentframe().f_lineno - 1
    assert (made.f_code.co_filename, made.f_lineno) == (__file__, line)
    assert handler(lambda: sys._getframe(1)).f_code is not made.f_code  # another line, another function


def test_the_script_line_that_ran_each_compiled_graph_is_read_from_the_targets_debug_analysis():
    # Frames innermost first: the first outside the interpreter's libraries and accrewrite's own.
    libraries = ("/venv/lib/python3.11/", "/work/accrewrite/")
    assert probe.compilation_sites(ANALYSIS, libraries) == ["/work/train.py:33", "/work/train.py:20"]
    assert probe.compilation_sites(ANALYSIS, ("/venv/", "/work/")) == ["/work/train.py:33", "/work/train.py:40"]
    assert probe.compilation_sites(ANALYSIS[:ANALYSIS.index("Post")], libraries) == ["/work/train.py:33"]


def test_the_probe_reads_the_analysis_of_the_scripts_compilations_and_skips_its_own(monkeypatch, tmp_path):
    counts = {"Compiled": (1, 0.1), "Executed": (1, 0.1)}
    metrics = types.ModuleType("vendor.metrics")
    metrics.metric_data = counts.get
    for name, module in (("vendor", types.ModuleType("vendor")), ("vendor.metrics", metrics)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv(probe.EXECUTIONS, "vendor.metrics:Compiled:Executed")
    monkeypatch.setenv(probe.ANALYSIS_FILE, "VENDOR_DEBUG_FILE")
    monkeypatch.setenv("VENDOR_DEBUG_FILE", "")  # removed after the test, once the probe has set it
    graphs = probe.Graphs.from_environment(str(tmp_path))
    analysis = Path(os.environ["VENDOR_DEBUG_FILE"])  # set for the target to read: a file of the probe's
    assert analysis.parent == tmp_path and str(os.getpid()) in analysis.name
    assert graphs.before_reads()["compiled_at"] == []  # nothing compiled: no file yet
    first, second = ANALYSIS.split("\nComputation hash")
    script = first.replace("/venv/", sysconfig.get_paths()["purelib"] + "/")
    analysis.write_text(script)
    assert graphs.before_reads()["compiled_at"] == ["/work/train.py:33"]
    with analysis.open("a") as more:
        more.write(second)  # compiled by the probe's own reads
    graphs.after_reads()
    with analysis.open("a") as more:
        more.write(script)
    assert graphs.before_reads()["compiled_at"] == ["/work/train.py:33"]


READ_AHEAD = """\
import queue, threading


class ReadAhead:
    \"\"\"A device loader shaped as torch_xla's ParallelLoader: a thread reads the loader it wraps
    ahead of the loop and hands over device_prefetch_size batches at a time.\"\"\"

    def __init__(self, cpu_loader, devices, batchdim=0, device_prefetch_size=8):
        self.cpu_loader = cpu_loader
        self.batches = queue.Queue()
        self.thread = threading.Thread(target=self.read, args=(device_prefetch_size,), daemon=True)
        self.thread.start()

    def read(self, size):
        chunk = []
        for batch in self.cpu_loader:
            chunk.append(batch)
            if len(chunk) == size:
                chunk = [self.batches.put(b) for b in chunk] and []
        for batch in [*chunk, None]:
            self.batches.put(batch)

    def next_item(self, device):
        return self.batches.get()

    def close(self):
        self.thread.join()
"""


def noise(batch):
    """A batch drawn from the global generator as it loads, as a random augmentation is."""
    import torch

    return torch.rand(len(batch))


def noise_loader(torch, **options):
    return torch.utils.data.DataLoader([None] * 6, batch_size=2, collate_fn=noise, **options)


def draws_in_order(torch, batches):
    """Each batch's draws, then the loop's own draw, step by step, from a seeded generator."""
    torch.manual_seed(0)
    return [batch.tolist() + torch.rand(1).tolist() for batch in batches()]


def through(loader_class, loader):
    def batches():
        device_loader = loader_class(loader, ["cpu"])
        while (batch := device_loader.next_item("cpu")) is not None:
            yield batch
    return batches


@pytest.mark.timeout(60)  # a loader that waits for a loop that waits for it hangs
def test_a_paced_device_loader_loads_each_batch_when_the_loop_asks_for_it(tmp_path, monkeypatch):
    import torch

    loader = noise_loader(torch)
    plain = draws_in_order(torch, lambda: iter(loader))
    unpaced = {}
    exec(READ_AHEAD, unpaced)
    assert draws_in_order(torch, through(unpaced["ReadAhead"], loader)) != plain  # it read every batch before the loop drew
    (tmp_path / "vendor_loader.py").write_text(READ_AHEAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "vendor_loader", raising=False)
    probe._when_imported("vendor_loader:ReadAhead", lambda loader: probe.pace_loader(torch, loader))
    from vendor_loader import ReadAhead  # paced as the script imports it

    assert draws_in_order(torch, through(ReadAhead, loader)) == plain
    waiting = ReadAhead(loader, ["cpu"])
    waiting.next_item("cpu")
    closing = threading.Thread(target=waiting.close)
    closing.start()
    closing.join(10)
    assert not closing.is_alive()  # its thread waited for a loop that asks no more
    with_workers = noise_loader(torch, num_workers=1)
    assert ReadAhead(with_workers, ["cpu"]).cpu_loader is with_workers  # its workers draw from their own generators


# An accelerator class that looks for its hardware itself, as Lightning's XLAAccelerator does.
HARDWARE_ACCELERATOR = """
import functools


class ChipAccelerator:
    @staticmethod
    @functools.lru_cache(maxsize=1)
    def auto_device_count():
        return 0  # no chip on this host

    @staticmethod
    def is_available():
        return ChipAccelerator.auto_device_count() > 0


class Subclass(ChipAccelerator):
    pass
"""


def test_a_device_finder_finds_the_one_device_of_the_side_once_the_script_imports_it(tmp_path, monkeypatch):
    (tmp_path / "vendor_chips.py").write_text(HARDWARE_ACCELERATOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "vendor_chips", raising=False)
    probe._when_imported("vendor_chips:ChipAccelerator", probe.find_one_device)
    from vendor_chips import ChipAccelerator, Subclass

    assert ChipAccelerator.is_available() and ChipAccelerator.auto_device_count() == 1
    assert Subclass.is_available() and Subclass.auto_device_count() == 1  # the framework's subclass too


def graphs(*steps, probe_executions=3):
    """A torch_xla side's records, each step's counts so far given as (compiles, executions,
    transfers[, compiled_at[, changed_at]])."""
    def record(i, compiles, executions, transfers, compiled_at=(), changed_at=()):
        return {"step": i + 1, "graphs": {
            "compiles": compiles, "executions": executions, "transfers": transfers, "compiled_at": [*compiled_at],
            "changed_at": [*changed_at], "probe": {"compiles": 1, "executions": probe_executions * (i + 1),
                                                   "transfers": 0}}}

    return Side("torch_xla", "torch_xla", records={0: [record(i, *counts) for i, counts in enumerate(steps)]})


def test_the_profile_counts_each_step_up_to_the_next_optimizer_step_after_warm_up():
    # The graph that ends step N runs after its optimizer step: it is in step N+1's record.
    side = graphs((0, 0, 0), (1, 1, 1), (2, 2, 2), (2, 3, 3), (2, 4, 4), (2, 5, 5))
    summary, problem = check_graphs(side, "xla")
    assert summary == ("torch_xla: 5 graph executions on the xla device and 2 compilations, verify's own reads not "
                       "counted; per step after warm-up (steps 3-5): 1 graph execution, 1 host transfer; "
                       "0 compilations after warm-up")
    assert problem is None
    found = profile.profile(side.records[0])
    assert (found.steps, found.executions, found.compiles, found.transfers) == ([3, 4, 5], [1, 1, 1], [0, 0, 0],
                                                                                [1, 1, 1])
    uneven = graphs((0, 0, 0), (1, 2, 0), (2, 4, 0), (2, 7, 0), (2, 9, 0))
    assert profile.profile(uneven.records[0]).executions == [3, 2]
    assert check_graphs(graphs((0, 0, 0), (1, 1, 1), (2, 2, 2)), "xla")[0].endswith(
        "no step after warm-up to profile (the graphs of a step are counted up to the next step's optimizer step: "
        "--steps 4 at least)")


def test_a_compilation_after_warm_up_names_the_lines_that_changed_and_ran_it_and_one_in_every_step_fails():
    # Step 5's graph, as the probe saw it before its sync (in step 5's record), differs from step
    # 4's at train.py:17; its sync (counted up to step 6's record) at train.py:31 compiled it.
    late = graphs((0, 0, 0), (1, 1, 0), (2, 2, 0), (2, 3, 0), (2, 4, 0, [], ["/w/train.py:17", "/w/train.py:18"]),
                  (3, 5, 0, ["/w/train.py:31"]), (3, 6, 0))
    summary, problem = check_graphs(late, "xla", lambda site: site.replace("/w/", ""))
    assert summary.endswith("per step after warm-up (steps 3-6): 1 graph execution, 0 host transfers; "
                            "1 compilation after warm-up: train.py:17 changed the step's graph, train.py:31 ran it "
                            "(step 5)")
    assert problem is None
    ran = ["/w/train.py:31"]
    every = graphs((0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 3, 0, ran), (4, 4, 0, ran), (5, 5, 0, ran))
    assert check_graphs(every, "xla")[1] == (
        "torch_xla compiles a new graph in every step after warm-up (3 in 3 steps: /w/train.py:31 ran it "
        "(steps 3, 4, 5)): a shape or a Python number in the step's graph changes from step to step, and each new "
        "graph is compiled again")
    # In warm-up, a compilation per step is the graphs settling, not a fault.
    assert check_graphs(graphs((0, 0, 0), (1, 1, 0), (2, 2, 0), (2, 3, 0)), "xla")[1] is None


def test_a_side_that_ran_no_graph_fails_and_the_probes_reads_count_as_graphs_ran():
    assert check_graphs(graphs((0, 0, 0), (0, 0, 0), probe_executions=0), "xla")[1] == (
        "torch_xla ran no graph on the xla device: it trained on the CPU")
    assert check_graphs(graphs((0, 0, 0), (0, 0, 0)), "xla")[1] is None  # the script's graphs ran in the probe's reads


def test_records_are_kept_per_rank_and_process_and_a_rank_held_twice_at_once_is_a_collision(tmp_path):
    def record(step, time):
        return json.dumps({"step": step, "loss": 2.0, "checksum": 0.1, "change": 0.3, "time": time}) + "\n"

    (tmp_path / "rank0.11.jsonl").write_text(record(1, 10) + record(2, 11) + '{"step": 3')  # a torn line waits
    (tmp_path / "rank1.12.jsonl").write_text(record(1, 10) + '{"stopped": 1}\n')
    records, stopped, collisions = read_records(tmp_path)
    assert [r["step"] for r in records[0]] == [1, 2] and len(records[1]) == 1 and stopped and not collisions
    (tmp_path / "rank1.13.jsonl").write_text(record(1, 20) + record(2, 21))  # rank 1 again, later: a second demo
    records, _, collisions = read_records(tmp_path)
    assert [r["time"] for r in records[1]] == [10, 20, 21] and not collisions
    (tmp_path / "rank0.14.jsonl").write_text(record(1, 10.5))  # rank 0 twice at once
    assert read_records(tmp_path)[2] == {0: [11, 14]}
    # Born while rank 0's first holder trained, though its first step came after that one's last.
    (tmp_path / "rank0.14.jsonl").write_text('{"born": 10.9}\n' + record(1, 30))
    assert read_records(tmp_path)[2] == {0: [11, 14]}
    (tmp_path / "rank0.14.jsonl").write_text('{"born": 11.5}\n' + record(1, 30))  # born after: a second demo
    assert not read_records(tmp_path)[2]


FORKED = """\
import os
import time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, init):
    if init:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.2)  # the two processes train at the same time
    if init:
        dist.destroy_process_group()


if __name__ == "__main__":
    init = os.environ.get("INIT") == "1"
    context = mp.get_context(os.environ["START"])  # spawn: new interpreters, as mp.spawn starts
    processes = [context.Process(target=train, args=(rank, init)) for rank in range(2)]
    [p.start() for p in processes]
    [p.join() for p in processes]
    assert all(p.exitcode == 0 for p in processes)
"""


@pytest.mark.slow
def test_processes_the_script_starts_are_recorded_by_their_real_rank(project, capsys, monkeypatch):
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    write(project, "forked.py", FORKED.format(port=port))
    monkeypatch.setenv("INIT", "1")
    monkeypatch.setenv("START", "spawn")
    code, out, err = verify(capsys, "forked.py", "--compare", "original,runtime")
    assert code == 0, out + err
    assert "rank 0" in out and "match: 3 steps" in out
    monkeypatch.setenv("INIT", "0")  # two processes train without a rank: both claim rank 0
    monkeypatch.setenv("START", "fork")
    code, out, err = verify(capsys, "forked.py")
    assert code == 2 and "2 of its processes recorded steps as rank 0" in err


@pytest.mark.launches_ranks
def test_two_processes_compare_rank_by_rank_and_a_killed_rank_fails(project, capsys):
    write(project, "ddp.py", textwrap.dedent("""\
        import os, signal, sys
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank = dist.get_rank()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 1).to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(5):
            torch.manual_seed(100 * rank + step)
            x = torch.randn(8, 4).to(device)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step == 2 and rank == 1 and "--kill" in sys.argv and "accrewrite.runtime" in sys.modules:
                os.kill(os.getpid(), signal.SIGKILL)
        dist.destroy_process_group()
        """))
    code, out, err = verify(capsys, "ddp.py", "--steps", "4", "--nproc", "2")
    assert code == 0, out + err
    assert "rank 0" in out and "match: 4 steps" in out
    code, out, err = verify(capsys, "ddp.py", "--nproc", "2", "--", "--kill")
    assert code == 1 and "diverge: runtime exited with status 1" in out, out + err


@pytest.mark.launches_ranks
@pytest.mark.xla
def test_nproc_runs_under_an_interpreter_without_accrewrite(project, capsys, xla_python):
    # The torch_xla venv has torch but not accrewrite: torchrun itself launches the ranks.
    write(project, "ddp.py", textwrap.dedent("""\
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            loss = model(torch.ones(8, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        dist.destroy_process_group()
        """))
    code, out, err = verify(capsys, "ddp.py", "--nproc", "2", "--python", f"original={xla_python}")
    assert code == 0, out + err
    assert "match: 3 steps" in out


@pytest.mark.xla
def test_dropout_on_the_xla_device_draws_what_the_cpu_draws(project, capsys, xla_python):
    write(project, "train.py", script("nn.Dropout(0.3), nn.ReLU()"))
    code, out, err = verify(capsys, "train.py", "--compare", "original,torch_xla", "--python",
                            f"torch_xla={xla_python}", "--", "--steps", "4")
    assert code == 0, out + err
    assert "match: 4 steps" in out and "graph executions on the xla device" in out


# The loop of ``script()`` on batches sliced out of a tensor on the device at the step's offset.
# The tensor is also read whole, so the migration keeps it on the device (ACC029 would keep a
# corpus read only in slices on the host).
SLICE = "    batch = corpus[3 * step:3 * step + 8]"
SLICED = script().replace("for step, (x, y) in enumerate(loader):\n    x, y = x.to(device), y.to(device)\n",
                          "corpus = torch.randn(200, 9).to(device)\ncenter = corpus.mean(0)\n"
                          f"for step in range(args.steps):\n{SLICE}\n    x, y = batch[:, :8], batch[:, 8:]\n")


@pytest.mark.xla
def test_a_migrated_step_runs_one_graph_per_step_and_compiles_nothing_after_warm_up(project, capsys, xla_python):
    write(project, "train.py", script())
    code, out, err = verify(capsys, "train.py", "--compare", "original,torch_xla", "--python",
                            f"torch_xla={xla_python}", "--", "--steps", "6")
    assert code == 0, out + err
    # Its loss.item() moves to a step closure, which reads the loss once the step's graph has run.
    assert "per step after warm-up (steps 3-5): 1 graph execution, 1 host transfer; 0 compilations after warm-up" \
        in out, out


@pytest.mark.xla
def test_a_batch_sliced_at_a_python_offset_compiles_every_step_and_names_the_slice(project, capsys, xla_python):
    write(project, "train.py", SLICED)
    code, out, err = verify(capsys, "train.py", "--compare", "original,torch_xla", "--python",
                            f"torch_xla={xla_python}", "--", "--steps", "6")
    assert code == 1, out + err
    assert ("per step after warm-up (steps 3-5): 1 graph execution, 1 host transfer; 3 compilations after warm-up: "
            in out), out
    sliced = SLICED.splitlines().index(SLICE) + 1
    assert (f"diverge: torch_xla compiles a new graph in every step after warm-up (3 in 3 steps: train.py:{sliced} "
            "changed the step's graph, line " in out), out
    assert "of the migrated train.py (`torch_xla.sync()`) ran it (steps 3, 4, 5)" in out, out


AUGMENTED = """\
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F


class Jittered(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if "--draw-more" in sys.argv and "torch_xla" in sys.modules:
            torch.rand(1)
        return self.x[i] + 0.1 * torch.randn(self.x[i].shape), self.y[i]


device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 1)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
loader = torch.utils.data.DataLoader(Jittered(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
for step, (x, y) in enumerate(loader):
    x, y = x.to(device), y.to(device)
    mix = torch.rand(x.size(0), 1).to(device)
    loss = F.mse_loss(model(mix * x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 3:
        break
"""


@pytest.mark.xla
@pytest.mark.parametrize("draw_more", [False, True])
def test_random_augmentations_draw_between_the_loops_draws_on_xla_as_in_the_original(project, capsys, xla_python,
                                                                                     draw_more):
    # torch_xla's device loader reads ahead of the loop on a thread; verify holds it to the loop's
    # pace, and a dataset that draws differently on the migrated side still diverges.
    write(project, "train.py", AUGMENTED)
    code, out, err = verify(capsys, "train.py", "--compare", "original,torch_xla", "--python",
                            f"torch_xla={xla_python}", "--", *(["--draw-more"] if draw_more else []))
    if draw_more:
        assert code == 1 and "diverge: the loss differs by" in out and "at step 1" in out, out + err
    else:
        assert code == 0 and "match: 4 steps" in out, out + err


HOST_RANDOM_CHECK = """\
import contextlib, sys
import torch, torch_xla
sys.path.insert(0, sys.argv[1])
import probe

F = torch.nn.functional


def draws(device, host_random):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5).to(device)
    layer = torch.nn.Linear(5, 3).to(device)
    with probe.host_random(torch, "xla") if host_random else contextlib.nullcontext():
        torch.nn.init.normal_(layer.weight, 0.0, 0.02)
        torch.nn.init.kaiming_uniform_(tensor=layer.bias.unsqueeze(0), a=1)
        out = [F.dropout(x, 0.3, training=True), F.dropout2d(x, 0.5), torch.nn.Dropout(0.2)(x),
               torch.randn(2, 3, device=device), torch.randn_like(x), torch.empty(7, device=device).normal_(),
               torch.randint(0, 9, (5,), device=device), torch.multinomial(torch.tensor([0.2, 0.8], device=device), 4, True),
               layer.weight, layer.bias, x * 2]
        return [t.detach().cpu() for t in out]


def attention(device, host_random):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 4).to(device) for _ in range(3))
    with probe.host_random(torch, "xla") if host_random else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True).cpu()


cpu, xla = draws("cpu", False), draws(torch_xla.device(), True)
print([torch.equal(a, b) for a, b in zip(cpu, xla)])
print(torch.allclose(attention("cpu", False), attention(torch_xla.device(), True), atol=1e-5))
"""




@pytest.mark.parametrize("form", ["causal", "scale", "gqa", "bool-mask", "float-mask"])
def test_attention_with_dropout_draws_its_mask_as_the_cpus_attention_does(form, monkeypatch):
    # On the CPU itself, host_random's form of attention gives what torch's does with the same seed:
    # the same mask and the same sums (GPT-2's attention dropout, in transformers' sdpa).
    torch = pytest.importorskip("torch")
    options = {"causal": {"is_causal": True}, "scale": {"scale": 0.3}, "gqa": {"enable_gqa": True},
               "bool-mask": {"attn_mask": torch.ones(5, 5, dtype=torch.bool).triu()},
               "float-mask": {"attn_mask": torch.randn(5, 5)}}[form]
    query, key, value = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    if not options.get("enable_gqa"):
        key, value = key.repeat(1, 2, 1, 1), value.repeat(1, 2, 1, 1)
    F = torch.nn.functional

    def attention():
        torch.manual_seed(1)
        return F.scaled_dot_product_attention(query, key, value, dropout_p=0.3, **options)

    expected = attention()
    mode, masks = probe.host_random(torch, "cpu"), []
    dropout = F.dropout
    monkeypatch.setattr(F, "dropout", lambda *args, **kwargs: masks.append(args[0].shape) or dropout(*args, **kwargs))
    with mode:
        assert torch.allclose(attention(), expected, atol=1e-6)
    assert masks == [(2, 4, 5, 5)]  # the mask of the weights' shape, drawn on the CPU


@pytest.mark.xla
def test_the_xla_device_draws_what_the_cpu_draws_under_host_random(tmp_path, xla_python):
    (tmp_path / "check.py").write_text(HOST_RANDOM_CHECK)
    done = subprocess.run([xla_python, "check.py", str(Path(probe.__file__).parent)], cwd=tmp_path,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-3:-1] == [str([True] * 11), "True"]


@pytest.mark.slow
def test_a_side_that_cannot_run_says_why_unwrapped(project):
    write(project, "train.py", "import torch\nraise SystemExit('needs a dataset at /data/imagenet ' + 'x' * 120)\n")
    done = subprocess.run([sys.executable, "-m", "accrewrite.cli", "verify", "train.py"], capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert done.returncode == 2
    assert "original cannot run: it exited with status 1 after 0 steps" in done.stderr
    assert "needs a dataset at /data/imagenet " + "x" * 120 in done.stderr  # one line, however long
