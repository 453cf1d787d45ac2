import libcst as cst

from accrewrite.concepts import EXPRESSION, Definition
from accrewrite.nodes import call_arg, descendants, dotted, walk
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.values import TENSORS, Kind

# The tools that trace a model by running it, and the keywords of their model and its inputs.
_TRACERS = {"torch.jit.trace": ("func", "example_inputs"), "torch.onnx.export": ("model", "args")}
_ADD_GRAPH = ("model", "input_to_model")
# What a traced module may be used for on the host: written to a file.
_JIT_SAVE = "torch.jit.save"
_INPUT_NODES = (cst.Name, cst.Attribute, cst.Subscript, cst.Call)
_SCOPES = frozenset({cst.FunctionDef, cst.ClassDef})
# Inputs known to be tensors: on the device, or on the host already (where `.cpu()` is the tensor).
_INPUT_KINDS = frozenset({*TENSORS, Kind.CPU})
_HELP = (
    "Tracing a model on a lazy device records its parameters as constants, and those require grad "
    "(`RuntimeError: Cannot insert a Tensor that requires grad as a constant`). Trace a copy on the "
    "host: pass `copy.deepcopy(model).cpu()` and the inputs' `.cpu()`, and use what it returns on the host."
)


class TraceOnHost(Rule):
    """Trace a host copy of the model where the device cannot be traced.

    TensorBoard's `writer.add_graph(model, x)`, `torch.jit.trace(model, x)` and
    `torch.onnx.export(model, args, f)` run the model under the JIT tracer. On a lazy device
    (torch_xla, TorchAcc) that stops the script: the tracer meets parameters that require grad
    as constants of the graph (`RuntimeError: Cannot insert a Tensor that requires grad as a
    constant`). As a hand port does, they are given a copy of the model on the host and the
    inputs moved there: `writer.add_graph(copy.deepcopy(net).cpu(), input_tensor.cpu())`. The
    model itself, and the inputs, stay on the device; the graph, the traced module and the ONNX
    file are those of the same model, traced in eval mode as the original is (add_graph and
    onnx.export set it themselves; a `torch.jit.trace` is moved only below the model's
    `.eval()`: a copy traced in train mode would update its batch norm statistics in the
    model's place and draw its dropout masks from the host's generator).

    Reported instead, and left as it is: a model that is not a name (`make_model()`, whose copy
    would build another), an input that the analysis cannot show is a tensor or a tuple or list
    of tensors (a hidden state of unknown kind, a dict), and a traced module used other than to
    be saved (`traced = torch.jit.trace(...)` then called on device tensors, which a host module
    cannot take).
    """

    code = "ACC032"
    name = "trace-on-host"
    summary = "add_graph, jit.trace and onnx.export trace a host copy of the model on a lazy target"
    concepts = ("host_copy", "host_tensor")
    defines = (
        Definition("host_copy", EXPRESSION, "a copy of a module on the host, for a tool that traces it", ("model",)),
        Definition("host_tensor", EXPRESSION, "a tensor brought to the host, for a tool that traces a model",
                   ("tensor",)),
    )
    triggers = frozenset({"add_graph", "trace", "export"})
    examples = (
        Example(
            target="torch_xla",
            before="""
            import torch
            from torch.utils.tensorboard import SummaryWriter

            net = Net().cuda()
            writer = SummaryWriter(log_dir)
            input_tensor = torch.Tensor(1, 3, 32, 32).cuda()
            writer.add_graph(net, input_tensor)
            net.eval()
            torch.jit.trace(net, (input_tensor,)).save("net.pt")
            torch.onnx.export(net, input_tensor, "net.onnx")
            """,
            after="""
            import torch
            from torch.utils.tensorboard import SummaryWriter
            import torch_xla
            import copy

            torch.__future__.set_swap_module_params_on_conversion(True)
            net = Net().to(torch_xla.device())
            writer = SummaryWriter(log_dir)
            input_tensor = torch.Tensor(1, 3, 32, 32).to(torch_xla.device())
            writer.add_graph(copy.deepcopy(net).cpu(), input_tensor.cpu())
            net.eval()
            torch.jit.trace(copy.deepcopy(net).cpu(), (input_tensor.cpu(),)).save("net.pt")
            torch.onnx.export(copy.deepcopy(net).cpu(), input_tensor.cpu(), "net.onnx")
            """,
            with_rules=("ACC002",),
        ),
        Example(
            target="torch_xla",
            before="""
            import torch

            model = Net().to(device)
            traced = torch.jit.trace(model, torch.randn(8, 10, device=device))
            for x, y in loader:
                loss = criterion(traced(x.to(device)), y.to(device))
            torch.onnx.export(model, (dummy_input, model.init_hidden(1)), "model.onnx")
            """,
            diagnostics=("ACC032:4", "ACC032:7"),
        ),
    )

    def leave_Call(self, original_node, updated_node):
        names = self._traces(original_node)
        if names is None:
            return updated_node
        model, inputs = (call_arg(original_node, position, keyword) for position, keyword in enumerate(names))
        if model is None or inputs is None:
            return updated_node
        tool = excerpt(self.ctx.code(original_node.func), 30)
        host_inputs = self._on_host(inputs.value)
        if dotted(model.value) is None or host_inputs is None or not self._result_stays_on_host(original_node) \
                or not self._traces_in_eval_mode(original_node, model.value):
            self.ctx.diagnose(original_node, f"`{tool}` traces the model on the device, where tracing fails", _HELP)
            return updated_node
        self.ctx.fix(original_node, f"`{tool}` traces a host copy of the model")
        copied = self.ctx.expr("host_copy", model=self.ctx.code(model.value))
        args = [arg.with_changes(value=copied) if arg is model else
                arg.with_changes(value=host_inputs) if arg is inputs else arg for arg in original_node.args]
        return updated_node.with_changes(args=args)

    def _traces(self, call: cst.Call) -> tuple[str, str] | None:
        """The keywords of the model and the inputs of ``call`` where it traces a model."""
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "add_graph":
            return _ADD_GRAPH if any(name.endswith("SummaryWriter") for name in self.ctx.facts.file.called) else None
        return _TRACERS.get(self.ctx.facts.file.qualname(func))

    def _on_host(self, inputs: cst.BaseExpression) -> cst.BaseExpression | None:
        """``inputs`` brought to the host: each tensor, or each element of a tuple or list of
        them; None where one cannot be shown to be a tensor."""
        if isinstance(inputs, (cst.Tuple, cst.List)):
            elements = [self._on_host(element.value) for element in inputs.elements]
            starred = any(isinstance(element, cst.StarredElement) for element in inputs.elements)
            if starred or any(element is None for element in elements):
                return None
            return inputs.with_changes(elements=[e.with_changes(value=v) for e, v in zip(inputs.elements, elements)])
        values = self.ctx.facts.values(self.ctx.scope)
        if not isinstance(inputs, _INPUT_NODES) or values.kind(inputs) not in _INPUT_KINDS:
            return None
        return self.ctx.expr("host_tensor", tensor=self.ctx.code(inputs))

    def _traces_in_eval_mode(self, call: cst.Call, model: cst.BaseExpression) -> bool:
        """Whether the model is traced in eval mode, as the original is: add_graph and
        onnx.export set it themselves (unless told to export training); for jit.trace, the
        last mode this scope set on the model above the call is eval. A copy traced in train
        mode would update its batch norm statistics in the original's place, and draw its
        dropout masks from the host's generator."""
        if self.ctx.facts.file.qualname(call.func) != "torch.jit.trace":
            return call_arg(call, 99, "training") is None
        order = self.ctx.facts.order
        here = order.get(self.ctx.statement, 0)
        body = self.ctx.scope.body if self.ctx.scope is not None else self.ctx.module
        modes = [(order[node], mode) for node in descendants(body, prune=_SCOPES)
                 if isinstance(node, cst.SimpleStatementLine) and order.get(node, here) < here
                 and (mode := _mode_set(node, dotted(model))) is not None]
        return max(modes, default=(0, None))[1] == "eval"

    def _result_stays_on_host(self, call: cst.Call) -> bool:
        """Whether what ``call`` returns is dropped or only saved: a traced module made on the
        host cannot take the device's tensors."""
        line = self.ctx.statement
        statement = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        if not isinstance(statement, (cst.Expr, cst.Assign)):
            return False
        if statement.value is not call and not _saves(self, statement.value, call):
            return False
        if isinstance(statement, cst.Expr):
            return True
        target = statement.targets[0].target if len(statement.targets) == 1 else None
        return isinstance(target, cst.Name) and self._only_saved(target.value)

    def _only_saved(self, name: str) -> bool:
        """Whether every read of ``name`` in this scope saves it (``name.save(path)``,
        ``torch.jit.save(name, path)``)."""
        body = self.ctx.scope.body if self.ctx.scope is not None else self.ctx.module
        reads = []

        def enter(node):
            if isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node is not self.ctx.scope:
                return False
            if isinstance(node, cst.Call) and _saves(self, node, cst.Name(name), by_name=True):
                return False
            if isinstance(node, cst.Name) and node.value == name:
                reads.append(node)
            return True

        walk(body, enter)
        return len(reads) == 1  # the assignment's own target


def _mode_set(line: cst.SimpleStatementLine, model: str) -> str | None:
    """"eval" or "train" where ``line`` is ``model.eval()`` or ``model.train(...)``."""
    small = line.body[0] if len(line.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute) or dotted(call.func.value) != model:
        return None
    if call.func.attr.value == "eval":
        return "eval"
    if call.func.attr.value == "train":
        return "eval" if call.args and dotted(call.args[0].value) == "False" else "train"
    return None


def _saves(rule: Rule, node: cst.CSTNode, saved: cst.CSTNode, by_name: bool = False) -> bool:
    """``saved.save(...)`` or ``torch.jit.save(saved, ...)`` (``saved`` compared by its name where
    ``by_name``)."""
    if not isinstance(node, cst.Call):
        return False

    def same(value):
        return dotted(value) == dotted(saved) if by_name else value is saved

    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value == "save" and same(func.value):
        return True
    first = call_arg(node, 0, "m")
    return rule.ctx.facts.file.qualname(func) == _JIT_SAVE and first is not None and same(first.value)
