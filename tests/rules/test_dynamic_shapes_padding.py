"""ACC103's help for padding to the longest: the lines it gives are run here on real batches (a
word-level tokenizer built here, nothing downloaded), and each batch comes out at one of a few
lengths, its real tokens unchanged."""

import re
from pathlib import Path

import pytest
import torch

from accrewrite.engine import Options, migrate_source

SCRIPT = b'''import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding

device = torch.device("cuda")
model = Net().to(device)
collator = DataCollatorWithPadding(tokenizer)
train_loader = DataLoader(rows, batch_size=4, shuffle=True, collate_fn=collator)


def collate_ids(samples):
    ids = pad_sequence(samples, batch_first=True, padding_value=-1)
    return ids


def collate_steps(samples):
    return pad_sequence(samples)


for batch in train_loader:
    batch = {k: v.to(device) for k, v in batch.items()}
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
'''
LENGTHS = [3, 130, 17, 260, 9, 64, 200, 5]


def helps(target: str, script: bytes = SCRIPT) -> dict[int, str]:
    result = migrate_source(script, "train.py", Options(target=target, select=("ACC103",)))
    assert result.error is None, result.error
    return {d.line: d.help for d in result.diagnostics if d.code == "ACC103"}


def quoted(help: str) -> list[str]:
    return re.findall(r"`([^`]+)`", help)


def word_rows():
    """Token rows of LENGTHS and the tokenizer that made them."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[PAD]": 0, **{f"w{i}": i for i in range(1, 50)}}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w1"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]")
    texts = [" ".join(f"w{1 + (i + j) % 49}" for j in range(length)) for i, length in enumerate(LENGTHS)]
    return [{"input_ids": ids} for ids in tokenizer(texts)["input_ids"]], tokenizer


@pytest.mark.parametrize("target", ["torch_xla", "torchacc", "runtime"])
def test_a_collator_is_given_its_own_rounding_on_every_target(target):
    help = helps(target)[8]
    assert "`DataCollatorWithPadding(tokenizer, pad_to_multiple_of=128)`" in help
    rows, tokenizer = word_rows()
    transformers = pytest.importorskip("transformers")
    written = next(code for code in quoted(help) if code.startswith("DataCollatorWithPadding("))
    collator = eval(written, {"DataCollatorWithPadding": transformers.DataCollatorWithPadding, "tokenizer": tokenizer})
    loader = torch.utils.data.DataLoader(rows, batch_size=2, collate_fn=collator)
    for batch, pair in zip(loader, zip(LENGTHS[::2], LENGTHS[1::2])):
        assert batch["input_ids"].shape[-1] == -(-max(pair) // 128) * 128
        assert batch["attention_mask"].sum().item() == sum(pair)  # the real tokens, and no more


def test_where_the_target_has_a_bucketing_loader_the_loader_the_collator_feeds_is_named():
    help = helps("runtime")[8]
    lines = quoted(help)
    assert lines[:3] == [
        "import accrewrite.runtime.parallel_loader as pl",
        "from accrewrite.runtime.parallel.bucketing import BucketingLoader",
        "train_loader = pl.MpDeviceLoader(BucketingLoader(train_loader, [128, 256, 512, 1024]), device)",
    ]
    rows, tokenizer = word_rows()
    transformers = pytest.importorskip("transformers")
    scope = {"device": torch.device("cpu"),
             "train_loader": torch.utils.data.DataLoader(
                 rows, batch_size=2, collate_fn=transformers.DataCollatorWithPadding(tokenizer))}
    for line in lines[:3]:
        exec(line, scope)
    shapes = [batch["input_ids"].shape[-1] for batch in scope["train_loader"]]
    assert shapes == [256, 512, 128, 256]  # longest 130, 260, 64, 200
    for batch, pair in zip(scope["train_loader"], zip(LENGTHS[::2], LENGTHS[1::2])):
        assert batch["attention_mask"].sum().item() == sum(pair)


@pytest.mark.parametrize("target", ["torch_xla", "torchacc"])
def test_a_target_without_a_bucketing_loader_names_none(target):
    assert "BucketingLoader" not in helps(target)[8] and "device loader" not in helps(target)[8]


def test_a_collator_given_to_two_loaders_names_neither():
    script = SCRIPT.replace(b"\n\n\ndef collate_ids", b"\neval_loader = DataLoader(held_out, collate_fn=collator)\n\n\n"
                                                     b"def collate_ids")
    help = helps("runtime", script)[8]
    assert "BucketingLoader" not in help and "pad_to_multiple_of=128" in help


@pytest.mark.parametrize("line, pads", [(13, "(0, -ids.size(1) % 128)"), (18, "(0, 0, 0, -padded.size(0) % 128)")])
def test_pad_sequence_is_rounded_up_along_its_length_by_hand(line, pads):
    help = helps("runtime")[line]
    assert "BucketingLoader" not in help and pads in help
    code = quoted(help)
    samples = [torch.arange(1, n + 1) for n in (3, 130)]
    scope = {"torch": torch, "pad_sequence": torch.nn.utils.rnn.pad_sequence, "samples": samples}
    if line == 13:
        exec(f"ids = pad_sequence(samples, batch_first=True, padding_value=-1)\n{code[0]}", scope)
        assert scope["ids"].shape == (2, 256) and (scope["ids"] == -1).sum().item() == 2 * 256 - 133
    else:
        assert code[0] == "padded = pad_sequence(samples)"
        exec("\n".join(code[:2]), scope)
        assert scope["padded"].shape == (256, 2) and scope["padded"].sum().item() == sum(range(1, 4)) + sum(range(1, 131))


def test_a_tokenizer_that_pads_to_the_longest_is_given_a_multiple():
    script = b'''import torch
model = Net().cuda()
encoded = raw.map(lambda batch: tokenizer(batch["text"], truncation=True, padding=True), batched=True)
'''
    help = helps("torch_xla", script)[3]
    assert '`tokenizer(batch["text"], truncation=True, padding=True, pad_to_multiple_of=128)`' in help


def test_the_fixture_names_the_loader_its_collator_feeds_and_rounds_its_pad_sequence():
    script = (Path(__file__).parent / "fixtures" / "hf_collator_loop.in.py").read_bytes()
    runtime, torch_xla = helps("runtime", script), helps("torch_xla", script)
    assert "`train_loader = pl.MpDeviceLoader(BucketingLoader(train_loader, [128, 256, 512, 1024]), device)`" in runtime[21]
    assert "BucketingLoader" not in torch_xla[21] and "pad_to_multiple_of=128" in torch_xla[21]
    assert runtime[12] == torch_xla[12] and "`ids = torch.nn.functional.pad(ids, (0, -ids.size(1) % 128), value=0)`" in runtime[12]
