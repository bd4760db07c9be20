"""Counts and sizes in words, for messages: "1 file", "2,000 files", "80 KiB"."""

from __future__ import annotations

_IRREGULAR = {"entry": "entries", "scratch directory": "scratch directories"}


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1, with thousands separators.

    >>> count(1, "file"), count(2000, "row"), count(0, "pile")
    ('1 file', '2,000 rows', '0 piles')
    """
    return f"{n:,} {noun if n == 1 else _IRREGULAR.get(noun, noun + 's')}"


def size(nbytes: float) -> str:
    """``nbytes`` in the largest binary unit it fills, a decimal under 10.

    >>> size(512), size(80 * 2**10), size(3.25 * 2**20), size(12 * 2**30)
    ('512 bytes', '80 KiB', '3.2 MiB', '12 GiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.{1 if nbytes < 10 * scale else 0}f} {unit}"
    return count(int(nbytes), "byte")
