"""The codemod on real training scripts: does it run cleanly, does it do what they need, and do
they still train the same.

    python benchmarks/real_scripts.py DIR [--targets runtime,torch_xla,torchacc] [--exclude GLOB]
        [--jobs N] [--list-diagnostics] [--json OUT]
        [--verify [--python PATH] [--xla-python PATH] [--steps 5] [--timeout S] [--recipe TEXT]
                  [--no-end | --end-only] [--run-jobs N]]

DIR holds fetched public repositories, one folder per repository (``owner+name``). It is only
read: migrations happen in memory, and verify runs work on copies in temporary directories.

1. Every ``.py`` file and notebook under DIR (``accrewrite.discovery.discover``, minus
   ``--exclude``; a notebook's code cells as one script, ``accrewrite.notebook``), is migrated to
   each target.
   Counted: internal errors (a FileError whose reason starts with "internal error": a rule's
   bug; among them "net refused", the names a migration leaves unbound,
   ``accrewrite.unbound``), other errors (Python 2 syntax, undecodable files), outputs
   that do not ``compile()`` although the original does, and outputs that are not idempotent
   (migrating the output again with the same options changes it).
2. Training scripts: files with a ``for``/``while`` loop whose body calls ``.backward(`` or
   ``.step(`` on something named like an optimizer (``optimizer``, ``opt_g``, ``self.optim``,
   or ``scaler.step(optimizer)``), directly or through a function or method of the same file
   that does (Python's ``ast``, not the codemod's analysis, so that it can judge the codemod),
   and that does not train through Accelerate, Lightning or torch.distributed.rpc (left as they
   are, with a note). Each needs, judged by the checks below on the original and on the
   migrated output:

   * device placement: the original places on CUDA: ``.cuda(``; ``.to(`` a CUDA string, an
     integer ordinal or a name like ``gpu``/``rank``/``device_id``; ``torch.device``,
     ``torch.set_default_device``, ``device=`` or ``map_location=`` of a CUDA string;
     ``device = <CUDA string>`` (a name with "device", not "..type", that no later statement
     of its block rebinds); ``torch.cuda.set_device``; ``torch.accelerator.current_accelerator()``;
     an argparse ``--device`` defaulting to one while ``args.device`` is read. A CUDA string is
     ``"cuda"``, ``"cuda:N"``, ``f"cuda:{..}"``, or a conditional, ``or``, ``.format``, ``%``,
     ``+`` or ``torch.device`` giving one. Satisfied when none of these remains and the
     target's device is called (runtime/torchacc ``xm.xla_device()``, torch_xla
     ``torch_xla.device()``).
   * device loader: a training ``for`` loop iterates a loader, under ``enumerate``, ``tqdm``,
     ``zip``, ``iter``, ``log_every`` or a name bound to one of them. A loader: a call to a
     ``*loader*`` callee (``DataLoader``), a class of the file deriving from ``*DataLoader`` or
     a function of the file returning one, or a name bound to such a call, or, bound to no
     call, a name with "loader" or a ``*_data`` name in a file that builds a loader. Satisfied
     when the target's ``MpDeviceLoader(`` takes each loader (or one of its wrappers, such as
     the ``tqdm``) as its first argument or is assigned to it.
   * gradient reduction: a training loop steps an optimizer in a script that places on CUDA
     or is distributed (``torch.distributed``, DDP: one CPU process has nothing to reduce), and
     the file neither shards (FSDP, ``fully_shard``, DTensor, ``parallelize_module``) nor
     reduces by itself (``torch.distributed`` all_reduce/reduce_scatter and no DDP).
     Satisfied when the output calls the target's ``optimizer_step``, ``reduce_gradients`` or
     ``all_reduce`` (torchacc: ``_fetch_gradients`` + ``all_reduce``).
   * AMP: ``torch.cuda.amp`` anywhere (imports too), ``torch.autocast``/``torch.amp.autocast``
     on a CUDA device type (a CUDA string or a name bound to one), ``torch.amp.GradScaler`` on
     CUDA (its default). Satisfied when none of these remains.

   Names are resolved through the file's imports, so any alias of a target module counts. The
   checks are per file: a helper module that another file shards or migrates is judged alone.
   A miss that the migration reports, because doing the work would break the script (ACC003
   keeping the host's loader for a loop that works on a batch on the host before moving it,
   ACC005 keeping DDP where no gradient reduction can go), is counted as reported.
3. Files that train: a training loop as above (a framework's too), or a framework's trainer
   built and trained through (transformers' or trl's ``*Trainer`` then ``.train()``, Lightning's
   ``Trainer`` then ``.fit()`` or a ``LightningCLI``, fastai's learner, d2l's ``Trainer``,
   Accelerate's ``Accelerator`` or Lightning's ``Fabric`` then ``.prepare()``/``.setup()``). Per
   target, how many the migration changed, how many it left unchanged with a finding (which
   says why and what to do; counted by code, ACC107 among them), how many it left silently
   (unchanged, no finding: listed, with what trains in them), how many say
   ``# accrewrite: skip-file`` (the user's choice) and how many it failed on.
4. Diagnostics by code and target; ``--list-diagnostics`` prints every ACC101/ACC102/ACC103
   finding of the runtime target as ``path:line: CODE <source line>``, to label by hand.
5. ``--verify``: ``accrewrite verify`` on every script in ``RECIPES`` found in DIR, in a scratch
   directory holding a copy of the script's directory (two folders deep, so that ``../../data``
   stays inside it; verify runs a notebook's code cells in order) and synthetic data (no network):
   ``original,runtime`` and ``original,torch_xla``, or ``runtime,torch_xla`` (counted for both)
   where the original needs CUDA, or only ``original,runtime`` where it places nothing on a
   device. Each verdict comes with the torch_xla side's graph profile that verify prints: per
   step after warm-up, graph executions and host transfers, the compilations after warm-up and
   what changed and ran the first of them. ``--python`` runs ``-m accrewrite.cli verify`` and
   with it the original and the runtime side; ``--xla-python`` (default ``$ACCREWRITE_XLA_PYTHON``) the
   torch_xla side, which is skipped without one. A recipe whose original cannot run here is not
   counted as verified. Then, unless ``--no-end``, each side (the original where it runs here,
   runtime, torch_xla on PJRT_DEVICE=CPU) is run as a user runs it, with the recipe's arguments,
   to the script's end: verify stops after its steps and sees nothing after them (evaluation,
   generation, a second model, a checkpoint loaded back). Recorded: the exit status, the end of
   stderr when it failed, and for torch_xla how many graphs XLA executed and compiled and how
   many operations fell back to the CPU, summed over its processes (``SITE``, a module every
   process imports first, reports them at exit). ``--end-only`` runs these and no verify;
   ``--run-jobs`` recipes at a time.
6. A table per script (verify within the tolerance, ran to the end, XLA executions), a
   summary per target, and with ``--json OUT`` everything above as JSON.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import pickle
import random
import re
import shutil
import signal
import socket
import string
import struct
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from array import array
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from accrewrite.discovery import discover
from accrewrite.engine import SKIP_FILE, FileResult, Options, migrate_source
from accrewrite.errors import MigrationError
from accrewrite.notebook import Notebook, is_notebook
from accrewrite.unbound import REFUSAL
from accrewrite.verify.workspace import Workspace

DEFAULT_TARGETS = ("runtime", "torch_xla", "torchacc")
LISTED_DIAGNOSTICS = ("ACC101", "ACC102", "ACC103")
DEVICE, LOADER, REDUCTION, AMP = "device placement", "device loader", "gradient reduction", "AMP"


@dataclass(frozen=True)
class Spelling:
    """How a target's migrated script spells what the checks look for (rules/targets/*.toml)."""

    xm: str  # the xla_model module
    pl: str  # the parallel_loader module
    devices: tuple[str, ...]  # calls that give the target's device

    @property
    def reductions(self) -> tuple[str, ...]:
        return tuple(f"{self.xm}.{name}" for name in ("optimizer_step", "reduce_gradients", "all_reduce"))


SPELLINGS = {
    "runtime": Spelling("accrewrite.runtime.xla_model", "accrewrite.runtime.parallel_loader",
                        ("accrewrite.runtime.xla_model.xla_device",)),
    "torch_xla": Spelling("torch_xla.core.xla_model", "torch_xla.distributed.parallel_loader",
                          ("torch_xla.device", "torch_xla.core.xla_model.xla_device")),
    "torchacc": Spelling("torchacc.torch_xla.core.xla_model", "torchacc.torch_xla.distributed.parallel_loader",
                         ("torchacc.torch_xla.core.xla_model.xla_device",)),
}


# What a module spells ------------------------------------------------------------------------


class Facts:
    """One module's imports, bindings, functions and classes, by name: what the checks resolve
    names against (file-wide, ignoring scopes, except where ``Scope`` says otherwise)."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.aliases: dict[str, str] = {}
        self.bindings = bindings(ast.walk(tree))
        self.functions: dict[str, list[ast.FunctionDef]] = defaultdict(list)
        self.methods: dict[str, list[ast.FunctionDef]] = defaultdict(list)
        self.classes: dict[str, ast.ClassDef] = {}
        in_class = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):  # ``import a.b`` binds ``a`` to itself: no alias
                self.aliases.update((alias.asname, alias.name) for alias in node.names if alias.asname)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.methods[item.name].append(item)
                        in_class.add(item)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node not in in_class:
                self.functions[node.name].append(node)

    def qualified(self, node: ast.expr) -> str | None:
        """The dotted name an expression spells, its first name expanded through the imports."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def calls(self, qualified: tuple[str, ...]) -> list[ast.Call]:
        return [node for node in ast.walk(self.tree)
                if isinstance(node, ast.Call) and self.qualified(node.func) in qualified]


class Scope:
    """Bindings as one function (or the module) sees them: its own first, else the file's, so
    that ``it = tqdm(train_loader)`` in one function does not stand for ``it`` in another."""

    def __init__(self, facts: Facts, body: list[ast.stmt]):
        self.facts = facts
        self.local = bindings(walk_local(body))

    def values(self, expr: ast.expr) -> list[ast.expr]:
        name = key(expr)
        return self.local.get(name) or self.facts.bindings.get(name, [])

    def calls(self, expr: ast.expr) -> list[ast.Call]:
        return [value for value in self.values(expr) if isinstance(value, ast.Call)]


def bindings(nodes) -> dict[str, list[ast.expr]]:
    """What the assignments among ``nodes`` bind, by ``key``; a tuple target binds each of its
    names to the matching element, or to the whole value."""
    found = defaultdict(list)

    def bind(target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            same_shape = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
            for i, element in enumerate(target.elts):
                bind(element, value.elts[i] if same_shape else value)
        elif key(target):
            found[key(target)].append(value)

    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                bind(target, node.value)
    return found


def key(node: ast.expr) -> str | None:
    """How bindings are looked up: ``name`` or ``self.attr`` (the source of an attribute chain)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
        return ast.unparse(node)
    return None


def identifier(node: ast.expr) -> str | None:
    """The last name an expression spells: ``optimizer`` for ``self.optimizer`` or ``optimizer[0]``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def walk_local(nodes):
    """The nodes under ``nodes`` that run when they run: nested functions, lambdas and classes
    are left out (they run when called, which the call graph follows)."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node)
                     if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)))


# Training loops ------------------------------------------------------------------------------

_OPTIMIZER = re.compile(r"[Oo]ptim|(^|_)opt(?![a-z])")
BACKWARD, STEP = "backward", "step"


def _optimizer_like(node: ast.expr) -> bool:
    name = identifier(node)
    return bool(name and _OPTIMIZER.search(name))


def _direct(nodes) -> tuple[set[str], list[ast.Call]]:
    """What ``nodes`` do themselves (backward, optimizer step) and the calls they make."""
    does, calls = set(), []
    for node in walk_local(nodes):
        if not isinstance(node, ast.Call):
            continue
        calls.append(node)
        if isinstance(node.func, ast.Attribute):
            if node.func.attr == BACKWARD:
                does.add(BACKWARD)
            elif node.func.attr == STEP and (
                _optimizer_like(node.func.value) or node.args and _optimizer_like(node.args[0])
            ):
                does.add(STEP)
    return does, calls


class Training:
    """Which functions of a module train (transitively) and which of its loops are training
    loops: ``f()`` calls the file's functions named ``f``, ``x.f()`` its methods named ``f``."""

    def __init__(self, facts: Facts):
        self.facts = facts
        defs = [d for group in (*facts.functions.values(), *facts.methods.values()) for d in group]
        direct = {d: _direct(d.body) for d in defs}
        self.does = {d: set(does) for d, (does, _) in direct.items()}
        changed = True
        while changed:
            changed = False
            for d, (_, calls) in direct.items():
                reached = set().union(*(self.does[callee] for call in calls for callee in self._callees(call)))
                if not reached <= self.does[d]:
                    self.does[d] |= reached
                    changed = True
        self.loops: dict[ast.stmt, set[str]] = {}
        self.scopes: dict[ast.stmt, Scope] = {}  # each training loop's innermost function
        for owner in (facts.tree, *defs):
            scope = Scope(facts, owner.body)
            for node in walk_local(owner.body):
                if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
                    does, calls = _direct(node.body)
                    does |= set().union(*(self.does[callee] for call in calls for callee in self._callees(call)))
                    if does:
                        self.loops[node] = does
                        self.scopes[node] = scope

    def _callees(self, call: ast.Call) -> list[ast.FunctionDef]:
        if isinstance(call.func, ast.Name):
            return self.facts.functions.get(call.func.id, [])
        if isinstance(call.func, ast.Attribute):
            return self.facts.methods.get(call.func.attr, [])
        return []

    @property
    def steps(self) -> bool:
        return any(STEP in does for does in self.loops.values())


# Training a framework runs ------------------------------------------------------------------

# A framework's trainer (transformers' and trl's Trainer, Lightning's, fastai's Learner, d2l's
# Trainer) or launcher (Accelerate's Accelerator, Lightning's Fabric), and the calls that train
# through it. LightningCLI fits as it is built.
_FRAMEWORKS = ("transformers", "trl", "lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "fastai",
               "d2l")
_TRAINERS = re.compile(r"\w*Trainer|Accelerator|Fabric|Learner|\w+_learner|LightningCLI")
_FITS = {"fit", "train", "fine_tune", "fit_one_cycle", "prepare", "setup", "backward"}


def framework_training(facts: Facts) -> str | None:
    """``framework Trainer`` where a framework's trainer is built and trained through (``x =
    Trainer(..)`` then ``x.fit(..)``, or ``Trainer(..).fit(..)``), else None."""
    starred = [node.module.split(".")[0] for node in ast.walk(facts.tree)
               if isinstance(node, ast.ImportFrom) and node.module and any(a.name == "*" for a in node.names)]
    for node in ast.walk(facts.tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in _FITS:
            receiver = node.func.value
            built = [receiver] if isinstance(receiver, ast.Call) else [
                value for value in facts.bindings.get(key(receiver) or "", []) if isinstance(value, ast.Call)]
        elif (found := _trainer(facts, node.func, starred)) and found.endswith("LightningCLI"):
            return found
        else:
            continue
        for call in built:
            if found := _trainer(facts, call.func, starred):
                return found
    return None


def _trainer(facts: Facts, built: ast.expr, starred: list[str], depth: int = 0) -> str | None:
    """``framework Name`` when ``built`` names a framework's trainer: a name imported from one, a
    bare name where the file star-imports one, or a class of the file deriving from one."""
    name = facts.qualified(built)
    if name in facts.classes and depth < 3:
        return next(filter(None, (_trainer(facts, base, starred, depth + 1) for base in facts.classes[name].bases)),
                    None)
    if name is None or not _TRAINERS.fullmatch(name.rsplit(".", 1)[-1]):
        return None
    module = name.split(".")[0]
    if "." not in name and name not in facts.aliases:
        module = next((m for m in starred if m in _FRAMEWORKS), "")
    return f"{module} {name.rsplit('.', 1)[-1]}" if module in _FRAMEWORKS else None


# Loaders -------------------------------------------------------------------------------------

_WRAPPERS = {"enumerate", "iter", "tqdm", "zip", "islice", "log_every"}
_INDEXING = {"enumerate", "iter", "zip"}  # a device loader goes inside these, not around them


def _iterated(scope: Scope, expr: ast.expr, via: tuple[str, ...] = ()):
    """What a loop iterates under its wrappers, with the wrappers a device loader may take
    instead: ``loader`` in ``enumerate(tqdm(loader))``, or in ``pbar`` after
    ``pbar = tqdm(loader)`` (``pbar`` and ``tqdm(loader)`` may be wrapped too)."""
    if isinstance(expr, ast.Call) and identifier(expr.func) in _WRAPPERS:
        name = identifier(expr.func)
        inner = via if name in _INDEXING else (*via, ast.unparse(expr))
        for arg in expr.args if name == "zip" else expr.args[:1]:
            yield from _iterated(scope, arg, inner)
        return
    wrapped = [call for call in scope.calls(expr) if identifier(call.func) in _WRAPPERS]
    if wrapped and key(expr) not in via:
        for call in wrapped:
            yield from _iterated(scope, call, (*via, key(expr)))
    else:
        yield expr, (*via, ast.unparse(expr))


def _loader_call(facts: Facts, call: ast.Call, depth: int = 0) -> bool:
    """Whether a call builds a loader: a class of the file deriving from ``*DataLoader``, a
    function of the file returning a loader, else any callee named with "loader"."""
    name = identifier(call.func) or ""
    if name in facts.classes:
        return any((identifier(base) or "").endswith("DataLoader") for base in facts.classes[name].bases)
    if name in facts.functions:
        return depth < 3 and any(_returns_loader(facts, function, depth + 1) for function in facts.functions[name])
    return "loader" in name.lower()


def _returns_loader(facts: Facts, function: ast.FunctionDef, depth: int) -> bool:
    scope = Scope(facts, function.body)
    returned = [node.value for node in walk_local(function.body) if isinstance(node, ast.Return) and node.value]
    return any(_loader_call(facts, call, depth)
               for value in returned for call in ([value] if isinstance(value, ast.Call) else scope.calls(value)))


def is_loader(scope: Scope, expr: ast.expr, builds_loader: bool) -> bool:
    if isinstance(expr, ast.Call):
        return _loader_call(scope.facts, expr)
    if calls := scope.calls(expr):
        return any(_loader_call(scope.facts, call) for call in calls)
    name = identifier(expr) or ""
    return "loader" in name.lower() or (name.endswith("_data") and builds_loader)


def training_loaders(facts: Facts, training: Training) -> dict[str, set[str]]:
    """The loaders training ``for`` loops iterate, as source text, each with the expressions a
    device loader may wrap instead (itself and its wrappers)."""
    builds = any(isinstance(n, ast.Call) and _loader_call(facts, n) for n in ast.walk(facts.tree))
    found = {}
    for loop, scope in training.scopes.items():
        if isinstance(loop, (ast.For, ast.AsyncFor)):
            for expr, wrappable in _iterated(scope, loop.iter):
                if is_loader(scope, expr, builds):
                    found.setdefault(ast.unparse(expr), set()).update(wrappable)
    return found


def wrapped_loaders(facts: Facts, spelling: Spelling) -> set[str]:
    """The loaders an output hands to the target's MpDeviceLoader, or rebinds to one."""
    wrappers = facts.calls((f"{spelling.pl}.MpDeviceLoader",))
    found = {ast.unparse(call.args[0]) for call in wrappers if call.args}
    inner = set(wrappers)
    for node in ast.walk(facts.tree):
        if isinstance(node, ast.Assign) and any(n in inner for n in ast.walk(node.value)):
            found.update(ast.unparse(target) for target in node.targets)
    return found


# CUDA spellings and sharding -----------------------------------------------------------------

_CUDA = re.compile(r"cuda(:.*)?")
_ORDINAL = re.compile(r"gpu|(^|_)rank$|device_id")
_AUTOCASTS = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast")
_SCALERS = ("torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler")
_SHARDING_MODULES = ("accelerate", "torch.distributed.fsdp", "torch.distributed._composable.fsdp",
                     "torch.distributed.tensor", "torch.distributed._tensor")
_SHARDING_CALLS = {"fully_shard", "FullyShardedDataParallel", "FSDP", "parallelize_module", "distribute_tensor",
                   "Accelerator"}
_COLLECTIVES = {"all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced"}


def _cuda_string(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(_CUDA.fullmatch(node.value))
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and str(first.value).startswith("cuda")
    return False


def mentions_cuda(expr: ast.AST) -> bool:
    """Whether an expression can evaluate to a CUDA string or device: ``"cuda"`` itself, a
    conditional or ``or`` with one, ``"cuda:{}".format(..)``, ``"cuda:%d" % ..``,
    ``"cuda:" + ..``, ``torch.device(<one of these>)``. Not ``"cuda" in device`` or
    ``s.replace("cuda:", "")``: those only read one."""
    if _cuda_string(expr):
        return True
    if isinstance(expr, ast.IfExp):
        return mentions_cuda(expr.body) or mentions_cuda(expr.orelse)
    if isinstance(expr, ast.BoolOp):
        return any(mentions_cuda(value) for value in expr.values)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mod, ast.Add)):
        return mentions_cuda(expr.left)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "format":
        return mentions_cuda(expr.func.value)
    if isinstance(expr, ast.Call) and identifier(expr.func) == "device":
        return any(mentions_cuda(arg) for arg in expr.args)
    return False


def _cuda_valued(facts: Facts, expr: ast.expr) -> bool:
    """A CUDA string, or a name bound to one (one level)."""
    return mentions_cuda(expr) or any(mentions_cuda(v) for v in facts.bindings.get(key(expr), []))


def _ordinal(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Constant):
        return type(expr.value) is int
    return bool(_ORDINAL.search(identifier(expr) or ""))


def cuda_placements(facts: Facts) -> list[tuple[int, str]]:
    """(line, source) of every CUDA placement (see the module docstring)."""
    read = _options_read(facts)
    found = [node for node in ast.walk(facts.tree) if isinstance(node, ast.Call) and _places_on_cuda(facts, node, read)]
    found += _device_assignments(facts)
    return sorted((node.lineno, ast.unparse(node)) for node in found)


def _places_on_cuda(facts: Facts, call: ast.Call, read: set[str] | None) -> bool:
    name = facts.qualified(call.func)
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    if method == "cuda" or name in ("torch.cuda.set_device", "torch.accelerator.current_accelerator"):
        return True
    if method == "to":
        moved = [*call.args, *([keywords["device"]] if "device" in keywords else [])]
        return any(mentions_cuda(arg) or _ordinal(arg) for arg in moved)
    if name in ("torch.device", "torch.set_default_device"):
        return bool(call.args) and mentions_cuda(call.args[0])
    if method == "add_argument":
        dest = _dest(call)
        return ("device" in (dest or "") and "default" in keywords and mentions_cuda(keywords["default"])
                and (read is None or dest in read))
    if name in _AUTOCASTS + _SCALERS:
        return False  # AMP's own check
    return any(mentions_cuda(keywords[k]) for k in ("device", "map_location") if k in keywords)


def _dest(call: ast.Call) -> str | None:
    """The attribute an argparse option lands in."""
    for k in call.keywords:
        if k.arg == "dest" and isinstance(k.value, ast.Constant):
            return str(k.value.value)
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    long = [f for f in flags if f.startswith("--")] or flags
    return long[0].lstrip("-").replace("-", "_") if long else None


def _options_read(facts: Facts) -> set[str] | None:
    """The options read from ``parse_args()``'s result (``args.device``), None when the file
    has no such result (then every option counts as read)."""
    parsing = ("parse_args", "parse_known_args")
    holders = {name for name, values in facts.bindings.items()
               if any(isinstance(v, ast.Call) and identifier(v.func) in parsing for v in values)}
    if not holders:
        return None
    return {node.attr for node in ast.walk(facts.tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in holders}


def _device_assignments(facts: Facts) -> list[ast.stmt]:
    """``device = "cuda"...`` (a name with "device", not "..type"), unless a later statement
    of the same block rebinds the name to something else."""
    found = []
    for block in _blocks(facts.tree):
        for index, statement in enumerate(block):
            names = _cuda_device_names(statement)
            if names and not any(_cuda_device_names(later, cuda=False) & names for later in block[index + 1:]):
                found.append(statement)
    return found


def _cuda_device_names(statement: ast.stmt, cuda: bool = True) -> set[str]:
    """The device-named keys a statement binds to a CUDA string (``cuda=False``: to anything else)."""
    if not isinstance(statement, (ast.Assign, ast.AnnAssign)) or statement.value is None:
        return set()
    if mentions_cuda(statement.value) != cuda:
        return set()
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    names = {key(t) for t in targets if key(t)}
    return {n for n in names if "device" in n.lower() and not n.endswith("type")}


def _blocks(tree: ast.Module):
    """Every list of statements: module, function, loop and branch bodies."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def cuda_amp(facts: Facts) -> list[tuple[int, str]]:
    """(line, source) of every CUDA AMP spelling (see the module docstring)."""
    found = {}
    for node in ast.walk(facts.tree):
        if _imports_cuda_amp(node):
            found.setdefault(node.lineno, node)
        elif isinstance(node, (ast.Name, ast.Attribute)) and (facts.qualified(node) or "").startswith("torch.cuda.amp"):
            found.setdefault(node.lineno, node)
        elif isinstance(node, ast.Call) and facts.qualified(node.func) in _AUTOCASTS + _SCALERS:
            device = node.args[0] if node.args else next(
                (k.value for k in node.keywords if k.arg in ("device_type", "device")), None)
            is_scaler = facts.qualified(node.func) in _SCALERS
            if device is None and is_scaler or device is not None and _cuda_valued(facts, device):
                found.setdefault(node.lineno, node)
    return [(line, ast.unparse(node)) for line, node in sorted(found.items())]


def _imports_cuda_amp(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.startswith("torch.cuda.amp") for a in node.names)
    if isinstance(node, ast.ImportFrom) and node.module:
        return node.module.startswith("torch.cuda.amp") or node.module == "torch.cuda" and any(
            a.name == "amp" for a in node.names)
    return False


def reduced_already(facts: Facts) -> bool:
    """Gradients that need no all-reduce of ours: FSDP, DTensor or Accelerate, or the script's
    own torch.distributed collectives where it has no DDP for the migration to remove."""
    collectives = ddp = False
    for node in ast.walk(facts.tree):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        if any(m == s or m.startswith(s + ".") for m in modules for s in _SHARDING_MODULES):
            return True
        if isinstance(node, ast.Call):
            name = identifier(node.func)
            if name in _SHARDING_CALLS:
                return True
            collectives |= name in _COLLECTIVES and (facts.qualified(node.func) or "").startswith("torch.distributed.")
            ddp |= name in ("DistributedDataParallel", "DDP")
    return collectives and not ddp


# Needs and coverage --------------------------------------------------------------------------


@dataclass
class Original:
    """A training script's needs: for each, what in the original calls for it."""

    needs: dict[str, str]
    loaders: dict[str, set[str]]  # each loader: what a device loader may wrap


@dataclass
class Need:
    name: str
    satisfied: bool
    why: str = ""  # for a miss: what is left or absent
    said: bool = False  # a miss the migration reports itself, where doing it would break the script


def parse(source: bytes) -> ast.Module | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ast.parse(source)
        except (SyntaxError, ValueError):
            return None


def analyse_original(source: bytes) -> Original | None:
    """The needs of a training script; None for a file that is not one (or does not parse)."""
    tree = parse(source)
    if tree is None:
        return None
    facts = Facts(tree)
    training = Training(facts)
    if not training.loops or _imports(facts, _MANAGED_MODULES):
        return None  # a framework's training (or RPC's) is its own: left as it is, with a note
    needs = {}
    placements = cuda_placements(facts)
    if placements:
        needs[DEVICE] = _where(placements)
    loaders = training_loaders(facts, training)
    if loaders:
        needs[LOADER] = ", ".join(loaders)
    distributed = _imports(facts, ("torch.distributed", "torch.nn.parallel")) or _calls_ddp(facts)
    if training.steps and (placements or distributed) and not reduced_already(facts):
        needs[REDUCTION] = "an optimizer step in a training loop"  # (a single CPU process reduces nothing)
    if amp := cuda_amp(facts):
        needs[AMP] = _where(amp)
    return Original(needs, loaders)


# Training that a framework runs, and RPC's, which moves its gradients through distributed autograd.
_MANAGED_MODULES = ("accelerate", "lightning", "pytorch_lightning", "torch.distributed.rpc")


def _imports(facts: Facts, modules: tuple[str, ...]) -> bool:
    """Whether the file imports one of ``modules`` (or something inside one)."""
    for node in ast.walk(facts.tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if isinstance(node, ast.ImportFrom) and node.module else [])
        if any(name == m or name.startswith(m + ".") for name in names for m in modules):
            return True
    return False


def _calls_ddp(facts: Facts) -> bool:
    return any(isinstance(node, ast.Call) and identifier(node.func) in ("DistributedDataParallel", "DDP")
               for node in ast.walk(facts.tree))


def _where(found: list[tuple[int, str]]) -> str:
    line, text = found[0]
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return f"line {line}: {_short(text)}{more}"


def _short(text: str, width: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def check_output(original: Original, output: bytes, target: str) -> list[Need]:
    """Whether the output does what each need of the original asks."""
    tree = parse(output)
    if tree is None:
        return [Need(name, False, "the output does not parse") for name in original.needs]
    facts = Facts(tree)
    spelling = SPELLINGS[target]
    needs = []
    for name in original.needs:
        why = _CHECKS[name](facts, spelling, original)
        needs.append(Need(name, not why, why))
    return needs


def _check_device(facts: Facts, spelling: Spelling, original: Original) -> str:
    """What keeps the need unsatisfied ("" when nothing does); likewise below."""
    if placements := cuda_placements(facts):
        return _where(placements) + " remains"
    if not facts.calls(spelling.devices):
        return f"no {' or '.join(spelling.devices)}() call"
    return ""


def _check_loaders(facts: Facts, spelling: Spelling, original: Original) -> str:
    wrapped = wrapped_loaders(facts, spelling)
    missing = [loader for loader, wrappable in original.loaders.items() if not wrappable & wrapped]
    return f"not wrapped in {spelling.pl}.MpDeviceLoader: {', '.join(missing)}" if missing else ""


def _check_reduction(facts: Facts, spelling: Spelling, original: Original) -> str:
    return "" if facts.calls(spelling.reductions) else f"no {spelling.xm}.optimizer_step/reduce_gradients/all_reduce"


def _check_amp(facts: Facts, spelling: Spelling, original: Original) -> str:
    amp = cuda_amp(facts)
    return _where(amp) + " remains" if amp else ""


_CHECKS = {DEVICE: _check_device, LOADER: _check_loaders, REDUCTION: _check_reduction, AMP: _check_amp}

# The findings that say why a need is left undone on purpose: a loop that works on a batch on the
# host before moving it keeps its host loader; DDP kept where no gradient reduction can go.
_SAYS = {LOADER: ("ACC003", "is used on the host"), REDUCTION: ("ACC005", "DistributedDataParallel kept")}


def said(needs: list[Need], diagnostics) -> list[Need]:
    """``needs`` with each miss that one of ``diagnostics`` reports marked ``said``."""
    for need in needs:
        code, words = _SAYS.get(need.name, ("", ""))
        need.said = not need.satisfied and any(d.code == code and words in d.message for d in diagnostics)
    return needs


# The corpus pass -----------------------------------------------------------------------------


@dataclass
class FileReport:
    path: str  # relative to DIR
    target: str
    error: str | None = None
    internal: bool = False
    compiles: bool | None = None  # None: the original does not compile either
    idempotent: bool | None = None  # None: not migrated
    idempotency_note: str = ""
    diagnostics: list[tuple[str, int]] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)  # the codes of the rules that changed it
    training: bool = False
    needs: list[Need] = field(default_factory=list)
    trains: str = ""  # a training loop, or a framework's trainer (``what_trains``); "" for neither
    outcome: str = ""  # for a file that trains, what the migration did with it (``outcome``)


def _compiles(source: bytes, path: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(source, path, "exec", dont_inherit=True)
            return True
        except (SyntaxError, ValueError):
            return False


def examine(path: str, relative: str, target: str) -> FileReport:
    """Migrate one file to one target and judge the output."""
    try:
        source = script_of(Path(path))
    except MigrationError as exc:  # a notebook nbformat cannot read
        return FileReport(relative, target, error=exc.error.reason)
    options = Options(target=target)
    result = migrate_source(source, path, options)
    report = FileReport(relative, target, diagnostics=[(d.code, d.line) for d in result.diagnostics],
                        fixes=sorted({f.code for f in result.fixes}))
    if result.error is not None:
        report.error = result.error.reason
        report.internal = result.error.reason.startswith("internal error")
    elif result.output == source:
        report.idempotent = True
    else:
        again = migrate_source(result.output, path, options)
        report.idempotent = again.error is None and again.output == result.output
        if again.error is not None:
            report.idempotency_note = f"second migration failed: {again.error.reason}"
    if _compiles(source, path):
        report.compiles = _compiles(result.output, path)
    original = analyse_original(source)
    if original is not None:
        report.training = True
        report.needs = said(check_output(original, result.output, target), result.diagnostics)
    report.trains = what_trains(source)
    if report.trains:
        report.outcome = outcome(source, result)
    return report


def script_of(path: Path) -> bytes:
    """What the migration reads of a file: a notebook's code cells as one script."""
    data = path.read_bytes()
    return Notebook.read(data).script() if is_notebook(path.name) else data


LOOP = "a training loop"
# The rules whose findings speak of a framework's training (ACC017-ACC019: Trainer, Lightning and
# Accelerate scripts; ACC107: RPC; ACC109: a library's trainer, d2l's or fastai's).
FRAMEWORK_CODES = ("ACC017", "ACC018", "ACC019", "ACC107", "ACC109")
MIGRATED, DIAGNOSED, SILENT, SKIPPED, FAILED = "migrated", "diagnosed", "silent", "skipped by the user", "failed"


def what_trains(source: bytes) -> str:
    """``framework Trainer`` for a file that trains through a framework's trainer, ``LOOP`` for
    one with a training loop (a framework's or its own), "" for a file that does not train."""
    tree = parse(source)
    if tree is None:
        return ""
    facts = Facts(tree)
    return framework_training(facts) or (LOOP if Training(facts).loops else "")


def outcome(source: bytes, result: FileResult) -> str:
    """What the migration did with a file that trains: changed it, left it with a finding that
    says why and what to do, left it silently (unchanged, not a word), or was told to skip it."""
    if SKIP_FILE.search(source):
        return SKIPPED
    if result.error is not None:
        return FAILED
    if result.output != source:
        return MIGRATED
    return DIAGNOSED if result.diagnostics else SILENT


def corpus_pass(directory: Path, paths: list[Path], targets: list[str], jobs: int) -> list[FileReport]:
    """Every file to every target, in worker processes; progress on stderr."""
    tasks = [(str(p), p.relative_to(directory).as_posix(), t) for t in targets for p in paths]
    reports = []

    def done(report: FileReport) -> None:
        reports.append(report)
        if len(reports) % 100 == 0 or len(reports) == len(tasks):
            print(f"migrated {len(reports)}/{len(tasks)} (file, target)", file=sys.stderr, flush=True)

    if jobs == 1:
        for task in tasks:
            done(_examine_safely(*task))
    else:
        with ProcessPoolExecutor(jobs) as pool:
            for future in as_completed([pool.submit(_examine_safely, *task) for task in tasks]):
                done(future.result())
    order = {t: i for i, t in enumerate(targets)}
    return sorted(reports, key=lambda r: (order[r.target], r.path))


def _examine_safely(path: str, relative: str, target: str) -> FileReport:
    """A file the benchmark itself cannot handle is reported, not fatal."""
    try:
        return examine(path, relative, target)
    except Exception as exc:  # noqa: BLE001 - one file never stops the run
        return FileReport(relative, target, error=f"benchmark could not examine it: {type(exc).__name__}: {exc}")


# Synthetic data for the verify recipes -------------------------------------------------------


def _png(path: Path, width: int, height: int, rng: random.Random, classes: int = 0) -> None:
    """A random RGB PNG, or with ``classes`` a grayscale one whose pixels are class indices below
    it, a segmentation mask (standard library only: zlib and struct)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    def row() -> bytes:
        return bytes(rng.randrange(classes) for _ in range(width)) if classes else rng.randbytes(width * 3)

    rows = b"".join(b"\x00" + row() for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0 if classes else 2, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 1)) + chunk(b"IEND", b"")
    path.write_bytes(png)


def image_folder(root: Path, splits=("train", "val"), classes=2, per_class=6, size=(40, 32)) -> None:
    rng = random.Random(0)
    for split in splits:
        for c in range(classes):
            for i in range(per_class):
                _png(root / split / f"class{c}" / f"{i}.png", *size, rng)


def mnist_raw(root: Path, train: int = 256, test: int = 64, name: str = "MNIST") -> None:
    """torchvision's unpacked MNIST (``root/MNIST/raw``), or FashionMNIST with ``name``: with
    these present it downloads nothing."""
    rng = random.Random(0)
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        images = struct.pack(">IIII", 2051, n, 28, 28) + rng.randbytes(n * 784)
        labels = struct.pack(">II", 2049, n) + bytes(rng.randrange(10) for _ in range(n))
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(images)
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(labels)


def mnist(root: str, train: int = 256, test: int = 64, name: str = "MNIST") -> Callable[[Path, str], None]:
    """The data helper that writes MNIST (or ``name``) at ``root``, relative to the working
    directory: tutorials hard-code their epochs and batch sizes, so ``train`` and ``test`` set
    how many steps they make."""
    def write(cwd: Path, python: str) -> None:
        mnist_raw(cwd / root, train, test, name)
    return write


def with_numpy(folder: Path, code: str, python: str) -> None:
    """Runs ``code`` in ``folder`` (made) with the verify interpreter, which has numpy."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-c", code], cwd=folder, check=True, capture_output=True, timeout=120)


def cifar10(root: str, train: int = 40, test: int = 12) -> Callable[[Path, str], None]:
    """torchvision's ``cifar-10-batches-py`` at ``root``: five training batches and a test batch
    of random pixels, uint8 arrays as torchvision reads them, so the interpreter writes them with
    numpy; their checksums pass through ``SITE``. Each batch of ten or more holds every class:
    tutorials end with an accuracy per class, which divides by the class's count."""
    def write(cwd: Path, python: str) -> None:
        code = (f"import numpy as np, pickle; rng = np.random.default_rng(0); n = {train}; "
                "sizes = [n // 5 + (i < n % 5) for i in range(5)]\n"
                "names = [f'data_batch_{i + 1}' for i in range(5)] + ['test_batch']\n"
                f"for name, k in zip(names, sizes + [{test}]):\n"
                "    batch = {'data': rng.integers(0, 256, (k, 3072), dtype=np.uint8), "
                "'labels': rng.permutation(np.arange(k) % 10).tolist()}\n"
                "    pickle.dump(batch, open(name, 'wb'))\n"
                "pickle.dump({'label_names': [f'class{i}' for i in range(10)]}, open('batches.meta', 'wb'))")
        with_numpy(cwd / root / "cifar-10-batches-py", code, python)
    return write


def cifar100(root: str, train: int = 200, test: int = 100) -> Callable[[Path, str], None]:
    """torchvision's ``cifar-100-python`` at ``root`` (``train``, ``test``, ``meta``), random pixels,
    every class in turn; the checksums pass through ``SITE`` as CIFAR-10's do."""
    def write(cwd: Path, python: str) -> None:
        code = ("import numpy as np, pickle; rng = np.random.default_rng(0)\n"
                f"for name, k in (('train', {train}), ('test', {test})):\n"
                "    batch = {'data': rng.integers(0, 256, (k, 3072), dtype=np.uint8), "
                "'fine_labels': (np.arange(k) % 100).tolist(), 'coarse_labels': (np.arange(k) % 20).tolist()}\n"
                "    pickle.dump(batch, open(name, 'wb'))\n"
                "pickle.dump({'fine_label_names': [f'class{i}' for i in range(100)], "
                "'coarse_label_names': [f'super{i}' for i in range(20)]}, open('meta', 'wb'))")
        with_numpy(cwd / root / "cifar-100-python", code, python)
    return write


def text(name: str, kind: str = "chars", size: int = 6000) -> Callable[[Path, str], None]:
    """A text file ``name`` in the working directory: ``chars`` (a character-level corpus),
    ``words`` (lines of ten words from a vocabulary of 50) or ``names`` (one short name a line)."""
    def write(cwd: Path, python: str) -> None:
        rng = random.Random(0)
        if kind == "chars":
            body = "".join(rng.choice(string.ascii_letters + " \n.,!?") for _ in range(size))
        elif kind == "words":
            words = [f"w{i}" for i in range(50)]
            body = "".join(" ".join(rng.choices(words, k=10)) + "\n" for _ in range(size // 10))
        else:
            body = "".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 8))) + "\n"
                           for _ in range(size))
        path = cwd / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return write


def images(root: str, classes: int = 2, per_class: int = 4, size=(40, 32)) -> Callable[[Path, str], None]:
    """An ImageFolder tree ``root/{train,val}/classN/*.png`` relative to the working directory."""
    def write(cwd: Path, python: str) -> None:
        image_folder(cwd / root, classes=classes, per_class=per_class, size=size)
    return write


def shakespeare_char(cwd: Path, python: str) -> None:
    """nanoGPT's ``data/shakespeare_char``: uint16 tokens and ``meta.pkl``."""
    rng, vocab = random.Random(0), 65
    folder = cwd / "data" / "shakespeare_char"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.bin", 20000), ("val.bin", 4000)):
        (folder / name).write_bytes(array("H", (rng.randrange(vocab) for _ in range(n))).tobytes())
    chars = [chr(32 + i) for i in range(vocab)]
    meta = {"vocab_size": vocab, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    (folder / "meta.pkl").write_bytes(pickle.dumps(meta))


mnist_above = mnist("../data")
"""MNIST in ``../data``, where pytorch/examples' MNIST scripts look: outside the working
directory, which ``accrewrite verify`` links beside its copies."""
mnist_here = mnist("data")
mnist_dataset = mnist("dataset", train=128, test=64)
"""MNIST in ``dataset/``, where aladdinpersson's Machine-Learning-Collection scripts look."""
fashion_mnist_above = mnist("../datasets", train=64, test=64, name="FashionMNIST")
"""FashionMNIST in ``../datasets``, where L1aoXingyu's pytorch-beginner scripts look."""


def vae_data(cwd: Path, python: str) -> None:
    mnist_above(cwd, python)
    (cwd / "results").mkdir(exist_ok=True)


def bsds300(cwd: Path, python: str) -> None:
    """super_resolution's ``dataset/BSDS300/images/{train,test}`` (it downloads when absent)."""
    rng = random.Random(0)
    for split, n in (("train", 6), ("test", 2)):
        for i in range(n):
            _png(cwd / "dataset" / "BSDS300" / "images" / split / f"{i}.png", 256, 256, rng)


def wikitext(cwd: Path, python: str) -> None:
    """A wikitext-2-shaped folder ``wt2/{train,valid,test}.txt`` of random words."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(50)]
    (cwd / "wt2").mkdir()
    for name, lines in (("train.txt", 400), ("valid.txt", 80), ("test.txt", 80)):
        text = "".join(" ".join(rng.choices(words, k=10)) + "\n" for _ in range(lines))
        (cwd / "wt2" / name).write_text(text)


def cora(cwd: Path, python: str, nodes: int = 1800, features: int = 32) -> None:
    """gat's ``./cora``: its split is fixed (1200/400/rest), so 1800 nodes."""
    rng = random.Random(0)
    (cwd / "cora").mkdir()
    content = "".join("\t".join([str(1000 + i), *(str(rng.randrange(2)) for _ in range(features)), f"c{i % 7}"]) + "\n"
                      for i in range(nodes))
    cites = "".join(f"{1000 + i}\t{1000 + rng.randrange(nodes)}\n" for i in range(nodes) for _ in range(2))
    (cwd / "cora" / "cora.content").write_text(content)
    (cwd / "cora" / "cora.cites").write_text(cites)


def sine_waves(cwd: Path, python: str) -> None:
    """time_sequence_prediction's ``traindata.pt`` (a pickled numpy array), 8 short waves: it
    needs numpy and torch, so the verify interpreter writes it."""
    code = ("import numpy as np, torch; x = np.arange(60)[None, :] + np.arange(8)[:, None] * 3; "
            "torch.save(np.sin(x / 20.0).astype('float64'), open('traindata.pt', 'wb'))")
    subprocess.run([python, "-c", code], cwd=cwd, check=True, capture_output=True, timeout=120)


def imagenet_folder(cwd: Path, python: str) -> None:
    image_folder(cwd / "images")


def classification_folder(cwd: Path, python: str) -> None:
    """Five classes at least: the reference reports top-5 accuracy."""
    image_folder(cwd / "images", classes=5, per_class=3)


def no_data(cwd: Path, python: str) -> None:
    pass


def mnist1d_arrays(cwd: Path, python: str) -> None:
    """udlbook's coursework arrays: ``{train,val}_data_x.npy`` (40 offsets by example) and
    ``{train,val}_data_y.npy`` (a digit each), which the notebook fetches only when absent."""
    with_numpy(cwd, "import numpy as np; rng = np.random.default_rng(0)\n"
                    "for name, n in (('train', 400), ('val', 100)):\n"
                    "    np.save(f'{name}_data_x.npy', rng.standard_normal((40, n)))\n"
                    "    np.save(f'{name}_data_y.npy', np.arange(n) % 10)", python)


# The research scripts' data (the third corpus, docs/benchmarks.md): the layouts their loaders
# read, written small.

CELEBA_ATTRIBUTES = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose Black_Hair "
    "Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee Gray_Hair Heavy_Makeup "
    "High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose "
    "Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat "
    "Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young").split()


def celeba(root: str, images: int = 8, lines: int = 2040, size=(48, 48)) -> Callable[[Path, str], None]:
    """CelebA at ``root``: ``images/NNNNNN.jpg`` and ``list_attr_celeba.txt`` (the count, the 40
    attribute names, then one line of 1/-1 per image). Its ``lines`` name the ``images`` files in
    turn: StarGAN keeps the first 1999 lines for testing and trains on the rest."""
    def write(cwd: Path, python: str) -> None:
        rng = random.Random(0)
        folder = cwd / root
        for i in range(images):
            _png(folder / "images" / f"{i:06d}.jpg", *size, rng)
        rows = [f"{i % images:06d}.jpg " + " ".join(rng.choice(("1", "-1")) for _ in CELEBA_ATTRIBUTES)
                for i in range(lines)]
        (folder / "list_attr_celeba.txt").write_text("\n".join([str(lines), " ".join(CELEBA_ATTRIBUTES), *rows]) + "\n")
    return write


def voc_segmentation(root: str, train: int = 8, val: int = 4, classes: int = 21,
                     size=(64, 48)) -> Callable[[Path, str], None]:
    """PASCAL VOC 2012's segmentation layout at ``root``: ``VOCdevkit/VOC2012/JPEGImages``,
    ``SegmentationClass`` (one grayscale mask of class indices per image) and
    ``ImageSets/Segmentation/{train,val,trainval}.txt``."""
    def write(cwd: Path, python: str) -> None:
        rng = random.Random(0)
        voc = cwd / root / "VOCdevkit" / "VOC2012"
        names = {"train": [f"2012_{i:06d}" for i in range(train)],
                 "val": [f"2012_{i:06d}" for i in range(train, train + val)]}
        names["trainval"] = names["train"] + names["val"]
        for name in names["trainval"]:
            _png(voc / "JPEGImages" / f"{name}.jpg", *size, rng)
            _png(voc / "SegmentationClass" / f"{name}.png", *size, rng, classes=classes)
        (voc / "ImageSets" / "Segmentation").mkdir(parents=True)
        for split, listed in names.items():
            (voc / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("".join(n + "\n" for n in listed))
    return write


def random_weights(model: str, path: str, key: str | None = None) -> Callable[[Path, str], None]:
    """Randomly initialised weights at ``path`` (relative to the working directory) for a script
    that loads a pretrained network: ``model`` is Python, run in the script's folder, that binds
    ``model``; ``key`` nests the state dict in a checkpoint dict. A backbone that
    ``torch.hub.load_state_dict_from_url`` fetches is found at
    ``torch_home/hub/checkpoints/FILE`` when the recipe sets ``TORCH_HOME=torch_home``."""
    def write(cwd: Path, python: str) -> None:
        state = f"{{{key!r}: model.state_dict()}}" if key else "model.state_dict()"
        code = (f"import os, torch\n{model}\nos.makedirs(os.path.dirname({path!r}) or '.', exist_ok=True)\n"
                f"torch.save({state}, {path!r})")
        subprocess.run([python, "-c", code], cwd=cwd, check=True, capture_output=True, timeout=300)
    return write


def ssl_checkpoint(encoder: str) -> Callable[[Path, str], None]:
    """``pretrained.pth.tar``, a self-supervised run's checkpoint as the linear-classification
    scripts of moco, moco-v3 and simsiam load it (random weights): a ResNet-18's weights under
    ``module.<encoder>.`` in ``state_dict``."""
    return random_weights("import torchvision; model = torch.nn.Module(); model.module = torch.nn.Module(); "
                          f"model.module.{encoder} = torchvision.models.resnet18()", "pretrained.pth.tar",
                          key="state_dict")


def json_file(name: str, content: dict) -> Callable[[Path, str], None]:
    """A JSON file ``name`` in the working directory: a configuration the script reads."""
    def write(cwd: Path, python: str) -> None:
        (cwd / name).write_text(json.dumps(content, indent=1))
    return write


def both(*writers: Callable[[Path, str], None]) -> Callable[[Path, str], None]:
    def write(cwd: Path, python: str) -> None:
        for writer in writers:
            writer(cwd, python)
    return write


def unaligned(root: str, per_domain: int = 4, size=(40, 40)) -> Callable[[Path, str], None]:
    """Two unpaired image domains at ``root``: ``{train,test}{A,B}/*.png``."""
    def write(cwd: Path, python: str) -> None:
        rng = random.Random(0)
        for folder in ("trainA", "trainB", "testA", "testB"):
            for i in range(per_domain):
                _png(cwd / root / folder / f"{i}.png", *size, rng)
    return write


# Verify recipes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """How to run one corpus script on a CPU, briefly, with synthetic data. Both sides must load
    the same data, so the arguments ask for the accelerator (``--accel``) only where that leaves
    the loader alone, and pass ``--no-accel`` where it would shuffle or add workers: the
    migration's CPU fallback is the target's device, so the migrated side still runs there."""

    suffix: str  # the script's path under DIR
    args: tuple[str, ...]
    data: Callable[[Path, str], None]  # writes the data, given the working directory and the interpreter
    original_runs: bool = True  # False: the original needs CUDA, so compare runtime,torch_xla
    on_device: bool = True  # False: the original places nothing on a device, so there is no XLA side
    nproc: int = 1
    devices: int = 1  # the runtime side's CPU devices in its run to the end (CPU_NUM_DEVICES), below
    steps: int | None = None  # instead of --steps, where a step is slow
    needs: tuple[str, ...] = ()  # modules the interpreters must import
    env: tuple[tuple[str, str], ...] = ()
    packages: tuple[str, ...] = ()  # folders, relative to the script's, copied into its working directory
    note: str = ""


_MNIST = ("torchvision", "PIL")
_IMAGES = ("torchvision", "PIL")
_SPAWN = ("--multiprocessing-distributed", "--world-size", "1", "--rank", "0", "--dist-url", "tcp://127.0.0.1:29517",
          "--dist-backend", "gloo")
"""How the mp.spawn scripts of facebookresearch (moco, moco-v3, simsiam) are run: one node, a
process per device, gloo as the original's backend (the migrations spell their own)."""
_VIEW = ("its accuracy() calls .view on a non-contiguous tensor, which current PyTorch rejects on the CPU and "
         "CUDA (the original fails the same way; torch_xla's tensors take it)")
_TEACHER = "save/models/resnet8_cifar100_lr_0.05_decay_0.0005_trial_0/resnet8_best.pth"
"""Where RepDistiller's train_teacher.py saves a ResNet-8: train_student.py reads the model's name
from the folder's."""
_OLD_PROTOBUF = (("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python"),)
"""tensorboard_logger's generated protobuf code predates protobuf 4: it imports only with the
pure-Python implementation."""
_SPAWNED = ("mp.spawn over torch.cuda.device_count() processes, DDP with device_ids; verify records the "
            "parent process only, so only the runs to the end judge it (two processes on runtime)")
_CALM = "at the default rate batches of two make the loss jump, which magnifies any rounding difference"
_ZERO_LOSS = ("its loss is a cross-entropy over one class, 0 at every step, and its gradients are 0, "
              "so a match shows only that both sides run")
RECIPES = (
    Recipe("karpathy+nanoGPT/train.py",
           ("config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=2",
            "--log_interval=1", "--block_size=32", "--batch_size=4", "--n_layer=2", "--n_head=2", "--n_embd=32",
            "--max_iters=6", "--dropout=0.0"), shakespeare_char, needs=("numpy",)),
    Recipe("pytorch+examples/mnist/main.py", ("--epochs", "1", "--batch-size", "16", "--no-accel"), mnist_above,
           needs=_MNIST),
    Recipe("pytorch+examples/mnist_rnn/main.py", ("--epochs", "1", "--batch-size", "16"), mnist_above, needs=_MNIST),
    Recipe("pytorch+examples/siamese_network/main.py", ("--epochs", "1", "--batch-size", "16", "--no-accel"),
           mnist_above, needs=_MNIST),
    Recipe("pytorch+examples/mnist_forward_forward/main.py",
           ("--epochs", "8", "--train_size", "64", "--test_size", "32", "--log-interval", "1", "--no_accel"),
           mnist_here, needs=_MNIST, steps=6,
           note="--epochs 8: each layer trains for that many steps, so the 6 verified are the first layer's"),
    Recipe("pytorch+examples/vae/main.py", ("--epochs", "1", "--batch-size", "32"), vae_data,
           needs=_MNIST),
    Recipe("pytorch+examples/dcgan/main.py",
           ("--dataset", "fake", "--niter", "1", "--batchSize", "4", "--imageSize", "64", "--workers", "0",
            "--outf", "out", "--accel"), no_data, needs=("torchvision",), steps=10,
           note="its discriminator and its generator step in turn, so 10 steps are 5 iterations, enough for "
                "torch_xla's graphs to settle"),
    Recipe("pytorch+examples/super_resolution/main.py",
           ("--upscale_factor", "2", "--batchSize", "2", "--testBatchSize", "2", "--nEpochs", "2", "--lr", "0.01",
            "--threads", "0", "--accel"), bsds300, needs=("torchvision", "PIL", "six")),
    Recipe("pytorch+examples/word_language_model/main.py",
           ("--data", "wt2", "--epochs", "1", "--emsize", "16", "--nhid", "16", "--nlayers", "1", "--batch_size", "4",
            "--bptt", "8", "--lr", "0.001", "--save", "model.pt", "--use-optimizer", "--accel"),
           wikitext,
           note="--use-optimizer: its default update is a manual SGD, which has no optimizer step to record "
                "(--lr 0.001: the default, 20, is that SGD's)"),
    Recipe("pytorch+examples/time_sequence_prediction/train.py", ("--steps", "3"), sine_waves, steps=3,
           needs=("numpy", "matplotlib"), env=(("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1"),), on_device=False,
           note="it trains on the CPU (no device in it, so none in its migration); torch.load of a pickled numpy "
                "array needs TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 on torch >= 2.6"),
    Recipe("pytorch+examples/gat/main.py",
           ("--epochs", "6", "--hidden-dim", "8", "--num-heads", "2", "--dropout-p", "0"), cora, needs=("numpy",),
           note="--dropout-p 0: with its dropout, torch_xla's first Adam step differs by 8% (the losses agree), "
                "which the nudged reruns do not explain; not yet understood"),
    Recipe("pytorch+examples/imagenet/main.py",
           ("-a", "resnet18", "--epochs", "1", "-b", "2", "-j", "0", "-p", "1", "--lr", "0.001", "images"),
           imagenet_folder, needs=("torchvision", "PIL"), note="--lr 0.001: " + _CALM),
    Recipe("pytorch+vision/references/classification/train.py",
           ("--data-path", "images", "--device", "cpu", "--model", "resnet18", "--batch-size", "2", "--epochs", "1",
            "--workers", "0", "--print-freq", "1", "--output-dir", "out", "--lr", "0.001"), classification_folder,
           needs=("torchvision", "PIL"), note="--lr 0.001: " + _CALM),
    Recipe("pytorch+examples/distributed/ddp-tutorial-series/single_gpu.py", ("1", "1", "--batch_size", "32"),
           no_data, original_runs=False, note="the original places on cuda:0 (device = 0); " + _ZERO_LOSS),
    Recipe("pytorch+examples/distributed/ddp-tutorial-series/multigpu_torchrun.py", ("1", "1", "--batch_size", "8"),
           no_data, original_runs=False, nproc=2,
           note="the original calls torch.cuda.set_device and uses NCCL; " + _ZERO_LOSS),
    # Tutorial-shaped scripts (the second corpus, docs/benchmarks.md): module-level code that
    # hard-codes its epochs and sizes, so the data sets how long they run.
    Recipe("yunjey+pytorch-tutorial/tutorials/01-basics/logistic_regression/main.py", (),
           mnist("../../data", train=200, test=100), needs=_MNIST, on_device=False,
           note="it places nothing on a device"),
    Recipe("yunjey+pytorch-tutorial/tutorials/01-basics/feedforward_neural_network/main.py", (),
           mnist("../../data", train=200, test=100), needs=_MNIST),
    Recipe("yunjey+pytorch-tutorial/tutorials/02-intermediate/convolutional_neural_network/main.py", (),
           mnist("../../data", train=200, test=100), needs=_MNIST),
    Recipe("yunjey+pytorch-tutorial/tutorials/02-intermediate/recurrent_neural_network/main.py", (),
           mnist("../../data", train=200, test=100), needs=_MNIST, steps=4),
    Recipe("yunjey+pytorch-tutorial/tutorials/02-intermediate/bidirectional_recurrent_neural_network/main.py", (),
           mnist("../../data", train=200, test=100), needs=_MNIST, steps=4),
    Recipe("yunjey+pytorch-tutorial/tutorials/02-intermediate/deep_residual_network/main.py", (),
           cifar10("../../data", train=100, test=100), needs=("torchvision", "numpy"), steps=4,
           note="80 epochs of one batch; its learning rate drops every 20 epochs"),
    Recipe("yunjey+pytorch-tutorial/tutorials/02-intermediate/language_model/main.py", (),
           text("data/train.txt", "words", 2400), needs=("numpy",),
           note="it samples 1000 words after training, one model call per word"),
    Recipe("yunjey+pytorch-tutorial/tutorials/03-advanced/generative_adversarial_network/main.py", (),
           mnist("../../data", train=100, test=10), needs=_MNIST, steps=8,
           note="200 epochs of one batch, a sample image saved per epoch; two optimizers: over 5 steps "
                "torch_xla still compiled each step, over 8 its graphs settle"),
    Recipe("yunjey+pytorch-tutorial/tutorials/03-advanced/variational_autoencoder/main.py", (),
           mnist("../../data", train=128, test=10), needs=_MNIST),
    Recipe("eriklindernoren+PyTorch-GAN/implementations/gan/gan.py", ("--n_epochs", "1", "--batch_size", "32"),
           mnist("../../data/mnist", train=128, test=10), needs=_MNIST, steps=6),
    Recipe("eriklindernoren+PyTorch-GAN/implementations/dcgan/dcgan.py", ("--n_epochs", "1", "--batch_size", "16"),
           mnist("../../data/mnist", train=64, test=10), needs=_MNIST, steps=6),
    Recipe("eriklindernoren+PyTorch-GAN/implementations/cgan/cgan.py", ("--n_epochs", "1", "--batch_size", "16"),
           mnist("../../data/mnist", train=64, test=10), needs=_MNIST, steps=6),
    Recipe("eriklindernoren+PyTorch-GAN/implementations/acgan/acgan.py", ("--n_epochs", "1", "--batch_size", "16"),
           mnist("../../data/mnist", train=64, test=10), needs=_MNIST, steps=6),
    Recipe("eriklindernoren+PyTorch-GAN/implementations/wgan_gp/wgan_gp.py",
           ("--n_epochs", "1", "--batch_size", "16"), mnist("../../data/mnist", train=160, test=10), needs=_MNIST),
    *(Recipe(f"eriklindernoren+PyTorch-GAN/implementations/{name}/{name}.py", ("--n_epochs", "1", "--batch_size", "16"),
             mnist("../../data/mnist", train=96, test=10), needs=_MNIST, steps=6)
      for name in ("lsgan", "wgan", "infogan", "aae", "wgan_div")),
    Recipe("MorvanZhou+PyTorch-Tutorial/tutorial-contents/401_CNN.py", (), mnist("mnist", train=200, test=64),
           needs=_MNIST, on_device=False, steps=4, note="it places nothing on a device"),
    Recipe("MorvanZhou+PyTorch-Tutorial/tutorial-contents/402_RNN_classifier.py", (),
           mnist("mnist", train=256, test=64), needs=_MNIST, on_device=False, steps=4, note="it places nothing on a device"),
    Recipe("MorvanZhou+PyTorch-Tutorial/tutorial-contents/403_RNN_regressor.py", (), no_data,
           needs=("numpy", "matplotlib"), on_device=False, note="it places nothing on a device"),
    Recipe("MorvanZhou+PyTorch-Tutorial/tutorial-contents/406_GAN.py", (), no_data, needs=("numpy", "matplotlib"),
           on_device=False, note="it places nothing on a device; 10000 steps of two small networks"),
    Recipe("MorvanZhou+PyTorch-Tutorial/tutorial-contents/502_GPU.py", (), mnist("mnist", train=100, test=64),
           needs=_MNIST, original_runs=False, steps=2, note="the original calls .cuda() unconditionally"),
    Recipe("aladdinpersson+Machine-Learning-Collection/ML/Pytorch/Basics/pytorch_simple_CNN.py", (),
           mnist_dataset, needs=(*_MNIST, "tqdm")),
    Recipe("aladdinpersson+Machine-Learning-Collection/ML/Pytorch/Basics/pytorch_simple_fullynet.py", (),
           mnist_dataset, needs=(*_MNIST, "tqdm"),
           note='device = "mps" if torch.backends.mps.is_available() else "cuda" if ... else "cpu"'),
    Recipe("aladdinpersson+Machine-Learning-Collection/ML/Pytorch/Basics/pytorch_rnn_gru_lstm.py", (),
           mnist_dataset, needs=_MNIST, steps=4,
           note="the model's forward places its initial states with .to(device), the module-level device"),
    Recipe("aladdinpersson+Machine-Learning-Collection/ML/Pytorch/Basics/pytorch_bidirectional_lstm.py", (),
           mnist_dataset, needs=_MNIST, steps=4),
    Recipe("aladdinpersson+Machine-Learning-Collection/ML/Pytorch/Basics/pytorch_mixed_precision_example.py", (),
           mnist("dataset", train=20, test=10), needs=_MNIST, original_runs=False, steps=3,
           note="torch.cuda.amp.GradScaler and autocast; the original asserts device == 'cuda'; its convolutions "
                "have 420 and 1000 channels, so 20 images"),
    Recipe("aladdinpersson+Machine-Learning-Collection/ML/Pytorch/GANs/1. SimpleGAN/fc_gan.py", (),
           mnist("dataset", train=64, test=10), needs=(*_MNIST, "tensorboard"),
           note='device = "cuda" if ... else "cpu" (a string); 50 epochs of two batches, images to TensorBoard'),
    Recipe("pytorch+tutorials/beginner_source/basics/quickstart_tutorial.py", (),
           mnist("data", train=256, test=64, name="FashionMNIST"), needs=_MNIST),
    Recipe("pytorch+tutorials/beginner_source/blitz/cifar10_tutorial.py", (), cifar10("data"),
           needs=("torchvision", "matplotlib"), on_device=False,
           note="it trains on the CPU: the device is chosen at the end and only printed"),
    Recipe("pytorch+tutorials/intermediate_source/spatial_transformer_tutorial.py", (),
           mnist(".", train=64, test=64), needs=(*_MNIST, "matplotlib", "six"),
           note="20 epochs of one batch, each followed by a test; loaders with num_workers=4; "
                "F.affine_grid and F.grid_sample"),
    Recipe("pytorch+tutorials/beginner_source/knowledge_distillation_tutorial.py", (), cifar10("data"),
           needs=("torchvision",),
           note="five models trained for 10 epochs each by functions given device=; the teacher's "
                "state_dict, on the device, is loaded into new models built on the CPU"),
    Recipe("pytorch+tutorials/intermediate_source/ddp_tutorial.py", (), no_data, original_runs=False,
           note="mp.spawn of two processes, one step each, twice; the original needs CUDA "
                "(device_ids from torch.cuda.device_count()); verify records the parent process only"),
    Recipe("patrickloeber+pytorchTutorial/13_feedforward.py", (), mnist("data", train=200, test=100),
           needs=(*_MNIST, "matplotlib")),
    Recipe("patrickloeber+pytorchTutorial/14_cnn.py", (), cifar10("data", train=40, test=12),
           needs=("torchvision", "matplotlib"),
           note="batches of 4; its test indexes each batch element by element (predicted[i], labels[i])"),
    Recipe("patrickloeber+pytorchTutorial/16_tensorboard.py", (), mnist("data", train=128, test=64),
           needs=(*_MNIST, "matplotlib", "tensorboard"),
           note="writer.add_graph traces the model on a batch .to(device); add_pr_curve of the gathered "
                "predictions"),
    Recipe("L1aoXingyu+pytorch-beginner/02-Logistic Regression/Logistic_Regression.py", (), fashion_mnist_above,
           needs=_MNIST,
           note="use_gpu = torch.cuda.is_available(), then .cuda() under if use_gpu; 100 epochs of one batch, "
                "each followed by a test"),
    Recipe("L1aoXingyu+pytorch-beginner/03-Neural Network/neural_network.py", (), fashion_mnist_above,
           needs=_MNIST, note="as Logistic_Regression.py, 50 epochs"),
    Recipe("L1aoXingyu+pytorch-beginner/08-AutoEncoder/conv_autoencoder.py", (), mnist_here, needs=_MNIST,
           original_runs=False,
           note="model.cuda() and Variable(img).cuda() unconditionally; 100 epochs of two batches"),
    Recipe("karpathy+ng-video-lecture/bigram.py", (), text("input.txt", "chars", 6000),
           note="3000 steps, an evaluation every 300, then 500 generated characters"),
    Recipe("karpathy+minGPT/projects/chargpt/chargpt.py",
           ("--trainer.max_iters=20", "--trainer.batch_size=8", "--trainer.num_workers=0",
            "--model.model_type=gpt-nano", "--data.block_size=32"), text("input.txt", "chars", 6000),
           packages=("../../mingpt",),
           note="the training loop is mingpt/trainer.py, copied beside it and migrated with it; it "
                "generates 500 characters at step 0"),
    Recipe("karpathy+makemore/makemore.py",
           ("--max-steps", "30", "--num-workers", "0", "--batch-size", "8", "--n-layer", "2", "--n-embd", "32",
            "--n-embd2", "32"), text("names.txt", "names", 400), needs=("tensorboard",),
           note="its --device option (default cpu) chooses the device, the target's once migrated"),
    Recipe("rasbt+LLMs-from-scratch/appendix-A/01_main-chapter-code/code-part1.ipynb", (), no_data,
           needs=("numpy",), on_device=False, note="a notebook; it places nothing on a device"),
    Recipe("rasbt+LLMs-from-scratch/appendix-A/01_main-chapter-code/DDP-script.py", (), no_data,
           original_runs=False,
           note="mp.spawn over torch.cuda.device_count() processes, NCCL; verify records the parent process only"),
    Recipe("rasbt+LLMs-from-scratch/appendix-A/01_main-chapter-code/DDP-script-torchrun.py", (), no_data,
           original_runs=False, nproc=2, note="torchrun, NCCL, torch.cuda.set_device(rank)"),
    Recipe("tczhangzhi+pytorch-distributed/multiprocessing_distributed.py",
           ("--data", "images", "-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "0", "-p", "1"),
           images("images", classes=2, per_class=2), needs=("torchvision", "PIL"), original_runs=False, steps=2,
           note="mp.spawn over torch.cuda.device_count() processes, NCCL; verify records the parent process only"),
    Recipe("tczhangzhi+pytorch-distributed/distributed.py",
           ("--data", "images", "-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "0", "-p", "1"),
           images("images", classes=2, per_class=2), needs=("torchvision", "PIL"), original_runs=False, nproc=2,
           steps=2, note="written for torch.distributed.launch (--local_rank), NCCL"),
    Recipe("mrdbourke+pytorch-deep-learning/01_pytorch_workflow.ipynb", (), no_data, needs=("matplotlib",),
           steps=104, note="a notebook: 100 steps on the CPU, then the device is chosen and a second model "
                           "trains on it for 1000 steps; 104 steps reach the second model"),
    # Notebooks (the fourth corpus, docs/benchmarks.md): course and tutorial notebooks whose own
    # loops train, run as their code cells in order. Their epochs and batch sizes are written in
    # the cells, so the synthetic data sets how many steps they make.
    *(Recipe(f"rasbt+deeplearning-models/pytorch_ipynb/{path}", (), mnist("data", train=256, test=64),
             needs=_MNIST + extra, note=note)
      for path, extra, note in (
          ("cnn/cnn-basic.ipynb", (), "torch.device('cuda:3' if available), 10 epochs of two batches"),
          ("cnn/cnn-allconv.ipynb", (), "torch.device('cuda:1' if available), 15 epochs of one batch"),
          ("cnn/cnn-he-init.ipynb", (), "torch.device('cuda:2' if available), 10 epochs of two batches"),
          ("autoencoder/ae-basic.ipynb", ("matplotlib",), "an autoencoder, 5 epochs of one batch"),
          ("gan/gan.ipynb", ("matplotlib",), "two optimizers stepped in turn, 100 epochs of two batches"),
          ("basic-ml/softmax-regression.ipynb", (), "10 epochs of one batch"))),
    Recipe("rasbt+deeplearning-models/pytorch_ipynb/cnn/cnn-lenet5-mnist.ipynb", (), mnist("data", train=256, test=64),
           needs=_MNIST + ("pandas", "matplotlib"), original_runs=False,
           note="DEVICE = \"cuda:1\", unconditionally; 10 epochs of two batches"),
    Recipe("rasbt+deeplearning-models/pytorch_ipynb/cnn/cnn-lenet5-cifar10.ipynb", (), cifar10("data", train=40),
           needs=_IMAGES + ("pandas", "matplotlib"), original_runs=False,
           note="DEVICE = \"cuda:0\", unconditionally; 10 epochs of one batch, an accuracy per class at the end"),
    Recipe("rasbt+LLMs-from-scratch/appendix-A/01_main-chapter-code/code-part2.ipynb", (), no_data,
           original_runs=False, note="a notebook: a first cell moves tensors to \"cuda\" unconditionally, then "
                                     "torch.device('cuda' if available) and a tensor data set written in a cell"),
    Recipe("mrdbourke+pytorch-deep-learning/02_pytorch_classification.ipynb", (), no_data,
           needs=("sklearn", "pandas", "matplotlib", "torchmetrics"),
           note="make_circles data; helper_functions.py is beside it, so nothing is downloaded"),
    Recipe("mrdbourke+pytorch-deep-learning/03_pytorch_computer_vision.ipynb", (),
           mnist("data", train=64, test=32, name="FashionMNIST"),
           needs=_MNIST + ("pandas", "matplotlib", "torchmetrics", "mlxtend"),
           note="three models on FashionMNIST, 3 epochs of two batches each, a confusion matrix at the end"),
    Recipe("mrdbourke+pytorch-deep-learning/extras/solutions/01_pytorch_workflow_exercise_solutions.ipynb", (),
           no_data, needs=("matplotlib",), note="a linear regression on data made in a cell, 300 steps"),
    Recipe("mrdbourke+pytorch-deep-learning/extras/solutions/02_pytorch_classification_exercise_solutions.ipynb",
           (), no_data, needs=("sklearn", "pandas", "matplotlib", "torchmetrics"),
           note="make_moons and a spiral made with numpy, 1000 steps each"),
    Recipe("udlbook+udlbook/CM20315/CM20315_Coursework_II.ipynb", (), mnist1d_arrays, needs=("matplotlib",),
           note="its model is never placed on a device (a CPU notebook that seeds CUDA), 50 epochs of four "
                "batches"),
    Recipe("d2l-ai+d2l-pytorch-colab/chapter_linear-regression/linear-regression-scratch.ipynb", (), no_data,
           needs=("d2l",), note="d2l's Trainer with the notebook's own fit_epoch and SGD class (no torch "
                                "optimizer: verify sees no step), num_gpus=0, data made by d2l"),
    # Research scripts (the third corpus, docs/benchmarks.md): self-supervised learning with DDP
    # and custom optimizers, GANs, detection and segmentation trainers, helper modules, resume
    # branches.
    Recipe("facebookresearch+vicreg/main_vicreg.py",
           ("--data-dir", "images", "--exp-dir", "exp", "--arch", "resnet34", "--mlp", "64-64-64", "--epochs", "1",
            "--batch-size", "4", "--num-workers", "0", "--log-freq-time", "0"),
           images("images", classes=2, per_class=10), needs=_IMAGES, original_runs=False, nproc=2,
           note="torchrun; init_distributed_mode (NCCL, in distributed.py) and .cuda(gpu); a LARS optimizer of "
                "the file stepped through a GradScaler; FullGatherLayer all-reduces in its backward; SyncBatchNorm"),
    Recipe("facebookresearch+vicreg/evaluate.py",
           ("--data-dir", "images", "--pretrained", "backbone.pth", "--exp-dir", "exp", "--arch", "resnet34",
            "--epochs", "1", "--batch-size", "4", "--workers", "0", "--print-freq", "1", "--lr-head", "0.1"),
           both(images("images", classes=2, per_class=4),
                random_weights("import resnet; model = resnet.resnet34()[0]", "backbone.pth")),
           needs=_IMAGES, original_runs=False, devices=2,
           note="mp.spawn over torch.cuda.device_count() with a random port, NCCL spelled in the worker; a linear "
                "probe of a frozen backbone (random weights here)"),
    Recipe("facebookresearch+moco-v3/main_moco.py",
           ("-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "0", "-p", "1", "--moco-dim", "32",
            "--moco-mlp-dim", "64", *_SPAWN, "images"),
           images("images", classes=2, per_class=6), needs=(*_IMAGES, "tensorboard", "timm"), original_runs=False,
           devices=2, note=_SPAWNED + "; vits.py imports timm 0.4.9's layout (its README's version); LARS "
                                  "(moco/optimizer.py) through a GradScaler; loc = 'cuda:{}' bound only when resuming"),
    Recipe("facebookresearch+moco-v3/main_lincls.py",
           ("-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "0", "-p", "1", "--lr", "0.1", "--pretrained",
            "pretrained.pth.tar", *_SPAWN, "images"),
           both(images("images", classes=2, per_class=6), ssl_checkpoint("base_encoder")), needs=(*_IMAGES, "timm"),
           original_runs=False, devices=2,
           note=_SPAWNED + "; timm 0.4.9, as main_moco.py"),
    Recipe("facebookresearch+moco/main_moco.py",
           ("-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "0", "-p", "1", "--moco-dim", "16", "--moco-k", "32",
            "--mlp", "--aug-plus", "--cos", *_SPAWN, "images"),
           images("images", classes=2, per_class=6), needs=_IMAGES, original_runs=False, devices=2,
           note=_SPAWNED + "; the queue and the batch shuffle gather across ranks (moco/builder.py); " + _VIEW),
    Recipe("facebookresearch+moco/main_lincls.py",
           ("-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "0", "-p", "1", "--lr", "0.1", "--pretrained",
            "pretrained.pth.tar", *_SPAWN, "images"),
           both(images("images", classes=2, per_class=6), ssl_checkpoint("encoder_q")), needs=_IMAGES,
           original_runs=False, devices=2,
           note=_SPAWNED + "; a frozen backbone, its last layer trained, then validated; " + _VIEW),
    Recipe("facebookresearch+simsiam/main_simsiam.py",
           ("-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "0", "-p", "1", "--dim", "32", "--pred-dim", "16",
            "--fix-pred-lr", *_SPAWN, "images"),
           images("images", classes=2, per_class=6), needs=_IMAGES, original_runs=False, devices=2,
           note=_SPAWNED),
    Recipe("facebookresearch+simsiam/main_lincls.py",
           ("-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "0", "-p", "1", "--lr", "0.1", "--pretrained",
            "pretrained.pth.tar", *_SPAWN, "images"),
           both(images("images", classes=2, per_class=6), ssl_checkpoint("encoder")), needs=_IMAGES,
           original_runs=False, devices=2,
           note=_SPAWNED + "; without --lars, which imports apex"),
    Recipe("sthalles+SimCLR/run.py",
           ("-data", "datasets", "-dataset-name", "cifar10", "--epochs", "1", "-b", "8", "-j", "0",
            "--log-every-n-steps", "1", "--seed", "0"), cifar10("datasets", train=48, test=10),
           needs=("torchvision", "tensorboard", "yaml"),
           note="the training loop is SimCLR.train (simclr.py), with torch.cuda.amp's GradScaler and autocast "
                "(disabled without --fp16-precision) and `with torch.cuda.device(args.gpu_index)` around it"),
    Recipe("HobbitLong+SupContrast/main_supcon.py",
           ("--batch_size", "8", "--num_workers", "0", "--epochs", "1", "--model", "resnet18", "--dataset", "cifar10",
            "--data_folder", "datasets", "--print_freq", "1", "--save_freq", "1"),
           cifar10("datasets", train=48, test=10),
           needs=("torchvision", "tensorboard_logger"), env=_OLD_PROTOBUF,
           note="every placement is under `if torch.cuda.is_available()`; two crops a batch, torch.cat'd"),
    Recipe("HobbitLong+SupContrast/main_ce.py",
           ("--batch_size", "8", "--num_workers", "0", "--epochs", "1", "--model", "resnet18", "--dataset", "cifar10",
            "--print_freq", "1", "--save_freq", "1"), cifar10("datasets", train=48, test=16),
           needs=("torchvision", "tensorboard_logger"), env=_OLD_PROTOBUF, original_runs=False,
           note="cross-entropy baseline of main_supcon.py: the model under `if torch.cuda.is_available()`, the "
                "batches' .cuda() unconditional; a validation after each epoch; " + _VIEW),
    Recipe("Spijkervet+SimCLR/main.py",
           ("--dataset", "CIFAR10", "--dataset_dir", "datasets", "--batch_size", "4", "--image_size", "32",
            "--epochs", "1", "--workers", "0"), cifar10("datasets", train=24, test=10),
           needs=("torchvision", "tensorboard", "yaml"), original_runs=False,
           note="its options come from config/config.yaml; .cuda() in train(); the model in the simclr package"),
    Recipe("leftthomas+SimCLR/main.py", ("--batch_size", "8", "--epochs", "1", "--k", "10", "--feature_dim", "32"),
           cifar10("data", train=48, test=16), needs=("torchvision", "thop", "pandas"), original_runs=False,
           note="Model(...).cuda() and thop.profile on a .cuda() input; train(net, loader, train_optimizer); "
                "a kNN test over a memory bank after each epoch"),
    Recipe("yunjey+stargan/main.py",
           ("--mode", "train", "--dataset", "CelebA", "--image_size", "32", "--celeba_crop_size", "40", "--c_dim", "5",
            "--batch_size", "4", "--num_iters", "6", "--num_iters_decay", "3", "--g_repeat_num", "1",
            "--d_repeat_num", "3", "--n_critic", "1", "--log_step", "1", "--sample_step", "3", "--model_save_step", "6",
            "--lr_update_step", "2", "--use_tensorboard", "False", "--num_workers", "0",
            "--selected_attrs", "Black_Hair", "Blond_Hair", "Brown_Hair", "Male", "Young"),
           celeba("data/celeba"), needs=("torchvision", "PIL", "numpy"), steps=6,
           note="label2onehot builds one-hot labels on the host from the batch's labels before they are moved; "
                "the discriminator and the generator step in turn (--n_critic 1), with a gradient penalty"),
    Recipe("VainF+DeepLabV3Plus-Pytorch/main.py",
           ("--dataset", "voc", "--data_root", "data", "--model", "deeplabv3plus_mobilenet", "--batch_size", "2",
            "--val_batch_size", "2", "--crop_size", "32", "--crop_val", "--total_itrs", "6", "--val_interval", "3",
            "--print_interval", "1"),
           both(voc_segmentation("data"), random_weights("from network.backbone.mobilenetv2 import MobileNetV2; "
                                                          "model = MobileNetV2()",
                                                          "torch_home/hub/checkpoints/mobilenet_v2-b0353104.pth")),
           needs=("torchvision", "visdom", "matplotlib", "sklearn"), env=(("TORCH_HOME", "torch_home"),),
           note="its pretrained MobileNetV2 backbone is random weights written where torch.hub looks; a while True "
                "loop over the loader that returns at --total_itrs, validating every --val_interval"),
    Recipe("taesungp+contrastive-unpaired-translation/train.py",
           ("--dataroot", "data", "--name", "exp", "--CUT_mode", "CUT", "--display_id", "0", "--no_html",
            "--num_threads", "0", "--load_size", "32", "--crop_size", "32", "--ngf", "8", "--ndf", "8",
            "--netG", "resnet_6blocks", "--n_epochs", "1", "--n_epochs_decay", "1", "--print_freq", "1",
            "--num_patches", "16", "--save_epoch_freq", "1"),
           unaligned("data", per_domain=6), needs=("torchvision", "dominate"), original_runs=False, steps=6,
           note="--gpu_ids 0 (its default) sets torch.cuda.set_device; the networks, their optimizers and "
                "optimize_parameters live in models/ (cut_model.py, base_model.py), the loop in train.py; "
                "the feature-patch network and its optimizer are built at the first batch"),
    Recipe("huggingface+pytorch-image-models/train.py",
           ("--data-dir", "images", "--train-split", "train", "--val-split", "val", "--model", "resnet18",
            "--num-classes", "2", "--epochs", "1", "-b", "2", "--workers", "1", "--img-size", "32",
            "--log-interval", "1", "--output", "out"),
           images("images", classes=2, per_class=6), needs=("torchvision", "PIL", "yaml", "huggingface_hub",
                                                            "safetensors"), original_runs=False,
           note="--device defaults to cuda and init_distributed_device (timm/utils/distributed.py) turns it "
                "into the device; timm's own PrefetchLoader moves the batches; one loader worker, as its "
                "persistent workers need one"),
    Recipe("HobbitLong+RepDistiller/train_teacher.py",
           ("--model", "resnet8", "--epochs", "1", "--batch_size", "16", "--num_workers", "0", "--print_freq", "1"),
           cifar100("data", train=96, test=32), needs=("torchvision", "tensorboard_logger"), env=_OLD_PROTOBUF,
           note="every placement is under `if torch.cuda.is_available()`; the loops are helper/loops.py's"),
    Recipe("HobbitLong+RepDistiller/train_student.py",
           ("--path_t", _TEACHER, "--distill", "hint", "--model_s", "resnet8", "-r", "0.1", "-a", "0.9", "-b", "100",
            "--epochs", "1", "--batch_size", "16", "--num_workers", "0", "--print_freq", "1"),
           both(cifar100("data", train=96, test=32),
                random_weights("from models import model_dict; model = model_dict['resnet8'](num_classes=100)",
                               _TEACHER, key="model")),
           needs=("torchvision", "tensorboard_logger"), env=_OLD_PROTOBUF,
           note="FitNets' hint distillation: a teacher (random weights), a student and the regressor trained "
                "with it in a module_list; --distill crd's dataset reads torchvision's long-gone train_data"),
    Recipe("yassouali+pytorch-segmentation/train.py", ("--config", "small.json"),
           both(voc_segmentation("data", train=8, val=4),
                json_file("small.json", {
                    "name": "UNet", "n_gpu": 1, "use_synch_bn": False,
                    "arch": {"type": "UNet", "args": {"freeze_bn": False}},
                    "train_loader": {"type": "VOC", "args": {
                        "data_dir": "data", "batch_size": 2, "base_size": 40, "crop_size": 32, "augment": True,
                        "shuffle": True, "scale": True, "flip": True, "rotate": False, "blur": False,
                        "split": "train", "num_workers": 0}},
                    "val_loader": {"type": "VOC", "args": {
                        "data_dir": "data", "batch_size": 2, "crop_size": 32, "val": True, "split": "val",
                        "num_workers": 0}},
                    "optimizer": {"type": "SGD", "differential_lr": True,
                                  "args": {"lr": 0.01, "weight_decay": 1e-4, "momentum": 0.9}},
                    "loss": "CrossEntropyLoss2d", "ignore_index": 255, "lr_scheduler": {"type": "Poly", "args": {}},
                    "trainer": {"epochs": 2, "save_dir": "saved/", "save_period": 1, "monitor": "max Mean_IoU",
                                "early_stop": 10, "tensorboard": True, "log_dir": "saved/runs", "log_per_iter": 1,
                                "val": True, "val_per_epochs": 1}})),
           needs=("torchvision", "tensorboard", "cv2", "scipy"),
           note="its configuration is a JSON file (written small here); the loop is trainer.py's Trainer over "
                "base/base_trainer.py's, which picks the device from torch.cuda.device_count() and resumes"),
)


@dataclass
class VerifyResult:
    script: str
    comparison: str  # e.g. "original,runtime"
    counts_for: tuple[str, ...]  # the targets this verdict is counted for
    code: int | None  # accrewrite verify's exit status; None when it did not run
    verdict: str
    seconds: float = 0.0
    profile: GraphProfile | None = None  # the torch_xla side's, where verify printed one


@dataclass
class GraphProfile:
    """A torch_xla side's graph profile as verify prints it, per step after warm-up (verify's own
    reads not counted)."""

    graphs: str  # graph executions per step
    transfers: str  # host transfers per step
    compilations: int  # compilations after warm-up
    line: str = ""  # what changed and ran the first graph compiled after warm-up


_PROFILE = re.compile(r"torch_xla: .*; per step after warm-up \([^)]*\): (?P<graphs>[\d.]+) graph executions?, "
                      r"(?P<transfers>[\d.]+) host transfers?; (?P<compilations>\d+) compilations? after warm-up"
                      r"(?:: (?P<line>.*?) \(steps? [\d, ]+\)(?:;|$))?")


def graph_profile(stdout: str) -> GraphProfile | None:
    """The torch_xla side's profile in verify's output, None where it printed none."""
    found = next((match for match in map(_PROFILE.match, stdout.splitlines()) if match), None)
    if found is None:
        return None
    return GraphProfile(found["graphs"], found["transfers"], int(found["compilations"]), found["line"] or "")


@dataclass
class EndResult:
    """One side run as a user runs it, to the script's end (no probe, no step limit)."""

    script: str
    side: str  # original, runtime or torch_xla
    code: int | None  # its exit status; None when it did not run or ran past --timeout
    note: str  # why it did not run, or the end of its stderr when it failed
    seconds: float = 0.0
    executions: int | None = None  # torch_xla: XLA graph executions, summed over its processes
    compilations: int | None = None
    fallbacks: int | None = None  # torch_xla: operations that fell back to the CPU (aten:: counters)


def comparisons(recipe: Recipe) -> list[tuple[str, tuple[str, ...]]]:
    """(the two sides, the targets the verdict counts for)."""
    if not recipe.on_device:
        return [("original,runtime", ("runtime",))]
    if recipe.original_runs:
        return [("original,runtime", ("runtime",)), ("original,torch_xla", ("torch_xla",))]
    return [("runtime,torch_xla", ("runtime", "torch_xla"))]


@functools.lru_cache(maxsize=None)
def importable(python: str, module: str, env: tuple[tuple[str, str], ...] = ()) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=300,
                          env={**os.environ, **dict(env)}).returncode == 0


def _missing(recipe: Recipe, pythons: list[str]) -> str:
    missing = sorted({m for python in pythons for m in recipe.needs if not importable(python, m, recipe.env)})
    return f"skipped: cannot import {', '.join(missing)}" if missing else ""


# Every process the benchmark starts imports SITE first (it is put on PYTHONPATH): the synthetic
# CIFAR-10 batches pass torchvision's checksums, and a process that imported torch_xla says at
# exit how many graphs XLA compiled and executed, spawned workers included.
XLA_MARK = "real_scripts: xla"
SITE = '''"""Written by benchmarks/real_scripts.py: see its SITE."""
import atexit
import importlib.abc
import sys


class _SyntheticCifar(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torchvision.datasets.cifar":
            return None
        spec = next((s for s in (f.find_spec(name, path, target) for f in sys.meta_path if f is not self) if s), None)
        if spec is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                module.CIFAR10._check_integrity = lambda self: True
                module.check_integrity = lambda *args, **kwargs: True  # batches.meta's checksum

            spec.loader.exec_module = exec_module
        return spec


def _xla_report():
    if "torch_xla" not in sys.modules:
        return
    import torch_xla.debug.metrics as met

    def count(*names):
        return sum((met.metric_data(n) or (0,))[0] for n in names)

    fallbacks = sum(met.counter_value(n) or 0 for n in met.counter_names() if n.startswith("aten::"))
    print(MARK, "executions", count("ExecuteTime", "ExecuteReplicatedTime"), "compilations",
          count("CompileTime"), "fallbacks", fallbacks, file=sys.stderr, flush=True)


sys.meta_path.insert(0, _SyntheticCifar())
atexit.register(_xla_report)
'''.replace("MARK", repr(XLA_MARK))


@dataclass
class Prepared:
    cwd: Path  # the working directory: a copy of the script's directory, data written
    script: Path  # the script (or notebook) in it
    env: dict[str, str]


def prepare(script: Path, recipe: Recipe, scratch: Path, python: str) -> Prepared:
    """The script's directory copied to ``scratch/<its parent's name>/<its name>`` (so that
    ``../../data`` stays inside ``scratch``), the recipe's data written, ``SITE`` installed."""
    cwd = scratch / script.parent.parent.name / script.parent.name
    shutil.copytree(script.parent, cwd, ignore=shutil.ignore_patterns(".git", "__pycache__"), symlinks=True)
    path = cwd / script.name
    for package in recipe.packages:
        shutil.copytree(script.parent / package, cwd / Path(package).name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    recipe.data(cwd, python)
    site = scratch / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    paths = [str(site), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, **dict(recipe.env), "PYTHONPATH": os.pathsep.join(filter(None, paths)),
           "MPLBACKEND": "Agg", "COLUMNS": "1000",  # COLUMNS: rich does not wrap verify's verdict
           "MASTER_PORT": str(free_port())}  # torch_xla.launch's rendezvous, else 12355 on every machine
    return Prepared(cwd, path, env)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_verify(script: Path, relative: str, recipe: Recipe, args) -> list[VerifyResult]:
    """A recipe's verdicts; a comparison that cannot run here gets the reason instead."""
    results = []
    for sides, counts_for in comparisons(recipe):
        try:
            verdict = _verify_once(script, recipe, sides, args)
        except Exception as exc:  # noqa: BLE001 - one recipe never stops the run
            verdict = (None, f"could not run accrewrite verify: {type(exc).__name__}: {exc}", 0.0, None)
        results.append(VerifyResult(relative, sides, counts_for, *verdict))
    return results


def _verify_once(script: Path, recipe: Recipe, sides: str, args) -> tuple[int | None, str, float, GraphProfile | None]:
    """(exit status or None, verdict, seconds, the torch_xla side's profile) of one
    ``accrewrite verify --compare SIDES``."""
    if "torch_xla" in sides and not args.xla_python:
        return None, "skipped: no --xla-python (or $ACCREWRITE_XLA_PYTHON)", 0.0, None
    missing = _missing(recipe, [args.python, *([args.xla_python] if "torch_xla" in sides else [])])
    if missing:
        return None, missing, 0.0, None
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="real-scripts-") as scratch:
        try:
            ready = prepare(script, recipe, Path(scratch), args.python)
        except Exception as exc:  # noqa: BLE001 - one recipe never stops the run
            return None, f"could not prepare the data: {type(exc).__name__}: {exc}", 0.0, None
        command = [args.python, "-m", "accrewrite.cli", "verify", str(ready.script), "--compare", sides,
                   "--steps", str(recipe.steps or args.steps), "--timeout", str(args.timeout),
                   *(["--rtol", str(args.rtol)] if args.rtol else []), "--nproc", str(recipe.nproc),
                   "--root", scratch, *(["--python", f"torch_xla={args.xla_python}"] if args.xla_python else []),
                   "--", *recipe.args]
        env = ready.env
        try:
            done = subprocess.run(command, cwd=ready.cwd, env=env, capture_output=True, text=True,
                                  timeout=2 * args.timeout + 120)
        except subprocess.TimeoutExpired:
            return None, "accrewrite verify itself did not finish", time.monotonic() - start, None
    return done.returncode, verdict_line(done), time.monotonic() - start, graph_profile(done.stdout)


_EXCEPTION = re.compile(r"[\w.]*(Error|Exception|Interrupt|Exit)\b.*")


def verdict_line(done: subprocess.CompletedProcess) -> str:
    """The last line of stdout (match/diverge), or for a side that cannot run its error and the
    exception its output ends with (else its last line)."""
    out = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode in (0, 1) and out:
        return out[-1]
    err = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    if not err:
        return f"exit {done.returncode}"
    error = next((line for line in err if line.startswith("error:")), err[0])
    cause = next((line for line in reversed(err) if _EXCEPTION.fullmatch(line)), err[-1])
    return error if cause == error else f"{error} | {cause}"


END_TAIL = 6  # lines of stderr kept for a side that did not run to its end


def end_sides(recipe: Recipe) -> list[str]:
    return [*(["original"] if recipe.original_runs else []), "runtime", "torch_xla"]


def run_to_end(script: Path, relative: str, recipe: Recipe, side: str, args) -> EndResult:
    """``side`` run as a user runs it, with the recipe's arguments and data, to the script's end:
    the migrated copies are made as ``accrewrite verify`` makes them; torch_xla runs on
    PJRT_DEVICE=CPU and reports its XLA executions through ``SITE``."""
    python = args.xla_python if side == "torch_xla" else args.python
    if not python:
        return EndResult(relative, side, None, "skipped: no --xla-python (or $ACCREWRITE_XLA_PYTHON)")
    missing = _missing(recipe, [python])
    if missing:
        return EndResult(relative, side, None, missing)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="real-scripts-") as scratch:
        try:
            ready = prepare(script, recipe, Path(scratch), args.python)
            (Path(scratch) / "sides").mkdir()
            workspace = Workspace(Path(scratch) / "sides", ready.cwd, ready.script, Path(scratch))
            workspace.survey()
            errors: list[str] = []
            home, path = workspace.view(side, None if side == "original" else side, errors)
        except Exception as exc:  # noqa: BLE001 - one recipe never stops the run
            return EndResult(relative, side, None, f"could not prepare it: {type(exc).__name__}: {exc}")
        if errors:
            return EndResult(relative, side, None, "migration error: " + "; ".join(errors))
        launch = [] if recipe.nproc <= 1 else ["-m", "accrewrite.launcher", "--standalone",
                                               f"--nproc_per_node={recipe.nproc}"]
        env = {**ready.env, "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", **side_environment(recipe, side)}
        with open(Path(scratch) / "stderr", "w+b") as err:
            process = subprocess.Popen([python, *launch, str(path), *recipe.args], cwd=home, env=env,
                                       stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            try:
                code = process.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                code = None
            err.seek(0)
            stderr = err.read().decode(errors="replace")
    result = EndResult(relative, side, code, "", time.monotonic() - start)
    if side == "torch_xla":
        counts = [dict(zip(mark[2::2], map(int, mark[3::2])))
                  for mark in (line.split() for line in stderr.splitlines() if line.startswith(XLA_MARK))]
        if counts:
            result.executions, result.compilations, result.fallbacks = (
                sum(c[key] for c in counts) for key in ("executions", "compilations", "fallbacks"))
    if code != 0:
        tail = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith(XLA_MARK)]
        reason = [f"still running after {args.timeout:.0f} s (--timeout)"] if code is None else []
        result.note = " | ".join(reason + first_exception(tail) + tail[-END_TAIL:])
    return result


_RANK = re.compile(r"\[(default)?rank\d+\]:\s*")


def first_exception(lines: list[str]) -> list[str]:
    """The first exception a process raised (``[rankN]: `` prefixes dropped), where the end of
    stderr may be a launcher's summary of the failed ranks instead."""
    found = (_RANK.sub("", line, count=1) for line in lines)
    return next(([line] for line in found if _EXCEPTION.fullmatch(line) and not line.startswith("Traceback")), [])


def side_environment(recipe: Recipe, side: str) -> dict[str, str]:
    """torch_xla runs on PJRT's CPU client, one device: with two (``CPU_NUM_DEVICES=2``) each
    process takes both as its own and their first all-reduce never meets. The runtime side of a
    script that spawns a process per device gets ``recipe.devices``."""
    if side == "torch_xla":
        return {"PJRT_DEVICE": "CPU"}
    return {"CPU_NUM_DEVICES": str(recipe.devices)} if side == "runtime" and recipe.devices > 1 else {}


@dataclass
class Outcome:
    """One recipe's verify verdicts and runs to the end."""

    verify: list[VerifyResult]
    ends: list[EndResult]


def run_recipe(script: Path | None, relative: str, recipe: Recipe, args) -> Outcome:
    if script is None:
        return Outcome([VerifyResult(recipe.suffix, sides, counts, None, "skipped: not in DIR")
                        for sides, counts in comparisons(recipe)],
                       [EndResult(recipe.suffix, side, None, "skipped: not in DIR") for side in end_sides(recipe)])
    ends = [] if args.no_end else [run_to_end(script, relative, recipe, side, args) for side in end_sides(recipe)]
    return Outcome([] if args.end_only else run_verify(script, relative, recipe, args), ends)


def verify_all(directory: Path, args) -> list[Outcome]:
    """Every chosen recipe, ``--run-jobs`` at a time (each runs its processes one after another)."""
    found = {p.relative_to(directory).as_posix(): p for p in directory.rglob("*") if p.suffix in (".py", ".ipynb")}
    chosen = [r for r in RECIPES if not args.recipe or any(text in r.suffix for text in args.recipe)]

    def one(numbered: tuple[int, Recipe]) -> Outcome:
        number, recipe = numbered
        match = next((rel for rel in found if rel == recipe.suffix or rel.endswith("/" + recipe.suffix)), None)
        outcome = run_recipe(found.get(match), match or recipe.suffix, recipe, args)
        lines = [f"verify {number}/{len(chosen)} {recipe.suffix}"]
        lines += [f"  {r.comparison}: exit {r.code} {r.verdict}" for r in outcome.verify]
        for e in outcome.ends:
            xla = f", {e.executions} XLA executions" if e.side == "torch_xla" else ""
            lines.append(f"  {e.side} to the end: exit {e.code} in {e.seconds:.0f}s{xla}" + (f": {e.note}" if e.note else ""))
        print("\n".join(lines), file=sys.stderr, flush=True)
        return outcome

    with ThreadPoolExecutor(max_workers=max(args.run_jobs, 1)) as pool:
        return list(pool.map(one, enumerate(chosen, 1)))


# Reporting -----------------------------------------------------------------------------------


def summarise(reports: list[FileReport], targets: list[str]) -> dict:
    """Per target: the counts, the lists to print, the coverage."""
    summary = {}
    for target in targets:
        mine = [r for r in reports if r.target == target]
        training = [r for r in mine if r.training]
        needed = sum(len(r.needs) for r in training)
        satisfied = sum(n.satisfied for r in training for n in r.needs)
        summary[target] = {
            "files": len(mine),
            "internal_errors": [(r.path, r.error) for r in mine if r.internal],
            "refused_by_net": [(r.path, r.error) for r in mine if r.internal and r.error.startswith(REFUSAL)],
            "other_errors": [(r.path, r.error) for r in mine if r.error and not r.internal],
            "not_compiling": [r.path for r in mine if r.compiles is False],
            "not_idempotent": [(r.path, r.idempotency_note) for r in mine if r.idempotent is False],
            "training_scripts": len(training),
            "needed": needed,
            "satisfied": satisfied,
            "coverage": satisfied / needed if needed else None,
            "said": sum(n.said for r in training for n in r.needs),
            "needs_by_kind": {kind: [sum(n.satisfied for r in training for n in r.needs if n.name == kind),
                                     sum(1 for r in training for n in r.needs if n.name == kind)]
                              for kind in (DEVICE, LOADER, REDUCTION, AMP)},
            "diagnostics": dict(sorted(Counter(code for r in mine for code, _ in r.diagnostics).items())),
            **outcomes([r for r in mine if r.trains]),
        }
    return summary


def outcomes(trains: list[FileReport]) -> dict:
    """Of the files that train: how many the migration changed, left with a finding (files per
    code), left silently, was told to skip, failed on; the silent ones with what trains in them."""
    counts = Counter(r.outcome for r in trains)
    diagnosed = [r for r in trains if r.outcome == DIAGNOSED]
    return {
        "trains": len(trains),
        "trains_by_framework": dict(sorted(Counter(r.trains for r in trains).items())),
        "migrated": counts[MIGRATED],
        "diagnosed": counts[DIAGNOSED],
        "diagnosed_by_code": dict(sorted(Counter(code for r in diagnosed for code in {c for c, _ in r.diagnostics})
                                         .items())),
        "silent": [(r.path, _silently(r)) for r in trains if r.outcome == SILENT],
        # Changed or reported for something else (a memory statistic, a host sync), while no
        # fix or finding of a framework's rule concerns it: silent about the training itself.
        "framework_unnamed": [(r.path, r.trains, r.outcome) for r in trains
                              if r.trains != LOOP and r.outcome in (MIGRATED, DIAGNOSED)
                              and not {*r.fixes, *(code for code, _ in r.diagnostics)} & set(FRAMEWORK_CODES)],
        "skipped_by_user": [r.path for r in trains if r.outcome == SKIPPED],
        "failed": [r.path for r in trains if r.outcome == FAILED],
    }


def _silently(report: FileReport) -> str:
    """What trains in a silent file and what it needs, for the lead to read beside it."""
    needs = ", ".join(n.name for n in report.needs) if report.training else ""
    return report.trains + (f" (needs {needs})" if needs else " (no CUDA need found)" if report.training else "")


def print_corpus(summary: dict, targets: list[str]) -> None:
    print("== 1. every file ==")
    for target in targets:
        s = summary[target]
        kinds = Counter(reason.split(":")[0].split("(")[0].strip() for _, reason in s["other_errors"])
        by_kind = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()) or "-"
        print(f"{target}: {s['files']} files, {len(s['internal_errors'])} internal errors, "
              f"{len(s['other_errors'])} other errors ({by_kind}), "
              f"{len(s['not_compiling'])} outputs do not compile, {len(s['not_idempotent'])} not idempotent")
        for path, reason in s["internal_errors"]:
            print(f"  internal error  {path}: {_short(reason, 160)}")
        for path in s["not_compiling"]:
            print(f"  does not compile  {path}")
        for path, note in s["not_idempotent"]:
            print(f"  not idempotent  {path}" + (f": {_short(note, 160)}" if note else ""))


def print_training(reports: list[FileReport], summary: dict, targets: list[str]) -> None:
    rows = defaultdict(dict)
    for r in reports:
        if r.training:
            rows[r.path][r.target] = r
    print(f"\n== 2. training scripts: {len(rows)} (satisfied/needed) ==")
    print("  ".join(f"{t:>9}" for t in targets) + "  script (needs)")
    for path in sorted(rows):
        cells = [f"{sum(n.satisfied for n in rows[path][t].needs)}/{len(rows[path][t].needs)}" for t in targets]
        kinds = ", ".join(n.name for n in rows[path][targets[0]].needs) or "nothing"
        print("  ".join(f"{c:>9}" for c in cells) + f"  {path} ({kinds})")
    for target in targets:
        s = summary[target]
        kinds = ", ".join(f"{kind} {k}/{n}" for kind, (k, n) in s["needs_by_kind"].items())
        print(f"coverage {target}: {_ratio(s)}  ({kinds}); misses the migration reports: {s['said']}")
    print("misses:")
    for target in targets:
        for r in reports:
            for need in r.needs if r.target == target else []:
                if not need.satisfied:
                    print(f"  {target:<9} {r.path}: {need.name}: {need.why}" + (" (reported)" if need.said else ""))


def print_outcomes(summary: dict, targets: list[str]) -> None:
    print("\n== 3. files that train: migrated, left with a finding, left silently ==")
    for target in targets:
        s = summary[target]
        codes = ", ".join(f"{code} {n}" for code, n in s["diagnosed_by_code"].items()) or "-"
        print(f"{target}: {s['trains']} train; {s['migrated']} migrated, {s['diagnosed']} left with a finding "
              f"({codes}), {len(s['silent'])} left silently, {len(s['skipped_by_user'])} skipped by the user, "
              f"{len(s['failed'])} failed")
    print("what trains: " + ", ".join(f"{what} {n}" for what, n in summary[targets[0]]["trains_by_framework"].items()))
    for target in targets:
        for path, what in summary[target]["silent"]:
            print(f"  silent  {target:<9} {path}: {what}")
    codes = "/".join(FRAMEWORK_CODES)
    for target in targets:
        unnamed = summary[target]["framework_unnamed"]
        print(f"{target}: {len(unnamed)} of those that train through a framework were {MIGRATED} or {DIAGNOSED} "
              f"with no {codes} fix or finding")
        for path, what, done in unnamed:
            print(f"  unnamed  {target:<9} {path}: {what}, {done}")


def _ratio(s: dict) -> str:
    if s["coverage"] is None:
        return "- (nothing needed)"
    return f"{s['coverage']:.2f} ({s['satisfied']}/{s['needed']})"


def print_diagnostics(summary: dict, targets: list[str]) -> None:
    codes = sorted({code for t in targets for code in summary[t]["diagnostics"]})
    print("\n== 4. diagnostics by code ==")
    print("code    " + "  ".join(f"{t:>9}" for t in targets))
    for code in codes:
        print(f"{code:<8}" + "  ".join(f"{summary[t]['diagnostics'].get(code, 0):>9}" for t in targets))


def list_diagnostics(directory: Path, reports: list[FileReport]) -> None:
    print("\n== ACC101/ACC102/ACC103 findings (runtime) ==")
    for r in reports:
        listed = sorted((line, code) for code, line in r.diagnostics
                        if r.target == "runtime" and code in LISTED_DIAGNOSTICS)
        if not listed:
            continue
        lines = (directory / r.path).read_bytes().decode("utf-8", errors="replace").splitlines()
        for line, code in listed:
            text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            print(f"{r.path}:{line}: {code} {text}")


def print_verify(outcomes: list[Outcome]) -> None:
    results = [r for o in outcomes for r in o.verify]
    ends = [e for o in outcomes for e in o.ends]
    print("\n== 5. accrewrite verify ==")
    width = max((len(r.script) for r in results), default=10)
    print("(xla, per step after warm-up, verify's own reads not counted: graph executions/step, compilations "
          "after warm-up, host transfers/step, what changed and ran a graph compiled after warm-up)")
    print(f"{'script':<{width}}  {'comparison':<18}  exit  {'time':>6}  {'graphs':>6}  {'late':>4}  "
          f"{'moves':>5}  verdict")
    for r in results:
        code = "-" if r.code is None else str(r.code)
        graphs, late, moves = ((r.profile.graphs, str(r.profile.compilations), r.profile.transfers) if r.profile
                               else ("-", "-", "-"))
        print(f"{r.script:<{width}}  {r.comparison:<18}  {code:>4}  {r.seconds:>5.0f}s  {graphs:>6}  {late:>4}  "
              f"{moves:>5}  {r.verdict}")
        if r.profile and r.profile.line:
            print(f"{'':<{width}}  late compilation: {r.profile.line}")
    if ends:
        print("\n== 6. to the end: each side run as a user runs it, with the recipe's arguments ==")
        print(f"{'script':<{width}}  {'side':<9}  exit  {'time':>6}  xla (executions/compilations/fallbacks)  why not")
        for e in ends:
            code = "-" if e.code is None else str(e.code)
            xla = "" if e.executions is None else f"{e.executions}/{e.compilations}/{e.fallbacks}"
            print(f"{e.script:<{width}}  {e.side:<9}  {code:>4}  {e.seconds:>5.0f}s  {xla:<40}  {e.note}")
    print("\n== per script: verify within the tolerance, ran to the end, XLA executions ==")
    print(f"{'script':<{width}}  {'original':>8}  {'runtime':>7}  {'to end':>6}  {'torch_xla':>9}  {'to end':>6}  "
          "xla exec.")
    for o in outcomes:
        row = scorecard(o)
        print(f"{row['script']:<{width}}  {row['original to end']:>8}  {row['runtime verify']:>7}  "
              f"{row['runtime to end']:>6}  {row['torch_xla verify']:>9}  {row['torch_xla to end']:>6}  "
              f"{row['xla executions']}")
    notes = {r.suffix: r.note for r in RECIPES if r.note}
    for script, note in sorted(notes.items()):
        if any(res.script.endswith(script) for res in results):
            print(f"  note {script}: {note}")


def _yes_no(code: int | None) -> str:
    return "-" if code is None else ("yes" if code == 0 else "no")


def scorecard(outcome: Outcome) -> dict[str, str]:
    """One row of the per-script table: "-" where it did not run (skipped, not applicable)."""
    script = (outcome.verify or outcome.ends)[0].script
    row = {"script": script}
    for target in ("runtime", "torch_xla"):
        codes = [r.code for r in outcome.verify if target in r.counts_for]
        row[f"{target} verify"] = _yes_no(codes[0]) if codes else "-"
    for side in ("original", "runtime", "torch_xla"):
        ends = [e for e in outcome.ends if e.side == side]
        row[f"{side} to end"] = "-" if not ends or (ends[0].code is None and ends[0].note.startswith("skipped")) \
            else ("yes" if ends[0].code == 0 else "no")
    xla = [e for e in outcome.ends if e.side == "torch_xla" and e.executions is not None]
    row["xla executions"] = str(xla[0].executions) if xla else "-"
    return row


def verified_counts(outcomes: list[Outcome], rtol: float | None) -> dict[str, str]:
    results = [r for o in outcomes for r in o.verify]
    ends = [e for o in outcomes for e in o.ends]
    counts = {}
    for target in ("runtime", "torch_xla"):
        mine = [r for r in results if target in r.counts_for and r.code is not None]
        ok = sum(r.code == 0 for r in mine)
        skipped = sum(1 for r in results if target in r.counts_for and r.code is None)
        via_xla = sum(1 for r in mine if r.comparison == "runtime,torch_xla")
        extras = [f"{via_xla} compared runtime,torch_xla: the original needs CUDA"] if via_xla else []
        extras += [f"{skipped} not run"] if skipped else []
        within = f"--rtol {rtol:g}" if rtol else "the measured noise"
        counts[target] = f"{ok}/{len(mine)} within {within}" + (f" ({'; '.join(extras)})" if extras else "")
        ran = [e for e in ends if e.side == target and not e.note.startswith("skipped")]
        if ran:
            counts[target] += f"; {sum(e.code == 0 for e in ran)}/{len(ran)} ran to the end"
        if target == "torch_xla" and ran:
            idle = sum(e.code == 0 and not e.executions for e in ran)
            counts[target] += f" ({idle} of them without an XLA execution)"
    return counts


def print_summary(summary: dict, targets: list[str], verify: list[Outcome] | None, rtol: float | None) -> None:
    print("\n== summary ==")
    print(f"{'target':<10} {'files':>6} {'internal':>9} {'net refused':>12} {'not idem.':>10} {'training':>9}  "
          f"{'trains':>6} {'migrated':>8} {'diagnosed':>9} {'silent':>6}  coverage")
    for target in targets:
        s = summary[target]
        print(f"{target:<10} {s['files']:>6} {len(s['internal_errors']):>9} {len(s['refused_by_net']):>12} "
              f"{len(s['not_idempotent']):>10} "
              f"{s['training_scripts']:>9}  {s['trains']:>6} {s['migrated']:>8} {s['diagnosed']:>9} "
              f"{len(s['silent']):>6}  {_ratio(s)}")
    if verify is not None:
        for target, text in verified_counts(verify, rtol).items():
            print(f"verified {target}: {text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", metavar="DIR", help="a directory of fetched repositories")
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated (default: all three)")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="skip matching paths (repeatable)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: one per CPU)")
    parser.add_argument("--list-diagnostics", action="store_true", help="print every ACC101-103 finding (runtime)")
    parser.add_argument("--json", metavar="OUT", help="write everything as JSON")
    parser.add_argument("--verify", action="store_true", help="run accrewrite verify on the recipes")
    parser.add_argument("--python", default=sys.executable, help="runs accrewrite verify, the original and runtime")
    parser.add_argument("--xla-python", default=os.environ.get("ACCREWRITE_XLA_PYTHON"),
                        help="runs the torch_xla side (default: $ACCREWRITE_XLA_PYTHON)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per verify (default 5)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per verify side and run (default 300)")
    parser.add_argument("--rtol", type=float, help="verify's --rtol (default: none, the measured noise decides)")
    parser.add_argument("--recipe", action="append", metavar="TEXT", help="verify only recipes whose path has TEXT")
    parser.add_argument("--no-end", action="store_true", help="verify only: no runs to the end")
    parser.add_argument("--end-only", action="store_true", help="runs to the end only: no accrewrite verify")
    parser.add_argument("--run-jobs", type=int, default=1, help="recipes verified at once (default 1)")
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in SPELLINGS]
    if unknown:
        parser.error(f"unknown target {', '.join(unknown)}; choose from {', '.join(SPELLINGS)}")

    directory = Path(args.directory).resolve()
    paths = discover([str(directory)], tuple(args.exclude)).files
    reports = corpus_pass(directory, paths, targets, max(args.jobs, 1))
    summary = summarise(reports, targets)
    print_corpus(summary, targets)
    print_training(reports, summary, targets)
    print_outcomes(summary, targets)
    print_diagnostics(summary, targets)
    if args.list_diagnostics:
        list_diagnostics(directory, reports)
    verify = verify_all(directory, args) if args.verify else None
    if verify is not None:
        print_verify(verify)
    print_summary(summary, targets, verify, args.rtol)
    if args.json:
        document = {"directory": str(directory), "targets": targets, "summary": summary,
                    "files": [asdict(r) for r in reports],
                    "verify": None if verify is None else {
                        "results": [asdict(r) for o in verify for r in o.verify],
                        "ends": [asdict(e) for o in verify for e in o.ends],
                        "scripts": [scorecard(o) for o in verify],
                        "counts": verified_counts(verify, args.rtol)}}
        Path(args.json).write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
