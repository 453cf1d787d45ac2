"""The diff that ``migrate --diff`` prints (``accrewrite.unified_diff``): difflib's hunks for a
migration's diff, a correct diff for any pair of files, and a long file's in one pass."""

import difflib
import random

from accrewrite.unified_diff import _AnchoredMatcher, unified_diff

BEFORE = """\
import torch


def make_dataset(samples):
    images = torch.randn(samples, 8)
    return images


def main():
    model = Net().cuda()
    for x in loader:
        loss = model(x.cuda()).sum()
        loss.backward()
        optimizer.step()
""".splitlines(keepends=True)

AFTER = """\
import torch
import torch_xla


def make_dataset(samples):
    images = torch.randn(samples, 8)
    return images


atexit.register(torch_xla.sync)


def main():
    model = Net().to(xm.xla_device())
    for x in pl.MpDeviceLoader(loader, xm.xla_device()):
        loss = model(x).sum()
        loss.backward()
        xm.optimizer_step(optimizer)
""".splitlines(keepends=True)


def test_a_migration_s_diff_is_difflib_s():
    ours = list(unified_diff(BEFORE, AFTER, "a/train.py", "b/train.py"))
    assert ours == list(difflib.unified_diff(BEFORE, AFTER, "a/train.py", "b/train.py"))
    assert ours[:3] == ["--- a/train.py\n", "+++ b/train.py\n", "@@ -1,4 +1,5 @@\n"]


def test_no_change_no_diff():
    assert list(unified_diff(BEFORE, BEFORE, "a", "b")) == []


def applied(before: list[str], after: list[str]) -> list[str]:
    """``after`` rebuilt from ``before`` and the matcher's edits (equal parts checked)."""
    rebuilt, at_a, at_b = [], 0, 0
    for tag, i1, i2, j1, j2 in _AnchoredMatcher(before, after).get_opcodes():
        assert (i1, j1) == (at_a, at_b)
        if tag == "equal":
            assert before[i1:i2] == after[j1:j2]
        rebuilt += after[j1:j2]
        at_a, at_b = i2, j2
    assert (at_a, at_b) == (len(before), len(after))
    return rebuilt


def test_random_edits_give_correct_diffs():
    rng = random.Random(0)
    for _ in range(300):
        lines = [f"line {k}\n" for k in range(rng.randint(1, 30))] + ["\n"] * 3
        before = [rng.choice(lines) for _ in range(rng.randint(0, 250))]
        after = list(before)
        for _ in range(rng.randint(0, 15)):
            roll = rng.random()
            if roll < 0.4 and after:
                del after[rng.randrange(len(after))]
            elif roll < 0.8:
                after.insert(rng.randint(0, len(after)), rng.choice([*lines, f"new {rng.random()}\n"]))
            elif after:
                after[rng.randrange(len(after))] = rng.choice(lines)
        assert applied(before, after) == after


def test_a_long_file_changed_in_every_loop():
    # Thousands of near-identical loops, each changed: difflib's own matcher reads the file
    # again after each block it matches.
    loop = ["for x{k} in data:\n", "    x{k} = x{k}.cuda()\n", "    loss = model(x{k})\n",
            "    loss.backward()\n", "    optimizer.step()\n", "\n"]
    before = [line.format(k=k) for k in range(3000) for line in loop]
    after = [line.format(k=k) for k in range(3000) for line in loop if ".cuda()" not in line]
    diff = list(unified_diff(before, after, "a", "b"))
    assert sum(line.startswith("-    x") for line in diff) == 3000
    assert not any(line.startswith("+") for line in diff[2:])
    assert applied(before, after) == after
