import functools
import re

import libcst as cst

from accrewrite.analysis import LOADER_NAMES
from accrewrite.concepts import EXPRESSION, Definition
from accrewrite.nodes import call_arg, dotted, string_value, walk
from accrewrite.rule import Example, Rule, excerpt
from accrewrite.rules._generation import BUCKETED, Generation, grown_sequence, planned_generation
from accrewrite.rules._host_corpus import HOST_CORPUS_RULE, host_corpus
from accrewrite.rules._loader_feeds import calls_in
from accrewrite.rules._training_code import LoopDiagnostic
from accrewrite.values import read_names

# Hugging Face collators that pad each batch to its longest sample unless told otherwise.
_PADDING_COLLATORS = frozenset(
    {"DataCollatorWithPadding", "DataCollatorForSeq2Seq", "DataCollatorForTokenClassification",
     "DataCollatorForLanguageModeling", "DataCollatorForWholeWordMask", "DataCollatorForMultipleChoice"}
)
# What a padding finding's call has in its text: a collator, ``pad_sequence``, ``padding=``.
_PADDING_WORDS = re.compile("DataCollator|pad")
# Ops whose output size depends on the data.
_DATA_SIZED = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"})
_NEW_SHAPES = "Every batch has a new shape, and each new shape compiles a new graph."
_FIXED = (
    "pack samples into fixed-length rows (accrewrite.runtime.io.PackedDataset) or pad to a fixed "
    "length (padding=\"max_length\", max_length=N)"
)
# What a suggested padding rounds lengths up to: a few lengths (8 up to 1024), little padding.
_MULTIPLE = 128
_BUCKETS = "[128, 256, 512, 1024]"
_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
_GROWING_HELP = (
    "On a lazy device every new shape compiles a new graph, so N generated tokens compile N graphs "
    "(minutes where eager takes seconds). ACC028 pads the context of a causal model to a few bucket "
    "lengths, but not here: {why}. Where the model is causal, make that visible to ACC028 (its "
    "forward returning every position's logits, a lower-triangular mask or is_causal=True, the logits "
    "read at [:, -1, :]); or grow the tokens on the host and run the model on the context padded on "
    "the right to a few fixed lengths, reading the logits at the last real position through an index "
    "tensor; or generate on the host: move the model to the CPU for sampling."
)
_DATA_SIZED_HELP = (
    "The size is known only after the device computes it (an XLA sync), and each size compiles a "
    "new graph. Keep the full shape and weight by the mask (`(loss * mask).sum() / mask.sum()`), "
    "use ignore_index, or torch.where(mask, x, 0)."
)


class DynamicShapes(LoopDiagnostic, Rule):
    """Report shapes that change from step to step.

    A compiled step (XLA, or torch.compile without dynamic shapes) is specialised to its input
    and intermediate shapes: every new shape compiles a new graph, and on XLA a data-dependent
    size also forces a sync to learn it. Reported:

    - per-batch padding to the longest sample: `DataCollatorWithPadding(tokenizer)` and the
      other padding collators without `padding="max_length"`, `tokenizer(..., padding=True)`
      or `padding="longest"`, `pad_sequence(...)` (typically in a `collate_fn`), Accelerate's
      `accelerator.pad_across_processes(...)` before a gather, Hugging Face's `Trainer` given a
      tokenizer (`processing_class=`) and no `data_collator` (its default is
      `DataCollatorWithPadding`). What to
      do: pad to a few lengths. The help gives the lines: a collator or tokenizer the same call
      with `pad_to_multiple_of=128` (each of them takes it); `pad_sequence` its result rounded up
      along the length with `torch.nn.functional.pad` (dim 1 with `batch_first=True`, else dim 0);
      and where the target has a bucketing loader (runtime: `BucketingLoader`, the loader of
      `accelerate`'s `config.dataloader`) and one `DataLoader` of the file is given the collator
      as its `collate_fn`, that loader named as its device loader, each batch's last dimension
      padded up to the nearest of `[128, 256, 512, 1024]`. torch_xla has none; TorchAcc 2.x's
      `AsyncLoader(..., buckets=...)` pads only plain dict batches (a collator's `BatchEncoding`
      passes unpadded), so it is not offered. `pad_sequence` is not offered one either: a
      bucketing loader pads the last dimension, the batch's where the length comes first. Or
      pack variable-length samples into fixed-length rows with
      `accrewrite.runtime.io.PackedDataset` (TorchAcc's migration guide, "Pack dataset"), or pad to a fixed
      `max_length`. These are reported wherever they are, since the loop sees their batches;
    - in the training loop: boolean-mask indexing (`x[mask]`, `logits[labels != -100]`),
      `nonzero()`/`argwhere`/`masked_select`/`unique` and one-argument
      `torch.where(cond)`, whose sizes depend on the data. What to do: keep the full shape and
      weight by the mask (`(loss * mask).sum() / mask.sum()`), or use `ignore_index`;
    - a tensor sliced at the training loop's own counter, in the loop or in a function it passes
      the counter to (`source[i:i + bptt]` in a language model's `get_batch`). The shape
      stays, but on XLA the offset is a constant of the graph, so every step compiles a new one.
      What to do: keep the tensor on the host and move each slice (`source[i:i + bptt].to(device)`);
      a slice moved at once is not reported, nor one that ACC029 moves so;
    - on a lazy target (torchacc, torch_xla), token-by-token generation in any function of the
      file, a model's `generate` included: a loop that calls a model and grows a tensor by
      concatenating onto it (`idx = torch.cat((idx, idx_next), dim=1)`), where ACC028 cannot pad
      its context to bucket lengths (the model not shown causal, its forward returning only the
      last position's logits, the logits read elsewhere; the help says which). Every token is a
      new length and compiles a new graph. What to do: make the model's causality visible to
      ACC028; or grow the tokens on the host and run the model on the context padded on the
      right to a few lengths, reading the logits at the last real position through an index
      tensor; or generate on the host (the model moved to the CPU for sampling). ACC003 ends
      each token's step, so that the graph does not also grow across tokens.
    """

    code = "ACC103"
    name = "dynamic-shapes"
    summary = "dynamic shapes: boolean-mask indexing, nonzero(), padding to the longest sample per batch"
    triggers = frozenset(
        {*_PADDING_COLLATORS, *_DATA_SIZED, "where", "padding", "pad_sequence", "pad_across_processes", "mask", "masks", "labels",
         "attention_mask", "loss_mask", "valid", "cat", "concat", "concatenate",
         "processing_class", "tokenizer"}  # a Trainer's default collator pads
    )
    trigger_nodes = (cst.Slice,)  # an offset that changes every step has no word of its own
    defines = (
        Definition("bucketing_loader", EXPRESSION,
                   "a data loader whose batches arrive on the device, the last dimension of each of their "
                   "tensors (a collator's dict of them included) padded up to the nearest of `buckets`",
                   ("loader", "buckets", "device")),
    )
    examples = (
        Example(
            before="""
            import torch
            from torch.nn.utils.rnn import pad_sequence
            from transformers import DataCollatorWithPadding
            model = Net().cuda()

            collator = DataCollatorWithPadding(tokenizer)

            def collate_fn(samples):
                return pad_sequence([s["ids"] for s in samples], batch_first=True)

            for batch in train_loader:
                logits = model(batch["input_ids"])
                mask = batch["labels"] != -100
                loss = criterion(logits[mask], batch["labels"][mask])
                loss.backward()
                optimizer.step()
            """,
            diagnostics=("ACC103:6", "ACC103:9", "ACC103:14", "ACC103:14"),
        ),
        Example(
            before="""
            import torch
            data = torch.tensor(ids).view(bsz, -1).t().contiguous().cuda()

            def get_batch(source, i):
                return source[i:i + bptt], source[i + 1:i + 1 + bptt].reshape(-1)

            for epoch in range(epochs):
                for batch, i in enumerate(range(0, data.size(0) - 1, bptt)):
                    inputs, targets = get_batch(data, i)
                    extra = data[i:i + bptt].cuda()
                    for micro in range(2):
                        criterion(model(inputs[micro * 4:(micro + 1) * 4]), targets).backward()
                    optimizer.step()
                    first = data[epoch:epoch + 1]
            """,
            diagnostics=("ACC103:5", "ACC103:5"),
        ),
        # A script that Accelerate trains (ACC019) has its padding reported.
        Example(
            target="torch_xla",
            before="""
            import torch
            from accelerate import Accelerator
            from transformers import DataCollatorForSeq2Seq

            accelerator = Accelerator()
            collator = DataCollatorForSeq2Seq(tokenizer, pad_to_multiple_of=8)
            model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
            for epoch in range(3):
                for batch in train_loader:
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()
                for batch in eval_loader:
                    tokens = accelerator.pad_across_processes(model.generate(**batch), dim=1)
                    outputs.append(accelerator.gather(tokens))
            """,
            diagnostics=("ACC103:6", "ACC103:13"),
        ),
        Example(
            target="torch_xla",
            before="""
            import torch
            import torch.nn as nn

            class GPT(nn.Module):
                def generate(self, idx, max_new_tokens):
                    for _ in range(max_new_tokens):
                        logits = self(idx[:, -min(self.block_size, idx.size(1)):])
                        idx_next = torch.multinomial(logits[:, -1, :].softmax(-1), num_samples=1)
                        idx = torch.cat((idx, idx_next), dim=1)
                    return idx
            """,
            diagnostics=("ACC103:6",),
        ),
        # The loader the collator feeds is known: the help gives it the target's bucketing loader.
        Example(
            before="""
            import torch
            from torch.utils.data import DataLoader
            from transformers import DataCollatorWithPadding
            device = torch.device("cuda")
            model = Net().to(device)
            collator = DataCollatorWithPadding(tokenizer)
            train_loader = DataLoader(rows, batch_size=16, shuffle=True, collate_fn=collator)
            for batch in train_loader:
                batch = {k: v.to(device) for k, v in batch.items()}
                model(**batch).loss.backward()
                optimizer.step()
            """,
            diagnostics=("ACC103:6",),
        ),
        # Where the target has none, the same collator and a tokenizer are told to round up.
        Example(
            target="torchacc",
            before="""
            import torch
            from torch.utils.data import DataLoader
            from transformers import DataCollatorForSeq2Seq
            model = Net().cuda()
            encoded = raw.map(lambda rows: tokenizer(rows["text"], padding="longest"), batched=True)
            train_loader = DataLoader(encoded, batch_size=16, collate_fn=DataCollatorForSeq2Seq(tokenizer))
            """,
            diagnostics=("ACC103:5", "ACC103:6"),
        ),
        # Given a tokenizer and no collator, a Trainer pads each batch with DataCollatorWithPadding.
        Example(
            target="torch_xla",
            before="""
            from transformers import Trainer

            Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer).train()
            """,
            diagnostics=("ACC103:3",),
        ),
    )

    def applies(self) -> bool:
        # Generation loops (on lazy targets) and padding are reported outside the training loop too.
        facts = self.ctx.facts
        return self.could_report() or self.ctx.target.has("lazy_execution") or bool(facts.trainer_builds) or (
            facts.places_on_device and _PADDING_WORDS.search(self.ctx.source_text) is not None)

    def visit_For(self, node: cst.For) -> None:
        self._generation(node)

    def visit_While(self, node: cst.While) -> None:
        self._generation(node)

    def _generation(self, loop: cst.For | cst.While) -> None:
        if not self.ctx.target.has("lazy_execution"):
            return
        values = self.ctx.facts.values(self.ctx.scope)
        grown = grown_sequence(self.ctx.facts, loop, values)
        if grown is None or any(grown_sequence(self.ctx.facts, inner, values) for inner in _loops_in(loop.body)):
            return  # not generation, or an outer loop around the one that generates
        plan = planned_generation(self.ctx, loop)
        if plan is BUCKETED or isinstance(plan, Generation) and "ACC028" in self.ctx.running:
            return  # padded to bucket lengths
        why = "ACC028 is not selected" if isinstance(plan, Generation) else plan
        self.ctx.diagnose(
            loop, f"`{grown}` grows by one step per iteration of this loop: each length compiles a new graph",
            _GROWING_HELP.format(why=why),
        )

    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("to", "cuda") and isinstance(func.value, cst.Subscript):
            self._moved.add(func.value)

    def check_call(self, node: cst.Call) -> None:
        func = node.func
        callee = self.ctx.facts.file.qualname(func) or dotted(func) or ""
        last = callee.split(".")[-1]
        if node in self.ctx.facts.trainer_builds:
            self._default_collator(node)
            return
        if last in _PADDING_COLLATORS:
            padding = call_arg(node, 99, "padding")
            if padding is None or string_value(padding.value) not in ("max_length", "do_not_pad"):
                self._padded(node, f"`{last}` pads each batch to its longest sample",
                             *self._bucketing_loader(node), _rounded(node))
            return
        if last == "pad_sequence":
            self._padded(node, "`pad_sequence` pads each batch to its longest sequence", self._rounded_sequence(node))
            return
        if last == "pad_across_processes":
            self._padded(node, "`pad_across_processes` pads each batch to the longest of any process")
            return
        padding = call_arg(node, 99, "padding")
        if padding is not None and (
            string_value(padding.value) == "longest"
            or isinstance(padding.value, cst.Name) and padding.value.value == "True"
        ):
            shown = excerpt(self.ctx.code(padding.value))
            self._padded(node, f"`padding={shown}` pads each batch to its longest sample", _rounded(node))
            return
        if not self.in_loop:
            return
        tensors = self.tensors()
        is_method = isinstance(func, cst.Attribute) and self.ctx.facts.file.qualname(func) is None
        if last in _DATA_SIZED and (callee.startswith("torch.") or is_method and tensors.is_tensor(func.value)):
            self._data_sized(node, f"`{last}()`")
        elif callee == "torch.where" and len(node.args) == 1:
            self._data_sized(node, "one-argument `torch.where`")

    def _padded(self, node: cst.CSTNode, message: str, *ways: str) -> None:
        """Report padding to the longest, with the ways to keep the shapes few, best first."""
        first, *others = (*ways, _FIXED)
        self.report(node, message, " ".join([_NEW_SHAPES, f"{first[0].upper()}{first[1:]}.",
                                             *(f"Or {way}." for way in others)]))

    def _default_collator(self, trainer: cst.Call) -> None:
        """A Trainer given a tokenizer and no collator collates with DataCollatorWithPadding."""
        given = call_arg(trainer, 99, "processing_class") or call_arg(trainer, 99, "tokenizer")
        if given is None or call_arg(trainer, 99, "data_collator") is not None:
            return
        collator = f"DataCollatorWithPadding({_one_line(self.ctx.code(given.value))}, pad_to_multiple_of={_MULTIPLE})"
        self.report(trainer, "the Trainer's default collator pads each batch to its longest sample",
                    f"Given a tokenizer and no data_collator, the Trainer collates with DataCollatorWithPadding. "
                    f"{_NEW_SHAPES} Round each batch's length up to a multiple of {_MULTIPLE}: pass "
                    f"`data_collator={collator}`. Or {_FIXED}. Rows padded already: pass "
                    f"data_collator=default_data_collator.")

    def _bucketing_loader(self, collator: cst.Call) -> tuple[str, ...]:
        """The lines that give the loader ``collator`` feeds the target's bucketing loader, where
        the target has one and exactly one loader of the file is given the collator."""
        if not self.ctx.target.has("bucketing_loader"):
            return ()
        loaders = self._loaders_fed.get(collator, set())
        if len(loaders) != 1:
            return ()
        concept = self.ctx.concept("bucketing_loader")
        name = next(iter(loaders))
        keys = list(concept.imports)
        devices = {binding.name for binding in self.ctx.facts.devices}
        if len(devices) == 1:
            device = devices.pop()
        else:  # the target's device call, with its imports
            device = self.ctx.concept("device").render_expr()
            keys += self.ctx.concept("device").imports
        imports = ", ".join(f"`{self.ctx.target.import_line(key)}`" for key in dict.fromkeys(keys))
        line = f"{name} = {concept.render_expr(loader=name, buckets=_BUCKETS, device=device)}"
        return (f"pad each batch up to the nearest of a few lengths (the last at least the longest sample): "
                f"with {imports}, make `{line}` the device loader of `{name}`",)

    @functools.cached_property
    def _loaders_fed(self) -> dict[cst.Call, set[str]]:
        """Each collator call given to a DataLoader of the file as its ``collate_fn`` (there or
        through the name it is bound to) -> the names of those loaders."""
        facts = self.ctx.facts
        fed: dict[cst.Call, set[str]] = {}
        for binding in facts.loader_bindings:
            for call in calls_in(binding.statement):
                collate = call_arg(call, 6, "collate_fn")
                if collate is None or facts.file.qualname(call.func) not in LOADER_NAMES:
                    continue
                collator = facts.values(binding.scope).assigned_value(collate.value)
                if isinstance(collator, cst.Call):
                    fed.setdefault(collator, set()).add(binding.name)
        return fed

    def _rounded_sequence(self, call: cst.Call) -> str:
        """The padded length rounded up, by hand: the bucketing loaders pad the last dimension,
        which is the batch's where ``pad_sequence`` puts the length first."""
        batch_first = call_arg(call, 1, "batch_first")
        value = call_arg(call, 2, "padding_value")
        fill = _one_line(self.ctx.code(value.value)) if value is not None else "0"
        statement = self.ctx.facts.values(self.ctx.scope).statement_of(call)
        name = _assigned_name(statement, call)
        first = "" if name else f"`padded = {_one_line(self.ctx.code(call))}`, then "
        name = name or "padded"
        if batch_first is not None and isinstance(batch_first.value, cst.Name) and batch_first.value.value == "True":
            shape, pad = "(batch, length)", f"(0, -{name}.size(1) % {_MULTIPLE})"
        else:
            shape, pad = "(length, batch)", f"(0, 0, 0, -{name}.size(0) % {_MULTIPLE})"
        return (f"round the length up to a multiple of {_MULTIPLE} ({shape} tensors): "
                f"{first}`{name} = torch.nn.functional.pad({name}, {pad}, value={fill})`")

    def _data_sized(self, node: cst.CSTNode, what: str) -> None:
        self.report(node, f"{what} returns as many elements as the data selects", _DATA_SIZED_HELP)

    def leave_Subscript(self, original_node, updated_node):
        self._sliced_at_the_step(original_node)
        if not self.in_loop or len(original_node.slice) != 1:
            return updated_node
        index = original_node.slice[0].slice
        if not isinstance(index, cst.Index):
            return updated_node
        tensors = self.tensors()
        if tensors.is_mask(index.value) and tensors.is_tensor(original_node.value):
            shown = excerpt(self.ctx.code(original_node))
            self.report(original_node, f"mask indexing `{shown}` keeps as many elements as the mask selects",
                        _DATA_SIZED_HELP)
        return updated_node

    def _sliced_at_the_step(self, node: cst.Subscript) -> None:
        bounds = [e.slice.lower for e in node.slice if isinstance(e.slice, cst.Slice) and e.slice.lower is not None]
        if not bounds or node in self._moved or self.in_closure or self._moved_by_its_rule(node):
            return
        counters = self._step_counters()
        offset = next((bound for bound in bounds if read_names(bound) & counters), None)
        if offset is None:
            return
        values = self.tensors()
        # A helper's parameter is often of a kind the analysis cannot follow (a dataset's tensor).
        if not (values.is_tensor(node.value) or not self.ctx.loops and not values.is_host(node.value)):
            return
        code, value = (" ".join(self.ctx.code(n).split()) for n in (node, node.value))
        self.report(
            node,
            f"`{excerpt(code, 30)}` slices at an offset that changes every step",
            f"On XLA the offset `{excerpt(self.ctx.code(offset))}` is a constant of the graph, so every step "
            f"compiles a new graph. Keep `{value}` on the host and move each slice to the device "
            f"(`{code}.to(device)`).",
        )

    def _moved_by_its_rule(self, node: cst.Subscript) -> bool:
        """A slice of a corpus that ACC029 keeps on the host, moved where it is made."""
        return HOST_CORPUS_RULE in self.ctx.running and node in host_corpus(self.ctx).slices

    @functools.cached_property
    def _moved(self) -> set:
        """Subscripts moved to a device where they are made (``x[i:j].to(device)``)."""
        return set()

    def _step_counters(self) -> set[str]:
        """Names that change every step here: the targets of the innermost loop that steps the
        optimizer (not an epoch loop around it, nor a gradient-accumulation loop inside it, whose
        few offsets come back every step), or in a function such a loop calls, the parameters it
        passes those targets to."""
        loops = [loop for loop in self.ctx.loops if _steps(loop)]
        if loops:
            return _targets(loops[-1].node)
        return self._helper_counters.get(self.ctx.scope, set())

    @functools.cached_property
    def _helper_counters(self) -> dict[cst.FunctionDef, set[str]]:
        facts = self.ctx.facts
        counters: dict[cst.FunctionDef, set[str]] = {}
        calls = {}  # call in a stepping loop -> that loop's targets
        for loop in facts.loops:
            if _steps(loop):
                targets = _targets(loop.node)
                walk(loop.node, lambda n, t=targets: calls.setdefault(n, t) if isinstance(n, cst.Call) else None)
        for statement in self.ctx.module.body:
            if isinstance(statement, cst.FunctionDef):
                for _, call, arguments in facts.passed(statement):
                    for param, argument in arguments.items():
                        if isinstance(argument, cst.Name) and argument.value in calls.get(call, ()):
                            counters.setdefault(statement, set()).add(param)
        return counters


def _rounded(call: cst.Call) -> str:
    """What to write for a Hugging Face call that pads to the longest (a collator, a
    tokenizer): the same call with ``pad_to_multiple_of``, which each of them takes."""
    kept = [arg.with_changes(comma=cst.MaybeSentinel.DEFAULT) for arg in call.args
            if arg.keyword is None or arg.keyword.value != "pad_to_multiple_of"]
    multiple = cst.Arg(cst.Integer(str(_MULTIPLE)), keyword=cst.Name("pad_to_multiple_of"), equal=_EQUAL)
    code = cst.Module([]).code_for_node(call.with_changes(args=[*kept, multiple]))
    return f"round each batch's length up to a multiple of {_MULTIPLE}: `{_one_line(code)}`"


def _one_line(code: str) -> str:
    return " ".join(code.split())


def _assigned_name(statement: cst.CSTNode | None, value: cst.CSTNode) -> str | None:
    """The name ``statement`` binds ``value`` to (``padded = value``), if it does."""
    if isinstance(statement, cst.Assign) and statement.value is value and len(statement.targets) == 1:
        target = statement.targets[0].target
        return target.value if isinstance(target, cst.Name) else None
    return None


def _steps(loop) -> bool:
    return loop.calls_step and not loop.encloses_step_loop


def _loops_in(body: cst.CSTNode) -> list[cst.For | cst.While]:
    found = []
    walk(body, lambda node: found.append(node) if isinstance(node, (cst.For, cst.While)) else None)
    return found


def _targets(loop: cst.For | cst.While) -> set[str]:
    return read_names(loop.target) if isinstance(loop, cst.For) else set()
