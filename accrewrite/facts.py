"""What the analysis learns about a training script, read by every rule: its devices, loaders,
optimizers and training loops, and the questions rules ask of them (the device bound where a
statement runs, whether the file reduces its gradients itself, what it spawns). The walk that
fills it is ``accrewrite.analysis``; what the file declares is its ``FileFacts``; what its
expressions hold is ``accrewrite.values``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Callable

import libcst as cst

from accrewrite.file_model import FileFacts
from accrewrite.nodes import call_arg, dotted, node_types, string_value, walk
from accrewrite.targets import spelled_callees
from accrewrite.values import CommandLineOptions, FileValues, Kind, ScopeValues, Spawn, target_names

SCALER_NAMES = frozenset({
    "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.amp.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
    "torch.GradScaler",
    # The targets' scalers: a migrated file still trains with loss scaling.
    *spelled_callees("grad_scaler"),
})

# Names of lists of CUDA indices (an option of the pix2pix family, a launcher's list).
_GPU_ID_LISTS = frozenset({"gpu_ids", "gpus", "device_ids"})
# What a ``--device`` option's default may name besides CUDA.
DEVICE_TYPES = frozenset({"cpu", "mps", "xpu", "hpu", "npu", "xla", "meta", "cuda"})

# What keeps parameters' gradients gradients: a view of them (``p.grad.view(-1)``), a flat
# buffer of them (``torch.cat(grads)``, DDP's own ``_flatten_dense_tensors``).
_GRADIENT_VIEWS = frozenset({"view", "reshape", "flatten", "contiguous", "detach", "clone", "float", "to", "div_",
                             "mul_"})
_GRADIENT_BUFFERS = frozenset({"torch.cat", "torch.stack", "torch.flatten", "torch._utils._flatten_dense_tensors"})
# The base class of an autograd Function: an all-reduce in its ``backward`` reduces the gradient
# of the Function's input (a gather with gradients), not the parameters'.
_AUTOGRAD_FUNCTIONS = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})


@dataclass(eq=False)
class TrainingLoop:
    """A for/while loop that trains: it calls backward or an optimizer step, directly or
    through a function of the same file."""

    node: cst.For | cst.While
    scope: cst.FunctionDef | None
    calls_backward: bool = False
    calls_step: bool = False
    # Whether a loop that steps the optimizer is nested inside (an epoch loop around the step
    # loop; not a gradient-accumulation loop that only calls backward).
    encloses_step_loop: bool = False


@dataclass(frozen=True, eq=False)
class Binding:
    """An assignment a rule may place code after: ``name = ...`` in ``statement``, inside
    function ``scope`` (None at module level), ``order``-th statement of the file."""

    name: str
    statement: cst.CSTNode = field(repr=False)
    scope: cst.FunctionDef | None = field(repr=False)
    order: int


@dataclass(frozen=True)
class Triggers:
    """What makes a statement worth walking, rule by rule (``Rule.triggers`` and
    ``Rule.trigger_nodes``). A mask has bit ``i`` for the ``i``-th rule."""

    words: dict[str, int]  # a word (name, attribute name, text in a string) -> the rules it concerns
    types: dict[type, int]  # a node type -> the rules it concerns
    always: int  # the rules without triggers: every statement concerns them
    bits: dict[type, int]  # each rule (its class) -> its bit
    # Whether a string's text holds one of the words (one search, not a test per word); None
    # without words.
    search: Callable[[str], object] | None

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def of(rules: tuple[type, ...]) -> "Triggers":
        """The triggers of ``rules`` (cached: every file of a run has the same rules)."""
        words: dict[str, int] = {}
        types: dict[type, int] = {}
        always = 0
        for index, rule in enumerate(rules):
            bit = 1 << index
            if rule.triggers is None:
                always |= bit
                continue
            for word in rule.triggers:
                words[word] = words.get(word, 0) | bit
            for kind in node_types(*rule.trigger_nodes):
                types[kind] = types.get(kind, 0) | bit
        search = re.compile("|".join(map(re.escape, sorted(words)))).search if words else None
        return Triggers(words, types, always, {rule: 1 << index for index, rule in enumerate(rules)}, search)


@dataclass
class Facts:
    """What one analysis pass learns about a file."""

    # Each target whose modules the file imports (one migrated to it, or written for it by
    # hand), with the first import that does.
    target_imports: dict[str, cst.Import | cst.ImportFrom] = field(default_factory=dict)
    # Variables assigned a CUDA device.
    devices: list[Binding] = field(default_factory=list)
    # The values of those assignments (so that a rule rewrites the assignment, not the value).
    device_values: set[cst.CSTNode] = field(default_factory=set)
    optimizers: dict[str, cst.Call] = field(default_factory=dict)
    scalers: set[str] = field(default_factory=set)
    loader_bindings: list[Binding] = field(default_factory=list)
    optimizer_bindings: list[Binding] = field(default_factory=list)
    # Names already assigned a device loader (a migrated file).
    device_loaders: set[str] = field(default_factory=set)
    loops: list[TrainingLoop] = field(default_factory=list)
    # Functions that call backward or an optimizer step (a training step factored out of the
    # loop, as in TorchAcc's migration guide's loop_with_amp).
    step_functions: set[cst.FunctionDef] = field(default_factory=set)
    # Seeds passed to torch.manual_seed, as code.
    torch_seeds: set[str] = field(default_factory=set)
    # The first argument of each all-reduce (``torch.distributed``'s reductions) of the file,
    # with its function: ``reduces_gradients`` reads them.
    collectives: list[tuple[cst.BaseExpression, cst.FunctionDef | None]] = field(default_factory=list)
    # The framework the file trains through, when one manages devices and gradients itself
    # (Accelerate, Lightning: ACC019, ACC018; a Trainer the file builds, transformers': ACC017).
    framework: str | None = None
    # The calls that build a Trainer (``Trainer(model=..., args=...)``), in a file it trains.
    trainer_builds: list[cst.Call] = field(default_factory=list)
    # Whether the file moves anything to a device (``.cuda()``, ``.to(device)``, ``device=``, or
    # a framework that places the model): a script that never does trains on the CPU, where
    # nothing waits for a device.
    places_on_device: bool = False
    # Names passed to DistributedDataParallel/DataParallel as their device_ids: lists of CUDA
    # indices (``.to(device_ids[0])`` in PyTorch's DDP tutorial); see ``lists_device_ids``.
    device_id_lists: set[str] = field(default_factory=set)
    # Each statement's next sibling in its block (None for the last).
    next_statement: dict[cst.CSTNode, cst.CSTNode | None] = field(default_factory=dict)
    # Each statement's position in the file (statements numbered in source order; the small
    # statements of a line share its number).
    order: dict[cst.CSTNode, int] = field(default_factory=dict)
    # Every ``for`` loop, with the function it is in (None at module level).
    for_loops: list[tuple[cst.For, cst.FunctionDef | None]] = field(default_factory=list)
    # ``iter(x)`` calls, with their function and statement.
    iter_calls: list[tuple[cst.Call, cst.FunctionDef | None, cst.CSTNode]] = field(default_factory=list)
    # ``next(it)`` calls: the name read, its function and the loops around the call.
    next_calls: list[tuple[str, cst.FunctionDef | None, tuple[cst.CSTNode, ...]]] = field(default_factory=list)
    # The rules each statement concerns (a mask of ``triggers``): those whose trigger words it
    # mentions, and of the statements in it. None: every statement concerns every rule.
    hot: dict[cst.CSTNode, int] | None = None
    triggers: Triggers | None = None
    # The ids of the nodes whose subtree holds no node of the types the rule walk acts on
    # (``analyze``'s ``walked``): the walk need not enter them. (Ids: a node hashes by a Python
    # method of libcst's, and this is asked of nearly every node; the tree outlives the set.)
    inert: set[int] = field(default_factory=set)
    # What the file declares (its imports, definitions, assignments, calls), once the walk has
    # ended; and its command-line options, read when first asked.
    file: FileFacts | None = None
    _options: CommandLineOptions | None = None
    _values: FileValues | None = None
    _launched: set[cst.FunctionDef] | None = None
    _reduces_gradients: bool | None = None

    def concerned(self, statement: cst.CSTNode) -> int:
        """The rules that ``statement`` concerns, as a mask of ``triggers`` (-1: every rule)."""
        if self.hot is None:
            return -1
        return self.hot.get(statement, 0) | self.triggers.always

    def values(self, scope: cst.FunctionDef | None) -> ScopeValues:
        """What each expression of ``scope`` (a function, or None for module level) holds: the
        file's one data-flow analysis (``accrewrite.values``), computed for a scope when a rule
        first asks."""
        return self.file_values.of(scope)

    def forget_values(self) -> None:
        """Drop the data-flow analysis (computed again if asked): its parts refer to each other."""
        if self._values is not None:
            self._values.forget()
            self._values = None

    @property
    def file_values(self) -> FileValues:
        """The data-flow analysis's per-file part: what it reads from the syntax alone (the
        functions, their calls, the options), no scope's values computed for it."""
        if self._values is None:
            self._values = FileValues(self.file, self.options)
        return self._values

    @property
    def options(self) -> CommandLineOptions:
        """The file's command-line options (``parser.add_argument``)."""
        if self._options is None:
            self._options = CommandLineOptions(
                (call for call, _ in self.file.calls), self.file.option_parses, self.file.text)
        return self._options

    def passed(self, function: cst.FunctionDef) -> list[tuple[cst.FunctionDef | None, cst.Call, dict]]:
        """What each call of ``function`` in this file passes: (calling scope, the call,
        parameter name -> argument expression)."""
        return self.file_values.passed(function)

    @property
    def reduces_gradients(self) -> bool:
        """Whether the script all-reduces its parameters' gradients itself: ``dist.all_reduce``
        of ``p.grad`` over the parameters, of a buffer of them, in a helper given them. Not the
        all-reduce in an autograd Function's ``backward`` (a gather with gradients, which
        reduces the gradient of its input), nor that of a loss or metric (a gradient norm)."""
        if self._reduces_gradients is None:
            self._reduces_gradients = any(
                not self._in_autograd_backward(scope) and self._holds_gradients(value, scope, set())
                for value, scope in self.collectives
            )
        return self._reduces_gradients

    def _in_autograd_backward(self, scope: cst.FunctionDef | None) -> bool:
        owner = self.file.method_class.get(scope)
        return owner is not None and scope.name.value == "backward" and any(
            self.file.qualname(base.value) in _AUTOGRAD_FUNCTIONS for base in owner.bases)

    def _holds_gradients(self, value: cst.BaseExpression, scope: cst.FunctionDef | None, seen: set) -> bool:
        """Whether ``value`` (in ``scope``) is parameters' gradients: ``p.grad``, a view or a
        flat buffer of them, a list of them, a name bound to one of those."""
        kind = type(value)
        if kind is cst.Attribute:
            return value.attr.value == "grad" or value.attr.value == "data" and self._holds_gradients(
                value.value, scope, seen)
        if kind is cst.Subscript:
            return self._holds_gradients(value.value, scope, seen)
        if kind in (cst.List, cst.Tuple):
            return any(self._holds_gradients(element.value, scope, seen) for element in value.elements)
        if kind in (cst.ListComp, cst.GeneratorExp):
            return self._holds_gradients(value.elt, scope, seen) or self._iterates_gradients(value, scope, seen)
        if kind is cst.Call:
            func = value.func
            if type(func) is cst.Attribute and func.attr.value in _GRADIENT_VIEWS:
                return self._holds_gradients(func.value, scope, seen)
            first = call_arg(value, 0, "tensors")
            return (self.file.qualname(func) in _GRADIENT_BUFFERS and first is not None
                    and self._holds_gradients(first.value, scope, seen))
        if kind is not cst.Name or (value.value, scope) in seen:
            return False
        seen.add((value.value, scope))
        return self._name_holds_gradients(value.value, scope, seen)

    def _iterates_gradients(self, comprehension: cst.ListComp | cst.GeneratorExp, scope, seen: set) -> bool:
        """``[g.view(-1) for g in grads]``: the element is a name the comprehension binds, or a view
        of one, over gradients."""
        root = comprehension.elt
        while type(root) is cst.Call and type(root.func) is cst.Attribute and root.func.attr.value in _GRADIENT_VIEWS:
            root = root.func.value
        clause = comprehension.for_in
        while type(root) is cst.Name and clause is not None:
            if root.value in target_names(clause.target):
                return self._holds_gradients(clause.iter, scope, seen)
            clause = clause.inner_for_in
        return False

    def _name_holds_gradients(self, name: str, scope: cst.FunctionDef | None, seen: set) -> bool:
        """A name holds gradients that it is assigned, iterates over, or (a parameter) is passed;
        a helper that no call of this file passes anything reduces what its parameter's name
        says (``def all_reduce_grads(grads)``)."""
        if any(self._holds_gradients(assigned, scope, seen) for assigned in self.file.assignments.get(name, ())):
            return True
        if any(loop_scope is scope and name in target_names(loop.target)
               and self._holds_gradients(loop.iter, scope, seen) for loop, loop_scope in self.for_loops):
            return True
        if scope is None or name not in {p.name.value for p in (*scope.params.posonly_params, *scope.params.params)}:
            return False
        calls = self.passed(scope)
        if not calls:
            return "grad" in name
        return any(name in arguments and self._holds_gradients(arguments[name], caller, seen)
                   for caller, _, arguments in calls)

    def spawns(self) -> list[Spawn]:
        """The file's ``torch.multiprocessing.spawn`` calls (or a target's spelling of one)."""
        return self.file_values.spawns()

    def defines(self, func: cst.BaseExpression) -> bool:
        """Whether a call of ``func`` calls a function or class of this file."""
        return isinstance(func, cst.Name) and func.value in self.file.definitions.defined

    def in_launcher(self, scopes: list[cst.FunctionDef]) -> bool:
        """Whether code in ``scopes`` (nested functions, innermost last; none at module level)
        runs in the process that spawns the others: the file spawns, and it is not in a launched
        function."""
        return bool(self.spawns()) and not any(self.launched(scope) for scope in scopes)

    def launched(self, scope: cst.FunctionDef | None) -> bool:
        """Whether ``scope`` runs in the processes that the file's spawns start: a worker, or a
        function of the file that one calls (a class it makes: every method)."""
        if self._launched is None:
            self._launched = set()
            pending = [worker for spawn in self.spawns() for worker in spawn.workers]
            while pending:
                function = pending.pop()
                if function not in self._launched:
                    self._launched.add(function)
                    pending += self._callees(function)
        return scope in self._launched

    def _callees(self, function: cst.FunctionDef) -> list[cst.FunctionDef]:
        defined, found = self.file.definitions.defined, []
        method_class = self.file.method_class
        owner = method_class.get(function)

        def enter(node):
            if isinstance(node, cst.FunctionDef) and node is not function:
                found.append(node)  # a nested function runs where it is made
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
                called = defined.get(node.func.value)
                if isinstance(called, cst.FunctionDef):
                    found.append(called)
                elif isinstance(called, cst.ClassDef):
                    found.extend(m for m, c in method_class.items() if c is called)
            elif isinstance(node, cst.Call) and owner is not None and dotted(node.func) is not None \
                    and dotted(node.func).startswith("self."):
                found.extend(m for m, c in method_class.items() if c is owner and
                             m.name.value == node.func.attr.value)
            return True

        walk(function, enter)
        return found

    @property
    def uses_grad_scaler(self) -> bool:
        """Whether the file trains with a GradScaler (AMP with loss scaling)."""
        return bool(self.scalers or self.file.called & SCALER_NAMES)

    def device_at(self, scope: cst.FunctionDef | None, statement: cst.CSTNode | None) -> str | None:
        """The device variable bound where ``statement`` of ``scope`` (a function, or None for
        module level) runs: one that every path to it assigned a device last (not one chosen
        only in a resume branch, a ``try`` body or a loop's body); a parameter named ``device``
        that its callers do not pass a CUDA ordinal (an int); a ``self.`` attribute another
        method of the class assigns; one of module level assigned so before every call that runs
        ``scope``. None: the target's device is to be spelled out."""
        for name in self._devices_chosen(scope):
            if self._chosen_at(scope, name, statement):
                return name
        if scope is None:
            return None
        for param in scope.params.params:
            if param.name.value == "device":
                self.values(None)
                if self.file_values.param_kind(scope, param) is not Kind.INT:
                    return "device"
        method_class = self.file.method_class
        owner = method_class.get(scope)
        for device in self.devices:
            if owner is not None and device.name.startswith("self.") and method_class.get(device.scope) is owner:
                return device.name
        for device in self.devices:
            if device.scope is None and self._runs_after(scope, device):
                return device.name
        return None

    def _runs_after(self, function: cst.FunctionDef, device: Binding, seen: frozenset = frozenset()) -> bool:
        """Whether every run of ``function`` starts where every path has assigned the module-level
        ``device`` last: each call of it in this file is a module-level statement so placed or in
        a function that runs so; a function this file never calls (a callback) must be defined
        so (its module-level statement: a class's, the outermost function's)."""
        module = self.values(None)
        calls = self.file_values.calls_of(function)
        if not calls:
            return self._chosen_at(None, device.name, self._module_statement(function))
        for call, caller, _ in calls:
            if caller is None:
                if not self._chosen_at(None, device.name, module.statement_of(call)):
                    return False
            elif caller in seen or not self._runs_after(caller, device, seen | {function}):
                return False
        return True

    def _devices_chosen(self, scope: cst.FunctionDef | None) -> dict[str, set[cst.CSTNode]]:
        """Each device variable of ``scope``, with the statements that assign it a device."""
        chosen: dict[str, set[cst.CSTNode]] = {}
        for device in self.devices:
            if device.scope is scope:
                chosen.setdefault(device.name, set()).add(device.statement)
        return chosen

    def _chosen_at(self, scope: cst.FunctionDef | None, name: str, statement: cst.CSTNode | None) -> bool:
        """Whether every path to ``statement`` of ``scope`` assigned ``name`` a device last."""
        found = self.values(scope).bindings_at(name, statement)
        return bool(found) and found <= self._devices_chosen(scope).get(name, set())

    def _module_statement(self, function: cst.FunctionDef) -> cst.CSTNode:
        """The module-level statement that defines ``function``: itself, its class's, or the
        function's it is nested in."""
        functions = self.file_values.functions
        found = function
        while found in functions:
            info = functions[found]
            if info.owner is None and info.parent is None:
                break
            found = info.owner if info.owner is not None else info.parent
        return found

    def lists_device_ids(self, chain: str | None) -> bool:
        """Whether ``chain`` names a list of CUDA indices: one given to a wrapper as its
        device_ids (``DataParallel(net, gpu_ids)``), or one named for GPU ids (the pix2pix
        family's ``--gpu_ids`` option, which ``init_net`` reads as ``net.to(gpu_ids[0])``)."""
        return chain is not None and (chain in self.device_id_lists or chain.rpartition(".")[2] in _GPU_ID_LISTS)

    def is_cuda_device(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` selects a CUDA device (see ``selects_cuda``)."""
        return selects_cuda(node, self.file.qualname, self.devices, lambda: self.options)


def selects_cuda(node: cst.CSTNode, qualname: Callable[[cst.CSTNode], str | None], devices: list[Binding],
                 options: Callable[[], CommandLineOptions]) -> bool:
    """Whether ``node`` selects a CUDA device: ``"cuda"``, ``"cuda:0"``, ``f"cuda:{r}"``,
    ``"cuda:{}".format(r)``, ``"cuda:" + str(r)``, ``torch.device("cuda", r)``, ``"cuda" if
    torch.cuda.is_available() else "cpu"``, an option whose default is one. (An integer ordinal is
    a CUDA device too, but only where it is passed as one: see ACC002.) ``qualname`` resolves the
    file's names, ``devices`` are its device variables, ``options()`` its command-line options:
    the analysis walk asks before it has seen the whole file."""
    kind = type(node)
    if kind is cst.Name or kind is cst.Integer:
        return False  # none of the cases below, and what most callers ask about
    text = string_value(node)
    if text is not None:
        return text == "cuda" or text.startswith("cuda:")
    if kind is cst.FormattedString:
        first = node.parts[0] if node.parts else None
        if isinstance(first, cst.FormattedStringExpression) and len(node.parts) > 1:
            # f"{acc}:{rank}": an index put after a device
            after = node.parts[1]
            return (isinstance(after, cst.FormattedStringText) and after.value.startswith(":")
                    and dotted(first.expression) in {binding.name for binding in devices})
        return isinstance(first, cst.FormattedStringText) and first.value.startswith("cuda")
    if kind is cst.Call and qualname(node.func) == "torch.device":
        first = call_arg(node, 0, "type")
        return first is not None and selects_cuda(first.value, qualname, devices, options)
    if kind is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "format":
        template = string_value(node.func.value)  # "cuda:{}".format(args.gpu)
        return template is not None and template.startswith("cuda")
    if kind is cst.Call and qualname(node.func) == "torch.accelerator.current_accelerator":
        return True
    if kind is cst.Attribute and type(node.value) is cst.Name:
        # args.device, default "cuda"; or named device with a default of another device
        # ("cpu", "mps"): the option chooses the device, which the target's now is. (Not
        # ``x.device``, a tensor's.)
        default = options().string_defaults().get(node.attr.value)
        if default is None or options().kind(node) is None:
            return False
        return default == "cuda" or default.startswith("cuda:") or (
            node.attr.value == "device" and default.partition(":")[0] in DEVICE_TYPES)
    if kind is cst.IfExp:
        # ``"cuda" if torch.cuda.is_available() else "cpu"`` and ``"cuda:0" if n_gpu > 0 else
        # "cpu"`` choose a device; nanoGPT's ``"cuda" if "cuda" in device else "cpu"``, which
        # compares a string, names a device's type. (``"mps" if ... else "cuda" if ... else
        # "cpu"`` chooses one too.)
        return not _compares_string(node.test) and (
            selects_cuda(node.body, qualname, devices, options)
            or selects_cuda(node.orelse, qualname, devices, options))
    if kind is cst.BinaryOperation and type(node.operator) is cst.Add:
        prefix = string_value(node.left)  # "cuda:" + str(args.gpu_to_work_on), swav's
        return prefix is not None and prefix.startswith("cuda:")
    return False


def _compares_string(test: cst.BaseExpression) -> bool:
    """``"cuda" in device``, ``args.device == "cuda"``: a test that reads a device's name."""
    return type(test) is cst.Comparison and (string_value(test.left) is not None or any(
        string_value(comparison.comparator) is not None for comparison in test.comparisons))
