"""``shuffle``: a Dask DataFrame in, a Dask DataFrame with one partition per pile out."""

from __future__ import annotations

import logging
import warnings
import weakref

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa

from daskpile import _passes, _sizing
from daskpile._random import resolve_seed
from daskpile._scratch import PileReader, Scratch
from daskpile._validate import check_piles

logger = logging.getLogger("daskpile")


def shuffle(
    ddf: dd.DataFrame,
    piles: int | str = 512,
    *,
    seed: int | None = None,
    scratch: str | None = None,
    storage_options: dict | None = None,
    memory_per_pile: int | None = None,
) -> dd.DataFrame:
    """Put the rows of a Dask DataFrame into a uniformly random order.

    The result is lazy and has exactly ``piles`` partitions: partition ``j``
    is pile ``j``, already permuted, and reading the partitions in order gives
    a uniformly random permutation of all rows.  Rows keep their index values,
    as with pandas ``sample(frac=1)``.  The same ``seed`` gives the same result
    on any scheduler and any number of workers.

    Pass 1 runs fused with whatever produced the partitions of ``ddf`` and
    writes one scratch file per partition under ``scratch`` (default: the local
    temporary directory; give a URL every worker can reach, e.g. ``s3://...``,
    when workers share no disk).  The scratch files are removed when the
    returned DataFrame, and everything derived from it, is garbage-collected.

    ``piles="auto"`` computes a few evenly spaced partitions of ``ddf`` (up to
    3) to measure their in-memory size, scales it by the number of partitions,
    and picks the fewest piles (at least 4 per thread) whose largest fits
    ``memory_per_pile`` (default: a quarter of a worker's memory per thread).
    The result has that many partitions; ``plan_piles(ddf)`` gives the same
    choice with its estimate, and it is logged (logger ``daskpile``, INFO).

    >>> import dask.dataframe as dd, pandas as pd
    >>> ddf = dd.from_pandas(pd.DataFrame({"x": range(10)}), npartitions=2)
    >>> shuffled = shuffle(ddf, piles=3, seed=0)
    >>> shuffled.npartitions, sorted(shuffled.compute()["x"])
    (3, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    """
    if not isinstance(ddf, dd.DataFrame):
        raise TypeError(f"shuffle takes a dask DataFrame, got {type(ddf).__name__}")
    if piles == "auto":
        plan = plan_piles(ddf, memory_per_pile)
        logger.info("piles='auto': %s", plan)
        piles = plan.piles
    piles = check_piles(piles, auto_allowed=True)
    seed = resolve_seed(seed)
    run = Scratch.create(scratch, storage_options, ddf.npartitions)
    # The graph holds `run`; once no collection refers to it, its scratch goes.
    weakref.finalize(run, _remove_quietly, Scratch(run.fs, run.directory, run.partitions))
    token = run.directory[-16:]

    scattered = ddf.map_partitions(
        _scatter_frame,
        piles,
        seed,
        run,
        partition_info=True,
        meta=pd.DataFrame({"partition": np.array([], dtype=np.int64), "rows": np.array([], dtype=np.int64)}),
        enforce_metadata=False,
        align_dataframes=False,
    )
    scatter_results = scattered.to_delayed()
    meta = ddf._meta
    piles_out = [
        dask.delayed(_gather_frame)(run, j, seed, meta, scatter_results, dask_key_name=f"daskpile-gather-{j}-{token}")
        for j in range(piles)
    ]
    return dd.from_delayed(piles_out, meta=meta, verify_meta=False)


SAMPLED_PARTITIONS = 3


def plan_piles(ddf: dd.DataFrame, memory_per_pile: int | None = None) -> _sizing.PilePlan:
    """The pile count ``shuffle(ddf, piles="auto")`` would choose, from a few computed partitions.

    >>> plan_piles(ddf, memory_per_pile=2**28).piles  # doctest: +SKIP
    12
    """
    n = ddf.npartitions
    picks = sorted({round(i * (n - 1) / max(SAMPLED_PARTITIONS - 1, 1)) for i in range(min(SAMPLED_PARTITIONS, n))})
    sizes = dask.compute(*[dask.delayed(_frame_size)(ddf.get_partition(i).to_delayed()[0]) for i in picks])
    rows = round(np.mean([r for r, _ in sizes]) * n)
    data_bytes = round(np.mean([b for _, b in sizes]) * n)
    return _sizing.plan_for_cluster(rows, data_bytes, memory_per_pile)


def _frame_size(frame: pd.DataFrame) -> tuple[int, int]:
    return len(frame), int(frame.memory_usage(deep=True, index=True).sum())


def _remove_quietly(run: Scratch) -> None:
    # Runs from the garbage collector or at exit, where an exception would only be printed.
    try:
        run.remove()
    except Exception as e:
        warnings.warn(f"daskpile could not remove its scratch directory {run.directory!r}: {e}", stacklevel=1)


def _scatter_frame(frame: pd.DataFrame, piles: int, seed: int, run: Scratch, partition_info=None) -> pd.DataFrame:
    partition = partition_info["number"]
    result = _passes.scatter_table(pandas_to_arrow(frame), partition, piles, seed, run)
    return pd.DataFrame({"partition": [partition], "rows": [result.rows]})


def _gather_frame(run: Scratch, pile: int, seed: int, meta: pd.DataFrame, _after_scatter: list) -> pd.DataFrame:
    with PileReader(run) as reader:
        return arrow_to_pandas(_passes.gather_table(reader.pile(pile), pile, seed), meta)


def pandas_to_arrow(frame: pd.DataFrame) -> pa.Table:
    """A pandas partition as Arrow, with its index kept as columns."""
    try:
        return pa.Table.from_pandas(frame, preserve_index=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise TypeError(f"daskpile cannot convert this partition to Arrow: {e}") from e


def arrow_to_pandas(table: pa.Table, meta: pd.DataFrame) -> pd.DataFrame:
    """A gathered pile back as pandas, with the dtypes of the input DataFrame."""
    frame = table.to_pandas()
    frame = frame[list(meta.columns)] if list(frame.columns) != list(meta.columns) else frame
    for name, dtype in meta.dtypes.items():
        # repr, because pandas calls some distinct string dtypes equal (NA vs NaN as missing value).
        if repr(frame[name].dtype) != repr(dtype) and not _unknown_categories(dtype):
            frame[name] = frame[name].astype(dtype)
    return frame


def _unknown_categories(dtype) -> bool:
    # Dask marks categoricals whose categories it does not know with this placeholder.
    return isinstance(dtype, pd.CategoricalDtype) and "__UNKNOWN_CATEGORIES__" in dtype.categories
