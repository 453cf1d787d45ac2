import libcst as cst

from accrewrite.imports import first_import
from accrewrite.nodes import call_arg, string_value
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.toolbox import quoted_like, with_keywords

# The classes that hold a Trainer's settings; and every config of trl's trainers (SFTConfig,
# GRPOConfig, DPOConfig...), each a subclass of TrainingArguments.
_TRAINING_ARGUMENTS = frozenset({
    "transformers.TrainingArguments",
    "transformers.training_args.TrainingArguments",
    "transformers.Seq2SeqTrainingArguments",
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
})


def _holds_settings(qualname: str | None) -> bool:
    return qualname in _TRAINING_ARGUMENTS or (qualname or "").startswith("trl.") and qualname.endswith("Config")
_PARSERS = frozenset({"transformers.HfArgumentParser", "transformers.hf_argparser.HfArgumentParser", "trl.TrlParser"})
# The Trainer's default optimizer under torch 2.8+, which takes no XLA tensors.
_FUSED_OPTIMIZERS = frozenset({"adamw_torch_fused"})
# Mixed precision flags and the part of their name that the target's spelling replaces.
_HALF_PRECISION = ("fp16", "fp16_full_eval")
# Settings that train on many devices: the script runs a process per device.
_MANY_DEVICES = ("fsdp", "fsdp_config", "ddp_backend", "ddp_find_unused_parameters", "ddp_bucket_cap_mb")
# Why each setting the rule adds, in its fix's message.
_ADDED = {
    "optim": "torch's fused AdamW, the default, takes no tensors of the target's device",
    "dataloader_drop_last": "an epoch's last partial batch is dropped (its shape would compile a new graph)",
}

_AS_IT_IS_HELP = (
    "The Trainer places the model and reduces gradients itself, through Accelerate, on the device "
    "PyTorch has (CUDA, else the CPU), and needs nothing of the target there. Start a process per "
    "device with `torchrun --nproc_per_node N script.py`; ACC101 and ACC103 still report its "
    "callbacks, collators and metrics."
)


class HfTrainer(Rule):
    """Migrate a script that trains with Hugging Face's `Trainer` by its settings.

    A `Trainer` (`Seq2SeqTrainer`, trl's `SFTTrainer`, a subclass of the file's) runs the
    training loop itself: the other fixes leave such a file alone, and this rule changes what
    the Trainer is told, per target:

    - where the target has a setup call for the Trainer (TorchAcc's `accelerate_hf_trainer()`),
      it goes at the top of the file, before transformers is imported, as TorchAcc's
      documentation says;
    - where the Trainer's mixed precision is not the target's, `fp16=True` becomes the target's
      flag: on torch_xla `bf16=True` (Accelerate refuses fp16 on TPUs; bfloat16 needs no loss
      scaling), `fp16_full_eval` likewise;
    - where torch's fused AdamW, the Trainer's default optimizer under torch 2.8+, does not run
      on the target's device (XLA tensors), `optim="adamw_torch"` is set (in place of an
      explicit `"adamw_torch_fused"` too);
    - where execution is lazy (XLA), `dataloader_drop_last=True` is set: a last batch smaller
      than the others compiles a new graph. It drops that batch each epoch. Padding to each
      batch's longest sample (`DataCollatorWithPadding` without `pad_to_multiple_of`,
      `padding=True`) compiles a graph per length: ACC103 reports it with what to change.

    A `TrainingArguments` that this rule cannot read whole (built from `**kwargs`, or not built
    in the file: `HfArgumentParser`, a YAML or JSON file) is reported with the settings to give
    it, as command-line flags (`--bf16 --optim adamw_torch --dataloader_drop_last`) or keywords;
    so is `training_args.fp16 = True` set on the settings after they are made.
    On torch_xla, settings that train on many devices (`fsdp`, `ddp_*`) get one line on how to
    start a process per device (`torch_xla.launch(_mp_fn)`, as HF's `xla_spawn.py` does with
    the `_mp_fn(index)` its examples define); FSDP on XLA is torch_xla's, chosen with
    `fsdp_config={"xla": True}`. Where the target needs none of this (runtime: the Trainer
    trains through Accelerate on the device PyTorch has, as the runtime would), one line says
    so and how to start many processes; the runtime's compiler cannot be the Trainer's
    `torch_compile_backend`, as Accelerate takes only the dynamo backends it lists. Only a file that builds a Trainer is concerned:
    one that imports transformers for a model and trains it in its own loop is migrated as any
    other. Host reads and changing shapes in the Trainer's callbacks (`TrainerCallback`
    subclasses), its subclass's methods, the collator and `preprocess_logits_for_metrics` are
    reported by ACC101 and ACC103, as in any training loop (`compute_metrics` is not: it is
    given numpy arrays, read from the device once per evaluation), and so is the Trainer's
    default collator, which pads each batch to its longest sample.
    """

    code = "ACC017"
    name = "hf-trainer"
    summary = "Hugging Face Trainer scripts: the target's setup call and TrainingArguments"
    manages = frozenset({"transformers"})
    triggers = frozenset({"TrainingArguments", "Seq2SeqTrainingArguments", "SFTConfig", "GRPOConfig", "DPOConfig",
                          *_HALF_PRECISION})
    examples = (
        Example(
            target="torch_xla",
            before="""
            from transformers import Trainer, TrainingArguments

            args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, fp16=True)
            Trainer(model=model, args=args, train_dataset=dataset).train()
            """,
            after="""
            from transformers import Trainer, TrainingArguments

            args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, bf16=True, optim="adamw_torch", dataloader_drop_last=True)
            Trainer(model=model, args=args, train_dataset=dataset).train()
            """,
        ),
        Example(
            target="torchacc",
            before="""
            import torch
            from transformers import Trainer, TrainingArguments

            args = TrainingArguments(
                output_dir="out",
                fp16=True,
            )
            Trainer(model=model, args=args, train_dataset=dataset).train()
            """,
            after="""
            import torchacc
            torchacc.accelerate_hf_trainer()
            import torch
            from transformers import Trainer, TrainingArguments

            args = TrainingArguments(
                output_dir="out",
                fp16=True,
                optim="adamw_torch",
                dataloader_drop_last=True,
            )
            Trainer(model=model, args=args, train_dataset=dataset).train()
            """,
        ),
        Example(
            target="torch_xla",
            before="""
            from transformers import HfArgumentParser, Trainer, TrainingArguments

            def main():
                parser = HfArgumentParser((ModelArguments, TrainingArguments))
                model_args, training_args = parser.parse_args_into_dataclasses()
                Trainer(model=model, args=training_args, train_dataset=dataset).train()
            """,
            diagnostics=("ACC017:4",),
        ),
        Example(
            before="""
            from transformers import Trainer, TrainingArguments

            args = TrainingArguments(output_dir="out", fp16=True)
            Trainer(model=model, args=args, train_dataset=dataset).train()
            """,
            diagnostics=("ACC017:4",),
        ),
    )

    def applies(self) -> bool:
        return self.ctx.facts.framework in self.manages and bool(self.ctx.facts.trainer_builds)

    def visit_Module(self, node: cst.Module) -> None:
        self._settings = self._needed_settings()
        calls = [call for call, _ in self.ctx.facts.file.calls]
        self._arguments = {call for call in calls if _holds_settings(self.ctx.facts.file.qualname(call.func))}
        self._set_up(node)
        if not self._settings:
            if not self.ctx.target.has("trainer_setup"):
                self.ctx.diagnose(self.ctx.facts.trainer_builds[0],
                                  "Hugging Face's Trainer trains this script as it is on this target", _AS_IT_IS_HELP)
            return
        if not self._arguments:
            self._report_unseen(calls)

    def _needed_settings(self) -> dict[str, str]:
        """What the Trainer's settings must say on this target: keyword -> value as code."""
        target = self.ctx.target
        settings = {}
        if target.has("trainer_precision"):
            settings[self._precision("fp16")] = "True"
        if target.has("trainer_optimizer"):
            settings["optim"] = target.concept("trainer_optimizer").render_expr()
        if target.has("lazy_execution"):
            settings["dataloader_drop_last"] = "True"
        return settings

    def _precision(self, flag: str) -> str:
        """The target's mixed precision flag in place of ``flag`` (``fp16_full_eval`` ->
        ``bf16_full_eval``)."""
        return flag.replace("fp16", self.ctx.target.concept("trainer_precision").render_expr())

    def _set_up(self, module: cst.Module) -> None:
        """The target's setup call, once, before the file's imports."""
        if not self.ctx.target.has("trainer_setup") or not module.body:
            return
        statements = self.ctx.statements("trainer_setup")
        if self.ctx.code(statements[-1]).strip() in self.ctx.source_text:
            return  # set up already
        anchor = module.body[first_import(module.body)]
        self.ctx.insert_before(anchor, statements)
        self.ctx.fix(anchor, "the target's setup call for Hugging Face's Trainer added before the imports")

    def _report_unseen(self, calls: list[cst.Call]) -> None:
        """The settings to give, where the file builds no TrainingArguments: at its parser, or at
        the Trainer built with its defaults or with settings made elsewhere."""
        flags = " ".join(_flag(keyword, value) for keyword, value in self._settings.items())
        keywords, names = self._keywords()
        parser = next((call for call in calls if self.ctx.facts.file.qualname(call.func) in _PARSERS), None)
        build = self.ctx.facts.trainer_builds[0]
        if parser is None and call_arg(build, 1, "args") is None:
            message = f"the Trainer takes default TrainingArguments: set {names}"
            help = f"Pass `args=TrainingArguments(output_dir=..., {keywords})`. {self._why()}"
            self.ctx.diagnose(build, message, help + self._launch_help())
            return
        source = "HfArgumentParser" if parser is not None else "outside this file"
        help = (f"Give the Trainer `{flags}` on the command line (or `{keywords}` in the JSON or YAML file "
                f"the arguments are read from). {self._why()}")
        self.ctx.diagnose(parser or build, f"TrainingArguments come from {source}: set {names}",
                          help + self._launch_help())

    def _keywords(self) -> tuple[str, str]:
        """The settings as keywords (``bf16=True, optim='adamw_torch'``), and their names quoted."""
        keywords = ", ".join(f"{keyword}={value}" for keyword, value in self._settings.items())
        return keywords, ", ".join(f"`{keyword}`" for keyword in self._settings)

    def _why(self) -> str:
        why = []
        if self.ctx.target.has("trainer_precision"):
            why.append(f"fp16 is not the mixed precision of the target's device: use `{self._precision('fp16')}`.")
        if self.ctx.target.has("trainer_optimizer"):
            why.append("torch's fused AdamW, the Trainer's default, does not take the device's tensors.")
        if self.ctx.target.has("lazy_execution"):
            why.append("A last partial batch compiles a new graph: drop it.")
        return " ".join(why)

    def _launch_help(self, fsdp: bool = False) -> str:
        """How to start a process per device on a target whose launcher owns the devices."""
        if not self.ctx.target.has("spawn_owns_devices"):
            return ""
        spawn = self.ctx.concept("spawn").render_expr()
        help = f" On many devices, start the script's `main` in a process per device with `{spawn}(_mp_fn)`"
        help += "." if "_mp_fn" in self.ctx.facts.file.definitions.defined else ", where `def _mp_fn(index): main()`."
        return help + (" FSDP on an XLA device is XLA's own: add `fsdp_config={\"xla\": True}`." if fsdp else "")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self._arguments or not self._settings:
            return updated_node
        if any(arg.star for arg in original_node.args):
            keywords, names = self._keywords()
            self.ctx.diagnose(original_node, f"TrainingArguments from a dict (`**`): set {names} in it",
                              f"Set `{keywords}`. {self._why()}{self._launch_help()}")
            return updated_node
        updated_node = self._precision_flags(original_node, updated_node)
        updated_node = self._optimizer(original_node, updated_node)
        quoted = next((arg.value for arg in original_node.args if isinstance(arg.value, cst.SimpleString)), None)
        added = [(keyword, quoted_like(quoted, cst.parse_expression(value))) for keyword, value in self._settings.items()
                 if keyword in ("optim", "dataloader_drop_last") and call_arg(original_node, 99, keyword) is None]
        for keyword, value in added:
            self.ctx.fix(original_node, f"{keyword}={self.ctx.code(value)}: {_ADDED[keyword]}")
        if added:
            updated_node = with_keywords(updated_node, added)
        self._many_devices(original_node)
        return updated_node

    def visit_Assign(self, node: cst.Assign) -> None:
        """``training_args.fp16 = True`` after the settings are made: reported, as the object
        may be any of the file's."""
        if not self.ctx.target.has("trainer_precision"):
            return
        for target in node.targets:
            flag = target.target
            if isinstance(flag, cst.Attribute) and flag.attr.value in _HALF_PRECISION:
                shown = excerpt(self.ctx.code(flag), 30)
                self.ctx.diagnose(node, f"`{shown}` is set: fp16 is not the target's mixed precision",
                                  f"Set `{shown[: -len(flag.attr.value)]}{self._precision(flag.attr.value)}` "
                                  f"where it is a Trainer's setting. {self._why()}")

    def _precision_flags(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``fp16=...`` -> the target's flag, with the same value."""
        if not self.ctx.target.has("trainer_precision"):
            return updated
        renamed = {}
        for flag in _HALF_PRECISION:
            given = call_arg(original, 99, flag)
            if given is None:
                continue
            if call_arg(original, 99, self._precision(flag)) is not None:
                self.ctx.diagnose(given, f"`{flag}` and `{self._precision(flag)}` are both given: fp16 is not the "
                                  "target's mixed precision", f"Set `{flag}` to False.")
                continue
            renamed[flag] = self._precision(flag)
            self.ctx.fix(given, f"{flag} -> {renamed[flag]}: the target's mixed precision")
        if not renamed:
            return updated
        return updated.with_changes(args=[
            arg.with_changes(keyword=cst.Name(renamed[arg.keyword.value]))
            if arg.keyword is not None and arg.keyword.value in renamed else arg
            for arg in updated.args
        ])

    def _optimizer(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """An explicit fused AdamW -> the target's optimizer; a name the file computes is reported."""
        given = call_arg(original, 99, "optim")
        if given is None or "optim" not in self._settings:
            return updated
        name = string_value(given.value)
        replacement = self._settings["optim"]
        if name is None:
            self.ctx.diagnose(given, f"`optim={excerpt(self.ctx.code(given.value), 20)}` must not be torch's fused "
                              "AdamW on the target's device", f"Use optim={replacement}: {self._why()}")
        if name not in _FUSED_OPTIMIZERS:
            return updated
        self.ctx.fix(given, f"optim {name} -> {replacement}: the fused AdamW takes no tensors of the target's device")
        value = quoted_like(given.value, cst.parse_expression(replacement))
        return updated.with_changes(args=[
            arg.with_changes(value=value) if arg.keyword is not None and arg.keyword.value == "optim" else arg
            for arg in updated.args
        ])

    def _many_devices(self, call: cst.Call) -> None:
        many = [keyword for keyword in _MANY_DEVICES if call_arg(call, 99, keyword) is not None]
        help = self._launch_help(fsdp="fsdp" in many)
        if many and help:
            self.ctx.diagnose(call, f"`{many[0]}` trains on many devices: the target's launcher starts their "
                              "processes", help.strip())


def _flag(keyword: str, value: str) -> str:
    """A setting as HfArgumentParser's command line takes it."""
    if value == "True":
        return f"--{keyword}"
    return f"--{keyword} {string_value(cst.parse_expression(value)) or value}"
