"""Checks on user arguments, failing before anything is written."""

from __future__ import annotations

import numbers


def check_piles(piles: object) -> int:
    """``piles`` as an int, or a ValueError naming the bad value.

    >>> check_piles(512)
    512
    """
    if isinstance(piles, bool) or not isinstance(piles, numbers.Integral):
        raise ValueError(f"piles must be a positive integer, got {piles!r}")
    if piles < 1:
        raise ValueError(f"piles must be at least 1, got {piles}")
    return int(piles)
