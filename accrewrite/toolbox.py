"""What several rules share: argument lists rebuilt after a rewrite, string literals in the file's
quotes, ``with`` statements rid of a context manager, the arguments that say where tensors go,
and the recognition of a model wrapped in DistributedDataParallel/DataParallel.

Rules import from here and from the engine's public names, never from one another, so that a
rule's module holds that rule alone and a rule added through the entry point finds the same
tools.
"""

from dataclasses import dataclass

import libcst as cst

from accrewrite.analysis import WRAPPER_NAMES, small_statements
from accrewrite.facts import Facts
from accrewrite.nodes import STATEMENT_TYPES, call_arg, dotted, node_types, string_value, walk
from accrewrite.reduction import named_like_optimizer
from accrewrite import snippets
from accrewrite.rule import RuleContext, excerpt
from accrewrite.targets import called_names, spelled_callees

# Keywords that name where tensors go.
PLACEMENT_KEYWORDS = ("device", "map_location")


def with_commas(args: list[cst.Arg | cst.Element]) -> list[cst.Arg | cst.Element]:
    """Arguments (or a tuple's elements) with a comma after each but the last (the last keeps none)."""
    fixed = []
    for position, arg in enumerate(args):
        last = position == len(args) - 1
        if last:
            fixed.append(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        elif arg.comma is cst.MaybeSentinel.DEFAULT:
            fixed.append(arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
        else:
            fixed.append(arg)
    return fixed


def device_here(ctx: RuleContext) -> cst.BaseExpression:
    """The device variable bound where the current statement runs (``Facts.device_at``), else the
    target's device."""
    name = ctx.facts.device_at(ctx.scope, ctx.statement)
    return snippets.expression(name, ctx.module.config_for_parsing) if name else ctx.expr("device")


def with_keywords(call: cst.Call, keywords: list[tuple[str, cst.BaseExpression]]) -> cst.Call:
    """``call`` with keyword arguments added after its last, laid out as its arguments are (one a
    line where they are, a trailing comma kept). The comments of the arguments stay with them:
    the last one keeps its own and those below it, and the new ones come after."""
    args = list(call.args)
    equal = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    new = [cst.Arg(keyword=cst.Name(name), value=value, equal=equal) for name, value in keywords]
    between = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if len(args) > 1 and isinstance(args[-2].comma, cst.Comma):
        between = _uncommented(args[-2].comma)
    trailing = args[-1].comma if args else cst.MaybeSentinel.DEFAULT
    after_last, end = between, trailing
    if isinstance(trailing, cst.Comma) and isinstance(trailing.whitespace_after, cst.ParenthesizedWhitespace) \
            and isinstance(between.whitespace_after, cst.ParenthesizedWhitespace):
        lines = trailing.whitespace_after
        after_last = trailing.with_changes(whitespace_after=lines.with_changes(last_line=between.whitespace_after.last_line))
        end = _uncommented(trailing)
    if args:
        args[-1] = args[-1].with_changes(comma=after_last)
    args += [arg.with_changes(comma=between) for arg in new[:-1]]
    return call.with_changes(args=[*args, new[-1].with_changes(comma=end)])


def _uncommented(comma: cst.Comma) -> cst.Comma:
    """A comma's line break and indentation, without the comment and blank lines it holds."""
    if isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
        return comma.with_changes(whitespace_after=comma.whitespace_after.with_changes(
            first_line=cst.TrailingWhitespace(), empty_lines=[]))
    return comma


def quoted_like(original: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """``new`` in the quotes of the string literal it replaces (the file's quoting is kept)."""
    if isinstance(original, cst.SimpleString) and isinstance(new, cst.SimpleString):
        quote, value = original.quote, new.evaluated_value
        if quote in ('"', "'") and quote not in value and "\\" not in value:
            return new.with_changes(value=f"{quote}{value}{quote}")
    return new


def without_items(with_node: cst.With, dropped: list[bool]) -> cst.With | cst.FlattenSentinel:
    """``with_node`` (a rule's updated node) without the context managers that ``dropped`` marks,
    in the order of its items; where none is left, the statements of its block in its place. They
    keep the ``with``'s leading lines and the comment on its line; the comments that close the
    block go before its last statement, the last place a statement can hold them."""
    kept = [item for item, drop in zip(with_node.items, dropped) if not drop]
    if kept:
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return with_node.with_changes(items=kept)
    block = with_node.body
    if not isinstance(block, cst.IndentedBlock):
        line = cst.SimpleStatementLine(list(block.body), leading_lines=with_node.leading_lines)
        return cst.FlattenSentinel([line])
    body = list(block.body)
    leading = list(with_node.leading_lines)
    if block.header.comment is not None:
        leading.append(cst.EmptyLine(comment=block.header.comment))
    closing = [line for line in block.footer if line.comment is not None]
    body[-1] = body[-1].with_changes(leading_lines=[*body[-1].leading_lines, *closing])
    body[0] = body[0].with_changes(leading_lines=[*leading, *body[0].leading_lines])
    return cst.FlattenSentinel(body)


def placement_arguments(facts: Facts, call: cst.Call) -> list[cst.BaseExpression]:
    """The arguments of ``call`` that say where tensors go, which ACC002 makes the target's device
    where they name CUDA: every one of ``x.cuda(...)``, the first of ``x.to(...)`` and
    ``torch.device(...)``, and ``device=`` and ``map_location=`` where ``places_by_keyword``."""
    func = call.func
    callee = facts.file.qualname(func)
    method = func.attr.value if isinstance(func, cst.Attribute) and callee is None else None
    if method == "cuda":
        return [arg.value for arg in call.args]
    first = call_arg(call, 0, "device") if method == "to" else call_arg(call, 0, "type") if callee == "torch.device" \
        else None
    found = [first.value] if first is not None else []
    if places_by_keyword(facts, call):
        found += [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value in PLACEMENT_KEYWORDS]
    return found


def places_by_keyword(facts: Facts, call: cst.Call) -> bool:
    """Whether an index ``call`` takes as ``device=`` is a device to place on: not where a
    function of this file takes it (it may read it as a rank), nor one of torch.cuda's, which
    asks about a CUDA device (ACC010 migrates it with its arguments)."""
    return not facts.defines(call.func) and not (facts.file.qualname(call.func) or "").startswith("torch.cuda.")


def moves_to_cuda(facts: Facts, call: cst.Call) -> bool:
    """Whether ``call`` puts something on CUDA itself: ``x.cuda()``, ``x.to("cuda")``, or a
    CUDA device given as ``device=`` (``torch.zeros(n, device="cuda")``). In a script that a
    framework trains (Lightning, Accelerate), each fails where CUDA is absent."""
    func = call.func
    if type(func) is cst.Attribute and facts.file.qualname(func) is None:
        if func.attr.value == "cuda":
            return True
        if func.attr.value == "to" and call.args and facts.is_cuda_device(call.args[0].value):
            return True
    device = call_arg(call, 99, "device")
    return device is not None and facts.is_cuda_device(device.value)


def wraps_model(facts: Facts, node: cst.CSTNode) -> bool:
    """Whether ``node`` is a DistributedDataParallel/DataParallel call, however imported."""
    return isinstance(node, cst.Call) and facts.file.qualname(node.func) in WRAPPER_NAMES


def wrapped_module(ctx: RuleContext, original: cst.Call, updated: cst.Call, by_hand: str) -> cst.Arg | None:
    """The argument holding the module a DDP/DataParallel call wraps, or None, after a finding
    that says what to do ``by_hand``, where star arguments or its absence hide it."""
    module = call_arg(updated, 0, "module")
    if module is None or any(arg.star for arg in original.args):
        ctx.diagnose(original, "the module this wrapper wraps cannot be told; left as it is", by_hand)
        return None
    return module


def single_assign(statement) -> cst.Assign | None:
    """The assignment when ``statement`` is a line of one ``target = value``, else None."""
    if (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1):
        return statement.body[0]
    return None


def wrapped_models_of(ctx: RuleContext) -> set[str] | None:
    """``wrapped_models`` of the rule context's file, or None where the file never names
    DataParallel (a cheap gate before any name is resolved)."""
    if "DataParallel" not in ctx.source_text:
        return None
    return wrapped_models(ctx.facts, ctx.module)


def wrapped_models(facts: Facts, module: cst.Module) -> set[str]:
    """Names assigned a DDP/DataParallel wrapper anywhere in the file (`model = DDP(model)`,
    `self.model = DDP(...)`, `model = DDP(model) if ddp else model`, `model = DP(model).cuda()`)."""
    return {dotted(node.targets[0].target) for node, _ in _wrapping_assignments(facts, module)}


# Module methods that return the module itself: ``DataParallel(model).to(device)`` is the wrapper.
_SELF_RETURNING = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval",
                             "requires_grad_"})


def _wrapping_assignments(facts: Facts, module: cst.Module) -> list[tuple[cst.Assign, list[cst.Call]]]:
    """Each ``name = <wrapper>`` of the file (one target, a name or an attribute), with the
    wrapper calls it assigns."""
    found = []
    for node in small_statements(module):
        if type(node) is cst.Assign and len(node.targets) == 1 and dotted(node.targets[0].target):
            calls = assigned_wrappers(facts, node.value)
            if calls:
                found.append((node, calls))
    return found


def assigned_wrappers(facts: Facts, value: cst.BaseExpression) -> list[cst.Call]:
    """The wrapper calls whose module ``value`` is: the call itself, the call followed by
    module methods that return the module (``DP(model).cuda()``), either arm of a conditional."""
    found = []
    for candidate in [value.body, value.orelse] if type(value) is cst.IfExp else [value]:
        while (type(candidate) is cst.Call and type(candidate.func) is cst.Attribute
               and candidate.func.attr.value in _SELF_RETURNING and not wraps_model(facts, candidate)):
            candidate = candidate.func.value
        if wraps_model(facts, candidate):
            found.append(candidate)
    return found


@dataclass(frozen=True)
class Wrappers:
    """The file's DDP/DataParallel wrappers as ACC005 reads them: the names assigned one that it
    follows (each ``name.module`` becomes ``name``), and, by id, the wrapper calls whose model
    goes where it cannot follow, each with the code that takes it there."""

    followed: frozenset[str]
    unfollowed: dict[int, str]


# Calls that keep what they are given in a container (StarGAN v2's ``Munch(generator=generator)``).
_CONTAINERS = frozenset({"dict", "list", "tuple", "set", "setattr", "Munch", "EasyDict", "edict", "OrderedDict",
                         "SimpleNamespace", "ModuleList", "ModuleDict", "Sequential"})
_DISPLAYS = (cst.List, cst.Tuple, cst.Set)


def wrappers_of(ctx: RuleContext) -> Wrappers | None:
    """``Wrappers`` of the rule context's file, worked out once; None where the file never
    names DataParallel.

    A wrapper assigned to a name (``model = DP(model)``, ``self.model = DP(model).cuda()``) is
    followed: ACC005 rewrites every ``model.module`` of the file. It cannot be where the
    wrapper, or a name holding it, is stored elsewhere: passed to ``setattr`` and read back with
    ``getattr`` (pix2pix's ``setattr(self, 'net' + name, DataParallel(net))``), put in a list,
    a tuple or a dict (``Munch(generator=generator)``), returned or yielded; there another
    module, or a ``getattr``, reads ``.module`` of the wrapper, and unwrapping would break it."""
    if "DataParallel" not in ctx.source_text:
        return None
    if "wrappers" not in ctx.shared:
        ctx.shared["wrappers"] = _wrappers(ctx)
    return ctx.shared["wrappers"]


def _wrappers(ctx: RuleContext) -> Wrappers:
    facts = ctx.facts
    assignments = _wrapping_assignments(facts, ctx.module)
    assigned = {id(call): node for node, calls in assignments for call in calls}
    scopes = {id(call): scope for call, scope in facts.file.calls if id(call) in assigned}
    unfollowed, names, escaped = {}, set(), {}
    for call, scope in facts.file.calls:
        if not wraps_model(facts, call):
            continue
        node = assigned.get(id(call))
        if node is None:
            unfollowed[id(call)] = _statement_code(ctx, call, scope)
            continue
        name = dotted(node.targets[0].target)
        # A local name escapes within its function; a module's name or an attribute anywhere.
        where = scopes[id(call)] if "." not in name and scopes[id(call)] is not None else ctx.module
        key = (id(where), name)
        if key not in escaped:
            escaped[key] = _escape(ctx, where, name)
        if escaped[key] is not None:
            unfollowed[id(call)] = escaped[key]
        names.add(name)
    kept = {dotted(assigned[key].targets[0].target) for key in unfollowed if key in assigned}
    return Wrappers(frozenset(names - kept), unfollowed)


def _statement_code(ctx: RuleContext, call: cst.Call, scope) -> str:
    """The code of the statement that holds ``call``, quoted."""
    statement = ctx.facts.values(scope).statement_of(call)
    return excerpt(ctx.code(statement if statement is not None else call), 32)


def _escape(ctx: RuleContext, where: cst.CSTNode, name: str) -> str | None:
    """The code under ``where`` that takes the model ``name`` holds out of reach, quoted: a
    return, a yield, a list, tuple, set or dict that holds it, a container call or ``setattr``
    given it, a subscript assigned it, a ``getattr`` of its owner by a computed name; None where
    there is none. Assignment and loop targets (``model, optimizer = ...``) store nothing, and
    a function that binds a name of its own (``from_pretrained``'s ``return model``) is not read."""
    owner = name.rpartition(".")[0]
    targets: set[int] = set()
    found = None

    def holds_it(node) -> bool:
        return dotted(node) == name

    def local(function: cst.FunctionDef) -> bool:  # a function's own ``model``, not the wrapped one
        params = function.params
        return "." not in name and (name in ctx.facts.file.local_names.get(function.body, ()) or any(
            param.name.value == name for param in (*params.posonly_params, *params.params, *params.kwonly_params)))

    def escapes(node, kind) -> bool:
        if kind is cst.Return or kind is cst.Yield:
            return node.value is not None and holds_it(node.value)
        if kind in _DISPLAYS:
            return any(holds_it(element.value) for element in node.elements)
        if kind is cst.Dict:
            return any(type(element) is cst.DictElement and holds_it(element.value) for element in node.elements)
        if kind is cst.Assign:
            return holds_it(node.value) and any(type(target.target) is cst.Subscript for target in node.targets)
        if kind is not cst.Call or type(node.func) not in (cst.Name, cst.Attribute):
            return False
        callee = node.func.value if type(node.func) is cst.Name else node.func.attr.value
        if callee in _CONTAINERS:
            return any(holds_it(arg.value) for arg in node.args)
        return (callee == "getattr" and bool(owner) and len(node.args) > 1
                and dotted(node.args[0].value) == owner and string_value(node.args[1].value) is None)

    def enter(node) -> bool:
        nonlocal found
        kind = type(node)
        if id(node) in targets or kind is cst.FunctionDef and node is not where and local(node):
            return False
        targets.update(id(target) for target in _targets(node, kind))
        if escapes(node, kind):
            found = node
        return found is None

    walk(where, enter)
    return None if found is None else excerpt(ctx.code(found), 32)


def _targets(node, kind) -> list[cst.CSTNode]:
    """What ``node`` binds (assignment, loop and ``with`` targets), where it is such a statement."""
    if kind is cst.Assign:
        return [target.target for target in node.targets]
    if kind in (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor):
        return [node.target]
    if kind is cst.WithItem and node.asname is not None:
        return [node.asname.name]
    return []


# Optimizer steps, and the gradient all-reduce that takes DistributedDataParallel's place ----------

DDP_NAMES = frozenset(name for name in WRAPPER_NAMES if name.endswith(".DistributedDataParallel"))
# Libraries' loss scalers that call backward and step the optimizer themselves.
OPAQUE_STEPPERS = frozenset({"timm.utils.NativeScaler", "timm.utils.cuda.NativeScaler", "timm.utils.ApexScaler"})
# Sharding that reduces (reduce-scatters) gradients itself: FSDP, FSDP2, DTensor parallelism.
SHARDING = ("torch.distributed.fsdp.", "torch.distributed._composable.fsdp.", "torch.distributed.tensor.",
            "torch.distributed._tensor.")
# Calls that read gradients after the backward passes of a step: the reduction goes before the
# first of them (overflow detection and clipping must see reduced gradients).
GRADIENT_READERS = ("unscale_", "clip_grad_norm_", "clip_grad_value_")
# What reads gradients before a plain optimizer step: clipping (also a script's own
# ``clip_gradients`` helper) and ``p.grad`` itself (a finite check, a gradient-norm log).
PLAIN_READERS = ("clip_grad_norm_", "clip_grad_value_", "clip_gradients", "clip_grad", "grad")
# The reduction's rule, which DDP's removal relies on.
REDUCING_RULE = "ACC006"


def step_call(statement) -> cst.Call | None:
    """The call when ``statement`` is a lone ``x.method(...)`` expression statement."""
    if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
        return None
    expression = statement.body[0]
    if type(expression) is not cst.Expr or type(expression.value) is not cst.Call:
        return None
    call = expression.value
    return call if type(call.func) is cst.Attribute else None


def _scaler(facts: Facts, owner: str) -> bool:
    # A scaler passed in as a parameter (TorchAcc's migration guide's loop_with_amp) is known by its name.
    return owner in facts.scalers or "scaler" in owner.split(".")[-1].lower()


def scaler_step(facts: Facts, statement) -> cst.BaseExpression | None:
    """The optimizer when ``statement`` is ``<scaler>.step(<optimizer>)``."""
    call = step_call(statement)
    if call is None or call.func.attr.value != "step" or not call.args:
        return None
    return call.args[0].value if _scaler(facts, dotted(call.func.value) or "") else None


def stepped_optimizer(facts: Facts, call: cst.Call, in_training: bool) -> str | None:
    """The optimizer's name when ``call`` is ``<optimizer>.step(...)``: one the file builds from
    torch.optim or from an optimizer class of its own (VICReg's ``LARS``), or, in training
    code, one named so (built by a factory, or in another module)."""
    if call.func.attr.value != "step":
        return None
    owner = dotted(call.func.value)
    if owner is None or _scaler(facts, owner):
        return None
    if owner in facts.optimizers or _built_by_own_optimizer_class(facts, owner):
        return owner
    return owner if in_training and owner.split(".")[-1] in ("optimizer", "optim", "opt") else None


def _built_by_own_optimizer_class(facts: Facts, name: str) -> bool:
    """Whether ``name`` is assigned an instance of a ``torch.optim.Optimizer`` subclass of the file."""
    for value in facts.file.assignments.get(name, ()):
        if type(value) is cst.Call and type(value.func) is cst.Name:
            built = facts.file.definitions.classes.get(value.func.value)
            if built is not None and any((facts.file.qualname(base.value) or "").startswith("torch.optim.")
                                         for base in built.bases):
                return True
    return False


def steps_through_target(call: cst.Call) -> bool:
    """``optimizer.step()``, or LBFGS's ``optimizer.step(closure)``: a step the target's
    optimizer step takes the place of."""
    return len(call.args) <= 1 and all(arg.keyword is None or arg.keyword.value == "closure" for arg in call.args)


def reduces_like_a_target(facts: Facts, statement) -> bool:
    """A statement that already reduces gradients the way a target does (a migrated file,
    guarded or not); the script's own ``dist.all_reduce(loss)`` is not that."""
    reductions = spelled_callees("gradient_allreduce")
    names = called_names("gradient_allreduce")
    found = False

    def enter(node):
        nonlocal found
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in names:
            qualified = facts.file.qualname(node.func)
            found = found or qualified is None or qualified in reductions  # an alias added by this run
        return not found

    walk(statement, enter)
    return found


@dataclass(frozen=True)
class BlockReduction:
    """Where a block's gradients are all-reduced: before ``anchor``, for ``optimizer``, which
    ``step`` steps (through a GradScaler, or plainly after reading the gradients); ``done``
    where the block reduces already (a migrated file)."""

    anchor: cst.CSTNode
    optimizer: cst.BaseExpression
    step: cst.CSTNode
    scaled: bool
    done: bool


def block_reduction(facts: Facts, body, in_training: bool) -> BlockReduction | None:
    """The reduction a block's first step needs: before the first statement that reads the
    gradients (``scaler.unscale_``, clipping, the scaler's step itself), with a GradScaler; with
    a plain step, before what reads them first, where something does (else the step itself
    becomes the target's optimizer step, which reduces)."""
    gradient_readers, plain_readers = _FirstMention(body, GRADIENT_READERS), _FirstMention(body, PLAIN_READERS)
    for index, statement in enumerate(body):
        optimizer = scaler_step(facts, statement)
        scaled = optimizer is not None
        if scaled:
            anchor = gradient_readers.before(index) or statement
        else:
            call = step_call(statement)
            if call is None or call.args or stepped_optimizer(facts, call, in_training) is None:
                continue
            optimizer = call.func.value
            anchor = plain_readers.before(index)
            if anchor is None:
                continue
        done = any(reduces_like_a_target(facts, s) for s in body[:index])
        return BlockReduction(anchor, optimizer, statement, scaled, done)
    return None


def _mentions(statement, methods) -> bool:
    found = False

    def enter(node: cst.CSTNode) -> bool:
        nonlocal found
        found = found or (isinstance(node, cst.Attribute) and node.attr.value in methods)
        return not found

    walk(statement, enter)
    return found


class _FirstMention:
    """The first statement of a block that mentions one of ``methods``, the block read once and
    only as far as asked (each step statement asks about the statements before it)."""

    def __init__(self, body, methods: tuple[str, ...]):
        self.body = body
        self.methods = methods
        self.read = 0
        self.found = None

    def before(self, index: int):
        """The first such statement before ``body[index]``, or None."""
        while self.found is None and self.read < index:
            statement = self.body[self.read]
            self.read += 1
            if _mentions(statement, self.methods):
                self.found = statement
        return self.found


def ddp_kept(ctx: RuleContext) -> str | None:
    """Why DistributedDataParallel stays in this file, or None where it goes. It goes only
    together with the reduction that takes its place: the target's all-reduce at each of the
    file's optimizer steps (``REDUCING_RULE``), or, for a file whose steps live in another
    module, that module's (the project's pass, ``accrewrite.project``, says where it is not:
    ``ctx.keep_ddp``). Worked out once a file."""
    if "DistributedDataParallel" not in ctx.source_text:
        return None
    if "ddp_kept" not in ctx.shared:
        ctx.shared["ddp_kept"] = _why_ddp_stays(ctx) if ctx.facts.file.called & DDP_NAMES else None
    return ctx.shared["ddp_kept"]


def _why_ddp_stays(ctx: RuleContext) -> str | None:
    facts = ctx.facts
    if ctx.keep_ddp is not None:
        return ctx.keep_ddp
    opaque = sorted(facts.file.called & OPAQUE_STEPPERS)
    if opaque:
        return f"{opaque[0]} steps the optimizer where no all-reduce can go"
    if any(callee.startswith(SHARDING) for callee in facts.file.called):
        return "the file also shards a model, and its steps are left as they are"
    if facts.reduces_gradients:
        return "the script all-reduces gradients itself"
    unfollowed = _unfollowed_ddp(ctx)
    if unfollowed is not None:
        return f"`{unfollowed}` hides the model from ACC005"
    unreduced = _unreduced_step(facts, ctx.module, REDUCING_RULE in ctx.running)
    if unreduced is None:
        return None  # reduced at every step, or stepped in another module
    if REDUCING_RULE not in ctx.running:
        return f"{REDUCING_RULE}, which all-reduces the gradients in its place, does not run"
    return f"`{excerpt(ctx.code(unreduced), 40)}` steps where no all-reduce can go"


def _unfollowed_ddp(ctx: RuleContext) -> str | None:
    """The code that takes a DDP-wrapped model where ACC005 cannot follow it, or None."""
    unfollowed = wrappers_of(ctx).unfollowed
    return next((unfollowed[id(call)] for call, _ in ctx.facts.file.calls
                 if id(call) in unfollowed and ctx.facts.file.qualname(call.func) in DDP_NAMES), None)


def steps_an_optimizer(facts: Facts, call: cst.Call) -> bool:
    """``<optimizer>.step(...)`` or ``<scaler>.step(<optimizer>)``: an optimizer or scaler the
    file builds, or one named so (``accrewrite.reduction.named_like_optimizer``)."""
    func = call.func
    if type(func) is not cst.Attribute or func.attr.value != "step":
        return False
    owner = func.value
    while type(owner) is cst.Subscript:
        owner = owner.value
    name = dotted(owner)
    return name is not None and (name in facts.optimizers or name in facts.scalers or named_like_optimizer(name)
                                 or _built_by_own_optimizer_class(facts, name))


def _unreduced_step(facts: Facts, module: cst.Module, reducing: bool) -> cst.Call | None:
    """The first optimizer step of the file that the reduction's rule (where ``reducing``: it
    runs) leaves without the target's all-reduce."""
    steps = [call for call, _ in facts.file.calls if steps_an_optimizer(facts, call)]
    if not steps or not reducing or not (facts.loops or facts.step_functions):
        return steps[0] if steps else None
    reduced = _reduced_steps(facts, module)
    return next((step for step in steps if id(step) not in reduced), None)


def _reduced_steps(facts: Facts, module: cst.Module) -> set[int]:
    """The ids of the step calls that the reduction's rule gives the target's all-reduce, walking
    the statements it walks (those that mention its trigger words), as it does: the first step
    of each block through a GradScaler (or plainly after reading the gradients) gets the
    reduction, and a training loop's lone ``optimizer.step()`` becomes the target's optimizer
    step."""
    bit = next((bit for rule, bit in facts.triggers.bits.items() if rule.code == REDUCING_RULE), -1) \
        if facts.triggers is not None else -1
    loops = {id(loop.node) for loop in facts.loops}
    reduced: set[int] = set()
    training: list[cst.CSTNode] = []

    def enter(node, in_training=False):
        kind = type(node)
        if kind in _EXPRESSION_TYPES or kind in STATEMENT_TYPES and not facts.concerned(node) & bit:
            return False
        if not in_training and (id(node) in loops or kind is cst.FunctionDef and node in facts.step_functions):
            training.append(node)  # walked below, as training code
            return False
        if kind is cst.Module or kind is cst.IndentedBlock:
            planned = block_reduction(facts, node.body, in_training)
            if planned is not None:
                reduced.add(id(step_call(planned.step)))
        elif kind is cst.SimpleStatementLine:
            for small in node.body:
                call = small.value if type(small) is cst.Expr and type(small.value) is cst.Call else None
                if (call is not None and type(call.func) is cst.Attribute and steps_through_target(call)
                        and stepped_optimizer(facts, call, in_training) is not None):
                    reduced.add(id(call))
            return False
        return True

    walk(module, enter)
    for node in training:
        walk(node, lambda child: enter(child, in_training=True))
    return reduced


_EXPRESSION_TYPES = node_types(cst.BaseExpression)
