"""``piles="auto"``: choose the pile count from the data's size and the memory of a task.

Pass 2 holds one pile in memory, with its permuted copy and the Parquet
writer's buffers, so a pile must fit in a fraction of the memory a task can
count on.  A pile's row count is binomial, so the largest of M piles is about
its mean plus a few standard deviations; the plan makes mean + 6 sd fit.
Within that, piles are kept small enough to permute fast (``FAST_PILE_BYTES``).
"""

from __future__ import annotations

import dataclasses
import errno
import math

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from daskpile import _kernels
from daskpile._compute import memory_per_thread, total_threads
from daskpile._storage import free_space, full_url
from daskpile._words import count, human_size, size
from daskpile.sources.parquet import open_parquet, parquet_errors, read_parquet

MAX_PILES = 65_535  # pile numbers are uint16 in pass 1
MIN_ROWS_PER_PILE = 10_000
SAMPLED_FILES = 8
DECODED_SAMPLE_ROWS = 65_536
# Peak memory of a pass-2 task measured at about 2.5-3.5 piles (the pile, its
# permuted copy, writer buffers); 4 leaves room for Dask and the allocator.
MEMORY_PER_PILE_FRACTION = 1 / 4
# A row of one large value is held up to this many times by a task (pass 2: the pile, its permuted copy, the
# Parquet writer's page and compressed buffers): a worker thread of 2.2 GiB for a row of 300 MiB, measured
# on the sync scheduler (7.3x).  In a trial (2026-11-29) workers of 1.3-2 GiB died on rows of 300 MiB, and
# workers of 1 GiB held rows of 60 MiB (with a pile count and a blocksize of 64 MiB).
ROW_COPIES = 8
WORKER_BASE_BYTES = 256 * 2**20  # a worker's own memory (Python, Dask, Arrow's libraries), besides its tasks'


def refuse_rows_a_task_cannot_hold(where: str, row_bytes: float, task_memory: int | None, each: bool = True) -> None:
    """Refuse rows of ``row_bytes`` that a worker thread of ``task_memory`` cannot hold ``ROW_COPIES`` times over
    (None: no limit), saying what to change.

    >>> refuse_rows_a_task_cannot_hold("the rows of x.parquet take", 300 * 2**20, 2**30)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: the rows of x.parquet take about 300 MiB each in memory, ... at least 2.6 GiB (--memory-limit, ...)
    """
    if task_memory is None or row_bytes * ROW_COPIES <= task_memory:
        return
    raise ValueError(
        f"{where} about {row_bytes / 2**20:,.0f} MiB{' each' if each else ''} in memory, and a task holds a row up "
        f"to {ROW_COPIES} times over, more than the {task_memory / 2**20:,.0f} MiB it has (a worker's memory limit "
        f"over its threads): give each worker thread at least {row_memory(row_bytes) / 2**30:,.1f} GiB "
        "(--memory-limit, --threads-per-worker on a cluster daskpile starts)"
    )


def row_memory(row_bytes: float) -> float:
    """The memory a worker thread needs to shuffle rows of ``row_bytes``: ``ROW_COPIES`` of one, and the
    worker's own.

    >>> row_memory(300 * 2**20) / 2**30
    2.59375
    """
    return row_bytes * ROW_COPIES + WORKER_BASE_BYTES


# Piles of at most this many bytes in memory on average, however much memory there is: a pile's permutation
# reads it in random order, and past a few tens of MiB most of those reads miss the CPU's caches and TLB.
# Measured on the 2-core VM (benchmarks/README.md, 2026-11-28, evening): pass 2 of B took 23.5-24.4 s in 8 piles
# of 640 MiB (the fewest that fit) against 14.9-16.9 s in 64 to 256; 5 M lines 1.6 s in piles of 85 MiB
# against 1.0-1.1 in 16 to 64; A 1.2-1.3 s in piles of 64 MiB against 0.9-1.1 in 16 or 64.
FAST_PILE_BYTES = 32 * 2**20


class NotEnoughSpace(OSError):
    """Scratch or dest lacks the space the run needs, found before anything is written (``errno`` ENOSPC)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC


class PileTooLargeError(RuntimeError):
    """A pile is over its memory budget and ``on_oversize="error"`` was asked for, or, in
    ``shuffle(ddf, piles="auto")``, over twice the budget its plan was made for.

    Raised by :func:`shuffle_parquet` after pass 1, before pass 2 writes
    anything; the message names the largest pile, its rows and estimated
    bytes.  The scratch is removed, since a rerun needs other arguments: more
    piles, a larger ``memory_per_pile``, or ``on_oversize="split"``.  Raised
    by a compute of ``shuffle(ddf, piles="auto")`` at the end of pass 1, when
    the partitions its plan measured were much smaller than the others: the
    message says the pile count that fits.
    """


@dataclasses.dataclass(frozen=True)
class PilePlan:
    """The chosen pile count and the estimate it came from.

    What :func:`~daskpile.plan_piles` returns, and ``ShuffleReport.pile_plan``
    for ``piles="auto"``; ``str`` describes it in one line.  Every parameter
    below is an attribute.

    Parameters
    ----------
    piles
        The pile count.
    rows
        The estimated rows of the data.
    bytes
        The estimated size of the data in memory (uncompressed), in bytes.
    memory_per_pile
        The bytes a pile was planned to fit (mean plus 6 standard deviations).
    """

    piles: int
    rows: int
    bytes: int
    memory_per_pile: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return (
            f"{count(self.piles, 'pile')}: about {count(self.rows, 'row')}, {size(self.bytes)} in memory, "
            f"{size(self.bytes / self.piles)} a pile on average, "  # (a small plan's "0 MiB a pile" said nothing)
            f"each planned to fit a budget of {self.memory_per_pile / 2**20:,.0f} MiB"
        )


def estimate_parquet(
    fs, files: list[str], sizes: list[int], metadata: pq.FileMetaData | None = None
) -> tuple[int, int, int]:
    """(rows, bytes in memory, bytes a row takes at least) of a Parquet dataset, from the footers of a few
    evenly spaced files.

    The sampled files' rows and bytes per stored byte are extrapolated by file
    size, so a dataset of 10,000 files on S3 costs 8 footer reads.  With the
    dataset's ``_metadata`` sidecar, the rows are exact and no footer is read.
    A footer counts a dictionary-encoded column at its encoded size (a country
    name, or a label among three, in a byte or less), so no column is taken
    for less than its type's width, and dictionary-encoded strings, lists and
    binaries are measured by decoding up to ``DECODED_SAMPLE_ROWS`` rows of
    the first sampled file that has rows (a file whose columns cannot be told
    apart keeps the footers' figures; one that cannot be read fails the run,
    naming it, as pass 1 would).
    """
    if metadata is not None:
        rows, bytes_by_column = metadata.num_rows, _footer_bytes_by_column(metadata)
        with_rows = _first_with_rows(metadata, files) or next(
            (f for f, size in zip(files, sizes, strict=True) if size), None
        )
    else:
        step = max(1, len(files) // SAMPLED_FILES)
        sample = list(range(0, len(files), step))[:SAMPLED_FILES]
        rows = stored = 0
        bytes_by_column: dict[str, int] = {}
        with_rows = None
        for k in sample:
            meta = read_parquet(fs, files[k], pq.read_metadata)
            if with_rows is None and meta.num_rows:
                with_rows = files[k]
            rows += meta.num_rows
            for name, nbytes in _footer_bytes_by_column(meta).items():
                bytes_by_column[name] = bytes_by_column.get(name, 0) + nbytes
            stored += sizes[k]
        scale = sum(sizes) / max(stored, 1)
        rows, bytes_by_column = round(rows * scale), {n: b * scale for n, b in bytes_by_column.items()}
    in_memory = _bytes_per_row_in_memory(fs, with_rows) if with_rows is not None and rows else {}
    data_bytes = round(sum(max(b, in_memory.get(n, 0) * rows) for n, b in bytes_by_column.items()))
    return rows, data_bytes, math.ceil(sum(in_memory.values()))


def _first_with_rows(metadata: pq.FileMetaData, files: list[str]) -> str | None:
    """The file of the ``_metadata`` sidecar's first row group that has rows (the one sampled without it)."""
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        if group.num_rows and group.num_columns:
            name = group.column(0).file_path
            return next((f for f in files if f == name or f.endswith("/" + name)), None)
    return None


def _footer_bytes_by_column(meta: pq.FileMetaData) -> dict[str, int]:
    """{top-level column: its uncompressed bytes as the footer counts them}, over every row group (all of them
    under one name "" if the leaves cannot be told apart)."""
    found: dict[str, int] = {}
    owners = _top_level_owners(meta)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            name = owners[c] if owners is not None else ""
            found[name] = found.get(name, 0) + group.column(c).total_uncompressed_size
    return found


def _top_level_owners(meta: pq.FileMetaData) -> list[str] | None:
    """The top-level column of each leaf column, in the footer's order (a name may hold dots: "a.b" is one);
    None where the columns' names are not one each, or their leaves do not add up to the footer's.

    >>> import pyarrow as pa, io
    >>> sink, pairs = io.BytesIO(), pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int8()))
    >>> pq.write_table(pa.table({"a.b": [1], "s": [{"x": 1, "y": "q"}], "m": pairs}), sink)
    >>> _top_level_owners(pq.read_metadata(pa.BufferReader(sink.getvalue())))
    ['a.b', 's', 's', 'm', 'm']
    """
    try:
        schema = meta.schema.to_arrow_schema()
    except (pa.ArrowException, ValueError):
        return None
    owners = [field.name for field in schema for _ in range(_leaves(field.type))]
    if len(set(schema.names)) != len(schema.names) or len(owners) != meta.num_columns:
        return None
    return owners


def _leaves(kind) -> int:
    if isinstance(kind, pa.ExtensionType):
        return _leaves(kind.storage_type)
    if pa.types.is_dictionary(kind):
        return _leaves(kind.value_type)
    if pa.types.is_map(kind):
        return _leaves(kind.key_type) + _leaves(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaves(kind.value_type)
    if pa.types.is_struct(kind):
        return sum(_leaves(kind.field(i).type) for i in range(kind.num_fields))
    return 1


def _bytes_per_row_in_memory(fs, path: str) -> dict[str, float]:
    """{top-level column: bytes a row takes in memory, at least}: a fixed-width column its width, from the
    schema; a dictionary-encoded string, binary or nested one measured on the first rows of ``path``.

    A file whose columns cannot be told apart (repeated names, leaves that do not add up) gives {}: the
    footers' figures stand.  A file that cannot be read fails the run, naming it, as pass 1 would: a run's
    pieces depend on this figure, which must not change with an error that a retry would not meet.
    """
    with open_parquet(fs, path) as parquet:
        owners = _top_level_owners(parquet.metadata)
        if owners is None or parquet.metadata.num_row_groups == 0:
            return {}
        widths = {f.name: _width(f.type) for f in parquet.schema_arrow}
        group = parquet.metadata.row_group(0)
        encoded = {owners[c] for c in range(group.num_columns) if group.column(c).has_dictionary_page}
        sampled = sorted(n for n in encoded if widths.get(n) is None)
        strings = [n for n in sampled if parquet.schema_arrow.field(n).type in _kernels.PLAIN_BINARY]
        flat = [
            n for n in strings if all(_indices_only(chunks[n]) for chunks in _measured_chunks(parquet, owners, strings))
        ]
        nested = [n for n in sampled if n not in flat]
        batch = None
        if nested:
            with parquet_errors(full_url(fs, path)):
                batches = parquet.iter_batches(batch_size=DECODED_SAMPLE_ROWS, columns=nested, use_threads=False)
                batch = next(batches, None)
    found = {name: width for name, width in widths.items() if width is not None}
    if batch is not None and batch.num_rows:
        found.update({name: batch.column(name).nbytes / batch.num_rows for name in nested})
    if flat:
        found.update(_decoded_bytes_per_row(fs, path, parquet.metadata, flat))
    return found


def _measured_chunks(parquet, owners: dict, columns: list[str]) -> list[dict]:
    """{column: its chunk} of each row group ``_decoded_bytes_per_row`` would read of ``columns``."""
    most, rows, found = max(1, MEASURED_VALUES // max(1, len(columns))), 0, []
    for g in range(parquet.metadata.num_row_groups):
        group = parquet.metadata.row_group(g)
        found.append({owners[c]: group.column(c) for c in range(group.num_columns)})
        rows += group.num_rows
        if rows >= most:
            break
    return found


def _indices_only(chunk) -> bool:
    """Whether a dictionary-encoded column chunk's data pages hold indices alone (4 bytes a value at most).

    A writer whose dictionary grew too large falls back to plain pages, which the footer counts at about
    their size in memory; read as a dictionary, pyarrow would build one of every value (0.2 s for 500,000
    names), to learn what the footer says already.
    """
    if chunk.dictionary_page_offset is None or not chunk.num_values:
        return False
    dictionary_page = chunk.data_page_offset - chunk.dictionary_page_offset
    return (chunk.total_compressed_size - dictionary_page) <= 4 * chunk.num_values


MEASURED_VALUES = 2**24  # of a file's dictionary-encoded strings (rows times columns), measured without decoding


def _decoded_bytes_per_row(fs, path: str, footer, columns: list[str]) -> dict[str, float]:
    """The bytes a row of each dictionary-encoded string column of ``path`` takes decoded, over its first
    rows (``MEASURED_VALUES`` values in all): read as dictionaries (an index a row), their values' lengths
    taken by index.  The first 65,536 rows alone misled: a log whose first lines were heartbeats ("a") and
    the rest stack traces was taken for 4 MiB in memory, not 1,195, and killed every worker whatever the
    blocksize."""
    total, rows, most = dict.fromkeys(columns, 0), 0, max(1, MEASURED_VALUES // len(columns))
    with open_parquet(fs, path, footer, read_dictionary=columns) as parquet, parquet_errors(full_url(fs, path)):
        batches = parquet.iter_batches(batch_size=min(most, 2**20), columns=columns, use_threads=False)
        for batch in batches:
            for name in columns:
                column = batch.column(name)
                values = column.nbytes
                if pa.types.is_dictionary(column.type):
                    lengths = pc.binary_length(column.dictionary).cast(pa.int64())
                    values = (pc.sum(pc.take(lengths, column.indices)).as_py() or 0) + 4 * len(column)
                total[name] += values
            rows += batch.num_rows
            if rows >= most:
                break
    return {name: nbytes / rows for name, nbytes in total.items()} if rows else {}


def _width(kind) -> float | None:
    """Bytes a value of a fixed-width type takes in Arrow (with its validity bit); None for other types."""
    if isinstance(kind, pa.ExtensionType):
        kind = kind.storage_type
    if pa.types.is_dictionary(kind):
        return None
    try:
        return kind.bit_width / 8 + 1 / 8
    except ValueError:  # not fixed-width
        return None


def plan_for_cluster(rows: int, data_bytes: int, memory_per_pile: int | None = None) -> PilePlan:
    """``plan`` with the defaults of ``piles="auto"``: a quarter of a task's memory per pile, at least 4 piles
    per thread and piles of ``FAST_PILE_BYTES`` or less on average.

    With ``memory_per_pile`` given, the count depends on the data and it alone, not on the cluster's threads
    (the docs promise a result as deterministic as with a pile count): 2 workers planned 8 piles, 3 planned 12.

    >>> plan_for_cluster(rows=100_000_000, data_bytes=5 * 2**30, memory_per_pile=2**30).piles
    160
    >>> plan_for_cluster(rows=100_000, data_bytes=12 * 2**30, memory_per_pile=3 * 2**30).piles  # images
    384
    """
    budget = memory_per_pile or int(memory_per_thread() * MEMORY_PER_PILE_FRACTION)
    fast = min(math.ceil(data_bytes / FAST_PILE_BYTES), MAX_PILES)
    parallel = 4 * total_threads() if memory_per_pile is None else 1
    return plan(rows, data_bytes, budget, min_piles=max(parallel, fast))


def plan(rows: int, data_bytes: int, memory_per_pile: int, min_piles: int = 1) -> PilePlan:
    """The fewest piles (at least ``min_piles``) whose largest pile fits ``memory_per_pile``.

    >>> plan(rows=10_000_000, data_bytes=10 * 2**30, memory_per_pile=2**30).piles
    11
    >>> plan(rows=200, data_bytes=2_000, memory_per_pile=2**30, min_piles=8).piles
    1
    >>> plan(rows=3, data_bytes=190 * 2**20, memory_per_pile=2**30, min_piles=8).piles  # three huge lines
    3
    """
    if memory_per_pile <= 0:
        raise ValueError(f"memory_per_pile must be positive, got {memory_per_pile!r}")
    bytes_per_row = data_bytes / max(rows, 1)
    fitting_rows = memory_per_pile / max(bytes_per_row, 1e-9)
    # largest mean mu with mu + 6 sqrt(mu) <= fitting_rows
    mean_rows = ((-6 + math.sqrt(36 + 4 * fitting_rows)) / 2) ** 2
    if mean_rows < 1:
        # a pile of 1 row on average is drawn up to 7 (6 sigma above its mean): that must fit the budget
        needed = 7 * bytes_per_row
        raise ValueError(
            f"rows take about {human_size(bytes_per_row)} each in memory, and piles='auto' fits the largest pile "
            "(up to 7 rows, for piles of one row on average) in memory_per_pile, which is "
            f"{human_size(memory_per_pile)}: pass a memory_per_pile (--memory-per-pile) of {human_size(needed)} or "
            "more (a worker thread needs 4 times that), or a pile count (shuffle_parquet and the command then split "
            "a pile over memory_per_pile into files that fit)"
        )
    # at least min_piles (for parallelism), but never so many that piles get fewer than
    # MIN_ROWS_PER_PILE rows and FAST_PILE_BYTES on average: 200 rows make one pile, not 4 per thread; rows of
    # 120 KB (images) are not held to piles of 10,000 rows, 1.2 GB (a loader holds a few of them at once)
    # (and never more piles than rows: a trial's 3 lines of 190 MB got 5 piles, 2 of them empty files)
    parallel = min(min_piles, max(1, rows // MIN_ROWS_PER_PILE, data_bytes // FAST_PILE_BYTES), max(rows, 1))
    piles = max(parallel, math.ceil(rows / mean_rows), 1)
    if piles > MAX_PILES:
        raise ValueError(
            f"{rows:,} rows of {data_bytes:,} bytes need {piles:,} piles of {memory_per_pile:,} bytes, "
            f"more than the {MAX_PILES:,} daskpile supports: give the workers more memory"
        )
    return PilePlan(piles=piles, rows=rows, bytes=data_bytes, memory_per_pile=int(memory_per_pile))


MAX_SUB_PILES = 64  # files a pile of a few very large rows may be split into (two rows that each fill more than
# half the budget meet in one sub-pile with a chance of 1/64 then: the run is refused, not a worker killed)
SMALL_ROWS = 64  # rows of at most 1/64 of a budget are small: a sub-pile holds many, its size follows its rows
SPLIT_FAILURE_RATE = 0.01  # at most, for a pile of rows as large as its largest (the worst case)


def sub_piles(rows: int, nbytes: int, largest_row: int, budget: int) -> int:
    """How many sub-piles an oversized pile is split in: as many as rows of its average size need, unless
    its largest row is over ``1/SMALL_ROWS`` of the budget (a few rows of many MB).  Then, taking its bytes
    as rows as large as its largest (the worst case), enough that no sub-pile draws more of them than its
    budget holds but with a chance under ``SPLIT_FAILURE_RATE`` (a union bound over sub-piles of a binomial
    tail), at most ``MAX_SUB_PILES``.  The count depends on the rows, not on how they are drawn, so the
    split stays uniform.  (Splitting a sub-pile drawn over its budget again would keep it uniform too, but
    the tasks of pass 2 are made before the split is drawn.)

    >>> sub_piles(10_000, 2_000_000, 300, 1_500_000), sub_piles(3_750, 6_300_000, 2_100_000, 5_200_000)
    (2, 10)
    >>> sub_piles(30_000, 4 * 2**26 + 10**6, 2**26, 2**28)  # 4 rows of 64 MiB and 1 MB of small ones, 256 MiB
    5
    """
    even = max(2, plan(rows, nbytes, budget).piles)
    if largest_row * SMALL_ROWS <= budget:  # many rows to a sub-pile: the plan's margin on its rows holds
        return even
    large = nbytes // largest_row  # rows that large, at most
    fits = (budget - (nbytes - large * largest_row)) // largest_row  # of them in a sub-pile beside the rest
    for subs in range(even, MAX_SUB_PILES + 1):
        if subs * _binomial_tail(large, 1 / subs, fits) <= SPLIT_FAILURE_RATE:
            return subs
    return MAX_SUB_PILES


def _binomial_tail(n: int, p: float, k: int) -> float:
    """P(X > k) for X ~ Binomial(n, p).

    >>> round(_binomial_tail(3, 0.5, 2), 3), _binomial_tail(3, 0.5, 3)
    (0.125, 0.0)
    """
    if k >= n:
        return 0.0
    return max(0.0, 1.0 - sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1)))


# Text written from columns, against their size in memory: JSON lines repeat every key in every row (dataset A:
# 122 bytes a row against 51 in memory), CSV writes numbers as digits (90).  Floats and timestamps alone are
# longer as text still (a review: 2.1-3.4x as CSV): an estimate, as the scratch's is
TEXT_EXPANSION = {"jsonl": 2.5, "csv": 2.0}


def result_bytes(files_bytes: int, memory_bytes: float, format: str, compression: str | None, schema) -> int:
    """About the bytes of a result: the source's files, or, written uncompressed as text or Arrow, the rows'
    size in memory (as text, expanded: ``TEXT_EXPANSION``) if that is more.  A gzipped corpus written out as
    JSON lines is five to ten times its files; Parquet written as JSON lines two to three times.

    >>> result_bytes(100, 600, "jsonl", None, pa.schema([("line", pa.binary())]))  # the lines as written
    600
    >>> result_bytes(100, 600, "jsonl", None, pa.schema([("id", pa.int64()), ("x", pa.float64())]))
    1500
    >>> result_bytes(100, 600, "parquet", None, pa.schema([("id", pa.int64())]))
    100
    """
    if format == "parquet" or compression is not None:
        return files_bytes
    as_written = len(schema) == 1 and (pa.types.is_binary(schema[0].type) or pa.types.is_string(schema[0].type))
    expansion = 1.0 if format in ("arrow", "lines") or as_written else TEXT_EXPANSION[format]
    return max(files_bytes, int(memory_bytes * expansion))


def check_space(scratch_fs, scratch_dir: str, scratch_bytes: int, dest_fs, dest_dir: str, output_bytes: int) -> None:
    """Fail before anything is written if local scratch or dest lacks the space the run needs.

    Scratch holds uncompressed Arrow (about the data's in-memory size, as
    estimated: 0.88x it on dataset A, 0.94x on B), the output about
    ``result_bytes``; both exist at once at the end of pass 2.
    Object stores are not checked.
    """
    needs: dict[tuple[int, int], list] = {}
    for fs, path, nbytes, role in [
        (scratch_fs, scratch_dir, scratch_bytes, "scratch"),
        (dest_fs, dest_dir, output_bytes, "dest"),
    ]:
        space = free_space(fs, path)
        if space is not None:
            free, device = space
            need = needs.setdefault((device, free), [0, []])
            need[0] += nbytes
            need[1].append(f"{role} {full_url(fs, path)!r}")
    for (_, free), (nbytes, where) in needs.items():
        if nbytes > free:
            elsewhere = "give scratch (--scratch)" if where[0].startswith("scratch") else "write the result"
            raise _not_enough(" and ".join(where), nbytes, free, f"{elsewhere} on a larger disk or an object store")


def check_room(fs, path: str, nbytes: int, what: str, elsewhere: str) -> None:
    """Fail before anything is written if a local ``path`` lacks ``nbytes`` free (object stores: not checked).

    >>> import fsspec
    >>> check_room(fsspec.filesystem("file"), "/tmp", 2**80, "window", "expire generations first")
    Traceback (most recent call last):
    ...
    daskpile.engine._sizing.NotEnoughSpace: not enough space for window '/tmp': ...
    """
    space = free_space(fs, path)
    if space is not None and nbytes > space[0]:
        raise _not_enough(f"{what} {full_url(fs, path)!r}", nbytes, space[0], elsewhere)


def _not_enough(where: str, nbytes: int, free: int, elsewhere: str) -> NotEnoughSpace:
    return NotEnoughSpace(
        f"not enough space for {where}: the run needs about {human_size(nbytes)} ({nbytes:,} bytes) there, "
        f"{human_size(free)} ({free:,} bytes) are free. Free some space or {elsewhere}"
    )
