"""Training-step time and cold start: eager vs torch.compile vs regional vs accrewrite.

For each model, in one run and side by side, one full training step (forward, backward,
AdamW step) under each setup, each in a process of its own (as each would be its own training
script) on the same model:

- eager: the model as written, ``torch.optim.AdamW`` with its default (per-parameter) step;
- eager+cache: eager in a process with accrewrite's host memory cache on
  (``runtime/compiler/cpu/host_memory.py``, which the accrewrite setup asks ``compile`` for): how
  much of accrewrite's step comes from the cache, not from compiling;
- torch.compile: ``torch.compile(model)``, eager optimizer;
- regional: Accelerate's ``compile_regions`` recipe, ``torch.compile`` of each repeated block and
  of each other leaf module, eager optimizer;
- accrewrite: ``accrewrite.runtime.compile(model, host_memory=True)`` and
  ``compile(optimizer)``;
- accrewrite@base (with ``--base DIR``): the same with the accrewrite that ``import accrewrite``
  finds on ``DIR`` (put first on its process's path), to compare two versions in one run.

"first step" is the wall time of step 1, compilation included (cold start: dynamo and inductor
caches are off; what a process pays once, whatever it compiles, such as loading inductor and
registering patterns, is paid before any measurement by a warm-up compile of a tiny model, as is
loading accrewrite's CPU kernels, which are built once per machine);
"step" is the median of the steady steps after it. One process runs at a time: the first steps
one after another, then the steady steps in turns (a step of each setup per round), so that the
machine's drift falls on every setup alike. With ``--rounds N`` all of it is done N times, each
time with fresh processes and the setups in a rotated order, and the medians are printed.
Ratios are against eager and against torch.compile (where those setups run).
"floor" is the time that the matmuls, convolutions and attention of an eager+cache step take
(ATen's kernels; the median of three more steps): no setup steps faster than that unless it
replaces those kernels, as accrewrite does for most matmuls (``compiler/cpu/onednn.py``). Run
on CPU (``--device cuda``: the same on a GPU, every step and floor op synchronized):

    python benchmarks/train_step.py            # gpt-4 and cnn: steps and cold start;
                                               # gpt-12: cold start only
    python benchmarks/train_step.py --quick    # tiny shapes, four steps (a smoke run)
    python benchmarks/train_step.py --threads 1  # on a shared, loaded machine
    python benchmarks/train_step.py --base DIR   # this accrewrite against the one on DIR
    python benchmarks/train_step.py --base DIR --rounds 5 --setups eager,accrewrite,accrewrite@base
                                               # the same, to within a few percent
"""

import argparse
import copy
import dataclasses
import gc
import multiprocessing
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode



class GPTBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, blocks, d, heads, seq, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList([GPTBlock(d, heads) for _ in range(blocks)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, target):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.ln(x)).flatten(0, 1), target.flatten())


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class CNN(nn.Module):
    def __init__(self, c, blocks, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
        self.blocks = nn.ModuleList([ResBlock(c) for _ in range(blocks)])
        self.head = nn.Linear(c, classes)

    def forward(self, x, target):
        x = F.relu(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x.mean((2, 3))), target)


@dataclasses.dataclass
class Case:
    name: str
    model: nn.Module
    batch: tuple
    steps: int  # steady steps after the first (0: cold start only)


def cases(quick: bool) -> list[Case]:
    g = torch.Generator().manual_seed(0)
    if quick:
        gpt = dict(d=32, heads=2, seq=16, vocab=64)
        tokens = torch.randint(0, 64, (2, 17), generator=g)
        images = torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 10, (2,), generator=g)
        return [
            Case("gpt-2 (quick)", GPT(2, **gpt), (tokens[:, :-1], tokens[:, 1:]), 3),
            Case("cnn (quick)", CNN(8, 2), images, 3),
        ]
    gpt = dict(d=256, heads=4, seq=128, vocab=4096)
    tokens = torch.randint(0, 4096, (16, 129), generator=g)
    text = tokens[:, :-1], tokens[:, 1:]
    images = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
    return [
        Case("gpt-4 d256 seq128 b16", GPT(4, **gpt), text, 10),
        Case("cnn resnet-6 c32 32x32 b32", CNN(32, 6), images, 10),
        Case("gpt-12 d256 seq128 b16", GPT(12, **gpt), text, 0),  # last: cold start only
    ]


def compile_regions(module: nn.Module) -> nn.Module:
    """Accelerate's ``compile_regions`` (accelerate/utils/other.py), ported: an
    ``nn.ModuleList`` of one class has each block compiled, any other leaf module is compiled on
    its own, containers are rebuilt around the compiled children."""
    if isinstance(module, nn.ModuleList):
        if all(isinstance(block, type(module[0])) for block in module):
            return nn.ModuleList([torch.compile(block) for block in module])
        return torch.compile(module)
    if module._modules:
        new = copy.copy(module)
        new._modules = {}
        for name, child in module._modules.items():
            new.add_module(name, compile_regions(child))
        return new
    return torch.compile(module)


def eager(model):
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


# accrewrite is imported by the setups that use it, in their worker process (see --base)


def eager_cached(model):
    from accrewrite.runtime.compiler.cpu.host_memory import cache_host_memory

    off = cache_host_memory()
    if off:  # the row would be plain eager under another name
        raise RuntimeError(f"eager+cache: the host memory cache is off ({off})")
    return eager(model)


def full(model):
    model = torch.compile(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def regional(model):
    model = compile_regions(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def accrewrite(model):
    from accrewrite.runtime import compile

    model = compile(model, host_memory=True)
    return model, compile(torch.optim.AdamW(model.parameters(), lr=1e-4))


def accrewrite_base(model):
    """``accrewrite`` with the version on ``--base``, whose ``compile`` may not have the
    ``host_memory`` argument (it turned the cache on for a CPU model by itself)."""
    from accrewrite.runtime import compile

    try:
        model = compile(model, host_memory=True)
    except TypeError:
        model = compile(model)
    return model, compile(torch.optim.AdamW(model.parameters(), lr=1e-4))


SETUPS = {
    "eager": eager,
    "eager+cache": eager_cached,
    "torch.compile": full,
    "regional": regional,
    "accrewrite": accrewrite,
    "accrewrite@base": accrewrite_base,  # with --base only
}


def warm_up(setup, device: str) -> None:
    """Pay the once-per-process costs of ``setup`` on a tiny model (see the docstring), then
    have dynamo forget it: dynamo remembers the sizes that a function was compiled for, and the
    measured model, of the same class at other sizes, would compile again with dynamic shapes.
    Last, collect the warm-up's garbage: else a full collection of it (0.5 s after a GPT's
    warm-up) falls into the first step of one setup and not another's, by where the
    interpreter's thresholds stood when the warm-up ended."""
    batch = tuple(t.to(device) for t in cases(quick=True)[0].batch)
    first_step(GPT(1, d=8, heads=2, seq=16, vocab=64).to(device), batch, setup)
    torch._dynamo.reset()
    gc.collect()


def first_step(model, batch, setup):
    """(the first step's time in s, a function that runs one more step and returns its time)."""
    model, optimizer = setup(copy.deepcopy(model))

    cuda = batch[0].is_cuda

    def step():
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(*batch).backward()
        optimizer.step()
        if cuda:  # the step's kernels are queued, not done
            torch.cuda.synchronize()
        return time.perf_counter() - start

    return step(), step


# ATen ops (by name prefix) of the matmuls, convolutions and attention, forward and backward
_FLOOR_OPS = (
    "aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product", "aten::convolution"
)


class _FloorTimer(TorchDispatchMode):
    """Adds up the time of the ``_FLOOR_OPS`` run under it (CPU kernels run synchronously; on
    CUDA each is synchronized before and after)."""

    seconds = 0.0

    def __init__(self, cuda: bool):
        super().__init__()
        self.cuda = cuda

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.name().startswith(_FLOOR_OPS):
            return func(*args, **(kwargs or {}))
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start
        return out


def floor(step, cuda: bool) -> float:
    """The median time in ms of the ``_FLOOR_OPS`` in three more ``step()``s."""
    times = []
    for _ in range(3):
        with _FloorTimer(cuda) as timer:
            step()
        times.append(timer.seconds * 1e3)
    return statistics.median(times)


class Worker:
    """One setup's process for one case. It answers "ready" once warmed up; ``call(command)``
    then has it run "first" (the first step; answers its time in s), "step" (one more; its time
    in s) or "floor" (three more; their floor in ms), and waits for the answer."""

    def __init__(self, case_index: int, setup: str, args):
        context = multiprocessing.get_context("spawn")
        self.setup = setup
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=serve, args=(child, case_index, setup, args), daemon=True
        )
        self.process.start()
        child.close()

    def call(self, command: str):
        self.connection.send(command)
        return self.answer()

    def answer(self):
        ok, value = self.connection.recv()
        if not ok:
            raise RuntimeError(f"{self.setup} failed:\n{value}")
        return value

    def close(self) -> None:
        self.connection.close()
        self.process.join(timeout=60)
        self.process.kill()


def serve(connection, case_index: int, setup_name: str, args) -> None:
    """A worker process's loop (see ``Worker``)."""
    try:
        if setup_name == "accrewrite@base":  # before anything imports accrewrite
            sys.path.insert(0, args.base)
        if args.threads:
            torch.set_num_threads(args.threads)
        torch._inductor.config.force_disable_caches = True  # cold start means cold
        torch.manual_seed(0)  # the same model in every process
        case, setup = cases(args.quick)[case_index], SETUPS[setup_name]
        model, batch = case.model.to(args.device), tuple(t.to(args.device) for t in case.batch)
        warm_up(setup, args.device)
        connection.send((True, "ready"))
        while True:
            command = connection.recv()
            if command == "first":
                answer, step = first_step(model, batch, setup)
            elif command == "step":
                answer = step()
            else:
                answer = floor(step, args.device == "cuda")
            connection.send((True, answer))
    except EOFError:  # the run is over
        pass
    except Exception:
        connection.send((False, traceback.format_exc()))


def run(case_index: int, case: Case, names: list[str], args) -> dict[str, tuple]:
    """One round on ``case``, a fresh process per setup in ``names``' order: per setup, (first
    step in s, its steady steps in s); and "floor": (None, [floor of the eager+cache step in
    s]) when there are steady steps and that setup runs."""
    workers = {name: Worker(case_index, name, args) for name in names}
    try:
        for worker in workers.values():  # "ready": they warm up side by side
            worker.answer()
        first = {name: worker.call("first") for name, worker in workers.items()}
        steady = {name: [] for name in workers}
        for _ in range(case.steps):
            for name, worker in workers.items():
                steady[name].append(worker.call("step"))
        results = {name: (first[name], steady[name]) for name in workers}
        if case.steps and "eager+cache" in workers:
            results["floor"] = (None, [workers["eager+cache"].call("floor") / 1e3])
        return results
    finally:
        for worker in workers.values():
            worker.close()


def rounds(case_index: int, case: Case, args) -> dict[str, tuple[float, float | None]]:
    """Per setup: (median first step in s, median steady step in ms or None) over
    ``args.rounds`` rounds, each with the setups in another order (rotated), so that no setup
    always comes first or after the same one; "floor" as a step."""
    names = setups(args)
    firsts, steps = {}, {}
    for index in range(args.rounds):
        shift = index % len(names)
        results = run(case_index, case, names[shift:] + names[:shift], args)
        for name, (first, steady) in results.items():
            firsts.setdefault(name, []).append(first)
            steps.setdefault(name, []).extend(steady)
    return {
        name: (
            statistics.median(firsts[name]) if firsts[name][0] is not None else None,
            statistics.median(steps[name]) * 1e3 if steps[name] else None,
        )
        for name in [*names, "floor"] if name in firsts
    }


def setups(args) -> list[str]:
    wanted = args.setups.split(",") if args.setups else list(SETUPS)
    unknown = set(wanted) - set(SETUPS)
    if unknown:
        raise SystemExit(
            f"--setups: unknown {', '.join(sorted(unknown))}; from {', '.join(SETUPS)}"
        )
    return [name for name in SETUPS if name in wanted and (args.base or name != "accrewrite@base")]


def ratio(value, base):
    return f"{value / base:5.2f}x" if value is not None and base else "    -"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, four steps")
    parser.add_argument(
        "--threads",
        type=int,
        help="intra-op threads (default: torch's); 1 on a shared, loaded machine, where OpenMP "
        "threads of compiled kernels wait on each other's time slices",
    )
    parser.add_argument(
        "--base", metavar="DIR",
        help="also run accrewrite@base: the accrewrite that 'import accrewrite' finds on DIR",
    )
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="measure each case this many times, the setups in a rotated order each time, and "
        "print medians (first steps vary by several percent from one process to the next)",
    )
    parser.add_argument(
        "--setups", metavar="A,B,...",
        help=f"only these setups (default: all; from {', '.join(SETUPS)})",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is available")
    threads = args.threads or torch.get_num_threads()
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(
        f"torch {torch.__version__}, {threads} threads, {where}, a process per setup, "
        f"{args.rounds} round{'s' if args.rounds > 1 else ''}"
    )
    header = f"{'model':28} {'setup':14} {'first step':>11} {'vs eager':>9} {'vs compile':>10}"
    header += f" {'step':>10} {'vs eager':>9} {'vs compile':>10}"
    print(header)
    for index, case in enumerate(cases(args.quick)):
        results = rounds(index, case, args)
        eager_first, eager_step = results.get("eager", (None, None))
        full_first, full_step = results.get("torch.compile", (None, None))
        for name, (first, step) in results.items():
            step_text = f"{step:8.1f}ms" if step is not None else "         -"
            first_text = f"{first:10.2f}s" if first is not None else "          -"
            print(
                f"{case.name:28} {name:14} {first_text} {ratio(first, eager_first):>9}"
                f" {ratio(first, full_first):>10} {step_text:>10} {ratio(step, eager_step):>9}"
                f" {ratio(step, full_step):>10}",
                flush=True,
            )


if __name__ == "__main__":
    main()
