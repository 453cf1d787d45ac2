import libcst as cst

from accrewrite.rule import Example, Rule
from accrewrite.rules._host_corpus import host_corpus


class HostResidentCorpus(Rule):
    """Keep a corpus that is sliced every step on the host, and move each slice to the device.

    A language model's corpus is often moved to the device whole, once (`batchify` in
    pytorch/examples' word_language_model returns `data.to(device)`), and each batch sliced out
    of it at a Python offset (`get_batch` returns `source[i:i + bptt]`). On a lazy device the
    offset is a constant of the graph, so every step compiles a new graph. As a hand port does,
    the corpus stays on the host (the `.to(device)` goes) and each slice is moved where it is
    made (`source[i:i + bptt].to(device)`): the batches hold the same values, and the step's
    graph has the same input shapes every step.

    Done only where the corpus is not needed on the device whole: every read of it (and of the
    parameters of the file's functions it is passed to) is a slice, its size (`.size()`,
    `.shape`, `len()`) or an argument of such a function that every caller passes a corpus; it
    is bound once, at module level, from `x.to(device)` or `x.cuda()` (whose slices go to the
    target's device), or from a function of the file that returns such a move and is called
    only so. Elsewhere the file is left as it is and
    ACC103 reports the slices.
    """

    code = "ACC029"
    name = "host-resident-corpus"
    summary = "a corpus sliced every step stays on the host; each slice is moved to the device"
    concepts = ("lazy_execution", "device")
    triggers = frozenset({"to", "cuda"})
    trigger_nodes = (cst.Subscript,)  # a slice of the corpus names no word of its own
    examples = (
        Example(
            target="torch_xla",
            before="""
            import torch

            device = torch.device("cuda")

            def batchify(data, bsz):
                data = data[:data.size(0) // bsz * bsz]
                return data.view(bsz, -1).t().contiguous().to(device)

            train_data = batchify(corpus.train, 20)
            val_data = batchify(corpus.valid, 10)

            def get_batch(source, i):
                seq_len = min(bptt, len(source) - 1 - i)
                return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)

            def evaluate(data_source):
                for i in range(0, data_source.size(0) - 1, bptt):
                    data, targets = get_batch(data_source, i)
                    total += criterion(model(data), targets).item()

            for i in range(0, train_data.size(0) - 1, bptt):
                data, targets = get_batch(train_data, i)
                criterion(model(data), targets).backward()
                optimizer.step()
            evaluate(val_data)
            """,
            after="""
            import torch
            import torch_xla

            device = torch_xla.device()

            def batchify(data, bsz):
                data = data[:data.size(0) // bsz * bsz]
                return data.view(bsz, -1).t().contiguous()

            train_data = batchify(corpus.train, 20)
            val_data = batchify(corpus.valid, 10)

            def get_batch(source, i):
                seq_len = min(bptt, len(source) - 1 - i)
                return source[i:i + seq_len].to(device), source[i + 1:i + 1 + seq_len].to(device).view(-1)

            def evaluate(data_source):
                for i in range(0, data_source.size(0) - 1, bptt):
                    data, targets = get_batch(data_source, i)
                    total += criterion(model(data), targets).item()

            for i in range(0, train_data.size(0) - 1, bptt):
                data, targets = get_batch(train_data, i)
                criterion(model(data), targets).backward()
                optimizer.step()
            evaluate(val_data)
            """,
            with_rules=("ACC002",),
        ),
    )

    def applies(self) -> bool:
        return bool(host_corpus(self.ctx).moves)

    def leave_Call(self, original_node, updated_node):
        moved = host_corpus(self.ctx).moves.get(original_node)
        if moved is None:
            return updated_node
        self.ctx.fix(original_node, "the corpus stays on the host: each slice of it is moved to the device instead")
        return updated_node.func.value

    def leave_Subscript(self, original_node, updated_node):
        found = host_corpus(self.ctx)
        if original_node not in found.slices:
            return updated_node
        self.ctx.fix(original_node, "a slice of the host corpus is moved to the device where it is made")
        device = found.device if found.device is not None else self.ctx.expr("device")
        return cst.Call(func=cst.Attribute(value=updated_node, attr=cst.Name("to")), args=[cst.Arg(device)])
