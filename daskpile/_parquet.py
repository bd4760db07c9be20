"""``shuffle_parquet``: a Parquet dataset in, one shuffled Parquet file per pile out.

Arrow end to end: files are read with pyarrow, scattered to Arrow IPC scratch
files, gathered and written with pyarrow; pandas is never involved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import math
import os
import posixpath
import re
import tempfile

import dask
import numpy as np
from dask.utils import parse_bytes

from daskpile import _fingerprint, _manifest, _passes, _scratch, _sizing
from daskpile import _run as run_state
from daskpile._compute import Timer, compute, total_threads
from daskpile._fingerprint import Fingerprint
from daskpile._random import resolve_seed
from daskpile._scratch import Scratch
from daskpile._storage import (
    check_writable,
    filesystem,
    full_url,
    is_local,
    is_temporary,
    remove_tree,
    write_bytes,
)
from daskpile._validate import check_piles
from daskpile._words import count
from daskpile.sources import plan_sources


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
    skipped_files: list[str] = dataclasses.field(default_factory=list)  # not Parquet, so not read
    source_description: dict = dataclasses.field(default_factory=dict)  # see SourcePlan.describe

    @property
    def seconds(self) -> float:
        return self.seconds_scatter + self.seconds_gather

    def __str__(self) -> str:
        resumed = ""
        if self.resumed_partitions or self.resumed_piles:
            resumed = (
                f" (resumed: {count(self.resumed_partitions, 'partition')}, {count(self.resumed_piles, 'pile')} reused)"
            )
        verified = ", verified" if self.fingerprint is not None else ""
        if self.skipped_files:
            shown = ", ".join(self.skipped_files[:3])
            more = ", ..." if len(self.skipped_files) > 3 else ""
            verified += f"; skipped, not Parquet: {count(len(self.skipped_files), 'file')} ({shown}{more})"
        return (
            f"shuffled {count(self.rows, 'row')} from {count(len(self.source_files), 'file')} into "
            f"{count(self.piles, 'pile')} "
            f"(seed {self.seed}) at {self.dest}: pass 1 {self.seconds_scatter:.1f} s, "
            f"pass 2 {self.seconds_gather:.1f} s, {self.output_bytes / 2**20:,.0f} MiB written{verified}{resumed}"
        )


def shuffle_parquet(
    source: str | list[str],
    dest: str,
    piles: int | str = "auto",
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
    partitioning="hive",
    schema: str = "strict",
    version: int | None = None,
    stray_files: str = "skip",
) -> ShuffleReport:
    """Shuffle the rows of a Parquet dataset into ``piles`` Parquet files.

    ``source`` is a file, a directory, a glob, or a list of any of these, as
    fsspec URLs (``s3://...`` included), or a Delta Lake or Iceberg table
    folder (its live files at its current version, or ``version=``; needs the
    ``delta`` or ``iceberg`` extra).  Key=value folders (``year=2024/``) become
    columns, typed as pyarrow infers them or as ``partitioning=`` declares
    (a ``pa.Schema``; ``"none"`` ignores the folders).  ``schema="strict"``
    wants every file to hold the same columns (order, nullability and
    ``string``/``large_string`` aside); ``schema="unify"`` takes their union,
    with types promoted as ``pa.unify_schemas(promote_options="permissive")``
    and missing columns as nulls.  Files that are not Parquet by their
    extension (``README.txt``) are skipped and listed in the report, or
    refused with ``stray_files="error"``.  ``dest`` receives ``part-00000.parquet`` ...
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
    by the size of the file.  Consecutive files smaller than that are read
    together, up to a sixteenth of ``blocksize`` on disk, so that 2,000 small
    files make a few dozen tasks.  Like ``piles`` and ``seed``, it decides the
    output.

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
    plan = plan_sources(
        source, storage_options, partitioning=partitioning, schema=schema, version=version, stray_files=stray_files
    )
    source_fs = plan.fs
    source_files = [f.path for f in plan.files]
    dest_fs, dest_path = filesystem(dest, storage_options)
    dest_url = full_url(dest_fs, dest_path)
    _check_overlap(source_fs, source_files, source, dest_fs, dest_path)
    source_urls = plan.urls
    stamps = plan.stamps
    check_writable(dest_fs, dest_path, "dest")
    check_writable(*filesystem(scratch or tempfile.gettempdir(), storage_options), "scratch")
    old_result = _check_dest(dest_fs, dest_path)
    partitions = plan.partitions(blocksize)

    schema = plan.schema
    scratch_dir = Scratch.create(
        scratch, storage_options, len(partitions), name=run_state.scratch_name(dest_url), make=False
    )
    previous = run_state.read(dest_fs, dest_path) or run_state.read(scratch_dir.fs, scratch_dir.directory)
    if previous is not None:
        differences = previous.differences(
            source_urls, stamps, requested_piles, requested_seed, blocksize, rows_per_file, _schema_key(plan)
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
    sizes = plan.sizes
    estimated_rows, estimated_bytes = _sizing.estimate_parquet(source_fs, source_files, sizes, plan.metadata)
    if memory_per_pile is not None and estimated_rows and estimated_bytes / estimated_rows > memory_per_pile:
        raise ValueError(  # checked now, not after pass 1
            f"a row takes about {estimated_bytes / estimated_rows:,.0f} bytes in memory, more than "
            f"memory_per_pile={memory_per_pile:,} (--memory-per-pile) allows a whole pile"
        )
    pile_plan = None
    if auto:
        pile_plan = _sizing.plan_for_cluster(estimated_rows, estimated_bytes, memory_per_pile)
        if previous is not None:  # resuming: keep the run's count even if the cluster changed
            pile_plan = dataclasses.replace(pile_plan, piles=previous.piles)
    piles = pile_plan.piles if auto else requested_piles
    scratch_dir = dataclasses.replace(scratch_dir, bands=_scratch.band_bounds(piles))
    if progress and pile_plan is not None:
        print(f"piles=auto: {pile_plan}", flush=True)
    if progress and (plan.reading.policy != "strict" or plan.table or plan.files[0].keys):
        print(f"source: {plan}", flush=True)
    spec = run_state.RunSpec(
        tuple(source_urls), tuple(stamps), piles, seed, dest_url, blocksize, rows_per_file, _schema_key(plan)
    )
    if old_result is not None and not overwrite:
        raise FileExistsError(
            f"dest {dest_url!r} holds a finished daskpile result; pass overwrite=True (--overwrite on the command "
            "line) to replace it"
        )
    staging = posixpath.join(dest_path, f".daskpile-staging-{spec.key()}") if old_result is not None else None
    if previous is not None and not _scratch_serves(scratch_dir, dest_fs, staging or dest_path, piles, seed):
        scratch_dir.remove()  # pass 2 consumed bands whose piles are no longer in dest: start pass 1 afresh
        previous = None
    if previous is None:  # a resumed run has part of its scratch already
        _sizing.check_space(scratch_dir.fs, scratch_dir.directory, estimated_bytes, dest_fs, dest_path, sum(sizes))
    scratch_dir.fs.makedirs(scratch_dir.directory, exist_ok=True)
    run_state.write(scratch_dir.fs, scratch_dir.directory, spec)

    with _resumable(scratch_dir, dest_url):
        try:
            timer = Timer(progress)
            scattered = compute((
                dask.delayed(_passes.scatter_partition)(
                    source_fs, files, k, piles, seed, scratch_dir, plan.reading, verify, blocksize,
                    dask_key_name=f"daskpile-scatter-{k}-{spec.key()}",
                )
                for k, files in enumerate(partitions)
            ), progress=progress)  # fmt: skip
            seconds_scatter = timer.seconds
        except (ValueError, TypeError, OSError) as e:
            scratch_dir.remove()  # bad input, or scratch full: nothing worth resuming
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                raise OSError(
                    e.errno, f"scratch {full_url(scratch_dir.fs, scratch_dir.directory)!r} is full: {e}"
                ) from e
            raise

        counts = np.sum([r.counts for r in scattered], axis=0) if scattered else np.zeros(piles, dtype=np.int64)
        scratch_dir = dataclasses.replace(scratch_dir, pieces=tuple(r.pieces for r in scattered))
        timer.say(
            f"pass 1: {count(int(counts.sum()), 'row')} read from {count(len(source_files), 'file')} in "
            f"{count(len(partitions), 'task')} "
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
            f"pass 2: {count(sum(r.rows for r in gathered), 'row')} written to {count(len(names), 'file')} "
            f"({sum(r.bytes for r in gathered) / 2**20:,.0f} MiB){split_note}"
        )

        rows = int(counts.sum())
        fingerprint = _check_fingerprints(scattered, gathered, dest_url) if verify else None
        if staging is not None:
            _commit_staged(dest_fs, dest_path, staging, names, old_result)
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
        source=plan.describe(),
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
        skipped_files=list(plan.skipped),
        source_description=plan.describe(),
    )


@contextlib.contextmanager
def _resumable(scratch_dir: Scratch, dest_url: str):
    """An interruption or an unexpected failure of the passes says what can be resumed, and where its state is."""
    try:
        yield
    except (KeyboardInterrupt, Exception) as e:
        if not isinstance(e, VerificationError) and scratch_dir.fs.exists(scratch_dir.directory):
            state = f"{full_url(scratch_dir.fs, scratch_dir.directory)} and {dest_url}"
            e.add_note(f"resumable: run the same call again; its state is in {state} (daskpile clean removes it "
                       "once it cannot be resumed)")  # fmt: skip
            with contextlib.suppress(AttributeError):
                e.daskpile_state = state  # for the command line's one line
        raise


def _check_fingerprints(scattered, gathered, dest_url: str) -> Fingerprint:
    read = _fingerprint.total(r.fingerprint for r in scattered)
    written = _fingerprint.total(r.fingerprint for r in gathered)
    if read != written:
        raise VerificationError(
            f"the output at {dest_url!r} is not a permutation of the input: read {read}, wrote {written}. "
            "No manifest was written."
        )
    return read


FOREIGN_NAMES_SHOWN = 10
STAGING_PREFIX = ".daskpile-staging-"
COMMIT_PLAN = "_commit.json"  # in a staging directory: the commit has begun; what it removes
_PART_NAME = re.compile(r"^part-\d{5,}(-\d{4})?\.parquet$")


def _dest_entries(fs, dest_path: str) -> dict[str, str]:
    """{name: path} of what dest holds (not dest itself: s3fs lists a "folder" marker object as an entry)."""
    entries = {}
    for path in fs.ls(dest_path, detail=False):
        path = path.rstrip("/")
        if path != dest_path.rstrip("/"):
            entries[posixpath.basename(path)] = path
    return entries


def _is_ours(name: str, manifest: dict | None, unfinished_run: bool) -> bool:
    """Whether daskpile wrote ``name`` in dest: its result, its run state, an unfinished run's parts, temporaries."""
    return (
        name in (_manifest.MANIFEST_NAME, run_state.RUN_FILE)
        or name in (manifest or {}).get("files", ())
        or name.startswith(STAGING_PREFIX)
        or _is_part_temporary(name)
        or (unfinished_run and bool(_PART_NAME.match(name)))
    )


def _check_dest(fs, dest_path: str) -> dict | None:
    """The manifest of the finished result dest holds (None if none); refuses a dest holding other files.

    daskpile's own files are its result (the files its manifest lists), its
    run state, the parts of an unfinished run and what a killed writer left.
    Anything else is the user's: daskpile never writes among it or deletes it,
    with or without ``overwrite``.  A commit that was interrupted is finished
    first.
    """
    if not fs.exists(dest_path):
        return None
    if not fs.isdir(dest_path):
        raise FileExistsError(f"dest {full_url(fs, dest_path)!r} is a file, not a directory")
    _finish_interrupted_commits(fs, dest_path)
    entries = _dest_entries(fs, dest_path)
    manifest = _manifest.read_at(fs, dest_path) if _manifest.MANIFEST_NAME in entries else None
    foreign = sorted(n for n in entries if not _is_ours(n, manifest, run_state.RUN_FILE in entries))
    if foreign:
        shown = ", ".join(foreign[:FOREIGN_NAMES_SHOWN]) + (
            f" and {len(foreign) - FOREIGN_NAMES_SHOWN} more" if len(foreign) > FOREIGN_NAMES_SHOWN else ""
        )
        raise FileExistsError(
            f"dest {full_url(fs, dest_path)!r} holds files daskpile did not write ({shown}); daskpile writes "
            "only into a new or empty directory or over its own result, and never removes other files: "
            "choose another dest"
        )
    return manifest


def _is_part_temporary(name: str) -> bool:
    """The temporary of a part file: left behind only by a writer killed before it could commit."""
    return name.startswith(".part-") and is_temporary(name)


def _remove_temporaries(fs, directory: str) -> None:
    for name, path in _dest_entries(fs, directory).items():
        if _is_part_temporary(name):
            fs.rm(path)


def _discard_unfinished(fs, dest_path: str) -> None:
    """Remove what an interrupted run left in dest, keeping a finished result if there is one."""
    if not fs.exists(dest_path):
        return
    entries = _dest_entries(fs, dest_path)
    finished = _manifest.MANIFEST_NAME in entries
    for name, path in entries.items():
        if (
            name == run_state.RUN_FILE
            or name.startswith(STAGING_PREFIX)
            or (not finished and _PART_NAME.match(name))
            or _is_part_temporary(name)
        ):
            fs.rm(path, recursive=True)


def _commit_staged(fs, dest_path: str, staging: str, names: list[str], old_result: dict) -> None:
    """Replace an old result by the staged new one: manifest first, so no reader takes the mix as complete.

    Removes exactly the old result's files (those its manifest lists) and
    daskpile's leftovers, nothing else.  What it will remove is written into
    the staging directory first, so an interrupted commit is finished by the
    next run (``_finish_interrupted_commits``) rather than left half done.
    """
    old_files = {n for n in old_result.get("files", []) if _PART_NAME.match(n)} - set(names)
    stale = [
        n for n in _dest_entries(fs, dest_path) if n.startswith(STAGING_PREFIX) and n != posixpath.basename(staging)
    ]
    plan = {"remove": sorted(old_files | set(stale)), "move": names}
    write_bytes(fs, posixpath.join(staging, COMMIT_PLAN), json.dumps(plan).encode())
    _finish_commit(fs, dest_path, staging)


def _finish_commit(fs, dest_path: str, staging: str) -> None:
    with fs.open(posixpath.join(staging, COMMIT_PLAN), "rb") as f:
        plan = json.load(f)
    old_manifest = posixpath.join(dest_path, _manifest.MANIFEST_NAME)
    if fs.exists(old_manifest):
        fs.rm(old_manifest)
    for name in plan["remove"]:
        remove_tree(fs, posixpath.join(dest_path, name))
    for name in plan["move"]:
        if fs.exists(posixpath.join(staging, name)):  # (those moved before an interruption are there already)
            fs.mv(posixpath.join(staging, name), posixpath.join(dest_path, name))
    remove_tree(fs, staging)


def _finish_interrupted_commits(fs, dest_path: str) -> None:
    """Finish a commit that an interruption stopped halfway: its run had passed verification."""
    for name, path in _dest_entries(fs, dest_path).items():
        if name.startswith(STAGING_PREFIX) and fs.exists(posixpath.join(path, COMMIT_PLAN)):
            _finish_commit(fs, dest_path, path)


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
    # Locally, through symlinks too: a dest that is a link to the source is the source.
    real = os.path.realpath if is_local(dest_fs) else (lambda p: p)
    dest_dir = real(dest_path).rstrip("/") + "/"
    roots = source if isinstance(source, (list, tuple)) else [source]
    for root in [filesystem(r)[1] for r in roots] + source_files:
        root = real(root).rstrip("/")
        if dest_dir == root + "/" or root.startswith(dest_dir) or dest_dir.startswith(root + "/"):
            raise ValueError(f"dest {dest_path!r} overlaps the source {root!r}: choose a separate directory")


def _scratch_serves(scratch_dir: Scratch, dest_fs, target: str, piles: int, seed: int) -> bool:
    """Whether an interrupted run's scratch can finish the run: every band pass 2 removed has its piles in dest.

    Pass 2 removes a band's scratch once the band's piles are written; if
    those piles were then deleted from dest (or are not this run's), the
    scratch can no longer make them, and resuming would fail in pass 2.
    """
    if scratch_dir.bands is None or not scratch_dir.fs.exists(scratch_dir.directory):
        return True
    present: dict[tuple[int, int], set[int]] = {}
    for path in scratch_dir.fs.ls(scratch_dir.directory, detail=False):
        parsed = _scratch.parse_scratch_name(posixpath.basename(path))
        if parsed is not None and parsed[2] is not None:
            present.setdefault(parsed[:2], set()).add(parsed[2])
    bands = range(len(scratch_dir.bands) - 1)
    removed = {b for found in present.values() if 0 in found for b in bands if b not in found}
    needed = [j for b in sorted(removed) for j in range(scratch_dir.bands[b], scratch_dir.bands[b + 1])]
    for j in needed:
        stamp = _passes.pile_stamp(dest_fs, posixpath.join(target, _manifest.part_name(j, piles)))
        if stamp is None or (stamp.get("pile"), stamp.get("piles"), stamp.get("seed")) != (j, piles, seed):
            return False
    return True


def _schema_key(plan) -> str:
    """What the rows of a run are made of besides its files: the schema they are read into, and how."""
    text = f"{plan.reading.policy}:{plan.schema.remove_metadata().to_string()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
