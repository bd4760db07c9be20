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
    if piles > MAX_PILES:
        raise ValueError(f"piles must be at most {MAX_PILES:,} (a pile's number is 32 bits), got {piles:,}")
    return int(piles)


MAX_PILES = 2**32


def check_bytes(name: str, value: object) -> int | None:
    """A size in bytes given as an int or as Dask writes sizes (``"64MiB"``, ``"2GB"``); None stays None.

    >>> check_bytes("memory_per_pile", "64MiB")
    67108864
    """
    if value is None:
        return None
    given = value
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            value = parse_bytes(value)
        except ValueError:
            raise ValueError(f"{name} must be a number of bytes or a size such as '512MiB', got {value!r}") from None
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and float(value).is_integer():
        value = int(value)  # 1e9
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive number of bytes or a size such as '512MiB', got {given!r}")
    return int(value)
