"""The bucketing loader (``config.dataloader``) against padding each batch to its longest sample
and to the longest possible one: distinct shapes, padding, and torch_xla's compilations.

    python benchmarks/bucketing_loader.py [--samples 4096] [--batch 16] [--max-length 1024]
        [--multiple 128] [--epochs 3] [--xla-steps 48] [--xla-python PY]

The samples are token rows of lognormal lengths (median 128, sigma 0.8, clipped to
[8, max-length]: a chat or instruction corpus's shape), shuffled each epoch and collated by a
collator that pads to the longest: ``pad_sequence`` into ``input_ids``/``attention_mask``/
``labels``, and, where transformers imports, ``DataCollatorWithPadding`` with a word-level
tokenizer built here (nothing is downloaded). Each collator's batches are then taken as they are
(pad to longest), through the bucketing loader (``max_length`` in 8 uniform buckets, TorchAcc's
default; and power-of-two buckets from 16), rounded up to a multiple of ``--multiple`` (what
ACC103's help writes where the target has no bucketing loader: ``pad_to_multiple_of=128``), or
padded to ``max-length`` (pad to max).

Printed per collator and padding: the distinct batch shapes per epoch (mean over epochs) and the
padding overhead, padded positions over real tokens. On torch_xla (``--xla-python``, default
``$ACCREWRITE_XLA_PYTHON``; ``PJRT_DEVICE=CPU``), a small LM trains ``--xla-steps`` steps on the
``pad_sequence`` batches of each padding, and the compilations (the ``CompileTime`` metric) are
counted: one per distinct shape, each a whole forward + backward + optimizer graph.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

VOCAB = 1000
LM_PADS = {"input_ids": 0, "attention_mask": 0, "labels": -100}


def lognormal_lengths(count: int, max_length: int) -> list[int]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.empty(count).log_normal_(mean=torch.log(torch.tensor(128.0)).item(), std=0.8,
                                             generator=generator)
    return lengths.round().clamp(8, max_length).long().tolist()


def token_rows(lengths: list[int]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, (length,), generator=generator) for length in lengths]


def pad_sequence_collate(rows):
    return {"input_ids": pad_sequence(rows, batch_first=True),
            "attention_mask": pad_sequence([torch.ones_like(row) for row in rows], batch_first=True),
            "labels": pad_sequence(rows, batch_first=True, padding_value=-100)}


def transformers_collator(rows):
    """``DataCollatorWithPadding`` over ``rows`` tokenized by a word-level tokenizer built here,
    or None where transformers does not import."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import DataCollatorWithPadding, PreTrainedTokenizerFast
    except ImportError:
        return None
    vocab = {"[PAD]": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]")
    texts = [" ".join(f"w{token}" for token in row.tolist()) for row in rows]
    encoded = [{"input_ids": ids} for ids in fast(texts)["input_ids"]]
    return encoded, DataCollatorWithPadding(fast, return_tensors="pt")


def padded_to(length: int, batch: dict) -> dict:
    return {key: torch.nn.functional.pad(value, (0, length - value.shape[-1]), value=LM_PADS.get(key, 0))
            for key, value in batch.items()}


def rounded_up(multiple: int, batch: dict) -> dict:
    return padded_to(-(-batch["input_ids"].shape[-1] // multiple) * multiple, batch)


def paddings(max_length: int, multiple: int) -> dict:
    """Each padding's loader over a collated loader: the batches as they are, bucketed, or at max."""
    # Imported here: the torch_xla worker runs this file where accrewrite is not installed.
    from accrewrite.runtime.parallel.bucketing import BucketingLoader, bucket_lengths
    from accrewrite.runtime.parallel.config import DataLoaderConfig

    uniform = bucket_lengths(DataLoaderConfig(max_length=max_length))
    powers = [2 ** k for k in range(4, max_length.bit_length()) if 2 ** k < max_length] + [max_length]
    return {
        "pad to longest": lambda loader: loader,
        f"buckets: max_length, {len(uniform)} uniform": lambda loader: BucketingLoader(loader, uniform, LM_PADS),
        f"buckets: {len(powers)} powers of two": lambda loader: BucketingLoader(loader, powers, LM_PADS),
        f"rounded up to a multiple of {multiple}": lambda loader: (rounded_up(multiple, batch) for batch in loader),
        "pad to max": lambda loader: (padded_to(max_length, batch) for batch in loader),
    }


def shapes_and_overhead(loader_of, dataset, collate, args) -> tuple[float, float]:
    """Distinct shapes per epoch (mean) and padded positions over real tokens, over the epochs."""
    shapes, padded, real = [], 0, 0
    for epoch in range(args.epochs):
        torch.manual_seed(epoch)
        loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, collate_fn=collate)
        seen = set()
        for batch in loader_of(loader):
            seen.add(tuple(batch["input_ids"].shape))
            padded += batch["input_ids"].numel()
            real += int(batch["attention_mask"].sum())
        shapes.append(len(seen))
    return sum(shapes) / len(shapes), (padded - real) / real


def xla_compilations(rows, args) -> dict:
    """Compilations of a small LM's training steps on torch_xla, per padding (a subprocess)."""
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, loader_of in paddings(args.max_length, args.multiple).items():
            torch.manual_seed(0)
            loader = DataLoader(rows, batch_size=args.batch, shuffle=True, collate_fn=pad_sequence_collate)
            batches = [(batch["input_ids"], batch["labels"])
                       for _, batch in zip(range(args.xla_steps), loader_of(loader))]
            path = Path(folder) / "batches.pt"
            torch.save(batches, path)
            done = subprocess.run([args.xla_python, __file__, "--worker", str(path)], capture_output=True,
                                  text=True, env={**os.environ, "PJRT_DEVICE": "CPU"})
            if done.returncode != 0:
                raise SystemExit(f"the torch_xla run failed:\n{done.stderr[-3000:]}")
            results[name] = done.stdout.split()[-2:]
    return results


def train_on_xla(path: str) -> None:
    """Worker, under torch_xla's Python: train on the saved batches; print compilations, steps."""
    import torch_xla
    import torch_xla.debug.metrics as met
    from torch import nn

    device = torch_xla.device()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64),
                          nn.LayerNorm(64), nn.Linear(64, VOCAB)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = torch.load(path)
    for input_ids, labels in batches:
        input_ids, labels = input_ids.to(device), labels.to(device)
        logits = model(input_ids)
        loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch_xla.sync()
    print(met.metric_data("CompileTime")[0], len(batches))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--multiple", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--xla-steps", type=int, default=48)
    parser.add_argument("--xla-python", default=os.environ.get(
        "ACCREWRITE_XLA_PYTHON", str(Path.home() / ".cache" / "accrewrite-xla-venv" / "bin" / "python")))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return train_on_xla(args.worker)

    lengths = lognormal_lengths(args.samples, args.max_length)
    rows = token_rows(lengths)
    print(f"{args.samples} samples, lognormal lengths (median {sorted(lengths)[len(lengths) // 2]}, "
          f"max {max(lengths)}), batch {args.batch}, {len(rows) // args.batch} batches per epoch, "
          f"{args.epochs} epochs")
    collators = {"pad_sequence": (rows, pad_sequence_collate)}
    built = transformers_collator(rows)
    if built is not None:
        collators["DataCollatorWithPadding"] = built
    print(f"{'collator':<25}{'padding':<34}{'shapes/epoch':>13}{'padding overhead':>18}")
    for collator, (dataset, collate) in collators.items():
        for name, loader_of in paddings(args.max_length, args.multiple).items():
            shapes, overhead = shapes_and_overhead(loader_of, dataset, collate, args)
            print(f"{collator:<25}{name:<34}{shapes:>13.1f}{overhead:>17.1%}")
    if not Path(args.xla_python).exists():
        print(f"torch_xla: no interpreter at {args.xla_python}; compilations not measured")
        return
    print(f"torch_xla (PJRT_DEVICE=CPU), {args.xla_steps} training steps on pad_sequence's batches:")
    for name, (compilations, steps) in xla_compilations(rows, args).items():
        print(f"  {name:<34}{compilations:>4} compilations in {steps} steps")


if __name__ == "__main__":
    sys.exit(main())
