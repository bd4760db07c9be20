"""``shuffle_parquet``: a Parquet dataset in, one shuffled Parquet file per pile out.

Arrow end to end: files are read with pyarrow, scattered to Arrow IPC scratch
files, gathered and written with pyarrow; pandas is never involved.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import posixpath
import tempfile

import dask
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from dask.utils import parse_bytes

from daskpile import _fingerprint, _manifest, _passes, _sizing
from daskpile import _run as run_state
from daskpile._compute import Timer, compute, memory_per_thread, total_threads
from daskpile._fingerprint import Fingerprint
from daskpile._random import resolve_seed
from daskpile._scratch import Scratch
from daskpile._storage import check_writable, filesystem, full_url, list_files, remove_tree
from daskpile._validate import check_piles


class VerificationError(RuntimeError):
    """The output is not a permutation of the input: rows were lost, duplicated or changed."""


class RunMismatchError(RuntimeError):
    """dest or scratch holds an unfinished run with other arguments."""


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
    fingerprint: Fingerprint | None = None
    resumed_partitions: int = 0
    resumed_piles: int = 0
    pile_plan: _sizing.PilePlan | None = None

    @property
    def seconds(self) -> float:
        return self.seconds_scatter + self.seconds_gather

    def __str__(self) -> str:
        resumed = ""
        if self.resumed_partitions or self.resumed_piles:
            resumed = f" (resumed: {self.resumed_partitions} partitions, {self.resumed_piles} piles reused)"
        verified = ", verified" if self.fingerprint is not None else ""
        return (
            f"shuffled {self.rows:,} rows from {len(self.source_files)} files into {self.piles} piles "
            f"(seed {self.seed}) at {self.dest}: pass 1 {self.seconds_scatter:.1f} s, "
            f"pass 2 {self.seconds_gather:.1f} s, {self.output_bytes / 2**20:,.0f} MiB written{verified}{resumed}"
        )


def shuffle_parquet(
    source: str | list[str],
    dest: str,
    piles: int | str = 512,
    *,
    seed: int | None = None,
    scratch: str | None = None,
    storage_options: dict | None = None,
    overwrite: bool = False,
    verify: bool = True,
    memory_per_pile: int | None = None,
    progress: bool = False,
    blocksize: int | str = _passes.BLOCKSIZE,
) -> ShuffleReport:
    """Shuffle the rows of a Parquet dataset into ``piles`` Parquet files.

    ``source`` is a file, a directory, a glob or a list of files, as fsspec
    URLs (``s3://...`` included).  ``dest`` receives ``part-00000.parquet`` ...
    one file per pile, and ``_daskpile.json``, written last.  Reading the parts
    in name order gives a uniformly random permutation of the input rows; the
    same seed and piles give byte-identical files on any cluster.

    With ``verify`` (the default) pass 1 fingerprints the input rows and pass 2
    the output rows; a difference raises ``VerificationError`` and no manifest
    is written.  If a run is interrupted, calling again with the same
    arguments resumes it (``seed=None`` adopts the interrupted run's seed).

    ``piles="auto"`` chooses the fewest piles (at least 4 per thread) whose
    largest fits ``memory_per_pile`` bytes, by default a quarter of a worker's
    memory per thread; the choice is in ``report.pile_plan`` and the manifest.

    A file larger than ``blocksize`` bytes in memory (its row groups'
    uncompressed size; default 256 MiB, as in ``dask.dataframe.read_parquet``)
    is read in pieces of whole row groups, so memory stays bounded by that, not
    by the size of the file.  Like ``piles`` and ``seed``, it decides the output.

    Runs on the current Dask client if there is one, else on Dask's default
    local scheduler.  ``progress=True`` shows Dask's progress bar for each pass
    and prints one summary line per pass.

    >>> report = shuffle_parquet("data/", "shuffled/", piles=64, seed=1)  # doctest: +SKIP
    >>> report.rows, len(report.files)  # doctest: +SKIP
    (10000000, 64)
    """
    blocksize = parse_bytes(blocksize) if isinstance(blocksize, str) else int(blocksize)
    if blocksize < 1:
        raise ValueError(f"blocksize must be positive, got {blocksize!r}")
    auto = piles == "auto"
    requested_piles = None if auto else check_piles(piles, auto_allowed=True)
    requested_seed = None if seed is None else resolve_seed(seed)
    source_fs, source_files = _source_files(source, storage_options)
    dest_fs, dest_path = filesystem(dest, storage_options)
    dest_url = full_url(dest_fs, dest_path)
    _check_overlap(source_fs, source_files, source, dest_fs, dest_path)
    source_urls = [full_url(source_fs, p) for p in source_files]
    infos = [source_fs.info(p) for p in source_files]
    stamps = run_state.file_stamps(infos)
    check_writable(dest_fs, dest_path, "dest")
    check_writable(*filesystem(scratch or tempfile.gettempdir(), storage_options), "scratch")

    schema = _dataset_schema(source_fs, source_files[0])
    scratch_dir = Scratch.create(
        scratch, storage_options, len(source_files), name=run_state.scratch_name(dest_url), make=False
    )
    previous = run_state.read(dest_fs, dest_path) or run_state.read(scratch_dir.fs, scratch_dir.directory)
    if previous is not None:
        differences = previous.differences(source_urls, stamps, requested_piles, requested_seed, blocksize)
        if differences and not overwrite:
            raise RunMismatchError(
                f"{dest_url!r} has an unfinished daskpile run (seed {previous.seed}, {previous.piles} piles) "
                f"that this call does not match: {'; '.join(differences)}. Run the same call again to resume it, "
                "or pass overwrite=True (--overwrite) to discard it."
            )
        if differences:
            scratch_dir.remove()
            _discard_unfinished(dest_fs, dest_path)
            previous = None
    seed = previous.seed if previous is not None else resolve_seed(requested_seed)
    pile_plan = None
    if auto:
        pile_plan = _sizing.plan(
            *_sizing.estimate_parquet(source_fs, source_files, [int(i.get("size") or 0) for i in infos]),
            memory_per_pile=memory_per_pile or int(memory_per_thread() * _sizing.MEMORY_PER_PILE_FRACTION),
            min_piles=4 * total_threads(),
        )
        if previous is not None:  # resuming: keep the run's count even if the cluster changed
            pile_plan = dataclasses.replace(pile_plan, piles=previous.piles)
    piles = pile_plan.piles if auto else requested_piles
    if progress and pile_plan is not None:
        print(f"piles=auto: {pile_plan}", flush=True)
    spec = run_state.RunSpec(tuple(source_urls), tuple(stamps), piles, seed, dest_url, blocksize)
    has_result, has_other_files = _dest_contents(dest_fs, dest_path)
    if (has_result or has_other_files) and not overwrite:
        what = "a finished daskpile result" if has_result else "files"
        raise FileExistsError(
            f"dest {dest_url!r} holds {what}; pass overwrite=True (--overwrite on the command line) to replace it"
        )
    staging = posixpath.join(dest_path, f".daskpile-staging-{spec.key()}") if has_result or has_other_files else None
    scratch_dir.fs.makedirs(scratch_dir.directory, exist_ok=True)
    run_state.write(scratch_dir.fs, scratch_dir.directory, spec)

    try:
        timer = Timer(progress)
        scattered = compute((
            dask.delayed(_passes.scatter_parquet_file)(
                source_fs, path, k, piles, seed, scratch_dir, schema, verify, source_urls[0], blocksize,
                dask_key_name=f"daskpile-scatter-{k}-{spec.key()}",
            )
            for k, path in enumerate(source_files)
        ), progress=progress)  # fmt: skip
        seconds_scatter = timer.seconds
    except (ValueError, TypeError, OSError) as e:
        scratch_dir.remove()  # bad input, or scratch full: nothing worth resuming
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise OSError(e.errno, f"scratch {full_url(scratch_dir.fs, scratch_dir.directory)!r} is full: {e}") from e
        raise

    counts = np.sum([r.counts for r in scattered], axis=0) if scattered else np.zeros(piles, dtype=np.int64)
    scratch_dir = dataclasses.replace(scratch_dir, pieces=tuple(r.pieces for r in scattered))
    timer.say(
        f"pass 1: {int(counts.sum()):,} rows read from {len(source_files)} files "
        f"({sum(int(i.get('size') or 0) for i in infos) / 2**20:,.0f} MiB), "
        f"{sum(r.scratch_bytes for r in scattered) / 2**20:,.0f} MiB to scratch"
    )
    target = staging or dest_path
    dest_fs.makedirs(target, exist_ok=True)
    run_state.write(dest_fs, dest_path, spec)
    timer = Timer(progress)
    names = [_manifest.part_name(j, piles) for j in range(piles)]
    gathered = []
    for group in compute((
        dask.delayed(_passes.gather_to_parquet)(
            scratch_dir, piles, group, [int(counts[j]) for j in group], seed, dest_fs,
            [posixpath.join(target, names[j]) for j in group], schema, verify,
            dask_key_name=f"daskpile-gather-{group[0]}-{spec.key()}",
        )
        for group in _pile_groups(piles, total_threads())
    ), progress=progress):  # fmt: skip
        gathered += group
    seconds_gather = timer.seconds
    timer.say(
        f"pass 2: {sum(r.rows for r in gathered):,} rows written to {piles} files "
        f"({sum(r.bytes for r in gathered) / 2**20:,.0f} MiB)"
    )

    rows = int(counts.sum())
    fingerprint = _check_fingerprints(scattered, gathered, dest_url) if verify else None
    if staging is not None:
        _commit_staged(dest_fs, dest_path, staging, names)
    manifest = _manifest.build(
        piles=piles,
        seed=seed,
        rows_per_pile=[r.rows for r in gathered],
        files=names,
        schema=schema,
        source_files=source_urls,
        seconds={"scatter": round(seconds_scatter, 3), "gather": round(seconds_gather, 3)},
        fingerprint=fingerprint,
        pile_plan=pile_plan,
    )
    manifest_path = _manifest.write(dest_fs, dest_path, manifest)
    run_state.remove(dest_fs, dest_path)
    scratch_dir.remove()
    return ShuffleReport(
        rows=rows,
        piles=piles,
        seed=seed,
        dest=dest_url,
        files=[full_url(dest_fs, posixpath.join(dest_path, n)) for n in names],
        manifest=full_url(dest_fs, manifest_path),
        source_files=source_urls,
        seconds_scatter=seconds_scatter,
        seconds_gather=seconds_gather,
        scratch_bytes=sum(r.scratch_bytes for r in scattered),
        output_bytes=sum(r.bytes for r in gathered),
        fingerprint=fingerprint,
        resumed_partitions=sum(r.reused for r in scattered),
        resumed_piles=sum(r.reused for r in gathered),
        pile_plan=pile_plan,
    )


def _check_fingerprints(scattered, gathered, dest_url: str) -> Fingerprint:
    read = _fingerprint.total(r.fingerprint for r in scattered)
    written = _fingerprint.total(r.fingerprint for r in gathered)
    if read != written:
        raise VerificationError(
            f"the output at {dest_url!r} is not a permutation of the input: read {read}, wrote {written}. "
            "No manifest was written."
        )
    return read


def _dest_contents(fs, dest_path: str) -> tuple[bool, bool]:
    """(holds a finished result, holds other files), ignoring daskpile's own run state."""
    if not fs.exists(dest_path):
        return False, False
    if not fs.isdir(dest_path):
        raise FileExistsError(f"dest {full_url(fs, dest_path)!r} is a file, not a directory")
    names = {posixpath.basename(p.rstrip("/")) for p in fs.ls(dest_path, detail=False)}
    has_result = _manifest.MANIFEST_NAME in names
    # Parts of an unfinished run (its run file is there, no manifest) are resumed, not refused.
    resumable_parts = not has_result and run_state.RUN_FILE in names
    others = {
        n
        for n in names - {_manifest.MANIFEST_NAME, run_state.RUN_FILE}
        if not n.startswith(".daskpile-staging-") and not (resumable_parts and n.startswith("part-"))
    }
    return has_result, bool(others)


def _discard_unfinished(fs, dest_path: str) -> None:
    """Remove what an interrupted run left in dest, keeping a finished result if there is one."""
    if not fs.exists(dest_path):
        return
    names = {posixpath.basename(p.rstrip("/")): p for p in fs.ls(dest_path, detail=False)}
    finished = _manifest.MANIFEST_NAME in names
    for name, path in names.items():
        if (
            name == run_state.RUN_FILE
            or name.startswith(".daskpile-staging-")
            or (not finished and name.startswith("part-"))
        ):
            fs.rm(path, recursive=True)


def _commit_staged(fs, dest_path: str, staging: str, names: list[str]) -> None:
    """Replace an old result by the staged new one: manifest first, so no reader takes the mix as complete."""
    old_manifest = posixpath.join(dest_path, _manifest.MANIFEST_NAME)
    if fs.exists(old_manifest):
        fs.rm(old_manifest)
    keep = set(names) | {run_state.RUN_FILE, posixpath.basename(staging)}
    for path in fs.ls(dest_path, detail=False):
        if posixpath.basename(path.rstrip("/")) not in keep:
            fs.rm(path, recursive=True)
    for name in names:
        fs.mv(posixpath.join(staging, name), posixpath.join(dest_path, name))
    remove_tree(fs, staging)


def _pile_groups(piles: int, threads: int) -> list[list[int]]:
    """Consecutive piles per pass-2 task: about 4 tasks per thread, for balance,
    and no more tasks than that, since each task opens every scratch file.

    >>> _pile_groups(5, 1)
    [[0, 1], [2, 3], [4]]
    """
    per_task = max(1, math.ceil(piles / (4 * threads)))
    return [list(range(j, min(j + per_task, piles))) for j in range(0, piles, per_task)]


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


def _check_overlap(source_fs, source_files, source, dest_fs, dest_path) -> None:
    if type(source_fs) is not type(dest_fs):
        return
    dest_dir = dest_path.rstrip("/") + "/"
    roots = source if isinstance(source, (list, tuple)) else [source]
    for root in [filesystem(r)[1] for r in roots] + source_files:
        root = root.rstrip("/")
        if dest_dir == root + "/" or root.startswith(dest_dir) or dest_dir.startswith(root + "/"):
            raise ValueError(f"dest {dest_path!r} overlaps the source {root!r}: choose a separate directory")


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
