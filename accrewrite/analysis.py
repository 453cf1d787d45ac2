"""One analysis pass over a training script: the facts every rule reads.

Names resolve through the file's imports (``import torch.optim as optim; optim.Adam`` and
``from torch.optim import AdamW as W`` both give ``torch.optim.Adam(W)``), never by bare text.
The pass is one walk (``nodes.walk``) with no metadata providers: scope and qualified-name
providers cost several times a parse, and a training script's imports are simple enough to
resolve from a table. It fills the file's ``Facts`` (``accrewrite.facts``) and, once it has
seen the whole file, its ``FileFacts`` (``accrewrite.file_model``).
"""

from __future__ import annotations

import builtins
import functools
import re
from types import MappingProxyType

import libcst as cst

from accrewrite.facts import SCALER_NAMES, Binding, Facts, TrainingLoop, Triggers, selects_cuda
from accrewrite.file_model import Definitions, FileFacts, qualname
from accrewrite.nodes import (
    NODE_TYPES, STATEMENT_TYPES, call_arg, descendants, dotted, node_types, string_value, walk,
)
from accrewrite.targets import spelled_callees, written_for
from accrewrite.values import CommandLineOptions, parses_options, returned_read, target_names

# A trigger word that stands for the calls of the file's functions that return an argument read
# on the host (``to_python_float(t)``, see ``FileFacts.returned_reads``): the statements holding
# such a call are walked for a rule that lists it.
HOST_READ_CALLS = "<calls returning a host read>"
_BUILTINS = frozenset(dir(builtins))

OPTIMIZER_MODULES = ("torch.optim.",)
LOADER_NAMES = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
WRAPPER_NAMES = frozenset({
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
})


# Frameworks that place the model and reduce gradients themselves (ACC018 and ACC019 migrate them
# by their configuration), and RPC-based training, whose gradients travel through distributed
# autograd (ACC107 says why): in their files only the rules that migrate them change anything.
MANAGED_FRAMEWORKS = ("accelerate", "lightning", "pytorch_lightning", "torch.distributed.rpc")


# Of those, the ones that put the model on the accelerator (``accelerator.prepare``, the Trainer):
# their scripts wait for a device as any other does.
PLACING_FRAMEWORKS = frozenset({"accelerate", "lightning", "pytorch_lightning", "transformers"})

# Trainers that run the training loop themselves, with the framework they train through: a file
# that builds one (or a subclass of its own) trains through it. Importing transformers for a
# model that a hand-written loop trains does not.
TRAINER_CLASSES = MappingProxyType({
    "transformers.Trainer": "transformers",
    "transformers.trainer.Trainer": "transformers",
    "transformers.Seq2SeqTrainer": "transformers",
    "transformers.trainer_seq2seq.Seq2SeqTrainer": "transformers",
})


def trainer_framework(qualname: str | None) -> str | None:
    """The framework a Trainer class trains through: transformers' own, and every trainer of
    trl (SFT, DPO, GRPO, reward...), each a subclass of transformers' Trainer."""
    if qualname is None:
        return None
    if qualname.startswith("trl.") and qualname.endswith("Trainer"):
        return "transformers"
    return TRAINER_CLASSES.get(qualname)
TRAINER_CALLBACKS = frozenset({"transformers.TrainerCallback", "transformers.trainer_callback.TrainerCallback"})
# What a Trainer is given that it calls on every step (or every evaluation step). Not
# compute_metrics: it is given numpy arrays, read from the device once per evaluation.
_TRAINER_STEP_ARGUMENTS = ("data_collator", "preprocess_logits_for_metrics", "compute_loss_func")


# The method each framework calls for a training step, where it runs the backward pass and
# the optimizer step itself: host syncs and dynamic shapes there are the step's (ACC101, ACC103).
FRAMEWORK_STEPS = MappingProxyType({"lightning": "training_step", "pytorch_lightning": "training_step"})


def managed_by(module: str) -> str | None:
    """The framework of ``MANAGED_FRAMEWORKS`` that importing ``module`` trains through."""
    return next((f for f in MANAGED_FRAMEWORKS if module == f or module.startswith(f + ".")), None)

# The targets' device calls: a migrated file places on its device.
_DEVICE_CALLS = spelled_callees("device")

# torch.cuda/accelerator calls that place nothing: they ask (``pin_memory=torch.cuda.is_available()``),
# seed the device's generators (a host script's ``set_seed`` helper), or keep its memory's books.
_QUERIES = frozenset({"is_available", "device_count", "is_bf16_supported", "get_device_name", "get_device_capability",
                      "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
                      "get_rng_state_all", "set_rng_state", "set_rng_state_all", "empty_cache",
                      "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
                      "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                      "memory_cached", "max_memory_cached", "memory_stats", "memory_summary", "mem_get_info"})

_COLLECTIVES = frozenset({"torch.distributed.all_reduce", "torch.distributed.reduce_scatter", "torch.distributed.reduce",
                "torch.distributed.all_reduce_coalesced"})
def placed_model(line: cst.CSTNode, models: set[str]) -> str | None:
    """The model's name when ``line`` moves one of ``models`` to a device: ``model.to(d)``,
    ``model = model.to(d)``, ``model = Net().cuda()``."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    statement = line.body[0]
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
        name, call = dotted(statement.targets[0].target), statement.value
    elif isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
        call = statement.value
        name = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
    else:
        return None
    if name not in models or not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
        return None
    return name if call.func.attr.value in ("to", "cuda") else None


@functools.lru_cache(maxsize=64)
def _types_named(names: frozenset[str]) -> frozenset[type]:
    """The node types of ``names`` (cached: every file of a run walks the same types)."""
    return frozenset(kind for kind in NODE_TYPES if kind.__name__ in names)


class _Analyzer:
    def __init__(self, module: cst.Module, text: str | None, triggers: Triggers | None,
                 walked: frozenset[str] | None) -> None:
        self.facts = Facts(hot=None if triggers is None else {}, triggers=triggers)
        self._words = dict(triggers.words) if triggers is not None else {}
        self._in_text = triggers.search if triggers is not None else None
        self._every = (1 << len(triggers.bits)) - 1 if triggers is not None else -1
        self._trigger_types = triggers.types if triggers is not None else {}
        # What the walk does at each node type (``_steps_at``), looked up once a type.
        self._steps: dict[type, tuple] = {}
        # The rules that each open statement concerns so far, innermost last.
        self._masks: list[int] = []
        # Per node entered and not yet left, innermost last: whether its subtree holds a node of
        # the types the rules' walk acts on.
        self._live: list[bool] = []
        self._walked_types = None if walked is None else _types_named(walked)
        self._statements: list[cst.CSTNode] = []
        self._order = 0
        self._functions: list[cst.FunctionDef] = []
        # Enclosing classes and functions, innermost last.
        self._containers: list[cst.ClassDef | cst.FunctionDef] = []
        self._loops: list[TrainingLoop] = []
        # Functions (by name) that call backward or step: loops calling them train.
        self._step_functions: dict[str, tuple[bool, bool]] = {}
        self._function_calls: dict[cst.FunctionDef | None, tuple[bool, bool]] = {}
        self._loop_callees: list[tuple[TrainingLoop, str]] = []
        # Each loop with the statements it is in (itself last), and where its own statements
        # start and end in ``_concerning`` (the statements that concern some rule, as left).
        self._loop_statements: dict[cst.CSTNode, tuple[cst.CSTNode, ...]] = {}
        self._loop_spans: dict[cst.CSTNode, tuple[int, int]] = {}
        self._concerning: list[cst.CSTNode] = []
        # Lists indexed for a device (``.to(ids[0])``): CUDA indices where they are device_ids.
        self._indexed_moves: set[str | None] = set()
        # Calls of plain names, with their enclosing statements, while a rule asks for
        # HOST_READ_CALLS (whether the name returns a host read is known at the module's end).
        self._name_calls: list[tuple[str, tuple[cst.CSTNode, ...]]] | None = (
            [] if HOST_READ_CALLS in self._words else None
        )
        self._calls: list[tuple[cst.Call, cst.FunctionDef | None]] = []
        # The file's subclasses of a Trainer (name -> framework), and those and its Trainer
        # callbacks: the Trainer calls their methods on each step.
        self._trainers: dict[str, str] = {}
        self._trainer_classes: list[cst.ClassDef] = []
        # The names bound, and declared global or nonlocal, in the body being walked (a
        # function's, or the module), innermost last; None inside a nested scope (a class, a
        # lambda, a comprehension, a function's header), whose names are its own.
        self._binders: list[tuple[set[str], set[str], cst.CSTNode] | None] = []
        # What the file declares, as ``FileFacts`` holds it once the walk has ended.
        self._imports: dict[str, str] = {}
        self._imported_modules: set[str] = set()
        self._definitions = Definitions()
        self._local_names: dict[cst.CSTNode, frozenset[str]] = {}
        self._method_class: dict[cst.FunctionDef, cst.ClassDef] = {}
        self._models: set[str] = set()
        self._loaders: set[str] = set()
        self._assignments: dict[str, list[cst.BaseExpression]] = {}
        self._assigned_calls: dict[str, str] = {}
        self._called: set[str] = set()
        self._option_parses: list[cst.Assign] = []
        self._returned_reads: dict[str, frozenset[str]] = {}
        self._module, self._text = module, text
        self._scanned_options: CommandLineOptions | None = None

    def _qualname(self, node: cst.CSTNode) -> str | None:
        return qualname(self._imports, node)

    def _is_cuda_device(self, node: cst.CSTNode) -> bool:
        return selects_cuda(node, self._qualname, self.facts.devices, self._options)

    def _options(self) -> CommandLineOptions:
        """The file's options, asked before the walk has seen them all: a walk of their own."""
        if self._scanned_options is None:
            self._scanned_options = CommandLineOptions.scanned(self._module, self._text)
        return self._scanned_options

    def file_facts(self) -> FileFacts:
        """What the walk has learnt the file declares, once it has ended."""
        return FileFacts(
            module=self._module, text=self._text, imports=MappingProxyType(self._imports),
            imported_modules=frozenset(self._imported_modules), definitions=self._definitions.frozen(),
            local_names=MappingProxyType(self._local_names), method_class=MappingProxyType(self._method_class),
            models=frozenset(self._models), loaders=frozenset(self._loaders),
            assignments=MappingProxyType({name: tuple(values) for name, values in self._assignments.items()}),
            assigned_calls=MappingProxyType(self._assigned_calls), called=frozenset(self._called),
            calls=tuple(self._calls), option_parses=tuple(self._option_parses),
            returned_reads=MappingProxyType(self._returned_reads),
        )

    @property
    def _scope(self) -> cst.FunctionDef | None:
        return self._functions[-1] if self._functions else None

    # Hot statements ------------------------------------------------------------------------

    def _steps_at(self, kind: type) -> tuple:
        """At a node of ``kind``: whether it is a statement, the rules its type concerns, the
        analysis's ``visit_``/``leave_`` functions for it, and whether the rules' walk acts on it."""
        name = kind.__name__
        visit, leave = getattr(_Analyzer, "visit_" + name, None), getattr(_Analyzer, "leave_" + name, None)
        live = self._walked_types is None or kind in self._walked_types
        found = self._steps[kind] = (kind in STATEMENT_TYPES, self._trigger_types.get(kind, 0), visit, leave, live)
        return found

    def enter(self, node: cst.CSTNode) -> None:
        """The walk's step into ``node`` (it enters every node of the file): the statements
        open and their order, the rules its type concerns, the node's ``visit_`` function."""
        kind = type(node)
        statement, concerns, visit, _, live = self._steps.get(kind) or self._steps_at(kind)
        if statement:
            self._statements.append(node)
            self._masks.append(0)
            self._order += 1
            order = self.facts.order
            order[node] = self._order
            if kind is cst.SimpleStatementLine:
                for small in node.body:
                    order[small] = self._order
        if concerns:
            self._mark_hot(concerns)
        if visit is not None:
            visit(self, node)
        self._live.append(live)

    def leave(self, node: cst.CSTNode) -> None:
        """The walk's step out of ``node``, after the nodes under it: its ``leave_`` function,
        whether its subtree holds a node the rules' walk acts on, the rules it concerns."""
        statement, _, _, leave, _ = self._steps[type(node)]
        if leave is not None:
            leave(self, node)
        live = self._live.pop()
        if not live:
            self.facts.inert.add(id(node))
        elif self._live:
            self._live[-1] = True
        if statement:
            self._statements.pop()
            mask = self._masks.pop()
            if mask and self.facts.hot is not None:
                self.facts.hot[node] = mask
                self._concerning.append(node)
                if self._masks:
                    self._masks[-1] |= mask  # a statement concerns the rules of those in it

    def _mark_hot(self, mask: int) -> None:
        if self._masks:
            self._masks[-1] |= mask

    def _concern(self, statements, mask: int) -> None:
        """Add ``mask`` to the rules that ``statements`` concern, after the walk."""
        hot = self.facts.hot
        if hot is not None:
            for statement in statements:
                hot[statement] = hot.get(statement, 0) | mask

    def _concern_all_in(self, loop: cst.CSTNode) -> None:
        """A training loop's statements that concern some rule concern every rule: the rules
        that keep the loop's steps (where it ends, where it returns) look at all of them."""
        start, end = self._loop_spans[loop]
        self._concern(self._concerning[start:end], self._every)

    def visit_Name(self, node: cst.Name) -> None:
        mask = self._words.get(node.value)
        if mask:
            self._mark_hot(mask)

    # Text in a string may hold any of the words: it concerns every rule (one search, not a test
    # per word).
    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if self._in_text is not None and self._in_text(node.value):
            self._mark_hot(self._every)

    def visit_FormattedStringText(self, node: cst.FormattedStringText) -> None:
        if self._in_text is not None and self._in_text(node.value):
            self._mark_hot(self._every)  # f"cuda:{rank}"

    # Imports ---------------------------------------------------------------------------------

    def _note_framework(self, module: str | None) -> None:
        if self.facts.framework is None:
            self.facts.framework = managed_by(module or "")
            if self.facts.framework in PLACING_FRAMEWORKS:
                self.facts.places_on_device = True

    def _note_target(self, module: str, node: cst.Import | cst.ImportFrom) -> None:
        target = written_for(module)
        if target is not None:
            self.facts.target_imports.setdefault(target, node)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted(alias.name)
            self._note_framework(full)
            self._note_target(full, node)
            if alias.asname is not None:
                self._imports[alias.asname.name.value] = full
            else:
                root = full.split(".")[0]
                self._imports[root] = root
                self._imported_modules.add(full)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted(node.module)
        self._note_framework(module)
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else dotted(alias.name)
            self._note_framework(f"{module}.{name}")  # from torch.distributed import rpc
            self._note_target(f"{module}.{name}", node)
            local = alias.asname.name.value if alias.asname is not None else name
            self._imports[local] = f"{module}.{name}"
            if name in self._words and local != name:
                self._words[local] = self._words.get(local, 0) | self._words[name]  # the alias stands for the word

    # Blocks ----------------------------------------------------------------------------------

    def _record_siblings(self, body) -> None:
        for statement, following in zip(body, [*body[1:], None]):
            self.facts.next_statement[statement] = following

    def visit_Module(self, node: cst.Module) -> None:
        self._record_siblings(node.body)
        self._open_body(node)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._record_siblings(node.body)
        self._open_body(node)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._close_body(original_node)

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self._open_body(node)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite) -> None:
        self._close_body(original_node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._define(node)
        self._containers.append(node)
        if node.bases:
            self._note_trainer_class(node)

    def _note_trainer_class(self, node: cst.ClassDef) -> None:
        """A subclass of a Trainer or of a Trainer callback (by its bases)."""
        for base in node.bases:
            framework = self._trainer_of(base.value)
            if framework is not None:
                self._trainers[node.name.value] = framework
            if framework is not None or self._qualname(base.value) in TRAINER_CALLBACKS:
                self._trainer_classes.append(node)
                return

    def _trainer_of(self, name: cst.BaseExpression) -> str | None:
        """The framework of the Trainer that ``name`` names (transformers', a subclass of the file's)."""
        return trainer_framework(self._qualname(name)) or self._trainers.get(dotted(name))

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._containers.pop()
        self._binders.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self._containers and isinstance(self._containers[-1], cst.ClassDef):
            self._method_class[node] = self._containers[-1]
        self._define(node)
        self._containers.append(node)
        self._functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._containers.pop()
        self._binders.pop()
        self._functions.pop()
        backward, step = self._function_calls.pop(original_node, (False, False))
        if backward or step:
            self._step_functions[original_node.name.value] = (backward, step, original_node)
            self.facts.step_functions.add(original_node)
        elif original_node in self._method_class and \
                original_node.name.value == FRAMEWORK_STEPS.get(self.facts.framework or ""):
            self.facts.step_functions.add(original_node)  # the framework steps around it

    # Definitions and local names ----------------------------------------------------------------

    def _define(self, node: cst.FunctionDef | cst.ClassDef) -> None:
        """Note a function or class, which binds its name where it is; what it holds binds
        names of its own (its body's, see ``_open_body``)."""
        self._definitions.note(node, self._containers[-1] if self._containers else None)
        self._bind({node.name.value})
        self._binders.append(None)

    def _open_body(self, node: cst.CSTNode) -> None:
        function = self._containers[-1] if self._containers else None
        if type(node) is cst.Module or type(function) is cst.FunctionDef and function.body is node:
            self._binders.append((set(), set(), node))

    def _close_body(self, node: cst.CSTNode) -> None:
        binder = self._binders[-1]
        if binder is not None and binder[2] is node:
            found, declared, _ = self._binders.pop()
            self._local_names[node] = frozenset(found - declared)

    def _bind(self, names: set[str]) -> None:
        binder = self._binders[-1]  # the module's at the bottom
        if binder is not None:
            binder[0].update(names)

    def _nested_scope(self, node: cst.CSTNode) -> None:
        self._binders.append(None)

    def _nested_scope_left(self, original_node: cst.CSTNode) -> None:
        self._binders.pop()

    visit_Lambda = visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _nested_scope
    leave_Lambda = leave_ListComp = leave_SetComp = leave_DictComp = leave_GeneratorExp = _nested_scope_left

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(target_names(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(target_names(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(target_names(node.target))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(target_names(node.target))

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(target_names(node.name))

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        name = dotted(node.asname.name if node.asname is not None else node.name)
        if name:
            self._bind({name.split(".")[0]})

    def visit_Global(self, node: cst.Global | cst.Nonlocal) -> None:
        binder = self._binders[-1]
        if binder is not None:
            binder[1].update(name.name.value for name in node.names)

    visit_Nonlocal = visit_Global

    def visit_Return(self, node: cst.Return) -> None:
        function = self._functions[-1] if len(self._containers) == 1 and self._functions else None
        if function is None or node.value is None:
            return
        params = {param.name.value for param in (*function.params.posonly_params, *function.params.params)}
        read = returned_read(node, params)
        if read:
            name = function.name.value
            self._returned_reads[name] = self._returned_reads.get(name, frozenset()) | read

    def _enter_loop(self, node) -> None:
        self._loops.append(TrainingLoop(node=node, scope=self._scope))
        self._loop_statements[node] = tuple(self._statements)
        self._loop_spans[node] = (len(self._concerning), len(self._concerning))
        if type(node) is cst.For:
            self.facts.for_loops.append((node, self._scope))

    def _leave_loop(self) -> None:
        loop = self._loops.pop()
        self._loop_spans[loop.node] = (self._loop_spans[loop.node][0], len(self._concerning))
        if loop.calls_backward or loop.calls_step:
            self._concern_all_in(loop.node)
            self.facts.loops.append(loop)
            if loop.calls_step:
                for outer in self._loops:
                    outer.encloses_step_loop = True
            self._mark_hot(self._every)  # every rule may look at a training loop (the innermost statement)

    def visit_For(self, node: cst.For) -> None:
        self._bind(target_names(node.target))
        self._enter_loop(node)

    def leave_For(self, original_node: cst.For) -> None:
        self._leave_loop()

    def visit_While(self, node: cst.While) -> None:
        self._enter_loop(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._leave_loop()

    # Assignments -----------------------------------------------------------------------------

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if type(target.target) is cst.Name:
                self._assignments.setdefault(target.target.value, []).append(node.value)
        if parses_options(node):
            self._option_parses.append(node)
        if len(node.targets) != 1:
            return
        target = dotted(node.targets[0].target)
        if target is None:
            return
        value = node.value
        binding = Binding(target, self._statements[-1], self._scope, self._order)
        if self._is_cuda_device(value) and not target.lower().endswith("type"):
            # (``device_type = "cuda" if ... else "cpu"`` names a kind of device, a string that
            # autocast and comparisons read: it is not the device)
            self.facts.devices.append(binding)
            self.facts.device_values.add(value)
            return
        if isinstance(value, cst.IfExp) and all(isinstance(v, cst.Call) for v in (value.body, value.orelse)):
            made = {self._qualname(v.func) for v in (value.body, value.orelse)}
            if len(made) == 1 and None not in made:  # Accelerator(log_with=...) if tracking else Accelerator()
                self._assigned_calls.setdefault(target, made.pop())
        if not isinstance(value, cst.Call):
            return
        callee = self._qualname(value.func) or ""
        if callee:
            self._assigned_calls.setdefault(target, callee)
        if callee in SCALER_NAMES or "Scaler" in callee.rpartition(".")[2]:
            # (a script's or a library's loss scaler wraps a GradScaler: MAE's NativeScaler)
            self.facts.scalers.add(target)
        elif callee in LOADER_NAMES:
            self._loaders.add(target)
            self.facts.loader_bindings.append(binding)
        elif callee in spelled_callees("device_loader"):
            self.facts.device_loaders.add(target)
        elif callee in WRAPPER_NAMES:
            self._models.add(target)
        elif callee.startswith(OPTIMIZER_MODULES) and ".lr_scheduler." not in callee:
            self.facts.optimizers[target] = value
            self.facts.optimizer_bindings.append(binding)
            self._note_parameters(value)

    def _note_parameters(self, optimizer_call: cst.Call) -> None:
        first = call_arg(optimizer_call, 0, "params")
        if first is None:
            return
        value = first.value
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            if value.func.attr.value in ("parameters", "named_parameters"):
                owner = dotted(value.func.value)
                if owner:
                    self._models.add(owner)

    # Calls -----------------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        self._calls.append((node, self._scope))
        func = node.func
        callee = self._qualname(func)
        if callee:
            self._called.add(callee)
        if callee in _COLLECTIVES and node.args:
            self.facts.collectives.append((node.args[0].value, self._scope))
        if callee == "torch.manual_seed":
            seed = call_arg(node, 0, "seed")
            if seed is not None:
                self.facts.torch_seeds.add(cst.Module([]).code_for_node(seed.value))
        if self._steps_through(node):
            self._trains(backward=True, step=True)
        if not self.facts.places_on_device and self._places(node, callee):
            self.facts.places_on_device = True
        if callee in WRAPPER_NAMES:
            given = call_arg(node, 1, "device_ids")
            if given is not None and dotted(given.value):
                self.facts.device_id_lists.add(dotted(given.value))
            if given is not None or callee.endswith(".DataParallel"):
                self.facts.places_on_device = True  # CUDA devices given, or DataParallel's (CUDA only)
        if not isinstance(func, cst.Attribute):
            if isinstance(func, cst.Name):
                self._loop_callees += [(loop, func.value) for loop in self._loops]
                self._note_iteration(node, func.value)
                if self._name_calls is not None and callee is None and func.value not in _BUILTINS:
                    self._name_calls.append((func.value, tuple(self._statements)))
            return
        method = func.attr.value
        if isinstance(func.value, cst.Name) and func.value.value == "self":  # a trainer's self._run_batch()
            self._loop_callees += [(loop, method) for loop in self._loops]
        backward = method == "backward"
        step = method == "step" and self._is_optimizer_step(node)
        self._trains(backward, step)
        if method in ("train", "eval") and not node.args:
            owner = dotted(func.value)
            if owner:
                self._models.add(owner)

    def _note_iteration(self, node: cst.Call, name: str) -> None:
        """``iter(x)`` and ``next(it)``: where a loader may be read outside a ``for`` loop."""
        if len(node.args) != 1 or name not in ("iter", "next") or name in self._imports:
            return
        if name == "iter":
            self.facts.iter_calls.append((node, self._scope, self._statements[-1]))
            return
        read = dotted(node.args[0].value)
        if read is not None:
            self.facts.next_calls.append((read, self._scope, tuple(loop.node for loop in self._loops)))

    def _trains(self, backward: bool, step: bool) -> None:
        """The enclosing loops and function call backward or step the optimizer."""
        if backward or step:
            for loop in self._loops:
                loop.calls_backward |= backward
                loop.calls_step |= step
            previous = self._function_calls.get(self._scope, (False, False))
            self._function_calls[self._scope] = (previous[0] or backward, previous[1] or step)

    def _places(self, node: cst.Call, callee: str | None) -> bool:
        if callee is not None and (callee.startswith(("torch.accelerator.", "torch.cuda.")) or callee in _DEVICE_CALLS):
            return callee.rpartition(".")[2] not in _QUERIES
        func = node.func
        if isinstance(func, cst.Attribute) and callee is None and func.attr.value in ("cuda", "to"):
            if func.attr.value == "cuda" or not node.args:
                return func.attr.value == "cuda"
            if isinstance(node.args[0].value, cst.Subscript):  # .to(device_ids[0]), known at the end
                self._indexed_moves.add(dotted(node.args[0].value.value))
            where = dotted(node.args[0].value) or string_value(node.args[0].value) or ""
            return any(word in where.lower() for word in ("device", "cuda", "gpu", "rank")) or \
                self._is_cuda_device(node.args[0].value)
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value in ("device", "map_location"):
                return string_value(arg.value) != "cpu"
        return False

    def _steps_through(self, node: cst.Call) -> bool:
        """``loss_scaler(loss, optimizer, parameters=...)`` (MAE's and DeiT's NativeScaler): a
        call given the loss and the optimizer runs backward and the step inside."""
        names = [dotted(arg.value) or "" for arg in node.args]
        last = [name.split(".")[-1] for name in names]
        optimizer = any(n in self.facts.optimizers or l in ("optimizer", "optim", "opt") for n, l in zip(names, last))
        return optimizer and any("loss" in name for name in last)

    def _is_optimizer_step(self, node: cst.Call) -> bool:
        owner = dotted(node.func.value)
        if owner in self.facts.optimizers:
            return True
        if owner in self.facts.scalers:
            return True
        # Optimizers built elsewhere (a factory, another module) still read as optimizers.
        return owner is not None and owner.split(".")[-1] in ("optimizer", "optim", "opt")

    def leave_Module(self, original_node: cst.Module) -> None:
        self._close_body(original_node)
        if self._trainers or any(map(trainer_framework, self._called)):
            self._note_trainer()
        if any(self.facts.lists_device_ids(chain) for chain in self._indexed_moves):
            self.facts.places_on_device = True
        for name, statements in self._name_calls or ():
            if name in self._returned_reads:
                self._concern(statements, self._words[HOST_READ_CALLS])
        known = {loop.node for loop in self.facts.loops}
        # Functions that hold a step loop of their own (``train()`` looping over its loader).
        looping = {loop.scope for loop in self.facts.loops if loop.calls_step}
        for loop, callee in self._loop_callees:
            if callee in self._step_functions and loop.node not in known:
                backward, step, function = self._step_functions[callee]
                loop.calls_backward |= backward
                loop.calls_step |= step
                loop.encloses_step_loop |= function in looping  # an epoch loop around train()
                self.facts.loops.append(loop)
                self._concern(self._loop_statements[loop.node], self._every)
                self._concern_all_in(loop.node)
                known.add(loop.node)

    def _note_trainer(self) -> None:
        """A file that builds a Trainer trains through its framework; what the Trainer calls on
        each step (its subclass's and its callbacks' methods, the collator and the logits'
        preprocessing it is given) are the file's step functions, where the diagnostics look."""
        facts = self.facts
        builds = [(call, scope) for call, scope in self._calls if self._trainer_of(call.func)]
        if not builds:
            return
        facts.trainer_builds = [call for call, _ in builds]
        # Accelerate imported beside it (``PartialState`` for the main process) is the Trainer's own.
        if facts.framework in (None, "accelerate"):
            facts.framework = self._trainer_of(builds[0][0].func)
            facts.places_on_device = True
        methods = self._definitions.methods
        for owner in self._trainer_classes:
            facts.step_functions.update(m for name, m in methods.get(owner, {}).items() if name != "__init__")
        for call, scope in builds:
            for keyword in _TRAINER_STEP_ARGUMENTS:
                given = call_arg(call, 99, keyword)
                if given is not None:
                    facts.step_functions.update(self._called_each_step(given.value, scope))

    def _called_each_step(self, value: cst.BaseExpression, scope: cst.FunctionDef | None) -> list[cst.FunctionDef]:
        """The file's functions that ``value``, given to a Trainer, runs: a function, or the
        ``__call__`` of a collator class of the file (``MyCollator(tokenizer)``, or a name bound
        to one)."""
        definitions = self._definitions
        if type(value) is cst.Name:
            name = value.value
            found = definitions.nested.get((scope, name)) or definitions.defined.get(name)
            if type(found) is cst.FunctionDef:
                return [found]
            made = [v for v in self._assignments.get(name, ()) if type(v) is cst.Call]
            return [f for v in made for f in self._called_each_step(v, scope)]
        if type(value) is cst.Call and type(value.func) is cst.Name:
            made = definitions.classes.get(value.func.value)
            call = definitions.methods.get(made, {}).get("__call__") if made is not None else None
            return [call] if call is not None else []
        return []


def analyze(module: cst.Module, triggers: Triggers | None = None, walked: frozenset[str] | None = None,
            text: str | None = None) -> Facts:
    """Run the analysis pass over ``module``. With ``triggers``, ``facts.hot`` holds the rules
    each statement concerns: those of the words it mentions (names, attribute names, text in
    string literals) and of its node types, and those of the statements in it. With ``walked``
    (names of node types), ``facts.inert`` holds the ids of the nodes whose subtree has none of those types
    (whitespace and punctuation fields aside, which the analysis does not walk). ``text``, the
    file's, spares a search of the tree for a word it lacks."""
    analyzer = _Analyzer(module, text, triggers, walked)
    # The imports first, in order: a function above them (or a file that imports at its end)
    # calls what they import, and the second run finds the imports the first added at the top.
    # (Where they all open the file, the walk meets them first anyway.)
    if not _imports_lead(module, text):
        for statement in _import_statements(module):
            if isinstance(statement, cst.Import):
                analyzer.visit_Import(statement)
            else:
                analyzer.visit_ImportFrom(statement)
    walk(module, analyzer.enter, analyzer.leave)
    analyzer.facts.file = analyzer.file_facts()
    return analyzer.facts


_NOT_BLOCKS = NODE_TYPES - node_types(cst.BaseStatement, cst.BaseSuite, cst.Else, cst.ExceptHandler,
                                      cst.ExceptStarHandler, cst.Finally, cst.MatchCase)
_SMALL_STATEMENTS = node_types(cst.BaseSmallStatement)
_IMPORTS = frozenset({cst.Import, cst.ImportFrom})


def small_statements(module: cst.Module) -> list[cst.BaseSmallStatement]:
    """Every small statement (an assignment, an import, an expression...) of ``module``, in any
    block, in source order: the walk enters statements and blocks only, not expressions."""
    later_first = [node for node in descendants(module, _NOT_BLOCKS) if type(node) in _SMALL_STATEMENTS]
    return later_first[::-1]


_IMPORT_WORD = re.compile(r"\bimport\b")


def _imports_lead(module: cst.Module, text: str | None) -> bool:
    """Whether every import of the file is on the lines that open it (a docstring aside): as many
    as the text spells the word ``import`` (a comment or string that spells it counts against)."""
    if text is None:
        return False
    leading = 0
    for index, statement in enumerate(module.body):
        smalls = statement.body if type(statement) is cst.SimpleStatementLine else ()
        if smalls and all(type(small) in _IMPORTS for small in smalls):
            leading += len(smalls)
        elif not (index == 0 and len(smalls) == 1 and type(smalls[0]) is cst.Expr
                  and type(smalls[0].value) in (cst.SimpleString, cst.ConcatenatedString)):
            break
    # ``str.count`` is quick, and counts the word and more ("importlib"): the search for the
    # whole word runs only where it counts more.
    return leading == text.count("import") or leading == len(_IMPORT_WORD.findall(text))


def _import_statements(module: cst.Module):
    """Every ``import`` and ``from ... import`` of ``module``, in source order, in any block."""
    return [node for node in small_statements(module) if type(node) in _IMPORTS]
