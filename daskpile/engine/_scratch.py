"""The scratch format: one Arrow IPC file per input partition (or piece of one).

Pass 1 writes, for input partition ``k``, a single IPC file holding its rows
grouped by pile: pile 0's rows, then pile 1's, and so on.  The rows are stored
in record batches that each hold a run of whole consecutive piles, about
``RUN_BYTES`` long (a pile larger than that is a batch of its own, or, in a
local file, several of about ``WRITE_BUFFER_BYTES`` a column at most, see
``write_piles``; empty piles take no room).  The footer lists every pile's row count and every batch's number of
rows, so pass-2 task ``j`` finds the batches holding pile ``j`` in each file
and slices the pile out of them.  That makes at most BANDS x K + M
files in all (bands below), never K x M, and with many small piles far fewer
batches than piles, so far fewer reads (see ``RUN_BYTES``).  An input file too large to hold in memory is read
in pieces of whole row groups (or of a row group's rows), each with its own scratch file
(``scatter-00000k-000p.arrow`` for pieces after the first).

A run of ``shuffle_parquet`` splits those files further, by bands of
consecutive piles (``scatter-00000k-b3.arrow`` holds the rows the partition
sent to the piles of band 3; see ``BANDS``, and ``bands_for``), so that pass 2
can remove each band's files as soon as every pile of the band is written.

Scratch is uncompressed: it is written once and read once, sequentially, and
compressing it costs more CPU than the bytes it saves on local disk.
"""

from __future__ import annotations

import base64
import bisect
import collections
import concurrent.futures
import contextlib
import dataclasses
import errno
import functools
import itertools
import json
import os
import posixpath
import re
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Iterator

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from daskpile._kernels import offsets
from daskpile._storage import (
    EndFetchedFirst,
    FileVersion,
    atomic_sink,
    check_writable,
    filesystem,
    full_url,
    is_local,
    make_private_directory,
    open_read,
    reaching,
    remove_tree,
    rows_per_write,
    write_bytes,
)


@dataclasses.dataclass(frozen=True)
class Scratch:
    """The scratch files of one run: ``directory/scatter-00000k.arrow`` for each partition k.

    ``pieces`` (known after pass 1) is the number of pieces of each partition;
    None means one each.
    """

    fs: fsspec.AbstractFileSystem
    directory: str
    partitions: int
    pieces: tuple[int, ...] | None = None
    bands: tuple[int, ...] | None = None  # band b holds piles bands[b]:bands[b + 1]; None: one band, unnamed

    @classmethod
    def create(
        cls, url: str | None, storage_options: dict | None, partitions: int, name: str | None = None, make: bool = True
    ) -> Scratch:
        """The directory ``daskpile-<name>`` under ``url`` (default: the local temporary directory).

        ``name`` defaults to a fresh random one; ``make=False`` only names the
        directory.  Every worker must be able to reach ``url``: on a cluster
        whose workers share no disk with the client, pass an object-store URL
        (``s3://...``).
        """
        if url is not None and "::" in str(url):
            raise ValueError(
                f"scratch {url!r}: a chained URL's cache (simplecache::, filecache::) would give back what scratch "
                "files held before they were written again: give the store's own URL"
            )
        fs, root = filesystem(url or tempfile.gettempdir(), storage_options)
        directory = posixpath.join(root, f"daskpile-{name or uuid.uuid4().hex[:16]}")
        if make:
            if is_local(fs):  # a file on the way: named, not os.makedirs' "[Errno 17] File exists"
                check_writable(fs, root, "scratch")
            with reaching(fs, directory, "scratch"):  # one line naming it, not the store client's traceback
                make_private_directory(fs, directory)
        return cls(fs, directory, partitions)

    @property
    def name(self) -> str:
        return posixpath.basename(self.directory).removeprefix("daskpile-")

    def path(self, partition: int, piece: int = 0, band: int = 0) -> str:
        return scratch_path(self.directory, partition, piece, None if self.bands is None else band)

    def paths(self, band: int = 0) -> list[str]:
        """The scratch files of one band, in (partition, piece) order."""
        pieces = self.pieces or (1,) * self.partitions
        return [self.path(k, p, band) for k in range(self.partitions) for p in range(pieces[k])]

    def band_of(self, pile: int) -> int:
        return 0 if self.bands is None else bisect.bisect_right(self.bands, pile) - 1

    @property
    def band_count(self) -> int:
        return 1 if self.bands is None else len(self.bands) - 1

    def write(
        self, partition: int, piece: int, grouped: pa.RecordBatch, counts: np.ndarray, footer: dict | None = None
    ) -> int:
        """Write what one partition (or piece) sent to the piles, a file per band; returns the bytes written.

        Band 0 is written last, so its file is what says the partition is done (``last_path``).
        """
        counts = np.asarray(counts, dtype=np.int64)
        bounds = self.bands or (0, len(counts))
        pile_start = offsets(np.append(counts, 0))  # and the end
        bands = {BANDS_KEY: encode_integers(bounds)}
        rows_per_run = _rows_per_run(grouped)
        written = 0
        for band in reversed(range(len(bounds) - 1)):
            first, stop = bounds[band], bounds[band + 1]
            rows = grouped.slice(pile_start[first], pile_start[stop] - pile_start[first])
            path = self.path(partition, piece, band)
            if band == 0:  # what a resumed run reads (``last_path``): every pile's counts, and ``footer``
                indexed = {**(footer or {}), **bands}
                written += write_piles(self.fs, path, rows, counts, indexed, first, stop, rows_per_run)
            else:  # its own piles' counts only: every pile's, in every band, were most of small pieces' scratch
                written += write_piles(self.fs, path, rows, counts[first:stop], bands, first, None, rows_per_run, first)
        return written

    def last_path(self, partition: int, piece: int = 0) -> str:
        """The file written last, band 0's: it exists once every band of the partition (or piece) is written."""
        return self.path(partition, piece, 0)

    def done_path(self, partition: int) -> str:
        """The record a partition's task writes once all its pieces are in scratch (``write_done``)."""
        return posixpath.join(self.directory, f"scatter-{partition:06d}{DONE_SUFFIX}")

    def write_done(self, partition: int, files: str, pieces: int, footer_rows: int) -> None:
        """Record that every piece of ``partition``, of ``files`` (``files_key``), is written: a resumed run
        reuses them without reading the source's files again (30,000 small files took 2-4 s locally to number
        their pieces, a request each on an object store; a compressed text file was decompressed again)."""
        record = {"files": files, "pieces": pieces, "footer_rows": footer_rows}
        write_bytes(self.fs, self.done_path(partition), json.dumps(record).encode())

    def read_done(self, partition: int, files: str, kept: dict[str, int] | None = None) -> dict | None:
        """What ``write_done`` recorded of ``partition``; None if nothing, if of other ``files`` (grouped
        otherwise than when it was written) or, with ``kept``, if not listed."""
        path = self.done_path(partition)
        if kept is not None and posixpath.basename(path) not in kept:
            return None
        try:
            with self.fs.open(path, "rb") as f:
                record = json.loads(f.read())
            found = {"pieces": int(record["pieces"]), "footer_rows": int(record["footer_rows"])}
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None
        return found if record.get("files") == files else None

    def size(self, partition: int, piece: int = 0, kept: dict[str, int] | None = None) -> int:
        """Bytes of the files of a partition (or piece) still there (pass 2 may have removed bands), or of
        those ``kept`` lists (``Scratch.kept``)."""
        total = 0
        for band in range(self.band_count):
            path = self.path(partition, piece, band)
            if kept is not None:
                total += kept.get(posixpath.basename(path), 0)
                continue
            with contextlib.suppress(FileNotFoundError):
                total += self.fs.size(path)
        return total

    def kept(self) -> dict[int, dict[str, int]]:
        """The finished scratch files in the directory, by partition (name: bytes): one listing, where looking
        for each piece's file was a request a piece on an object store."""
        found: dict[int, dict[str, int]] = {}
        try:
            listed = self.fs.find(self.directory, detail=True)
        except FileNotFoundError:
            return found
        for path, info in listed.items():
            name = posixpath.basename(path)
            done = _DONE_NAME.match(name)  # a partition's record (``done_path``)
            parsed = (int(done[1]), 0, None) if done else parse_scratch_name(name)
            if parsed is not None and info.get("type", "file") == "file":
                found.setdefault(parsed[0], {})[name] = int(info["size"])
        return found

    def versions(self) -> dict[str, FileVersion]:
        """The version (size, ETag) of each file in the directory, by path, from one listing: a reader of files
        on an object store opens them by it (``open_read``), where looking each up was a request a file."""
        try:
            listed = self.fs.find(self.directory, detail=True)
        except FileNotFoundError:
            return {}
        return {path: FileVersion.of(info) for path, info in listed.items()}

    def remove_band(self, band: int) -> None:
        """Remove the files of one band (pass 2 is done with them), ignoring those already gone."""
        if not is_local(self.fs):
            self.fs.rm(self.paths(band))  # an object store deletes many keys a request, and ignores missing ones
            return
        for path in self.paths(band):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)

    def remove(self) -> None:
        remove_tree(self.fs, self.directory)


# Pass 1 of shuffle_parquet splits scratch into this many bands of piles (fewer with fewer piles).  Removing
# scratch is slow on some disks (B's 5 GB took 2-3 s on this project's VM, whose ext4 is mounted with
# ``discard``), and it keeps the disk busy, not the CPU: removing each band while pass 2 works on the others
# hides all but the share of the bands finished last.  More bands mean more, smaller files.
BANDS = 8


# Every scratch file holds its schema twice and, per batch, about this many bytes a column: a band's file is
# worth its own only if it holds several times that.  A CSV of 300 columns in 128 KiB ranges (--blocksize 2MiB)
# wrote 402 MiB of scratch for 81 MiB of rows in 8 bands (files of about 64 KiB, mostly schema), 148 MiB in 1.
BATCH_BYTES_PER_COLUMN = 64
BAND_FILE_TIMES_OVERHEAD = 8


def bands_for(partition_bytes: float, schema: pa.Schema) -> int:
    """How many bands to split scratch into: ``BANDS``, fewer when a partition's rows (``partition_bytes`` in
    memory, on average) cut in that many files would make files of little more than their schema.

    >>> wide = pa.schema([(f"c{i}", pa.int64()) for i in range(300)])  # 50 KB a file besides its rows
    >>> bands_for(16 * 2**20, wide), bands_for(2**20, wide), bands_for(128 * 2**10, wide)
    (8, 2, 1)
    """
    return int(min(BANDS, max(1, partition_bytes // (BAND_FILE_TIMES_OVERHEAD * _file_overhead(schema)))))


def _file_overhead(schema: pa.Schema) -> int:
    return 2 * len(schema.serialize()) + BATCH_BYTES_PER_COLUMN * len(schema)


# Band 0's footer holds three arrays of a number a pile (rows, bytes, the largest row's), compressed, in base64:
# 0.9-2.7 bytes a pile each, measured from 444 rows in 1,000 piles to 20 M rows in 65,535 (10.7 uncompressed).
FOOTER_BYTES_PER_PILE = 8


BATCH_HEADER_BYTES = 160  # an IPC batch's message besides its columns' (3 columns: 308 bytes a batch in all)


def scratch_bytes(data_bytes: float, pieces: float, bands: int, piles: int, schema: pa.Schema) -> int:
    """About the bytes of a run's scratch: its rows (``data_bytes`` in memory), their batches' headers and, in
    each of the ``pieces`` x ``bands`` files, the schema and the pile index, which small pieces of many piles
    make most of it.

    >>> scratch_bytes(2**30, 4, 8, 512, pa.schema([("x", pa.int64())])) - 2**30  # 224 bytes a batch, a few kB a file
    949248
    """
    batches = data_bytes / RUN_BYTES + pieces * bands
    headers = batches * (BATCH_HEADER_BYTES + BATCH_BYTES_PER_COLUMN * len(schema))
    return int(data_bytes + headers + pieces * (bands * 2 * len(schema.serialize()) + FOOTER_BYTES_PER_PILE * piles))


def band_bounds(piles: int, bands: int = BANDS) -> tuple[int, ...]:
    """Where the bands of piles begin, and the end: equal bands of consecutive piles.

    >>> band_bounds(20, 8)
    (0, 3, 6, 9, 12, 15, 18, 20)
    """
    size = -(-piles // bands)
    return (*range(0, piles, size), piles)


def scratch_path(directory: str, partition: int, piece: int = 0, band: int | None = None) -> str:
    """Name of the scratch file of input partition ``partition`` (or of one of its pieces, or of a band).

    >>> scratch_path("/tmp/s", 3), scratch_path("/tmp/s", 3, piece=2), scratch_path("/tmp/s", 3, band=1)
    ('/tmp/s/scatter-000003.arrow', '/tmp/s/scatter-000003-0002.arrow', '/tmp/s/scatter-000003-b1.arrow')
    """
    suffix = f"-{piece:04d}" if piece else ""
    suffix += "" if band is None else f"-b{band}"
    return posixpath.join(directory, f"scatter-{partition:06d}{suffix}.arrow")


DIRECTORY_NAME = re.compile(r"^daskpile-[0-9a-f]{16}$")  # Scratch.create's fresh names, and nothing else
DONE_SUFFIX = ".done.json"
_DONE_NAME = re.compile(r"^scatter-(\d+)\.done\.json$")
_SCRATCH_NAME = re.compile(r"^scatter-(\d+)(?:-(\d{4}))?(?:-b(\d+))?\.arrow$")


def parse_scratch_name(name: str) -> tuple[int, int, int | None] | None:
    """(partition, piece, band or None) of a scratch file's name, None for other names.

    >>> parse_scratch_name("scatter-000003-0002-b1.arrow"), parse_scratch_name("scatter-000003.arrow")
    ((3, 2, 1), (3, 0, None))
    """
    match = _SCRATCH_NAME.match(name)
    if match is None:
        return None
    partition, piece, band = match.groups()
    return int(partition), int(piece or 0), None if band is None else int(band)


# A batch of scratch holds whole piles up to about this many bytes.  Reading a batch is one call into
# Arrow and, on an object store, one or two GETs, whatever its size.  With a batch per pile, 400 k rows
# in 8 files shuffled into 256 piles with scratch on S3 (moto) made 2,176 GETs in 29.5 s; with batches
# of this size, 261 in 8.9 s.  Locally, where batches are memory-mapped, the difference was within
# noise.  Remote scratch keeps the current batch of every file in memory, so this also bounds what a
# pass-2 task holds beyond its pile (files x RUN_BYTES).
RUN_BYTES = 256 * 2**10
COUNTS_KEY = "daskpile.counts"  # rows the partition sent to each pile (band 0's file: every pile)
COUNTS_FROM_KEY = "daskpile.counts_from"  # the pile of COUNTS_KEY's first count, if not 0 (a band's own piles)
BATCH_ROWS_KEY = "daskpile.batch_lengths"  # rows of each batch (their piles follow from the counts)
FIRST_PILE_KEY = "daskpile.first_pile"  # the first pile of the file's band
BANDS_KEY = "daskpile.bands"  # where every band of the run begins, and the end


def write_piles(
    fs: fsspec.AbstractFileSystem,
    path: str,
    grouped: pa.RecordBatch,
    counts: np.ndarray,
    footer: dict[str, str] | None = None,
    first: int = 0,
    stop: int | None = None,
    rows_per_run: int | None = None,
    counts_from: int = 0,
) -> int:
    """Write the rows of one partition, grouped by pile, in batches of whole piles (a long pile cut in several).

    ``counts`` is the row count of each pile from pile ``counts_from`` on;
    ``grouped`` holds the rows of piles ``first:stop`` (default: all).  The
    counts go in the IPC footer with the batches' row counts and ``footer``,
    so that a reader finds a pile without reading the data before it, and a
    resumed run learns what a finished scratch file holds.  Returns the
    number of bytes written.
    """
    counts = np.asarray(counts, dtype=np.int64)
    band_counts = counts[first - counts_from : None if stop is None else stop - counts_from]
    rows_per_run = rows_per_run or _rows_per_run(grouped)
    # Locally, a batch's buffers hold about WRITE_BUFFER_BYTES at most: the IPC writer hands each buffer to the
    # kernel in one write, and one of more than 2 MiB is cached in 2 MiB pages (_storage.write_in_pieces says why
    # that costs).  On an object store a batch is a request: long piles stay whole there.
    longest = rows_per_write(grouped) if is_local(fs) else None
    lengths = batch_lengths(band_counts, rows_per_run, longest)
    index = {COUNTS_KEY: encode_integers(counts), BATCH_ROWS_KEY: encode_integers(lengths), FIRST_PILE_KEY: str(first)}
    if counts_from:
        index[COUNTS_FROM_KEY] = str(counts_from)
    footer = {**(footer or {}), **index}
    batches = (
        grouped.slice(start, length) for start, length in zip(offsets(lengths).tolist(), lengths.tolist(), strict=True)
    )
    return _write_batches(fs, path, grouped.schema, batches, footer, make_parents=False)


def _rows_per_run(grouped: pa.RecordBatch) -> int:
    # Of a whole batch: the buffer sizes of a slice are those of the whole (``get_total_buffer_size``).
    return max(1, int(RUN_BYTES * grouped.num_rows / max(grouped.get_total_buffer_size(), 1)))


def batch_lengths(counts: np.ndarray, rows_per_run: int, longest: int | None = None) -> np.ndarray:
    """The rows of each batch: runs of whole piles (``pile_runs``), each cut in equal batches of at most
    ``longest`` rows.

    >>> batch_lengths(np.array([5, 5, 5, 20, 0, 5]), 10).tolist()
    [10, 25, 5]
    >>> batch_lengths(np.array([5, 5, 5, 20, 0, 5]), 10, longest=12).tolist()
    [10, 9, 8, 8, 5]
    """
    runs = pile_runs(counts, rows_per_run)
    run_rows = np.add.reduceat(counts, offsets(runs)) if len(counts) else runs
    if longest is None:
        return run_rows
    lengths = []
    for rows in run_rows.tolist():
        parts = max(1, -(-rows // longest))
        length, longer = divmod(rows, parts)
        lengths += [length + 1] * longer + [length] * (parts - longer)
    return np.array(lengths, dtype=np.int64)


def pile_runs(counts: np.ndarray, rows_per_run: int) -> np.ndarray:
    """How many consecutive piles each batch holds: a batch closes once it has ``rows_per_run`` rows.

    >>> pile_runs(np.array([5, 5, 5, 20, 0, 5]), 10).tolist()
    [2, 2, 2]
    """
    ends = np.cumsum(counts)
    runs, start = [], 0
    while start < len(counts):
        done = int(ends[start - 1]) if start else 0
        # the first pile at which the run has rows_per_run rows (the last pile if none)
        stop = min(int(np.searchsorted(ends, done + rows_per_run, side="left")), len(counts) - 1) + 1
        runs.append(stop - start)
        start = stop
    return np.array(runs, dtype=np.int64)


ZLIB_PREFIX = "zlib:"  # (not base64, so a footer written before arrays were compressed reads as it did)


def encode_integers(values) -> str:
    """Integers for a footer: int64, compressed (zlib at its fastest: the piles' counts of a small piece are
    mostly zeros, a tenth as large so; those of a large piece a fifth), in base64.

    >>> encode_integers([0, 3, 0, 0, 5])[:5], decode_integers(encode_integers([0, 3, 0, 0, 5])).tolist()
    ('zlib:', [0, 3, 0, 0, 5])
    """
    compressed = zlib.compress(np.asarray(values, dtype="<i8").tobytes(), 1)
    return ZLIB_PREFIX + base64.b64encode(compressed).decode("ascii")


def decode_integers(encoded: str | bytes) -> np.ndarray:
    """The integers ``write_piles`` stored in a footer (the piles' rows, or the batches')."""
    encoded = encoded.decode("ascii") if isinstance(encoded, bytes) else encoded
    if encoded.startswith(ZLIB_PREFIX):
        data = zlib.decompress(base64.b64decode(encoded[len(ZLIB_PREFIX) :]))
    else:
        data = base64.b64decode(encoded)
    return np.frombuffer(data, dtype="<i8").astype(np.int64)


def write_table(fs: fsspec.AbstractFileSystem, path: str, table: pa.Table, batch_rows: int) -> int:
    """A permuted pile as IPC in batches of ``batch_rows`` (fewer where a column's buffer would pass about 1 MiB
    locally, see ``write_piles``), so that ``read_rows`` of a range reads little more.

    The footer lists the batches' row counts, so a reader finds a range's
    batches without reading the ones before it.  Returns the size in bytes.
    """
    if is_local(fs):
        batch_rows = min(batch_rows, rows_per_write(table))
    batches = table.to_batches(max_chunksize=batch_rows)
    footer = {"daskpile.batch_rows": json.dumps([b.num_rows for b in batches])}
    return _write_batches(fs, path, table.schema, batches, footer, make_parents=True)


def _write_batches(fs, path: str, schema: pa.Schema, batches, footer: dict | None, make_parents: bool) -> int:
    """One IPC file of ``batches``, committed atomically; returns its size in bytes."""
    with atomic_sink(fs, path, make_parents=make_parents) as sink:
        with ipc.new_file(sink, schema, metadata=footer) as writer:
            for batch in batches:
                writer.write_batch(batch)
        return sink.tell()


def read_rows(fs: fsspec.AbstractFileSystem, path: str, start: int, stop: int) -> pa.Table:
    """Rows ``start:stop`` of a file written by ``write_table``, reading only the batches that hold them."""
    with _open_scratch(fs, path) as source:
        reader = ipc.open_file(source)
        ends = np.cumsum(json.loads(reader.metadata[b"daskpile.batch_rows"]))
        first, last = np.searchsorted(ends, start, side="right"), np.searchsorted(ends, stop, side="left")
        batches = []
        for i in range(int(first), min(int(last) + 1, len(ends))):
            offset = int(ends[i - 1]) if i else 0
            batch = reader.get_batch(i)
            batches.append(batch.slice(max(start - offset, 0), min(stop, int(ends[i])) - max(start, offset)))
        return pa.Table.from_batches(batches, schema=reader.schema).combine_chunks()


def read_footer(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, str] | None:
    """The footer metadata of a finished scratch file, or None if there is none.

    Scratch files appear under their final name only once complete, so an
    existing file is a finished one.
    """
    try:
        if is_local(fs):
            with pa.memory_map(path) as source:
                metadata = ipc.open_file(source).metadata
        else:
            with fs.open(path, "rb", cache_type="none") as f:
                metadata = ipc.open_file(f).metadata
    except (FileNotFoundError, pa.ArrowInvalid):
        return None
    return {k.decode(): v.decode() for k, v in (metadata or {}).items()}


# A reader unmaps the pages it has handed out (closing the files, reopened on
# demand) once they add up to this; smaller piles share one opening.
RELEASE_BYTES = 64 * 2**20
# Scratch files one reader (a Dask thread's) opens and reads at once on an object store.  A pile is a slice of
# every pass-1 task's file, each a few requests of tens of milliseconds: one at a time, a text corpus of 543
# pass-1 tasks took 52-82 s in pass 2 with scratch on S3 (moto), against 4 s locally.  10: s3fs's connections
# (botocore's max_pool_connections), past which requests wait anyway.
REMOTE_FILES_AT_ONCE = 10


@dataclasses.dataclass(frozen=True)
class PileIndex:
    """Where the piles of one scratch file are, from its footer: read once, the file may be reopened many times."""

    pile_start: list[int]  # pile j is rows pile_start[j - counts_from]:pile_start[j - counts_from + 1] of the file
    batch_start: list[int]  # batch b is rows batch_start[b]:batch_start[b + 1] of the file
    counts_from: int = 0  # the first pile pile_start lists

    @classmethod
    def from_footer(cls, footer: dict[bytes, bytes]) -> PileIndex:
        counts = decode_integers(footer[COUNTS_KEY.encode()])
        first = int(footer.get(FIRST_PILE_KEY.encode(), 0))
        counts_from = int(footer.get(COUNTS_FROM_KEY.encode(), 0))
        pile_start = np.concatenate(([0], np.cumsum(counts))) - int(counts[: first - counts_from].sum())
        batch_start = np.concatenate(([0], np.cumsum(decode_integers(footer[BATCH_ROWS_KEY.encode()]))))
        return cls(pile_start.tolist(), batch_start.tolist(), counts_from)


class ScratchFile:
    """One open scratch file, and the batch last read from it.

    ``pile(j)`` gives the rows that partition sent to pile ``j``: slices of
    the batches holding them (one, unless the pile was cut in several).

    >>> f = ScratchFile(fs, "/tmp/s/scatter-000000.arrow")  # doctest: +SKIP
    >>> slices = f.pile(3)  # doctest: +SKIP
    """

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        index: PileIndex | None = None,
        mapped: bool = True,
        listed: FileVersion | None = None,
    ):
        self.file = _open_scratch(fs, path, mapped, listed)
        try:
            self.reader = ipc.open_file(self.file)
            self.index = index or PileIndex.from_footer(self.reader.metadata or {})
            if isinstance(self.file, EndFetchedFirst):
                self.file.forget_end()
        except BaseException:
            self.file.close()
            raise
        self._batch: tuple[int, pa.RecordBatch, float] | None = None  # number, batch, bytes per row

    def pile(self, pile: int) -> list[tuple[pa.RecordBatch, int]]:
        """The rows of ``pile`` (an empty slice if none), each slice with about how many bytes it takes."""
        batch_start = self.index.batch_start
        listed = pile - self.index.counts_from
        start, stop = self.index.pile_start[listed], self.index.pile_start[listed + 1]
        number = min(bisect.bisect_right(batch_start, start) - 1, len(batch_start) - 2)  # (an empty last pile)
        slices = []
        while True:
            batch, bytes_per_row = self._read(number)
            low = max(start - batch_start[number], 0)
            rows = min(stop, batch_start[number + 1]) - batch_start[number] - low
            slices.append((batch.slice(low, rows), int(rows * bytes_per_row)))
            number += 1
            if number >= len(batch_start) - 1 or batch_start[number] >= stop:
                return slices

    def _read(self, number: int) -> tuple[pa.RecordBatch, float]:
        if self._batch is None or self._batch[0] != number:
            self._batch = None  # drop the previous batch before reading the next
            batch = self.reader.get_batch(number)
            # Not ``nbytes``, which walks every value (24 us a batch):
            # a batch read from IPC has buffers of exactly its own bytes.
            self._batch = (number, batch, batch.get_total_buffer_size() / max(batch.num_rows, 1))
        return self._batch[1:]

    def close(self) -> None:
        self._batch = None
        self.file.close()


class PileReader:
    """Reads piles from all the scratch files of a run, opening each file once.

    Local files are memory-mapped, so only the pages of the piles read are
    touched.  Those pages stay mapped, and count in the process's resident
    memory (which Dask's memory monitor watches), until the files are closed:
    by ``release()``, at exit, or before the next pile once the piles read
    since the files were opened add up to ``RELEASE_BYTES``.  So a task
    reading many small piles holds a pile and ``RELEASE_BYTES``, not all of
    them (B with 512 piles: 970 MiB a worker before, 427 MiB with this).

    >>> with PileReader(run) as reader:  # doctest: +SKIP
    ...     batches = reader.pile(3)  # its slices of every input partition's file, in order
    """

    def __init__(self, scratch: Scratch, mapped: bool = True):
        self.scratch = scratch
        # (every band has a file per pass-1 task: more than a reader may map are read instead)
        self.mapped = mapped and is_local(scratch.fs) and len(scratch.paths()) <= maps_budget()
        self._files: list[ScratchFile] = []
        self._band = 0  # of the open files
        self._indexes: dict[str, PileIndex] = {}
        self._mapped = 0  # bytes of the piles read from memory-mapped files since they were opened
        self._one_at_a_time = False  # each pile's files opened, read and closed one after the other
        self._remote = not is_local(scratch.fs)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # (object stores: made on first need)
        self._listed: dict[str, FileVersion] | None = None  # (object stores: listed on first need)

    def __enter__(self) -> PileReader:
        return self

    def _open_all(self, paths: list[str]) -> list[ScratchFile] | None:
        """Every file of ``paths`` open; None if there are more than this process may hold open, or if their
        columns add up to more than ``OPEN_FIELDS``."""
        if not self._remote and len(paths) > open_files_budget():  # (an object store's files hold no descriptor)
            return None
        files: list[ScratchFile] = []
        try:
            with contextlib.closing(self._in_order(self._open, paths)) as opened:
                for f in opened:
                    files.append(f)
                    if len(files) == 1 and len(paths) * len(f.reader.schema) > OPEN_FIELDS:
                        break
        except BaseException as e:
            for f in files:
                f.close()
            if not isinstance(e, OSError) or e.errno != errno.EMFILE:
                raise
            return None
        if len(files) < len(paths):  # (too many columns: the files are read one at a time instead)
            for f in files:
                f.close()
            return None
        return files

    def _in_order(self, function, items: list) -> Iterator:
        """``function`` of each item, in order: locally one at a time; on an object store up to
        ``REMOTE_FILES_AT_ONCE`` at once, each result held until its turn.  On an error, or when the caller
        stops, what has not started is cancelled, and a file opened for a result not taken is closed."""
        if not self._remote or len(items) < 2:
            yield from map(function, items)
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                REMOTE_FILES_AT_ONCE, thread_name_prefix="daskpile-scratch-read"
            )
        waiting = iter(items)
        pending = collections.deque(
            self._pool.submit(function, item) for item in itertools.islice(waiting, REMOTE_FILES_AT_ONCE)
        )
        try:
            while pending:
                result = pending.popleft().result()
                pending.extend(self._pool.submit(function, item) for item in itertools.islice(waiting, 1))
                yield result
        finally:
            for future in pending:
                future.cancel()
            for future in pending:
                if not future.cancelled() and future.exception() is None and isinstance(future.result(), ScratchFile):
                    future.result().close()

    def _open(self, path: str) -> ScratchFile:
        listed = None if self._listed is None else self._listed.get(path)
        f = ScratchFile(self.scratch.fs, path, self._indexes.get(path), self.mapped, listed)
        self._indexes[path] = f.index
        return f

    def _list_remote(self) -> None:
        """On an object store, list the run's files once, before any is opened (``Scratch.versions``)."""
        if self._remote and self._listed is None:
            self._listed = self.scratch.versions()

    def pile(self, pile: int) -> list[pa.RecordBatch]:
        self._list_remote()
        band = self.scratch.band_of(pile)
        if self._mapped > RELEASE_BYTES or band != self._band:
            self.release()
        if not self._files and not self._one_at_a_time:
            files = self._open_all(self.scratch.paths(band))
            self._one_at_a_time = files is None  # more scratch files than this process may hold open
            self._files, self._band = files or [], band
        if self._one_at_a_time:
            return compacted(found for slices in self._slices_one_file_at_a_time(pile) for found in slices)
        read = self._in_order(lambda f: f.pile(pile), self._files)
        return compacted(self._counted(found for slices in read for found in slices))

    def _counted(self, slices: Iterator[tuple[pa.RecordBatch, int]]) -> Iterator[tuple[pa.RecordBatch, int]]:
        for batch, row_bytes in slices:
            if self.mapped:
                # The pages touched are the pile's, not the whole batch's: what is mapped stays untouched until read.
                self._mapped += row_bytes
            yield batch, row_bytes

    def pile_slices(self, pile: int) -> Iterator[list[pa.RecordBatch]]:
        """The slices of one pile, a scratch file's at a time (one slice, or several for a pile cut in batches),
        each file closed after its slices are read.

        For piles too large to hold: a slice's pages are unmapped as soon as
        the caller drops the slice, so memory holds what the caller keeps.
        """
        self._list_remote()
        for slices in self._slices_one_file_at_a_time(pile):
            yield [batch for batch, _ in slices]

    def _slices_one_file_at_a_time(self, pile: int) -> Iterator[list[tuple[pa.RecordBatch, int]]]:
        def read(path: str) -> list[tuple[pa.RecordBatch, int]]:
            f = self._open(path)
            try:
                return f.pile(pile)
            finally:
                f.close()

        with contextlib.closing(self._in_order(read, self.scratch.paths(self.scratch.band_of(pile)))) as slices:
            yield from slices

    def release(self) -> None:
        """Close every file; the pages of batches already dropped are unmapped. Reopened on demand."""
        for f in self._files:
            f.close()
        self._files, self._mapped = [], 0

    def close(self) -> None:
        """``release``, and end the threads that read an object store's files."""
        self.release()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __exit__(self, *exc) -> None:
        self.close()


# A pile is a slice of every pass-1 task's scratch file, and each slice holds an Arrow array a column, of
# hundreds of bytes of C++ and Python objects whatever its rows: 1,300 slices of 300 columns held 132 MiB
# beside their rows.  So the slices of a pile are combined as they are read (after, the memory freed is not
# given back), into batches of at least this many arrays (70 MiB held there): a copy of their rows, made only
# for piles of many tasks times columns (a few columns from a few hundred tasks are left as read).
COMPACT_ARRAYS = 16_384
# Slices adding up to more bytes than this are not combined: their objects are small beside their rows (at
# most 700 bytes an array against 1 KiB), and the copy would raise the pile's peak (a run of 256 MiB: 958 MiB
# against 696 for a pile of 110 tasks of 300 columns).
COMPACT_BYTES = 16 * 2**20


def compacted(slices) -> list[pa.RecordBatch]:
    """The batches of ``(batch, bytes)`` pairs holding rows, in order, each run of ``COMPACT_ARRAYS`` arrays
    and at most ``COMPACT_BYTES`` combined into one batch (a run whose schemas differ left as read): the same
    rows in the same order (no rows at all: the first batch, to say the schema).

    >>> one_row = pa.record_batch({"x": [1]})
    >>> [b.num_rows for b in compacted([(one_row, 8)] * (COMPACT_ARRAYS + 2))]
    [16384, 1, 1]
    """
    batches: list[pa.RecordBatch] = []
    run: list[pa.RecordBatch] = []
    run_bytes = 0
    empty = None
    for batch, nbytes in slices:
        if not batch.num_rows:  # (its types may be its own: an empty categorical's dictionary of nulls)
            empty = empty or batch
            continue
        run.append(batch)
        run_bytes += nbytes
        if len(run) * max(batch.num_columns, 1) < COMPACT_ARRAYS:
            continue
        if run_bytes <= COMPACT_BYTES:
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):  # schemas that differ
                run = pa.Table.from_batches(run).combine_chunks().to_batches() or run[:1]  # (no rows: one empty)
        batches.extend(run)
        run, run_bytes = [], 0
    return batches + run or ([empty] if empty is not None else [])


# An open scratch file holds its schema, and the batch last read from it an Arrow array a column: about
# 900 bytes a column in all.  A pile of 1,294 files of 300 columns read with every file held open took
# 356 MiB (anonymous memory), against 65-90 MiB opening, reading and closing the files one at a time
# (1.2-2.4 s a pile against 0.6-0.9).  Past this many columns in all, a band's files are read one at a time.
OPEN_FIELDS = 2**18


# How long the process keeps a scratch run's files open after its last pile read (``read_pile``): a
# removed file's disk space is freed only once nothing maps it.
IDLE_SECONDS = 2.0


OPEN_FILES_SHARE = 8  # of the process's limit, what one reader may hold: every thread may hold a band at once
MAPS_SHARE = 8  # of the kernel's limit on a process's memory maps, what one reader may map: for other maps


@functools.cache
def maps_budget() -> int:
    """How many scratch files of a band one ``PileReader`` may memory-map; past that it reads them.

    Linux limits the memory maps of a process (``vm.max_map_count``, 65,530
    by default), and every mapped scratch file of a band is one, in every
    thread (Dask's default: one a core), while its pile is put together: 35,000 pass-1 tasks (a 2 MB file
    in ranges of 960 bytes) on 2 threads failed in pass 2 with "Memory
    mapping file failed: Cannot allocate memory".
    """
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except (OSError, ValueError):  # not Linux: its default
        limit = 65_530
    return limit // max(MAPS_SHARE, 2 * (os.cpu_count() or 1))  # a reader a thread, a thread a core by default


@functools.cache
def open_files_budget() -> int:
    """How many scratch files one ``PileReader`` may hold open; it reads one file at a time past that.

    Pass 2 holds every scratch file of a band open (one per pass-1 task), in
    every thread: the common soft limit of 1,024 is passed by 400 tasks on 3
    threads (a 6 GB text file in 16 MiB ranges).  So the soft limit is first
    raised to the hard one, once (as Go's runtime does at start): usually
    hundreds of thousands.  Decided before opening, rather than on the first
    ``Too many open files``: a thread holding a band then would make another
    thread's open of its output file fail.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    except (ImportError, ValueError, OSError):  # not on this platform, or not allowed
        return 256
    return 2**20 if soft == resource.RLIM_INFINITY else soft // OPEN_FILES_SHARE


class _OpenRun:
    """The ``PileReader`` of the scratch run this process last read a pile of, closed once idle."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reader: PileReader | None = None
        self.run_id: str | None = None
        self.last_read = 0.0
        self.timer: threading.Timer | None = None

    def pile(self, scratch: Scratch, pile: int, run_id: str | None = None) -> list[pa.RecordBatch]:
        with self.lock:
            if self.reader is None or self.reader.scratch != scratch or self.run_id != run_id:
                self._close()
                self.run_id = run_id
                # Read, not mapped: pages mapped between tasks would count in the worker's memory
                # (100 MiB more a worker on dataset A, where the reader of one task unmaps its pages).
                self.reader = PileReader(scratch, mapped=False)
            try:
                batches = self.reader.pile(pile)
            except BaseException:
                self._close()  # a file may have changed or gone (a rerun of pass 1): reopen next time
                raise
            self.last_read = time.monotonic()
            if self.timer is None:
                self._arm(IDLE_SECONDS)
        return batches

    def _arm(self, seconds: float) -> None:
        self.timer = threading.Timer(seconds, self._close_if_idle)
        self.timer.daemon = True
        self.timer.start()

    def _close_if_idle(self) -> None:
        with self.lock:
            self.timer = None
            idle = time.monotonic() - self.last_read
            if self.reader is not None and idle < IDLE_SECONDS:
                self._arm(IDLE_SECONDS - idle)
            else:
                self._close()

    def _close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.reader = None


_OPEN_RUN = _OpenRun()


def read_pile(scratch: Scratch, pile: int, run_id: str | None = None) -> list[pa.RecordBatch]:
    """The slices of one pile (each scratch file's, in order), from files this process keeps open between calls.

    ``run_id`` names the pass 1 that wrote the files: files kept open from another one (scratch removed
    and written again under the same names) are not read.

    For ``shuffle(ddf)``, whose pass 2 is a task per pile, each reading a
    slice of every scratch file: opening them all for every pile cost 0.41 s
    of the 3.9 s of dataset A in 64 piles on one thread (2,560 opens, most of
    it reading footers).  The files stay open, read rather than memory-mapped
    (a batch is copied once, as ``take`` would copy it anyway; twice if ``compacted``), for one run at a
    time, and are closed ``IDLE_SECONDS`` after the last read.
    """
    return _OPEN_RUN.pile(scratch, pile, run_id)


class BandRemover:
    """Removes a band of scratch on a thread of its own as soon as every task that reads it is done.

    ``bands_read[i]`` are the bands task ``i`` reads.  Band 0 stays: its files,
    written last, tell a resumed run which partitions pass 1 finished, and the
    run removes what is left at its end.  A band goes only once the piles read
    from it are written, so a rerun after a failure reuses those piles and
    never needs the band again.

    >>> with BandRemover(run, [[0], [1], [2]]) as remover:  # doctest: +SKIP
    ...     compute(tasks, on_done=remover.task_done)
    """

    def __init__(self, scratch: Scratch, bands_read: list[list[int]]):
        self.scratch = scratch
        self._bands_read = bands_read
        self._readers = collections.Counter(band for bands in bands_read for band in bands)
        self._lock = threading.Lock()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="daskpile-remove-band")
        self._closed = False

    def __enter__(self) -> BandRemover:
        return self

    def task_done(self, task: int) -> None:
        with self._lock:
            if self._closed:  # the run stopped (Ctrl-C, a failed task) while tasks still finish: a rerun removes
                return
            for band in self._bands_read[task]:
                self._readers[band] -= 1
                if self._readers[band] == 0 and band != 0:
                    # Failures are not reported here: removing the whole directory at the end reports them.
                    self._thread.submit(self.scratch.remove_band, band)

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._closed = True
        self._thread.shutdown(wait=True)


# A remote scratch file's last bytes, fetched as it is opened: its footer (which Arrow reads in two requests
# otherwise), and a small file whole.
END_BYTES = 2**16


def _open_scratch(fs: fsspec.AbstractFileSystem, path: str, mapped: bool = True, listed: FileVersion | None = None):
    try:
        # Remote: no read-ahead cache, so a pile costs ranged reads of its own bytes, not whole blocks.
        if not is_local(fs):
            with contextlib.ExitStack() as opening:
                handle = opening.enter_context(open_read(fs, path, listed, cache_type="none"))
                opened = EndFetchedFirst(handle, END_BYTES)
                opening.pop_all()
                return opened
        return pa.memory_map(path) if mapped else pa.OSFile(path)
    except FileNotFoundError as e:  # (s3fs: "The specified key does not exist.", naming no key)
        raise FileNotFoundError(
            f"scratch file {full_url(fs, path)!r} is gone, removed while the run used it (daskpile clean "
            "--older-than keeps the scratch of a live run; by hand?): run the same command again, which writes it "
            "again"
        ) from e
