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

from daskpile import _fingerprint, _manifest, _passes, _scratch, _sizing
from daskpile import _run as run_state
from daskpile._compute import Timer, compute, total_threads
from daskpile._fingerprint import Fingerprint
from daskpile._random import resolve_seed
from daskpile._scratch import Scratch
from daskpile._storage import check_writable, dataset_files, filesystem, full_url, is_temporary, remove_tree
from daskpile._validate import check_piles


class VerificationError(RuntimeError):
    """The output is not a permutation of the input: rows were lost, duplicated or changed."""


class RunMismatchError(RuntimeError):
    """dest or scratch holds an unfinished run with other arguments."""


class PileTooLargeError(RuntimeError):
    """A pile is over its memory budget and ``on_oversize="error"`` was asked for."""


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
    on_oversize: str = "split",
    rows_per_file: int | None = None,
) -> ShuffleReport:
    """Shuffle the rows of a Parquet dataset into ``piles`` Parquet files.

    ``source`` is a file, a directory, a glob or a list of files, as fsspec
    URLs (``s3://...`` included).  ``dest`` receives ``part-00000.parquet`` ...
    one file per pile, and ``_daskpile.json``, written last.  Reading the parts
    in name order gives a uniformly random permutation of the input rows; the
    same seed and piles give byte-identical files on any cluster (with
    ``piles="auto"``, give ``memory_per_pile`` too: the default depends on the
    workers' memory).

    With ``verify`` (the default) pass 1 fingerprints the input rows and pass 2
    the output rows; a difference raises ``VerificationError`` and no manifest
    is written.  If a run is interrupted, calling again with the same
    arguments resumes it (``seed=None`` adopts the interrupted run's seed).

    ``piles="auto"`` chooses the fewest piles (at least 4 per thread) whose
    largest fits ``memory_per_pile`` bytes, by default a quarter of a worker's
    memory per thread; the choice is in ``report.pile_plan`` and the manifest.
    When a budget is known (``memory_per_pile`` given, or ``piles="auto"``) and
    pass 1 shows a pile over it, that pile is split by a further random level
    and written as consecutive files ``part-0000j-0000.parquet``, ...
    (``on_oversize="split"``), or ``PileTooLargeError`` is raised before pass 2
    writes anything (``on_oversize="error"``).

    ``rows_per_file=N`` writes files of exactly N rows (the last one the
    remainder) instead of one per pile: pass 2 keeps the permuted piles in
    scratch and a third pass cuts their sequence into equal files.  It is the
    same uniformly random sequence, only cut differently.

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
    if rows_per_file is not None and (isinstance(rows_per_file, bool) or int(rows_per_file) < 1):
        raise ValueError(f"rows_per_file must be a positive integer, got {rows_per_file!r}")
    if on_oversize not in ("split", "error"):
        raise ValueError(f"on_oversize must be 'split' or 'error', got {on_oversize!r}")
    auto = piles == "auto"
    requested_piles = None if auto else check_piles(piles, auto_allowed=True)
    requested_seed = None if seed is None else resolve_seed(seed)
    source_fs, source_files = dataset_files(source, storage_options)
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
        differences = previous.differences(
            source_urls, stamps, requested_piles, requested_seed, blocksize, rows_per_file
        )
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
    sizes = [int(i.get("size") or 0) for i in infos]
    estimated_rows, estimated_bytes = _sizing.estimate_parquet(source_fs, source_files, sizes)
    pile_plan = None
    if auto:
        pile_plan = _sizing.plan_for_cluster(estimated_rows, estimated_bytes, memory_per_pile)
        if previous is not None:  # resuming: keep the run's count even if the cluster changed
            pile_plan = dataclasses.replace(pile_plan, piles=previous.piles)
    piles = pile_plan.piles if auto else requested_piles
    scratch_dir = dataclasses.replace(scratch_dir, bands=_scratch.band_bounds(piles))
    if progress and pile_plan is not None:
        print(f"piles=auto: {pile_plan}", flush=True)
    spec = run_state.RunSpec(tuple(source_urls), tuple(stamps), piles, seed, dest_url, blocksize, rows_per_file)
    has_result, has_other_files = _dest_contents(dest_fs, dest_path)
    if (has_result or has_other_files) and not overwrite:
        what = "a finished daskpile result" if has_result else "files"
        raise FileExistsError(
            f"dest {dest_url!r} holds {what}; pass overwrite=True (--overwrite on the command line) to replace it"
        )
    staging = posixpath.join(dest_path, f".daskpile-staging-{spec.key()}") if has_result or has_other_files else None
    if previous is None:  # a resumed run has part of its scratch already
        _sizing.check_space(scratch_dir.fs, scratch_dir.directory, estimated_bytes, dest_fs, dest_path, sum(sizes))
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
        f"({sum(sizes) / 2**20:,.0f} MiB), "
        f"{sum(r.scratch_bytes for r in scattered) / 2**20:,.0f} MiB to scratch"
    )
    try:
        split = _oversized_piles(counts, scattered, memory_per_pile, pile_plan, on_oversize)
    except PileTooLargeError:
        scratch_dir.remove()  # a rerun needs other arguments, so nothing here can be resumed
        raise
    target = staging or dest_path
    dest_fs.makedirs(target, exist_ok=True)
    run_state.write(dest_fs, dest_path, spec)
    timer = Timer(progress)
    names, gathered = _pass_2(
        scratch_dir, counts, split, seed, dest_fs, target, schema, verify,
        _budget(memory_per_pile, pile_plan), spec.key(), rows_per_file, progress,
    )  # fmt: skip
    seconds_gather = timer.seconds
    _remove_temporaries(dest_fs, target)  # of writers killed mid-file, in this run or an interrupted one
    split_note = f", {len(split)} piles over memory_per_pile split in {sum(split.values())}" if split else ""
    split_note += f", cut into files of {rows_per_file:,} rows" if rows_per_file else ""
    timer.say(
        f"pass 2: {sum(r.rows for r in gathered):,} rows written to {len(names)} files "
        f"({sum(r.bytes for r in gathered) / 2**20:,.0f} MiB){split_note}"
    )

    rows = int(counts.sum())
    fingerprint = _check_fingerprints(scattered, gathered, dest_url) if verify else None
    if staging is not None:
        _commit_staged(dest_fs, dest_path, staging, names)
    manifest = _manifest.build(
        piles=piles,
        seed=seed,
        rows_per_pile=[int(counts[j]) for j in range(piles)],
        files=names,
        rows_per_file=[r.rows for r in gathered],
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
        if not n.startswith(".daskpile-staging-")
        and not (resumable_parts and (n.startswith("part-") or _is_part_temporary(n)))
    }
    return has_result, bool(others)


def _is_part_temporary(name: str) -> bool:
    """The temporary of a part file: left behind only by a writer killed before it could commit."""
    return name.startswith(".part-") and is_temporary(name)


def _remove_temporaries(fs, directory: str) -> None:
    for path in fs.ls(directory, detail=False):
        if _is_part_temporary(posixpath.basename(path.rstrip("/"))):
            fs.rm(path)


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
            or _is_part_temporary(name)
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


def _pile_groups(piles: list[int], threads: int) -> list[list[int]]:
    """Consecutive piles per pass-2 task: about 4 tasks per thread, for balance,
    and no more tasks than that, since each task opens every scratch file.

    >>> _pile_groups([0, 1, 2, 3, 4], 1)
    [[0, 1], [2, 3], [4]]
    """
    per_task = max(1, math.ceil(len(piles) / (4 * threads)))
    return [piles[i : i + per_task] for i in range(0, len(piles), per_task)]


def _pass_2(
    scratch_dir, counts, split, seed, dest_fs, target, schema, verify, budget, key, rows_per_file, progress
) -> tuple[list[str], list]:
    """Pass 2 (and for ``rows_per_file``, pass 3): the output files' names and their results, in sequence order."""
    piles = len(counts)
    if rows_per_file is None:
        subs = [range(split[j]) if j in split else [None] for j in range(piles)]
        names = [_manifest.part_name(j, piles, sub) for j in range(piles) for sub in subs[j]]
        tasks, groups = _gather_tasks(scratch_dir, counts, split, seed, dest_fs, target, schema, verify, budget, key)
        if split:  # the tasks splitting a pile read its band too, and are not counted: remove at the end
            return names, _in_order(compute(tasks, progress=progress))
        with _scratch.BandRemover(scratch_dir, [sorted({scratch_dir.band_of(j) for j in g}) for g in groups]) as bands:
            return names, _in_order(compute(tasks, progress=progress, on_done=bands.task_done))
    # pass 2 writes the permuted piles to scratch, pass 3 cuts their sequence into equal files
    tasks, _ = _gather_tasks(scratch_dir, counts, split, seed, scratch_dir.fs, None, schema, False, budget, key)
    permuted = _in_order(compute(tasks, progress=progress))
    ranges = _file_ranges([(r.path, r.rows) for r in permuted], rows_per_file)
    names = [_manifest.part_name(f, len(ranges)) for f in range(len(ranges))]
    rechunk = [
        dask.delayed(_passes.rechunk_to_parquet)(
            file_ranges, scratch_dir.fs, dest_fs, posixpath.join(target, names[f]), f, seed, schema, verify,
            dask_key_name=f"daskpile-rechunk-{f}-{key}",
        )
        for f, file_ranges in enumerate(ranges)
    ]  # fmt: skip
    return names, compute(rechunk, progress=progress)  # in file order already


def _gather_tasks(scratch_dir, counts, split, seed, fs, target, schema, verify, budget, key) -> tuple[list, list]:
    """Pass 2 as Dask tasks: groups of piles, and for each split pile its split then groups of sub-piles.

    Into Parquet files in ``target``, or with ``target=None`` into permuted
    Arrow files in scratch (for ``rows_per_file``).  Returns the tasks, and
    the piles of each of the first tasks (those of piles that are not split).
    """
    piles = len(counts)
    as_arrow = target is None

    def path(j, sub=None):
        if as_arrow:
            return posixpath.join(scratch_dir.directory, "permuted", _manifest.part_name(j, piles, sub) + ".arrow")
        return posixpath.join(target, _manifest.part_name(j, piles, sub))

    threads = total_threads()
    # Dask starts independent tasks in descending order of their keys (dask.order's tie-break), so with
    # zero-padded pile numbers the tasks of band 0 run last: the band that stays until the end anyway.
    groups = _pile_groups([j for j in range(piles) if j not in split], threads)
    tasks = [
        dask.delayed(_passes.gather_to_parquet)(
            scratch_dir, piles, group, [int(counts[j]) for j in group], seed, fs, [path(j) for j in group], schema,
            verify, as_arrow=as_arrow, dask_key_name=f"daskpile-gather-{group[0]:06d}-{key}",
        )
        for group in groups
    ]  # fmt: skip
    for j, subs in split.items():
        split_result = dask.delayed(_passes.split_pile)(
            scratch_dir, j, subs, seed, budget // 2, dask_key_name=f"daskpile-split-{j}-{key}"
        )
        tasks += [
            dask.delayed(_passes.gather_split_to_parquet)(
                split_result, piles, group, seed, fs, [path(j, s) for s in group], schema, verify, as_arrow,
                dask_key_name=f"daskpile-gather-{j}-{group[0]}-{key}",
            )
            for group in _pile_groups(list(range(subs)), threads)
        ]  # fmt: skip
    return tasks, groups


def _in_order(groups) -> list:
    """Results of pass-2 tasks (a list each), flattened into the order of the output sequence."""
    return sorted((r for group in groups for r in group), key=lambda r: (r.pile, -1 if r.sub is None else r.sub))


def _file_ranges(units: list[tuple[str, int]], rows_per_file: int) -> list[list[tuple[str, int, int]]]:
    """The sequence of (permuted pile file, rows) cut into files of ``rows_per_file`` rows (the last one shorter).

    >>> _file_ranges([("a", 3), ("b", 4)], 5)
    [[('a', 0, 3), ('b', 0, 2)], [('b', 2, 4)]]
    """
    files: list[list[tuple[str, int, int]]] = [[]]
    room = rows_per_file
    for path, rows in units:
        start = 0
        while start < rows:
            if room == 0:
                files.append([])
                room = rows_per_file
            take = min(room, rows - start)
            files[-1].append((path, start, start + take))
            start += take
            room -= take
    return files


def _budget(memory_per_pile: int | None, pile_plan: _sizing.PilePlan | None) -> int | None:
    """The memory a pile may take: given, or the one ``piles="auto"`` planned with."""
    return memory_per_pile or (pile_plan.memory_per_pile if pile_plan else None)


def _oversized_piles(counts, scattered, memory_per_pile, pile_plan, on_oversize: str) -> dict[int, int]:
    """{pile: sub-piles} for the piles over their memory budget, or PileTooLargeError.

    Sizes come from pass 1: a pile's rows times the scratch bytes per row (the
    uncompressed Arrow size).  Without a budget (a pile count given, no
    ``memory_per_pile``) nothing is split, so the output never depends on the
    cluster's memory.
    """
    budget = _budget(memory_per_pile, pile_plan)
    rows = int(counts.sum())
    if budget is None or rows == 0:
        return {}
    bytes_per_row = sum(r.scratch_bytes for r in scattered) / rows
    over = {j: int(n) for j, n in enumerate(counts) if n * bytes_per_row > budget}
    if over and on_oversize == "error":
        j = max(over, key=over.get)
        raise PileTooLargeError(
            f"{len(over)} of {len(counts)} piles are over memory_per_pile={budget:,} bytes, the largest pile {j} "
            f"with {over[j]:,} rows, about {over[j] * bytes_per_row:,.0f} bytes: pass more piles, a larger "
            "memory_per_pile, or on_oversize='split'"
        )
    return {j: max(2, _sizing.plan(n, round(n * bytes_per_row), budget).piles) for j, n in over.items()}


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
