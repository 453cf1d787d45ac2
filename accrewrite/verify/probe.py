"""What ``accrewrite verify`` installs in every Python process of a side, to record what the
training does. ``hooks/sitecustomize.py`` loads it by its path at interpreter start wherever
``ACCREWRITE_VERIFY_RECORDS`` is set: in the script's process, in torchrun's workers and in the
processes the script starts itself (``mp.spawn``, ``torch.multiprocessing``, a ``fork``).

Per process, ``RECORDS/rank<RANK>.<PID>.jsonl`` holds a first line ``{"born": T}`` (when the
process started or was forked, seconds since the epoch), then one JSON line per optimizer step;
RANK is the process's rank in ``torch.distributed`` once it is initialised (``$RANK`` before,
else 0). A process born before another holder of its rank made its last step held the rank at
the same time; one born after held it later (a script that spawns a process group per demo).
A step's line holds:

* ``loss``: the mean of the tensors ``backward()`` was called on since the previous step (a
  GradScaler's scaled loss counts unscaled, so a scaler that is disabled on one side and not on
  the other compares equal);
* ``checksum``: the parameters' change since the first step, projected on a fixed pattern of
  signs (the same on every side), so two runs that apply the same updates agree and any other
  update shows; ``change``: that change's norm, the scale the checksums are compared at;
* ``time``: when the step ended (seconds since the epoch);
* ``graphs``: where the target counts them (``ACCREWRITE_VERIFY_EXECUTIONS=MODULE:COMPILES:EXECUTIONS[:TRANSFERS]``,
  from its profile's ``[verify.executions]``), how many graphs the process has compiled and
  executed and how many times it moved values to the host so far, the probe's own reads of the
  loss and checksum left out (``Graphs``): MODULE's ``metric_data`` of those metrics, read once
  the script has imported MODULE's package, before and after those reads, each time after
  ``ACCREWRITE_VERIFY_DEVICE_WAIT`` (``module:function``) has waited for the graphs launched so
  far to run. ``probe`` holds the counts of the probe's reads; ``compiled_at``, where the target
  writes the Python frames that triggered each compilation to the file named by the variable
  ``ACCREWRITE_VERIFY_ANALYSIS_FILE`` names (the probe sets it to ``RECORDS/compilations.<PID>.txt``),
  the script's line (``path:line``) that ran each graph compiled since the previous step;
  ``changed_at``, where ``ACCREWRITE_VERIFY_GRAPH`` names what hashes and prints a graph, the
  script's lines that made the operations of this step's graph (its parameters' update, before
  the step's sync runs it) that the previous step's graph lacks.

With ``ACCREWRITE_VERIFY_STEPS=N`` the process ends after N steps (``SystemExit(0)`` from the
optimizer step, so ``finally`` blocks and launchers see an orderly end), with a last line
``{"stopped": N}``: the rest of the script is not run. With ``ACCREWRITE_VERIFY_HOST_RANDOM=TYPE``
(verify sets it where the target's profile asks, ``[verify] host_random``), random numbers for
devices of that type are drawn by the CPU generator and moved there, so that dropout and noise
draw what the original's CPU run draws. With ``ACCREWRITE_VERIFY_PACED_LOADER=MODULE:CLASS``
(``[verify] paced_loader``), a device loader built as torch_xla's ParallelLoader, which reads the
loader it wraps ahead of the loop on a thread, loads each batch when the loop asks for it where
that loader has no worker processes: what loading draws from the global generator (random
augmentations) then falls between the loop's own draws as it does in the original. CLASS is
changed once the script imports MODULE. With ``ACCREWRITE_VERIFY_DEVICE_FINDERS=MODULE:CLASS,...``
(``[verify] device_finders``), each such class, a framework's accelerator that looks for the
target's hardware itself (Lightning's XLAAccelerator counts TPU chips), finds the one device the
side runs on, where that hardware is absent.

It imports nothing of accrewrite's, so that it runs in any interpreter with torch (the one with
the target's package, say), and does nothing in a process that has no torch.
"""

from __future__ import annotations

import collections
import importlib
import importlib.abc
import importlib.util
import inspect
import json
import os
import random
import re
import sys
import sysconfig
import threading
import time

SEED = 0
RECORDS = "ACCREWRITE_VERIFY_RECORDS"
STEPS = "ACCREWRITE_VERIFY_STEPS"
NUDGE = "ACCREWRITE_VERIFY_NUDGE"  # a seed (not 0): nudge the parameters before their first use
NUDGE_SIZE = 1e-6  # relative; at least one unit in the last place of the parameter's dtype
HOST_RANDOM = "ACCREWRITE_VERIFY_HOST_RANDOM"
EXECUTIONS = "ACCREWRITE_VERIFY_EXECUTIONS"
PACED_LOADER = "ACCREWRITE_VERIFY_PACED_LOADER"
DEVICE_FINDERS = "ACCREWRITE_VERIFY_DEVICE_FINDERS"
EXIT_GRACE = "ACCREWRITE_VERIFY_EXIT_GRACE"  # the runtime's _process_exit.py, by its path
DEVICE_WAIT = "ACCREWRITE_VERIFY_DEVICE_WAIT"
GRAPH = "ACCREWRITE_VERIFY_GRAPH"  # module:function,module:function: what hashes and what prints a graph
ANALYSIS_FILE = "ACCREWRITE_VERIFY_ANALYSIS_FILE"


class Recorder:
    def __init__(self, folder: str, steps: int):
        import torch

        self.torch = torch
        self.folder = folder
        self.steps = steps  # 0: no limit
        self.nudge_seed = int(os.environ.get(NUDGE) or 0)
        self.nudged: set | None = set() if self.nudge_seed else None  # parameters nudged
        self.nudging = None  # the module forward pre-hook that nudges, until the first step
        self.graphs = Graphs.from_environment(folder)
        self._begin()

    def _begin(self) -> None:
        """A process's own count: a forked child starts its own records."""
        self.born = time.time()
        self.pid = os.getpid()
        self.handle = None
        self.step = 0
        self.losses: list = []
        self.start: dict = {}  # parameter -> (its value at the first step, its sign pattern)

    def _write(self, record: dict) -> None:
        if self.handle is None:
            name = f"rank{_rank(self.torch)}.{self.pid}.jsonl"
            os.makedirs(self.folder, exist_ok=True)
            self.handle = open(os.path.join(self.folder, name), "a", encoding="utf-8")
            self.handle.write(json.dumps({"born": self.born}) + "\n")
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()

    # hooks ---------------------------------------------------------------------------------

    def backward(self, tensor) -> None:
        if self.pid != os.getpid():
            self._begin()
        loss = getattr(tensor, "_accrewrite_unscaled", tensor)
        self.losses.append(loss.detach().float().sum())

    def before_forward(self, module, args) -> None:
        # Before the first loss, so that the first step's gradients see the nudge too.
        for parameter in module.parameters():
            self._nudge(parameter)

    def before_step(self, optimizer, args, kwargs) -> None:
        if self.pid != os.getpid():
            self._begin()
        if self.nudging is not None:
            self.nudging.remove()
            self.nudging = None
        for parameter in _parameters(optimizer):
            if parameter not in self.start:
                self._nudge(parameter)  # one that no module's forward used
                generator = self.torch.Generator().manual_seed(len(self.start))
                signs = self.torch.randint(0, 2, parameter.shape, generator=generator).float() * 2 - 1
                self.start[parameter] = (parameter.detach().clone(), signs.to(parameter.device))

    def _nudge(self, parameter) -> None:
        """Nudge a parameter before its first use (once)."""
        if self.nudged is None or parameter in self.nudged or not parameter.is_floating_point():
            return
        self.nudged.add(parameter)
        self._jitter(parameter, len(self.nudged))

    def _jitter(self, parameter, salt: int) -> None:
        """Move every element by ``NUDGE_SIZE``, up or down at random: about what two backends'
        float32 kernels differ by (batch-norm statistics, a convolution's order of summation).
        Before the first use and again after every step, as those differences recur every step,
        so how far a run drifts from its nudged copy is what such differences alone do to it."""
        torch = self.torch
        generator = torch.Generator().manual_seed(self.nudge_seed * 1_000_003 + salt)
        size = max(torch.finfo(parameter.dtype).eps, NUDGE_SIZE)
        signs = torch.randint(0, 2, parameter.shape, generator=generator).to(parameter.device) * 2 - 1
        with torch.no_grad():
            nudge = parameter * (size * signs.to(parameter.dtype))
            parameter.add_(nudge)
            if parameter in self.start:  # the checksum counts what training does, not the nudge itself
                self.start[parameter][0].add_(nudge)

    def after_step(self, optimizer, args, kwargs) -> None:
        torch = self.torch
        graphs = self.graphs.before_reads() if self.graphs else None
        with torch.no_grad():
            changes = [
                (parameter.detach().float() - first.float(), signs)
                for parameter, (first, signs) in ((p, self.start[p]) for p in _parameters(optimizer))
            ]
            if changes:
                sums = torch.stack([torch.stack([(change * signs).sum(), change.pow(2).sum()]) for change, signs in changes])
                checksum, squares = (float(value) for value in sums.sum(0).cpu())
            else:
                checksum, squares = 0.0, 0.0
            losses = [float(loss.cpu()) for loss in self.losses]
        if graphs is not None:
            graphs["changed_at"] = self.graphs.changed(_parameters(optimizer))
            self.graphs.after_reads()
        self.step += 1
        record = {"step": self.step, "loss": sum(losses) / len(losses) if losses else None, "checksum": checksum,
                  "change": squares ** 0.5, "time": time.time()}
        if graphs is not None:
            record["graphs"] = graphs
        self.losses = []
        self._write(record)
        if self.nudged is not None:
            for index, parameter in enumerate(_parameters(optimizer)):
                if parameter.is_floating_point():
                    self._jitter(parameter, 7919 * self.step + index + 1_000_000)
        if self.steps and self.step >= self.steps:
            if self.step == self.steps:
                self._write({"stopped": self.step})
            # The steps asked for are recorded; the user asked not to run the rest. An exit that
            # unwinds, so that a launcher's pool (torch_xla's spawn) sees its worker return.
            raise SystemExit(0)


def _rank(torch) -> int:
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank()
    return int(os.environ.get("RANK") or 0)


def _parameters(optimizer):
    return [p for group in optimizer.param_groups for p in group["params"]]


KINDS = ("compiles", "executions", "transfers")  # what ACCREWRITE_VERIFY_EXECUTIONS names, in order


class Graphs:
    """A process's graphs compiled and executed and its transfers to the host, counted apart from
    the probe's own reads: ``before_reads()`` gives the script's counts so far, ``after_reads()``
    adds what the reads between them did to the probe's own. Nothing is asked of the target until
    the script has imported its package (importing it here would start its runtime in a process
    that does not use it)."""

    def __init__(self, module: str, names: list[str], wait: str, analysis: str, graph: str = ""):
        self.module = module
        self.names = dict(zip(KINDS, names))
        self.wait = wait
        self.analysis = analysis  # the file the target writes its compilations' frames to; "" none
        self.read = 0  # how far that file is read
        self.own = dict.fromkeys(self.names, 0)  # the probe's reads, so far
        self.total: dict | None = None  # every count, before the probe's reads
        self.graph = graph  # as GRAPH says; "" none
        self.last: tuple = (None, None)  # the hash of the previous step's graph, and its operations

    @classmethod
    def from_environment(cls, folder: str):
        spec = os.environ.get(EXECUTIONS)
        if not spec:
            return None
        module, *names = spec.split(":")
        analysis = ""
        if os.environ.get(ANALYSIS_FILE):
            os.makedirs(folder, exist_ok=True)  # the target writes there from the first compilation on
            analysis = os.path.join(folder, f"compilations.{os.getpid()}.txt")
            os.environ[os.environ[ANALYSIS_FILE]] = analysis  # read by the target when the script imports it
        return cls(module, names, os.environ.get(DEVICE_WAIT, ""), analysis, os.environ.get(GRAPH, ""))

    def _counts(self) -> dict:
        if self.wait:
            _function(self.wait)()
        metrics = importlib.import_module(self.module)
        return {kind: (metrics.metric_data(name) or (0,))[0] for kind, name in self.names.items()}

    def before_reads(self) -> dict | None:
        """The script's counts so far, the probe's own, and the script's lines that triggered the
        compilations since the previous call; None before the script imports the package."""
        if self.module.split(".")[0] not in sys.modules:
            self.total = None
            return None
        self.total = self._counts()
        counts = {kind: self.total[kind] - self.own[kind] for kind in self.names}
        counts["probe"] = dict(self.own)
        if self.analysis:
            counts["compiled_at"] = [site for site in compilation_sites(self._unread(), _LIBRARIES) if site]
        return counts

    def changed(self, tensors: list) -> list[str]:
        """The script's lines (``path:line``) that made the operations of the graph computing
        ``tensors`` (the step's parameters, before the step's sync runs it) that the previous
        step's graph lacks, in the graph's order: the first made the first operation that differs,
        the others may only take its new shape. The graph is printed only when its hash is new."""
        if not self.graph or self.total is None or not tensors:
            return []
        hashing, printing = (_function(spec) for spec in self.graph.split(","))
        key = hashing(tensors)
        if key == self.last[0]:
            return []
        operations = _operations(printing(tensors))
        counts = collections.Counter(operations)
        previous = self.last[1]
        self.last = (key, counts)
        if previous is None:
            return []
        new = counts - previous
        return list(dict.fromkeys(site for text, site in operations
                                  if (text, site) in new and site and not site.startswith(_LIBRARIES)))

    def after_reads(self) -> None:
        if self.total is None:
            return
        now = self._counts()
        for kind in self.names:
            self.own[kind] += now[kind] - self.total[kind]
        self._unread()  # what the probe's reads compiled

    def _unread(self) -> str:
        try:
            with open(self.analysis, "rb") as analysis:
                analysis.seek(self.read)
                written = analysis.read()
        except FileNotFoundError:  # nothing compiled yet
            return ""
        self.read += len(written)
        return written.decode(errors="replace")


def _function(spec: str):
    """``module:function``'s function."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


# Where a frame is not the script's: the interpreter's libraries (torch, torch_xla) and accrewrite's
# own package (the probe's hooks).
_LIBRARIES = tuple({os.path.join(path, "") for key, path in sysconfig.get_paths().items()
                    if key in ("stdlib", "platstdlib", "purelib", "platlib")}
                   | {os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")})
_METADATA = re.compile(r", metadata=\{.*\}")
_SOURCE = re.compile(r'source_file="(?P<path>[^"]+)" source_line=(?P<line>\d+)')
_NUMBERED = re.compile(r"(%[\w-]+)\.\d+")


def _operations(text: str) -> list[tuple[str, str]]:
    """A graph printed as HLO, as its operations in order: each line, its names' numbers and
    metadata left out, with the line that made it (``path:line`` from the metadata, ``""`` where
    none is given). Two graphs that differ in one slice's bounds differ in that slice alone."""
    found = []
    for line in text.splitlines():
        source = _SOURCE.search(line)
        found.append((_NUMBERED.sub(r"\1", _METADATA.sub("", line)).strip(),
                      f"{source['path']}:{source['line']}" if source else ""))
    return found


_ANALYSIS = "Compilation Analysis:"
_FRAME = re.compile(r"\s+\S+ \((?P<path>.+):(?P<line>\d+)\)$")


def compilation_sites(text: str, libraries: tuple[str, ...]) -> list[str]:
    """For each compilation that torch_xla's debug analysis describes in ``text`` (a block of
    ``Compilation Analysis:`` lines whose ``Python Frame Triggered Execution:`` lists the frames,
    innermost first), the innermost frame outside ``libraries`` as ``path:line``: the script's line
    that ran the graph that compiled (``""`` where no frame is given)."""
    sites, frames = [], None
    for line in text.splitlines():
        if not line.startswith(_ANALYSIS):
            continue
        rest = line[len(_ANALYSIS):]
        if rest.strip() == "Python Frame Triggered Execution:":
            frames = []
        elif frames is not None:
            frame = _FRAME.match(rest)
            if frame:
                frames.append(f"{frame['path']}:{frame['line']}")
                continue
            users = [site for site in frames if not site.startswith(libraries)]
            sites.append((users or frames[-1:] or [""])[0])  # else the outermost: nearest the script
            frames = None
    return sites


def install(recorder: Recorder) -> None:
    torch = recorder.torch
    backward = torch.Tensor.backward

    def recording_backward(self, *args, **kwargs):
        recorder.backward(self)
        return backward(self, *args, **kwargs)

    torch.Tensor.backward = recording_backward
    scale = torch.amp.GradScaler.scale

    def remembering_scale(self, outputs):
        scaled = scale(self, outputs)
        if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor) and scaled is not outputs:
            scaled._accrewrite_unscaled = outputs
        return scaled

    torch.amp.GradScaler.scale = remembering_scale
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(recorder.before_step)
    if recorder.nudged is not None:
        recorder.nudging = torch.nn.modules.module.register_module_forward_pre_hook(recorder.before_forward)
    register_optimizer_step_post_hook(recorder.after_step)
    os.register_at_fork(after_in_child=recorder._begin)  # born at the fork, not at its first step


def host_random(torch, device_type: str, as_caller: bool = False):
    """A torch function mode in which what draws random numbers for devices of ``device_type``
    draws them on the CPU generator and moves them there (attention's dropout as the CPU's
    attention draws its mask); to a lazy device's graph they are an input, as a batch is. Every other call goes through untouched (a dispatch mode would change
    XLA's lowering); with ``as_caller``, from a frame that carries its caller's file and line
    (``_pass``), so that what records the Python frame that made an operation (XLA_IR_DEBUG)
    records the script's line, not this mode's."""
    from torch.overrides import TorchFunctionMode

    F, T = torch.nn.functional, torch.Tensor
    dropouts = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d}
    fills = {T.normal_, T.uniform_, T.bernoulli_, T.random_, T.exponential_, T.cauchy_, T.log_normal_,
             T.geometric_}  # in place: they read only the shape of the tensor they fill
    shaped = {*fills, torch.randn_like, torch.rand_like, torch.randint_like}  # their first argument: its shape
    draws = {torch.randn, torch.rand, torch.randint, torch.randperm, torch.normal, torch.bernoulli, T.bernoulli,
             torch.multinomial, T.multinomial, torch.poisson, *shaped}
    init = torch.nn.init  # its functions hand their tensor on by keyword and fill it inside
    inits = {init.normal_, init.uniform_, init.trunc_normal_, init.kaiming_uniform_, init.kaiming_normal_,
             init.xavier_uniform_, init.xavier_normal_, init.orthogonal_, init.sparse_}

    def on_device(value):
        return value is not None and torch.device(value).type == device_type

    class HostRandom(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in dropouts:
                return self.dropout(func, *args, **kwargs)
            if func is F.scaled_dot_product_attention:
                return self.attention(func, args, kwargs)
            if func in inits:
                return self.initialise(func, *args, **kwargs)
            device = kwargs.get("device") or next((a.device for a in args if isinstance(a, torch.Tensor)), None)
            if func not in draws or not on_device(device):
                return _pass(func, args, kwargs) if as_caller else func(*args, **kwargs)
            host = [torch.empty(a.shape, dtype=a.dtype) if i == 0 and func in shaped
                    else a.cpu() if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
            drawn = func(*host, **{**kwargs, **({"device": "cpu"} if "device" in kwargs else {})})
            return args[0].copy_(drawn) if func in fills else drawn.to(device)

        @staticmethod
        def initialise(func, tensor, *args, **kwargs):
            if not on_device(tensor.device):
                return func(tensor, *args, **kwargs)
            host = torch.empty(tensor.shape, dtype=tensor.dtype)
            func(host, *args, **kwargs)
            with torch.no_grad():
                return tensor.copy_(host)

        @staticmethod
        def dropout(func, input, p=0.5, training=True, inplace=False):
            if not training or p == 0 or not on_device(input.device):
                return func(input, p, training, inplace)
            # The CPU draws the mask it draws for the original: dropout of ones is the mask, scaled.
            noise = func(torch.ones(input.shape, dtype=input.dtype), p, True).to(input.device)
            return input.mul_(noise) if inplace else input * noise

        @staticmethod
        def attention(func, args, kwargs):
            given = {**dict(zip(_ATTENTION_PARAMETERS, args)), **kwargs}
            query, key, value = given["query"], given["key"], given["value"]
            p = given.get("dropout_p", 0.0)
            if not p or not on_device(query.device):
                return func(*args, **kwargs)
            # The CPU's attention with dropout is its math form, whose mask is dropout's of the
            # weights' shape: the same form on the device, with the mask the CPU draws.
            if given.get("enable_gqa"):
                key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
                value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
            scale = given.get("scale") or query.size(-1) ** -0.5
            scores = query @ key.transpose(-2, -1) * scale
            mask = given.get("attn_mask")
            if given.get("is_causal"):
                mask = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
            weights = scores.softmax(-1)
            noise = F.dropout(torch.ones(weights.shape, dtype=weights.dtype), p, True).to(query.device)
            return (weights * noise) @ value

    return HostRandom()


_PASSES: dict = {}  # (file, line) -> a function whose one line is that line of that file


def _pass(func, args, kwargs):
    """``func(*args, **kwargs)``, called from a function compiled as the line of the frame below
    the caller's (the frame that called the mode), once per line."""
    frame = sys._getframe(2)
    where = (frame.f_code.co_filename, frame.f_lineno)
    passing = _PASSES.get(where)
    if passing is None:
        names: dict = {}
        exec(compile("\n" * (where[1] - 1) + "def passing(func, args, kwargs): return func(*args, **kwargs)",
                     where[0], "exec"), names)
        passing = _PASSES[where] = names["passing"]
    return passing(func, args, kwargs)


# torch.nn.functional.scaled_dot_product_attention's parameters, in order.
_ATTENTION_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class _Pace:
    """An iterable over ``loader`` that waits for ``ask()`` before each batch, and before
    ``iter(loader)`` (where a DataLoader draws its seeds); ``stop()`` ends it."""

    def __init__(self, loader):
        self.loader = loader
        self.asked = threading.Semaphore(0)
        self.stopped = False

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        if not self._asked():
            return
        iterator = iter(self.loader)
        while (batch := next(iterator, _Pace)) is not _Pace:  # the class: a value no loader yields
            yield batch
            if not self._asked():
                return

    def _asked(self) -> bool:
        self.asked.acquire()
        return not self.stopped

    def ask(self) -> None:
        self.asked.release()

    def stop(self) -> None:
        self.stopped = True
        self.asked.release()


def pace_loader(torch, loader_class) -> None:
    """Hold ``loader_class`` to the training loop's pace where the loader it wraps has no worker
    processes (workers draw from generators of their own). Its constructor takes the loader as
    ``cpu_loader`` and the batches it moves to the device at a time as ``device_prefetch_size``,
    ``next_item(device)`` is the loop asking for the next batch and ``close()`` ends an iteration,
    as in torch_xla's ParallelLoader. Its thread then loads a batch only while the loop waits for
    it, and moves it at once."""
    init, next_item, close = loader_class.__init__, loader_class.next_item, loader_class.close
    signature = inspect.signature(init)

    def paced_init(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        loader = bound.arguments["cpu_loader"]
        if not (isinstance(loader, torch.utils.data.DataLoader) and loader.num_workers > 0):
            self._accrewrite_pace = bound.arguments["cpu_loader"] = _Pace(loader)
            bound.arguments["device_prefetch_size"] = 1  # else its thread waits for that many to move any
        init(*bound.args, **bound.kwargs)

    def paced_next_item(self, device):
        pace = getattr(self, "_accrewrite_pace", None)
        if pace is not None:
            pace.ask()
        return next_item(self, device)

    def paced_close(self):
        pace = getattr(self, "_accrewrite_pace", None)
        if pace is not None:
            pace.stop()  # its thread may be waiting for the loop, which asks no more
        close(self)

    loader_class.__init__, loader_class.next_item, loader_class.close = paced_init, paced_next_item, paced_close


class _WhenImported(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once the module ``name`` has run, when the script first imports it
    (importing it here would start the target's runtime in a process that does not use it)."""

    def __init__(self, name: str, then):
        self.name = name
        self.then = then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                self.then(module)

            spec.loader.exec_module = exec_module
        return spec


def _when_imported(where: str, then) -> None:
    """Calls ``then(cls)`` once the script has imported the class ``where`` (``module:Class``)."""
    module, _, name = where.partition(":")
    sys.meta_path.insert(0, _WhenImported(module, lambda loaded: then(getattr(loaded, name))))


def find_one_device(finder) -> None:
    """Have a framework's accelerator class find one device where it finds none."""
    count = finder.auto_device_count

    def one_at_least():
        try:
            return max(1, count())
        except (ValueError, AssertionError, OSError):  # what looking for the hardware raises without it
            return 1

    finder.auto_device_count = staticmethod(one_at_least)
    finder.is_available = staticmethod(lambda: True)


def start() -> None:
    """Seed what the script may not, install the hooks; a no-op without torch. Every side's
    processes get the runtime's exit grace for gloo's threads (registered first, it runs last),
    so that a plain PyTorch DDP original ends as cleanly as its migration."""
    grace = os.environ.get(EXIT_GRACE)
    if grace:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_accrewrite_verify_exit_grace", grace)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    folder = os.environ.get(RECORDS)
    try:
        recorder = Recorder(folder, int(os.environ.get(STEPS) or 0)) if folder else None
    except ImportError:
        return
    if recorder is None:
        return
    random.seed(SEED)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(SEED)
    recorder.torch.manual_seed(SEED)
    install(recorder)
    if os.environ.get(HOST_RANDOM):
        mode = host_random(recorder.torch, os.environ[HOST_RANDOM], as_caller=bool(os.environ.get(GRAPH)))
        mode.__enter__()  # for the life of the process
    if os.environ.get(PACED_LOADER):
        _when_imported(os.environ[PACED_LOADER], lambda loader: pace_loader(recorder.torch, loader))
    for finder in filter(None, os.environ.get(DEVICE_FINDERS, "").split(",")):
        _when_imported(finder, find_one_device)
