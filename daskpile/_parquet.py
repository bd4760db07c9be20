"""``shuffle_parquet``: a Parquet dataset in, one shuffled Parquet file per pile out.

Arrow end to end: files are read with pyarrow, scattered to Arrow IPC scratch
files, gathered and written with pyarrow; pandas is never involved.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
import time

import dask
import pyarrow as pa
import pyarrow.parquet as pq

from daskpile import _manifest, _passes
from daskpile._random import resolve_seed
from daskpile._scratch import Scratch
from daskpile._storage import filesystem, full_url, list_files
from daskpile._validate import check_piles


@dataclasses.dataclass
class ShuffleReport:
    """What ``shuffle_parquet`` did.

    ``files`` are the output URLs in pile order; reading them in that order
    gives the shuffled dataset.
    """

    rows: int
    piles: int
    seed: int
    dest: str
    files: list[str]
    manifest: str
    source_files: list[str]
    seconds_scatter: float
    seconds_gather: float
    scratch_bytes: int
    output_bytes: int

    @property
    def seconds(self) -> float:
        return self.seconds_scatter + self.seconds_gather

    def __str__(self) -> str:
        return (
            f"shuffled {self.rows:,} rows from {len(self.source_files)} files into {self.piles} piles "
            f"(seed {self.seed}) at {self.dest}: pass 1 {self.seconds_scatter:.1f} s, "
            f"pass 2 {self.seconds_gather:.1f} s, {self.output_bytes / 2**20:,.0f} MiB written"
        )


def shuffle_parquet(
    source: str | list[str],
    dest: str,
    piles: int = 512,
    *,
    seed: int | None = None,
    scratch: str | None = None,
    storage_options: dict | None = None,
    overwrite: bool = False,
) -> ShuffleReport:
    """Shuffle the rows of a Parquet dataset into ``piles`` Parquet files.

    ``source`` is a file, a directory, a glob or a list of files, as fsspec
    URLs (``s3://...`` included).  ``dest`` receives ``part-00000.parquet`` ...
    one file per pile, and ``_daskpile.json``, written last.  Reading the parts
    in name order gives a uniformly random permutation of the input rows; the
    same seed and piles give byte-identical files on any cluster.

    Runs on the current Dask client if there is one, else on Dask's default
    local scheduler.

    >>> report = shuffle_parquet("data/", "shuffled/", piles=64, seed=1)  # doctest: +SKIP
    >>> report.rows, len(report.files)  # doctest: +SKIP
    (10000000, 64)
    """
    piles = check_piles(piles)
    seed = resolve_seed(seed)
    source_fs, source_files = _source_files(source, storage_options)
    dest_fs, dest_path = filesystem(dest, storage_options)
    _check_dest(source_fs, source_files, source, dest_fs, dest_path, overwrite)
    schema = _dataset_schema(source_fs, source_files[0])

    run = Scratch.create(scratch, storage_options, len(source_files))
    try:
        start = time.perf_counter()
        scattered = _compute(
            dask.delayed(_passes.scatter_parquet_file)(
                source_fs,
                path,
                k,
                piles,
                seed,
                run,
                schema,
                dask_key_name=f"daskpile-scatter-{k}-{run.directory[-16:]}",
            )
            for k, path in enumerate(source_files)
        )
        seconds_scatter = time.perf_counter() - start

        if overwrite:
            _remove_previous_result(dest_fs, dest_path)
        start = time.perf_counter()
        names = [_manifest.part_name(j, piles) for j in range(piles)]
        gathered = []
        for group in _compute(
            dask.delayed(_passes.gather_to_parquet)(
                run,
                group,
                seed,
                dest_fs,
                [posixpath.join(dest_path, names[j]) for j in group],
                schema,
                dask_key_name=f"daskpile-gather-{group[0]}-{run.directory[-16:]}",
            )
            for group in _pile_groups(piles, _total_threads())
        ):
            gathered += group
        seconds_gather = time.perf_counter() - start
    finally:
        run.remove()

    rows_in = sum(r.rows for r in scattered)
    rows_per_pile = [r.rows for r in gathered]
    expected_per_pile = sum(r.counts for r in scattered) if scattered else [0] * piles
    if sum(rows_per_pile) != rows_in or list(expected_per_pile) != rows_per_pile:
        raise RuntimeError(f"row counts do not add up: read {rows_in} rows, wrote {sum(rows_per_pile)}")
    if overwrite:
        _remove_stale_parts(dest_fs, dest_path, set(names))
    seconds = {"scatter": round(seconds_scatter, 3), "gather": round(seconds_gather, 3)}
    manifest = _manifest.build(
        piles=piles,
        seed=seed,
        rows_per_pile=rows_per_pile,
        files=names,
        schema=schema,
        source_files=[full_url(source_fs, p) for p in source_files],
        seconds=seconds,
    )
    manifest_path = _manifest.write(dest_fs, dest_path, manifest)
    return ShuffleReport(
        rows=rows_in,
        piles=piles,
        seed=seed,
        dest=full_url(dest_fs, dest_path),
        files=[full_url(dest_fs, r.path) for r in gathered],
        manifest=full_url(dest_fs, manifest_path),
        source_files=manifest["source_files"],
        seconds_scatter=seconds_scatter,
        seconds_gather=seconds_gather,
        scratch_bytes=sum(r.scratch_bytes for r in scattered),
        output_bytes=sum(r.bytes for r in gathered),
    )


def _pile_groups(piles: int, threads: int) -> list[list[int]]:
    """Consecutive piles per pass-2 task: about 4 tasks per thread, for balance,
    and no more tasks than that, since each task opens every scratch file.

    >>> _pile_groups(5, 1)
    [[0, 1], [2, 3], [4]]
    """
    per_task = max(1, math.ceil(piles / (4 * threads)))
    return [list(range(j, min(j + per_task, piles))) for j in range(0, piles, per_task)]


def _total_threads() -> int:
    """Threads of the current Dask client, or of this machine without one."""
    try:
        from distributed import get_client

        client = get_client()
    except (ImportError, ValueError):  # no client
        client = None
    if client is None or client.status != "running":
        return os.cpu_count() or 1
    return max(1, sum(client.nthreads().values()))


def _compute(tasks) -> list:
    return list(dask.compute(*list(tasks)))


def _source_files(source: str | list[str], storage_options: dict | None):
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("source is an empty list of files")
        fs, _ = filesystem(source[0], storage_options)
        files = []
        for url in source:
            fs_k, path = filesystem(url, storage_options)
            if not fs_k.isfile(path):
                raise FileNotFoundError(f"source file {url!r} does not exist")
            files.append(path)
        return fs, files
    fs, path = filesystem(source, storage_options)
    files = list_files(fs, path)
    if not files:
        raise FileNotFoundError(f"source {source!r} matches no data files")
    return fs, files


def _check_dest(source_fs, source_files, source, dest_fs, dest_path, overwrite) -> None:
    if type(source_fs) is type(dest_fs):
        dest_dir = dest_path.rstrip("/") + "/"
        roots = source if isinstance(source, (list, tuple)) else [source]
        for root in [filesystem(r)[1] for r in roots] + source_files:
            root = root.rstrip("/")
            if dest_dir == root + "/" or root.startswith(dest_dir) or dest_dir.startswith(root + "/"):
                raise ValueError(f"dest {dest_path!r} overlaps the source {root!r}: choose a separate directory")
    if dest_fs.exists(dest_path):
        if not dest_fs.isdir(dest_path):
            raise FileExistsError(f"dest {full_url(dest_fs, dest_path)!r} is a file, not a directory")
        if dest_fs.ls(dest_path) and not overwrite:
            raise FileExistsError(
                f"dest {full_url(dest_fs, dest_path)!r} exists and is not empty; pass overwrite=True to replace it"
            )


def _dataset_schema(fs, path: str) -> pa.Schema:
    """The first file's schema, which every file must share.

    A pandas RangeIndex recorded in the metadata describes the input files'
    row numbers, which are meaningless after a shuffle, so it is dropped.
    """
    schema = _passes.read_parquet(fs, path, pq.read_schema)
    pandas_meta = schema.pandas_metadata
    if pandas_meta and any(isinstance(c, dict) for c in pandas_meta.get("index_columns", [])):
        pandas_meta["index_columns"] = [c for c in pandas_meta["index_columns"] if not isinstance(c, dict)]
        schema = schema.with_metadata({**schema.metadata, b"pandas": json.dumps(pandas_meta).encode()})
    return schema


def _remove_previous_result(fs, dest_path: str) -> None:
    """First the manifest, so that a half-replaced result is never taken as complete."""
    manifest = posixpath.join(dest_path, _manifest.MANIFEST_NAME)
    if fs.exists(manifest):
        fs.rm(manifest)


def _remove_stale_parts(fs, dest_path: str, keep: set[str]) -> None:
    for path in fs.ls(dest_path, detail=False):
        if posixpath.basename(path) not in keep:
            fs.rm(path, recursive=True)
