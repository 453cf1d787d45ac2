from typing import NamedTuple

import libcst as cst

from accrewrite.concepts import EXPRESSION, Definition
from accrewrite.nodes import call_arg, descendants, dotted
from accrewrite.rule import Example, Rule
from accrewrite.rules._losses import is_loss_call
from accrewrite.toolbox import single_assign, wrapped_models_of
from accrewrite.values import read_chains

_CLIP = frozenset({"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_norm_"})
_TRAIN_WITH = ("A pipeline stage holds part of the model, and `{model}(...)` runs the whole pipeline forward "
               "only and returns the mean of the micro-batches' losses: what a forward that returns the loss "
               "gave, never the model's output. For a loss computed from the output, train with "
               "`loss = {model}.forward_backward(x, output_fn=criterion, target=y)` in place of the forward, the "
               "loss and `loss.backward()`: the last stage computes each micro-batch's `criterion(output, "
               "target)`, where criterion is torch's loss (module or function, mean or sum), or a function whose "
               "mean over equal micro-batches is the batch's.")


class _Step(NamedTuple):
    """A step that becomes ``loss = model.forward_backward(...)``: the forward's line, and the
    line before it that binds the output, where the loss is computed outside the model; the
    loss's index among the forward's values, where it returns several."""

    loss: str
    forward: cst.SimpleStatementLine
    output_line: cst.SimpleStatementLine | None = None
    index: int | None = None
    outside: bool = False


class _LossOutside(NamedTuple):
    """A step's loss computed from the model's output: ``criterion(model(x), y)``, or
    ``criterion(output, y)`` after ``output = model(x)`` (``output_line``)."""

    model: cst.Call
    criterion: cst.Call
    output_line: cst.SimpleStatementLine | None


class PipelineStep(Rule):
    """`migrate --parallel pp` (and `fsdp,pp`, `tp,pp`, `fsdp,tp,pp`): the training step of a
    model cut into pipeline stages becomes `loss = model.forward_backward(*inputs)`.

    Under pipeline parallel `accelerate` returns this rank's stage, and one call runs the
    forward and backward of every stage over the micro-batches (TorchAcc 2.x's spelling):

    - `loss = model(x, y)` (a model whose forward returns the loss) and, later in the same
      block, `loss.backward()` become `loss = model.forward_backward(x, y)` where the
      backward was: the gradients are those of the mean of the micro-batches' losses, which is
      returned on every rank. Calls between the two (`optimizer.zero_grad()`) stay before it.
    - `logits, loss = model(x, y)` (a forward that returns the loss among other values, as
      nanoGPT's does), the other values read nowhere in the function, becomes
      `loss = model.forward_backward(x, y, output_fn=lambda output: output[1])`: the loss is
      taken from the last stage's output.
    - `loss = criterion(model(x), y)`, or `output = model(x)` on the line before and
      `loss = criterion(output, y)` with `output` read nowhere else in the function, where
      `criterion` is torch's loss without a `reduction` (a loss function, or a name bound only
      to a loss module), becomes `loss = model.forward_backward(x, output_fn=criterion,
      target=y)`: the targets are split into micro-batches with the inputs, and the last stage
      computes each micro-batch's `criterion(output, target)`.

    The mean of the micro-batches' losses is the batch's where the loss is a mean over equal
    samples; a mean over a count that varies (tokens not ignored by `ignore_index`) weighs the
    micro-batches alike, as TorchAcc's pipeline does, where the model's forward computes it.
    Given as `output_fn`, cross entropy's and NLL's mean weighs each micro-batch by the targets
    it keeps, and a loss module's `reduction="sum"` is summed: the batch's loss either way.

    Reported and left as they are (ACC035), each with what to write:

    - any other loss computed from the model's output outside the model (a criterion of the
      script's own, given a `reduction`, an output read elsewhere, or a file whose classes'
      forward takes `target`, which the pipeline would not know to give the model or the
      loss): `forward_backward(x, output_fn=..., target=y)` where its mean over equal
      micro-batches is the batch's;
    - a loss changed between the forward and its backward (`loss = loss / accum`), or read
      there: `forward_backward` takes the gradients of the loss the model returns;
    - other values of the forward kept (read elsewhere, stored, or unpacked with a star):
      `forward_backward` gives the loss only;
    - any other call of the model (evaluation): it runs the pipeline forward only and returns
      the mean loss, not the model's output;
    - `clip_grad_norm_` over the model's parameters: they are one stage's, and so is the norm;
      the whole model's norm sums the stages' squared norms over `model.accelerate_mesh["pp"]`.
    """

    code = "ACC035"
    name = "pipeline-step"
    summary = "--parallel with pp: loss = model(...); loss.backward() -> loss = model.forward_backward(...)"
    opt_in = True
    parallel = True
    concepts = ("pipeline_step", "pipeline_step_of_output", "pipeline_step_of_loss")
    defines = (Definition("pipeline_step_of_loss", EXPRESSION,
                          "pipeline_step where the loss is {loss_fn}(output, {target}), computed on the last stage "
                          "from each micro-batch's output and targets", ("model", "inputs", "loss_fn", "target")),)
    triggers = None  # a model's calls are named by the script's own names
    examples = (
        Example(
            parallel="pp",
            with_rules=("ACC030",),
            before="""
            import torch

            model = torch.nn.parallel.DistributedDataParallel(GPT(config))
            for tokens, targets in loader:
                loss = model(tokens, targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            after="""
            import torch
            import accrewrite.runtime as accrt

            model = accrt.accelerate(GPT(config), config=accrt.parallel_config("pp"))
            for tokens, targets in loader:
                optimizer.zero_grad()
                loss = model.forward_backward(tokens, targets)
                optimizer.step()
            """,
        ),
        Example(
            parallel="pp",
            with_rules=("ACC030",),
            before="""
            import torch

            model = torch.nn.parallel.DistributedDataParallel(Net())
            criterion = torch.nn.CrossEntropyLoss(ignore_index=-1)
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            after="""
            import torch
            import accrewrite.runtime as accrt

            model = accrt.accelerate(Net(), config=accrt.parallel_config("pp"))
            criterion = torch.nn.CrossEntropyLoss(ignore_index=-1)
            for x, y in loader:
                optimizer.zero_grad()
                loss = model.forward_backward(x, output_fn=criterion, target=y)
                optimizer.step()
            """,
        ),
        Example(
            parallel="pp",
            with_rules=("ACC030",),
            before="""
            import torch
            import torch.nn.functional as F

            model = torch.nn.parallel.DistributedDataParallel(Net())
            for x, y in loader:
                output = model(x)
                loss = F.mse_loss(output, y)
                loss.backward()
                optimizer.step()
            """,
            after="""
            import torch
            import torch.nn.functional as F
            import accrewrite.runtime as accrt

            model = accrt.accelerate(Net(), config=accrt.parallel_config("pp"))
            for x, y in loader:
                loss = model.forward_backward(x, output_fn=F.mse_loss, target=y)
                optimizer.step()
            """,
        ),
        Example(
            before="""
            import torch

            model = torch.nn.parallel.DistributedDataParallel(Net())
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            print(model(x_val))
            """,
            after="""
            import torch
            import accrewrite.runtime as accrt

            model = accrt.accelerate(Net(), config=accrt.parallel_config("fsdp,pp"))
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            print(model(x_val))
            """,
            parallel="fsdp,pp",
            with_rules=("ACC030",),
            diagnostics=("ACC035:5", "ACC035:7", "ACC035:9"),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._wrapped: set[str] = set()
        self._steps: dict[cst.CSTNode, _Step] = {}  # by the backward's statement
        self._forwards: set[cst.CSTNode] = set()  # forward statements that move to their backward
        self._left: dict[cst.CSTNode, cst.SimpleStatementLine] = {}  # those as the other rules left them
        self._moved: set[cst.Call] = set()  # the model calls in them
        self._reported: set[cst.CSTNode] = set()  # model calls already reported

    def applies(self) -> bool:
        # Without stages (or without --parallel, DDP kept) the model has no forward_backward.
        if "pp" not in (self.ctx.parallel or "").split(","):
            return False
        self._wrapped = wrapped_models_of(self.ctx) or set()
        return bool(self._wrapped)

    # Forward and backward, paired in one block --------------------------------------------

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._pair_steps(node.body)

    def visit_Module(self, node: cst.Module) -> None:
        self._pair_steps(node.body)

    def _pair_steps(self, body) -> None:
        statements = list(body)
        for i, statement in enumerate(statements):
            loss = _backward_of(statement)
            if loss is None:
                continue
            j = _forward_of(statements[:i], loss)
            if j is None:
                continue
            forward = statements[j]
            value = forward.body[0].value if single_assign(forward) else None
            outside = None
            if not (isinstance(value, cst.Call) and dotted(value.func) in self._wrapped):
                outside = self._loss_outside(statements[j - 1] if j else None, forward)
                if outside is None:
                    self._report_loss_outside(statements[:j], forward, loss)
                    continue
            if not all(_calls_only(between) and loss not in read_chains(between) for between in statements[j + 1:i]):
                self._reported.add(value if outside is None else outside.model)
                self.ctx.diagnose(
                    forward, f"`{loss}` is changed or read between the model's forward and its backward",
                    "Under pipeline parallel, model.forward_backward(*inputs) runs the forward and the backward "
                    "together and takes the gradients of the mean loss that the model returns: compute the loss "
                    "whole in the model's forward (scaling for gradient accumulation included), then "
                    f"`{loss} = model.forward_backward(...)` in place of the forward and `{loss}.backward()`.",
                )
            elif outside is None:
                self._pair(statement, forward, loss)
            else:
                self._pair_loss_outside(statement, forward, loss, outside)

    def _pair(self, backward: cst.CSTNode, forward: cst.SimpleStatementLine, loss: str) -> None:
        """Note the step, with where the loss is in the values the forward returns (None: it is
        the value), or report the values that forward_backward would not give."""
        target = forward.body[0].targets[0].target
        call = forward.body[0].value
        if isinstance(target, cst.Name):
            self._move(backward, _Step(loss, forward), call)
            return
        elements = target.elements
        index = next(k for k, element in enumerate(elements)
                     if isinstance(element.value, cst.Name) and element.value.value == loss)
        # a starred value stands for a count of values: the loss's index is not known
        read = [self.ctx.code(element.value) for k, element in enumerate(elements) if k != index and (
            isinstance(element, cst.StarredElement) or not isinstance(element.value, cst.Name)
            or _read_elsewhere(self.ctx.scope or self.ctx.module, element.value.value, target))]
        if read:
            self._reported.add(forward.body[0].value)
            self.ctx.diagnose(
                forward, f"{', '.join(read)} of the forward's values kept: forward_backward gives the loss only",
                f"Under pipeline parallel the last stage's output reaches the loss only: "
                f"`{loss} = model.forward_backward(..., output_fn=lambda output: output[{index}])` returns the mean "
                f"loss. Compute what {', '.join(read)} served for inside the model, or with model.forward(...) "
                f"in evaluation (it returns the mean loss as well).",
            )
            return
        self._move(backward, _Step(loss, forward, index=index), call)

    def _loss_outside(self, previous, forward: cst.CSTNode) -> _LossOutside | None:
        """``forward``'s loss where the last stage can compute it: torch's loss (``is_loss_call``)
        of two arguments, the model's output and the targets, the output computed in ``forward``
        or bound by ``previous`` and read nowhere else."""
        assign = single_assign(forward)
        criterion = assign.value if assign and isinstance(assign.targets[0].target, cst.Name) else None
        if not (isinstance(criterion, cst.Call) and len(criterion.args) == 2
                and all(arg.keyword is None and not arg.star for arg in criterion.args)
                and is_loss_call(self.ctx.facts, criterion)):
            return None
        output, output_line = criterion.args[0].value, None
        if isinstance(output, cst.Name):
            bound = single_assign(previous)
            target = bound.targets[0].target if bound else None
            if not (isinstance(target, cst.Name) and target.value == output.value) or _read_elsewhere(
                    self.ctx.scope or self.ctx.module, output.value, target, output):
                return None
            output, output_line = bound.value, previous
        # forward_backward's own keywords, given to the model, would reach the loss instead
        if not (isinstance(output, cst.Call) and dotted(output.func) in self._wrapped and not any(
                arg.keyword is not None and arg.keyword.value in ("output_fn", "target") for arg in output.args)):
            return None
        return None if self._forward_takes_target() else _LossOutside(output, criterion, output_line)

    def _forward_takes_target(self) -> bool:
        """Whether a forward of the file's classes takes ``target``, which the pipeline refuses
        to give both the model and the loss."""
        definitions = self.ctx.facts.file.definitions
        return any("target" in definitions.functions[methods["forward"]].params
                   for methods in definitions.methods.values() if "forward" in methods)

    def _pair_loss_outside(self, backward: cst.CSTNode, forward: cst.SimpleStatementLine, loss: str,
                           outside: _LossOutside) -> None:
        self._move(backward, _Step(loss, forward, outside.output_line, outside=True), outside.model)
        if outside.output_line is not None:
            self._forwards.add(outside.output_line)

    def _move(self, backward: cst.CSTNode, step: _Step, model: cst.Call) -> None:
        """Note that ``step``'s forward, which calls ``model``, moves to ``backward``."""
        self._steps[backward] = step
        self._forwards.add(step.forward)
        self._moved.add(model)

    def _report_loss_outside(self, before: list, forward: cst.CSTNode, loss: str) -> None:
        """Report ``forward`` where it computes ``loss`` from a call of the model in it, or in
        the statement before it that binds an output it reads (``output = model(x)``)."""
        calls = self._model_calls(forward)
        if not calls and single_assign(forward):
            read = read_chains(forward.body[0].value)
            output = next((statement for statement in reversed(before) if _bound_by(statement) & read), None)
            calls = self._model_calls(output) if single_assign(output) else []
        if not calls:
            return
        self._reported.update(calls)
        model = dotted(calls[0].func)
        self.ctx.diagnose(forward, f"`{loss}` is computed from {model}'s output outside the model",
                          _TRAIN_WITH.format(model=model))

    def _model_calls(self, statement: cst.CSTNode) -> list[cst.Call]:
        return [node for node in descendants(statement)
                if isinstance(node, cst.Call) and dotted(node.func) in self._wrapped]

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if original_node in self._forwards:
            self.ctx.fix(original_node, "the model's forward moves into model.forward_backward(...), at the backward")
            self._left[original_node] = updated_node
            return cst.RemovalSentinel.REMOVE
        if original_node not in self._steps:
            return updated_node
        step = self._steps[original_node]
        self.ctx.fix(original_node, "loss.backward() -> loss = model.forward_backward(...): over the pipeline stages")
        return updated_node.with_changes(body=[cst.Assign([cst.AssignTarget(cst.Name(step.loss))],
                                                          self._forward_backward(step))])

    def _forward_backward(self, step: _Step) -> cst.BaseExpression:
        """The step's call, written from its lines as the other rules left them (an input's
        move to the device dropped where the loader moves it)."""
        value = self._left[step.forward].body[0].value
        if not step.outside:
            values = {"model": self.ctx.code(value.func), "inputs": _inputs(self.ctx, value)}
            if step.index is None:
                return self.ctx.expr("pipeline_step", **values)
            return self.ctx.expr("pipeline_step_of_output", index=str(step.index), **values)
        model = self._left[step.output_line].body[0].value if step.output_line else value.args[0].value
        return self.ctx.expr("pipeline_step_of_loss", model=self.ctx.code(model.func), inputs=_inputs(self.ctx, model),
                             loss_fn=self.ctx.code(value.func), target=self.ctx.code(value.args[1].value))

    # The model's other calls, and the norm of its gradients --------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted(node.func)
        if name in self._wrapped and node not in self._reported and node not in self._moved:
            self.ctx.diagnose(node, f"under pipeline parallel, {name}(...) runs the forward only and returns the "
                                    f"mean loss, not the output", _TRAIN_WITH.format(model=name))
        elif self.ctx.facts.file.qualname(node.func) in _CLIP:
            parameters = call_arg(node, 0, "parameters")
            model = next(iter(read_chains(parameters.value) & self._wrapped), None) if parameters else None
            if model is not None:
                self.ctx.diagnose(
                    node, "clip_grad_norm_ sees one pipeline stage's gradients",
                    f"Each rank holds one stage's parameters, so the norm is that stage's and the ranks clip "
                    f"differently. For the whole model's norm, sum the stages' squared norms over "
                    f"{model}.accelerate_mesh['pp'] (dist.all_reduce), take the root and clip with "
                    f"torch.nn.utils.clip_grads_with_norm_.",
                )


def _backward_of(statement) -> str | None:
    """``X`` when ``statement`` is ``X.backward()``, X a name."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)):
        return None
    call = statement.body[0].value
    if (isinstance(call, cst.Call) and not call.args and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "backward" and isinstance(call.func.value, cst.Name)):
        return call.func.value.value
    return None


def _forward_of(statements: list, loss: str) -> int | None:
    """The index of the statement that computes ``loss`` from the forward: the last that binds
    it, or, past bindings that compute it from itself (``loss = loss / accum``, ``loss += aux``),
    the one before."""
    for j in range(len(statements) - 1, -1, -1):
        if loss in _bound_by(statements[j]) and not _from_itself(statements[j], loss):
            return j
    return None


def _inputs(ctx, call: cst.Call) -> str:
    """The arguments of the model's ``call``, as written."""
    return ", ".join(ctx.code(arg).rstrip(", ") for arg in call.args)


def _read_elsewhere(scope: cst.CSTNode, name: str, *places: cst.CSTNode) -> bool:
    """Whether ``name`` appears in ``scope`` other than in ``places`` (a binding elsewhere counts)."""
    bound = {id(node) for place in places for node in (place, *descendants(place))}
    return any(isinstance(node, cst.Name) and node.value == name and id(node) not in bound
               for node in descendants(scope))


def _from_itself(statement, loss: str) -> bool:
    small = statement.body[0]
    return len(statement.body) == 1 and (isinstance(small, cst.AugAssign)
                                         or single_assign(statement) and loss in read_chains(small.value))


def _bound_by(statement) -> set[str]:
    """The names a simple statement assigns (``x = ...``, ``x += ...``, ``a, x = ...``)."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return set()
    targets = []
    for small in statement.body:
        if isinstance(small, cst.Assign):
            targets.extend(target.target for target in small.targets)
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            targets.append(small.target)
    names = set()
    for target in targets:
        for element in [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]:
            if isinstance(element, cst.Name):
                names.add(element.value)
    return names


def _calls_only(statement) -> bool:
    """A line of calls whose results are dropped: it binds nothing the step reads."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) for small in statement.body)

