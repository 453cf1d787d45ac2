"""Sequence classification fine-tuning in the shape of Hugging Face's ``run_glue_no_trainer.py``.

Dict batches moved with ``batch = {k: v.to(device) for k, v in batch.items()}``, ``model(**batch)``,
``outputs.loss``, a ``get_scheduler`` learning-rate schedule and a ``DataCollatorWithPadding`` that
pads every batch to its longest sample. There is no ``transformers`` dependency: the few pieces of
it that such a script uses are small local stand-ins with the same names and call shapes, so the
script runs with torch alone, on synthetic sentences (no downloads), in seconds on a CPU.

    python train.py --steps 20
"""

from torchacc.runtime import hooks
import torchacc.torch_xla.core.xla_model as xm
import torchacc.torch_xla.distributed.parallel_loader as pl
import atexit
hooks.enable_fused_adam()
import argparse
import math
import random
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset


# --- Stand-ins for the transformers pieces the script uses ---------------------------------------


class Tokenizer:
    """A word-level tokenizer with a fixed vocabulary (``AutoTokenizer`` stand-in)."""

    pad_token_id = 0

    def __init__(self, vocabulary):
        self.vocab = {word: index for index, word in enumerate(["[PAD]", "[CLS]", *vocabulary])}
        self.model_max_length = 64

    def __call__(self, text, truncation=True, max_length=None):
        limit = max_length or self.model_max_length
        ids = [1] + [self.vocab[word] for word in text.split()]
        return {"input_ids": ids[:limit] if truncation else ids}

    def __len__(self):
        return len(self.vocab)


class DataCollatorWithPadding:
    """Pads each batch to its longest sample and builds the attention mask (as transformers does)."""

    def __init__(self, tokenizer, pad_to_multiple_of=None):
        self.tokenizer = tokenizer
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features):
        longest = max(len(feature["input_ids"]) for feature in features)
        if self.pad_to_multiple_of:
            longest = math.ceil(longest / self.pad_to_multiple_of) * self.pad_to_multiple_of
        pad = self.tokenizer.pad_token_id
        input_ids = [f["input_ids"] + [pad] * (longest - len(f["input_ids"])) for f in features]
        attention_mask = [[1] * len(f["input_ids"]) + [0] * (longest - len(f["input_ids"])) for f in features]
        return {
            "input_ids": torch.tensor(input_ids),
            "attention_mask": torch.tensor(attention_mask),
            "labels": torch.tensor([f["labels"] for f in features]),
        }


@dataclass
class SequenceClassifierOutput:
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None


class TinyModelForSequenceClassification(nn.Module):
    """Embeddings, one transformer encoder layer, [CLS] pooling, a classifier head."""

    def __init__(self, vocab_size, num_labels=2, hidden_size=32, num_heads=2):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embeddings = nn.Embedding(64, hidden_size)
        self.encoder = nn.TransformerEncoderLayer(
            hidden_size, num_heads, dim_feedforward=4 * hidden_size, dropout=0.0, batch_first=True
        )
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(self, input_ids, attention_mask=None, labels=None):
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        hidden = self.embeddings(input_ids) + self.position_embeddings(positions)
        padding = attention_mask == 0 if attention_mask is not None else None
        hidden = self.encoder(hidden, src_key_padding_mask=padding)
        logits = self.classifier(hidden[:, 0])
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


def get_scheduler(name, optimizer, num_warmup_steps, num_training_steps):
    """transformers.get_scheduler for the "linear" and "constant" schedules."""

    def linear(step):
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    schedules = {"linear": linear, "constant": lambda step: 1.0}
    return LambdaLR(optimizer, schedules[name])


# --- A synthetic sentiment task ------------------------------------------------------------------

GOOD = ["good", "great", "fine", "lovely", "superb", "nice"]
BAD = ["bad", "awful", "poor", "dull", "boring", "weak"]
NEUTRAL = ["the", "film", "was", "a", "plot", "and", "acting", "story", "very", "quite"]


class SentimentDataset(Dataset):
    """Sentences of 4-24 words; the label says whether good words outnumber bad ones."""

    def __init__(self, size, tokenizer, seed):
        rng = random.Random(seed)
        self.examples = []
        for _ in range(size):
            words = [rng.choice(NEUTRAL + GOOD + BAD) for _ in range(rng.randint(4, 24))]
            label = int(sum(w in GOOD for w in words) > sum(w in BAD for w in words))
            self.examples.append({**tokenizer(" ".join(words)), "labels": label})

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, index):
        return self.examples[index]


def parse_args():
    parser = argparse.ArgumentParser(description="Fine-tune a sequence classifier (no Trainer).")
    parser.add_argument("--per_device_train_batch_size", type=int, default=16)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="total optimizer steps (max_train_steps)")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--lr_scheduler_type", default="linear", choices=["linear", "constant"])
    parser.add_argument("--num_warmup_steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


atexit.register(xm.mark_step)


def main():
    args = parse_args()
    random.seed(args.seed)
    xm.set_rng_state(args.seed)
    device = xm.xla_device()
    xm.set_replication(device, [device])

    tokenizer = Tokenizer(NEUTRAL + GOOD + BAD)
    train_dataset = SentimentDataset(512, tokenizer, seed=args.seed)
    eval_dataset = SentimentDataset(128, tokenizer, seed=args.seed + 1)
    model = TinyModelForSequenceClassification(len(tokenizer))

    data_collator = DataCollatorWithPadding(tokenizer)
    train_dataloader = DataLoader(
        train_dataset, shuffle=True, collate_fn=data_collator, batch_size=args.per_device_train_batch_size
    )
    train_dataloader = pl.MpDeviceLoader(train_dataloader, device)
    eval_dataloader = DataLoader(eval_dataset, collate_fn=data_collator, batch_size=args.per_device_eval_batch_size)
    eval_dataloader = pl.MpDeviceLoader(eval_dataloader, device)

    # Weight decay on everything but biases and LayerNorm weights, as the HF scripts do.
    no_decay = ["bias", "norm1.weight", "norm2.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": args.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)
    torch.__future__.set_swap_module_params_on_conversion(True)
    model.to(device)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.steps
    num_train_epochs = math.ceil(max_train_steps / num_update_steps_per_epoch)
    lr_scheduler = get_scheduler(
        name=args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=max_train_steps,
    )

    print(f"num examples = {len(train_dataset)}, epochs = {num_train_epochs}, steps = {max_train_steps}")
    completed_steps = 0
    for epoch in range(num_train_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            loss = loss / args.gradient_accumulation_steps
            loss.backward()
            if step % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                xm.optimizer_step(optimizer)
                lr_scheduler.step()
                optimizer.zero_grad()
                xm.add_step_closure(
                    lambda epoch, completed_steps, loss: print(f"epoch {epoch} step {completed_steps} loss {loss.item():.4f}"),
                    args=(epoch, completed_steps, loss.detach()),
                    run_async=False)
                completed_steps += 1
            if completed_steps >= max_train_steps:
                break
        xm.mark_step()

        model.eval()
        correct, seen = 0, 0
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            correct += (predictions == batch["labels"]).sum()
            seen += batch["labels"].numel()
        xm.add_step_closure(
            lambda epoch, correct, seen: print(f"epoch {epoch}: eval accuracy {float(correct) / seen:.4f}"),
            args=(epoch, correct, seen),
            run_async=False)
        if completed_steps >= max_train_steps:
            break
    xm.mark_step()


if __name__ == "__main__":
    main()
