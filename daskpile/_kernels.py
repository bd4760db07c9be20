"""The two kernels of the pile shuffle: pure functions on Arrow data.

``scatter`` sends each row of one input partition to a uniformly random pile
and groups the rows by pile; ``permute`` puts the rows of one pile into a
uniformly random order.  Composed over all partitions and piles they produce a
uniformly random permutation of the whole input (see DESIGN.md: choosing the
pile is a radix sort on the leading digits of a uniform key, permuting inside
a pile sorts on the remaining digits).
"""

from __future__ import annotations

import copyreg
import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# pyarrow pickles a fixed_size_list type as its value type and size, without its field: a plan's schema sent
# to a worker named the vectors' values ``item``, not ``element`` as Parquet does, and lost their ``not null``
# (the worker's rows then differed from the plan, or took another name than a run on threads gave them)
copyreg.pickle(pa.FixedSizeListType, lambda kind: (pa.list_, (kind.value_field, kind.list_size)))


def scatter(table: pa.Table, piles: int, rng: np.random.Generator) -> tuple[pa.RecordBatch, np.ndarray]:
    """Assign every row to a uniformly random pile and group the rows by pile.

    Returns one record batch whose rows are ordered by pile (stably, so rows
    keep their input order inside a pile; pass 2 permutes them) and the row
    count of each pile.  Pile ``j`` is ``batch.slice(offsets[j], counts[j])``.

    >>> import pyarrow as pa, numpy as np
    >>> batch, counts = scatter(pa.table({"x": [1, 2, 3]}), 2, np.random.default_rng(0))
    >>> int(counts.sum()), batch.num_rows
    (3, 3)
    """
    return group_by_pile(table, random_piles(rng, table.num_rows, piles), piles)


def random_piles(rng: np.random.Generator, rows: int, piles: int) -> np.ndarray:
    """A uniformly random pile for each of ``rows`` rows."""
    dtype = np.uint16 if piles <= 1 << 16 else np.uint32
    return rng.integers(0, piles, size=rows, dtype=dtype)


def group_by_pile(table: pa.Table, pile_of_row: np.ndarray, piles: int) -> tuple[pa.RecordBatch, np.ndarray]:
    """The rows of ``table`` ordered by their pile, stably, and the row count of each pile."""
    counts = np.bincount(pile_of_row, minlength=piles).astype(np.int64)
    if piles > 1:
        # A stable sort of 16-bit keys is a radix sort in numpy: linear time.
        table = take(table, np.argsort(pile_of_row, kind="stable"))
    return as_record_batch(table), counts


def group_nbytes(batch: pa.RecordBatch, counts: np.ndarray) -> np.ndarray:
    """The Arrow bytes of each group of consecutive rows ``counts`` of ``batch`` (a pile's, as pass 2 holds
    them): a few rows of many MB make a group large whatever its row count.  A dictionary column counts its
    indices (its dictionary is shared, held once whatever the groups).

    >>> batch = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64()), "s": ["a", "bbbb", "cc"]})
    >>> group_nbytes(batch, np.array([1, 2])).tolist()  # 8 bytes an id; 4 an offset and the strings' bytes
    [13, 30]
    """
    counts = np.asarray(counts, dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    total = np.zeros(len(counts), dtype=np.int64)
    for column in batch.columns:
        if not len(column):
            continue
        validity = (counts + 7) // 8 if column.buffers()[0] is not None else 0
        width, offsets, item_bytes = _layout(column)
        if offsets is not None:  # a group's values are those between its first and last offsets
            total += (offsets[bounds[1:]] - offsets[bounds[:-1]]).astype(np.int64) * item_bytes
        elif width is None:  # struct, map, nested strings: Arrow counts each group's buffers
            if len(counts) <= MAX_GROUPS_SLICED:
                total += np.array(
                    [column.slice(a, n).nbytes for a, n in zip(bounds[:-1], counts, strict=True)], np.int64
                )
            else:  # (a slice each costs microseconds: tens of thousands of piles, by the rows instead)
                total += (counts * column.nbytes) // len(column)
            continue
        total += counts * width + validity + ((counts + 7) // 8 if pa.types.is_boolean(column.type) else 0)
    return total


def group_largest_row(batch: pa.RecordBatch, counts: np.ndarray) -> np.ndarray:
    """The Arrow bytes of the largest row of each group of consecutive rows ``counts`` of ``batch``, nested
    values included (a dictionary's index only; unions, run-end encoded and view columns not counted).

    >>> batch = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64()), "s": ["a", "bbbb", "cc"]})
    >>> group_largest_row(batch, np.array([1, 2])).tolist()
    [13, 16]
    """
    counts = np.asarray(counts, dtype=np.int64)
    fixed, sizes = rows_bytes(batch)
    largest = np.full(len(counts), fixed, dtype=np.int64)
    filled = counts > 0
    if sizes is not None and filled.any():
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))[filled]
        largest[filled] += np.maximum.reduceat(sizes, starts)
    largest[~filled] = 0
    return largest


MAX_GROUPS_SLICED = 1024


def rows_bytes(data: pa.Table | pa.RecordBatch) -> tuple[int, np.ndarray | None]:
    """(the bytes every row of ``data`` takes, each row's bytes beyond that or None): ``row_bytes`` of its
    columns, added up.

    >>> fixed, varying = rows_bytes(pa.table({"id": [1, 2], "s": ["a", "bcd"]}))
    >>> fixed, varying.tolist()  # 8 bytes an id; 4 an offset and the bytes of a string
    (8, [5, 7])
    """
    fixed, varying = 0, None
    for column in data.columns:
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        sizes = [row_bytes(chunk) for chunk in chunks if len(chunk)]
        if not sizes or sizes[0] is None:  # (a type's chunks measure alike)
            continue
        if isinstance(sizes[0], int):
            fixed += sizes[0]
            continue
        each = np.concatenate(sizes) if len(sizes) > 1 else sizes[0]
        varying = each if varying is None else varying + each
    return fixed, varying


def row_bytes(column: pa.Array) -> int | np.ndarray | None:
    """The Arrow bytes of each row of ``column``: an int where every row takes the same, else one per row;
    None for what is not measured here (unions, run-end encoded, views).  Nested values count what they hold.

    >>> row_bytes(pa.array([{"n": 1, "s": "ab"}, {"n": 2, "s": "x" * 100}])).tolist()  # 8 + 4 + the bytes
    [14, 112]
    >>> row_bytes(pa.array([[1.5, 2.5], [], [3.5]])).tolist()  # an offset and 8 bytes an item
    [20, 4, 12]
    """
    kind = column.type
    if isinstance(kind, pa.ExtensionType):
        return row_bytes(column.storage)
    if pa.types.is_struct(kind):
        fields = [row_bytes(column.field(i)) for i in range(kind.num_fields)]  # (sliced as the struct is)
        return None if any(f is None for f in fields) else sum(fields, 0)
    # (a list's ``values`` are its whole child, whatever slice of it the list is: only its own are measured)
    if pa.types.is_fixed_size_list(kind):
        size = kind.list_size
        items = row_bytes(column.values.slice(column.offset * size, len(column) * size))
        if items is None or isinstance(items, int) or not size:
            return None if items is None else size * items
        return items.reshape(len(column), size).sum(axis=1)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        wide = pa.types.is_large_list(kind)
        offsets = _offsets(column, np.int64 if wide else np.int32)
        if offsets is None:
            return None
        first = int(offsets[0])
        items = row_bytes(column.values.slice(first, int(offsets[-1]) - first))
        if items is None:
            return None
        if isinstance(items, int):
            return (8 if wide else 4) + np.diff(offsets).astype(np.int64) * items
        sums = np.concatenate(([0], np.cumsum(items)))
        return (8 if wide else 4) + (sums[offsets[1:] - first] - sums[offsets[:-1] - first])
    width, offsets, item_bytes = _layout(column)
    if offsets is not None:
        return width + np.diff(offsets).astype(np.int64) * item_bytes
    return width


def _layout(column: pa.Array) -> tuple[int | None, np.ndarray | None, int]:
    """(bytes every row of ``column`` takes, or None if its rows differ in ways not measured here; the offsets
    of its values, if its rows have some; the bytes of a value): fixed widths, strings, binaries and lists of
    fixed-width values, a dictionary's indices."""
    kind = column.type
    if isinstance(kind, pa.ExtensionType):
        return _layout(column.storage)
    if pa.types.is_dictionary(kind):
        return (kind.index_type.bit_width + 7) // 8, None, 0
    if pa.types.is_boolean(kind):  # a bit a row: counted as the validity bitmap is, by group_nbytes
        return 0, None, 0
    if fixed_width(kind):
        return (kind.bit_width + 7) // 8, None, 0
    if kind in PLAIN_BINARY:
        wide = kind in (pa.large_string(), pa.large_binary())
        offsets = _offsets(column, np.int64 if wide else np.int32)
        return (8 if wide else 4), offsets, 1
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        wide, item = pa.types.is_large_list(kind), kind.value_type
        offsets = _offsets(column, np.int64 if wide else np.int32)
        if offsets is None or not fixed_width(item) or pa.types.is_boolean(item):
            return None, None, 0
        return (8 if wide else 4), offsets, (item.bit_width + 7) // 8
    return None, None, 0


PLAIN_BINARY = (pa.string(), pa.binary(), pa.large_string(), pa.large_binary())  # values behind offsets


def _offsets(column: pa.Array, dtype) -> np.ndarray | None:
    buffer = column.buffers()[1]
    if buffer is None:
        return None
    return np.frombuffer(buffer, dtype=dtype)[column.offset : column.offset + len(column) + 1]


def fixed_width(kind: pa.DataType) -> bool:
    """Whether every value of ``kind`` takes the same bytes (a bit, for booleans), nothing nested or shared.

    >>> fixed_width(pa.timestamp("us")), fixed_width(pa.string()), fixed_width(pa.dictionary(pa.int8(), pa.string()))
    (True, False, False)
    """
    if pa.types.is_boolean(kind):
        return True
    if pa.types.is_dictionary(kind):
        return False
    try:
        return kind.bit_width > 0 and kind.num_fields == 0
    except ValueError:
        return False


def permute(table: pa.Table, rng: np.random.Generator) -> pa.Table:
    """Return the rows of ``table`` in a uniformly random order.

    Called on one pile at a time, so the random ``take`` stays within a pile
    (cache friendly) and memory is bounded by the pile.

    >>> import pyarrow as pa, numpy as np
    >>> sorted(permute(pa.table({"x": [1, 2, 3]}), np.random.default_rng(0))["x"].to_pylist())
    [1, 2, 3]
    """
    if table.num_rows <= 1:
        return table
    return take(table, permutation(rng, table.num_rows))  # (rng.permutation's numbers)


# Filled this many at a time: numpy's arange of a whole pile is a temporary from the C heap
_FILL_STEP = 1 << 14


def permutation(rng: np.random.Generator, n: int) -> np.ndarray:
    """``rng.permutation(n)``, the same numbers, in memory from Arrow's pool rather than the C heap, as int32
    where they fit.

    A loader's thread (or a worker's) that draws a pile's order of 12 MB from
    the C heap leaves it in that thread's arena when freed, which glibc keeps
    rather than giving back (the loader on B: 50 to 100 MiB more peak resident
    memory); Arrow's pool hands it on to the next pile's columns.  Fisher-Yates
    swaps the same positions whatever the items' size, and 4-byte ones halve
    what a group's order holds while its columns are taken (a loader of one
    int64 column: as much as the column) and took 18-24 ns a row against 30 at
    1.56 M rows (2026-12-02).

    >>> permutation(np.random.default_rng(7), 5).tolist() == np.random.default_rng(7).permutation(5).tolist()
    True
    """
    kind = np.int32 if n < 2**31 else np.int64
    size = np.dtype(kind).itemsize
    order = np.frombuffer(pa.allocate_buffer(size * n), dtype=kind) if n else np.zeros(0, dtype=kind)
    for start in range(0, n, _FILL_STEP):
        stop = min(n, start + _FILL_STEP)
        order[start:stop] = np.arange(start, stop)
    rng.shuffle(order)  # what Generator.permutation does with its arange
    return order


# A string of at most 12 bytes fits whole in an Arrow string view (16 bytes), so a take of such strings
# can be a take of fixed-width values.  Arrow's own take of a string reads its offsets, then its bytes:
# two dependent memory accesses per row, which miss the cache once a column's strings outgrow it.
# Measured on 10-byte strings in 40 chunks, Arrow's take against the views' (cast, taken, cast back):
# 12 against 21 ns a row at 20 k rows, 21 against 25 at 160 k, 43 against 22 at 320 k, 78 against 30
# at 1.56 M.  So short piles take strings Arrow's way, long ones as views.
INLINE_STRING_BYTES = 12
VIEW_TAKE_MIN_ROWS = 250_000
_VIEW_TYPES = {
    pa.string(): pa.string_view(),
    pa.large_string(): pa.string_view(),
    pa.binary(): pa.binary_view(),
    pa.large_binary(): pa.binary_view(),
}


def take(table: pa.Table, indices: np.ndarray) -> pa.Table:
    """``table.take(indices)``, with long columns of short strings taken as fixed-width views.

    ``indices`` must be in bounds: they are not checked (see ``_take``).

    >>> t = pa.table({"s": ["a", None, "ccc"], "x": [1, 2, 3]})
    >>> take(t, np.array([2, 0, 1])).equals(t.take([2, 0, 1]))
    True
    """
    arrow_indices = as_arrow_indices(indices)  # once, not once per column
    small = table.num_rows < VIEW_TAKE_MIN_ROWS and table.nbytes <= OFFSETS_LIMIT
    if small and not any(_is_view(field.type) for field in table.schema):  # (Arrow takes no views)
        return _take(table, arrow_indices)  # A pile of 20 k rows: 50 ns a row, against 75 with views
    columns = [TakeSource(table.column(i)).take(arrow_indices) for i in range(table.num_columns)]
    return pa.Table.from_arrays(columns, schema=table.schema)


def as_arrow_indices(indices: np.ndarray) -> pa.Array:
    """``indices`` as an Arrow int32 (if they are: a ``permutation``'s) or int64 array sharing their memory.

    Not ``pa.array(indices)``: its first call in a process imports pandas
    (0.25-0.6 s, holding the GIL, so every thread of a threaded run waits),
    and nothing else in a shuffle of Parquet needs pandas.

    >>> as_arrow_indices(np.array([2, 0, 1])).to_pylist(), as_arrow_indices(np.array([1], np.int32)).type
    ([2, 0, 1], DataType(int32))
    """
    kind = np.int32 if indices.dtype == np.int32 else np.int64
    indices = np.ascontiguousarray(indices, dtype=kind)
    return pa.Array.from_buffers(pa.from_numpy_dtype(kind), len(indices), [None, pa.py_buffer(indices)])


def binary_scalar(value: bytes, kind: pa.DataType) -> pa.Scalar:
    """``pa.scalar(value, kind)`` for a string or binary ``kind``, built from buffers, since ``pa.scalar``
    imports pandas, as ``pa.array`` does.

    >>> binary_scalar(b"\\n", pa.large_string()).as_py()
    '\\n'
    """
    large = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)
    offsets = np.array([0, len(value)], dtype=np.int64 if large else np.int32)
    return pa.Array.from_buffers(kind, 1, [None, pa.py_buffer(offsets), pa.py_buffer(value)])[0]


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of no rows with ``schema``; ``schema.empty_table()`` imports pandas, as ``pa.array`` does.

    >>> empty_table(pa.schema([("x", pa.int64())])).num_rows
    0
    """
    return pa.Table.from_batches([], schema=schema)


def _take(data, indices: pa.Array):
    # Every caller's indices are a permutation or a stable sort of the rows, so in bounds.  Arrow checks
    # them again for every column: a tenth of the time of a take of B's numeric columns (6.6 against
    # 8.0 ns a row for an int64 column of 500 k rows).
    return pc.take(selectable(data), indices, boundscheck=False)


def selectable(data):
    """``data`` (a table, chunked array or array) as Arrow's take and filter select its rows right.

    pyarrow (26.0.1) takes and filters a fixed-size list of fixed-size lists (an image's rows of pixels, a
    grid of vectors) from the wrong rows where its arrays are slices (a pile of a batch, a part of a row
    group): such arrays are copied to arrays of their own first.  Others are given back as they are.

    >>> grid = pa.array([[[i, i]] for i in range(4)], pa.list_(pa.list_(pa.int8(), 2), 1)).slice(2)
    >>> pc.take(selectable(grid), pa.array([1, 0])).to_pylist()
    [[[3, 3]], [[2, 2]]]
    """
    if isinstance(data, pa.Table):
        if not selectable_needs_a_look(data.schema):
            return data
        return pa.Table.from_arrays([selectable(column) for column in data.columns], schema=data.schema)
    if not _lists_of_lists(data.type):
        return data
    chunks = data.chunks if isinstance(data, pa.ChunkedArray) else [data]
    if not any(map(_sliced, chunks)):
        return data
    chunks = [pa.concat_arrays([chunk]) if _sliced(chunk) else chunk for chunk in chunks]
    return pa.chunked_array(chunks, data.type) if isinstance(data, pa.ChunkedArray) else chunks[0]


def selectable_needs_a_look(schema: pa.Schema) -> bool:
    """Whether a table of ``schema`` may be one whose rows Arrow selects wrong where it is a slice."""
    return any(map(_lists_of_lists, schema.types))


def _lists_of_lists(kind: pa.DataType) -> bool:
    """Whether ``kind`` holds a fixed-size list of fixed-size lists, at any depth."""
    if isinstance(kind, pa.BaseExtensionType):  # (a user's type may not hash: its storage does)
        return _lists_of_lists(kind.storage_type)
    return _holds_lists_of_lists(kind)


@functools.cache
def _holds_lists_of_lists(kind: pa.DataType) -> bool:
    if pa.types.is_fixed_size_list(kind) and pa.types.is_fixed_size_list(kind.value_type):
        return True
    if pa.types.is_struct(kind):
        return any(_lists_of_lists(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _lists_of_lists(kind.key_type) or _lists_of_lists(kind.item_type)
    if pa.types.is_dictionary(kind):
        return _lists_of_lists(kind.value_type)
    value_type = getattr(kind, "value_type", None)  # lists of all kinds
    return value_type is not None and _lists_of_lists(value_type)


def _sliced(array: pa.Array) -> bool:
    """Whether ``array``, or an array within it, starts at an offset into its buffers."""
    if array.offset:
        return True
    if isinstance(array, pa.ExtensionArray):
        return _sliced(array.storage)
    kind = array.type
    if pa.types.is_struct(kind):
        return any(_sliced(array.field(i)) for i in range(kind.num_fields))
    if pa.types.is_dictionary(kind):
        return _sliced(array.dictionary)
    values = getattr(array, "values", None)  # lists of all kinds, maps: their child, unsliced
    return values is not None and _sliced(values)


class TakeSource:
    """A column made ready once for any number of takes of its rows.

    Its chunks are combined once (Arrow's take of a chunked array combines
    them again at every call), and a long column of short strings is held as
    fixed-width views (see ``INLINE_STRING_BYTES``).  ``take`` gives the
    column's own type back.

    >>> source = TakeSource(pa.chunked_array([["a", "b"], ["c"]]))
    >>> source.take(as_arrow_indices(np.array([2, 0]))).to_pylist()
    ['c', 'a']
    """

    def __init__(self, column: pa.ChunkedArray | pa.Array):
        self.type = column.type
        self.back = None  # the column's own type, where it is taken in another
        if _is_view(column.type):
            # Arrow 26 takes no string_view ("no kernel matching input types"); and the views taken would point
            # into every data buffer of the column: each batch of a loader would hold, and pickle, its whole pile
            self.wide_type = self.view_type = None
            self.back, self.values = column.type, _combined(column.cast(_LARGE_OF_VIEW[column.type]))
            return
        # (a user's Python extension type may be unhashable: only the types below have views or wide forms)
        plain = not isinstance(column.type, pa.BaseExtensionType)
        self.wide_type = _WIDE_TYPES.get(column.type) if plain and column.nbytes > OFFSETS_LIMIT else None
        if self.wide_type is not None:
            # More bytes than 32-bit offsets reach (a pile of a text corpus): combined with 64-bit ones
            self.view_type, self.values = None, _combined(column.cast(self.wide_type))
            self.lengths = pc.fill_null(pc.binary_length(self.values), 0)
            return
        combined = selectable(_combined(column))  # (once, not at each take)
        self.view_type = _VIEW_TYPES.get(column.type) if plain and len(column) >= VIEW_TAKE_MIN_ROWS else None
        if self.view_type is not None and (pc.max(pc.binary_length(combined)).as_py() or 0) <= INLINE_STRING_BYTES:
            # Strings combined, then cast: combining views instead rewrites each one (measured 7x slower).
            views = inline_views(combined)
            self.values = pa.Array.from_buffers(pa.binary(16), len(views), views.buffers()[:2], offset=views.offset)
        else:
            self.view_type, self.values = None, combined

    def take(self, indices: pa.Array) -> pa.Array | pa.ChunkedArray:
        """The rows at ``indices`` (an Arrow int64 array, in bounds: not checked)."""
        if self.wide_type is not None:
            return self._take_in_chunks(indices)
        taken = _take(self.values, indices)
        if self.back is not None:
            return taken.cast(self.back)  # (views of the rows taken only)
        if self.view_type is None:
            return taken
        return pa.Array.from_buffers(self.view_type, len(taken), taken.buffers(), offset=taken.offset).cast(self.type)

    def _take_in_chunks(self, indices: pa.Array) -> pa.ChunkedArray:
        """Taken wide, in runs of rows whose bytes fit 32-bit offsets, each run a chunk of the column's type."""
        ends = np.cumsum(np.asarray(_take(self.lengths, indices)))
        chunks, start, done = [], 0, 0
        while start < len(indices):
            # (at least one row: a string array's one value is under the limit)
            stop = max(int(np.searchsorted(ends, done + OFFSETS_LIMIT, side="right")), start + 1)
            chunks.append(_take(self.values, indices.slice(start, stop - start)).cast(self.type))
            start, done = stop, int(ends[stop - 1])
        return pa.chunked_array(chunks, self.type)


def _is_view(kind: pa.DataType) -> bool:
    return pa.types.is_string_view(kind) or pa.types.is_binary_view(kind)


_LARGE_OF_VIEW = {pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}


# The largest offset of a string or binary array: a column with more bytes is taken as its large type.
OFFSETS_LIMIT = 2**31 - 1
_WIDE_TYPES = {pa.string(): pa.large_string(), pa.binary(): pa.large_binary()}


def as_wide(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A string or binary array with 64-bit offsets (its large type), for more bytes than ``OFFSETS_LIMIT``.

    >>> as_wide(pa.array(["a"])).type, as_wide(pa.array([1])).type
    (DataType(large_string), DataType(int64))
    """
    return values.cast(_WIDE_TYPES.get(values.type, values.type))


def _combined(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(column, pa.Array):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()  # (combining one chunk copies it)


def inline_views(array: pa.Array) -> pa.Array:
    """A string or binary array whose values are at most ``INLINE_STRING_BYTES`` long, as Arrow views.

    Each value then lies whole in its 16-byte view (4-byte length, bytes
    zero-padded to 12): the views have no data buffer.

    >>> inline_views(pa.array(["a", None, "bc"]).slice(1)).to_pylist()
    [None, 'bc']
    """
    if array.offset:  # Arrow's cast of a sliced string array costs time in proportion to the offset
        array = _unsliced(array)
    return array.cast(_VIEW_TYPES[array.type])


def _unsliced(array: pa.Array) -> pa.Array:
    """The same strings at offset 0: without nulls, sharing the data (offsets need not start at 0)."""
    if array.null_count:
        return pa.concat_arrays([array])
    width = 8 if array.type in (pa.large_string(), pa.large_binary()) else 4
    offsets = array.buffers()[1].slice(array.offset * width, (len(array) + 1) * width)
    return pa.Array.from_buffers(array.type, len(array), [None, offsets, array.buffers()[2]])


def value_offsets(array: pa.Array) -> np.ndarray:
    """Where each value of a string or binary array (large too) starts and ends in its data buffer.

    >>> value_offsets(pa.array(["ab", "", "c"]).slice(1)).tolist()
    [2, 2, 3]
    """
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)
    return offsets[array.offset : array.offset + len(array) + 1]


def value_bytes(array: pa.Array) -> pa.Buffer:
    """The bytes of a string or binary array's values, end to end (what its slice sees of the data buffer).

    >>> value_bytes(pa.array(["ab", "", "c"]).slice(1)).to_pybytes()
    b'c'
    """
    offsets = value_offsets(array)
    data = array.buffers()[2]
    return pa.py_buffer(b"") if data is None else data[int(offsets[0]) : int(offsets[-1])]


def as_record_batch(table: pa.Table) -> pa.RecordBatch:
    """The whole table as a single record batch (empty tables included)."""
    batches = table.combine_chunks().to_batches()
    if not batches:
        # pa.nulls, not pa.array: it makes empty arrays of every type (a dictionary of nulls too)
        return pa.RecordBatch.from_arrays([pa.nulls(0, field.type) for field in table.schema], schema=table.schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def offsets(counts: np.ndarray) -> np.ndarray:
    """Start row of each pile in a batch grouped by ``scatter``.

    >>> offsets(np.array([2, 0, 3])).tolist()
    [0, 2, 2]
    """
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def integer_or_boolean(kind: pa.DataType) -> bool:
    """Whether values of ``kind`` (a dictionary's: its values) are integers or booleans, which numpy holds
    as float64 once one of them is null.

    >>> integer_or_boolean(pa.dictionary(pa.int8(), pa.int64())), integer_or_boolean(pa.float64())
    (True, False)
    """
    kind = kind.value_type if pa.types.is_dictionary(kind) else kind
    return pa.types.is_integer(kind) or pa.types.is_boolean(kind)


def integer_vector_depth(kind: pa.DataType) -> int:
    """How many levels of fixed-size lists ``kind`` has above integers or booleans (vectors of them, as numpy
    and tensors need them whole); 0 for any other type.

    >>> integer_vector_depth(pa.list_(pa.list_(pa.int8(), 2), 3)), integer_vector_depth(pa.list_(pa.float32(), 4))
    (2, 0)
    """
    depth = 0
    while pa.types.is_fixed_size_list(kind):
        kind, depth = kind.value_type, depth + 1
    return depth if integer_or_boolean(kind) and not pa.types.is_dictionary(kind) else 0


def vector_leaf_paths(name: str, depth: int) -> tuple[str, ...]:
    """The Parquet paths of the values of a column of ``depth`` levels of lists: as pyarrow writes them first,
    then as older writers did.

    >>> vector_leaf_paths("g", 2)
    ('g.list.element.list.element', 'g.list.item.list.item')
    """
    return name + ".list.element" * depth, name + ".list.item" * depth
