import libcst as cst

from accrewrite.nodes import string_value
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.toolbox import moves_to_cuda, quoted_like

_FRAMEWORKS = frozenset({"lightning", "pytorch_lightning"})
# What trains on CUDA: Lightning's GPU accelerators, and "auto", the default, which picks CUDA.
_GPU_ACCELERATORS = frozenset({"gpu", "cuda", "auto"})
_GPU_ACCELERATOR_CLASS = "CUDAAccelerator"
# Precisions by their spellings (Lightning reads 16 and "16" as "16-mixed", "bf16" as "bf16-mixed").
_MIXED_PRECISIONS = frozenset({"16-mixed", "16", "bf16-mixed", "bf16"})
_TRUE_PRECISIONS = frozenset({"32-true", "32", "16-true", "bf16-true"})
# Every GPU, as Lightning spelled it for CUDA (-1), and every device of the accelerator, as it
# spells it for XLA ("auto"; its XLA accelerator takes 1 or every device).
_ALL = frozenset({-1, "-1"})
_ALL_DEVICES = cst.SimpleString("'auto'")
# Where the Trainer's arguments come from the command line or a config file.
_CONFIGURED = frozenset({"from_argparse_args", "LightningCLI"})
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
_LAUNCH_HELP = (
    "Launch the script with `python` (not torchrun or accrun); `devices=` is 1 or every device of the host. "
    "Lightning's XLA accelerator finds its devices by the host's TPU chips: under PJRT_DEVICE=CPU or CUDA it "
    "stops (\"XLAAccelerator can not run on your system\")."
)
_NO_TARGET_HELP = (
    "Lightning (its Trainer, Fabric) chooses the device and reduces gradients itself, and knows CUDA, the CPU "
    "and TPUs (through torch_xla), not this target: the script trains as before on CUDA or the CPU "
    "(`accelerator=\"auto\"` where CUDA may be absent; `python train.py`, Lightning starts its DDP processes "
    "itself), and `--target torch_xla` migrates it to TPUs."
)


class LightningTrainer(Rule):
    """A Lightning `Trainer` trains on the target's device through Lightning's own accelerator.

    Lightning's `Trainer` places the model, starts a process per device and reduces gradients
    itself: a Lightning script is migrated by its configuration, not by its loop. Where the
    target spells a Lightning accelerator (torch_xla: `accelerator='tpu'`, Lightning's
    XLAAccelerator), the Trainer's arguments become what Lightning runs on it with:

    - `accelerator="gpu"`, `"cuda"`, `"auto"` or `CUDAAccelerator()` (or none) -> the target's;
      the old `gpus=N` -> the target's accelerator and `devices=N`; every GPU (`gpus=-1`,
      `devices=-1`) -> `devices="auto"`, every device of the accelerator;
    - a DDP `strategy` (`"ddp"`, `"ddp_spawn"`, `DDPStrategy(...)`, a variable bound only to
      those) is removed: the accelerator brings its own strategy (one device, or XLA's for
      every device of the host);
    - mixed precision (`"16-mixed"`, `16`, `"bf16-mixed"`) -> the target's precision for it
      (torch_xla: `"32-true"`: Lightning's XLA precision has no mixed mode, and TPUs run
      float32 matrix products in bfloat16 passes by default); `"16-true"`, `"bf16-true"` and
      `"32-true"` stay;
    - `sync_batchnorm=True` is removed and reported: Lightning converts to torch's
      SyncBatchNorm, which fails on XLA tensors; each device then normalizes its own batch.

    Each migrated file gets one diagnostic on how it runs: Lightning starts the processes itself
    (`python train.py`, not torchrun), `devices=` is 1 or every device of the host, and
    Lightning's XLA accelerator finds its devices by the host's TPU chips, so under
    `PJRT_DEVICE=CPU` or `CUDA` it stops ("XLAAccelerator can not run on your system").

    A Trainer the rule cannot migrate soundly is left as it is, with a diagnostic naming what to
    set: arguments it cannot see (`Trainer(**vars(args))`, `Trainer.from_argparse_args(args)`,
    `LightningCLI`, whose arguments come from the command line or a YAML file, a subclass of the
    Trainer, which passes its own to `super().__init__`), one read from a variable, another
    accelerator (`"cpu"`), strategy (FSDP, DeepSpeed) or precision (`"64-true"`), or GPU
    indices (`devices=[0, 1]`). On a target without a Lightning accelerator (runtime,
    TorchAcc) every Trainer and Fabric is left as it is, and reported: Lightning trains on CUDA
    and the CPU by itself.

    `.cuda()`, `.to("cuda")` and `device="cuda"` in the file are reported there: they fail
    where CUDA is absent.

    A Lightning Fabric (`L.Fabric(accelerator="cuda", ...)`) is left as it is, with a diagnostic:
    on XLA its `fabric.setup(model, optimizer)` moves the model after the optimizer was built on
    its parameters, which the move replaces, so the optimizer would step the old ones; the
    script sets the model up first (`fabric.setup_module`), then its optimizer
    (`fabric.setup_optimizers`), and names the accelerator.

    The LightningModule's `training_step` is a step function for the diagnostics: host syncs
    (`.item()`, ACC101) and dynamic shapes (ACC103) there are reported as in any loop.
    """

    code = "ACC018"
    name = "lightning-trainer"
    summary = "Lightning Trainer(accelerator='gpu', strategy='ddp', precision='16-mixed') -> the target's accelerator"
    manages = _FRAMEWORKS
    triggers = frozenset({"Trainer", "Fabric", *_CONFIGURED, "cuda"})
    examples = (
        Example(
            target="torch_xla",
            before="""
            import lightning as L

            trainer = L.Trainer(accelerator="gpu", devices=4, strategy="ddp", precision="16-mixed", max_epochs=10)
            trainer.fit(model, train_loader)
            """,
            after="""
            import lightning as L

            trainer = L.Trainer(accelerator="tpu", devices=4, precision="32-true", max_epochs=10)
            trainer.fit(model, train_loader)
            """,
            diagnostics=("ACC018:3",),
        ),
        Example(
            target="torch_xla",
            before="""
            import pytorch_lightning as pl

            trainer = pl.Trainer(gpus=2, max_epochs=5)
            """,
            after="""
            import pytorch_lightning as pl

            trainer = pl.Trainer(accelerator='tpu', devices=2, max_epochs=5)
            """,
            diagnostics=("ACC018:3",),
        ),
        Example(
            target="torch_xla",
            before="""
            from lightning.pytorch import Trainer

            trainer = Trainer(**vars(args))
            """,
            diagnostics=("ACC018:3",),
        ),
        Example(
            target="torch_xla",
            before="""
            import lightning as L
            import torch


            class Denoiser(L.LightningModule):
                def training_step(self, batch, batch_idx):
                    noise = torch.randn(batch.shape, device="cuda")
                    return self.loss(self(batch + noise), batch)
            """,
            diagnostics=("ACC018:7",),
        ),
        Example(
            before="""
            import lightning as L

            trainer = L.Trainer(accelerator="gpu", devices=4, strategy="ddp")
            """,
            diagnostics=("ACC018:3",),
        ),
    )

    def applies(self) -> bool:
        return self.ctx.facts.framework in _FRAMEWORKS

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._said = False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = {self._lightning_name(base.value) for base in node.bases}
        if "LightningCLI" in bases:
            self._unseen(node, "the command line")  # class MyCLI(LightningCLI), called as MyCLI(...)
        elif "Trainer" in bases:
            self._unseen(node, f"the subclass {node.name.value}")  # its super().__init__(accelerator=...)

    def leave_Call(self, original_node, updated_node):
        name = self._lightning_name(original_node.func)
        if name == "Trainer":
            return self._trainer(original_node, updated_node)
        if name == "Fabric":
            self._fabric(original_node)
        elif name in _CONFIGURED:
            self._unseen(original_node, "the command line")
        elif self._accelerator() is not None and moves_to_cuda(self.ctx.facts, original_node):
            self.ctx.diagnose(original_node, f"`{excerpt(self.ctx.code(original_node))}` needs CUDA, which the "
                              "target's device is not",
                              "Lightning places the LightningModule and its batches on the accelerator's device: "
                              "leave the move out, and create other tensors on `self.device`.")
        return updated_node

    def _lightning_name(self, func: cst.BaseExpression) -> str | None:
        """``Trainer``, ``from_argparse_args`` (of the Trainer) or ``LightningCLI`` where ``func``
        names Lightning's."""
        parts = (self.ctx.facts.file.qualname(func) or "").split(".")
        if parts[0] not in _FRAMEWORKS:
            return None
        if parts[-1] == "from_argparse_args":
            return parts[-1] if parts[-2] == "Trainer" else None
        return parts[-1]

    # Where the Trainer is left as it is -------------------------------------------------------

    def _accelerator(self) -> str | None:
        """The target's Lightning accelerator, as code; None where it has none."""
        return self._spelled("lightning_accelerator") if self.ctx.target.has("lightning_accelerator") else None

    def _spelled(self, concept: str) -> str:
        """The target's spelling of ``concept``, for a message or a comparison (no import noted)."""
        return self.ctx.concept(concept).render_expr()

    def _unseen(self, node: cst.CSTNode, source: str) -> None:
        if self._unsupported(node):
            return
        accelerator = self._accelerator()
        self.ctx.diagnose(
            node, f"the Trainer's arguments come from {source}: set accelerator={accelerator} there",
            f"The rule cannot see them: set the accelerator to {accelerator} (`--accelerator` on the command line, "
            f"`--trainer.accelerator` or `trainer: accelerator:` in a LightningCLI's YAML config), leave out a DDP "
            f"strategy (the accelerator brings its own) and give a mixed precision as "
            f"{self._spelled('lightning_mixed_precision')}.",
        )

    def _unsupported(self, node: cst.CSTNode) -> bool:
        """Whether the target has no Lightning accelerator; the file's first Lightning object is told so."""
        if self._accelerator() is not None:
            return False
        self._once(node, f"Lightning has no accelerator for the {self.ctx.target.name} target: left as it is",
                   _NO_TARGET_HELP)
        return True

    def _once(self, node: cst.CSTNode, message: str, help: str) -> None:
        """What the file's first Trainer is told about the whole file."""
        if not self._said:
            self._said = True
            self.ctx.diagnose(node, message, help)

    def _left(self, node: cst.Call, what: str) -> None:
        self.ctx.diagnose(
            node, f"{what}: Trainer left as it is",
            f"Lightning runs on the target with accelerator={self._accelerator()} and the strategy that accelerator "
            f"brings, a mixed precision there as {self._spelled('lightning_mixed_precision')}: set them and migrate "
            "again, or train on as before.",
        )

    def _fabric(self, node: cst.Call) -> None:
        if self._unsupported(node):
            return
        accelerator = self._accelerator()
        self.ctx.diagnose(
            node, f"Lightning Fabric is left as it is: it needs accelerator={accelerator} and its setup reordered",
            f"Give Fabric accelerator={accelerator} (the strategy comes with it; a mixed precision there is "
            f"{self._spelled('lightning_mixed_precision')}). There the model's move to the device replaces its "
            "parameters, so an optimizer built before `fabric.setup(model, optimizer)` steps the old ones: set the "
            "model up first (`model = fabric.setup_module(model)`), then build the optimizer and "
            "`optimizer = fabric.setup_optimizers(optimizer)`.",
        )

    # The Trainer's arguments -----------------------------------------------------------------

    def _trainer(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if self._unsupported(original):
            return updated
        starred = next((arg for arg in original.args if arg.star), None)
        if starred is not None:
            self._unseen(original, excerpt(self.ctx.code(starred), 30))
            return updated
        blocker = next(filter(None, map(self._blocker, original.args)), None)
        if blocker is not None:
            self._left(original, blocker)
            return updated
        return self._migrated(original, updated)

    def _blocker(self, arg: cst.Arg) -> str | None:
        """What stops the Trainer's migration in ``arg``, else None."""
        keyword = arg.keyword.value if arg.keyword is not None else None
        value = arg.value
        if keyword == "accelerator" and not self._is_gpu_accelerator(value) and not self._is_target_accelerator(value):
            return f"accelerator={excerpt(self.ctx.code(value), 30)}"
        if keyword == "strategy" and not _kept_strategy(value) and not self._is_ddp(value):
            return f"strategy={excerpt(self.ctx.code(value), 30)}"
        if keyword == "precision" and _precision(value) not in _MIXED_PRECISIONS | _TRUE_PRECISIONS:
            return f"precision={excerpt(self.ctx.code(value), 30)}"
        if keyword in ("devices", "gpus") and (isinstance(value, (cst.List, cst.Tuple)) and len(value.elements) > 1
                                               or isinstance(string_value(value), str) and "," in string_value(value)):
            return f"{keyword}={excerpt(self.ctx.code(value), 30)} lists GPU indices"
        return None

    def _is_gpu_accelerator(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Call):
            return (self.ctx.facts.file.qualname(value.func) or "").split(".")[-1] == _GPU_ACCELERATOR_CLASS
        return _literal(value) in _GPU_ACCELERATORS

    def _is_target_accelerator(self, value: cst.BaseExpression) -> bool:
        return _literal(value) == _literal(cst.parse_expression(self._spelled("lightning_accelerator")))

    def _is_ddp(self, value: cst.BaseExpression) -> bool:
        """A DDP strategy: by name, built (``DDPStrategy(...)``), or a variable the file binds only
        to those (or to Lightning's choice)."""
        if isinstance(value, cst.Call):
            return (self.ctx.facts.file.qualname(value.func) or "").split(".")[-1] == "DDPStrategy"
        if isinstance(value, cst.IfExp):
            return all(self._is_ddp(branch) or _kept_strategy(branch) for branch in (value.body, value.orelse))
        if isinstance(value, cst.Name):
            bound = self.ctx.facts.file.assignments.get(value.value, ())
            return bool(bound) and all(self._is_ddp(v) or _kept_strategy(v) for v in bound if v is not value)
        literal = _literal(value)
        return isinstance(literal, str) and literal.startswith("ddp")

    def _migrated(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        args: list[cst.Arg] = []
        changed: list[str] = []
        accelerator = self.ctx.expr("lightning_accelerator")
        has_accelerator = any(arg.keyword is not None and arg.keyword.value == "accelerator" for arg in updated.args)
        for arg in updated.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            literal = _literal(arg.value)
            if keyword == "accelerator" and not self._is_target_accelerator(arg.value):
                args.append(arg.with_changes(value=quoted_like(arg.value, accelerator)))
                changed.append(f"accelerator={self.ctx.code(accelerator)}")
            elif keyword == "gpus":
                if not has_accelerator:
                    args.append(cst.Arg(keyword=cst.Name("accelerator"), value=accelerator, equal=_EQUAL, comma=_COMMA))
                    has_accelerator = True
                devices = _ALL_DEVICES if literal in _ALL else arg.value
                args.append(arg.with_changes(keyword=cst.Name("devices"), value=devices))
                changed.append(f"gpus -> devices={self.ctx.code(devices)}")
            elif keyword == "devices" and literal in _ALL:
                args.append(arg.with_changes(value=quoted_like(arg.value, _ALL_DEVICES)))
                changed.append("devices='auto'")
            elif keyword == "strategy" and not _kept_strategy(arg.value):
                _drop(args, arg)
                changed.append("DDP strategy removed (the accelerator brings its own)")
                if _devices(original) == 1:
                    self.ctx.diagnose(original, "one device: Lightning no longer shuffles the training loader for DDP",
                                      "Under a DDP strategy Lightning gives the training loader a DistributedSampler, "
                                      "which shuffles it; on one device its own sampler stays: pass shuffle=True to "
                                      "the DataLoader where the order mattered.")
            elif keyword == "precision" and _precision(arg.value) in _MIXED_PRECISIONS:
                precision = self.ctx.expr("lightning_mixed_precision")
                args.append(arg.with_changes(value=quoted_like(arg.value, precision)))
                changed.append(f"precision={self.ctx.code(precision)}")
            elif keyword == "sync_batchnorm" and _literal(arg.value) is not False:
                _drop(args, arg)
                self.ctx.diagnose(original, "sync_batchnorm removed: each device normalizes its own batch",
                                  "Lightning's sync_batchnorm converts to torch's SyncBatchNorm, which fails on the "
                                  "target's device; with small per-device batches the statistics are noisier than "
                                  "over the global batch.")
                changed.append("sync_batchnorm removed")
            else:
                args.append(arg)
        if not has_accelerator:
            args.insert(0, cst.Arg(keyword=cst.Name("accelerator"), value=accelerator, equal=_EQUAL,
                                   comma=_COMMA if args else cst.MaybeSentinel.DEFAULT))
            changed.insert(0, f"accelerator={self.ctx.code(accelerator)}")
        if not changed:
            return updated
        self.ctx.fix(original, "Trainer on the target's device: " + ", ".join(changed))
        self._once(original, f"Lightning starts a process per device for accelerator={self._accelerator()} itself",
                   _LAUNCH_HELP)
        return updated.with_changes(args=args)


def _literal(value: cst.BaseExpression):
    """The value of a string, integer or True/False literal, else None."""
    if isinstance(value, cst.Integer):
        return int(value.value)
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus) and isinstance(value.expression, cst.Integer):
        return -int(value.expression.value)
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        return value.value == "True"
    return string_value(value)


def _kept_strategy(value: cst.BaseExpression) -> bool:
    """Lightning's choice ("auto"), or one of its XLA strategies ("xla", "single_xla"): already
    what the accelerator brings."""
    literal = _literal(value)
    return literal == "auto" or isinstance(literal, str) and "xla" in literal


def _precision(value: cst.BaseExpression) -> str | None:
    """A precision literal as Lightning reads it, a string (``16`` is ``"16"``)."""
    literal = _literal(value)
    return str(literal) if type(literal) is int else literal


def _devices(call: cst.Call):
    """The number of devices the Trainer ``call`` names as a literal (``devices=`` or ``gpus=``)."""
    return next((_literal(arg.value) for arg in call.args
                 if arg.keyword is not None and arg.keyword.value in ("devices", "gpus")), None)


def _drop(args: list[cst.Arg], dropped: cst.Arg) -> None:
    """Leave ``dropped`` out of the arguments being built (``args``, those before it): the one
    before takes its comma, which is the last's (none, or a trailing one with its line break)
    where it was the last, and like its own elsewhere."""
    if args:
        args[-1] = args[-1].with_changes(comma=dropped.comma)
