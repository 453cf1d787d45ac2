"""Pipeline parallel on ``torch.distributed.pipelining`` (``config.dist.pp``).

The model's forward is traced by torch.fx, its wrapped layers and split points kept as calls,
and cut *before* each split point into ``pp.size`` stages (``split_stages``). A stage takes the
values that the code before its cut computed and the code from its cut on reads (the
forward's inputs among them, passed along to the stage that reads them) and gives those that
later stages read; the last stage gives the forward's result. Each rank of a ``pp`` group keeps
its stage, whose modules are the model's own (the later parts split, checkpoint, compile and
shard them as they would the model's), named as in the model.

``PipelineModel`` is that stage, as ``accelerate`` returns it:

- ``loss = model.forward_backward(*inputs, output_fn=None, **kwargs)``: one training step's
  forward and backward. The inputs are split along their first (batch) dim into
  ``num_micro_batches``; the last stage gives each micro-batch's loss (``output_fn(output)``,
  or the forward's result itself when it is the loss), the gradients are those of the mean
  loss, and that mean is returned: on every rank with ``broadcast_loss``, on the last stage
  only (None elsewhere) without. The schedule is 1F1B (``Schedule1F1B``).
- ``output_fn``'s parameters after the output name keyword arguments that it takes, split into
  micro-batches as the inputs are (TorchAcc's spelling): ``model.forward_backward(x,
  output_fn=criterion, target=y)`` is ``criterion(model(x), y)``. The other keyword arguments
  go to the forward; one that both take is an error, as it is not known which it was for.
- The loss returned, and its gradients, are the whole batch's as ``output_fn`` computes it: a
  loss module with ``reduction="sum"`` gives the sum of the micro-batches' losses, and a
  mean over the targets that cross entropy and NLL keep (``ignore_index``, class ``weight``)
  weighs each micro-batch by the targets it keeps. Any other ``output_fn`` is taken to give a
  mean over equal samples, whose mean over the micro-batches is the batch's.
- ``model.forward(*inputs, **kwargs)`` (TorchAcc's spelling): the same, forward only
  (evaluation).

The stages send each other tensors of shapes fixed in advance: the first call with inputs of
new shapes passes a first micro-batch through the stages, one after the other, to learn them.

``model.parameters()`` are this stage's: the optimizer built after ``accelerate`` steps them.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from accrewrite.base import torch_compat
from .config import PipelineParallelConfig


def split_point_names(model: nn.Module, pp: PipelineParallelConfig, layers: list[nn.Module]) -> list[str]:
    """The qualified names of the modules the model is cut before: ``pp.split_points`` (names
    or modules), or, for None, the layers at even intervals (``pp.size`` stages of as many
    layers, the first stages taking one more where they do not divide)."""
    names = {id(module): name for name, module in model.named_modules()}
    if pp.split_points is not None:
        points = [point if isinstance(point, str) else names.get(id(point)) for point in pp.split_points]
        known = set(names.values())
        unknown = [repr(given) for given, point in zip(pp.split_points, points) if point not in known]
        if unknown:
            raise ValueError(f"config.dist.pp.split_points names {', '.join(unknown)}, which is not a module of "
                             f"{type(model).__name__}; give module names (as model.named_modules() lists them) "
                             f"or modules")
        if len(points) != pp.size - 1:
            raise ValueError(f"config.dist.pp.split_points gives {len(points)} points for config.dist.pp.size = "
                             f"{pp.size} stages; give {pp.size - 1} (the model is cut before each)")
        return points
    if len(layers) < pp.size:
        raise ValueError(f"{type(model).__name__} has {len(layers)} repeated blocks, too few for config.dist.pp.size = "
                         f"{pp.size} stages; give config.dist.pp.split_points or a smaller size")
    per_stage, longer = divmod(len(layers), pp.size)
    starts = [stage * per_stage + min(stage, longer) for stage in range(1, pp.size)]
    return [names[id(layers[start])] for start in starts]


def split_stages(model: nn.Module, cuts: list[str], layers: list[nn.Module],
                 input_names: list[str] | None) -> list[torch.fx.GraphModule]:
    """``model``'s forward cut before each module of ``cuts`` (in the order the forward calls
    them): one GraphModule per stage, holding the model's own modules and parameters."""
    kept = {id(layer) for layer in layers} | {id(model.get_submodule(name)) for name in cuts}
    try:
        traced = torch_compat.trace_forward(model, lambda module, default: default or id(module) in kept,
                                            inputs=input_names)
    except Exception as error:
        raise ValueError(f"pipeline parallel traces {type(model).__name__}'s forward with torch.fx, which "
                         f"failed ({type(error).__name__}: {error}); give config.dist.pp.input_names (the "
                         f"forward's inputs), or make the code between the split points traceable") from error
    stage_of = _stages(traced, cuts, type(model).__name__)
    count = len(cuts) + 1
    crossing = [_crossing(traced, stage_of, cut) for cut in range(1, count)]
    stages = [torch.fx.GraphModule(model, _stage_graph(traced, stage_of, stage, crossing, count))
              for stage in range(count)]
    _check_unshared(model, stages)
    return stages


def _check_unshared(model: nn.Module, stages: list[nn.Module]) -> None:
    """Each stage steps its own parameters: one read by two stages (tied embeddings) would be
    two parameters, trained apart."""
    names = {id(param): name for name, param in model.named_parameters()}
    holders = {}
    for index, stage in enumerate(stages):
        for param in stage.parameters():
            holders.setdefault(id(param), []).append(index)
    shared = {names[key]: found for key, found in holders.items() if len(found) > 1}
    if shared:
        name, found = next(iter(shared.items()))
        raise ValueError(f"{type(model).__name__}.{name} is read by pipeline stages {found} (tied weights?); a stage "
                         f"steps its own parameters, so they would be trained apart: untie them, or choose "
                         f"config.dist.pp.split_points that keep their readers in one stage")


def _stages(graph: torch.fx.Graph, cuts: list[str], model_name: str) -> dict:
    """The stage of each node but ``get_attr`` nodes (copied into each stage that reads them):
    the inputs in the first, the result in the last, the others by how many cuts precede them."""
    called = [node for node in graph.nodes if node.op == "call_module" and node.target in cuts]
    calls = {node.target: node for node in called}
    missing = [name for name in cuts if name not in calls]
    if missing:
        raise ValueError(f"config.dist.pp.split_points {missing} are not called by {model_name}'s forward; "
                         f"cut before modules it calls (its blocks)")
    if len(called) > len(cuts):
        again = sorted({node.target for node in called if calls[node.target] is not node})
        raise ValueError(f"config.dist.pp.split_points {again} are called more than once by {model_name}'s "
                         f"forward, so a cut before them is not one place; cut before modules called once")
    order = {node: index for index, node in enumerate(graph.nodes)}
    if sorted(cuts, key=lambda name: order[calls[name]]) != cuts:
        raise ValueError(f"config.dist.pp.split_points {cuts} are not in the order {model_name}'s forward calls "
                         f"them; list them in that order")
    stage_of, stage = {}, 0
    for node in graph.nodes:
        if node.op == "call_module" and node.target in cuts:
            stage += 1
        if node.op != "get_attr":
            stage_of[node] = 0 if node.op == "placeholder" else stage
    return stage_of


def _crossing(graph: torch.fx.Graph, stage_of: dict, cut: int) -> list[torch.fx.Node]:
    """The values computed before stage ``cut`` and read from it on, in the forward's order."""
    return [node for node in graph.nodes if node in stage_of and stage_of[node] < cut
            and any(stage_of.get(user, cut) >= cut for user in node.users)]


def _stage_graph(graph: torch.fx.Graph, stage_of: dict, stage: int, crossing: list, count: int) -> torch.fx.Graph:
    new = torch.fx.Graph()
    env = {}

    def value(node):
        if node not in env and node.op == "get_attr":  # each stage reads the attributes it uses itself
            env[node] = new.node_copy(node, value)
        return env[node]

    if stage > 0:
        for node in crossing[stage - 1]:
            env[node] = new.placeholder(node.name)
    for node in graph.nodes:
        if stage_of.get(node) != stage:
            continue
        if node.op == "output":
            new.node_copy(node, value)
        else:
            env[node] = new.node_copy(node, value)
    if stage < count - 1:
        new.output(tuple(value(node) for node in crossing[stage]))
    return new


class PipelineModel(nn.Module):
    """One stage of a model cut for pipeline parallel (see the module docstring), holding the
    stage's modules and parameters under their names in the model."""

    def __init__(self, stage: torch.fx.GraphModule, index: int, pp: PipelineParallelConfig, mesh, device,
                 input_names: list[str]):
        super().__init__()
        for name, child in stage.named_children():
            self.add_module(name, child)
        for name, param in stage.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buffer in stage.named_buffers(recurse=False):
            self.register_buffer(name, buffer)
        self._stage_forward = type(stage).forward  # the stage's code, run with this module as its self
        self._index, self._last, self._device = index, index == pp.size - 1, device
        self._pp, self._group = pp, mesh.get_group()
        self._last_rank = dist.get_global_rank(self._group, pp.size - 1)
        self._schedules = {}  # by the shapes of the inputs: the stages pass tensors of known shapes
        self._input_names = frozenset(input_names)  # the forward's, as traced
        self._in_schedule = False
        self._output_fn = None
        self._loss_inputs, self._loss_weights = [], []  # per micro-batch, during a call

    def forward(self, *inputs, output_fn=None, **kwargs):
        """Run by the schedule: this stage's part of the forward. Called by the training
        script (``model.forward(...)``): the whole pipeline, forward only (the loss as
        ``forward_backward`` gives it)."""
        if self._in_schedule:
            outputs = self._stage_forward(self, *inputs, **kwargs)
            if not self._last:
                _check_sendable(outputs, self._index)
                # torch's point-to-point send takes contiguous tensors only; a carried input may
                # be a view (tokens[:, 1:])
                outputs = tuple(t.contiguous() for t in outputs) if isinstance(outputs, tuple) else outputs.contiguous()
            return outputs
        with torch.no_grad():
            return self._run("eval", inputs, kwargs, output_fn)

    def forward_backward(self, *inputs, output_fn=None, **kwargs):
        """One training step's forward and backward over the micro-batches: the mean loss."""
        return self._run("step", inputs, kwargs, output_fn)

    def _micro_batch_loss(self, output, index):
        index = int(index)
        loss = output if self._output_fn is None else self._output_fn(output, **self._loss_inputs[index])
        return loss * self._loss_weights[index]

    def _run(self, method, inputs, kwargs, output_fn):
        kwargs, loss_kwargs = self._keywords_of_forward_and_loss(kwargs, output_fn)
        tensors = [t for t in (*inputs, *kwargs.values(), *loss_kwargs.values()) if isinstance(t, torch.Tensor)]
        micro = self._pp.num_micro_batches
        if not tensors or any(t.dim() == 0 or t.shape[0] % micro for t in tensors):
            raise ValueError(
                f"pipeline parallel splits the inputs along their first dim into config.dist.pp.num_micro_batches "
                f"= {micro}; inputs of shapes {[tuple(t.shape) for t in tensors]} do not split evenly")
        losses = []
        self._in_schedule, self._output_fn = True, output_fn
        self._loss_inputs = [{key: _micro_batch(value, micro, index) for key, value in loss_kwargs.items()}
                             for index in range(micro)]
        self._loss_weights = _micro_batch_weights(output_fn, self._loss_inputs, micro)
        try:
            schedule = self._schedule(inputs, kwargs)
            # The schedule splits the target it is given into the micro-batches: given their
            # indices, each micro-batch's loss finds its own keyword arguments.
            getattr(schedule, method)(*inputs, target=torch.arange(micro, device=self._device), losses=losses,
                                      return_outputs=False, **kwargs)
        finally:
            self._in_schedule, self._output_fn = False, None
            self._loss_inputs, self._loss_weights = [], []
        loss = torch.stack([loss.detach().float() for loss in losses]).mean() if self._last else None
        if not self._pp.broadcast_loss:
            return loss
        loss = torch.zeros((), device=self._device) if loss is None else loss
        dist.broadcast(loss, src=self._last_rank, group=self._group)
        return loss

    def _keywords_of_forward_and_loss(self, kwargs, output_fn):
        """``kwargs`` split into the forward's and ``output_fn``'s."""
        for_loss = _parameters_after_output(output_fn)
        unknown = [key for key in kwargs if key not in for_loss and key not in self._input_names]
        if unknown:
            raise TypeError(f"pipeline parallel got keyword arguments {unknown}, which neither the model's forward "
                            f"(inputs {sorted(self._input_names)}) nor output_fn takes; output_fn is given, after "
                            f"the output, the keyword arguments named as its parameters")
        # Given to both, a forward's optional input would change what the model computes.
        both = sorted(for_loss & self._input_names & kwargs.keys())
        if both:
            raise TypeError(f"pipeline parallel got keyword arguments {both}, which both the model's forward and "
                            f"output_fn take; give output_fn parameters of other names (output_fn=lambda output, "
                            f"labels: criterion(output, labels), labels=...)")
        return ({key: value for key, value in kwargs.items() if key not in for_loss},
                {key: value for key, value in kwargs.items() if key in for_loss})

    def _schedule(self, inputs, kwargs):
        """The 1F1B schedule for inputs of these shapes, its stage given the shapes of the
        values it receives and sends: those of a first micro-batch passed through the stages."""
        shapes = tuple(tuple(t.shape) for t in (*inputs, *kwargs.values()) if isinstance(t, torch.Tensor))
        if shapes not in self._schedules:
            received, sent = self._pass_first_micro_batch(inputs, kwargs)
            stage = PipelineStage(self, self._index, self._pp.size, self._device, input_args=received,
                                  output_args=sent, group=self._group)
            self._schedules[shapes] = Schedule1F1B(stage, self._pp.num_micro_batches, loss_fn=self._micro_batch_loss)
        return self._schedules[shapes]

    def _pass_first_micro_batch(self, inputs, kwargs):
        """This stage's inputs and outputs for the first micro-batch, the stages run one after
        the other (a stage's uninitialised inputs could fail its code: a loss on garbage targets)."""
        if self._index == 0:
            args = tuple(_first_micro_batch(value, self._pp.num_micro_batches) for value in inputs)
            kwargs = {key: _first_micro_batch(value, self._pp.num_micro_batches) for key, value in kwargs.items()}
        else:
            received = [None]
            dist.recv_object_list(received, group=self._group, group_src=self._index - 1, device=self._device)
            args, kwargs = received[0], {}
        outputs = self(*args, **kwargs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        outputs = tuple(t.detach().requires_grad_(t.requires_grad) for t in outputs)
        if not self._last:
            dist.send_object_list([outputs], group=self._group, group_dst=self._index + 1, device=self._device)
        return tuple(t for t in args if isinstance(t, torch.Tensor)), outputs


def forward_input_names(first_stage: torch.fx.GraphModule) -> list[str]:
    """The forward's inputs as traced: the first stage's."""
    return [node.target for node in first_stage.graph.nodes if node.op == "placeholder"]


def _first_micro_batch(value, micro: int):
    return _micro_batch(value, micro, 0)


def _micro_batch(value, micro: int, index: int):
    """Micro-batch ``index`` of ``value``: its part along the first dim, as the schedule splits
    the inputs; a value that is not a tensor whole."""
    return value.tensor_split(micro)[index] if isinstance(value, torch.Tensor) else value


def _parameters_after_output(output_fn) -> frozenset[str]:
    """The names of ``output_fn``'s parameters after its first, the output (a loss module's
    forward's: ``target``)."""
    if output_fn is None:
        return frozenset()
    function = output_fn.forward if isinstance(output_fn, nn.Module) else output_fn  # its call takes *args
    parameters = list(inspect.signature(function).parameters.values())[1:]
    return frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _micro_batch_weights(output_fn, loss_inputs: list[dict], micro: int) -> list:
    """What each micro-batch's loss is multiplied by so that their mean, whose gradients the
    schedule takes (it scales them by 1 / micro), is the whole batch's loss as ``output_fn``
    computes it."""
    reduction = getattr(output_fn, "reduction", "mean")
    if reduction == "sum":
        return [micro] * micro
    if reduction not in ("mean", "batchmean"):
        raise ValueError(f"output_fn {type(output_fn).__name__} has reduction={reduction!r}, but a micro-batch's "
                         f"loss must be one value: give reduction 'mean' or 'sum'")
    kept = _kept_targets(output_fn, [inputs.get("target") for inputs in loss_inputs])
    if kept is None:
        return [1] * micro
    total = sum(kept)
    return [micro * count / total for count in kept]


def _kept_targets(output_fn, targets: list) -> list | None:
    """How much of each micro-batch's targets cross entropy or NLL keeps, whose mean is over
    those: the targets other than ``ignore_index``, weighed by the class ``weight``; tensors on
    the targets' device, so that the step does not wait for a count on the host. None for
    another loss, or class probabilities as targets: a mean over equal samples."""
    if isinstance(output_fn, (nn.CrossEntropyLoss, nn.NLLLoss)):
        ignore_index, weight = output_fn.ignore_index, output_fn.weight
    elif output_fn in (F.cross_entropy, F.nll_loss):
        ignore_index, weight = -100, None  # their defaults: called with the target only
    else:
        return None
    if any(not isinstance(target, torch.Tensor) or target.is_floating_point() for target in targets):
        return None
    kept = [target != ignore_index for target in targets]
    if weight is None:
        return [mask.sum() for mask in kept]
    return [(weight[target.masked_fill(~mask, 0)] * mask).sum() for target, mask in zip(targets, kept)]


def _check_sendable(outputs, index: int) -> None:
    values = outputs if isinstance(outputs, tuple) else (outputs,)
    for value in values:
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"pipeline stage {index} passes a {type(value).__name__} to the next stage, which only tensors can "
                f"reach; compute it after the split point that follows it, or move the split point")
