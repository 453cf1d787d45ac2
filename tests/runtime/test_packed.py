import random

import pytest

torch = pytest.importorskip("torch")
import numpy as np
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from accrewrite.runtime.io import PackedDataset
from accrewrite.runtime.io.packed import IGNORE_INDEX, block_causal_mask, pack_lengths


def random_documents(count, max_len, seed=0, vocab=50):
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(1, max_len))] for _ in range(count)]


def documents_of(rows):
    """The documents of packed rows, by their segments (test documents never contain 0, the pad)."""
    found = []
    for row in rows:
        bounds = row["cu_seqlens"].unique_consecutive().tolist()
        for start, end in zip(bounds, bounds[1:]):
            segment = row["input_ids"][start:end].tolist()
            if any(segment):
                found.append(segment)
    return found


class TinyCausalLM(nn.Module):
    """One attention layer with learned positions: enough for a leak across documents to show."""

    def __init__(self, vocab=50, dim=16, heads=2, max_len=64):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(max_len, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, position_ids, attn_mask):
        x = self.embed(input_ids) + self.position(position_ids)
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.head(x + attended.transpose(1, 2).flatten(2))


def shifted_loss(logits, labels):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def test_packed_loss_equals_sum_of_separate_document_losses():
    torch.manual_seed(0)
    model = TinyCausalLM().double()
    documents = random_documents(40, 20, seed=1)
    rows = list(PackedDataset(documents, seq_len=64, buffer_size=16))
    assert len(rows) < len(documents) / 2  # documents really share rows
    batch = torch.utils.data.default_collate(rows)

    packed = shifted_loss(model(batch["input_ids"], batch["position_ids"], batch["attention_mask"]),
                          batch["labels"])

    separate = torch.zeros((), dtype=torch.float64)
    for document in documents:
        ids = torch.tensor([document])
        positions = torch.arange(len(document)).unsqueeze(0)
        causal = torch.ones(len(document), len(document), dtype=torch.bool).tril()
        separate += shifted_loss(model(ids, positions, causal), ids)
    torch.testing.assert_close(packed, separate, rtol=1e-10, atol=1e-10)

    # Without the mask the documents would see each other: the test can tell the difference.
    leaky = shifted_loss(model(batch["input_ids"], batch["position_ids"], None), batch["labels"])
    assert not torch.allclose(leaky, separate)


def test_row_fields_are_consistent():
    documents = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    (row,) = PackedDataset(documents, seq_len=12, pad_id=99)
    assert {k: (tuple(v.shape), v.dtype) for k, v in row.items()} == {
        "input_ids": ((12,), torch.int64), "labels": ((12,), torch.int64),
        "position_ids": ((12,), torch.int64), "cu_seqlens": ((13,), torch.int32),
        "attention_mask": ((1, 12, 12), torch.bool),
    }
    assert row["input_ids"].tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 13, 99, 99, 99]
    assert row["labels"].tolist() == [-100, 6, 7, -100, 9, -100, 11, 12, 13, -100, -100, -100]
    assert row["position_ids"].tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1, 2]
    assert row["cu_seqlens"].unique_consecutive().tolist() == [0, 3, 5, 9, 12]
    assert row["cu_seqlens"][5:].eq(12).all()
    expected = torch.zeros(12, 12, dtype=torch.bool)
    for start, end in [(0, 3), (3, 5), (5, 9), (9, 12)]:
        expected[start:end, start:end] = torch.ones(end - start, end - start, dtype=torch.bool).tril()
    assert torch.equal(row["attention_mask"][0], expected)


def test_block_causal_mask_is_batched_and_matches_rows():
    rows = list(PackedDataset(random_documents(30, 10), seq_len=24, buffer_size=8))
    batch = torch.utils.data.default_collate(rows)
    assert torch.equal(block_causal_mask(batch["position_ids"]), batch["attention_mask"])
    assert batch["attention_mask"].shape == (len(rows), 1, 24, 24)


@pytest.mark.parametrize("buffer_size", [1, 7, 1000])
def test_every_document_appears_once_and_rows_are_full_length(buffer_size):
    documents = random_documents(200, 40, seed=2)
    rows = list(PackedDataset(documents, seq_len=48, buffer_size=buffer_size, attention_mask=False))
    assert all(len(row["input_ids"]) == 48 for row in rows)
    assert sorted(documents_of(rows)) == sorted(documents)


def test_long_documents_are_split_or_truncated():
    long = list(range(1, 26))
    split = list(PackedDataset([long, [7, 7]], seq_len=10))
    assert sorted(documents_of(split)) == sorted([long[0:10], long[10:20], long[20:25], [7, 7]])
    truncated = list(PackedDataset([long, [7, 7]], seq_len=10, long_documents="truncate"))
    assert sorted(documents_of(truncated)) == sorted([long[:10], [7, 7]])


def test_accepts_tensors_arrays_mappings_and_skips_empty_documents():
    samples = [torch.tensor([1, 2, 3]), np.array([4, 5], dtype=np.int32), {"input_ids": [6]}, []]
    rows = list(PackedDataset(samples, seq_len=8))
    assert sorted(documents_of(rows)) == [[1, 2, 3], [4, 5], [6]]


def test_utilisation_on_long_tailed_lengths():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(200), 1.0, size=2000).astype(int), 1, 4096)
    documents = [np.ones(n, dtype=np.int64) for n in lengths]
    rows = list(PackedDataset(documents, seq_len=2048, attention_mask=False))
    assert len(rows) * 2048 >= lengths.sum()
    utilisation = lengths.sum() / (len(rows) * 2048)
    assert utilisation >= 0.97


def test_pack_lengths_respects_capacity_and_places_every_item():
    rng = random.Random(3)
    lengths = [rng.randint(1, 100) for _ in range(500)]
    bins = pack_lengths(lengths, 100)
    assert sorted(i for members in bins for i in members) == list(range(500))
    assert all(sum(lengths[i] for i in members) <= 100 for members in bins)
    assert len(bins) <= 1.05 * sum(lengths) / 100 + 1
    with pytest.raises(ValueError, match="capacity"):
        pack_lengths([5, 101], 100)


class Stream(IterableDataset):
    def __init__(self, documents):
        self.documents = documents

    def __iter__(self):
        return iter(self.documents)


@pytest.mark.parametrize("make", [list, Stream], ids=["map-style", "iterable"])
def test_replicas_get_disjoint_shares_that_cover_the_dataset(make):
    documents = [[i + 1] * (i % 5 + 1) for i in range(40)]
    shares = [documents_of(PackedDataset(make(documents), seq_len=16, num_replicas=2, rank=rank))
              for rank in range(2)]
    assert sorted(shares[0] + shares[1]) == sorted(documents)
    assert not set(map(tuple, shares[0])) & set(map(tuple, shares[1]))


def test_dataloader_workers_do_not_duplicate_documents():
    documents = [[i + 1] * (i % 7 + 1) for i in range(60)]
    packed = PackedDataset(Stream(documents), seq_len=16, num_replicas=2, rank=1)
    loader = DataLoader(packed, batch_size=4, num_workers=2)
    rows = [dict(zip(batch, values)) for batch in loader for values in zip(*batch.values())]
    assert sorted(documents_of(rows)) == sorted(documents[1::2])


def test_shuffle_follows_distributed_sampler_epochs():
    documents = [[i + 1] for i in range(64)]
    packed = PackedDataset(documents, seq_len=8, shuffle=True, seed=5)
    first = documents_of(packed)
    assert documents_of(packed) == first  # same epoch, same order
    packed.set_epoch(1)
    second = documents_of(packed)
    assert second != first and sorted(second) == sorted(first)


def test_defaults_to_the_initialised_process_group(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    packed = PackedDataset([[1]], seq_len=4)
    assert (packed.num_replicas, packed.rank) == (4, 3)


@pytest.mark.parametrize(
    "samples, kwargs, error, match",
    [
        ([[1]], {"seq_len": 0}, ValueError, "seq_len"),
        ([[1]], {"seq_len": 4, "buffer_size": 0}, ValueError, "buffer_size"),
        ([[1]], {"seq_len": 4, "long_documents": "drop"}, ValueError, "long_documents"),
        ([[1]], {"seq_len": 4, "num_replicas": 2, "rank": 2}, ValueError, "rank"),
        (Stream([[1]]), {"seq_len": 4, "shuffle": True}, ValueError, "map-style"),
    ],
)
def test_bad_arguments(samples, kwargs, error, match):
    with pytest.raises(error, match=match):
        PackedDataset(samples, **kwargs)


@pytest.mark.parametrize(
    "sample, error, match",
    [
        ([[1, 2], [3, 4]], ValueError, "1-D"),
        ([0.5, 1.5], TypeError, "integers"),
        ({"text": "hi"}, KeyError, "input_ids"),
        (["a", "b"], TypeError, "token ids"),
    ],
)
def test_bad_samples_name_the_sample(sample, error, match):
    with pytest.raises(error, match=match):
        list(PackedDataset([[1], sample], seq_len=4))
