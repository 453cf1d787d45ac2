import libcst as cst

from accrewrite.nodes import dotted
from accrewrite.rule import Example, Rule

# What a library's trainer is told to train with.
_FITS = frozenset({"fit", "fit_one_cycle", "fine_tune", "fit_flat_cos", "train"})
# Frameworks whose trainers have rules of their own (ACC017, ACC018, ACC019), and torch's own.
_HANDLED = frozenset({"torch", "transformers", "trl", "lightning", "pytorch_lightning", "accelerate"})


def _trainer(name: str) -> bool:
    """Whether a class or factory's name says it builds a trainer (``d2l.Trainer``, fastai's
    ``Learner`` and ``vision_learner``)."""
    last = name.rpartition(".")[2]
    return last.endswith(("Trainer", "Learner")) or last.endswith("_learner")


class LibraryTrainer(Rule):
    """Report a script that a library's trainer trains, in a loop the migration cannot see.

    A course notebook often trains through its book's library: `d2l.Trainer(max_epochs=10,
    num_gpus=1).fit(model, data)`, fastai's `vision_learner(...).fine_tune(1)`. The training
    loop, and the code that puts the model and the batches on CUDA, are in that library, not in
    the script: there is nothing here to migrate, and a migration that said "0 changed" would
    hide that the script still trains on CUDA or the CPU, never on the target. Where the script
    has no training loop of its own, this note says so.

    What to do: a module of your own project that holds the loop is migrated with it (give
    `accrewrite migrate` the folder); a library's trainer runs where the library puts it. To
    train on the target, write the loop out in the script (the model moved to the device, a
    loader, backward and the optimizer's step), or train through a framework that runs on the
    target (Lightning, the Hugging Face Trainer), and migrate again.
    """

    code = "ACC109"
    name = "library-trainer"
    summary = "a library's trainer trains this script, in a loop outside it"
    triggers = _FITS
    examples = (
        Example(
            before="""
            import torch
            from d2l import torch as d2l

            model = LeNet(lr=0.1)
            trainer = d2l.Trainer(max_epochs=10, num_gpus=1)
            trainer.fit(model, data)
            """,
            diagnostics=("ACC109:6",),
        ),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reported = False

    def applies(self) -> bool:
        facts = self.ctx.facts
        return not facts.loops and not facts.step_functions and facts.framework is None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if self._reported or not isinstance(func, cst.Attribute) or func.attr.value not in _FITS:
            return
        owner = func.value
        if isinstance(owner, cst.Call):  # d2l.Trainer(...).fit(...)
            made = self.ctx.facts.file.qualname(owner.func) or dotted(owner.func)
        else:
            name = dotted(owner)
            made = self.ctx.facts.file.assigned_calls.get(name) if name else None
            if made is None and isinstance(owner, cst.Name):
                made = self._factory(owner.value)
        if not made or not _trainer(made) or made.split(".")[0] in _HANDLED:
            return
        self._reported = True
        self.ctx.diagnose(
            node, f"`{made}` trains this script, in a loop outside it",
            f"The training loop, and what puts the model and its batches on a device, are in "
            f"`{made}`, not in this file. If it is a module of your project, migrate it too; a "
            "library's trainer runs where the library puts it. To train on the target, write the "
            "loop out here (the model moved to the device, a loader, backward, the optimizer's step) "
            "and migrate again.",
        )

    def _factory(self, name: str) -> str | None:
        """The callee a name is assigned the result of, where an import the migration cannot
        follow (``from fastai.vision.all import *``) leaves it unresolved."""
        for value in self.ctx.facts.file.assignments.get(name, ()):
            if isinstance(value, cst.Call) and dotted(value.func):
                return dotted(value.func)
        return None
