import sys

import libcst as cst

from accrewrite.analysis import WRAPPER_NAMES, placed_model
from accrewrite.facts import DEVICE_TYPES
from accrewrite.nodes import call_arg, dotted, holds, string_value, walk
from accrewrite.rule import Example, Rule
from accrewrite.rules._legacy_types import LEGACY_RULE
from accrewrite.toolbox import (
    PLACEMENT_KEYWORDS, device_here, places_by_keyword, quoted_like, with_commas, without_items, wrapped_models_of,
)
from accrewrite.values import Kind, bound_names, read_chains, read_names
from accrewrite.values.kinds import CUDA_TENSOR_TYPE

# Keywords that pin a wrapper (DDP, DataParallel) to CUDA devices.
_CUDA_ONLY_KEYWORDS = ("device_ids", "output_device")
_AVAILABLE = frozenset({"torch.cuda.is_available", "torch.accelerator.is_available"})
_SET_DEVICE = frozenset({"torch.cuda.set_device", "torch.accelerator.set_device_index", "torch.accelerator.set_device_idx"})
# Context managers that make a device current for their block.
_DEVICE_CONTEXTS = frozenset({"torch.cuda.device", "torch.accelerator.device_index"})
# torch functions that make a tensor on the CPU unless given a device.
_FACTORIES = frozenset(f"torch.{name}" for name in (
    "randn", "rand", "randint", "zeros", "ones", "full", "empty", "arange", "tensor", "eye", "linspace",
))
# Words of the statements building an optimizer that ``_delayed_optimizers`` may build later.
_OPTIMIZER_WORDS = ("optim", "SGD", "Adam", "AdamW")
_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


class DevicePlacement(Rule):
    """Place the model and tensors on the target device instead of CUDA.

    TorchAcc's migration guide, step 2: obtain the target device (`xm.xla_device()`) and call
    `xm.set_replication(device, [device])` after it, where the target needs that. So:

    - a variable assigned a CUDA device (`torch.device("cuda")`, `torch.device(f"cuda:{r}")`,
      `"cuda" if torch.cuda.is_available() else "cpu"`, `"cuda:0" if n_gpu > 0 else "cpu"`,
      `"cuda:0"`) is assigned the target device, followed by the replication call; chosen in a
      branch, the replication goes where the run has the device: once after an `if` whose
      every arm chooses the target's device, in the branch where another arm chooses the CPU,
      and where a run may skip the only choice (`if args.resume: loc = ...`), naming the
      target's device itself before it;
    - `torch.cuda.set_device(...)` and `torch.accelerator.set_device_index(...)` are removed
      (the target picks the device per process), and so is `assert(torch.cuda.is_available())`
      (the script runs on the target's device), and `with torch.cuda.device(i):` around
      a block (SimCLR's), which initialises CUDA where it is entered;
    - a device string built from a device and an index (`torch.device(f"{acc}:{rank}")` with
      `acc = torch.accelerator.current_accelerator()`) is the target device;
    - `x.cuda(...)` and `x.to("cuda")` become `x.to(device)`, using the device variable that
      every path to the call has chosen (not one bound only in a resume branch, a `try` body
      or a loop), else the target's device call; `non_blocking` and `memory_format` are kept;
    - an integer where a device goes is a CUDA device's index (`model.to(gpu_id)` with
      `gpu_id = int(os.environ["LOCAL_RANK"])`, `torch.device(local_rank)`,
      `device=torch.cuda.current_device()`, but not given to a function of the file, which may
      read it as a rank, nor to one of torch.cuda's), and so is an element of the list a wrapper takes as its device_ids
      (`model.to(device_ids[0])` in PyTorch's DDP tutorial) or of a list named for GPU ids
      (the pix2pix family's `net.to(gpu_ids[0])`): it names the target device too,
      and a `device` parameter that callers pass one is not a device;
    - a `--device` option chose the device (`default='cpu'` too): `torch.device(args.device)`
      is the target's device now; where the parsed options go to a function of another module
      (timm's `utils.init_distributed_device(args)`) or are returned (open_clip's
      `params.parse_args`), and the device is made of them out of this file's sight, a CUDA
      default becomes the target's device name;
    - `device="cuda"` arguments name the target device, and so does `map_location="cuda"` (or
      a function that restores each storage on CUDA, `lambda storage, loc: storage.cuda()`:
      the target's device is no `.to` argument of a storage), except where the target cannot
      load onto its device (XLA: `map_location='cpu'`, and `load_state_dict` copies onto the
      model's device);
    - where the target's device is always there, a CUDA check in front of a device choice or a
      move holds (`if torch.cuda.is_available():`), and its negation fails (MoCo's `if not
      torch.cuda.is_available(): print("using CPU")`, the placement in the other arms);
    - `device_ids=` and `output_device=` are dropped from DistributedDataParallel and
      DataParallel, which pin them to CUDA;
    - `"cuda" in device` (nanoGPT's device type) tests `str(device)`, and `device == "cpu"` its
      `device.type`: the target's device is an object, not a string; `assert device == "cuda"`
      goes where the target's device is an accelerator. A comparison with a string that is no
      device type (`device == "auto"`) stays, as does one of a parameter annotated `str` that
      still holds the caller's string; where it may hold either, `str(device).partition(":")[0]`
      is compared.

    Where the target's move gives a module new Parameter objects (XLA), the first model move is
    preceded by PyTorch's setting that keeps them, so weights tied before the move stay tied
    and an optimizer built before the move steps the moved parameters. Where a forward pass
    before the move keeps its output (RepDistiller's `feat_s, _ = model_s(data)`, to size its
    heads), whose graph holds the weights, that setting fails at the move: the optimizer is
    built after the statement holding the move instead, where nothing between reads it or what
    it is built of, and elsewhere the file is left as it is.
    """

    code = "ACC002"
    name = "device-placement"
    summary = "CUDA device selection, .cuda(), set_device, device_ids= -> the target device"
    concepts = ("device",)
    triggers = frozenset(
        {"cuda", "to", "set_device", "device", "accelerator", "exec", *PLACEMENT_KEYWORDS, *_CUDA_ONLY_KEYWORDS,
         *(name.rpartition(".")[2] for name in _FACTORIES), *_OPTIMIZER_WORDS}
    )
    examples = (
        Example(
            before="""
            import os
            import torch

            local_rank = int(os.environ["LOCAL_RANK"])
            device = torch.device(f"cuda:{local_rank}")
            torch.cuda.set_device(device)
            model = Net().cuda()
            mask = torch.ones(8, device="cuda")
            """,
            after="""
            import os
            import torch
            import accrewrite.runtime.xla_model as xm

            local_rank = int(os.environ["LOCAL_RANK"])
            device = xm.xla_device()
            xm.set_replication(device, [device])
            model = Net().to(device)
            mask = torch.ones(8, device=device)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            device = "mps" if torch.backends.mps.is_available() else "cuda" if torch.cuda.is_available() else "cpu"
            assert device == "cuda", "GPU not available"
            model = Net().to(device)
            if device == "cpu":
                print("slow")
            """,
            after="""
            import torch
            import torch_xla

            device = torch_xla.device()
            model = Net().to(device)
            if device.type == "cpu":
                print("slow")
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            def main_worker(gpu, args):
                model = torch.nn.parallel.DistributedDataParallel(model.cuda(gpu), device_ids=[gpu])
                for images, target in loader:
                    images = images.cuda(gpu, non_blocking=True)
            """,
            after="""
            import torch
            import torch_xla

            def main_worker(gpu, args):
                torch.__future__.set_swap_module_params_on_conversion(True)
                model = torch.nn.parallel.DistributedDataParallel(model.to(torch_xla.device()))
                for images, target in loader:
                    images = images.to(torch_xla.device(), non_blocking=True)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            def main_worker(args):
                model = Net()
                if not torch.cuda.is_available():
                    print("using CPU, this will be slow")
                else:
                    model.cuda()
                if args.resume:
                    checkpoint = torch.load(args.resume, map_location=lambda storage, loc: storage.cuda())
                with torch.cuda.device(args.gpu_index):
                    train(model, loader)
            """,
            after="""
            import torch
            import torch_xla

            def main_worker(args):
                model = Net()
                torch.__future__.set_swap_module_params_on_conversion(True)
                if False:
                    print("using CPU, this will be slow")
                else:
                    model.to(torch_xla.device())
                if args.resume:
                    checkpoint = torch.load(args.resume, map_location='cpu')
                train(model, loader)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            def main():
                model_s = torch.nn.Linear(8, 16)
                feat_s = model_s(torch.randn(2, 8))
                head = torch.nn.Linear(feat_s.shape[1], 3)
                module_list = torch.nn.ModuleList([model_s, head])
                optimizer = torch.optim.SGD(module_list.parameters(), lr=0.1)
                if torch.cuda.is_available():
                    module_list.cuda()
            """,
            after="""
            import torch
            import torch_xla

            def main():
                model_s = torch.nn.Linear(8, 16)
                feat_s = model_s(torch.randn(2, 8))
                head = torch.nn.Linear(feat_s.shape[1], 3)
                module_list = torch.nn.ModuleList([model_s, head])
                if True:
                    module_list.to(torch_xla.device())
                optimizer = torch.optim.SGD(module_list.parameters(), lr=0.1)
            """,
        ),
        Example(
            before="""
            import torch

            n_gpu = torch.cuda.device_count()
            device = torch.device("cuda:0" if n_gpu > 0 else "cpu")
            mask = torch.ones(8, device=torch.cuda.current_device())
            """,
            after="""
            import torch
            import accrewrite.runtime.xla_model as xm

            n_gpu = torch.cuda.device_count()
            device = xm.xla_device()
            xm.set_replication(device, [device])
            mask = torch.ones(8, device=device)
            """,
        ),
        Example(
            before="""
            import torch

            def main(device: str):
                if device == "cuda":
                    torch.backends.cudnn.benchmark = True
                if device == "auto":
                    device = "cuda" if torch.cuda.is_available() else "cpu"
                model = Net().to(device)
                if device == "cuda":
                    model = torch.compile(model)
            """,
            after="""
            import torch
            import accrewrite.runtime.xla_model as xm

            def main(device: str):
                if device == "cuda":
                    torch.backends.cudnn.benchmark = True
                if device == "auto":
                    device = xm.xla_device()
                    xm.set_replication(device, [device])
                model = Net().to(device)
                if str(device).partition(":")[0] == "cuda":
                    model = torch.compile(model)
            """,
        ),
    )

    # Statements ------------------------------------------------------------------------------

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        """Where moving a module to the target's device gives it new Parameter objects (XLA: a CPU
        tensor cannot become a device tensor in place), weights tied before the move come apart
        and an optimizer built before it steps the old CPU tensors. The first model move is
        preceded by the target's setting that keeps the Parameter objects, placed before the
        statement of its function (or module) that holds it, so that every branch has it."""
        if self._parameters_kept or not self.ctx.target.has("keep_parameters_on_move"):
            return
        in_loop = any(isinstance(statement, (cst.For, cst.While)) for statement in self.ctx.open_statements)
        if not self._moves_model(node, self.ctx.scope, unknown=not in_loop):
            return
        self._parameters_kept = True
        if self._forward_before(node, self.ctx.scope) is not None:
            self._move_after_forward(node)
            return
        setting = self.ctx.statements("keep_parameters_on_move")
        if all(_has_line(self.ctx.source_text, self.ctx.code(line).strip()) for line in setting):
            return  # migrated already
        opened = self.ctx.open_statements
        functions = [i for i, statement in enumerate(opened) if isinstance(statement, cst.FunctionDef)]
        self.ctx.insert_before(opened[functions[-1] + 1] if functions else opened[0], setting)
        self.ctx.fix(node, "moving the model keeps its Parameter objects (tied weights stay tied, optimizers "
                           "built before the move step the moved parameters)")

    def _move_after_forward(self, move: cst.CSTNode) -> None:
        """A forward pass run before the move (to size a head: RepDistiller's ``feat_s, _ =
        model_s(data)``) keeps its graph, which holds the weights, so the setting that keeps the
        Parameter objects fails at the move. The optimizer is built after the move instead
        (``_delayed_optimizers``); one that cannot be leaves the file as it is."""
        facts = self.ctx.facts
        delayed = self._delayed_optimizers()
        order = facts.order.get(move, 0)
        moved = self._moved_model(move)
        for binding in facts.optimizer_bindings:
            if moved is not None and moved.partition(".")[0] not in read_names(binding.statement):
                continue  # another model's optimizer (a notebook's first model, trained before)
            if binding.scope is self.ctx.scope and binding.order < order and binding.statement not in delayed:
                self.ctx.refuse(
                    move, f"`{binding.name}` is built before this move, after a forward pass; file left as it is",
                    "The target's move gives the module new Parameter objects: the optimizer built before it would "
                    "step the old ones, and PyTorch's setting that keeps them fails while the forward pass's output "
                    "holds the weights. Build the optimizer after the move and migrate again.",
                )

    def _moved_model(self, move: cst.CSTNode) -> str | None:
        """The name of the model ``move`` moves (``model.to(d)``, ``model = model.cuda()``)."""
        named = placed_model(move, self.ctx.facts.file.models)
        if named is not None or not isinstance(move, cst.SimpleStatementLine) or len(move.body) != 1:
            return named
        value = move.body[0].value if isinstance(move.body[0], (cst.Expr, cst.Assign)) else None
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("to", "cuda"):
            if self.ctx.facts.values(self.ctx.scope).is_model(value.func.value):
                return dotted(value.func.value)
        return None

    def _delayed_optimizers(self) -> dict[cst.CSTNode, cst.CSTNode]:
        """The optimizers built before the first model move of their block, after a forward pass
        (``_move_after_forward``), that can be built after the statement holding the move: the
        statement building each, and that statement."""
        if self._delays is None:
            self._delays = {}
            if self.ctx.target.has("keep_parameters_on_move"):
                for binding in self.ctx.facts.optimizer_bindings:
                    anchor = self._move_after(binding)
                    if anchor is not None:
                        self._delays[binding.statement] = anchor
        return self._delays

    def _move_after(self, binding) -> cst.CSTNode | None:
        """The statement after ``binding``'s, in its block, that moves a model after a forward
        pass, where nothing between them reads the optimizer or what builds it
        (``trainable_list``), and the moving statement not the optimizer: building it there is
        a safe reordering."""
        facts = self.ctx.facts
        optimizer = binding.name.partition(".")[0]
        reads = {*read_names(binding.statement), optimizer} - facts.file.imports.keys()
        statement = facts.next_statement.get(binding.statement)
        while statement is not None:
            used = read_names(statement) | bound_names(statement)
            move = self._first_move(statement, binding.scope)
            if move is not None and optimizer not in used:
                return statement if self._forward_before(move, binding.scope) is not None else None
            if used & reads:
                return None
            statement = facts.next_statement.get(statement)
        return None

    def _first_move(self, statement: cst.CSTNode, scope) -> cst.CSTNode | None:
        found = []
        walk(statement, lambda node: found.append(node) if isinstance(node, cst.SimpleStatementLine)
             and self._moves_model(node, scope) else None)
        return found[0] if found else None

    def _forward_before(self, move: cst.CSTNode, scope) -> cst.CSTNode | None:
        """A statement of ``move``'s function, before it, that keeps the output of a model's
        forward pass (``features = model(torch.randn(2, 4))``)."""
        facts = self.ctx.facts
        values = facts.values(scope)
        order = facts.order.get(move, 0)
        found = []

        def enter(node):
            if isinstance(node, cst.SimpleStatementLine) and facts.order.get(node, order) < order:
                small = node.body[0]
                if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and values.is_model(small.value.func):
                    found.append(node)
            return node is scope or not isinstance(node, (cst.FunctionDef, cst.ClassDef))

        walk(scope if scope is not None else self.ctx.module, enter)
        return found[0] if found else None

    def _moves_model(self, line: cst.CSTNode, scope, unknown: bool = False) -> bool:
        """``model.to(device)``, ``model = Net().cuda()``, ``self.model = model.to(gpu_id)``,
        ``layers = layers + [Layer(4, 4).to(device)]``; and with ``unknown``, where what moves is
        not known, a move whose result is dropped (a tensor's move returns its copy, a module
        moves in place) or kept on ``self`` (SimCLR's ``self.model = kwargs['model'].to(d)``):
        the setting changes nothing for a tensor."""
        if placed_model(line, self.ctx.facts.file.models) is not None:
            return True
        values = self.ctx.facts.values(scope)
        moves = [call for call in _calls_in(line)
                 if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("to", "cuda")]
        if any(values.kind(call.func.value) is Kind.MODEL for call in moves):
            return True
        statement = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        if not unknown or statement is None:
            return False
        if isinstance(statement, cst.Expr):
            moved = statement.value
        elif isinstance(statement, cst.Assign) and all(_on_self(target.target) for target in statement.targets):
            moved = statement.value
        else:
            return False
        return moved in moves and values.kind(moved.func.value) is Kind.UNKNOWN

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if len(original_node.body) != 1:
            return updated_node
        statement = original_node.body[0]
        if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
            callee = self.ctx.facts.file.qualname(statement.value.func)
            if callee in _SET_DEVICE:
                self.ctx.fix(original_node, f"removed {callee}(): the target chooses the device per process")
                return cst.RemoveFromParent()
        if self._asserts_cuda(statement):
            self.ctx.fix(original_node, "removed the assertion of a CUDA device: the script runs on the target's device")
            return cst.RemoveFromParent()
        if original_node in self._fallbacks:
            return self._assign_device(original_node, updated_node)
        if isinstance(statement, cst.Assign) and original_node in self._delayed_optimizers():
            self.ctx.insert_after(self._delays[original_node], [updated_node])
            self.ctx.fix(original_node, "the optimizer is built after the model's move: a forward pass before the "
                                        "move holds the weights, which PyTorch's setting that keeps them needs free")
            return cst.RemoveFromParent()
        if isinstance(statement, cst.Assign) and any(d.statement is original_node for d in self.ctx.facts.devices):
            if self._configurator is not None and self.ctx.scope is None and self._before_configurator(original_node):
                return updated_node  # a config value: the device is assigned after the configurator
            return self._assign_device(original_node, updated_node)
        if original_node is self._configurator:
            return self._after_configurator(original_node, updated_node)
        return updated_node

    def leave_With(self, original_node, updated_node):
        """``with torch.cuda.device(args.gpu_index):`` (SimCLR's) makes a CUDA device current for
        its block: the target chooses the device per process, and entering the context
        initialises CUDA, which fails where there is none."""
        dropped = [self._device_context(item) for item in original_node.items]
        if not any(dropped):
            return updated_node
        self.ctx.fix(original_node, "removed the CUDA device context: the target chooses the device per process")
        return without_items(updated_node, dropped)

    def _device_context(self, item: cst.WithItem) -> bool:
        return item.asname is None and isinstance(item.item, cst.Call) \
            and self.ctx.facts.file.qualname(item.item.func) in _DEVICE_CONTEXTS

    def _before_configurator(self, line) -> bool:
        order = self.ctx.facts.order
        return order.get(line, 0) < order.get(self._configurator, 0)

    def _after_configurator(self, original_node, updated_node):
        """The target's device, assigned to the config names that chose CUDA, after the
        configurator has run."""
        names = [d.name for d in self.ctx.facts.devices if d.scope is None and self._before_configurator(d.statement)]
        if not names:
            return updated_node
        lines = []
        for name in dict.fromkeys(names):
            lines.append(cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], self.ctx.expr("device"))]))
            if self.ctx.target.has("set_replication"):
                lines += self.ctx.statements("set_replication", device=name)
        following = self.ctx.facts.next_statement.get(original_node)
        if following is not None and self.ctx.code(following).strip() == self.ctx.code(lines[0]).strip():
            return updated_node  # migrated already
        self.ctx.fix(original_node, f"{', '.join(dict.fromkeys(names))}: the target device, after the configurator "
                                   "(the config value keeps its string type for command-line overrides)")
        return cst.FlattenSentinel([updated_node, *lines])

    def _assign_device(self, original_node, updated_node):
        assign = updated_node.body[0]
        name = self.ctx.code(assign.targets[0].target)
        new_line = updated_node.with_changes(body=[assign.with_changes(value=self.ctx.expr("device"))])
        self.ctx.fix(original_node, f"{name} is the target device")
        if not self.ctx.target.has("set_replication"):
            return new_line
        branches = self._branches_around()
        if not branches:
            return cst.FlattenSentinel([new_line, *self.ctx.statements("set_replication", device=name)])
        return cst.FlattenSentinel([new_line, *self._replicate_around(branches, name)])

    def _branches_around(self) -> list[cst.CSTNode]:
        """The statements of the current function (or module level) around the current one that a
        run may skip or leave early: an ``if`` (its ``elif``s are its own; not the script's
        ``__main__`` block), a loop, a ``try``, a ``match``; outermost first."""
        opened = self.ctx.open_statements
        functions = [i for i, statement in enumerate(opened) if type(statement) is cst.FunctionDef]
        around = opened[functions[-1] + 1 if functions else 0:-1]
        return [
            statement for index, statement in enumerate(around)
            if type(statement) in _BRANCHING and not _main_block(statement)
            and not (index and getattr(around[index - 1], "orelse", None) is statement)
        ]

    def _replicate_around(self, branches: list[cst.CSTNode], name: str) -> list:
        """The replication of a device chosen in a branch goes where the run has that device:
        right after the choice where the other paths choose another device (``else: device =
        "cpu"``); once, after the innermost statement around it whose every path chooses the
        target's device (``if``/``else`` both); and where a path may leave the name unbound (``if
        args.resume: loc = ...``), naming the target's device itself, before the outermost
        branch, so that a run that skips the branch has it too. The statements to put right
        after the choice."""
        values = self.ctx.facts.values(self.ctx.scope)
        target = {d.statement for d in self.ctx.facts.devices if d.scope is self.ctx.scope} | self._fallbacks
        for statement in reversed(branches):
            chosen = values.bindings_after(name, statement)
            if chosen and not chosen <= target:
                return self.ctx.statements("set_replication", device=name)
            if chosen:
                self._replicate(statement, name, self.ctx.insert_after)
                return []
        self._replicate(branches[0], self.ctx.code(self.ctx.expr("device")), self.ctx.insert_before)
        return []

    def _replicate(self, anchor: cst.CSTNode, device: str, insert) -> None:
        if (anchor, device) not in self._replicated:
            self._replicated.add((anchor, device))
            insert(anchor, self.ctx.statements("set_replication", device=device))

    # Expressions -----------------------------------------------------------------------------

    def leave_Comparison(self, original_node, updated_node):
        """``"cuda" in device`` and ``device == "cpu"`` (nanoGPT's, build-nanogpt's device type)
        read a device string; the target's device is an object, so its string is tested."""
        if len(original_node.comparisons) != 1:
            return updated_node
        comparison = original_node.comparisons[0]
        if isinstance(comparison.operator, (cst.In, cst.NotIn)) and string_value(original_node.left) is not None:
            if self._device_name(comparison.comparator):
                as_string = _string_of(updated_node.comparisons[0].comparator)
                self.ctx.fix(original_node, "a device object on the target: its string is tested")
                return updated_node.with_changes(comparisons=[updated_node.comparisons[0].with_changes(comparator=as_string)])
        compared = string_value(comparison.comparator)
        if isinstance(comparison.operator, (cst.Equal, cst.NotEqual)) and compared is not None:
            if self._device_name(original_node.left) and compared.partition(":")[0] in DEVICE_TYPES:
                return self._compare_device(original_node, updated_node, compared)
        return updated_node

    def _compare_device(self, original_node: cst.Comparison, updated_node: cst.Comparison, compared: str):
        """``device == "cuda"``: the device's type is compared, or its string where the compared
        string names an index. Where the name may still hold the string a parameter annotated
        ``str`` was given, its string's type is (``str(device).partition(":")[0]``, right for
        both), and where it holds only that string, the comparison stays."""
        values = self.ctx.facts.values(self.ctx.scope)
        statement = values.statement_of(original_node)
        name = dotted(original_node.left)
        given = statement is not None and values.passed_string(name, statement)
        if given and values.bindings_at(name, statement) == {self.ctx.scope}:
            return updated_node
        if ":" in compared:
            self.ctx.fix(original_node, "a device object on the target: its string is compared")
            return updated_node.with_changes(left=_string_of(updated_node.left))
        if given:
            self.ctx.fix(original_node, "a device object on the target, or the string given: its string's type is compared")
            return updated_node.with_changes(left=cst.parse_expression(f'str({name}).partition(":")[0]'))
        # torch.device("cuda") == "cuda" holds, str() of the target's "cuda:0" would not
        self.ctx.fix(original_node, "a device object on the target: its type is compared")
        return updated_node.with_changes(left=cst.Attribute(updated_node.left, cst.Name("type")))

    def _asserts_cuda(self, statement: cst.CSTNode) -> bool:
        """``assert device == "cuda", "GPU not available"``: the script asks for an accelerator,
        which the target's device is (where its availability test holds)."""
        if self._asserts_available(statement):
            return True
        test = statement.test if isinstance(statement, cst.Assert) else None
        if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
            return False
        comparison = test.comparisons[0]
        compared = string_value(comparison.comparator) or ""
        return (isinstance(comparison.operator, cst.Equal) and compared.partition(":")[0] == "cuda"
                and self._device_name(test.left) and self.ctx.target.has("accelerator_available"))

    def _asserts_available(self, statement: cst.CSTNode) -> bool:
        """``assert(torch.cuda.is_available())`` (the pix2pix family's ``init_net``, before moving
        the network to ``gpu_ids[0]``): the script runs on the target's device instead."""
        return isinstance(statement, cst.Assert) and isinstance(statement.test, cst.Call) \
            and self.ctx.facts.file.qualname(statement.test.func) in _AVAILABLE

    def leave_If(self, original_node, updated_node):
        """``if not torch.cuda.is_available():`` (MoCo's ``print("using CPU")``) fails where the
        device check holds on the target."""
        if self._checked(original_node.test, updated_node.test) is False:
            self.ctx.fix(original_node, "the device check holds on the target: its negation is False")
            return updated_node.with_changes(test=cst.Name("False"))
        return updated_node

    def leave_BooleanOperation(self, original_node, updated_node):
        """``not args.no_cuda and torch.cuda.is_available()`` and ``args.cpu or not
        torch.cuda.is_available()`` keep only their other operand where the target's device is
        always there (``and True`` and ``or False`` say nothing)."""
        neutral = isinstance(updated_node.operator, cst.And)
        sides = ((original_node.right, updated_node.right, updated_node.left),
                 (original_node.left, updated_node.left, updated_node.right))
        for was, checked, other in sides:
            if self._checked(was, checked) is neutral:
                self.ctx.fix(original_node, "the device check holds on the target: the other condition decides")
                if updated_node.lpar and not other.lpar:
                    other = other.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
                return other
        return updated_node

    def _checked(self, was: cst.BaseExpression, checked: cst.BaseExpression) -> bool | None:
        """What a device check the target holds (``torch.cuda.is_available()``, rewritten
        ``checked``) comes to: True, False where it is negated, None for any other test."""
        negated = isinstance(was, cst.UnaryOperation) and isinstance(was.operator, cst.Not)
        if negated:
            was, checked = was.expression, getattr(checked, "expression", None)
        if was in self._gates and isinstance(checked, cst.Name) and checked.value == "True":
            return not negated
        return None

    def _refuse_cuda_tensor_type(self, node: cst.Attribute) -> None:
        """``Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor``: a legacy CUDA
        tensor type makes tensors on CUDA, and has no spelling for the device of a target whose
        availability test holds (``cuda`` is true there). ACC027, where it runs, spells them with
        the device, or leaves the file as it is itself."""
        if LEGACY_RULE in self.ctx.running:
            return
        name = self.ctx.facts.file.qualname(node) or ""
        if self.ctx.target.has("accelerator_available") and CUDA_TENSOR_TYPE.fullmatch(name):
            self.ctx.refuse(
                node, f"`{name}` makes CUDA tensors, unlike this target; file left as it is",
                "Legacy tensor types have no spelling for another device, and the script's CUDA check holds on "
                "this target. Make the tensors with a device instead (`torch.ones(n, 1, device=device)`, "
                "`torch.as_tensor(array, device=device)`, `x.to(device, torch.float32)`) and migrate again.",
            )

    def _device_name(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` names a variable this rule turns into the target's device."""
        return dotted(node) in {device.name for device in self.ctx.facts.devices}

    def leave_Attribute(self, original_node, updated_node):
        """``device.startswith("cuda")`` reads a device string: its string is read instead."""
        self._refuse_cuda_tensor_type(original_node)
        if original_node.attr.value in _STRING_METHODS and self._device_name(original_node.value):
            self.ctx.fix(original_node, "a device object on the target: its string is read")
            return updated_node.with_changes(value=_string_of(updated_node.value))
        return updated_node

    # Choosing the device ----------------------------------------------------------------------

    def _find_gates(self) -> set[cst.Call]:
        """The availability tests in front of a device choice or a move to CUDA: ``if
        torch.cuda.is_available(): device = "cuda"``, ``model.cuda() if torch.cuda.is_available()
        else model``, and a flag they set (``use_cuda = not args.no_cuda and
        torch.cuda.is_available()`` before ``device = torch.device("cuda" if use_cuda else
        "cpu")``). Where the target's device is not a CUDA device they would keep the CPU. And
        an assertion that CUDA is there, which goes with its test."""
        chosen = {device.statement for device in self.ctx.facts.devices}
        tests: list[cst.CSTNode] = []

        def enter(node):
            if isinstance(node, cst.If) and self._uses_cuda(node.body, chosen):
                tests.append(node.test)
                self._fallbacks.update(self._other_choices(node.body, node.orelse, chosen))
            elif isinstance(node, cst.If) and node.orelse is not None:
                # ``if not torch.cuda.is_available(): print("using CPU") else: model.cuda()``
                negated = _negated(node.test)
                if negated and self._uses_cuda(node.orelse, chosen):
                    tests.extend(negated)
                    self._fallbacks.update(self._other_choices(node.orelse, node.body, chosen))
            elif isinstance(node, cst.IfExp) and (self.ctx.facts.is_cuda_device(node) or self._places_on_cuda(node.body)):
                tests.append(node.test)
            elif self._asserts_available(node):
                tests.append(node.test)  # the assertion goes (``_asserts_cuda``), its test with it
            return True

        walk(self.ctx.module, enter)
        flags = set().union(*(read_chains(test) for test in tests)) if tests else set()
        gates = set().union(*(_calls_in(test) for test in tests)) if tests else set()

        def flag(node):
            if isinstance(node, cst.Assign) and any(dotted(t.target) in flags for t in node.targets):
                gates.update(_calls_in(node.value))
            return True

        walk(self.ctx.module, flag)
        return gates

    def _uses_cuda(self, block: cst.CSTNode, chosen: set) -> bool:
        """Whether an arm of an ``if`` chooses a CUDA device, returns one or places on CUDA."""
        body = block.body if isinstance(block, cst.Else) else block
        return holds(block, chosen) or self._returns_cuda(body) or self._places_on_cuda(block)

    def _other_choices(self, cuda_arm: cst.CSTNode, other_arm: cst.CSTNode | None,
                       chosen: set) -> list[cst.CSTNode]:
        """``else: device = torch.device("cpu")`` (or ``"mps"``) beside a CUDA choice: on a
        target whose device is not CUDA the migrated script runs there too."""
        names = {d.name for d in self.ctx.facts.devices if holds(cuda_arm, {d.statement})}
        found = []

        def enter(node):
            if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 and isinstance(node.body[0], cst.Assign):
                assign = node.body[0]
                device = self.ctx.concept("device").render_expr()
                if (len(assign.targets) == 1 and dotted(assign.targets[0].target) in names and node not in chosen
                        and self.ctx.code(assign.value).strip() != device):  # not migrated already
                    found.append(node)
            return True

        if other_arm is not None:
            walk(other_arm, enter)
        return found

    def _places_on_cuda(self, node: cst.CSTNode) -> bool:
        """``model.cuda()``, ``x.to("cuda")``: ``model.cuda() if torch.cuda.is_available() else
        model`` would keep the model on the CPU where the target's device is not CUDA."""
        facts = self.ctx.facts

        def places(call: cst.Call) -> bool:
            func = call.func
            if not isinstance(func, cst.Attribute) or facts.file.qualname(func) is not None:
                return False
            if func.attr.value == "cuda":
                return True
            first = call_arg(call, 0, "device") if func.attr.value == "to" else None
            return first is not None and facts.is_cuda_device(first.value)

        return any(places(call) for call in _calls_in(node))

    def _returns_cuda(self, block: cst.CSTNode) -> bool:
        """``if use_cuda: return torch.device("cuda")``."""
        lines = block.body if isinstance(block, cst.IndentedBlock) else []
        return any(
            isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.Return)
            and line.body[0].value is not None and self.ctx.facts.is_cuda_device(line.body[0].value)
            for line in lines
        )

    def _availability(self, original_node, updated_node):
        callee = self.ctx.facts.file.qualname(original_node.func)
        if callee == "torch.accelerator.is_available" or (callee in _AVAILABLE and original_node in self._gates):
            self.ctx.fix(original_node, f"{callee}() -> the target's device is there")
            # (its parentheses kept: ``assert(torch.cuda.is_available())`` needs them)
            return self.ctx.expr("accelerator_available").with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        return None

    def __init__(self, ctx):
        super().__init__(ctx)
        self._parameters_kept = False
        self._delays: dict[cst.CSTNode, cst.CSTNode] | None = None  # ``_delayed_optimizers``
        self._wrapped_models: set[str] | None = None  # ``_wrapped``
        # The (statement, device) pairs a replication call was placed beside (``_replicate_around``).
        self._replicated: set[tuple[cst.CSTNode, str]] = set()
        # Other choices of a device variable beside a CUDA one (``_other_choices``).
        self._fallbacks: set[cst.CSTNode] = set()
        self._gates = self._find_gates() if ctx.target.has("accelerator_available") else set()
        self._moves: set[cst.Call] | None = None  # ``_storage_moves``
        # nanoGPT's configurator: ``exec(...)`` at module level overrides config globals from the
        # command line, type-checked, so the device string stays and the target's device is
        # assigned after it.
        self._configurator = _configurator(ctx.module)

    def _ordinal(self, node: cst.CSTNode) -> bool:
        """An int passed where a device goes (``model.to(gpu_id)``, ``torch.device(local_rank)``)
        is a CUDA device's index; so is an element of a list of them (``Facts.lists_device_ids``:
        ``.to(device_ids[0])`` beside ``DDP(model, device_ids=device_ids)``, ``.to(gpu_ids[0])``)."""
        if isinstance(node, cst.Subscript) and self.ctx.facts.lists_device_ids(dotted(node.value)):
            return True
        return self.ctx.facts.values(self.ctx.scope).is_int(node)

    def leave_Call(self, original_node, updated_node):
        if self.ctx.target.has("accelerator_available"):
            available = self._availability(original_node, updated_node)
            if available is not None:
                return available
        func = updated_node.func
        facts = self.ctx.facts
        callee = facts.file.qualname(func)
        if callee == "torch.accelerator.current_accelerator" and original_node not in facts.device_values:
            return self._current_accelerator(original_node)
        if callee == "torch.device" and (facts.is_cuda_device(original_node) or self._ordinal_device(original_node)):
            if original_node in facts.device_values:
                return updated_node  # the assignment is rewritten whole, at statement level
            self.ctx.fix(original_node, "torch.device('cuda') -> the target device")
            return self.ctx.expr("device")
        if callee in WRAPPER_NAMES:
            return self._drop_cuda_keywords(original_node, updated_node)
        if callee is None and self.ctx.in_training:
            values = facts.values(self.ctx.scope)
            if values.is_model(original_node.func) and values.is_tensor(original_node) and self._wrapped(original_node):
                return self._inputs_on_device(original_node, updated_node)
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda" and callee is None:
            if original_node in self._storage_moves():
                return updated_node  # the load's map_location is rewritten whole
            return self._cuda_method(original_node, updated_node)
        if isinstance(func, cst.Attribute) and func.attr.value == "add_argument":
            return self._device_option(original_node, updated_node)
        if isinstance(func, cst.Attribute) and func.attr.value == "to":
            moved = self._to_cuda(original_node, updated_node)
            if moved is not updated_node:
                return moved
        return self._device_keywords(original_node, updated_node)

    def _current_accelerator(self, call: cst.Call):
        """``torch.accelerator.current_accelerator()`` is the target's device; assigned to a
        device *type* (``device_type = ...``, then ``f"{device_type}:{rank}"``), its type."""
        device = device_here(self.ctx)
        statement = self.ctx.statement
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        typed = isinstance(small, cst.Assign) and small.value is call and (
            (dotted(small.targets[0].target) or "").lower().endswith("type")
        )
        self.ctx.fix(call, "torch.accelerator.current_accelerator() -> the target's device" + (" type" if typed else ""))
        return cst.Attribute(value=device, attr=cst.Name("type")) if typed else device

    def _ordinal_device(self, call: cst.Call) -> bool:
        first = call_arg(call, 0, "type")
        return first is not None and len(call.args) == 1 and self._ordinal(first.value)

    def _wrapped(self, call: cst.Call) -> bool:
        """Whether ``call`` calls a model that DistributedDataParallel or DataParallel wraps, and
        so moves its inputs (not one called on the host before its move)."""
        if self._wrapped_models is None:
            self._wrapped_models = wrapped_models_of(self.ctx) or set()
        return dotted(call.func) in self._wrapped_models

    def _inputs_on_device(self, original_node, updated_node):
        """``ddp_model(torch.randn(20, 10))``: DistributedDataParallel moved a CPU input to its
        device; unwrapped (ACC005), the input is made on the device."""
        values = {}
        for index, arg in enumerate(original_node.args):
            value = arg.value
            if isinstance(value, cst.Call) and self.ctx.facts.file.qualname(value.func) in _FACTORIES \
                    and call_arg(value, 99, "device") is None:
                made = updated_node.args[index].value
                device = cst.Arg(keyword=cst.Name("device"), value=device_here(self.ctx), equal=_EQUAL)
                made_args = list(made.args)
                if made_args:
                    made_args[-1] = made_args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                values[index] = made.with_changes(args=[*made_args, device])
        return self._with_values(original_node, updated_node, values, "the model's input is made on the target device")

    def _cuda_method(self, original_node, updated_node):
        kept = [
            arg for arg in updated_node.args
            if arg.keyword is not None and arg.keyword.value in ("non_blocking", "memory_format")
        ]
        args = [cst.Arg(device_here(self.ctx)), *kept]
        self.ctx.fix(original_node, ".cuda() -> .to(the target device)")
        return updated_node.with_changes(
            func=updated_node.func.with_changes(attr=cst.Name("to")), args=with_commas(args)
        )

    def _to_cuda(self, original_node, updated_node):
        first = call_arg(original_node, 0, "device")
        if first is None or not (self.ctx.facts.is_cuda_device(first.value) or self._ordinal(first.value)):
            return updated_node
        values = {original_node.args.index(first): device_here(self.ctx)}
        return self._with_values(original_node, updated_node, values, ".to('cuda') -> .to(the target device)")

    def _device_keywords(self, original_node, updated_node):
        values = {}
        devices = {device.name for device in self.ctx.facts.devices}
        for index, arg in enumerate(original_node.args):
            if arg.keyword is None or arg.keyword.value not in PLACEMENT_KEYWORDS:
                continue
            cuda = self._names_cuda(original_node, arg)
            if arg.keyword.value == "map_location" and self.ctx.target.has("load_location"):
                if cuda or dotted(arg.value) in devices:
                    values[index] = self.ctx.expr("load_location")
            elif cuda:
                values[index] = device_here(self.ctx)
        return self._with_values(original_node, updated_node, values, "device='cuda' -> the target device")

    def _names_cuda(self, call: cst.Call, arg: cst.Arg) -> bool:
        """Whether a ``device=`` or ``map_location=`` argument names a CUDA device: a device
        string, an index (``torch.ones(n, device=torch.cuda.current_device())``, where the call
        ``places_by_keyword``), a function that restores each
        storage on CUDA (``map_location=lambda storage, loc: storage.cuda()``: a storage's
        ``.to`` would not take the target's device as ``.cuda()``'s replacement passes it)."""
        value = arg.value
        if self.ctx.facts.is_cuda_device(value):
            return True
        if arg.keyword.value == "map_location":
            return isinstance(value, cst.Lambda) and value.body in self._storage_moves()
        if isinstance(value, cst.Attribute) and value.attr.value == "device":
            return False  # ``device=x.device``: a tensor's device (asked without its function's data flow)
        return self._ordinal(value) and places_by_keyword(self.ctx.facts, call)

    def _storage_moves(self) -> set[cst.Call]:
        """The moves of ``map_location=lambda storage, loc: storage.cuda()`` functions, which
        ``_names_cuda`` replaces whole."""
        if self._moves is None:
            self._moves = set()
            if "map_location" in self.ctx.source_text:
                self._moves = {
                    arg.value.body for call, _ in self.ctx.facts.file.calls for arg in call.args
                    if arg.keyword is not None and arg.keyword.value == "map_location"
                    and _restores_on_cuda(arg.value)
                }
        return self._moves

    def _device_option(self, original_node, updated_node):
        """``parser.add_argument("--device", default="cuda")`` whose options go to a function of
        another module (timm's ``utils.init_distributed_device(args)``), or are returned
        (open_clip's ``params.parse_args``, whose caller hands them to ``init_distributed_device``),
        where this file cannot see the device made of it: the option defaults to the target's
        device there too. (A
        device this file makes of the option is the target's already.)"""
        default = call_arg(original_node, 99, "default")
        if default is None or not self.ctx.facts.is_cuda_device(default.value):
            return updated_node
        reader = self._options_reader() if self.ctx.target.has("device_option") else None
        if reader is None:
            return updated_node
        values = {original_node.args.index(default): quoted_like(default.value, self.ctx.expr("device_option"))}
        return self._with_values(original_node, updated_node, values, f"the option defaults to the target's device: {reader}")

    def _options_reader(self) -> str | None:
        """What reads the parsed options out of this file's sight: a function of another module
        (not torch's) that the file passes them to, or the caller they are returned to."""
        facts = self.ctx.facts
        for call, _ in facts.file.calls:
            callee = facts.file.qualname(call.func)
            if callee is not None and callee.partition(".")[0] not in _NOT_READERS \
                    and not callee.startswith(self.ctx.target.package + ".") and any(
                    self._names_options(arg.value) for arg in call.args):
                return f"{self.ctx.code(call.func)}() reads the options"
        returned = []
        walk(self.ctx.module, lambda node: returned.append(node) if isinstance(node, cst.Return)
             and self._names_options(node.value) else None)
        return "the parsed options are returned" if returned else None

    def _names_options(self, node: cst.BaseExpression | None) -> bool:
        return type(node) is cst.Name and self.ctx.facts.options.names_options(node.value)

    def _with_values(self, original_node, updated_node, values: dict[int, cst.BaseExpression], message: str):
        """``updated_node`` with the arguments at ``values``' positions given those values, and
        ``message`` reported; as it is where there are none."""
        if not values:
            return updated_node
        args = list(updated_node.args)
        for index, value in values.items():
            args[index] = args[index].with_changes(value=value)
        self.ctx.fix(original_node, message)
        return updated_node.with_changes(args=args)

    def _drop_cuda_keywords(self, original_node, updated_node):
        args = [
            arg for arg in updated_node.args
            if arg.keyword is None or arg.keyword.value not in _CUDA_ONLY_KEYWORDS
        ]
        if len(args) == len(updated_node.args):
            return updated_node
        self.ctx.fix(original_node, "dropped device_ids/output_device: they pin the wrapper to CUDA")
        return updated_node.with_changes(args=with_commas(args))


# Modules whose functions make no device of a script's options (nor do the target's).
_NOT_READERS = frozenset({"torch", *sys.stdlib_module_names})
_STRING_METHODS = frozenset({"startswith", "endswith", "split", "lower", "upper", "replace"})
# Statements whose blocks a run may skip, or leave before their end.
_BRANCHING = frozenset({cst.If, cst.For, cst.While, cst.Try, cst.TryStar, cst.Match})


def _string_of(node: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Name("str"), args=[cst.Arg(node)])


def _main_block(statement: cst.CSTNode) -> bool:
    """``if __name__ == "__main__":``, which every run of the script as a script goes through."""
    test = getattr(statement, "test", None)
    return (type(statement) is cst.If and type(test) is cst.Comparison and dotted(test.left) == "__name__"
            and len(test.comparisons) == 1 and string_value(test.comparisons[0].comparator) == "__main__")


def _on_self(target: cst.BaseExpression) -> bool:
    return isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"


def _negated(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What ``test`` negates: ``X`` of ``not X``, ``args.cpu or not X``."""
    found = []
    walk(test, lambda node: found.append(node.expression)
         if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not) else None)
    return found


def _restores_on_cuda(function: cst.BaseExpression) -> bool:
    """``lambda storage, loc: storage.cuda()``: a map_location function that restores each
    storage on CUDA."""
    if not isinstance(function, cst.Lambda) or not function.params.params:
        return False
    move = function.body
    return (isinstance(move, cst.Call) and isinstance(move.func, cst.Attribute) and move.func.attr.value == "cuda"
            and dotted(move.func.value) == function.params.params[0].name.value)


def _has_line(text: str, line: str) -> bool:
    """Whether ``text`` has ``line`` as a line of its own (not in a docstring's sentence)."""
    return line in text and any(own.strip() == line for own in text.splitlines())


def _calls_in(node: cst.CSTNode) -> set[cst.Call]:
    found = set()
    walk(node, lambda child: found.add(child) if isinstance(child, cst.Call) else None)
    return found


def _configurator(module: cst.Module) -> cst.CSTNode | None:
    """nanoGPT's ``exec(open('configurator.py').read())`` at module level, which overrides the
    globals above it from the command line."""
    for line in module.body:
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Expr):
            call = line.body[0].value
            if isinstance(call, cst.Call) and dotted(call.func) == "exec":
                return line
    return None

