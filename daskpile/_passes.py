"""The two passes as functions that run inside Dask tasks.

Pass 1 (scatter), one task per input partition ``k``: draw a pile for every row
from the generator keyed (seed, SCATTER, k), group the rows by pile and write
one scratch file.  Pass 2 (gather), one task per pile ``j``: read slice ``j``
of every scratch file, permute the rows with the generator keyed
(seed, GATHER, j), and hand the pile on (as a Parquet file or a pandas frame).

The functions here are what the graphs in ``_parquet`` and ``_dataframe`` call;
they take everything they need as arguments so a task is a pure function of its
inputs and can be run twice, anywhere, with the same result.
"""

from __future__ import annotations

import dataclasses

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from daskpile import _kernels, _random, _scratch
from daskpile._scratch import PileReader, Scratch
from daskpile._storage import atomic_sink, full_url, is_local


@dataclasses.dataclass(frozen=True)
class ScatterResult:
    partition: int
    rows: int
    scratch_bytes: int
    counts: np.ndarray


@dataclasses.dataclass(frozen=True)
class GatherResult:
    pile: int
    rows: int
    path: str
    bytes: int


def scatter_table(table: pa.Table, partition: int, piles: int, seed: int, scratch: Scratch) -> ScatterResult:
    """Pass 1 for one partition already in Arrow form."""
    rng = _random.generator(seed, _random.SCATTER, partition)
    grouped, counts = _kernels.scatter(table, piles, rng)
    nbytes = _scratch.write_piles(scratch.fs, scratch.path(partition), grouped, counts)
    return ScatterResult(partition, table.num_rows, nbytes, counts)


def scatter_parquet_file(
    fs: fsspec.AbstractFileSystem,
    path: str,
    partition: int,
    piles: int,
    seed: int,
    scratch: Scratch,
    schema: pa.Schema,
) -> ScatterResult:
    """Pass 1 for one Parquet file: read it as Arrow, check its schema, scatter it."""
    table = read_parquet(fs, path)
    check_schema(table.schema, schema, full_url(fs, path))
    return scatter_table(table, partition, piles, seed, scratch)


def gather_table(batches: list[pa.RecordBatch], pile: int, seed: int) -> pa.Table:
    """Pass 2 for one pile: its slices from every scratch file, concatenated and permuted."""
    if len({b.schema for b in batches}) <= 1:
        table = pa.Table.from_batches(batches)
    else:  # partitions of a Dask DataFrame may disagree (e.g. an all-null partition)
        table = pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")
    return _kernels.permute(table, _random.generator(seed, _random.GATHER, pile))


def gather_to_parquet(
    scratch: Scratch,
    piles: list[int],
    seed: int,
    fs: fsspec.AbstractFileSystem,
    paths: list[str],
    schema: pa.Schema,
) -> list[GatherResult]:
    """Pass 2 for a few piles, each written as one Parquet file (atomically).

    The piles are handled one after the other, so memory holds one pile; a
    task takes several so that each scratch file is opened once per task
    rather than once per pile.
    """
    results = []
    with PileReader(scratch) as reader:
        for pile, path in zip(piles, paths, strict=True):
            table = gather_table(reader.pile(pile), pile, seed).replace_schema_metadata(schema.metadata)
            write_parquet(table, fs, path)
            results.append(GatherResult(pile, table.num_rows, path, fs.size(path)))
    return results


def write_parquet(table: pa.Table, fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Write one pile.  Settings measured on the reference dataset (benchmarks/):
    dictionary-encoding every column doubles write time and, on shuffled data,
    makes files larger, so only columns that already are dictionaries get it."""
    dictionary_columns = [f.name for f in table.schema if pa.types.is_dictionary(f.type)]
    with atomic_sink(fs, path) as sink:
        pq.write_table(table, sink, compression="snappy", use_dictionary=dictionary_columns or False)


def read_parquet(fs: fsspec.AbstractFileSystem, path: str, reader=pq.read_table):
    """Read one Parquet file (or with ``reader=pq.read_schema`` its schema) as Arrow.

    Local files go to pyarrow's native reader; others through fsspec.
    """
    try:
        if is_local(fs):
            return reader(path)
        with fs.open(path, "rb") as f:
            return reader(f)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"cannot read {full_url(fs, path)!r} as Parquet: {e}") from e


def check_schema(actual: pa.Schema, expected: pa.Schema, where: str) -> None:
    """Fail with the names of the columns that differ from the dataset's schema."""
    if actual.remove_metadata().equals(expected.remove_metadata()):
        return
    expected_types = {f.name: f.type for f in expected}
    actual_types = {f.name: f.type for f in actual}
    problems = [f"{name}: missing" for name in expected_types if name not in actual_types]
    problems += [f"{name}: unexpected column" for name in actual_types if name not in expected_types]
    problems += [
        f"{name}: {actual_types[name]} instead of {t}"
        for name, t in expected_types.items()
        if name in actual_types and actual_types[name] != t
    ]
    if not problems:
        problems = [f"column order {actual.names} instead of {expected.names}"]
    raise ValueError(f"schema of {where!r} differs from the first file's: " + "; ".join(problems))


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
