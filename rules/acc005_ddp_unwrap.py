import libcst as cst

from accrewrite.analysis import WRAPPER_NAMES, small_statements
from accrewrite.facts import Facts
from accrewrite.nodes import call_arg, dotted, walk
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.toolbox import DDP_NAMES, assigned_wrappers, ddp_kept, wrapped_module, wrappers_of, wraps_model

# Attributes of a DDP-wrapped model that only DDP has.
_SYNC_FLAG = "require_backward_grad_sync"
_LOAD = "load_state_dict"
_DEVICE_COUNTS = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})
_DATA_PARALLEL = WRAPPER_NAMES - DDP_NAMES


class DdpUnwrap(Rule):
    """Remove DistributedDataParallel / DataParallel wrapping.

    On the target, gradients are all-reduced explicitly where the optimizer steps (ACC006,
    step 4 of TorchAcc's migration guide), so the model is not wrapped: the guide's guarded BERT example wraps with
    DDP only on the original path. So:

    - `model = DDP(model, device_ids=[...])` disappears (`if ddp:` around it too, when
      nothing else is left in it); `ddp_model = DDP(model)` becomes `ddp_model = model`;
      a wrapper call used as a value becomes the module it wraps;
    - `model.module` becomes `model` for every wrapped name, and nanoGPT's
      `raw_model = model.module if ddp else model` collapses to `raw_model = model`;
    - `model.require_backward_grad_sync = ...` (nanoGPT's gradient-accumulation switch) is
      removed: nothing is reduced during backward any more;
    - `with model.no_sync():` (gradient accumulation with DDP) becomes its plain block:
      no_sync only stopped DDP's all-reduce during backward, and the explicit all-reduce runs
      only where the step happens, which is what the accumulation steps wanted; any other use
      of `model.no_sync` becomes `contextlib.nullcontext`, with a diagnostic to check it.

    DDP's constructor also broadcast rank 0's parameters and buffers to every rank. Where the
    target has that broadcast (`xm.broadcast_master_param(model)` of torch_xla and of
    accrewrite.runtime) it takes the wrapper's place; elsewhere a diagnostic says that every
    rank must then build equal weights (one seed for all ranks, step 1 of TorchAcc's migration
    guide), which a rank-dependent seed such as nanoGPT's `1337 + seed_offset` breaks.
    DataParallel ran in one process: it is only removed. A batch the file multiplies by the CUDA
    device count (`batch_size * torch.cuda.device_count()`), which DataParallel split over every
    GPU, now goes whole to one device: reported, with the target's way to train on every device.

    The wrapper's checkpoints name each key under `module.` (`features.module.` where only
    `model.features` was wrapped), which the unwrapped model lacks: a `load_state_dict` of the
    model that was the wrapper, or that held it, renames them as they load, so the checkpoints the
    original saved (and that repositories publish) load into the migrated script, and
    `strict=False` (fine-tuning) loads every weight rather than none. A load whose state dict
    cannot be told (`**kwargs`) is reported instead.

    A wrapper whose model ACC005 cannot follow (stored through `setattr`, in a list or dict,
    returned from a function: read back where `.module` cannot be rewritten, such as a
    `getattr`) is kept, and reported: unwrapped, the `.module` reads left behind would fail.
    Kept, DataParallel calls the model itself on a host without CUDA.

    DistributedDataParallel goes only together with the reduction that takes its place. It stays,
    with a diagnostic that says why, where that reduction cannot reach every optimizer step of
    the file: a step ACC006 cannot rewrite (`opt_g.step()` of an optimizer neither built in the
    file nor named `optimizer`, a step that is not a statement of its own), a library's loss
    scaler that steps inside (timm's `NativeScaler`), a file that also shards a model or
    all-reduces its gradients itself, ACC006 not selected. A file that steps no optimizer
    itself relies on the modules it imports that do: where `accrewrite migrate` runs over the
    project and those modules' migrations do not reduce (or they are not migrated), DDP stays
    too. Kept, DDP runs on the target as it is, over the target's process group (gloo or NCCL on
    `runtime`, `xla` on torch_xla; its CUDA-only `device_ids=` go, ACC002), and nothing else in
    the file reduces a second time.

    The DDP import is left in place (unused imports are harmless and may be used elsewhere).

    Left as it is and reported (ACC005): a wrapper whose module cannot be told
    (`DDP(*args)`); unwrap it by hand.
    """

    code = "ACC005"
    name = "ddp-unwrap"
    summary = "DistributedDataParallel/DataParallel wrapping removed; model.module, no_sync() follow"
    # Only a target that reduces gradients where the optimizer steps trains without the wrapper.
    concepts = ("gradient_allreduce",)
    triggers = frozenset({"DistributedDataParallel", "DataParallel", "module", "no_sync", _SYNC_FLAG, _LOAD})
    examples = (
        Example(
            before="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = Net().to(device)
            if ddp:
                model = DDP(model, device_ids=[ddp_local_rank])
            raw_model = model.module if ddp else model
            for micro_step in range(accum):
                if ddp:
                    model.require_backward_grad_sync = (micro_step == accum - 1)
                loss = model(x)
                loss.backward()
            """,
            after="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            import accrewrite.runtime.xla_model as xm

            model = Net().to(device)
            if ddp:
                xm.broadcast_master_param(model)
            raw_model = model
            for micro_step in range(accum):
                loss = model(x)
                loss.backward()
            """,
        ),
        Example(
            with_rules=("ACC006",),
            before="""
            import torch

            ddp_model = torch.nn.parallel.DistributedDataParallel(model)
            for step, batch in enumerate(loader):
                if (step + 1) % accum != 0:
                    with ddp_model.no_sync():  # accumulate locally
                        ddp_model(batch).backward()
                else:
                    ddp_model(batch).backward()
                    optimizer.step()
            torch.save(ddp_model.module.state_dict(), "model.pt")
            """,
            after="""
            import torch
            import accrewrite.runtime.xla_model as xm

            ddp_model = model
            xm.broadcast_master_param(model)
            for step, batch in enumerate(loader):
                if (step + 1) % accum != 0:
                    # accumulate locally
                    ddp_model(batch).backward()
                else:
                    ddp_model(batch).backward()
                    xm.optimizer_step(optimizer)
            torch.save(ddp_model.state_dict(), "model.pt")
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch.nn as nn

            model = nn.DataParallel(model)  # use every GPU
            torch.save(model.module.state_dict(), "model.pt")
            """,
            after="""
            import torch.nn as nn

            # use every GPU
            torch.save(model.state_dict(), "model.pt")
            """,
        ),
        Example(  # left as it is, and reported
            before="""
            import torch

            model = torch.nn.parallel.DistributedDataParallel(*args)
            """,
            diagnostics=("ACC005:3",),
        ),
        Example(  # the wrapper's checkpoint, keys under `module.`, loads into the unwrapped model
            before="""
            import torch

            model = torch.nn.DataParallel(Net()).to(device)
            model.load_state_dict(torch.load(args.checkpoint), strict=False)
            """,
            after="""
            import torch

            model = Net().to(device)
            model.load_state_dict({key.removeprefix("module."): value for key, value in torch.load(args.checkpoint).items()}, strict=False)
            """,
        ),
        Example(  # kept, and reported: the wrapper is read back through getattr
            before="""
            import torch

            for name in self.model_names:
                setattr(self, "net" + name, torch.nn.DataParallel(getattr(self, "net" + name), self.gpu_ids))
            """,
            diagnostics=("ACC005:4",),
        ),
        Example(  # reported: one device now takes the batch DataParallel split over every GPU
            before="""
            import torch

            batch_size = args.batch_size * torch.cuda.device_count()
            model = torch.nn.DataParallel(model)
            """,
            after="""
            import torch

            batch_size = args.batch_size * torch.cuda.device_count()
            """,
            diagnostics=("ACC005:3",),
        ),
        Example(  # kept, and reported: the library's scaler steps where no all-reduce can go
            before="""
            import torch
            from timm.utils import NativeScaler

            model = torch.nn.parallel.DistributedDataParallel(model)
            loss_scaler = NativeScaler()
            for x, y in loader:
                loss = criterion(model(x), y)
                loss_scaler(loss, optimizer, parameters=model.parameters())
            """,
            diagnostics=("ACC005:4",),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._wrapped: set[str] = set()
        self._unfollowed: dict[int, str] = {}
        self._removed: set[cst.CSTNode] = set()
        self._with_items: set[cst.CSTNode] = set()
        self._warned = False
        self._kept: str | None = None
        self._scaled: list[cst.CSTNode] = []

    def applies(self) -> bool:
        wrappers = wrappers_of(self.ctx)
        self._kept = ddp_kept(self.ctx)
        if wrappers is None:
            return False
        # Where DDP stays, nothing of it goes: the wrapped names keep their ``.module``,
        # ``no_sync`` and sync flag, and no broadcast is added.
        self._wrapped = set(wrappers.followed) if self._kept is None else set()
        self._unfollowed = wrappers.unfollowed
        self._scaled = self._scaled_by_device_count() if self._wrapped else []
        return True

    def _no_sync(self, node: cst.CSTNode) -> bool:
        return (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "no_sync"
            and dotted(node.func.value) in self._wrapped
        )

    # Expressions -----------------------------------------------------------------------------

    def leave_Call(self, original_node, updated_node):
        if not wraps_model(self.ctx.facts, original_node):
            return self._load(original_node, updated_node)
        if self._kept is not None:
            self._report_kept(original_node)
            return updated_node
        if id(original_node) in self._unfollowed:
            self._report_unfollowed(original_node)
            return updated_node
        module = wrapped_module(self.ctx, original_node, updated_node, "Unwrap it by hand.")
        if module is None:
            return updated_node
        self.ctx.fix(original_node, "unwrapped: the target all-reduces gradients at the step (ACC006), not in DDP")
        return module.value.with_changes(lpar=[], rpar=[]) if isinstance(module.value, cst.Name) else module.value

    def _report_unfollowed(self, call: cst.Call) -> None:
        self.ctx.diagnose(
            call,
            f"DataParallel kept: `{self._unfollowed[id(call)]}` hides the model from ACC005",
            "ACC005 removes a wrapper only where it can rewrite every `.module` read of it; a wrapper stored "
            "through setattr, in a container, or returned is read back where it cannot (getattr, another "
            "module), and unwrapped there `.module` would fail. Kept, DataParallel calls the model itself on a "
            "host without CUDA (a TPU VM, the CPU); on a CUDA host it needs the model on its first device. "
            "To drop it, assign the wrapper to a name and read `.module` through that name.",
        )

    def _report_kept(self, call: cst.Call) -> None:
        if self.ctx.facts.file.qualname(call.func) in DDP_NAMES:
            self.ctx.diagnose(
                call,
                f"DistributedDataParallel kept: {self._kept}",
                "DDP all-reduces the gradients during backward; it goes only where the target's all-reduce "
                "takes its place at every optimizer step (ACC006), and it runs on the target as it is. To "
                "train without it, step each optimizer where ACC006 reduces: `optimizer.step()` or "
                "`scaler.step(optimizer)` in a training loop of a file migrated with this one.",
            )

    def leave_Attribute(self, original_node, updated_node):
        attr = original_node.attr.value
        if attr == "module" and dotted(original_node.value) in self._wrapped:
            self.ctx.fix(original_node, f"{dotted(original_node.value)}.module -> {dotted(original_node.value)}: the model is not wrapped")
            return updated_node.value
        if attr == "no_sync" and dotted(original_node.value) in self._wrapped and original_node not in self._with_items:
            self.ctx.diagnose(
                original_node,
                "model.no_sync is now a no-op context (contextlib.nullcontext)",
                "Gradients are all-reduced only where the optimizer steps (ACC006): check that the step "
                "is where no_sync ended.",
            )
            self.ctx.fix(original_node, "model.no_sync -> contextlib.nullcontext: nothing is reduced during backward")
            return self.ctx.expr("null_context")
        return updated_node

    def leave_IfExp(self, original_node, updated_node):
        same = self.ctx.code(updated_node.body) == self.ctx.code(updated_node.orelse)
        if not same or self.ctx.code(original_node.body) == self.ctx.code(original_node.orelse):
            return updated_node
        self.ctx.fix(original_node, "both branches are the unwrapped model: collapsed")
        return updated_node.body

    def _load(self, original_node: cst.Call, updated_node: cst.Call):
        """``model.load_state_dict(state_dict)`` where ``model`` was the wrapper (or holds one):
        the checkpoints the wrapper saved name each key under ``module.``, which the unwrapped
        model lacks, so the keys lose it as they load (``strict=False`` would load nothing)."""
        func = original_node.func
        if type(func) is not cst.Attribute or func.attr.value != _LOAD or not self._wrapped:
            return updated_node
        receiver = dotted(func.value)
        paths = self._wrapped_paths(receiver)
        if not paths or "" in paths and self._bound_unwrapped(original_node, receiver):
            return updated_node
        state_dict = call_arg(updated_node, 0, "state_dict")
        if state_dict is not None and _renames_wrapper_keys(self.ctx, state_dict.value):
            return updated_node  # done already (a guarded file's migrated branch)
        if state_dict is None or any(arg.star for arg in original_node.args):
            self.ctx.diagnose(
                original_node,
                f"`{receiver}.{_LOAD}` loads a state dict that cannot be told; its `module.` keys stay",
                "The wrapper ACC005 removed saved its keys under `module.`; the unwrapped model loads them only "
                "without it. Strip the prefix as the state dict loads "
                "(torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state_dict, 'module.')).",
            )
            return updated_node
        self.ctx.fix(original_node, f"{receiver}.{_LOAD}: keys saved under the wrapper's `module.` load without it")
        args = [arg.with_changes(value=_unprefixed(state_dict.value, paths)) if arg is state_dict else arg
                for arg in updated_node.args]
        return updated_node.with_changes(args=args)

    def _wrapped_paths(self, receiver: str | None) -> list[str]:
        """Where ``receiver``'s state dict holds a removed wrapper's keys: ``""`` for the
        wrapper itself, ``"features."`` where ``receiver.features`` was wrapped."""
        if receiver is None:
            return []
        return sorted(name[len(receiver) + 1:] + "." if name != receiver else ""
                      for name in self._wrapped if name == receiver or name.startswith(receiver + "."))

    def _bound_unwrapped(self, call: cst.Call, name: str) -> bool:
        """Whether every binding of the local ``name`` that reaches ``call`` assigns no wrapper (a
        load before the model is wrapped: its checkpoint has no ``module.`` keys)."""
        if "." in name:
            return False
        values = self.ctx.facts.values(self.ctx.scope)
        statement = values.statement_of(call)
        bindings = values.bindings_at(name, statement) if statement is not None else frozenset()
        return bool(bindings) and not any(self._wraps(binding) for binding in bindings)

    def _wraps(self, statement: cst.CSTNode) -> bool:
        smalls = statement.body if type(statement) is cst.SimpleStatementLine else ()
        return any(type(small) is cst.Assign and assigned_wrappers(self.ctx.facts, small.value) for small in smalls)

    def _scaled_by_device_count(self) -> list[cst.CSTNode]:
        """The statements that multiply by the CUDA device count (deep-text's
        ``opt.batch_size = opt.batch_size * opt.num_gpu``) in a file that drops DataParallel, which
        split that batch over every GPU."""
        facts = self.ctx.facts
        # Where the file also runs DDP, the count is that of its processes, each with its share.
        if "device_count" not in self.ctx.source_text or not facts.file.called & _DATA_PARALLEL or facts.file.called & DDP_NAMES:
            return []
        counts, scaled = set(), []
        for small in small_statements(self.ctx.module):
            kind = type(small)
            if kind is cst.Assign and len(small.targets) == 1 and _counts_devices(facts, small.value):
                counts.add(dotted(small.targets[0].target))
            elif kind in (cst.Assign, cst.AugAssign) and _multiplies_by(facts, small, counts):
                scaled.append(small)
        return scaled

    # Statements ------------------------------------------------------------------------------

    def visit_With(self, node: cst.With) -> None:
        for item in node.items:
            if self._no_sync(item.item):
                self._with_items.add(item.item.func)

    def leave_With(self, original_node, updated_node):
        syncs = [self._no_sync(item.item) for item in original_node.items]
        if not any(syncs):
            return updated_node
        message = "with model.no_sync(): -> its plain block: the target reduces gradients only at the step (ACC006)"
        kept = [item for item, sync in zip(updated_node.items, syncs) if not sync]
        self.ctx.fix(original_node, message)
        if kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated_node.with_changes(items=kept)
        body = list(updated_node.body.body) if isinstance(updated_node.body, cst.IndentedBlock) else [
            cst.SimpleStatementLine(list(updated_node.body.body))
        ]
        comment = updated_node.body.header.comment if isinstance(updated_node.body, cst.IndentedBlock) else None
        leading = list(updated_node.leading_lines)
        if comment is not None:
            leading.append(cst.EmptyLine(comment=comment))
        body[0] = body[0].with_changes(leading_lines=[*leading, *body[0].leading_lines])
        return cst.FlattenSentinel(body)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if self._kept is not None or len(original_node.body) != 1 or not isinstance(original_node.body[0], cst.Assign):
            return updated_node
        assign = original_node.body[0]
        if len(assign.targets) != 1:
            return updated_node
        target = assign.targets[0].target
        if isinstance(target, cst.Attribute) and target.attr.value == _SYNC_FLAG and dotted(target.value) in self._wrapped:
            self._removed.add(original_node)
            self.ctx.fix(original_node, f"removed {_SYNC_FLAG}: nothing is reduced during backward on the target")
            return cst.RemoveFromParent()
        new = updated_node.body[0]
        module = self._wrapped_module(assign.value)
        if module is None or not isinstance(new, cst.Assign) or self.ctx.code(assign.value) == self.ctx.code(new.value):
            return updated_node
        # The broadcast reads the wrapped model where it is a name (DDP(model)); else the variable
        # the unwrapped model is assigned to: evaluating DDP(net.cuda())'s or DDP(build())'s
        # argument again would move or build another model.
        model = self.ctx.code(module if dotted(module) is not None else target).strip()
        broadcast = self._broadcast(original_node, model) if self._distributed(assign.value) else []
        if self.ctx.code(new.value).strip() == self.ctx.code(target).strip():
            self.ctx.fix(original_node, f"removed {self.ctx.code(target)} = {self.ctx.code(target)} left by unwrapping")
            if broadcast:
                broadcast[0] = broadcast[0].with_changes(leading_lines=updated_node.leading_lines)
                broadcast[-1] = broadcast[-1].with_changes(trailing_whitespace=updated_node.trailing_whitespace)
                return cst.FlattenSentinel(broadcast)
            self._removed.add(original_node)
            return cst.RemoveFromParent()
        if broadcast:
            self.ctx.fix(original_node, "rank 0's weights broadcast where the wrapper did it")
            return cst.FlattenSentinel([updated_node, *broadcast])
        return updated_node

    def _wrapped_module(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
        """The module a wrapper call wraps (``DDP(model)``, ``DDP(m) if ddp else m``)."""
        for candidate in [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]:
            if wraps_model(self.ctx.facts, candidate):
                module = call_arg(candidate, 0, "module")
                return module.value if module is not None else None
        return None

    def _distributed(self, value: cst.BaseExpression) -> bool:
        """DistributedDataParallel (many processes), not DataParallel (one process, every GPU):
        only the first started its ranks from rank 0's weights."""
        calls = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        return any(
            isinstance(call, cst.Call) and "DistributedDataParallel" in (self.ctx.facts.file.qualname(call.func) or "")
            for call in calls
        )

    def _broadcast(self, statement, module: str) -> list:
        """DDP's constructor broadcast rank 0's parameters and buffers to every rank; the
        target's broadcast takes its place, or a diagnostic says the ranks must start equal."""
        if self.ctx.target.has("broadcast_master_param"):
            return self.ctx.statements("broadcast_master_param", model=module)
        if not self._warned:
            self._warned = True
            self.ctx.diagnose(
                statement,
                "nothing broadcasts rank 0's weights now that DDP is removed",
                "DDP broadcast rank 0's parameters and buffers to every rank when it wrapped the model; "
                "without it every rank must build equal weights: seed every rank with the same value "
                "before the model is built (torch.manual_seed / xm.set_rng_state, step 1 of TorchAcc's "
                "migration guide), not with a rank-dependent seed.",
            )
        return []

    # Comments of removed statements -----------------------------------------------------------

    def leave_IndentedBlock(self, original_node, updated_node):
        return self._keep_comments(original_node, updated_node)

    def leave_Module(self, original_node, updated_node):
        for statement in self._scaled:
            self.ctx.diagnose(
                statement,
                f"`{excerpt(self.ctx.code(statement), 40)}` scales the batch by DataParallel's GPU count",
                "DataParallel ran the model on every GPU, each on its share of the batch; without it the model "
                "trains on one device, which now takes all of it (the same gradients, with that many times the "
                "memory and time). To train on every device, run a process per device (accrun, torch_xla.launch) "
                "with a DistributedSampler and the batch of one device; else scale by 1.",
            )
        return self._keep_comments(original_node, updated_node)

    def _keep_comments(self, original_block, updated_block):
        """Comments above (and inside) statements this rule removed move to the statement that
        follows them, or to the block's end. In guarded mode the removed statement stays on the
        original path, comments and all: a guard placeholder (a new bare ``pass``) is left in
        its place, and nothing moves."""
        removed = [s for s in original_block.body if s in self._removed]
        if not removed:
            return updated_block
        originals = set(original_block.body)
        if any(s not in originals and _is_pass(s) for s in updated_block.body):
            return updated_block
        body = list(updated_block.body)
        footer = list(getattr(updated_block, "footer", []))
        changed = None
        for statement in removed:
            comments = _comments(statement)
            if not comments:
                continue
            # The removed statement's own blank lines stay with its comments.
            comments = [*statement.leading_lines, *comments[len([l for l in statement.leading_lines if l.comment]):]]
            following = self.ctx.facts.next_statement.get(statement)
            while following is not None and following in self._removed:
                comments += _comments(following)
                following = self.ctx.facts.next_statement.get(following)
            if following is None:
                footer = [*comments, *footer]
            else:
                index = _index(body, following, original_block.body, self._removed)
                body[index] = body[index].with_changes(leading_lines=[*comments, *body[index].leading_lines])
            changed = changed or statement
        if changed is None:
            return updated_block
        self.ctx.fix(changed, "kept the comments of removed wrapper statements")
        return updated_block.with_changes(body=body, footer=footer)

    def leave_If(self, original_node, updated_node):
        body = original_node.body
        if original_node.orelse is not None or not isinstance(body, cst.IndentedBlock):
            return updated_node
        if not body.body or not all(statement in self._removed for statement in body.body):
            return updated_node
        self._removed.add(original_node)
        self.ctx.fix(original_node, "removed an if whose statements only wrapped the model")
        return cst.RemoveFromParent()


def _unprefixed(state_dict: cst.BaseExpression, paths: list[str]) -> cst.BaseExpression:
    """``state_dict`` with its keys under a removed wrapper renamed: ``module.x`` -> ``x`` (path
    ``""``), ``features.module.x`` -> ``features.x`` (path ``"features."``)."""
    key = 'key.removeprefix("module.")' if "" in paths else "key"
    for path in (path for path in paths if path):
        key = f'key.replace("{path}module.", "{path}", 1) if key.startswith("{path}module.") else {key}'
    comprehension = cst.parse_expression(f"{{{key}: value for key, value in state_dict.items()}}")
    if type(state_dict) not in (cst.Name, cst.Attribute, cst.Call, cst.Subscript):
        state_dict = state_dict.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    items = comprehension.for_in.iter
    return comprehension.with_changes(for_in=comprehension.for_in.with_changes(
        iter=items.with_changes(func=items.func.with_changes(value=state_dict))))


def _renames_wrapper_keys(ctx, state_dict: cst.BaseExpression) -> bool:
    """Whether ``state_dict`` is ``_unprefixed``'s comprehension."""
    return type(state_dict) is cst.DictComp and 'module."' in ctx.code(state_dict.key)


def _counts_devices(facts: Facts, value: cst.BaseExpression) -> bool:
    return type(value) is cst.Call and facts.file.qualname(value.func) in _DEVICE_COUNTS


def _multiplies_by(facts: Facts, statement, counts: set[str]) -> bool:
    """Whether ``statement`` multiplies by the device count (a name assigned it, or the call)."""
    if type(statement) is cst.AugAssign:
        return type(statement.operator) is cst.MultiplyAssign and (
            dotted(statement.value) in counts or _counts_devices(facts, statement.value))
    found = False

    def enter(node) -> bool:
        nonlocal found
        if type(node) is cst.BinaryOperation and type(node.operator) is cst.Multiply:
            found = any(dotted(side) in counts or _counts_devices(facts, side) for side in (node.left, node.right))
        return not found

    walk(statement.value, enter)
    return found


def _is_pass(statement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Pass)
    )


def _comments(statement: cst.CSTNode) -> list[cst.EmptyLine]:
    """The comment lines of a statement and of the statements nested in it, in order."""
    found = [line for line in getattr(statement, "leading_lines", ()) if line.comment is not None]
    trailing = getattr(statement, "trailing_whitespace", None)
    if trailing is not None and trailing.comment is not None:
        found.append(cst.EmptyLine(comment=trailing.comment))
    body = getattr(statement, "body", None)
    if isinstance(body, cst.IndentedBlock):
        if body.header.comment is not None:
            found.append(cst.EmptyLine(comment=body.header.comment))
        for inner in body.body:
            found += _comments(inner)
    return [cst.EmptyLine(comment=line.comment) for line in found]


def _index(body: list, following, original_body, removed) -> int:
    """Where ``following`` (an original statement) is in the updated ``body``: itself when no
    rule changed it, else an equal statement, else its position among the statements that were not removed."""
    for index, statement in enumerate(body):
        if statement is following:
            return index
    for index, statement in enumerate(body):
        if statement.deep_equals(following):
            return index
    kept = [s for s in original_body if s not in removed]
    return min(kept.index(following), len(body) - 1)
