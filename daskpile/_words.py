"""Counts in words, for messages: "1 file", "2,000 files"."""

from __future__ import annotations

_IRREGULAR = {"entry": "entries", "scratch directory": "scratch directories"}


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1, with thousands separators.

    >>> count(1, "file"), count(2000, "row"), count(0, "pile")
    ('1 file', '2,000 rows', '0 piles')
    """
    return f"{n:,} {noun if n == 1 else _IRREGULAR.get(noun, noun + 's')}"
