"""``shuffle_parquet``: files in (Parquet, text, Arrow, ORC, tables), one shuffled file per pile out.

A run is a list of steps (``_Run``): check the places, read what dest holds,
find an interrupted run to resume, size the piles, pass 1, pass 2, check the
fingerprints, commit.  Arrow end to end: files are read with pyarrow,
scattered to Arrow IPC scratch files, gathered and written with pyarrow;
pandas is never involved.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import functools
import hashlib
import json
import math
import posixpath
import re
import tempfile
import warnings

import dask
import numpy as np

from daskpile._compute import (
    Timer,
    Units,
    WorkerKilled,
    compute,
    counting_worker_deaths,
    current_client,
    exception_chain,
    giving_memory_back,
    said_while_slow,
    shows_progress_lines,
    task,
    task_of,
    total_threads,
    worker_memory_per_thread,
)
from daskpile._random import resolve_seed
from daskpile._storage import (
    FileChangedError,
    FileVersion,
    StoresApartError,
    as_urls,
    check_private_directory,
    check_writable,
    exists,
    file_stamp,
    filesystem,
    full_url,
    listed_infos,
    make_private_directory,
    redacting_errors,
    urls_said,
    versions_now,
)
from daskpile._validate import check_bytes, check_piles
from daskpile._words import count, human_size, size
from daskpile.checks import _fingerprint
from daskpile.checks._fingerprint import Fingerprint
from daskpile.engine import _dest, _lease, _manifest, _passes, _places, _scratch, _sizing
from daskpile.engine import _run as run_state
from daskpile.engine._outputs import Output
from daskpile.engine._scratch import Scratch
from daskpile.engine._sizing import PileTooLargeError
from daskpile.sources import arrowfiles, plan_sources, text
from daskpile.sources.parquet import open_parquet
from daskpile.sources.read import read_pieces

# New runs read a Parquet row group larger than a piece in parts of its rows; a run begun by a daskpile that
# numbered its pieces otherwise resumes as it began (``RunSpec.cut_row_groups``).
CUT_ROW_GROUPS = True
# New runs weigh a compressed text file as the text it holds when grouping files into tasks; a run begun by a
# daskpile that grouped them by their size on disk resumes in its own tasks (``RunSpec.weigh_compressed``).
WEIGH_COMPRESSED = True


class VerificationError(RuntimeError):
    """The output is not a permutation of the input: rows were lost, duplicated or changed.

    Raised by :func:`shuffle_parquet` with ``verify=True`` when the
    fingerprint of the rows written differs from that of the rows read.  No
    manifest is written, so ``dest`` is not a finished result.  The message
    gives both fingerprints.
    """


class RunMismatchError(RuntimeError):
    """``dest`` or its scratch holds an unfinished run with other arguments.

    Raised by :func:`shuffle_parquet` instead of mixing two runs, when an
    interrupted run differs from this call in its source files (or their
    sizes and modification stamps), ``piles``, ``seed``, ``blocksize``,
    ``rows_per_file`` or the schema it reads.  The message names the
    differences.  Run the same call again to resume the run, or pass
    ``overwrite=True`` to discard it.
    """


@dataclasses.dataclass
class ShuffleReport:
    """What :func:`shuffle_parquet` did; ``print`` it for a one-line summary.

    Every parameter below is an attribute of the report.

    Parameters
    ----------
    rows
        The rows shuffled.
    piles
        The pile count the run used.  With ``rows_per_file``, or piles split
        for being over their budget, the number of files differs.
    seed
        The seed the run used (drawn, when none was given).
    dest
        The URL of the result.
    files
        The URLs of the output files, in sequence order: reading them in
        that order gives the shuffled dataset.
    manifest
        The URL of the result's manifest, ``_daskpile.json``.
    source_files
        The URLs of the input files, in the order they were read.
    seconds_scatter
        Seconds of pass 1, reading the input and writing scratch.
    seconds_gather
        Seconds of pass 2 (and of the pass of ``rows_per_file``), writing
        the output.
    scratch_bytes
        Bytes pass 1 wrote to scratch.
    output_bytes
        Bytes of the output files.
    fingerprint
        The fingerprint of the rows, the same read and written; None with
        ``verify=False``.
    resumed_partitions
        Input partitions whose scratch files an interrupted run had written,
        reused.
    resumed_piles
        Output files an interrupted run had written, reused.
    pile_plan
        How ``piles="auto"`` chose the count, and the budget piles were
        checked against; None with a pile count.
    skipped_files
        Files of the source that are not Parquet by their extension, not read.
    source_description
        How the source was read, as the manifest records it under
        ``"source"``: ``schema_policy``, ``schema_from``, ``partition_keys``,
        ``table``, ``table_version``, ``skipped_files``.
    already_finished
        ``dest`` already held the finished result of this very call (same
        source files, unchanged, same piles, seed and options), so nothing was
        done: the figures are the manifest's.  A retried job succeeds at once.
    worker_deaths
        Workers that died while running (or holding) the run's tasks, which
        then ran again on the others: out of memory, most often.  The result
        is whole all the same (and verified, unless ``verify=False``), but
        workers that die are what makes a larger run fail.
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
    already_finished: bool = False
    worker_deaths: int = 0

    @property
    def seconds(self) -> float:
        """Seconds of the two passes together (``seconds_scatter + seconds_gather``)."""
        return self.seconds_scatter + self.seconds_gather

    @property
    def deaths_said(self) -> str:
        """``"; N workers died ..."`` for the report's line, or ``""`` if none did."""
        if not self.worker_deaths:
            return ""
        return (
            f"; {count(self.worker_deaths, 'worker')} died running its tasks, which ran again (out of memory, or "
            "its machine or pod gone: the workers' logs say which; for memory, give the workers more: "
            "--memory-limit on a cluster daskpile starts, the cluster's own settings on another)"
        )

    def __str__(self) -> str:
        if self.already_finished:
            verified = ", verified when written" if self.fingerprint is not None else ""
            return (
                f"already done: {self.dest} holds this run's finished result, {count(self.rows, 'row')} from "
                f"{count(len(self.source_files), 'file')} in {count(self.piles, 'pile')} (seed {self.seed}), "
                f"{size(self.output_bytes)}{verified}; nothing to do"
            )
        resumed = ""
        if self.resumed_partitions or self.resumed_piles:
            resumed = (
                f" (resumed: {count(self.resumed_partitions, 'partition')}, {count(self.resumed_piles, 'pile')} reused)"
            )
        verified = ", verified" if self.fingerprint is not None else ""
        if self.skipped_files:
            shown = ", ".join(self.skipped_files[:3])
            more = ", ..." if len(self.skipped_files) > 3 else ""
            verified += f"; skipped, not data: {count(len(self.skipped_files), 'file')} ({shown}{more})"
        verified += self.deaths_said
        return (
            f"shuffled {count(self.rows, 'row')} from {count(len(self.source_files), 'file')} into "
            f"{count(self.piles, 'pile')} "
            f"(seed {self.seed}) at {self.dest}: pass 1 {self.seconds_scatter:.1f} s, "
            f"pass 2 {self.seconds_gather:.1f} s, {size(self.output_bytes)} written{verified}{resumed}"
        )


@redacting_errors
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
    second_pass: str = "eager",
    format: str = "auto",
    read_options: dict | None = None,
    output_format: str = "parquet",
    compression: str | None = None,
) -> ShuffleReport:
    """Shuffle the rows of a Parquet dataset (or of CSV, JSON-lines or text files) into ``piles`` Parquet files.

    Arrow end to end, without pandas.  ``dest`` receives ``part-00000.parquet``
    ... (one file per pile, names zero-padded so that they sort in pile
    order) and ``_daskpile.json``, the manifest, written last: the result is
    complete when it exists.  Reading the parts in name order gives a
    uniformly random permutation of the input rows, every column with its
    exact Arrow type.  The same seed, pile count and ``blocksize`` give
    byte-identical files on any cluster.  Runs on the current Dask client if there is one, else on
    Dask's default local scheduler (``dask.config.set(scheduler=...)`` is
    honoured).

    Memory is bounded by a piece of input and a pile, never by a file or the
    dataset.  If a run is interrupted, calling again with the same arguments
    resumes it, reusing every finished scratch and output file.

    Parameters
    ----------
    source
        What to shuffle, as local paths or fsspec URLs (``s3://...``): a file,
        a directory (searched recursively; names starting with ``_`` or ``.``
        are skipped), a glob, or a list of any of these on one filesystem; or
        a Delta Lake or Iceberg table folder, of which only the live files of
        the current version (or ``version``) are read, never those the log
        removed (needs the ``daskpile[delta]`` or ``daskpile[iceberg]``
        extra; deletion vectors and Iceberg delete files are refused).  A
        ``_metadata`` file plans the run without reading any footer;
        ``_common_metadata``, ``_SUCCESS``, ``.crc``, ``_committed_*`` and
        ``_started_*`` are ignored.
    dest
        The directory to write, local or an fsspec URL: new, empty, or holding
        a daskpile result (see ``overwrite``).  It must not overlap
        ``source``.  daskpile never writes among, or removes, files it did not
        write.
    piles
        The number of piles (at least 1), or ``"auto"`` (the default, as on
        the command line): the fewest piles, at least 4 per thread (unless
        ``memory_per_pile`` is given: then the count depends on the data
        alone) and of 32 MiB in memory or less on average (larger piles permute slower),
        but not so many that piles hold fewer than 10,000 rows and less than
        32 MiB on average, such that a pile
        of mean size plus 6 standard deviations fits ``memory_per_pile``.
        The size comes from the Parquet footers of up to 8 evenly spaced files, scaled
        by file size (or from ``_metadata``); dictionary-encoded columns, which
        footers count at their encoded size, are measured on the first 65,536
        rows of a file.  The choice and its inputs are
        ``report.pile_plan`` and the manifest's ``pile_plan``; a resumed run
        keeps the count it started with.  Give a count (and a seed) for an
        output that does not depend on the cluster's memory.
    seed
        A non-negative integer.  Default None: a seed drawn from the operating
        system, or the seed of the interrupted run being resumed.  It is
        recorded in the report and the manifest.
    scratch
        Where pass 1 writes (about the uncompressed size of the data): a local
        path or an fsspec URL, under which the run uses
        ``daskpile-<hash of dest>/``, so that a rerun finds it.  Default: the
        local temporary directory.  Every worker must reach it: on a cluster
        whose workers share no disk, pass an object-store URL such as
        ``"s3://bucket/tmp"``.  It is removed when the run succeeds or fails
        on bad input or a full disk, and kept when the run is interrupted: it
        is the checkpoint a rerun resumes from.  It must be outside dest and
        outside the source's folders (a rerun would list it as source).
    storage_options
        Passed to fsspec for ``source``, ``dest`` and ``scratch``
        (credentials, endpoint).  Default None.
    overwrite
        Replace the daskpile result ``dest`` holds.  The new result is written
        beside it and takes its place at the end (the old manifest is removed
        first, so no reader takes the mix as complete); only the old result's
        files are removed.  Also discards an unfinished run in ``dest`` that
        was started with other arguments.  Default False: a finished result
        raises ``FileExistsError``, an unfinished run with other arguments
        :class:`RunMismatchError`.
    verify
        Pass 1 fingerprints the input rows and pass 2 the output rows; if they
        differ, :class:`VerificationError` is raised and no manifest is
        written.  About a quarter of the work.  Default True.
    memory_per_pile
        The bytes of memory a pile may take.  Default None: with
        ``piles="auto"``, a quarter of a worker's memory limit per thread (of
        the smallest worker), or of the machine's memory per core without a
        cluster; with a pile count, no budget, so that nothing is split and the
        output never depends on the cluster's memory.  When a budget is known,
        pile sizes are checked after pass 1 and a pile over it is handled as
        ``on_oversize`` says.
    progress
        Show Dask's progress bar during each pass (distributed's with a
        client, ``dask.diagnostics.ProgressBar`` without; only in a terminal
        or a notebook) and print a summary line per pass, and the plan of
        ``piles="auto"``.  Default False: nothing is printed.
    blocksize
        Bytes, as an integer or a string such as ``"128 MiB"``.  Default
        256 MiB, as in ``dask.dataframe.read_parquet``.  A file larger than
        this in memory (its row groups' uncompressed size) is read in pieces
        of whole row groups, and a larger row group in pieces of its rows,
        each scattered on its own, so a multi-GB file never sits whole in a
        worker (on an object store, a cut row group's compressed bytes do).  Consecutive smaller files are read by
        one task up to a sixteenth of ``blocksize`` on disk (a compressed text
        file weighed as 5 times its size), so tasks and scratch files follow
        the bytes, not the file count.  A text file (CSV, JSON lines,
        lines) is cut into ranges of a sixteenth of ``blocksize``, a task
        each, ending at line ends.  Like ``piles`` and ``seed``, it decides the
        output.  The command refuses under 16 KiB (a range of 1 KiB each, tens
        of thousands of tasks); here it is only warned of.
    on_oversize
        What to do with a pile over its memory budget: ``"split"`` (the
        default) splits it by a further random level (its own generator, keyed
        by seed and pile) and writes it as consecutive files
        ``part-0000j-0000.parquet``, ``part-0000j-0001.parquet``, ...: still a
        uniform permutation.  ``"error"`` raises :class:`PileTooLargeError`
        instead, before pass 2 writes anything.
    rows_per_file
        Write files of exactly this many rows (the last one the rest) instead
        of one per pile: pass 2 keeps the permuted piles in scratch and a
        third pass cuts their sequence into equal files.  It is the same
        sequence as one file per pile, cut differently, so still uniform; it
        costs one more write and read of scratch.  ``PileLoader`` takes each
        file as a pile: files smaller than the piles tie its epochs more (see
        the training guide).  Default None.
    partitioning
        How ``key=value`` folders in the files' paths (``year=2024/``,
        anywhere in the path, as DuckDB reads them) become columns, which are
        fingerprinted like every column.  ``"hive"`` (the default): typed as
        ``pyarrow.dataset`` infers them (``int32``, else ``string``;
        URL-decoded; ``__HIVE_DEFAULT_PARTITION__`` is null).  A
        ``pa.schema(...)`` or a string such as ``"year:int16,city:string"``
        declares their types; ``"none"`` (or None) ignores the folders.  A
        table's columns come from the table, not from its folders.
    schema
        ``"strict"`` (the default) wants the same columns in every file, but
        passes what changes no value: column order, the nullable flag,
        ``string`` against ``large_string``, a zero-row file of ``null``
        columns.  ``"unify"`` takes the union of the files' columns by name,
        with types promoted as ``pa.unify_schemas(promote_options="permissive")``
        does and missing columns as nulls, and records the schema in the
        manifest.  A table's rows take the table's schema.
    version
        The version of a Delta table, or the snapshot id of an Iceberg table,
        to read.  Default None: the current one.  Only for a table source.
    second_pass
        ``"eager"`` (the default) permutes each pile in pass 2.  ``"lazy"``
        writes each pile with its rows in scatter order and leaves the
        permutation to :class:`daskpile.PileLoader`, which permutes every pile
        as it loads it, afresh each epoch: pass 2 skips its random ``take``.
        The manifest says ``"second_pass": "lazy"``; a plain Parquet reader
        reading such a result in file order gets pile order only (rows of a
        pile in their input order).  Not with ``rows_per_file``.
    stray_files
        Files that are not Parquet by their extension (``README.txt``):
        ``"skip"`` (the default) skips them and lists them in
        ``report.skipped_files``; ``"error"`` refuses them.
    format
        What the source files are: ``"auto"`` (the default) goes by their
        names: Parquet if any is named so (or has no extension), else the
        one text format they name: ``.csv``, ``.tsv``, ``.jsonl``/``.ndjson``/
        ``.json`` (JSON lines), ``.txt`` (lines), each possibly ``.gz``,
        ``.bz2``, ``.zst`` (``.zstd``) or ``.xz``; ``.arrow``/``.feather`` (Arrow IPC) and
        ``.orc``.  Or one of ``"parquet"``, ``"csv"``, ``"tsv"``, ``"jsonl"``,
        ``"lines"``, ``"arrow"``, ``"orc"``.  Text is parsed by Arrow's CSV
        and JSON readers, the column names and types taken from the first
        MiB of the first file; ``"lines"`` makes each line one row of a
        single binary column ``line``, its bytes exactly, without the newline.
        An uncompressed file is read in byte ranges cut on line boundaries,
        one pass-1 task each; a compressed one by one task, a block at a time.
    read_options
        Text formats: ``delimiter`` (one character), ``autogenerate_column_names``
        (no header line: columns ``f0``, ``f1``, ...), ``column_types``
        (``{"id": "int64"}``: Arrow type names, the others inferred),
        ``newlines_in_values`` (quoted values may hold newlines: each such file
        is then one task, cut only between records), as pyarrow names them;
        and ``as_written`` (JSON lines: each row the line as written, checked
        to be one JSON object; by default when JSON lines go out as JSON lines).
    output_format
        What each pile is written as: ``"parquet"`` (the default), ``"arrow"``
        (Arrow IPC files), ``"csv"`` (a header line per file), ``"jsonl"`` (one
        JSON object per row, flat columns, no NaN; JSON lines in: each line as
        written, byte for byte), or ``"lines"``
        (the single binary or string column, each value followed by a newline:
        with ``format="lines"``, the input's lines permuted, byte for byte, a
        final newline added to a last line that lacked one).  The names end in
        ``.parquet``, ``.arrow``, ``.csv``, ``.jsonl`` or ``.txt``.  CSV and JSON
        lines are fingerprinted as read back.  PileLoader, quality and
        the moving windows read Parquet results only.
    compression
        ``"gzip"`` or ``"zstd"``: of the whole file for csv and lines (``.gz``,
        ``.zst``), inside the file for arrow (zstd) and parquet (every column).
        Default: none for csv, lines and arrow; Parquet's own choice per column.

    Returns
    -------
    ShuffleReport
        What the run did: rows, piles, seed, the output files in order, the
        seconds of each pass, the fingerprint, the pile plan.

    Raises
    ------
    ValueError
        If an argument is not valid; if ``dest`` overlaps ``source``; if a
        file's schema does not fit (``schema="strict"``) or a table cannot be
        read; if a row takes more than ``memory_per_pile``.
    FileNotFoundError
        If ``source`` does not exist or holds no Parquet file.
    FileExistsError
        If ``dest`` holds a finished result and ``overwrite`` is False, or
        holds files daskpile did not write.
    RunMismatchError
        If ``dest`` or its scratch holds an unfinished run with other
        arguments, and ``overwrite`` is False.
    PileTooLargeError
        If a pile is over its memory budget and ``on_oversize="error"``.
    VerificationError
        If ``verify`` finds the output is not a permutation of the input.
    OSError
        If ``dest`` or a local ``scratch`` cannot be written (a file where a
        directory should be, no permission), or lacks the space the run needs
        (``errno.ENOSPC``, with both numbers): checked before anything is
        written, from the Parquet footers.
    ImportError
        If ``source`` is a Delta or Iceberg table and its library is not
        installed.

    See Also
    --------
    verify : recompute the fingerprints of a result from the files.
    quality : measure how random a result's order is.
    read_manifest : the manifest of a finished result.

    Notes
    -----
    Parts are written with plain encoding, no min/max statistics, and Snappy
    only on the columns it shrinks; the layout, the manifest and the scratch
    directory are described in :doc:`/concepts/scratch` and
    :doc:`/reference/manifest`.

    Examples
    --------
    >>> report = shuffle_parquet("data/", "out/", piles=8, seed=1)
    >>> report.rows, len(report.files)
    (30000, 8)
    >>> shuffle_parquet("s3://lake/events/", "s3://lake/shuffled/", scratch="s3://lake/tmp/")  # doctest: +SKIP
    """
    blocksize = check_bytes("blocksize", blocksize)
    memory_per_pile = check_bytes("memory_per_pile", memory_per_pile)
    if second_pass not in ("eager", "lazy"):
        raise ValueError(f"second_pass must be 'eager' or 'lazy', got {second_pass!r}")
    if second_pass == "lazy" and rows_per_file is not None:
        raise ValueError(
            "second_pass='lazy' (--lazy) writes one file per pile, for PileLoader to permute on load; "
            "rows_per_file (--rows-per-file) would cut piles apart"
        )
    if rows_per_file is not None and (isinstance(rows_per_file, bool) or int(rows_per_file) < 1):
        raise ValueError(f"rows_per_file must be a positive integer, got {rows_per_file!r}")
    if on_oversize not in ("split", "error"):
        raise ValueError(f"on_oversize must be 'split' or 'error', got {on_oversize!r}")
    if piles != "auto":
        check_piles(piles, auto_allowed=True)
    if seed is not None:
        resolve_seed(seed)
    output = Output(output_format, compression)
    if second_pass == "lazy" and output.format != "parquet":
        raise ValueError(
            f"second_pass='lazy' (--lazy) leaves the permuting to PileLoader, which reads Parquet piles: "
            f"not with output_format={output.format!r} (--output-format {output.format})"
        )
    with said_while_slow(f"still planning: listing and opening {urls_said(source)}", progress):
        plan = plan_sources(
            source, storage_options, partitioning=partitioning, schema=schema, version=version,
            stray_files=stray_files, format=format, read_options=read_options, written_as=output.format,
        )  # fmt: skip
    output.check(plan.schema)
    return shuffle_plan(
        plan, source, dest, piles, seed=seed, scratch=scratch, storage_options=storage_options, overwrite=overwrite,
        verify=verify, memory_per_pile=memory_per_pile, progress=progress, blocksize=blocksize,
        on_oversize=on_oversize, rows_per_file=rows_per_file, second_pass=second_pass, output=output,
    )  # fmt: skip


def shuffle_plan(
    plan,
    source,
    dest: str,
    piles,
    *,
    seed,
    scratch,
    storage_options,
    overwrite: bool,
    verify: bool,
    memory_per_pile,
    progress: bool,
    blocksize: int,
    on_oversize: str,
    rows_per_file,
    second_pass: str,
    output: Output = _passes.PARQUET,
    window_generation: bool = False,
) -> ShuffleReport:
    """``shuffle_parquet`` of a source already planned (its files and the schema their rows take), arguments checked.

    ``daskpile.window.append`` plans its source into the window's schema and
    runs it here, as a step of its own (``window_generation=True``: dest is a
    generation's folder inside the window, and an interruption after its
    manifest is not said to have left a complete result).
    """
    plan = output.stored_plan(plan)
    run = _Run(
        plan, source, storage_options, overwrite, verify, memory_per_pile, progress, blocksize, on_oversize,
        rows_per_file, second_pass, output,
    )  # fmt: skip
    try:
        run.check_places(dest, scratch, inside_a_window=window_generation)
    except PermissionError:
        finished = None if overwrite or window_generation else _finished_where_nothing_may_be_written(run, piles, seed)
        if finished is None:
            raise
        return finished
    current_client()  # the command's cluster, if it waits to be started: before dest's lease and any write
    # (an append's generation is run here inside the window's lease, taken first to say "nothing to do")
    said = _complete_if_interrupted(run) if not window_generation else contextlib.nullcontext()
    with said, _lease.held(run.dest_fs, run.dest_path) as lease:  # one run at a time in a dest
        run.read_dest()
        run.find_previous(piles, seed)
        run.size_piles()
        finished = run.finished_already()
        if finished is not None:
            return finished
        if _FINISHED_ONLY.get():
            raise _NotFinished
        run.say_plan()
        run.prepare_scratch()
        with _resumable(run.scratch, run.dest_fs, run.dest_path), counting_worker_deaths(run.deaths):
            scattered = run.scatter()
            names, gathered = run.gather(scattered)
            fingerprint = run.check_fingerprints(scattered, gathered) if verify else None
            run.refuse_files_written_out_of_sight(gathered)
            lease.check()
            run.commit_staged(names)
        return run.finish(scattered, names, gathered, fingerprint)


def _another_calls_run(dest_url: str, scratch: Scratch | None, previous, differences: list[str]) -> RunMismatchError:
    """The refusal of an unfinished run (its run file in dest, or in ``scratch``) that a call does not match."""
    where = (
        f"{dest_url!r} has"
        if scratch is None
        else f"scratch {full_url(scratch.fs, scratch.directory)!r} holds, for dest {dest_url!r},"
    )
    # (not "daskpile clean": it keeps a run that can still be resumed, whether or not its dest is there)
    # The source's files or schema changed since: running the call that began it again is no way back,
    # whatever else differs (a rerun with another seed too was told to run the same call again)
    source_changed = any(d.startswith(("source files changed", "another schema")) for d in differences)
    other_files = any(d.startswith("other source files") for d in differences)
    if source_changed:
        then = "The source changed since it began, so it cannot be resumed: pass"
    elif other_files:  # (another source, no file in common: a formats trial's fresh call was told the source changed)
        then = "Run the call that began it again to resume it, or pass"
    else:
        then = "Run the same call again to resume it, or pass"
    return RunMismatchError(
        f"{where} an unfinished daskpile run (seed {previous.seed}, {count(previous.piles, 'pile')}) that this call "
        f"does not match: {'; '.join(differences)}. {then} overwrite=True (--overwrite) to discard it and run this "
        "call."
    )


def refuse_another_calls_run(dest: str, scratch: str | None, storage_options: dict | None, piles, seed) -> None:
    """Before a cluster starts (a Kubernetes job's pods): ``RunMismatchError`` where dest or its scratch holds an
    unfinished run of another seed or pile count than the call's own, read from its run file alone (a read or
    two, no planning of the source, no lease).  What else may differ is said once the run has planned the source;
    anything that cannot be looked at now, too.  A rerun with another seed started a cluster only to be refused.

    >>> refuse_another_calls_run("new/", None, None, piles=4, seed=1)  # nothing there: nothing said
    """
    requested_piles = None if piles == "auto" else check_piles(piles, auto_allowed=True)
    requested_seed = None if seed is None else resolve_seed(seed)
    try:
        dest_fs, dest_path = filesystem(as_urls(dest, "dest"), storage_options)
        dest_url = full_url(dest_fs, dest_path)
        in_scratch = None
        previous = run_state.read(dest_fs, dest_path)
        if previous is None:
            name = run_state.scratch_name(dest_url)
            in_scratch = Scratch.create(as_urls(scratch, "scratch"), storage_options, 0, name=name, make=False)
            check_private_directory(in_scratch.fs, in_scratch.directory)  # (as the run checks it, before its read)
            previous = run_state.read(in_scratch.fs, in_scratch.directory)
    except Exception:  # (unreadable, unreachable, not private: the run says it)
        return
    if previous is None:
        return
    differences = [
        said
        for said, differs in (
            (f"piles {requested_piles} instead of {previous.piles}", requested_piles not in (None, previous.piles)),
            (f"seed {requested_seed} instead of {previous.seed}", requested_seed not in (None, previous.seed)),
        )
        if differs
    ]
    if differences:
        raise _another_calls_run(dest_url, in_scratch, previous, differences)


def _finished_where_nothing_may_be_written(run: _Run, piles, seed) -> ShuffleReport | None:
    """The report of this very call's finished result in a local dest this process may not write (mounted
    read-only for its readers), or None: a retry of a finished command needs no write, and no lease, since no
    run writes where nobody may.  It said "no permission to write dest", exit 2, where the same
    retry in a dest it may write said "already done"."""
    try:
        run.read_dest()
        run.find_previous(piles, seed)
        run.size_piles()
        return run.finished_already()
    except Exception:  # no result, another call's, or one that changed: the permission is what to say
        return None


_FINISHED_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("daskpile_finished_only", default=False)


class _NotFinished(Exception):
    """A shuffle under ``finished_result`` has work to do."""


def finished_result(dest: str, storage_options: dict | None, shuffle) -> ShuffleReport | None:
    """The report of the finished result of a call that ``dest`` holds, found without a cluster, or None.

    ``shuffle`` makes the call (``shuffle_parquet`` with its arguments); it
    runs on the sync scheduler up to the point where a run would begin.  The
    command asks this before it starts a cluster, so that a retry of a
    finished run (a Kubernetes job's) reports it without one, and dest
    holding another call's result or run is said without one too
    (``FileExistsError``, ``RunMismatchError``).  None wherever the call would
    run: no manifest in dest, a run to resume, or any other error, which may
    depend on the cluster (its memory, what its workers see) and which the
    call on its cluster says again.

    >>> finished_result("shuffled/", None, lambda: shuffle_parquet("data/", "shuffled/", piles=4, seed=1)).rows
    30000
    >>> finished_result("new/", None, lambda: shuffle_parquet("data/", "new/", piles=4, seed=1)) is None
    True
    """
    token = _FINISHED_ONLY.set(True)
    try:
        dest_fs, dest_path = filesystem(as_urls(dest, "dest"), storage_options)
        if not exists(dest_fs, posixpath.join(dest_path, _manifest.MANIFEST_NAME)):
            return None  # (one request, before a second planning of the source)
        with dask.config.set(scheduler="sync"):
            return shuffle()
    except (FileExistsError, RunMismatchError):
        raise
    except Exception:  # _NotFinished, or an unreachable store, which the call says naming what it reads first
        return None
    finally:
        _FINISHED_ONLY.reset(token)


_SAME_STORE = (
    "do the workers reach the same store as this process (the same endpoint and credentials, from the environment "
    "or storage options) or, for local paths, the same disk"
)


@dataclasses.dataclass
class _Run:
    """One shuffle from a planned source to dest, in steps: where, what was there, how many piles, pass 1,
    pass 2, commit.  Each step reads what the earlier ones set."""

    plan: object
    source: object
    storage_options: dict | None
    overwrite: bool
    verify: bool
    memory_per_pile: int | None
    progress: bool
    blocksize: int
    on_oversize: str
    rows_per_file: int | None
    second_pass: str
    output: Output
    complete: bool = dataclasses.field(default=False, init=False)  # its manifest is written
    manifest: dict | None = dataclasses.field(default=None, init=False)  # the one it writes, once it does
    deaths: list = dataclasses.field(default_factory=list, init=False)  # workers that died running its tasks
    task_memory: int | None = dataclasses.field(default=None, init=False)  # a worker's limit over its threads

    def check_places(self, dest: str, scratch: str | None, inside_a_window: bool = False) -> None:
        """Dest and scratch: reachable, writable, seen by the workers, apart from the source and each other, and
        dest outside a moving window unless it is one of its generations, by ``append``."""
        self.dest_fs, self.dest_path = filesystem(as_urls(dest, "dest"), self.storage_options)
        self.dest_url = full_url(self.dest_fs, self.dest_path)
        self.inside_a_window = inside_a_window  # (whose pile count is the window's)
        _places.check_dest_outside_source(
            self.plan.fs, [f.path for f in self.plan.files], self.source, self.dest_fs, self.dest_path
        )
        scratch = as_urls(scratch, "scratch")
        scratch_fs, scratch_path = filesystem(scratch or tempfile.gettempdir(), self.storage_options)
        _places.check_scratch_outside_source(self.plan.fs, self.source, scratch_fs, scratch_path)
        _places.check_scratch_outside_dest(scratch_fs, scratch_path, self.dest_fs, self.dest_path)
        self.scratch_url = scratch
        check_writable(self.dest_fs, self.dest_path, "dest")
        if not inside_a_window:
            _dest.check_outside_a_window(self.dest_fs, self.dest_path)
        check_writable(scratch_fs, scratch_path, "scratch")
        _places.check_workers_see(self.dest_fs, self.dest_path, scratch_fs, scratch_path)
        _places.check_workers_see_the_source(self.plan.fs, self.plan.files[0].path if self.plan.files else None)

    def say_plan(self) -> None:
        """The pile count chosen, and how the source is read where that is not plain: not for a result found
        finished, whose own count the report says (a retry said a fresh plan's other count before it)."""
        if self.progress and self.pile_plan is not None:
            print(f"piles=auto: {self.pile_plan}", flush=True)
        for note in [*self.plan.notes, self._pile_count_said(), self._task_count_said(), self._lines_as_json_said()]:
            if note and self.progress:
                print(f"note: {note}", flush=True)
            elif note:
                warnings.warn(note, stacklevel=5)  # (the caller of shuffle_parquet)
        if self.progress and (self.plan.reading.policy != "strict" or self.plan.table or self.plan.files[0].keys):
            print(f"source: {self.plan}", flush=True)

    def read_dest(self) -> None:
        """What dest holds (a finished result, or refused: files daskpile did not write), and the scratch that
        goes with dest.  Under the dest's lease: an interrupted commit found there is finished."""
        self.old_result = _dest.check(self.dest_fs, self.dest_path)
        self.partitions = self.plan.partitions(self.blocksize, WEIGH_COMPRESSED)
        name = run_state.scratch_name(self.dest_url)
        self.scratch = Scratch.create(
            self.scratch_url, self.storage_options, len(self.partitions), name=name, make=False
        )
        check_private_directory(self.scratch.fs, self.scratch.directory)  # before its run file is read

    def find_previous(self, piles, seed) -> None:
        """The interrupted run of the same call to resume, if any; that of another call refused or discarded."""
        self.auto = piles == "auto"
        self.requested_piles = None if self.auto else check_piles(piles, auto_allowed=True)
        self.requested_seed = None if seed is None else resolve_seed(seed)
        in_dest = run_state.read(self.dest_fs, self.dest_path)
        try:
            self.previous = in_dest or run_state.read(self.scratch.fs, self.scratch.directory)
        except run_state.RunFileUnreadable as e:  # this user's own scratch (checked private), of no run to resume
            if self.progress:
                print(f"{e}: its scratch is removed, and the run starts afresh", flush=True)
            self.scratch.remove()
            self.previous = None
        if self.previous is None:
            return
        differences = self.previous.differences(
            self.plan.urls, self.plan.stamps, self.requested_piles, self.requested_seed, self.blocksize,
            self.rows_per_file, _schema_key(self.plan), self.second_pass, self.output.key(),
            still_there=functools.partial(exists, self.plan.fs),
        )  # fmt: skip
        if differences and not self.overwrite:
            raise _another_calls_run(self.dest_url, None if in_dest is not None else self.scratch, self.previous,
                                     differences)  # fmt: skip
        if differences:
            self.scratch.remove()
            _dest.discard_unfinished(self.dest_fs, self.dest_path)
            self.previous = None
        elif self.previous.weigh_compressed != WEIGH_COMPRESSED:  # its scratch is of its tasks: resumed as it began
            self.partitions = self.plan.partitions(self.blocksize, self.previous.weigh_compressed)
            self.scratch = dataclasses.replace(self.scratch, partitions=len(self.partitions))

    def size_piles(self) -> None:
        """The seed, the pile count (``auto``: from the source's estimated size) and the run's identity."""
        self.seed = self.previous.seed if self.previous is not None else resolve_seed(self.requested_seed)
        rows, self.estimated_bytes, row_bytes = _estimate(self.plan)
        # the pieces it cut
        row_bytes = self.previous.row_bytes if self.previous is not None else row_bytes
        cut_row_groups = self.previous.cut_row_groups if self.previous is not None else CUT_ROW_GROUPS
        self.plan = self.plan.with_pieces(row_bytes, cut_row_groups)
        self.row_estimate = max(self.estimated_bytes / rows, row_bytes) if rows else 0
        if self.old_result is None or self.overwrite:  # (a finished result is reported, whatever the cluster)
            self.refuse_rows_no_task_holds()
            self.refuse_blocks_no_task_holds()
        if self.memory_per_pile is not None and rows and self.estimated_bytes / rows > self.memory_per_pile:
            raise ValueError(  # checked now, not after pass 1
                f"a row takes about {self.estimated_bytes / rows:,.0f} bytes in memory, more than "
                f"memory_per_pile={self.memory_per_pile:,} (--memory-per-pile) allows a whole pile"
            )
        self.pile_plan = None
        if self.auto:
            self.pile_plan = _sizing.plan_for_cluster(rows, self.estimated_bytes, self.memory_per_pile)
            if self.previous is not None:  # resuming: keep the run's count even if the cluster changed
                self.pile_plan = dataclasses.replace(self.pile_plan, piles=self.previous.piles)
        self.piles = self.pile_plan.piles if self.auto else self.requested_piles
        self.estimated_rows = rows
        if self.previous is None and not self.inside_a_window:
            self.refuse_piles_no_machine_counts()
        bands = (
            self.previous.bands if self.previous is not None else _scratch.bands_for(self.piece_bytes, self.plan.schema)
        )
        self.scratch = dataclasses.replace(self.scratch, bands=_scratch.band_bounds(self.piles, bands))
        self.spec = run_state.RunSpec(
            tuple(self.plan.urls), tuple(self.plan.stamps), self.piles, self.seed, self.dest_url, self.blocksize,
            self.rows_per_file, _schema_key(self.plan), self.second_pass, self.output.key(), bands, row_bytes,
            cut_row_groups, self.previous.weigh_compressed if self.previous is not None else WEIGH_COMPRESSED,
        )  # fmt: skip

    def refuse_piles_no_machine_counts(self) -> None:
        """Refuse more piles than this machine holds the counts of (``_passes.refuse_piles_beyond_their_counts``)."""
        _passes.refuse_piles_beyond_their_counts(
            self.piles, len(self.partitions), f"about {self.estimated_rows:,} rows"
        )

    def _pile_count_said(self) -> str | None:
        """A note that more piles were asked for than there are rows (most of their files empty), or so many that
        each is a file of a few rows (a new user's 200,000 piles of a row each: 162,000 files in 5 minutes,
        without a word), or None."""
        rows = self.estimated_rows
        if self.auto or self.inside_a_window or not rows:
            return None
        if self.piles > rows:
            return (
                f"{self.piles:,} piles for about {count(rows, 'row')}: about {self.piles - rows:,} or more of their "
                "files will be empty"
            )
        if self.piles > MANY_PILES and rows < self.piles * FEW_ROWS_A_PILE:
            return (
                f"{self.piles:,} piles of about {count(round(rows / self.piles), 'row')}: as many files of a few rows "
                "each; did you mean fewer? (piles='auto', --piles auto, sizes them from the data)"
            )
        return None

    def _lines_as_json_said(self) -> str | None:
        """A note that lines read from files of JSON lines are written as JSON strings, or None: a trial's corpus
        read with --format lines and written with --output-format jsonl came out as ``{"line": "{\\"a\\": 1}"}``,
        every object turned into a string, without a word."""
        reading = self.plan.reading.text
        if reading is None or reading.format != "lines" or self.output.format != "jsonl":
            return None
        if not any(text.detect(f.path)[0] == "jsonl" for f in self.plan.files):
            return None
        return (
            "format='lines' (--format lines) reads each line as one string, which output_format='jsonl' writes "
            'as {"line": "..."}: each JSON line becomes a string in an object; output_format=\'lines\' '
            "(--output-format lines) keeps the lines as they are"
        )

    def _task_count_said(self) -> str | None:
        """A note that pass 1 is cut into thousands of tasks of little data each, or None: a trial's --blocksize
        1MiB on a 1 GB text file (ranges of a sixteenth of it) made 16,000 tasks, 550 s against 10 at the
        default, for each task has a cost of its own and each pile reads every task's scratch file."""
        tasks, data = len(self.partitions), sum(self.plan.sizes)
        if tasks <= MANY_TASKS or data >= tasks * SMALL_TASK_BYTES:
            return None
        text = self.plan.reading.text is not None
        how = "text is read in ranges of a sixteenth of it, small files" if text else "small files are"
        return (
            f"pass 1 is cut into {tasks:,} tasks of about {size(data / tasks)} each (blocksize {size(self.blocksize)}: "
            f"{how} grouped up to a sixteenth of it): each task has a cost of its own and each pile reads every "
            "task's scratch file, so the run takes many times longer than with fewer; a larger blocksize (the "
            f"default is {size(_passes.BLOCKSIZE)}) makes fewer"
        )

    @property
    def pieces(self) -> float:
        """About how many pieces pass 1 scatters: a partition each, more where files are larger than
        ``blocksize`` (in memory)."""
        return max(len(self.partitions), self.estimated_bytes / self.blocksize, 1)

    @property
    def piece_bytes(self) -> float:
        """The bytes in memory of what a pass-1 task scatters, on average."""
        return self.estimated_bytes / self.pieces

    def refuse_rows_no_task_holds(self) -> None:
        """Parquet rows a task cannot hold (``_sizing.ROW_COPIES`` times over, more than a worker's memory over
        its threads) refused before pass 1, whose workers would die reading the first: a piece is at least a row,
        and a pile too.  Only on a cluster whose workers have memory limits (a local scheduler's task may take
        the machine's).  Measured from the sampled footers and the first file's rows: larger rows in a file not
        sampled are refused alike by the pass-1 task about to read them, from its row group's footer."""
        row = self.row_estimate
        # (kept: pass 1's tasks refuse rows the estimate did not see, and pass 2's deaths are said with it)
        self.task_memory = worker_memory_per_thread() if self.plan.reading.text is None else None
        others = len(self.plan.urls) - 1
        where = f"{self.plan.urls[0]!r}" + (f" and {count(others, 'other file')}" if others else "")
        _sizing.refuse_rows_a_task_cannot_hold(f"the rows of the source ({where}) take", row, self.task_memory)

    def refuse_blocks_no_task_holds(self) -> None:
        """A text file read by one task, streaming (compressed, or CSV with newlines in values), refused before
        pass 1 where its task would hold more than a worker's memory over its threads: about
        ``text.STREAM_PEAK_BLOCKS`` blocks at its peak, 1.3 GB at the default blocksize (a trial's workers of
        1 GB a thread were killed, and the run failed after Dask's retries).  Only on a cluster whose workers
        have memory limits."""
        options = self.plan.reading.text
        if options is None or options.format not in text.TEXT_FORMATS or self.previous is not None:
            return  # (Arrow and ORC files are read a batch at a time; a resumed run's blocksize is its identity)
        streamed = [f for f in self.plan.files if not text.splittable(f.path, options)]
        per_thread = worker_memory_per_thread() if streamed else None
        if per_thread is None:
            return

        def block(f) -> int:  # (a compressed file's text taken as COMPRESSED_RATIO times its size)
            return min(self.blocksize, f.size * (text.COMPRESSED_RATIO if text.compression_of(f.path) else 1))

        largest = max(streamed, key=block)
        peak = text.STREAM_PEAK_BLOCKS * block(largest)
        if peak > per_thread:
            fits = 2 ** int(math.log2(max(per_thread // text.STREAM_PEAK_BLOCKS, 2**20) / 2**20))
            raise ValueError(
                f"{full_url(self.plan.fs, largest.path)!r} is read by one task, a block of --blocksize "
                f"({human_size(self.blocksize)}) at a time, which holds about {text.STREAM_PEAK_BLOCKS} blocks "
                f"({human_size(peak)}) at its peak; this cluster's workers have {human_size(per_thread)} a "
                f"thread: pass --blocksize {fits}MiB (blocksize=), or workers with more memory a thread"
            )

    def finished_already(self) -> ShuffleReport | None:
        """The report of dest's finished result if this call wrote it; another call's refused unless overwrite."""
        if self.old_result is None or self.overwrite:
            return None
        differences = _differences_from_result(self.old_result, self.spec, self.requested_piles, self.requested_seed)
        if not differences:
            return _already_finished(self.old_result, self.dest_fs, self.dest_path, self.scratch, self.plan)
        raise FileExistsError(
            f"dest {self.dest_url!r} holds a finished daskpile result of another call (this call: "
            f"{'; '.join(differences)}); "
            "pass overwrite=True (--overwrite on the command line) to replace it"
        )

    def prepare_scratch(self) -> None:
        """Scratch with the run file; a resumed run whose piles are gone from dest starts pass 1 afresh."""
        self.staging = posixpath.join(self.dest_path, self.spec.staging()) if self.old_result is not None else None
        can_finish = self.previous is not None and _passes.scratch_can_finish(
            self.scratch, self.dest_fs, [self.staging or self.dest_path], self.piles, self.seed, self.output
        )
        if self.previous is not None and not can_finish:
            self.scratch.remove()  # pass 2 consumed bands whose piles are no longer in dest
            self.previous = None
        if self.previous is None:  # a resumed run has part of its scratch already
            scratch_bytes = _scratch.scratch_bytes(
                self.estimated_bytes, self.pieces, self.scratch.band_count, self.piles, self.plan.schema
            )
            result_bytes = _sizing.result_bytes(
                sum(self.plan.sizes), self.estimated_bytes, self.output.format, self.output.compression,
                self.plan.schema,
            )  # fmt: skip
            _sizing.check_space(
                self.scratch.fs, self.scratch.directory, scratch_bytes, self.dest_fs, self.dest_path, result_bytes
            )
        make_private_directory(self.scratch.fs, self.scratch.directory)
        run_state.write(self.scratch.fs, self.scratch.directory, self.spec)

    def scatter(self) -> list[_passes.ScatterResult]:
        """Pass 1: every partition's rows to random piles in scratch.  Bad input removes scratch."""
        try:
            timer = Timer(self.progress)
            kept = self.scratch.kept() if self.previous is not None else {}  # a new run has none to reuse
            run_key = self.spec.key()  # (once: it hashes every file's URL, 22 ms for 30,000)
            tasks = [
                task(
                    _passes.scatter_partition, self.plan.fs, files, k, self.piles, self.seed, self.scratch,
                    self.plan.reading, self.verify, self.blocksize, self.task_memory, kept.get(k, {}), self.output,
                    key=f"daskpile-scatter-{k}-{run_key}",
                )
                for k, files in enumerate(self.partitions)
            ]  # fmt: skip
            *scattered, self.totals = compute(
                [
                    task_of(_passes.ScatterResult.without_pile_counts, t, key=f"daskpile-scattered-{k}-{run_key}")
                    for k, t in enumerate(tasks)
                ],
                along=_summed(tasks, self.piles, f"daskpile-pile-totals-{run_key}"),
                progress=self.progress,
            )
            self.refuse_what_the_output_cannot_hold(scattered)
        except WorkerKilled as e:
            raise e.saying(self._large_row_group_said(e.key)) from None
        except (ValueError, TypeError, OSError) as e:
            self.scratch.remove()  # bad input, or scratch full: nothing worth resuming
            self.refuse_sources_changed_under(e)
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                where = full_url(self.scratch.fs, self.scratch.directory)
                raise OSError(
                    e.errno,
                    f"scratch {where!r} is full: {e.strerror or e}. Free space there, or give scratch (--scratch) on "
                    "a larger disk or an object store, and run the same command again (nothing was written to dest)",
                ) from e
            raise
        self.refuse_sources_written_during_the_pass()
        self.seconds_scatter = timer.seconds  # (the pass-1 line says the report's seconds: they differed)
        self.counts = self.totals.counts
        self.scratch = dataclasses.replace(self.scratch, pieces=tuple(r.pieces for r in scattered))
        timer.say(
            f"pass 1: {count(int(self.counts.sum()), 'row')} read from {count(len(self.plan.files), 'file')} in "
            f"{count(len(self.partitions), 'task')}{self._pieces_said(scattered)} "
            f"({size(sum(self.plan.sizes))}), {self._scratch_written_said(scattered)}",
            self.seconds_scatter,
        )
        return scattered

    def refuse_sources_written_during_the_pass(self) -> None:
        """Once pass 1 has read every file, one written again or removed since the plan listed it is refused, and
        scratch, of rows of no one version of the source, removed.  A store that cannot be looked at now says so,
        and scratch is kept: the same command again resumes from it."""
        try:
            self.plan.refuse_files_written_again()
        except FileChangedError:
            self.scratch.remove()
            raise

    def refuse_sources_changed_under(self, failure: BaseException) -> None:
        """Where pass 1 failed on a source file written again or removed while it ran (a file gone, one cut
        short as it was written), that is said: not the error it caused.  Where the workers found a source file
        changed or gone that this process finds as listed, they see another store (or disk) than this process:
        that is said, not "written again", which every later try would meet again."""
        try:
            self.plan.refuse_files_written_again()
        except OSError:  # (the store cannot be looked at now: the failure is said as it is)
            return
        if isinstance(failure, (FileChangedError, FileNotFoundError)) and self.plan.table is None:
            self.refuse_a_source_the_workers_find_otherwise(str(failure))

    def refuse_a_source_the_workers_find_otherwise(self, said: str) -> None:
        """``StoresApartError`` where the source file a worker's error names (``said``), which this process finds
        as listed, is found otherwise by a worker asked now: they see another store, or disk, under one URL.
        Where every worker finds it as listed now, it changed and came back while the run read it (a file
        restored with its stamp): the worker's error is said as it is."""
        named = [f for f in self.plan.files if repr(full_url(self.plan.fs, f.path)) in said]  # (quoted: whole)
        if len(named) != 1 or named[0].listed is None:  # (a table's files are never listed: nothing to compare)
            return
        here = versions_now(self.plan.fs, [named[0].path])[0]
        if here is None or not named[0].listed.same_as(here):
            return
        url = full_url(self.plan.fs, named[0].path)
        finding, otherwise = _places.workers_finding(self.plan.fs, named[0].path, named[0].listed)
        if otherwise:
            raise StoresApartError(
                f"the workers do not find source file {url!r} as this process lists it ({said}; {len(otherwise)} of "
                f"{len(finding) + len(otherwise)} asked again), while this process finds every source file as "
                f"listed: {_SAME_STORE}? Nothing was written to dest"
            ) from None  # (raised while the workers' error is handled: it is said in the message)

    def _scratch_written_said(self, scattered) -> str:
        """``"N MiB to scratch"``; a resumed run's own, apart from what it kept of the run it resumes."""
        written = sum(r.scratch_bytes for r in scattered if not r.reused)
        kept = sum(r.scratch_bytes for r in scattered if r.reused)
        if self.previous is None or not kept:
            return f"{size(written + kept)} to scratch"
        return f"{size(written)} to scratch, {size(kept)} kept from the interrupted run"

    def _large_row_group_said(self, key: str) -> str:
        """Where a killed pass-1 task read a Parquet column chunk larger than ``blocksize``: a smaller blocksize
        cuts its row group, but a page is read whole, and one may hold most of the chunk.  (Rows too large for
        a task are refused before they are read: ``scatter_partition``'s ``task_memory``.)"""
        partition = int(key.split("-")[2]) if key.startswith("daskpile-scatter-") else None
        if partition is None or self.plan.reading.text is not None or partition >= len(self.partitions):
            return ""
        largest = (0, "", 0, "")  # bytes of a column chunk, url, row group, column
        for f in _files_near(self.partitions, partition):
            with contextlib.suppress(OSError, ValueError), open_parquet(self.plan.fs, f.path) as parquet:
                footer = parquet.metadata
                for g in range(footer.num_row_groups):
                    group = footer.row_group(g)
                    for c in range(group.num_columns):
                        chunk = group.column(c)
                        if chunk.total_uncompressed_size > largest[0]:
                            largest = (chunk.total_uncompressed_size, full_url(self.plan.fs, f.path), g,
                                       chunk.path_in_schema)  # fmt: skip
        nbytes, url, group, column = largest
        if nbytes <= self.blocksize:
            return ""
        return (
            f". Row group {group} of {url!r} holds {nbytes / 2**20:,.0f} MiB of column {column!r} alone: a piece of "
            "it is read page by page, but a Parquet page is read whole, and writers may put many large values in "
            "one (pyarrow up to 1,024 unless told otherwise): if a smaller blocksize does not help, rewrite the file "
            "with smaller row groups or pages (pyarrow: row_group_size, data_page_size and write_batch_size)"
        )

    @staticmethod
    def _pieces_said(scattered) -> str:
        """ " (N pieces)" where tasks read their files in more pieces than one each (``blocksize``)."""
        pieces = sum(r.pieces for r in scattered)
        return f" ({count(pieces, 'piece')})" if pieces > len(scattered) else ""

    def refuse_what_the_output_cannot_hold(self, scattered) -> None:
        """A null, which a file of lines can only write as an empty line, read back as an empty string: refused
        once pass 1 has found one, naming its file, before pass 2 writes anything (``scatter`` then removes
        scratch, as for other bad input).  A piece of an earlier version's run, reused, says nothing of its
        nulls: verification finds them."""
        if self.output.format != "lines":
            return
        for result, files in zip(scattered, self.partitions, strict=True):
            if result.nulls:
                raise ValueError(
                    f"column {self.plan.schema.names[0]!r} holds a null, in {self._file_holding_a_null(files)}, "
                    "which a file of lines would write as an empty line, read back as an empty string: write "
                    "another format (jsonl, parquet), or fill the nulls first"
                )

    def _file_holding_a_null(self, files) -> str:
        """Which of a partition's files holds the null its pass 1 found: read again here, one at a time."""
        if len(files) > 1:
            for f in files:
                pieces = read_pieces(self.plan.fs, [f], self.plan.reading, self.blocksize)
                if any(table.column(0).null_count for _, table in pieces):
                    return full_url(self.plan.fs, f.path)
        return full_url(self.plan.fs, files[0].path)

    def gather(self, scattered) -> tuple[list[str], list[_passes.GatherResult]]:
        """Pass 2: every pile permuted into its file (split if over its memory budget); the files' names."""
        try:
            split = _oversized_piles(self.totals, scattered, self.memory_per_pile, self.pile_plan, self.on_oversize)
        except PileTooLargeError:
            self.scratch.remove()  # a rerun needs other arguments, so nothing here can be resumed
            raise
        target = self.staging or self.dest_path
        self.dest_fs.makedirs(target, exist_ok=True)
        run_state.write(self.dest_fs, self.dest_path, self.spec)
        timer = Timer(self.progress)
        try:
            names, gathered = _pass_2(
                self.scratch, self.counts, split, self.seed, self.dest_fs, target, self.plan.schema, self.verify,
                _budget(self.memory_per_pile, self.pile_plan), self.spec.key(), self.rows_per_file, self.progress,
                self.second_pass == "eager", self.output,
            )  # fmt: skip
        except WorkerKilled as e:
            raise e.saying(self._large_pile_said(e.piles, scattered)) from None
        except ValueError as e:  # rows the output format cannot hold (a NaN in JSON): a rerun would fail alike
            self.discard(e)
            raise
        except OSError as e:  # the piles written are kept: a rerun with the space resumes from them
            if e.errno == errno.ENOSPC:
                said = str(e).removeprefix(f"[Errno {e.errno}] ")
                larger = (
                    " (daskpile dictionary-encodes only categorical columns)" if self.output.format == "parquet" else ""
                )
                raise OSError(
                    e.errno,
                    f"dest {full_url(self.dest_fs, target)!r}, or scratch for split piles, is full: {said}. Free "
                    "space and run the same call again: it resumes from the piles written. The output may take more "
                    f"space than the input{larger}",
                ) from e
            raise
        _dest.remove_temporaries(self.dest_fs, target)  # of writers killed mid-file, in this run or an interrupted one
        self.seconds_gather = timer.seconds
        split_note = ""
        if split:
            split_note = f", {count(len(split), 'pile')} over memory_per_pile split in {sum(split.values())}"
        split_note += f", cut into files of {count(self.rows_per_file, 'row')}" if self.rows_per_file else ""
        empty = sum(1 for r in gathered if not r.rows)
        split_note += f", {empty:,} of them empty" if empty else ""
        # (a resumed run's files of its interrupted run, not written now; not a retried task's own file)
        kept = sum(r.reused for r in gathered) if self.previous is not None else 0
        split_note += f", {kept:,} of them kept from the interrupted run" if kept else ""
        timer.say(
            f"pass 2: {count(sum(r.rows for r in gathered), 'row')} written to {count(len(names), 'file')} "
            f"({size(sum(r.bytes for r in gathered))}){split_note}",
            self.seconds_gather,
        )
        return names, gathered

    def _large_pile_said(self, piles: tuple[int, ...], scattered) -> str:
        """The piles a killed pass-2 task held, as pass 1 measured them: the largest, and its largest row, which
        no pile count or split takes apart."""
        if not piles:
            return ""
        pile_bytes, largest = _pile_bytes(self.totals, scattered), self.totals.largest_rows
        j = max(piles, key=lambda p: pile_bytes[p])
        held = f"pile {j}" if len(piles) == 1 else f"piles {piles[0]} to {piles[-1]}, the largest pile {j}"
        said = f". The task held {held}: {count(int(self.counts[j]), 'row')}, {pile_bytes[j] / 2**20:,.0f} MiB"
        said += " in memory"
        if largest is None:
            return said
        row, per_task = int(largest[j]), self.task_memory or worker_memory_per_thread()
        said += f", its largest row {row / 2**20:,.1f} MiB"
        if per_task is not None and row * _sizing.ROW_COPIES > per_task:
            said += (
                f"; a task holds a row up to {_sizing.ROW_COPIES} times over, more than the {per_task / 2**20:,.0f} "
                f"MiB it has: give each worker thread at least {_sizing.row_memory(row) / 2**30:,.1f} GiB, which no "
                "pile count or memory_per_pile can spare it"
            )
        return said

    def check_fingerprints(self, scattered, gathered) -> Fingerprint:
        """The fingerprint of the rows read, which must be that of the rows written; if not, nothing is kept.

        Which file is wrong is unknown, and a rerun that reused the run's files would fail alike, while the
        cause may have passed (a disk or a store that corrupted a write once).
        """
        try:
            return _check_fingerprints(scattered, gathered, self.dest_url)
        except VerificationError as e:
            self.discard(e)
            raise

    def discard(self, failure: BaseException) -> None:
        """Remove what this run wrote, to scratch and to dest, after ``failure``, which a rerun must not resume.

        A failure to clean up is noted on ``failure``, never raised in its place.
        """
        try:
            self.scratch.remove()
            _dest.discard_unfinished(self.dest_fs, self.dest_path)  # (a dest the run made goes with its lease)
        except OSError as e:
            failure.add_note(f"what the run wrote could not all be removed: {e!r}")

    def commit_staged(self, names: list[str]) -> None:
        """An overwrite's new files, written beside the old result, replace it."""
        if self.staging is not None:
            _dest.commit_staged(self.dest_fs, self.dest_path, self.staging, names, self.old_result)

    def refuse_files_written_out_of_sight(self, gathered) -> None:
        """Before anything of dest is replaced, refuse a result whose files, as pass 2 wrote them, this process
        does not find (each the listing misses looked at on its own): its manifest would name files dest does
        not hold.  Where a worker asked now finds them, the workers write to another store under the same URL
        (another endpoint in their environment): that is said."""
        expected = {r.path: FileVersion(r.bytes, None) for r in gathered}
        found = _infos_now(self.dest_fs, list(expected))
        unseen = [
            path
            for (path, version), info in zip(expected.items(), found, strict=True)
            if info is None or not version.same_as(FileVersion(info.get("size"), None))
        ]
        if not unseen:
            return
        names = [posixpath.relpath(p, self.dest_path) for p in unseen]
        said = f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        finding, others = _places.workers_finding(self.dest_fs, unseen[0], expected[unseen[0]])
        if finding:
            raise StoresApartError(
                f"the workers wrote {count(len(names), 'file')} of the result that this process does not find as "
                f"written in dest {self.dest_url!r} {said}, where {len(finding)} of {len(finding) + len(others)} "
                f"workers asked find them: {_SAME_STORE}? Nothing was committed: the same command again, once they "
                "do, resumes the run"
            )
        raise FileNotFoundError(
            f"{count(len(names), 'file')} of the result that pass 2 wrote in dest {self.dest_url!r} {said} "
            f"{'is' if len(names) == 1 else 'are'} not there, or not as written: removed or written over while "
            "the run ran? Nothing was committed: the same command again resumes the run"
        )

    def _commit(self, manifest: dict) -> str:
        """The manifest written: the result is complete."""
        self.manifest = manifest
        path = _manifest.write(self.dest_fs, self.dest_path, manifest)
        self.complete = True
        return path

    def wrote_manifest(self) -> bool:
        """Whether dest holds this run's manifest: a Ctrl-C may land once it is written, before ``complete``
        is set (CI saw a complete result called unfinished)."""
        if self.complete or self.manifest is None:
            return self.complete
        try:
            return _manifest.read_at(self.dest_fs, self.dest_path) == json.loads(json.dumps(self.manifest))
        except Exception:  # (said while a Ctrl-C is handled: what cannot be read is not known to be there)
            return False

    def finish(self, scattered, names, gathered, fingerprint) -> ShuffleReport:
        """The manifest, written last: the result is complete.  Then the run's state goes."""
        manifest = _manifest.build(
            piles=self.piles,
            seed=self.seed,
            rows_per_pile=[int(self.counts[j]) for j in range(self.piles)],
            files=names,
            rows_per_file=[r.rows for r in gathered],
            schema=self.plan.schema,
            source_files=self.plan.urls,
            seconds={"scatter": round(self.seconds_scatter, 3), "gather": round(self.seconds_gather, 3)},
            fingerprint=fingerprint,
            file_fingerprints=[r.fingerprint for r in gathered] if fingerprint is not None else None,
            null_columns=_manifest.union_of_nulls(r.nulls for r in scattered),
            pile_plan=self.pile_plan,
            source=self.plan.describe(),
            run=self.spec.call_json(),
            file_stamps=_stamps(_infos_now(self.dest_fs, [posixpath.join(self.dest_path, n) for n in names])),
            second_pass=self.second_pass,
            output=self.output,
        )
        manifest_path = self._commit(manifest)
        _dest.remove_run_state(self.dest_fs, self.dest_path)
        self.scratch.remove()
        return ShuffleReport(
            rows=int(self.counts.sum()),
            piles=self.piles,
            seed=self.seed,
            dest=self.dest_url,
            files=[full_url(self.dest_fs, posixpath.join(self.dest_path, n)) for n in names],
            manifest=full_url(self.dest_fs, manifest_path),
            source_files=self.plan.urls,
            seconds_scatter=self.seconds_scatter,
            seconds_gather=self.seconds_gather,
            scratch_bytes=sum(r.scratch_bytes for r in scattered),
            output_bytes=sum(r.bytes for r in gathered),
            fingerprint=fingerprint,
            # Reused in a run that did not resume: a retry of a task whose worker died after writing (deaths_said)
            resumed_partitions=sum(r.reused for r in scattered) if self.previous is not None else 0,
            resumed_piles=sum(r.reused for r in gathered) if self.previous is not None else 0,
            pile_plan=self.pile_plan,
            skipped_files=list(self.plan.skipped),
            source_description=self.plan.describe(),
            worker_deaths=len(self.deaths),
        )


def _differences_from_result(manifest: dict, spec: run_state.RunSpec, requested_piles, requested_seed) -> list[str]:
    """How this call differs from the one that wrote a finished result; [] for a retry of the same command."""
    if "window" in manifest:
        return [f"it is a moving window (version {manifest['window']['version']}): daskpile append adds to it"]
    if manifest.get("run") is None:
        return ["it records no run: written by an earlier version"]
    done = run_state.RunSpec.from_json(manifest["run"])
    moved = [] if done.dest == spec.dest else [f"dest is a copy of the result written at {done.dest}"]
    return moved + done.differences(
        spec.source_files, spec.source_stamps, requested_piles, requested_seed, spec.blocksize, spec.rows_per_file,
        spec.schema_key, spec.second_pass, spec.output,
    )  # fmt: skip


def _files_near(partitions: list, partition: int, most: int = 64) -> list:
    """The files of ``partition`` and of the partitions nearest it, ``most`` at most: the task Dask names as
    killed may be one that ran beside the one that held the memory, on the same worker (tasks are sent in
    order).  Of a task of many files, its first 16 (a task of many files holds small ones).

    >>> _files_near([["a"], ["b", "c"], ["d"]], 2, most=3)
    ['d', 'b', 'c']
    """
    order = sorted(range(len(partitions)), key=lambda k: abs(k - partition))
    return [f for k in order for f in partitions[k][:16]][:most]


def _infos_now(fs, paths: list[str]) -> list[dict | None]:
    """``listed_infos``, each file a listing misses looked up on its own (``_places.info_now``: an NFS client's
    cached folder lists files another host has just written up to a minute late; they would be taken for gone,
    or their stamps be None, and the finished result said changed)."""
    return [info or _places.info_now(fs, path) for path, info in zip(paths, listed_infos(fs, paths), strict=True)]


def _stamps(infos: list[dict | None]) -> list[str | None]:
    return [None if info is None else file_stamp(info) for info in infos]


def _already_finished(manifest: dict, dest_fs, dest_path: str, scratch_dir: Scratch, plan) -> ShuffleReport:
    """The report of the finished result, from its manifest; what a run killed after its commit left is removed."""
    dest_fs.invalidate_cache(dest_path)
    infos = listed_infos(dest_fs, [posixpath.join(dest_path, n) for n in manifest["files"]])
    now = _stamps(infos)
    changed = [
        n for n, then, later in zip(manifest["files"], manifest["file_stamps"], now, strict=True) if then != later
    ]
    if changed:
        raise FileExistsError(
            f"dest {full_url(dest_fs, dest_path)!r} holds this call's result, but {count(len(changed), 'file')} of "
            f"it changed or went since it was written ({', '.join(changed[:3])}): pass overwrite=True "
            "(--overwrite) to write it again"
        )
    _dest.remove_run_state(dest_fs, dest_path)
    scratch_dir.remove()
    fingerprint = manifest.get("fingerprint")
    return ShuffleReport(
        rows=manifest["rows"],
        piles=manifest["piles"],
        seed=manifest["seed"],
        dest=full_url(dest_fs, dest_path),
        files=[full_url(dest_fs, posixpath.join(dest_path, n)) for n in manifest["files"]],
        manifest=full_url(dest_fs, posixpath.join(dest_path, _manifest.MANIFEST_NAME)),
        source_files=list(manifest["source_files"]),
        seconds_scatter=0.0,
        seconds_gather=0.0,
        scratch_bytes=0,
        output_bytes=sum(info["size"] for info in infos),  # every file is there: its stamp is unchanged
        fingerprint=None if fingerprint is None else Fingerprint.from_json(fingerprint),
        pile_plan=None if manifest.get("pile_plan") is None else _sizing.PilePlan(**manifest["pile_plan"]),
        skipped_files=list(plan.skipped),
        source_description=manifest.get("source", {}),
        already_finished=True,
    )


@contextlib.contextmanager
def _complete_if_interrupted(run: _Run):
    """An interruption once the manifest is written (while scratch is removed, the lease let go) says that
    the result is complete, and, unless the call replaced a result (``overwrite``), that a run of the same
    call again only reports it."""
    try:
        yield
    except BaseException as e:
        # (or an error raised while the interruption was handled: a file closed twice in scratch's removal)
        if any(isinstance(c, KeyboardInterrupt) for c in exception_chain(e)) and run.wrote_manifest():
            again = (
                "a call without overwrite=True reports it"
                if run.overwrite
                else "the same call again reports it, and removes what is left of its scratch"
            )
            e.add_note(f"the result at {run.dest_url} was complete (its manifest written) when interrupted: {again}")
            e.daskpile_complete = run.dest_url  # for the command line's one line
            e.daskpile_reported_again = not run.overwrite
        raise


@contextlib.contextmanager
def _resumable(scratch_dir: Scratch, dest_fs, dest_path: str):
    """An interruption or an unexpected failure of the passes says what can be resumed, and where its state is."""
    try:
        yield
    except (KeyboardInterrupt, Exception) as e:
        if not isinstance(e, VerificationError) and exists(scratch_dir.fs, scratch_dir.directory):
            # dest, once pass 2 has begun there (an interruption in pass 1 leaves it as it was, or not made)
            state = full_url(scratch_dir.fs, scratch_dir.directory)
            with contextlib.suppress(Exception):  # (never in the way of the error said)
                if run_state.read(dest_fs, dest_path) is not None:
                    state += f" and {full_url(dest_fs, dest_path)}"
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
            "No manifest was written, and what the run wrote was removed: a rerun starts afresh."
        )
    return read


def _pile_groups(piles: list[int], threads: int) -> list[list[int]]:
    """Consecutive piles per pass-2 task: about 4 tasks per thread, for balance,
    and no more tasks than that, since each task opens every scratch file.

    >>> _pile_groups([0, 1, 2, 3, 4], 1)
    [[0, 1], [2, 3], [4]]
    """
    per_task = max(1, math.ceil(len(piles) / (4 * threads)))
    return [piles[i : i + per_task] for i in range(0, len(piles), per_task)]


def _pass_2(
    scratch_dir,
    counts,
    split,
    seed,
    dest_fs,
    target,
    schema,
    verify,
    budget,
    key,
    rows_per_file,
    progress,
    permute,
    output,
) -> tuple[list[str], list]:
    """Pass 2 (and for ``rows_per_file``, pass 3): the output files' names and their results, in sequence order."""
    piles = len(counts)
    if rows_per_file is None:
        subs = [range(split[j]) if j in split else [None] for j in range(piles)]
        names = [_manifest.part_name(j, piles, sub, output.suffix) for j in range(piles) for sub in subs[j]]
        tasks, groups, units = _gather_tasks(
            scratch_dir, counts, split, seed, dest_fs, target, schema, verify, budget, key, permute, output,
            counted=shows_progress_lines(progress),
        )  # fmt: skip
        with _saying_piles_of_a_killed_task(groups, key):
            if split:  # the tasks splitting a pile read its band too, and are not counted: remove at the end
                return names, _in_order(compute(tasks, progress=progress))
            bands_read = [sorted({scratch_dir.band_of(j) for j in g}) for g in groups]
            with _scratch.BandRemover(scratch_dir, bands_read) as bands:
                return names, _in_order(compute(tasks, progress=progress, on_done=bands.task_done, units=units))
    # pass 2 writes the permuted piles to scratch, pass 3 cuts their sequence into equal files
    tasks, groups, units = _gather_tasks(
        scratch_dir, counts, split, seed, scratch_dir.fs, None, schema, False, budget, key,
        counted=shows_progress_lines(progress),
    )  # fmt: skip
    with _saying_piles_of_a_killed_task(groups, key):
        permuted = _in_order(compute(tasks, progress=progress, units=units))
    ranges = _file_ranges([(r.path, r.rows) for r in permuted], rows_per_file)
    names = [_manifest.part_name(f, len(ranges), suffix=output.suffix) for f in range(len(ranges))]
    rechunk = [
        task(
            _passes.rechunk_to_parquet, file_ranges, scratch_dir.fs, dest_fs, posixpath.join(target, names[f]), f,
            seed, schema, verify, output, key=f"daskpile-rechunk-{f}-{key}",
        )
        for f, file_ranges in enumerate(ranges)
    ]  # fmt: skip
    return names, compute(rechunk, progress=progress)  # in file order already


@contextlib.contextmanager
def _saying_piles_of_a_killed_task(groups: list[list[int]], key: str):
    """A pass-2 task whose workers died says which piles it held (``WorkerKilled.piles``): those of its group,
    or the one it split, or whose sub-piles it gathered."""
    try:
        yield
    except WorkerKilled as e:
        group = next((g for g in groups if e.key == f"daskpile-gather-{g[0]:06d}-{key}"), None)
        split = re.match(r"daskpile-(?:split|gather)-(\d+)-", e.key)
        e.piles = tuple(group) if group is not None else (int(split[1]),) if split else ()
        raise


def _gather_tasks(
    scratch_dir,
    counts,
    split,
    seed,
    fs,
    target,
    schema,
    verify,
    budget,
    key,
    permute=True,
    output=_passes.PARQUET,
    counted=False,
) -> tuple[list, list, Units | None]:
    """Pass 2 as Dask tasks: groups of piles, and for each split pile its split then groups of sub-piles.

    Into Parquet files in ``target``, or with ``target=None`` into permuted
    Arrow files in scratch (for ``rows_per_file``).  Returns the tasks, the
    piles of each of the first tasks (those of piles that are not split), and
    the piles as units of progress where they are ``counted`` and none is split.
    """
    piles = len(counts)
    as_arrow = target is None

    def path(j, sub=None):
        if as_arrow:
            return posixpath.join(scratch_dir.directory, "permuted", _manifest.part_name(j, piles, sub) + ".arrow")
        return posixpath.join(target, _manifest.part_name(j, piles, sub, output.suffix))

    threads = total_threads()
    # Dask starts independent tasks in descending order of their keys (dask.order's tie-break), so with
    # zero-padded pile numbers the tasks of band 0 run last: the band that stays until the end anyway.
    groups = _pile_groups([j for j in range(piles) if j not in split], threads)
    units = Units.new("pile", [len(group) for group in groups]) if counted and not split else None
    tasks = [
        task(
            _passes.gather_to_parquet, scratch_dir, piles, group, [int(counts[j]) for j in group], seed, fs,
            [path(j) for j in group], schema, verify, as_arrow=as_arrow, permute=permute, output=output,
            on_pile=None if units is None else units.report(i), key=f"daskpile-gather-{group[0]:06d}-{key}",
        )
        for i, group in enumerate(groups)
    ]  # fmt: skip
    for j, subs in split.items():
        split_result = task(
            _passes.split_pile, scratch_dir, j, subs, seed, budget // 2, budget, key=f"daskpile-split-{j}-{key}"
        )
        tasks += [
            dask.delayed(giving_memory_back(_passes.gather_split_to_parquet))(
                split_result, piles, group, seed, fs, [path(j, s) for s in group], schema, verify, as_arrow, permute,
                output, dask_key_name=f"daskpile-gather-{j}-{group[0]}-{key}",
            )
            for group in _pile_groups(list(range(subs)), threads)
        ]  # fmt: skip
    return tasks, groups, units


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


def _oversized_piles(totals, scattered, memory_per_pile, pile_plan, on_oversize: str) -> dict[int, int]:
    """{pile: sub-piles} for the piles over their memory budget, or PileTooLargeError.

    Sizes come from pass 1: the Arrow bytes of each pile's rows, as it counted
    them (a few rows of many MB make a pile large whatever its row count).
    Without a budget (a pile count given, no ``memory_per_pile``) nothing is
    split, so the output never depends on the cluster's memory.
    """
    budget, counts = _budget(memory_per_pile, pile_plan), totals.counts
    if budget is None or int(counts.sum()) == 0:
        return {}
    pile_bytes = _pile_bytes(totals, scattered)
    over = {j: int(nbytes) for j, nbytes in enumerate(pile_bytes) if nbytes > budget}
    largest = totals.largest_rows
    too_large = [j for j in over if largest is not None and largest[j] >= budget]
    if too_large:  # (whatever on_oversize says: neither more piles nor a split would help)
        j = too_large[0]
        raise PileTooLargeError(
            f"pile {j} holds a row of {int(largest[j]):,} bytes, as much as memory_per_pile={budget:,} or more: no "
            "split brings it under. Pass a larger memory_per_pile (--memory-per-pile), and workers with the memory "
            "for it"
        )
    if over and on_oversize == "error":
        j = max(over, key=over.get)
        raise PileTooLargeError(
            f"{len(over)} of {len(counts)} piles are over memory_per_pile={budget:,} bytes, the largest pile {j} "
            f"with {int(counts[j]):,} rows, {over[j]:,} bytes: pass more piles (--piles), a larger memory_per_pile "
            "(--memory-per-pile), or on_oversize='split' (--on-oversize split)"
        )
    return {j: _sizing.sub_piles(int(counts[j]), nbytes, 0 if largest is None else int(largest[j]), budget)
            for j, nbytes in over.items()}  # fmt: skip


def _pile_bytes(totals: _passes.PileTotals, scattered) -> np.ndarray:
    """Each pile's Arrow bytes as pass 1 counted them; for scratch written by a daskpile that did not count
    them, its rows at the average row's scratch bytes."""
    if totals.pile_bytes is not None:
        return totals.pile_bytes
    return totals.counts * (sum(r.scratch_bytes for r in scattered) / max(int(totals.counts.sum()), 1))


def _summed(tasks: list, piles: int, key: str):
    """One task giving the ``PileTotals`` of pass-1 ``tasks`` (of ``piles``), summed ``SUM_FAN_IN`` at a time on
    the workers."""
    if not tasks:
        return task(_passes.PileTotals, np.zeros(piles, np.int64), None, None, key=f"{key}-none")
    few = _passes.summed_to_a_few(
        tasks, lambda depth, index, children: task_of(_passes.pile_totals, *children, key=f"{key}-{depth}-{index}")
    )
    return task_of(_passes.pile_totals, *few, key=key)


# A pile count beyond which piles of fewer rows than this on average are said (files of a few rows each)
MANY_PILES = 10_000
FEW_ROWS_A_PILE = 100
# A count of pass-1 tasks beyond which tasks of less data than this on average are said
MANY_TASKS = 1_000
SMALL_TASK_BYTES = 2**20


def _estimate(plan) -> tuple[int, int, int]:
    """(rows, bytes in memory, bytes a row takes at least) of the source, for piles="auto", the memory checks
    and, for Parquet, the pieces (``Reading.row_bytes``; 0 for other formats, which are cut as they are read)."""
    files, sizes = [f.path for f in plan.files], plan.sizes
    if plan.reading.text is None:
        return _sizing.estimate_parquet(plan.fs, files, sizes, plan.metadata)
    first = next((f for f in plan.files if f.size), plan.files[0]).path
    if plan.reading.text.format in arrowfiles.FORMATS:
        return (*arrowfiles.estimate(plan.fs, first, sizes, plan.reading.text.format), 0)
    compressed = [text.compression_of(f) is not None for f in files]
    return (
        *text.estimate(plan.fs, first, sizes, compressed, plan.data_schema, plan.reading.text, plan.reading.window),
        0,
    )


def _schema_key(plan) -> str:
    """What the rows of a run are made of besides its files: the schema they are read into, and how."""
    key = f"{plan.reading.policy}:{plan.schema.remove_metadata().to_string()}"
    if plan.reading.text is not None:
        key += f":{plan.reading.text.key()}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]
