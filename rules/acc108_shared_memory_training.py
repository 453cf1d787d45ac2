import libcst as cst

from accrewrite.rule import Example, Rule, excerpt
from accrewrite.values import HOST, Kind

_SHARE = frozenset({"share_memory", "share_memory_"})


class SharedMemoryTraining(Rule):
    """Leave Hogwild training where the target's device cannot share memory.

    Hogwild training (PyTorch's `mnist_hogwild`, A3C) puts the model in shared memory
    (`model.share_memory()`, `tensor.share_memory_()`) and starts several processes that step
    it at once. That needs tensors that other processes can map: CPU memory, or CUDA through
    its IPC handles. An XLA device's tensors live in its runtime, one per process, so on the
    XLA targets `share_memory()` of the migrated model stops the script (`_share_fd_: only
    available on CPU`), and every process would train its own copy anyway. There the file is
    left exactly as it is, with this one note; on `runtime` it migrates like any script. The
    modules of the project that it imports and drives (`mnist_hogwild`'s `train.py`, whose
    loop each process runs) are left as they are too, each with a note that names it, when
    `accrewrite migrate` is given the folder or the module alone: migrated, they would put the
    batches on the device while the model stays on the CPU.

    What to do: train data-parallel instead (one model replica per process, the gradients
    all-reduced: DistributedDataParallel under torchrun, which migrates), or keep the Hogwild
    script on the CPU.
    """

    code = "ACC108"
    name = "shared-memory-training"
    summary = "Hogwild training (model.share_memory()) is left as it is where the device cannot share memory"
    triggers = _SHARE
    examples = (
        Example(
            target="torch_xla",
            before="""
            import torch
            import torch.multiprocessing as mp

            model = Net().to(torch.device("cuda"))
            model.share_memory()
            workers = [mp.Process(target=train, args=(rank, model)) for rank in range(4)]
            """,
            diagnostics=("ACC108:5",),
        ),
    )

    def applies(self) -> bool:
        return not self.ctx.target.has("shared_memory")

    def leave_Call(self, original_node, updated_node):
        func = original_node.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in _SHARE or original_node.args:
            return updated_node
        kind = self.ctx.facts.values(self.ctx.scope).kind(func.value)
        if self.ctx.facts.file.qualname(func) is not None or kind in HOST or kind is Kind.CPU:
            return updated_node  # a module's function, or memory that stays on the host (a counter)
        shared = excerpt(self.ctx.code(func.value))
        self.ctx.refuse(
            original_node,
            f"`{shared}` is trained in shared memory, which this target's device lacks; file left as it is",
            "Hogwild training needs tensors that several processes map (CPU or CUDA memory); an XLA "
            "device's tensors belong to one process, and share_memory() of a device model stops the "
            "script. Train data-parallel (one replica per process, DistributedDataParallel under "
            "torchrun), which migrates, or keep this script on the CPU.",
        )
        return updated_node
