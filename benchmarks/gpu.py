"""Everything one CUDA GPU can tell about accrewrite, in one command (under 8 minutes).

    python benchmarks/gpu.py OUTDIR [--dry-run] [--budget-scale X]

Parts, most valuable first; each runs in a process group of its own under a time budget in
seconds (scaled by ``--budget-scale``): a part that outruns it is stopped and reported "timed
out" with what it had saved, and the next part starts.

1. tests: ``pytest tests/kernels`` on the GPU (no Triton interpreter; the slow tier included) and
   the runtime's tests that the CPU skips or runs another way (``RUNTIME_CUDA_TESTS``), every
   test's outcome read from pytest's JUnit XML;
2. kernels: every case of ``benchmarks/kernel_cases`` (fp32 and bf16, transformer and Swin
   shapes), one forward + backward (or optimizer step) of ours against eager PyTorch,
   ``torch.compile`` and the other baselines a case names (Liger-Kernel's layer norm where
   ``liger_kernel`` is importable), with ``kernels.py``'s measure: median time from CUDA
   events, peak memory;
3. train_step: ``benchmarks/train_step.py --device cuda``, eager vs torch.compile vs
   ``accrewrite.runtime.compile``, first step (cold start) and steady step, its table as printed;
4. verify: ``accrewrite verify`` of two bundled examples, the original on CUDA against the
   runtime target;
5. memory: peak ``torch.cuda.max_memory_allocated`` of a training step with ``auto_checkpoint``
   (``checkpoint_memory.py``'s GPT: every block, selective and full, and a budget) and with
   FSDP2 over one process (``fsdp_memory.py``'s GPT, accrewrite's sharding on a 1-rank mesh).

OUTDIR receives report.md, report.json and logs.tar.gz (each part's log, its saved results,
the JUnit files), rewritten after every part, so a run stopped anywhere keeps what it measured;
no other file is written there. Prerequisites (a visible CUDA GPU, torch built with CUDA,
triton) are checked first; what is missing is said in one line and the exit code is 2.
``--dry-run`` runs the same plan with tiny sizes and budgets (on the CPU the CUDA-only parts are
reported "skipped: no CUDA"). Exit code 0 when every part that ran is ok, else 1.

Optional comparison packages (liger_kernel, torchvision) are used where installed, never
installed here.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import functools
import importlib.util
import itertools
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

BENCHMARKS = pathlib.Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
sys.path.insert(0, str(BENCHMARKS))  # its sibling benchmark modules (benchmarks/ is no package)


@dataclass(frozen=True)
class Part:
    name: str
    title: str
    budget: float  # seconds on the GPU
    dry_budget: float  # seconds in a dry run
    cuda_only: bool


PARTS = [
    Part("tests", "CUDA tests the CPU skips", 100, 20, True),
    Part("kernels", "Triton kernels vs eager and torch.compile", 110, 20, True),
    Part("train_step", "training step and cold start", 110, 45, False),
    Part("verify", "accrewrite verify, CUDA original vs runtime", 60, 60, False),
    Part("memory", "peak memory: auto_checkpoint and FSDP2", 50, 20, True),
]

# The runtime's tests that skip without CUDA (grep -n cuda.is_available tests/runtime), and
# the compiler's Triton path, which the CPU runs only in Triton's interpreter (slow tier).
RUNTIME_CUDA_TESTS = [
    "tests/runtime/test_compile_kernels.py::test_on_cuda_auto_follows_the_rules_and_matches_eager",
    "tests/runtime/test_compile_kernels.py::test_ops_on_the_triton_path_match_torch",
    "tests/runtime/test_amp.py::test_autocast_defaults_to_fp16_on_cuda",
    "tests/runtime/test_parallel_loader.py::test_accelerator_batches_are_pinned_and_copied_non_blocking",
    "tests/runtime/test_utils_misc.py::test_accelerator_calls_run_on_side_streams_with_same_results",
    "tests/runtime/test_xla_model.py::test_xla_device_is_the_local_rank_gpu",
]
# Kernels with goals first (their case modules' docstrings name them), then the rest.
KERNEL_ORDER = ["layer_norm", "adam", "bias_dropout_add", "swin_fmha", "window_process"]
VERIFY_EXAMPLES = ["mnist", "nanogpt"]
OK, SKIPPED = "ok", "skipped: no CUDA"


# --- the report ------------------------------------------------------------------------------


def missing_prerequisites() -> list[str]:
    try:
        import torch
    except ImportError:
        return ["torch (not importable)"]
    missing = []
    if torch.version.cuda is None:
        missing.append(f"torch built with CUDA (this is torch {torch.__version__})")
    if not torch.cuda.is_available():
        missing.append("a visible CUDA GPU (torch.cuda.is_available() is False)")
    if importlib.util.find_spec("triton") is None:
        missing.append("triton (not importable)")
    return missing


def machine() -> dict:
    import torch

    from accrewrite.base.torch_compat import check_version

    triton = importlib.util.find_spec("triton") and importlib.import_module("triton")
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__ if triton else None,
        "python": platform.python_version(),
        "torch_note": check_version(),
    }


def markdown_table(table: dict) -> str:
    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = [f"**{table['title']}**", ""] if table["title"] else []
    lines.append("| " + " | ".join(map(cell, table["columns"])) + " |")
    lines.append("|" + "---|" * len(table["columns"]))
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in table["rows"]]
    return "\n".join(lines)


def render(report: dict) -> str:
    info = report["machine"]
    cuda = f"CUDA {info['cuda']}" if info["cuda"] else "without CUDA"
    head = [f"# accrewrite on {info['gpu'] or 'the CPU'}{' (dry run)' if report['dry_run'] else ''}",
            f"torch {info['torch']} ({cuda}), triton {info['triton']}, Python {info['python']}; "
            f"started {report['started']}; `{report['command']}`",
            "Prerequisites: " + ("missing " + "; ".join(report["missing"]) if report["missing"]
                                 else "all present")
            + (f". Note: {info['torch_note']}." if info["torch_note"] else "")]
    overview = ["| part | status | seconds | budget |", "|---|---|---|---|"]
    for part in report["parts"]:
        seconds = f"{part['seconds']:.1f}" if part["seconds"] is not None else ""
        overview.append(f"| {part['name']} | {part['status']} | {seconds} | {part['budget_s']:.0f} |")
    blocks = head + ["\n".join(overview)]
    for index, part in enumerate(report["parts"], 1):
        blocks += [f"## {index}. {part['name']}: {part['title']}", f"Status: {part['status']}"]
        blocks += [part["summary"]] if part.get("summary") else []
        blocks += ["\n".join(f"- {note}" for note in part["notes"])] if part.get("notes") else []
        blocks += [markdown_table(table) for table in part.get("tables", [])]
        blocks += [f"```\n{part['text'].rstrip()}\n```"] if part.get("text") else []
        if part.get("log_tail"):
            blocks += ["Log, last lines:", f"```\n{part['log_tail'].rstrip()}\n```"]
    return "\n\n".join(blocks) + "\n"


def write_json(path: pathlib.Path, data) -> None:
    """Whole or not at all: a part killed while saving leaves its previous save."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1))
    os.replace(partial, path)


def write_report(outdir: pathlib.Path, work: pathlib.Path, report: dict) -> None:
    write_json(outdir / "report.json", report)
    (outdir / "report.md").write_text(render(report))
    with tarfile.open(outdir / "logs.tar.gz.partial", "w:gz") as archive:
        archive.add(work, arcname="logs")
    os.replace(outdir / "logs.tar.gz.partial", outdir / "logs.tar.gz")


# --- running the parts ----------------------------------------------------------------------


def part_environment() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)  # the kernels must compile for the GPU
    return env


def stop(process: subprocess.Popen) -> None:
    """End a part's process group: SIGTERM first, so that verify can end its sides (they run in
    sessions of their own), then SIGKILL whatever is left."""
    for signum, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        if grace:
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
    process.wait()


def run_part(part: Part, work: pathlib.Path, budget: float, dry_run: bool) -> dict:
    """Run ``part`` in a subprocess for at most ``budget`` seconds; its record for the report."""
    command = [sys.executable, __file__, str(work), "--part", part.name, "--budget", str(budget)]
    start = time.monotonic()
    with open(work / f"{part.name}.log", "wb") as log:
        process = subprocess.Popen(command + ["--dry-run"] * dry_run, stdout=log,
                                   stderr=subprocess.STDOUT, cwd=ROOT, env=part_environment(),
                                   start_new_session=True)
        try:
            returncode = process.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            stop(process)
            returncode = None
        except BaseException:  # gpu.py itself stopped: its session would outlive it
            stop(process)
            raise
    seconds = time.monotonic() - start
    saved = work / f"{part.name}.json"
    record = json.loads(saved.read_text()) if saved.exists() else {}
    log_tail = (work / f"{part.name}.log").read_text(errors="replace")[-3000:]
    if returncode is None:
        status = f"timed out after {budget:.0f} s"
    elif returncode:
        status = f"failed: exit code {returncode}"
    else:
        status = record.pop("status", "failed: saved no status")
    if status != OK:
        record["log_tail"] = log_tail
    return {**record, "status": status, "seconds": seconds}


def run_all(args) -> int:
    missing = missing_prerequisites()
    if missing:
        print(f"benchmarks/gpu.py: missing: {'; '.join(missing)}"
              + ("; the dry run goes on" if args.dry_run else ""), file=sys.stderr)
        if not args.dry_run:
            return 2
    outdir = pathlib.Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # ends the part too
    work = pathlib.Path(tempfile.mkdtemp(prefix="accrewrite-gpu-"))
    cuda = not missing
    report = {
        "command": " ".join(["python", "benchmarks/gpu.py", *sys.argv[1:]]),
        "dry_run": args.dry_run,
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "missing": missing,
        "parts": [],
    }
    for part in PARTS:
        budget = (part.dry_budget if args.dry_run else part.budget) * args.budget_scale
        status = SKIPPED if part.cuda_only and not cuda else "not run yet"
        report["parts"].append({"name": part.name, "title": part.title, "budget_s": budget,
                                "status": status, "seconds": None})
    try:
        for part, entry in zip(PARTS, report["parts"]):
            if entry["status"] == SKIPPED:
                continue
            entry["status"] = "running"
            write_report(outdir, work, report)
            print(f"{part.name}: up to {entry['budget_s']:.0f} s", file=sys.stderr, flush=True)
            entry.update(run_part(part, work, entry["budget_s"], args.dry_run))
            print(f"{part.name}: {entry['status']}, {entry['seconds']:.0f} s", file=sys.stderr,
                  flush=True)
        report["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        write_report(outdir, work, report)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"report: {outdir / 'report.md'}", file=sys.stderr)
    return 0 if all(p["status"] in (OK, SKIPPED) for p in report["parts"]) else 1


# --- inside a part's process ----------------------------------------------------------------


class Results:
    """What a part has measured so far, saved after each step for the report."""

    def __init__(self, work: pathlib.Path, name: str):
        self.path = work / f"{name}.json"
        self.data = {"summary": "", "notes": [], "tables": [], "text": ""}

    def table(self, title: str, columns: list[str]) -> list:
        rows = []
        self.data["tables"].append({"title": title, "columns": columns, "rows": rows})
        return rows

    def save(self, status: str | None = None) -> None:
        if status is not None:
            self.data["status"] = status
        write_json(self.path, self.data)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def junit_outcomes(path: pathlib.Path) -> list[list]:
    """[test, outcome, seconds, message] per test case of a JUnit XML file."""
    rows = []
    for case in ElementTree.parse(path).iter("testcase"):
        outcome, message = "passed", ""
        for element in case:
            if element.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[element.tag]
                message = (element.get("message") or element.text or "").strip().split("\n")[0][:200]
                break
        rows.append([f"{case.get('classname')}::{case.get('name')}", outcome,
                     f"{float(case.get('time') or 0):.2f}", message])
    return rows


def run_pytest_groups(groups: list[list[str]], work: pathlib.Path, results: Results,
                      test_timeout: float, jobs: int = 4) -> dict:
    """Run each group of test paths in a pytest process of its own, ``jobs`` at a time (each
    JUnit file is read as its group ends, so a stopped part keeps the groups that ended);
    counts of outcomes."""
    rows = results.table("every test", ["test", "outcome", "seconds", "message"])
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def run(index: int, group: list[str]) -> None:
        junit = work / f"junit-{index}.xml"
        command = [sys.executable, "-m", "pytest", *group, "-m", "", "-q", "-p", "no:cacheprovider",
                   f"--junitxml={junit}", f"--timeout={test_timeout:.0f}"]
        with open(work / f"pytest-{index}.log", "wb") as log:
            returncode = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
        found = junit_outcomes(junit) if junit.exists() else [
            [" ".join(group), "error", "", f"pytest exited {returncode} without a JUnit report"]]
        with lock:
            rows.extend(found)
            for row in found:
                counts[row[1]] = counts.get(row[1], 0) + 1
            results.data["summary"] = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
            results.save()

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for future in [pool.submit(run, i, group) for i, group in enumerate(groups)]:
            future.result()
    return counts


def part_tests(results: Results, work: pathlib.Path, budget: float, tiny: bool) -> str:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "kernels").glob("test_*.py"))
    groups = [[f] for f in files[:1 if tiny else None]] + [RUNTIME_CUDA_TESTS]
    counts = run_pytest_groups(groups, work, results, test_timeout=budget / 2)
    bad = counts.get("failed", 0) + counts.get("error", 0)
    return OK if not bad and counts.get("passed") else f"failed: {results.data['summary']}"


def part_kernels(results: Results, work: pathlib.Path, budget: float, tiny: bool) -> str:
    import torch

    import kernel_cases
    import kernels as harness

    liger = importlib.util.find_spec("liger_kernel") is not None
    results.data["notes"] += [
        "One unit is a forward + backward (an optimizer step for adam, one call for nms); "
        "time: median ms of triton.testing.do_bench (CUDA events); peak: memory the unit "
        "allocates above what was allocated before it.",
        "speedup = baseline time / ours (> 1: ours is faster); memory = ours peak / baseline "
        "peak (< 1: ours needs less).",
        "Liger-Kernel: layer_norm measured against it (row 'liger')" if liger
        else "Liger-Kernel: not installed (liger_kernel is not importable), not compared",
    ]
    rows = results.table("", ["case", "implementation", "ms", "peak MiB", "speedup", "memory"])
    names = sorted(kernel_cases.kernel_names(),
                   key=lambda n: KERNEL_ORDER.index(n) if n in KERNEL_ORDER else len(KERNEL_ORDER))
    per_kernel = [kernel_cases.load(name).cases("cuda", smoke=tiny) for name in names]
    # the first case of every kernel (its goal's shape), then the second...: a part stopped
    # by its budget has measured every kernel at least once
    in_turn = [case for round_ in itertools.zip_longest(*per_kernel) for case in round_ if case]
    failures = 0
    for case in in_turn:
        ours = None
        for implementation, fn in {"ours": case.ours, **case.baselines()}.items():
            try:
                ms, peak = harness.measure(fn, warmup=10, rep=40)
            except Exception as error:  # one implementation failing is a result, not the end
                failures += 1
                first_line = (str(error).splitlines() or [""])[0][:150]
                rows.append([case.name, implementation,
                             f"error: {type(error).__name__}: {first_line}", "", "", ""])
                continue
            ratios = ["", ""]
            if implementation == "ours":
                ours = ms, peak
            elif ours:
                ratios = [f"{ms / ours[0]:.2f}x", f"{ours[1] / peak:.2f}x" if peak else "-"]
            rows.append([case.name, implementation, f"{ms:.3f}", f"{peak / 2**20:.1f}", *ratios])
        results.data["summary"] = f"{len(rows)} measurements of {len(in_turn)} cases, {failures} failed"
        results.save()
        torch._dynamo.reset()  # the next shape compiles static, as a fresh process would
        torch.cuda.empty_cache()
    return OK if not failures else f"failed: {failures} implementations raised"


def part_train_step(results: Results, work: pathlib.Path, budget: float, tiny: bool) -> str:
    device = "cuda" if cuda_available() else "cpu"
    setups = "eager" if tiny else "eager,torch.compile,accrewrite"
    command = [sys.executable, str(BENCHMARKS / "train_step.py"), "--device", device, "--setups", setups]
    command += ["--quick"] if tiny else []
    results.data["notes"].append(f"`{' '.join(['python', *command[1:]]).replace(str(ROOT) + '/', '')}`")
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT) as process:
        for line in process.stdout:  # saved line by line: a stopped run keeps its rows
            lines.append(line)
            results.data["text"] = "".join(lines)
            results.save()
    return OK if process.returncode == 0 else f"failed: exit code {process.returncode}"


VERDICTS = {0: "match", 1: "diverge, or the migrated side failed",
            2: "the original could not run, or verify could not set up"}


def part_verify(results: Results, work: pathlib.Path, budget: float, tiny: bool) -> str:
    steps = 2 if tiny else 10
    # three sides run one after the other (original, runtime, a nudged rerun of the original)
    side_timeout = max(5, int(budget / 3.5))
    on = "cuda" if cuda_available() else "cpu"
    results.data["notes"].append(
        f"`accrewrite verify train.py --target runtime --steps {steps} --root . --timeout "
        f"{side_timeout} -- --steps {steps}` in examples/NAME; the original ran on {on}")
    rows = results.table("", ["example", "exit code", "verdict", "seconds"])
    processes = {}
    for name in VERIFY_EXAMPLES:
        command = [sys.executable, "-m", "accrewrite", "verify", "train.py", "--target", "runtime",
                   "--steps", str(steps), "--root", ".", "--timeout", str(side_timeout),
                   "--", "--steps", str(steps)]
        output = open(work / f"verify-{name}.log", "w")
        # side by side: the two are independent, and the GPU has room for both
        processes[name] = (subprocess.Popen(command, cwd=ROOT / "examples" / name, stdout=output,
                                            stderr=subprocess.STDOUT), output, time.monotonic())
    texts = []
    for name, (process, output, start) in processes.items():
        returncode = process.wait()
        output.close()
        rows.append([name, returncode, VERDICTS.get(returncode, "verify crashed"),
                     f"{time.monotonic() - start:.1f}"])
        texts.append(f"$ accrewrite verify examples/{name}/train.py\n"
                     + (work / f"verify-{name}.log").read_text(errors="replace"))
        results.data["text"] = "\n".join(texts)
        results.save()
    matched = sum(row[1] == 0 for row in rows)
    results.data["summary"] = f"{matched}/{len(rows)} matched"
    return OK if matched == len(rows) else f"failed: {results.data['summary']}"


def part_memory(results: Results, work: pathlib.Path, budget: float, tiny: bool) -> str:
    checkpoint_peaks(results, tiny)
    fsdp_peaks(results, tiny)
    return OK


def _bench(fn) -> float:
    import triton.testing

    fn()  # the warm-up; with a checkpoint budget, its calibration step
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def checkpoint_peaks(results: Results, tiny: bool) -> None:
    """auto_checkpoint on checkpoint_memory.py's GPT: peak above what is held before a step
    (activations, gradients, temporaries), as that script measures on the CPU."""
    import torch

    shape = dict(blocks=2, dim=64, seq=32, batch=2) if tiny else dict(blocks=12, dim=1024, seq=1024, batch=8)
    shape["model"] = "gpt"
    results.data["notes"].append(
        f"auto_checkpoint: checkpoint_memory.py's GPT, {shape['blocks']} blocks, dim {shape['dim']}, "
        f"seq {shape['seq']}, batch {shape['batch']}, fp32; peak of forward + backward above the "
        "memory held before it (its goals: every block <= 0.40x the peak at <= 1.25x the time; "
        "a budget b met within b + 0.04)")
    rows = results.table("auto_checkpoint", ["configuration", "checkpointed", "peak MiB", "peak ratio",
                                             "ms", "time ratio"])
    labels = {"plain": "none", "selective": "every block, selective", "full": "every block, full",
              "0.5": "budget 0.5"}
    plain = None
    for configuration, label in labels.items():
        ms, peak, checkpointed = _checkpointed_step(argparse.Namespace(**shape), configuration)
        torch.cuda.empty_cache()
        plain = plain or (peak, ms)
        rows.append([label, checkpointed, f"{peak / 2**20:.1f}", f"{peak / plain[0]:.2f}x",
                     f"{ms:.2f}", f"{ms / plain[1]:.2f}x"])
        results.save()


def _checkpointed_step(shape, configuration: str) -> tuple[float, int, int]:
    """(ms, peak bytes, blocks checkpointed) of a step of checkpoint_memory's model."""
    import checkpoint_memory
    from kernels import peak_memory

    model, batch = checkpoint_memory.make(shape, configuration)
    model, batch = model.cuda(), batch.cuda()
    step = functools.partial(checkpoint_memory.step, model, batch)
    ms = _bench(step)
    model.zero_grad(set_to_none=True)
    plan = getattr(model, "checkpoint_plan", None)
    return ms, peak_memory(step), plan.checkpointed if plan else 0


def fsdp_peaks(results: Results, tiny: bool) -> None:
    """fsdp_memory.py's GPT in one process, plain and under FSDP2: accelerate() leaves a single
    process unsharded, so its sharding step is applied on a 1-rank mesh; what FSDP2 itself
    costs on a GPU (gathers, prefetch, DTensor state), to set against the sharding it buys."""
    import torch
    import torch.distributed as dist

    import fsdp_memory

    shape = dict(blocks=2, dim=64, heads=4, vocab=256, seq=32, batch=2) if tiny else dict(
        blocks=12, dim=1024, heads=16, vocab=2048, seq=1024, batch=8)
    args = argparse.Namespace(**shape)
    results.data["notes"].append(
        f"FSDP2: fsdp_memory.py's GPT, {args.blocks} blocks, dim {args.dim}, seq {args.seq}, "
        f"batch {args.batch}, AdamW, fp32, one process (NCCL); peak of a whole step "
        "(torch.cuda.max_memory_allocated), at rest: parameters, gradients and optimizer state")
    rows = results.table("FSDP2, one process", ["setup", "at rest MiB", "peak MiB", "peak ratio",
                                                "ms", "time ratio"])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(fsdp_memory._free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), device="cuda")
    plain = None
    for setup in ("plain", "FSDP2"):
        ms, peak, at_rest = _fsdp_step(args, tokens, sharded=setup == "FSDP2")
        torch.cuda.empty_cache()
        plain = plain or (peak, ms)
        rows.append([setup, f"{at_rest / 2**20:.1f}", f"{peak / 2**20:.1f}",
                     f"{peak / plain[0]:.2f}x", f"{ms:.2f}", f"{ms / plain[1]:.2f}x"])
        results.save()
    dist.destroy_process_group()


def _fsdp_step(args, tokens, sharded: bool) -> tuple[float, int, int]:
    """(ms, peak bytes, bytes at rest) of a training step of fsdp_memory's model."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import fsdp_memory
    from accrewrite.runtime.parallel.apply import apply_fsdp
    from accrewrite.runtime.parallel.config import ComputeConfig, FSDPConfig

    torch.manual_seed(0)
    model = fsdp_memory.GPT(args).cuda()
    if sharded:
        mesh = init_device_mesh("cuda", (1, 1), mesh_dim_names=("dp", "fsdp"))
        apply_fsdp(model, list(model.h), FSDPConfig(), ComputeConfig(), mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(tokens[:, :-1], tokens[:, 1:]).backward()
        optimizer.step()

    ms = _bench(step)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    at_rest = sum(fsdp_memory.model_state_bytes(model, optimizer).values())
    return ms, torch.cuda.max_memory_allocated(), at_rest


PART_FUNCTIONS = {"tests": part_tests, "kernels": part_kernels, "train_step": part_train_step,
                  "verify": part_verify, "memory": part_memory}


def run_inside(args) -> int:
    work = pathlib.Path(args.outdir)
    results = Results(work, args.part)
    results.save()
    results.save(PART_FUNCTIONS[args.part](results, work, args.budget, args.dry_run))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", metavar="OUTDIR")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny sizes and budgets; on the CPU the CUDA-only parts are skipped")
    parser.add_argument("--budget-scale", type=float, default=1.0, metavar="X",
                        help="multiply every part's time budget by X")
    parser.add_argument("--part", choices=PART_FUNCTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget_scale <= 0:
        parser.error("--budget-scale must be above 0")
    return run_inside(args) if args.part else run_all(args)


if __name__ == "__main__":
    sys.exit(main())
