from types import MappingProxyType

import libcst as cst

from accrewrite.nodes import call_arg, descendants, dotted, string_value, walk
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.toolbox import with_commas

# Autocast callables that are CUDA-only, and their positional parameters.
_CUDA_AUTOCAST = frozenset({"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"})
_CUDA_AUTOCAST_PARAMETERS = ("enabled", "dtype", "cache_enabled")
# Device-generic autocast callables: CUDA when their device type says so.
_AUTOCAST = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
_AUTOCAST_PARAMETERS = ("device_type", "dtype", "enabled", "cache_enabled")
_CUDA_SCALER = frozenset({"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"})
_SCALER = frozenset({"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"})
_SCALER_PARAMETERS = ("device", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
# Modules whose autocast/GradScaler are CUDA's: imports from them are re-pointed.
_CUDA_AMP_MODULES = frozenset({"torch.cuda.amp"})
_CONCEPT_OF = MappingProxyType({"autocast": "autocast", "GradScaler": "grad_scaler"})


class Amp(Rule):
    """CUDA automatic mixed precision -> the target's AMP.

    TorchAcc's migration guide, "Integrate with mixed precision": AMP code stays as PyTorch's, with the target's
    `autocast` and `GradScaler` (`from torchacc.torch_xla.amp import autocast, GradScaler`).
    Rewritten: `torch.cuda.amp.autocast(...)`, `torch.amp.autocast("cuda", ...)`,
    `torch.autocast(device_type=...)` (a device type given as a variable, as nanoGPT's
    `device_type`, is taken to be the training device; `"cpu"` autocast is left alone),
    `torch.cuda.amp.GradScaler(...)`, `torch.amp.GradScaler("cuda", ...)`, and the import
    `from torch.cuda.amp import autocast, GradScaler`, which is re-pointed at the target's
    module so that call sites stay as they are (the guide's guarded form). The target's autocast
    picks its device itself: the device argument is dropped and positional arguments become
    keywords; `enabled`, `dtype` and `cache_enabled` are kept.

    Where the target has no CUDA-style AMP (torch_xla 2.9: no `GradScaler`, and autocast on
    its CPU backend only as `torch.autocast('xla', dtype=torch.bfloat16)`), the rewrite is
    code that runs there, with a diagnostic: autocast becomes bfloat16 autocast on the target
    device (bfloat16 has float32's range, so no loss scaling is needed), and a GradScaler
    becomes PyTorch's scaler *disabled*, so `scaler.scale(loss).backward()`,
    `scaler.unscale_`, `scaler.step` and `scaler.update` still run, as plain calls.

    Left as it is and reported (ACC007): `autocast(*args)`/`GradScaler(**kwargs)`, a call whose
    target name is already bound to something else in the file, and autocast/GradScaler passed
    around uncalled where the target has no CUDA-style one.
    """

    code = "ACC007"
    name = "amp"
    summary = "CUDA autocast / GradScaler (torch.cuda.amp.*, torch.amp.*('cuda')) -> the target's AMP"
    concepts = ("autocast",)
    triggers = frozenset({"autocast", "GradScaler", "amp"})  # "amp": its import, dropped with its uses
    examples = (
        Example(
            before="""
            import torch

            scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))
            ctx = torch.amp.autocast(device_type=device_type, dtype=ptdtype)
            with torch.cuda.amp.autocast():
                loss = model(x)
            """,
            after="""
            import torch
            from accrewrite.runtime.amp import GradScaler
            from accrewrite.runtime.amp import autocast

            scaler = GradScaler(enabled=(dtype == 'float16'))
            ctx = autocast(dtype=ptdtype)
            with autocast():
                loss = model(x)
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import torch
            from torch.cuda.amp import autocast, GradScaler

            scaler = GradScaler()
            with autocast():
                loss = model(x)
            """,
            after="""
            import torch
            from torchacc.torch_xla.amp import autocast, GradScaler

            scaler = GradScaler()
            with autocast():
                loss = model(x)
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            import torch
            from torch.cuda.amp import autocast, GradScaler

            scaler = GradScaler(init_scale=1024)
            with autocast(dtype=torch.float16):
                loss = model(x)
            """,
            after="""
            import torch

            scaler = torch.amp.GradScaler('xla', enabled=False)
            with torch.autocast('xla', dtype=torch.bfloat16):
                loss = model(x)
            """,
        ),
        Example(  # left as it is, and reported
            before="""
            import torch

            with torch.cuda.amp.autocast(*amp_args):
                loss = model(x)
            """,
            diagnostics=("ACC007:3",),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Local names imported from torch.cuda.amp that the import rewrite re-points at the
        # target's own autocast/GradScaler: their call sites need no change.
        self._repointed: set[str] = set()
        # Local names of torch.amp's device-generic autocast/GradScaler (``from torch.amp import
        # autocast``) where the target spells its own by the same name: re-pointed too when every
        # call is a CUDA one (their device argument is dropped), else left to torch.amp.
        self._generic: dict[str, str] = {}
        self._clashes: set[str] = set()
        self._called: set[cst.CSTNode] = set()  # callees seen, to tell names passed around
        self._uncalled = _uncalled_names(ctx.module, {
            local for local, qualified in ctx.facts.file.imports.items()
            if qualified.rpartition(".")[0] in _CUDA_AMP_MODULES
        })
        for local, qualified in ctx.facts.file.imports.items():
            module, _, name = qualified.rpartition(".")
            if name not in _CONCEPT_OF or self._bare(name) is None:
                continue
            if module in _CUDA_AMP_MODULES:
                self._repointed.add(local)
            elif qualified in _AUTOCAST or qualified in _SCALER:
                self._generic[local] = qualified
            elif local == self.ctx.target.concept(_CONCEPT_OF[name]).expr:
                self._clashes.add(local)
        if self._generic:
            for local, found in _calls_of(ctx.module, set(self._generic)).items():
                keyword = "device_type" if self._generic[local] in _AUTOCAST else "device"
                if not all(self._on_cuda(call, keyword) for call in found):
                    self._clashes.add(local)
            for local in self._clashes:
                self._generic.pop(local, None)

    def _bare(self, name: str) -> str | None:
        """The target's import line when it spells ``name`` as that very name imported from a
        module (``from M import autocast``), else None."""
        target = self.ctx.target
        concept = _CONCEPT_OF[name]
        if not target.has(concept):
            return None
        spelled = target.concept(concept)
        if spelled.expr != name or len(spelled.imports) != 1:
            return None
        line = target.import_line(spelled.imports[0])
        return line if line.startswith("from ") and line.endswith(f" import {name}") else None

    def _callee(self, concept: str) -> cst.BaseExpression:
        """The target's spelling; a bare name that a re-pointed import already binds needs no
        import of its own."""
        name = self.ctx.target.concept(concept).expr
        if name in self._repointed or name in self._generic:
            return cst.Name(name)
        return self.ctx.expr(concept)

    def _clash(self, call: cst.Call, concept: str) -> bool:
        """Whether the target's bare name for ``concept`` is already this file's name for
        something else that stays (torch.amp's autocast, also used for the CPU): then the call
        is left as it is, with a diagnostic."""
        name = self.ctx.target.concept(concept).expr
        if not name.isidentifier() or name in self._repointed or name in self._generic:
            return False
        line = self._bare(name) if name in _CONCEPT_OF else None
        bound = self.ctx.facts.file.imports.get(name)
        if bound is None or line is None:
            return False
        module = line[len("from "):line.index(" import ")]
        if bound == f"{module}.{name}":
            return False
        self.ctx.diagnose(
            call,
            f"{excerpt(self.ctx.code(call.func))}() left as it is: the name `{name}` is taken",
            f"The target's own is called {name}, which this file already binds to {bound}; import the "
            "target's under another name and call it here.",
        )
        return True

    # Imports ---------------------------------------------------------------------------------

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if len(original_node.body) != 1 or not isinstance(original_node.body[0], cst.ImportFrom):
            return updated_node
        node = original_node.body[0]
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return updated_node
        module_name = dotted(node.module)
        if module_name == "torch.cuda":
            return self._drop_amp_module(original_node, updated_node, node)
        generic = module_name not in _CUDA_AMP_MODULES
        if generic and not any(
            self.ctx.facts.file.imports.get(_local(alias)) == f"{module_name}.{_name(alias)}" and _local(alias) in self._generic
            for alias in node.names
        ):
            return updated_node
        kept, moved, dropped = [], {}, []
        for alias in node.names:
            name = _name(alias)
            if name not in _CONCEPT_OF or (generic and _local(alias) not in self._generic):
                kept.append(alias)
                continue
            line = self._bare(name)
            if line is not None:
                module = line[len("from "):line.index(" import ")]
                moved.setdefault(module, []).append(alias)
            elif _local(alias) in self._uncalled:
                kept.append(alias)  # passed around uncalled: its calls cannot be rewritten
                self.ctx.diagnose(
                    original_node,
                    f"{_local(alias)} is passed around uncalled; this target has no CUDA-style {name}",
                    "The import stays (it runs, without mixed precision); change the calls it reaches by hand.",
                )
            else:
                dropped.append(name)
        if not moved and not dropped:
            return updated_node
        statements = []
        config = self.ctx.module.config_for_parsing
        for module, aliases in moved.items():
            new = cst.parse_statement(f"from {module} import x", config=config)
            statements.append(new.with_changes(body=[new.body[0].with_changes(names=_aliases(aliases))]))
        if kept:
            statements.append(updated_node.with_changes(body=[node.with_changes(names=_aliases(kept))]))
        parts = [f"{', '.join(a.name.value for aliases in moved.values() for a in aliases)} from the target's AMP"] if moved else []
        if dropped:
            parts.append(f"dropped {', '.join(dropped)}: the target has none to import; call sites are rewritten")
        self.ctx.fix(original_node, f"from {module_name} import: " + "; ".join(parts))
        if not statements:
            return cst.RemoveFromParent()
        statements[0] = statements[0].with_changes(
            leading_lines=updated_node.leading_lines, trailing_whitespace=updated_node.trailing_whitespace
        )
        return cst.FlattenSentinel(statements) if len(statements) > 1 else statements[0]

    def _drop_amp_module(self, original_node, updated_node, node: cst.ImportFrom):
        """``from torch.cuda import amp`` used only as ``amp.autocast``/``amp.GradScaler``, which
        this rule rewrites: the import goes with them."""
        unused = [a for a in node.names if _name(a) == "amp" and _only_amp(self.ctx.module, _local(a))]
        if not unused:
            return updated_node
        kept = [a for a in node.names if a not in unused]
        self.ctx.fix(original_node, "from torch.cuda import amp: dropped, its autocast and GradScaler are the target's")
        if not kept:
            return cst.RemoveFromParent()
        return updated_node.with_changes(body=[node.with_changes(names=_aliases(kept))])

    # Calls -----------------------------------------------------------------------------------

    def visit_Call(self, node) -> None:
        self._called.add(node.func)

    def leave_Attribute(self, original_node, updated_node):
        """``torch.cuda.amp.autocast`` named without a call (``ctx = torch.cuda.amp.autocast if
        amp else nullcontext``): the target's callable where it has one by name."""
        if original_node in self._called:
            return updated_node
        callee = self.ctx.facts.file.qualname(original_node)
        concept = "autocast" if callee in _CUDA_AUTOCAST else "grad_scaler" if callee in _CUDA_SCALER else None
        if concept is None:
            return updated_node
        name = concept if concept == "autocast" else "GradScaler"
        if self._bare(name) is None or self._clash(original_node, concept):
            if self._bare(name) is None:
                self.ctx.diagnose(
                    original_node,
                    f"{callee} is passed around uncalled; this target has no CUDA-style {name}",
                    "Change the calls it reaches by hand (see `accrewrite explain ACC007`).",
                )
            return updated_node
        self.ctx.fix(original_node, f"{callee} -> the target's {name}")
        return self._callee(concept)

    def leave_Call(self, original_node, updated_node):
        callee = self.ctx.facts.file.qualname(original_node.func)
        if callee is None:
            return updated_node
        local = original_node.func.value if isinstance(original_node.func, cst.Name) else None
        repointed = local in self._repointed or local in self._generic
        if local in self._clashes and (callee in _AUTOCAST or callee in _SCALER):
            if self._on_cuda(original_node, "device_type" if callee in _AUTOCAST else "device"):
                self.ctx.diagnose(
                    original_node,
                    f"{local}() left as it is: the target's own is called {local} too",
                    f"{local}() is {callee}, which this file also calls for other devices: it stays CUDA AMP "
                    "(inactive off CUDA). Call the target's by hand here, imported under another name.",
                )
            return updated_node
        if callee in _CUDA_AUTOCAST:
            return self._autocast(original_node, updated_node, _CUDA_AUTOCAST_PARAMETERS, repointed)
        if callee in _AUTOCAST and self._on_cuda(original_node, "device_type"):
            return self._autocast(original_node, updated_node, _AUTOCAST_PARAMETERS, repointed)
        if callee in _CUDA_SCALER:
            return self._scaler(original_node, updated_node, _SCALER_PARAMETERS[1:], repointed)
        if callee in _SCALER and self._on_cuda(original_node, "device"):
            return self._scaler(original_node, updated_node, _SCALER_PARAMETERS, repointed)
        return updated_node

    def _on_cuda(self, call: cst.Call, keyword: str) -> bool:
        """Whether a device-generic AMP call is CUDA's: a "cuda" device, none (GradScaler's
        default), or an expression (the training device, as nanoGPT's ``device_type``)."""
        device = call_arg(call, 0, keyword)
        if device is None:
            return keyword == "device"
        text = string_value(device.value)
        if text is None:
            return not isinstance(device.value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString))
        return text == "cuda" or text.startswith("cuda:")

    @staticmethod
    def _named(original: cst.Call, updated: cst.Call, parameters) -> list[tuple[str, cst.Arg]]:
        named = []
        for position, (before, arg) in enumerate(zip(original.args, updated.args)):
            name = arg.keyword.value if arg.keyword is not None else parameters[position]
            if arg.keyword is None:
                arg = arg.with_changes(keyword=cst.Name(name), equal=_EQUAL)
            named.append((name, arg))
        return named

    def _arguments_by_keyword(self, original_node, updated_node, named, what: str):
        """A call whose import now names the target's ``what``: only its arguments may change,
        the device one dropped (the target's picks its device) and the others by keyword."""
        if len(named) == len(original_node.args) and all(a.keyword for a in updated_node.args):
            return updated_node
        self.ctx.fix(original_node, f"{what}: the target's picks its device; arguments by keyword")
        return updated_node.with_changes(args=with_commas([a for _, a in named]))

    def _by_hand(self, call: cst.Call, parameters, what: str) -> bool:
        """Whether ``call``'s arguments cannot all be named (``*args``/``**kwargs``, or more
        than ``parameters``): then it is reported, to be migrated by hand."""
        if not any(arg.star for arg in call.args) and len(call.args) <= len(parameters):
            return False
        self.ctx.diagnose(call, f"{what}(*args/**kwargs) left as it is",
                          f"Migrate this call to the target's {what} by hand.")
        return True

    def _autocast(self, original_node, updated_node, parameters, repointed):
        ctx = self.ctx
        if self._by_hand(original_node, parameters, "autocast"):
            return updated_node
        named = [(n, a) for n, a in self._named(original_node, updated_node, parameters) if n != "device_type"]
        if repointed and not ctx.target.has("autocast_device"):
            return self._arguments_by_keyword(original_node, updated_node, named, "autocast")
        if self._clash(original_node, "autocast"):
            return updated_node
        callee = self._callee("autocast")
        args = []
        if ctx.target.has("autocast_device"):
            args.append(cst.Arg(ctx.expr("autocast_device")))
        message = "autocast -> the target's autocast on its device"
        if ctx.target.has("autocast_dtype"):
            dtype = ctx.expr("autocast_dtype")
            given = dict(named).get("dtype")
            enabled = dict(named).get("enabled")
            disabled = enabled is not None and ctx.code(enabled.value) == "False"
            if not disabled and (given is None or ctx.code(given.value) != ctx.code(dtype)):
                was = ctx.code(given.value) if given is not None else "float16 (CUDA's default)"
                ctx.diagnose(
                    original_node,
                    f"autocast now runs in {ctx.code(dtype)} instead of {excerpt(was)}",
                    "This target's autocast supports only that dtype on its device; it has float32's range, "
                    "so no loss scaling is needed (the GradScaler is disabled).",
                )
            args.append(_keyword("dtype", dtype))
            named = [(n, a) for n, a in named if n != "dtype"]
            message += f" in {ctx.code(dtype)}"
        args += [a for _, a in named]
        ctx.fix(original_node, message)
        return updated_node.with_changes(func=callee, args=with_commas(args))

    def _scaler(self, original_node, updated_node, parameters, repointed):
        ctx = self.ctx
        if self._by_hand(original_node, parameters, "GradScaler"):
            return updated_node
        if not ctx.target.has("grad_scaler") and ctx.target.has("disabled_grad_scaler"):
            ctx.diagnose(
                original_node,
                "GradScaler is now disabled: this target has none",
                "The scaler is PyTorch's, disabled, so scaler.scale(), unscale_(), step() and update() "
                "pass through; autocast runs in bfloat16, which needs no loss scaling. Remove the scaler "
                "when the script no longer runs on CUDA.",
            )
            ctx.fix(original_node, "GradScaler -> a disabled scaler (the target has none)")
            return ctx.expr("disabled_grad_scaler")
        named = [(n, a) for n, a in self._named(original_node, updated_node, parameters) if n != "device"]
        if repointed:
            return self._arguments_by_keyword(original_node, updated_node, named, "GradScaler")
        if self._clash(original_node, "grad_scaler"):
            return updated_node
        callee = self._callee("grad_scaler")
        ctx.fix(original_node, "GradScaler -> the target's GradScaler on its device")
        return updated_node.with_changes(func=callee, args=with_commas([a for _, a in named]))


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(keyword=cst.Name(name), value=value, equal=_EQUAL)


def _aliases(aliases: list[cst.ImportAlias]) -> list[cst.ImportAlias]:
    fixed = []
    for position, alias in enumerate(aliases):
        if position == len(aliases) - 1:
            fixed.append(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        else:
            fixed.append(alias.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
    return fixed


def _name(alias: cst.ImportAlias) -> str | None:
    return alias.name.value if isinstance(alias.name, cst.Name) else None


def _local(alias: cst.ImportAlias) -> str | None:
    return alias.asname.name.value if alias.asname is not None else _name(alias)


def _calls_of(module: cst.Module, names: set[str]) -> dict[str, list[cst.Call]]:
    """The calls of some bare names in a module."""
    found: dict[str, list[cst.Call]] = {name: [] for name in names}
    for node in descendants(module):
        if type(node) is cst.Call and type(node.func) is cst.Name and node.func.value in found:
            found[node.func.value].append(node)
    return found


def _uncalled_names(module: cst.Module, names: set[str]) -> set[str]:
    """Which of ``names`` the module uses other than by calling them (``return autocast``)."""
    if not names:
        return set()
    # Names that are no uses: the functions called, and ``autocast`` of ``x.autocast``.
    others: set[cst.CSTNode] = set()
    used: list[cst.Name] = []
    for node in descendants(module, _IMPORTS):
        kind = type(node)
        if kind is cst.Call:
            others.add(node.func)
        elif kind is cst.Attribute:
            others.add(node.attr)
        elif kind is cst.Name and node.value in names:
            used.append(node)
    return {name.value for name in used if name not in others}


_IMPORTS = frozenset({cst.Import, cst.ImportFrom})


def _only_amp(module: cst.Module, local: str) -> bool:
    """Whether ``local`` (``torch.cuda.amp``) is used only as ``local.autocast`` and
    ``local.GradScaler``."""
    other_use = False

    def enter(node):
        nonlocal other_use
        if other_use or isinstance(node, (cst.Import, cst.ImportFrom)):
            return False
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == local:
            other_use = node.attr.value not in _CONCEPT_OF
            return False
        if isinstance(node, cst.Name) and node.value == local:
            other_use = True
        return True

    walk(module, enter)
    return not other_use

