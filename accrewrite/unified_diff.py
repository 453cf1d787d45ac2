"""The unified diff of a file and its migration, in time that grows with the file.

difflib's matcher takes the longest block the two sides have in common, then does the same on
each side of it. A long script with a change in every loop has many blocks of the same length,
and the first one, near the start, wins each time: the rest of the file is read again after each
block, and time grows with the square of the file (a 2,000-loop script: 8 s; twice the loops,
four times the time). Here the lines that occur exactly once on each side and in the same order
(patience diff's anchors) match first, grown over the equal lines around them as difflib grows
its blocks, and difflib matches what lies between two of them, which is short in a migration (a
file without such lines is difflib's alone). The hunks are written as ``difflib.unified_diff``
writes them, three lines of context; the bundled examples' and fixtures' diffs come out the
same but for a few that place an inserted line on the other side of a blank one.
"""

from __future__ import annotations

import difflib
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator

_CONTEXT = 3


def unified_diff(before: list[str], after: list[str], from_file: str, to_file: str) -> Iterator[str]:
    """The lines of the unified diff from ``before`` to ``after`` (lines with their ends)."""
    groups = _AnchoredMatcher(before, after).get_grouped_opcodes(_CONTEXT)
    for index, group in enumerate(groups):
        if index == 0:
            yield f"--- {from_file}\n"
            yield f"+++ {to_file}\n"
        first, last = group[0], group[-1]
        yield f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                yield from (" " + line for line in before[i1:i2])
                continue
            if tag in ("replace", "delete"):
                yield from ("-" + line for line in before[i1:i2])
            if tag in ("replace", "insert"):
                yield from ("+" + line for line in after[j1:j2])


def line_opcodes(before: list[str], after: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib's opcodes from ``before`` to ``after``, matched as the diff matches them."""
    return _AnchoredMatcher(before, after).get_opcodes()


def _range(start: int, stop: int) -> str:
    """A hunk's range as unified diffs write it: ``first,length``, ``first`` for one line."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


class _AnchoredMatcher(difflib.SequenceMatcher):
    def __init__(self, before: list[str], after: list[str]):
        super().__init__(None, before, after)

    def get_matching_blocks(self) -> list[difflib.Match]:
        if self.matching_blocks is not None:
            return self.matching_blocks
        a, b = self.a, self.b
        blocks = []
        start_a = start_b = 0
        for i, j, size in [*_extended(a, b, _anchors(a, b)), (len(a), len(b), 0)]:
            between = difflib.SequenceMatcher(None, a[start_a:i], b[start_b:j])
            blocks += [(start_a + x, start_b + y, n) for x, y, n in between.get_matching_blocks() if n]
            if size:
                blocks.append((i, j, size))
            start_a, start_b = i + size, j + size
        merged: list[list[int]] = []
        for i, j, size in blocks:
            if merged and merged[-1][0] + merged[-1][2] == i and merged[-1][1] + merged[-1][2] == j:
                merged[-1][2] += size
            else:
                merged.append([i, j, size])
        self.matching_blocks = [difflib.Match(*block) for block in [*merged, (len(a), len(b), 0)]]
        return self.matching_blocks


def _extended(a: list[str], b: list[str], anchors: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The runs of adjacent anchors as blocks, each grown over the equal lines around it. As
    difflib takes the longest block first, the block whose run of equal lines is the longest
    (not counting lines that are common in a long file, which difflib does not start a match
    on) grows first: lines that two blocks could both take (blank lines between a function and
    an inserted statement) go to it."""
    common = set()
    if len(b) >= 200:  # difflib's "autojunk": lines in more than 1% of a long file
        common = {line for line, count in Counter(b).items() if count > len(b) // 100 + 1}
    runs: list[list[int]] = []
    for i, j in anchors:
        if runs and runs[-1][0] - runs[-1][1] == i - j and all(
                a[x] == b[x - i + j] and a[x] not in common for x in range(runs[-1][0] + runs[-1][2], i)):
            runs[-1][2] = i + 1 - runs[-1][0]  # one run of equal lines holds both
        else:
            runs.append([i, j, 1])

    def grown(k: int, over_common: bool) -> tuple[int, int, int]:
        """Run ``k`` grown over the equal lines between its neighbours."""
        i, j, size = runs[k]
        low_a, low_b = (runs[k - 1][0] + runs[k - 1][2], runs[k - 1][1] + runs[k - 1][2]) if k else (0, 0)
        high_a, high_b = (runs[k + 1][0], runs[k + 1][1]) if k + 1 < len(runs) else (len(a), len(b))
        while i > low_a and j > low_b and a[i - 1] == b[j - 1] and (over_common or b[j - 1] not in common):
            i, j, size = i - 1, j - 1, size + 1
        while i + size < high_a and j + size < high_b and a[i + size] == b[j + size] and (
                over_common or b[j + size] not in common):
            size += 1
        return i, j, size

    longest = [grown(k, over_common=False)[2] for k in range(len(runs))]
    for k in sorted(range(len(runs)), key=lambda k: (-longest[k], runs[k][0])):
        runs[k] = list(grown(k, over_common=True))
    return [tuple(run) for run in runs]


def _anchors(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """The pairs of equal lines that occur once in ``a`` and once in ``b``, the longest run of
    them in the same order on both sides (patience sorting)."""
    count_a, count_b = Counter(a), Counter(b)
    where_b = {line: j for j, line in enumerate(b) if count_b[line] == 1}
    pairs = [(i, where_b[line]) for i, line in enumerate(a) if count_a[line] == 1 and line in where_b]
    # Piles by their top's position in b; each pair remembers the top of the pile before its own.
    tops: list[int] = []
    top_pair: list[int] = []
    previous: list[int] = []
    for index, (_, j) in enumerate(pairs):
        pile = bisect_left(tops, j)
        previous.append(top_pair[pile - 1] if pile else -1)
        if pile == len(tops):
            tops.append(j)
            top_pair.append(index)
        else:
            tops[pile] = j
            top_pair[pile] = index
    chain = []
    index = top_pair[-1] if top_pair else -1
    while index >= 0:
        chain.append(pairs[index])
        index = previous[index]
    return chain[::-1]
