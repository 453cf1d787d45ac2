"""PackedDataset vs pad-to-longest batching: token utilisation and training tokens/s, one run.

    python benchmarks/packing.py [--documents 4000] [--train-documents 160]

Document lengths are long-tailed: lognormal with median 200 tokens, clipped to 4096; rows hold
2048 tokens. Documents over 2048 tokens are cut into 2048-token pieces for both sides.

* Utilisation: the fraction of the token slots that hold real tokens. PackedDataset fills rows
  of 2048; the baseline collates ``--batch-docs`` documents in arrival order and pads them to the
  longest (what ``DataCollatorWithPadding`` does). Goal: PackedDataset at least 0.97.
* Training throughput: real (non-padding) tokens per second of a small GPT (forward, loss,
  backward, AdamW) on the first ``--train-documents`` documents, steps alternating between the
  two so that machine load hits both alike. Packed rows attend within documents by
  ``cu_seqlens`` (as ``flash_attn_varlen`` would; a dense L x L mask would spend the attention
  work that packing saves); padded batches use plain causal attention, which is exact for them
  (padding is on the right, so no real token sees it) and the fastest path they have.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_memory import GPT  # noqa: E402  (the benchmarks' CPU GPT)

from accrewrite.runtime.io import PackedDataset  # noqa: E402
from accrewrite.runtime.io.packed import IGNORE_INDEX  # noqa: E402

ROW = 2048


def document_lengths(count, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(200), 1.0, size=count).astype(int), 1, 4096)


def make_documents(lengths, vocab, seed=0):
    rng = np.random.default_rng(seed + 1)
    pieces = []
    for length in lengths:
        tokens = rng.integers(1, vocab, size=length)
        pieces += [tokens[i: i + ROW] for i in range(0, length, ROW)]
    return pieces


def padded_batches(documents, batch_docs):
    """Pad-to-longest batches: input_ids, labels (-100 on padding), position_ids."""
    for start in range(0, len(documents), batch_docs):
        group = documents[start: start + batch_docs]
        longest = max(map(len, group))
        ids = torch.zeros(len(group), longest, dtype=torch.int64)
        labels = torch.full((len(group), longest), IGNORE_INDEX, dtype=torch.int64)
        for row, document in enumerate(group):
            ids[row, : len(document)] = torch.from_numpy(document)
            labels[row, : len(document)] = torch.from_numpy(document)
        yield {"input_ids": ids, "labels": labels,
               "position_ids": torch.arange(longest).expand(len(group), -1)}


def packed_batches(documents, rows_per_batch):
    packed = PackedDataset(documents, ROW, attention_mask=False)  # attention by cu_seqlens
    yield from torch.utils.data.DataLoader(packed, batch_size=rows_per_batch)


def utilisation(batches):
    """Real tokens over token slots (documents never contain 0, the padding id of both sides)."""
    real = slots = 0
    for batch in batches:
        real += int((batch["input_ids"] != 0).sum())
        slots += batch["input_ids"].numel()
    return real / slots


def real_tokens(batch):
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def train_step(model, optimizer, batch):
    logits = model(batch["input_ids"], batch["position_ids"], cu_seqlens=batch.get("cu_seqlens"))
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(),
                           ignore_index=IGNORE_INDEX)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def throughput(documents, args):
    """Tokens/s of packed and padded training over the same documents, steps interleaved."""
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a shared, loaded machine: two threads would thrash
    models = {name: GPT(vocab=args.vocab, dim=args.dim, heads=4, blocks=args.blocks) for name in ("packed", "padded")}
    models["padded"].load_state_dict(models["packed"].state_dict())
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-3) for name, model in models.items()}
    streams = {"packed": list(packed_batches(documents, args.rows_per_batch)),
               "padded": list(padded_batches(documents, args.batch_docs))}
    for name in streams:  # warm-up step (first-call allocations, kernels)
        train_step(models[name], optimizers[name], streams[name][0])
    seconds = {name: 0.0 for name in streams}
    queues = {name: list(batches) for name, batches in streams.items()}
    while any(queues.values()):
        for name, queue in queues.items():
            if queue:
                start = time.perf_counter()
                train_step(models[name], optimizers[name], queue.pop(0))
                seconds[name] += time.perf_counter() - start
    tokens = {name: sum(real_tokens(batch) for batch in batches) for name, batches in streams.items()}
    return {name: tokens[name] / seconds[name] for name in streams}, tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=4000)
    parser.add_argument("--batch-docs", type=int, default=8)
    parser.add_argument("--rows-per-batch", type=int, default=2)
    parser.add_argument("--train-documents", type=int, default=160)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=2)
    args = parser.parse_args()

    lengths = document_lengths(args.documents)
    documents = make_documents(lengths, args.vocab)
    print(f"{len(lengths)} documents, {lengths.sum()} tokens, median {int(np.median(lengths))}, "
          f"max {lengths.max()}; rows of {ROW}")
    packed = utilisation(packed_batches(documents, args.rows_per_batch))
    padded = utilisation(padded_batches(documents, args.batch_docs))
    print(f"utilisation: PackedDataset {packed:.3f} (goal >= 0.97 {'ok' if packed >= 0.97 else 'MISSED'}), "
          f"pad-to-longest x{args.batch_docs} docs {padded:.3f}: {packed / padded:.2f}x")

    rates, tokens = throughput(documents[: args.train_documents], args)
    print(f"training ({args.blocks}-block GPT, dim {args.dim}, {tokens['packed']} real tokens each): "
          f"packed {rates['packed']:.0f} tokens/s, padded {rates['padded']:.0f} tokens/s: "
          f"{rates['packed'] / rates['padded']:.2f}x")


if __name__ == "__main__":
    main()
