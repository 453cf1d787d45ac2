import libcst as cst

from accrewrite.nodes import call_arg, string_value
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.toolbox import moves_to_cuda, quoted_like

_FRAMEWORK = "accelerate"
_ACCELERATOR = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
# mixed_precision values Accelerate runs with on every device, and the one to replace.
_KEPT_PRECISIONS = frozenset({"no", "bf16"})
_FP16 = "fp16"
_CUDA = "cuda"  # x.cuda(), device="cuda"
_LAUNCH_HELP = (
    "Run `accelerate config`, choose TPU (torch_xla) as the compute environment, then start the script with "
    "`accelerate launch train.py`: Accelerate places the model, shards the loaders and reduces the gradients on "
    "the XLA device itself (a plain `python train.py` takes the one device torch_xla finds). Off TPUs "
    "(PJRT_DEVICE=CPU or CUDA) Accelerate reads the local rank from LOCAL_RANK alone: set LOCAL_RANK=0 for one "
    "process, or `accelerator.print` and `is_local_main_process` find no main process. On TPUs its bf16 "
    "holds the weights and optimizer state in bfloat16 too (it sets XLA_USE_BF16); mixed_precision=\"no\" keeps "
    "them in float32."
)
_NO_TARGET_HELP = (
    "Accelerate chooses the device and reduces gradients itself, and knows CUDA, the CPU and XLA devices "
    "(through torch_xla), not this target: the script trains as before on CUDA or the CPU "
    "(`accelerate launch train.py`), and `--target torch_xla` migrates it to XLA devices."
)


class AccelerateConfig(Rule):
    """A Hugging Face Accelerate script trains on the target's device through Accelerate itself.

    `Accelerator()` places the model, shards the loaders and reduces gradients on the device its
    configuration names (`accelerate config`, or the one it finds: torch_xla's where torch_xla
    is installed); `accelerator.prepare(...)` and `accelerator.backward(loss)` stay as they are.
    Where the target spells Accelerate's precision for its device (torch_xla), what the script
    chose for CUDA becomes what Accelerate runs there:

    - `mixed_precision="fp16"` -> the target's (torch_xla: `"bf16"`: Accelerate refuses fp16
      on TPUs, and on XLA GPUs it needs torch_xla's GradScaler, which torch_xla 2.9 removed;
      bfloat16 is what XLA devices compute in and needs no loss scaling; on TPUs Accelerate's bf16 sets XLA_USE_BF16, which
      holds the weights and optimizer state in bfloat16 too, as the launch note says);
      `"bf16"` and `"no"` stay;
    - one diagnostic per file names how to launch it: `accelerate config` (choose TPU/XLA as the
      compute environment), then `accelerate launch train.py`; off TPUs (`PJRT_DEVICE=CPU` or
      `CUDA`) Accelerate reads the local rank from `LOCAL_RANK` alone, which one process sets to
      0, else `accelerator.print` and `is_local_main_process` find no main process;
    - a precision the rule cannot see (`mixed_precision=args.mixed_precision`,
      `Accelerator(**kwargs)`) or cannot run there (`"fp8"`) is reported, with what to give;
    - `.cuda()`, `.to("cuda")` and `device="cuda"` in the file are reported: they fail where
      CUDA is absent, and Accelerate places what `prepare` gets (put anything else on
      `accelerator.device`).

    On a target without it (runtime, TorchAcc) the Accelerator is left as it is, and reported:
    Accelerate trains on CUDA and the CPU by itself. Host syncs and dynamic shapes in the
    training loop are reported by ACC101 and ACC103 as in any script.
    """

    code = "ACC019"
    name = "accelerate-config"
    summary = "Accelerate: Accelerator(mixed_precision='fp16') -> the target's precision; how to launch it"
    manages = frozenset({_FRAMEWORK})
    triggers = frozenset({"Accelerator", _CUDA})
    examples = (
        Example(
            target="torch_xla",
            before="""
            from accelerate import Accelerator

            accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            """,
            after="""
            from accelerate import Accelerator

            accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            """,
            diagnostics=("ACC019:3",),
        ),
        Example(
            target="torch_xla",
            before="""
            from accelerate import Accelerator

            accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
            """,
            diagnostics=("ACC019:3", "ACC019:3"),
        ),
        Example(
            before="""
            from accelerate import Accelerator

            accelerator = Accelerator(mixed_precision="fp16")
            """,
            diagnostics=("ACC019:3",),
        ),
    )

    def applies(self) -> bool:
        return self.ctx.facts.framework == _FRAMEWORK

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._said = False

    def leave_Call(self, original_node, updated_node):
        func = original_node.func
        if self.ctx.facts.file.qualname(func) in _ACCELERATOR:
            return self._accelerator(original_node, updated_node)
        if self._has_precision() and moves_to_cuda(self.ctx.facts, original_node):
            self.ctx.diagnose(original_node, f"`{excerpt(self.ctx.code(original_node))}` needs CUDA, which the "
                              "target's device is not",
                              "Accelerate places what `accelerator.prepare` gets on the target's device: leave "
                              "those out, and put anything else on `accelerator.device`.")
        return updated_node

    def _has_precision(self) -> bool:
        return self.ctx.target.has("accelerate_mixed_precision")

    def _accelerator(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self._has_precision():
            self._once(original, f"Accelerate has no device for the {self.ctx.target.name} target: left as it is",
                       _NO_TARGET_HELP)
            return updated
        self._once(original, "Accelerate trains on the device `accelerate config` names: choose TPU/XLA there",
                   _LAUNCH_HELP)
        bf16 = self.ctx.concept("accelerate_mixed_precision").render_expr()
        starred = next((arg for arg in original.args if arg.star), None)
        precision = call_arg(original, 99, "mixed_precision")
        if precision is None:
            if starred is not None:
                self._unseen(original, excerpt(self.ctx.code(starred), 30), bf16)
            return updated
        value = string_value(precision.value)
        if value == _FP16:
            return self._precision(original, updated, precision)
        if value is None:
            self._unseen(original, excerpt(self.ctx.code(precision.value), 30), bf16)
        elif value not in _KEPT_PRECISIONS:
            self.ctx.diagnose(original, f"mixed_precision={value!r} does not run on the target's device",
                              f"Give mixed_precision={bf16} (or \"no\"): Accelerate's other precisions need CUDA.")
        return updated

    def _precision(self, original: cst.Call, updated: cst.Call, precision: cst.Arg) -> cst.Call:
        new = self.ctx.expr("accelerate_mixed_precision")
        args = [arg.with_changes(value=quoted_like(arg.value, new)) if arg.keyword is not None
                and arg.keyword.value == "mixed_precision" else arg for arg in updated.args]
        self.ctx.fix(original, f"mixed_precision={self.ctx.code(new)}: the target's device runs no fp16 loss scaling")
        return updated.with_changes(args=args)

    def _unseen(self, node: cst.Call, source: str, bf16: str) -> None:
        self.ctx.diagnose(node, f"mixed_precision is {source}: give the Accelerator {bf16}, not 'fp16'",
                          f"Accelerate's fp16 does not run on the target's device (no loss scaling there): pass "
                          f"{bf16} (or \"no\") there, or choose it in `accelerate config`.")

    def _once(self, node: cst.Call, message: str, help: str) -> None:
        """What the file's first Accelerator is told about the whole file."""
        if not self._said:
            self._said = True
            self.ctx.diagnose(node, message, help)
