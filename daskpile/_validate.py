"""Checks on user arguments, failing before anything is written."""

from __future__ import annotations

import numbers


def check_piles(piles: object, auto_allowed: bool = False) -> int:
    """``piles`` as an int, or a ValueError naming the bad value (and 'auto' if that is allowed).

    >>> check_piles(512)
    512
    """
    if isinstance(piles, bool) or not isinstance(piles, numbers.Integral):
        expected = "a positive integer or 'auto'" if auto_allowed else "a positive integer"
        raise ValueError(f"piles must be {expected}, got {piles!r}")
    if piles < 1:
        raise ValueError(f"piles must be at least 1, got {piles}")
    return int(piles)
