"""PreprocessCache: second-epoch time vs first with a costly preprocess_fn, one run.

    python benchmarks/preprocess_cache.py [--samples 2000] [--words 400]

The raw dataset is synthetic text; ``tokenize`` is a deliberately costly pure-Python preprocess
(normalisation, regex word split, a hash per word, padding to 512 ids with an attention mask),
about a millisecond or more per sample. Three epochs over the same samples, each a full pass
that touches every tensor:

* uncached: ``tokenize`` on the fly (what the script did before);
* epoch 1 with the cache: build (preprocess + write) and a pass over the cache;
* epoch 2 with the cache (a new PreprocessCache, as a second run of the script would have):
  fingerprint, open and validate the file, and a pass of checksummed reads.
"""

import argparse
import hashlib
import re
import shutil
import tempfile
import time
import unicodedata

import numpy as np
import torch

from accrewrite.runtime.io import PreprocessCache

MAX_LENGTH = 512
WORD = re.compile(r"\w+|[^\w\s]")


def tokenize(text, vocab=32000):
    """Normalise, split into words and punctuation, hash each to an id; pad to MAX_LENGTH."""
    words = WORD.findall(unicodedata.normalize("NFKC", text).lower())[:MAX_LENGTH]
    ids = [int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little") % vocab
           for word in words]
    input_ids = torch.zeros(MAX_LENGTH, dtype=torch.int64)
    input_ids[: len(ids)] = torch.tensor(ids, dtype=torch.int64)
    attention_mask = torch.zeros(MAX_LENGTH, dtype=torch.bool)
    attention_mask[: len(ids)] = True
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def raw_texts(count, words, seed=0):
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzéàü"))
    texts = []
    for _ in range(count):
        lengths = rng.integers(1, 10, size=words)
        chars = rng.choice(letters, size=int(lengths.sum()))
        pieces = np.split(chars, np.cumsum(lengths)[:-1])
        texts.append(" ".join("".join(piece) for piece in pieces) + ".")
    return texts


def epoch(dataset):
    """A pass that reads every sample and touches its tensors; returns seconds."""
    start = time.perf_counter()
    total = 0
    for i in range(len(dataset)):
        sample = dataset[i]
        total += int(sample["input_ids"].sum()) + int(sample["attention_mask"].sum())
    return time.perf_counter() - start


class OnTheFly:
    """The uncached baseline: preprocess at every read."""

    def __init__(self, texts):
        self.texts = texts

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, index):
        return tokenize(self.texts[index])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--words", type=int, default=400)
    args = parser.parse_args()
    texts = raw_texts(args.samples, args.words)
    cache_dir = tempfile.mkdtemp(prefix="preprocess-cache-bench-")
    try:
        uncached = epoch(OnTheFly(texts))

        start = time.perf_counter()
        cache = PreprocessCache(texts, tokenize, cache_dir, dataset_id="bench-texts")
        first = time.perf_counter() - start + epoch(cache)
        assert cache.status == "built"

        start = time.perf_counter()
        cache = PreprocessCache(texts, tokenize, cache_dir, dataset_id="bench-texts")
        second = time.perf_counter() - start + epoch(cache)
        assert cache.status == "hit"
    finally:
        shutil.rmtree(cache_dir)
    per_sample = uncached / args.samples * 1e3
    print(f"{args.samples} samples, tokenize {per_sample:.2f} ms/sample")
    print(f"uncached epoch {uncached:.2f} s; cached: epoch 1 (build + read) {first:.2f} s "
          f"({first / uncached:.2f}x uncached), epoch 2 {second:.2f} s")
    print(f"epoch 2 / epoch 1: {second / first:.3f}x; epoch 2 / uncached: {second / uncached:.3f}x "
          f"({uncached / second:.1f}x faster)")


if __name__ == "__main__":
    main()
