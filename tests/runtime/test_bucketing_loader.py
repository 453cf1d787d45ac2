"""The bucketing loader (``config.dataloader``): each batch's sequences padded up to the nearest
bucket, whatever the batch's shape, and a model trained on the padded batches computes the loss
it computes on the unpadded ones."""

from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from accrewrite.runtime import Config, accelerate
from accrewrite.runtime.parallel.bucketing import BucketingLoader, bucket_lengths, pad_batch
from accrewrite.runtime.parallel.config import DataLoaderConfig

BUCKETS = [4, 8, 16]
LM_PADS = {"input_ids": 0, "attention_mask": 0, "labels": -100}


def ids(*rows):
    return torch.tensor(rows)


def test_a_dict_batch_is_padded_to_the_nearest_bucket_labels_with_minus_100():
    batch = {"input_ids": ids([5, 6, 7, 8, 9], [1, 2, 0, 0, 0]), "attention_mask": ids([1] * 5, [1, 1, 0, 0, 0]),
             "labels": ids([5, 6, 7, 8, 9], [1, 2, -100, -100, -100]), "score": torch.tensor([0.5, 1.0])}
    padded = pad_batch(batch, BUCKETS, LM_PADS)
    assert [padded[key].shape for key in ("input_ids", "attention_mask", "labels")] == [(2, 8)] * 3
    assert padded["input_ids"][0].tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert padded["attention_mask"][0].tolist() == [1] * 5 + [0] * 3
    assert padded["labels"][1].tolist() == [1, 2] + [-100] * 6
    assert padded["score"] is batch["score"]  # one value per sample: not a sequence


def test_labels_are_padded_with_minus_100_without_a_pad_value_dict():
    padded = pad_batch({"input_ids": ids([3, 4, 5]), "labels": ids([3, 4, 5])}, BUCKETS)
    assert padded["input_ids"].tolist() == [[3, 4, 5, 0]]
    assert padded["labels"].tolist() == [[3, 4, 5, -100]]


def test_a_tuple_takes_pad_values_by_position_and_keeps_per_sample_labels():
    inputs, targets, classes = ids([1, 2, 3, 4, 5, 6]), ids([2, 3, 4, 5, 6, 7]), torch.tensor([1])
    padded = pad_batch((inputs, targets, classes), BUCKETS, {1: -100})
    assert isinstance(padded, tuple) and len(padded) == 3
    assert padded[0].tolist() == [[1, 2, 3, 4, 5, 6, 0, 0]]
    assert padded[1].tolist() == [[2, 3, 4, 5, 6, 7, -100, -100]]
    assert padded[2] is classes


def test_lists_named_tuples_and_mappings_keep_their_type():
    Pair = namedtuple("Pair", "tokens mask")
    pair = pad_batch(Pair(ids([1, 2, 3]), torch.ones(1, 3, dtype=torch.bool)), BUCKETS)
    assert isinstance(pair, Pair) and pair.tokens.shape == (1, 4)
    assert pair.mask.dtype == torch.bool and pair.mask.tolist() == [[True, True, True, False]]
    assert isinstance(pad_batch([ids([1, 2, 3])], BUCKETS), list)

    class Encoding(dict):
        pass

    encoded = pad_batch(Encoding(input_ids=ids([1, 2, 3])), BUCKETS)
    assert type(encoded) is Encoding and encoded["input_ids"].shape == (1, 4)


def test_a_tensor_batch_pads_its_last_dimension_whatever_its_rank():
    features = torch.randn(2, 3, 9)  # (batch, channels, time)
    padded = pad_batch(features, BUCKETS)
    assert padded.shape == (2, 3, 16)
    assert torch.equal(padded[..., :9], features) and not padded[..., 9:].any()
    assert pad_batch(torch.arange(5), BUCKETS).shape == (5,)  # a batch of scalars has no length


def test_a_batch_already_at_a_bucket_is_left_as_it_is():
    batch = ids([1, 2, 3, 4])
    assert pad_batch(batch, BUCKETS) is batch


def test_only_the_named_sequences_set_the_length_other_shapes_pass():
    batch = {"input_ids": ids([1, 2, 3]), "pixel_values": torch.zeros(1, 3, 10, 10)}
    padded = pad_batch(batch, BUCKETS, {"input_ids": 0})
    assert padded["input_ids"].shape == (1, 4)
    assert padded["pixel_values"] is batch["pixel_values"]


def test_a_batch_without_sequences_passes():
    batch = (torch.tensor([1.0, 2.0]), "names")
    assert pad_batch(batch, BUCKETS) is batch


def test_a_batch_longer_than_the_largest_bucket_says_which_buckets_to_give():
    with pytest.raises(ValueError, match=r"length 17 is longer than the largest bucket \(16\).*"
                                         r"buckets = \[4, 8, 16, 17\].*max_length of at least 17"):
        pad_batch({"input_ids": torch.zeros(2, 17, dtype=torch.long)}, BUCKETS)


def test_other_batch_types_are_refused():
    with pytest.raises(TypeError, match="got a batch of str"):
        pad_batch("text", BUCKETS)


@pytest.mark.parametrize("config, lengths", [
    (DataLoaderConfig(), None),
    (DataLoaderConfig(buckets=[512, 128, 256, 128]), [128, 256, 512]),
    (DataLoaderConfig(max_length=1024, num_buckets=4), [256, 512, 768, 1024]),
    (DataLoaderConfig(max_length=10, num_buckets=3), [3, 6, 10]),
    (DataLoaderConfig(max_length=64), [8, 16, 24, 32, 40, 48, 56, 64]),
])
def test_bucket_lengths(config, lengths):
    assert bucket_lengths(config) == lengths


@pytest.mark.parametrize("config, message", [
    (DataLoaderConfig(buckets=[128], max_length=256), "give one of them"),
    (DataLoaderConfig(buckets=[]), "positive integers"),
    (DataLoaderConfig(buckets=[0, 8]), "positive integers"),
    (DataLoaderConfig(buckets=[8.5]), "positive integers"),
    (DataLoaderConfig(num_buckets=4), "needs max_length"),
    (DataLoaderConfig(max_length=4, num_buckets=8), "no more buckets than the length"),
    (DataLoaderConfig(pad_value_dict={"labels": -100}), "set buckets or max_length too"),
])
def test_settings_that_cannot_be_honoured_say_what_to_change(config, message):
    with pytest.raises(ValueError, match=message):
        bucket_lengths(config)


def samples(lengths):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(1, 32, (length,), generator=generator) for length in lengths]


def lm_collate(rows):
    """Pad to the longest, as a causal-LM collator does."""
    return {"input_ids": pad_sequence(rows, batch_first=True),
            "attention_mask": pad_sequence([torch.ones_like(row) for row in rows], batch_first=True),
            "labels": pad_sequence(rows, batch_first=True, padding_value=-100)}


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.blocks = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.head = nn.Linear(16, 32)

    def forward(self, input_ids, attention_mask):
        x = self.embed(input_ids)
        for block in self.blocks:
            # causal mixing of the tokens a row holds: padding on the right never reaches them
            x = torch.tanh(block(x)).cumsum(1) * attention_mask.unsqueeze(-1)
        return self.head(x)


def lm_loss(model, batch):
    logits = model(batch["input_ids"], batch["attention_mask"])
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten())


def test_accelerate_returns_a_bucketing_loader_whose_batches_train_as_the_unpadded_ones():
    loader = DataLoader(samples([3, 9, 5, 2, 14, 7]), batch_size=2, collate_fn=lm_collate)
    config = Config()
    config.dataloader.buckets = BUCKETS
    config.dataloader.pad_value_dict = LM_PADS
    torch.manual_seed(0)
    model = TinyLM()
    accelerated, bucketed = accelerate(model, loader, config)
    assert isinstance(bucketed, BucketingLoader) and len(bucketed) == 3 and bucketed.batch_size == 2
    for plain, padded in zip(loader, bucketed):
        assert padded["input_ids"].shape[-1] in BUCKETS
        torch.testing.assert_close(lm_loss(accelerated, padded), lm_loss(accelerated, plain), rtol=1e-6, atol=1e-6)


def test_accelerate_without_a_dataloader_still_returns_the_model():
    model = TinyLM()
    assert accelerate(model, config=Config()) is model


def test_buckets_without_a_dataloader_ask_for_it():
    config = Config()
    config.dataloader.max_length = 64
    with pytest.raises(ValueError, match=r"model, loader = accelerate\(model, loader, config\)"):
        accelerate(TinyLM(), config=config)
