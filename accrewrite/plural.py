"""Counts in words: ``1 fix``, ``2 fixes``, ``1 file``."""


def counted(number: int, noun: str, nouns: str = "") -> str:
    return f"{number} {noun if number == 1 else nouns or noun + 's'}"
