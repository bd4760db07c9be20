"""Counts and sizes in words, for messages: "1 file", "2,000 files", "4.2 MiB"."""

from __future__ import annotations

_IRREGULAR = {"entry": "entries", "scratch directory": "scratch directories"}


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1, with thousands separators.

    >>> count(1, "file"), count(2000, "row"), count(0, "pile")
    ('1 file', '2,000 rows', '0 piles')
    """
    return f"{n:,} {noun if n == 1 else _IRREGULAR.get(noun, noun + 's')}"


def size(nbytes: float) -> str:
    """``nbytes`` in MiB, with a decimal under 10 MiB, in KiB under 1 MiB: a small run's "0 MiB" said nothing.

    >>> size(5_000 * 2**20), size(4.24 * 2**20), size(18_000), size(0)
    ('5,000 MiB', '4.2 MiB', '18 KiB', '0 KiB')
    """
    if nbytes >= 10 * 2**20:
        return f"{nbytes / 2**20:,.0f} MiB"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / 2**10:,.0f} KiB"


def human_size(nbytes: float) -> str:
    """``nbytes`` in the largest binary unit under 1024 of it, for messages.

    >>> human_size(512), human_size(80 * 2**10), human_size(3.25 * 2**20)
    ('512.0 B', '80.0 KiB', '3.2 MiB')
    """
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if nbytes < 1024:
            return f"{nbytes:,.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:,.1f} TiB"
