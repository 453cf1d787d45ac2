"""The persistent map behaves as a dict that is copied at every change, and ``merge`` as a
key-by-key merge of such dicts; parts that maps share stay shared."""

import random

from accrewrite.persistent import PersistentMap, merge


def _dict(mapping: PersistentMap, keys) -> dict:
    return {key: mapping.get(key) for key in keys if mapping.get(key) is not None}


def _larger(buckets, _before=None):
    """Key by key, the largest value: combining a value with itself gives it back, as the
    analysis's own combinations do, so that buckets shared or not give the same result."""
    merged = {}
    for bucket in buckets:
        for key, value in (bucket or {}).items():
            merged[key] = max(merged.get(key, value), value)
    return merged


def test_set_without_and_get_are_a_dicts_and_leave_the_old_map_as_it_was():
    rng = random.Random(0)
    keys = [f"name{i}" for i in range(300)]
    mapping, model, history = PersistentMap(), {}, []
    for _ in range(2000):
        key = rng.choice(keys)
        history.append((mapping, dict(model)))
        if rng.random() < 0.3:
            mapping, _ = mapping.without(key), model.pop(key, None)
        else:
            value = rng.randrange(1, 9)
            mapping, model[key] = mapping.set(key, value), value
    assert _dict(mapping, keys) == model
    for old, old_model in history[::97]:
        assert _dict(old, keys) == old_model
    assert PersistentMap().without("absent") == PersistentMap()


def test_merge_combines_each_key_of_the_maps_and_shares_what_they_share():
    rng = random.Random(1)
    keys = [f"v{i}" for i in range(500)]
    start = PersistentMap()
    for key in keys:
        start = start.set(key, 1)
    for count in (1, 2, 3, 5):
        branches, models = [], []
        for _ in range(count):
            mapping, model = start, dict.fromkeys(keys, 1)
            for key in rng.sample(keys, 20):
                if rng.random() < 0.25:
                    mapping, _ = mapping.without(key), model.pop(key)
                else:
                    value = rng.randrange(2, 9)
                    mapping, model[key] = mapping.set(key, value), value
            branches.append(mapping)
            models.append(model)
        expected = {key: max(model[key] for model in models if key in model)
                    for key in keys if any(key in model for model in models)}
        assert _dict(merge(branches, _larger), keys) == expected
        assert _dict(merge(branches, _larger, before=start), keys) == expected
    assert merge([start, start], _larger)._root is start._root  # nothing to combine: shared whole
