"""Counter-based randomness keyed by (seed, stage, index).

Every random draw in daskpile comes from a generator built here from the run's
seed, the stage (scatter or gather) and the partition or pile index.  Nothing
depends on global RNG state, worker identity, thread or task order, so the
output is a pure function of (input partitions, piles, seed) and a task that
Dask runs twice draws exactly the same numbers.
"""

from __future__ import annotations

import numbers
import secrets

import numpy as np
import numpy.random  # (now: numpy imports it on first use, and a Ctrl-C landing in that import is lost)

SCATTER = 1  # pass 1: which pile each row of a partition goes to
GATHER = 2  # pass 2: the order of the rows inside a pile (or a sub-pile: piece = sub-pile + 1)
SPLIT = 3  # pass 2, a pile over its memory budget: which sub-pile each of its rows goes to
LOAD_ORDER = 4  # the loader, one epoch: the order of the piles
LOAD_GROUP = 5  # the loader, one epoch: the order of the rows of one group of piles of one canonical stream
LOAD_PILE = 6  # the loader, one epoch: a lazy pile's own order, before a canonical stream takes part of it
WINDOW = 7  # a moving window: the seed of generation g, keyed (seed, WINDOW, g)
COMPACT = (
    8  # a moving window's compaction: the order of one pile's merged rows, keyed (seed, COMPACT, generation, pile)
)
LOAD_TURN = 9  # the loader, one epoch: where a pile cut between canonical streams is cut (its rows turned)


def generator(seed: int, stage: int, index: int, piece: int = 0) -> np.random.Generator:
    """A Philox (counter-based) generator for one task: partition or pile ``index``, and its ``piece``.

    >>> generator(7, SCATTER, 0).integers(0, 10, 3).tolist() == generator(7, SCATTER, 0).integers(0, 10, 3).tolist()
    True
    """
    # Piece 0 keeps the three-part key, so a file read in one piece draws what it always drew.
    key = np.random.SeedSequence([seed, stage, index] + ([piece] if piece else []))
    return np.random.Generator(np.random.Philox(key))


def seed_for_ranks(seed: int | None, world_size: int) -> int:
    """``resolve_seed`` for a loader's ranks: None draws a seed in each process, so it is refused with more
    than one rank (they would share out different orders: rows lost and repeated).

    >>> seed_for_ranks(None, 1) >= 0, seed_for_ranks(3, 8)
    (True, 3)
    """
    if seed is None and world_size > 1:
        raise ValueError(
            f"seed=None draws a seed in each process, and the {world_size} ranks would then share out different "
            "orders (rows lost and repeated): pass the same seed on every rank (draw one on rank 0 and broadcast it)"
        )
    return resolve_seed(seed)


def keyed(seed: int, stage: int, *counters: int) -> np.random.Generator:
    """A Philox generator keyed by ``(seed, stage, *counters)``: the loader's (epoch, stream, group...).

    >>> keyed(7, LOAD_ORDER, 0).permutation(4).tolist() == keyed(7, LOAD_ORDER, 0).permutation(4).tolist()
    True
    """
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, stage, *counters])))


def resolve_seed(seed: int | None) -> int:
    """Validate a user seed, or draw a fresh one from the OS when it is None.

    >>> resolve_seed(42)
    42
    """
    if seed is None:
        return secrets.randbits(63)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return int(seed)
