"""The catalogue of concepts: what the rules may ask a target for, what it means, and how a
profile (``rules/targets/*.toml``, or an installed package's) may spell it. A profile is checked
against it when it loads. A concept that only one rule asks for (a fused kernel's spelling) is
defined by that rule, ``Rule.defines``, with the same ``Definition``; a profile's spelling of it
is checked once the rules load.

Kinds:

- an *expression* is written where the original code was: a value or a call, with
  ``{placeholder}`` fields that the rule fills (``pl.MpDeviceLoader({loader}, {device})``);
- *statements* are lines the rule inserts (``xm.set_rng_state({seed})``);
- a *spelling* is a name written in place of the original's name, the call keeping its arguments
  (``autocast``, ``syncfree.{name}``); one marked ``hook`` may instead be statements that run once
  at the top of the file and patch the original for the whole process;
- a *capability* says what the target's device does or lacks; it has no spelling and is listed
  under the profile's ``[capabilities]``.

A target without a concept does not support the rules that need it: they do not run there. A
``required`` concept is one that every target spells; ``needs`` names the concepts that a rule
reads, unasked, wherever this one is spelled.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    EXPRESSION = "expression"
    STATEMENTS = "statements"
    SPELLING = "spelling"
    CAPABILITY = "capability"


@dataclass(frozen=True)
class Definition:
    name: str
    kind: Kind
    meaning: str
    placeholders: tuple[str, ...] = ()
    required: bool = False
    needs: tuple[str, ...] = ()
    # Concepts of which the profile must spell at least one wherever it spells this one.
    needs_one_of: tuple[str, ...] = ()
    # The spelling flags that mean something for this concept (``keep``, ``rebind``).
    flags: tuple[str, ...] = ()
    hook: bool = False

    @property
    def forms(self) -> tuple[str, ...]:
        """The profile keys it may be spelled with."""
        if self.kind is Kind.STATEMENTS:
            return ("stmts",)
        if self.kind is Kind.CAPABILITY:
            return ()
        return ("expr", "stmts") if self.hook else ("expr",)


EXPRESSION, STATEMENTS, SPELLING, CAPABILITY = Kind

_DEFINITIONS = (
    # The device and placement (ACC002, ACC003, ACC106)
    Definition("device", EXPRESSION, "the training device, where the script said torch.device('cuda')",
               required=True),
    Definition("set_replication", STATEMENTS,
               "registers the device with the target's replication after it is chosen", ("device",)),
    Definition("accelerator_available", EXPRESSION,
               "what an availability test in front of a device choice becomes (torch.cuda.is_available())"),
    Definition("keep_parameters_on_move", STATEMENTS,
               "keeps a module's Parameter objects when it moves to the device (tied weights, an optimizer "
               "built before the move)"),
    Definition("load_location", EXPRESSION, "torch.load's map_location where the device cannot restore storages"),
    Definition("device_option", EXPRESSION,
               "the default of a command-line option that named a CUDA device: a name torch.device() takes for "
               "the training device"),
    Definition("device_loader", EXPRESSION, "a data loader whose batches arrive on the device", ("loader", "device"),
               needs=("device",), flags=("rebind",)),
    Definition("device_save", EXPRESSION, "torch.save of device tensors (brought to the CPU first)", ("obj", "path")),
    Definition("pin_memory", EXPRESSION, "a DataLoader's pin_memory where the script gave none"),
    # Seeding (ACC001)
    Definition("seed", STATEMENTS,
               "seeds the target's random number generators; with keep, torch's seed call stays", ("seed",),
               flags=("keep",)),
    # Steps and gradients (ACC005, ACC006, ACC008, ACC009)
    Definition("gradient_allreduce", STATEMENTS,
               "averages the gradients of the optimizer's parameters over the workers; a target that spells "
               "it trains without DistributedDataParallel (ACC005 removes the wrapper)", ("optimizer",),
               needs=("null_context",)),
    Definition("optimizer_step", EXPRESSION, "reduces the gradients, then steps", ("optimizer",),
               needs=("optimizer_step_closure",)),
    Definition("optimizer_step_closure", EXPRESSION,
               "optimizer_step for an optimizer whose step takes a closure (LBFGS)", ("optimizer", "closure")),
    Definition("broadcast_master_param", STATEMENTS,
               "copies rank 0's parameters and buffers to every rank, as DDP's constructor did", ("model",)),
    Definition("null_context", SPELLING, "a context manager that does nothing (model.no_sync without DDP)"),
    Definition("syncfree_optimizer", SPELLING, "the optimizer class that steps without waiting for the device",
               ("name",)),
    Definition("step_closure", EXPRESSION, "runs a function with its arguments at the step's end",
               ("closure", "args", "run_async"), needs=("mark_step",)),
    Definition("mark_step", STATEMENTS,
               "ends a step: runs pending step closures and, where execution is lazy, the step's graph"),
    Definition("flush_at_exit", STATEMENTS, "runs pending step closures at interpreter exit"),
    # Processes (ACC004, ACC010)
    Definition("dist_backend", EXPRESSION, "init_process_group's backend"),
    Definition("dist_init_method", EXPRESSION, "init_process_group's init method; with keep, a script's own stays",
               flags=("keep",)),
    Definition("dist_assigned_rank", EXPRESSION, "the rank, where the init method assigns it",
               needs=("dist_assigned_world_size",)),
    Definition("dist_assigned_world_size", EXPRESSION, "the world size, where the init method assigns it"),
    Definition("spawn", SPELLING, "torch.multiprocessing.spawn's replacement, called with the same function"),
    Definition("device_count", EXPRESSION, "the number of devices the job trains on, one process each"),
    Definition("synchronize", EXPRESSION, "waits for the device (torch.cuda.synchronize())"),
    Definition("device_call", SPELLING,
               "torch.cuda.{name}, the same call for the device the target trains on: memory statistics, "
               "the allocator's cache, the device's name, timing events", ("name",)),
    Definition("device_type", EXPRESSION,
               "the type of a device that is not CUDA: torch.cuda's queries do not describe it",
               needs=("memory_info",)),
    Definition("memory_info", EXPRESSION, "the device's memory use, named in a diagnostic", ("device",)),
    # Mixed precision (ACC007)
    Definition("autocast", SPELLING, "CUDA's autocast", needs_one_of=("grad_scaler", "disabled_grad_scaler")),
    Definition("autocast_device", EXPRESSION, "autocast's device type argument"),
    Definition("autocast_dtype", EXPRESSION, "the one dtype the target's autocast runs in"),
    Definition("grad_scaler", SPELLING, "CUDA's GradScaler"),
    Definition("disabled_grad_scaler", EXPRESSION, "what a GradScaler becomes where the target has none"),
    # Compilation and evaluation (ACC011, ACC013, ACC015)
    Definition("compile", STATEMENTS, "compiles a model after it is built", ("model",)),
    Definition("compile_backend", EXPRESSION, "torch.compile's backend"),
    Definition("grad_free_mode", SPELLING, "what torch.inference_mode becomes where inference tensors do not work"),
    # Batch normalization over every process's batch (ACC016)
    Definition("sync_batch_norm", SPELLING,
               "torch.nn.SyncBatchNorm's replacement, synchronized on the target's device: a subclass with the "
               "same constructor and convert_sync_batchnorm"),
    # Fused optimizers and memory (ACC021, ACC025)
    Definition("fused_adam", SPELLING, "torch.optim.Adam's fused replacement", hook=True),
    Definition("fused_adamw", SPELLING, "torch.optim.AdamW's fused replacement", hook=True),
    Definition("auto_checkpoint", STATEMENTS, "activation checkpointing chosen for a model", ("model",)),
    # migrate --parallel (ACC030, ACC031, ACC035, ACC036)
    Definition("parallel_accelerate", EXPRESSION,
               'a model sharded, tensor-, pipeline- or context-parallel; {kind} is a --parallel kind ("fsdp", "cp")',
               ("model", "kind"),
               needs=("gradient_sync_switch",)),
    Definition("gradient_sync_switch", STATEMENTS, "DDP's require_backward_grad_sync for a sharded model",
               ("model", "value")),
    Definition("pipeline_step", EXPRESSION,
               "one training step's forward and backward over a pipeline-parallel model's micro-batches, "
               "the mean loss", ("model", "inputs")),
    Definition("pipeline_step_of_output", EXPRESSION,
               "pipeline_step where the model's forward returns several values, the loss at {index}",
               ("model", "inputs", "index")),
    Definition("full_state_export", STATEMENTS, "writes a sharded model's unsharded state dict", ("path", "model")),
    # Hugging Face's Trainer (ACC017)
    Definition("trainer_setup", STATEMENTS,
               "run once at the top of the file, before transformers is imported, so that a Hugging Face "
               "Trainer trains on the target's device"),
    Definition("trainer_precision", SPELLING,
               "the TrainingArguments flag that turns mixed precision on where the script gave fp16: one the "
               "Trainer runs on the target's device"),
    Definition("trainer_optimizer", EXPRESSION,
               "TrainingArguments' optim where the Trainer's default (torch's fused AdamW) does not run on the "
               "target's device"),
    # Frameworks that train by themselves (ACC018, ACC019)
    Definition("lightning_accelerator", EXPRESSION,
               "a Lightning Trainer's accelerator for the target's device, with Lightning's own strategy for it"),
    Definition("lightning_mixed_precision", EXPRESSION,
               "a Lightning Trainer's precision on that accelerator where the script asked for mixed precision",
               needs=("lightning_accelerator",)),
    Definition("accelerate_mixed_precision", EXPRESSION,
               "an Accelerator's mixed_precision on the target's device where the script asked for fp16"),
    # Capabilities
    Definition("lazy_execution", CAPABILITY, "operations are recorded into a graph that runs at the step's end",
               needs=("mark_step",)),
    Definition("shared_memory", CAPABILITY, "device tensors can be shared between processes (Hogwild training)"),
    Definition("spawn_owns_devices", CAPABILITY, "the target's spawn starts a process per device itself and refuses to "
               "start once the launching process has asked for a device", needs=("spawn", "device_count")),
)

CATALOGUE: dict[str, Definition] = {definition.name: definition for definition in _DEFINITIONS}
