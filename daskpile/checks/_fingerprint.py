"""An order-independent fingerprint of a multiset of rows.

Each row gets a 64-bit hash of all its values; a table's fingerprint is the
row count with the wrapping sum and the xor of those hashes.  Fingerprints of
parts add up (``a + b``) to the fingerprint of the whole, whatever the order of
the rows or how Arrow chunks them, so pass 1 can fingerprint the input
partition by partition and pass 2 the output pile by pile, and the two must be
equal.  Everything is vectorised numpy over Arrow buffers: no per-row Python.

The hash is exact on values: nulls hash alike whatever the bytes under them,
every NaN hashes alike, a dictionary column hashes as its decoded values, and
types are part of the schema (checked separately), not of the hash.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daskpile import _kernels
from daskpile._kernels import INLINE_STRING_BYTES  # strings up to this long fit whole in an Arrow string view

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_NULL = np.uint64(0x6A09E667F3BCC909)
_MASK = (1 << 64) - 1

# Fingerprints are comparable only between equal versions of the row hash.
# 2: string words are hashed with a multiplier per word position (faster than 1).
# 3: that multiplier is R**k, not affine in k (one prefix sum a word, not two); words folded by >> 29, not 32.
# 4: times (timestamp, duration, time) hashed as nanoseconds, whatever their unit: a result rewritten in another
#    unit holds the same instants, and was said to differ.
# 5: times past int64 nanoseconds (before 1677, after 2262) hashed as (seconds, nanoseconds), not wrapped: the
#    wrapped value is another instant, the one pyarrow reads Spark's 9999-12-31 as, and hashed alike.
HASH_VERSION = 5


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _M1
        x = x ^ (x >> np.uint64(27))
        x = x * _M2
        return x ^ (x >> np.uint64(31))


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """Row count, wrapping sum and xor of the row hashes of a multiset of rows.

    The fingerprint does not depend on the order of the rows, and the
    fingerprints of two parts add up to that of the whole, so a shuffle's
    input and output can be compared without holding either.  ``str`` gives
    ``10,000,000 rows, sum 1f2e..., xor 9a0b...``.  Every parameter below is
    an attribute.

    Parameters
    ----------
    rows
        The number of rows.
    sum
        The sum of the rows' 64-bit hashes, modulo ``2**64``.
    xor
        The xor of the rows' 64-bit hashes.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from daskpile.checks._fingerprint import of  # the fingerprint of an Arrow table
    >>> t = pa.table({"x": [1, 2, 3]})
    >>> of(t) == of(t.slice(2)) + of(t.slice(0, 2))
    True
    """

    rows: int = 0
    sum: int = 0
    xor: int = 0

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.rows + other.rows, (self.sum + other.sum) & _MASK, self.xor ^ other.xor)

    def to_json(self) -> dict:
        return {"rows": self.rows, "sum": f"{self.sum:016x}", "xor": f"{self.xor:016x}", "hash": HASH_VERSION}

    @classmethod
    def from_json(cls, data: dict) -> Fingerprint | None:
        """The fingerprint ``to_json`` wrote, or None if another version of the row hash computed it.

        >>> Fingerprint.from_json(Fingerprint(3, 5, 7).to_json())
        Fingerprint(rows=3, sum=5, xor=7)
        >>> Fingerprint.from_json({"rows": 3, "sum": "5", "xor": "7"}) is None  # version 1 had no "hash"
        True
        """
        if data.get("hash", 1) != HASH_VERSION:
            return None
        return cls(int(data["rows"]), int(data["sum"], 16), int(data["xor"], 16))

    def __str__(self) -> str:
        return f"{self.rows:,} rows, sum {self.sum:016x}, xor {self.xor:016x}"


def total(parts) -> Fingerprint:
    result = Fingerprint()
    for part in parts:
        result = result + part
    return result


# Rows hashed per step, with every intermediate array preallocated for the
# block and updated in place.  Dask workers run with MALLOC_TRIM_THRESHOLD_
# set, which makes each large numpy temporary cost fresh pages from the kernel:
# the allocating version of this code was measured 2.3x slower in a worker.
BLOCK_ROWS = 32768
# And at most about this many bytes of values a block (one row at least): its temporaries (a padded copy of
# its strings, a word per list item) then stay small whatever the rows hold.  By rows alone, a block of
# 1 MB images held a second copy of 32 GB of them, and one of lists of 1,000 numbers 3 words an item.
BLOCK_BYTES = 8 * 2**20
TAIL_WORDS = 2**16  # words of long strings summed per step (0.5 MiB an array: in cache)
_CANONICAL_NAN = np.uint64(0x7FF8000000000000)
_NANOSECONDS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}  # a time unit's, to hash every unit alike
_PAST_NANOSECONDS = np.uint64(0x3C6EF372FE94F82B)  # marks the hash of a time int64 nanoseconds cannot hold


def _rehash_past_nanoseconds(values: np.ndarray, nanoseconds: int, words: np.ndarray) -> None:
    """Give the times among ``values`` (of a unit ``nanoseconds`` long) that int64 nanoseconds cannot hold a
    hash of their (seconds, nanoseconds), the same in every unit, in place of their wrapped nanoseconds."""
    limit = np.iinfo(np.int64).max // nanoseconds
    past = (values > limit) | (values < -limit)
    if not past.any():
        return
    per_second = 10**9 // nanoseconds
    seconds, within = np.divmod(values[past], per_second)
    with np.errstate(over="ignore"):
        words[past] = _mix(seconds.view(np.uint64) * _GOLDEN + within.view(np.uint64) * np.uint64(nanoseconds))
        words[past] ^= _PAST_NANOSECONDS


class _Workspace:
    """The preallocated arrays of one fingerprint computation."""

    def __init__(self, rows: int):
        self.h, self.words, self.tmp, self.value = (np.empty(rows, dtype=np.uint64) for _ in range(4))
        self.lengths = np.empty(rows, dtype=np.int64)
        self.flags = np.empty(rows, dtype=bool)


def of(data: pa.Table | pa.RecordBatch) -> Fingerprint:
    """The fingerprint of the rows of a table or record batch."""
    result = Fingerprint()
    workspace = _Workspace(min(BLOCK_ROWS, data.num_rows))
    for start, rows in _blocks(data):
        hashes = _block_row_hashes(data.slice(start, rows), workspace)
        with np.errstate(over="ignore"):
            block = Fingerprint(
                len(hashes), int(hashes.sum(dtype=np.uint64)), int(np.bitwise_xor.reduce(hashes, initial=0))
            )
        result = result + block
    return result


def of_columns(data: pa.Table) -> dict[str, Fingerprint]:
    """Each column's fingerprint on its own: which columns differ, when two row multisets do."""
    result = {}
    blocks = list(_blocks(data))  # (of every column: cut again for each, a table's columns were read squared)
    for name in data.column_names:
        total = Fingerprint()
        for start, rows in blocks:
            column = data.column(name).slice(start, rows)
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
            hashes = _mix(value_words(column).copy())
            with np.errstate(over="ignore"):
                total = total + Fingerprint(
                    len(hashes), int(hashes.sum(dtype=np.uint64)), int(np.bitwise_xor.reduce(hashes, initial=0))
                )
        result[name] = total
    return result


def _blocks(data: pa.Table | pa.RecordBatch) -> Iterator[tuple[int, int]]:
    """(first row, rows) of each block of ``data`` hashed in turn: ``BLOCK_ROWS`` rows, fewer where they hold
    more than ``BLOCK_BYTES`` (one row at least)."""
    start, n = 0, data.num_rows
    while start < n:
        rows = min(BLOCK_ROWS, n - start)
        block = data.slice(start, rows)
        if _value_bytes(block) > BLOCK_BYTES:  # (rare: row by row only then)
            _, varying = _kernels.rows_bytes(block)
            if varying is not None:
                rows = max(1, int(np.searchsorted(np.cumsum(varying), BLOCK_BYTES, "right")))
        yield start, rows
        start += rows


def _varying(data: pa.Table | pa.RecordBatch) -> Iterator[tuple[pa.DataType, list[pa.Array]]]:
    """(type, non-empty chunks) of each column of ``data`` whose rows vary in size: strings, lists..."""
    for column in data.columns:
        kind = column.type.storage_type if isinstance(column.type, pa.ExtensionType) else column.type
        if not (pa.types.is_dictionary(kind) or _kernels.fixed_width(kind)):
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
            yield kind, [c.storage if isinstance(c, pa.ExtensionArray) else c for c in chunks if len(c)]


def _value_bytes(data: pa.Table | pa.RecordBatch) -> float:
    """The bytes of the values of ``data`` that vary in size (its strings' from their offsets, at a glance)."""
    total = 0
    for kind, chunks in _varying(data):
        for chunk in chunks:
            if kind not in _kernels.PLAIN_BINARY:
                return math.inf  # nested: counted row by row, if need be
            offsets = _kernels.value_offsets(chunk)
            total += int(offsets[-1]) - int(offsets[0])
    return total


def row_hashes(data: pa.Table | pa.RecordBatch) -> np.ndarray:
    """One uint64 hash per row, combining every column in order."""
    return _block_row_hashes(data, _Workspace(data.num_rows)).copy()


def _block_row_hashes(data: pa.Table | pa.RecordBatch, ws: _Workspace) -> np.ndarray:
    n = data.num_rows
    h, tmp = ws.h[:n], ws.tmp[:n]
    if not data.num_columns:
        h.fill(0)
    for i, name in enumerate(data.column_names):
        column = data.column(i)
        if isinstance(column, pa.ChunkedArray):
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        try:
            words = value_words(column, ws)
        except TypeError as e:
            raise TypeError(
                f"cannot fingerprint column {name!r}: {e}; verify=False (--no-verify) shuffles without fingerprints"
            ) from e
        # A cheap combine per column (odd multiply, add: a change in any one column
        # always changes h, since the multiplier is invertible); one strong mix at the end.
        if i == 0:
            np.copyto(h, words)  # 0 * _M1 + words
            continue
        np.multiply(h, _M1, out=h)
        np.add(h, words, out=h)
    _mix_in_place(h, tmp)
    return h


def _mix_in_place(x: np.ndarray, tmp: np.ndarray) -> None:
    """_mix without temporaries."""
    for shift, multiplier in ((30, _M1), (27, _M2)):
        np.right_shift(x, np.uint64(shift), out=tmp)
        np.bitwise_xor(x, tmp, out=x)
        np.multiply(x, multiplier, out=x)
    np.right_shift(x, np.uint64(31), out=tmp)
    np.bitwise_xor(x, tmp, out=x)


# A word's hash depends on where in its string it is: word k is weighted by R**k (R odd, so invertible
# modulo 2**64).  Then a string's sum over its words is a difference of prefix sums over all the words
# of a buffer, weighted by R**j from the buffer's start, times R**-start: one multiply and one prefix sum
# a word, with no gather per word and no position arithmetic.  R is not the length's multiplier (GOLDEN),
# else a length and word 1 could cancel; R = 3 mod 8, so R**d - 1 has as few factors of 2 as an odd
# multiplier allows for words an odd distance d apart (a change confined to a word's top bits, moved
# between two words, then still changes the sum).
_R = np.uint64(0xD6E8FEB86659FD93)
# A word is folded as w ^ w >> 29 before its multiply, so that its high bits reach the low ones, which
# a multiply does not do.  Not 32: a change to the same bit of bytes i and i + 4 (a case flip of both)
# would cancel in the low half and be left to the top bits.
_WORD_SHIFT = np.uint64(29)
_R_INVERSE = np.uint64(pow(int(_R), -1, 1 << 64))


def _powers_of(base: np.uint64, n: int) -> np.ndarray:
    """``base ** k`` modulo ``2**64`` for k < n."""
    powers = np.full(n, base, dtype=np.uint64)
    powers[0] = 1
    return np.multiply.accumulate(powers)  # wraps, as uint64 arithmetic does


class _Powers:
    """R**k and R**-k for the word positions of a step."""

    def __init__(self, n: int):
        self.up, self.down = _powers_of(_R, n), _powers_of(_R_INVERSE, n)

    @classmethod
    def at_least(cls, n: int) -> _Powers:
        """The shared tables, or, for a step longer than they are (a line of over a MiB), tables of its own:
        kept, they would hold twice the longest line's size for the life of the process."""
        return _POWERS if n <= len(_POWERS.up) else cls(n)


_POWERS = _Powers(2 * TAIL_WORDS)  # a step is about TAIL_WORDS words, and the longest row in it


def _string_words_into(array: pa.Array, ws: _Workspace, out: np.ndarray) -> None:
    """The hash of each string (or binary value) of ``array``, written into ``out``.

    A string hashes as its length plus, for each 8-byte word ``w`` counted
    from its start (the last zero-padded), ``(w ^ w >> 29) * R**k`` where
    ``k`` is the word's position.  Every string is first padded to whole
    words by Arrow, so that the words of all strings are one aligned uint64
    array, and each string's sum comes from one prefix sum over that array
    (``_add_word_sums``).  A string hashes the same wherever it sits in the
    buffer.
    """
    n = len(array)
    lengths = ws.lengths[:n]
    offsets = _kernels.value_offsets(array)
    np.subtract(offsets[1:], offsets[:-1], out=lengths, casting="unsafe")
    if int(lengths.max()) <= INLINE_STRING_BYTES:
        _inline_string_words_into(array, lengths, ws, out)
        return
    np.multiply(lengths.view(np.uint64), _GOLDEN, out=out)
    if offsets.dtype == np.int32 and int(offsets[-1]) - int(offsets[0]) + 7 * n > _kernels.OFFSETS_LIMIT:  # pads too
        array = _kernels.as_wide(array)
    padded = _padded_to_words(array, lengths)
    word_offsets = _kernels.value_offsets(padded).astype(np.int64) >> 3
    words = np.frombuffer(padded.buffers()[2], dtype="<u8", count=int(word_offsets[-1]))
    # Rows in chunks of about TAIL_WORDS words: the prefix sums stay in cache
    cuts = np.searchsorted(word_offsets[1:], np.arange(TAIL_WORDS, int(word_offsets[-1]), TAIL_WORDS), "right")
    for begin, end in itertools.pairwise([0, *cuts.tolist(), n]):
        if end > begin:
            _add_word_sums(words, word_offsets[begin : end + 1], out[begin:end])
    _mix_in_place(out, ws.tmp[:n])


def _padded_to_words(array: pa.Array, lengths: np.ndarray) -> pa.Array:
    """Each value followed by the zero bytes that make it whole 8-byte words, starting at 0 (Arrow aligns)."""
    pad_lengths = (-lengths) & 7
    offsets = np.empty(len(lengths) + 1, dtype=_kernels.value_offsets(array).dtype)
    offsets[0] = 0
    np.cumsum(pad_lengths, out=offsets[1:])
    zeros = np.zeros(int(offsets[-1]), dtype=np.uint8)
    # built from buffers: 13x faster than a take of one-to-seven-byte pads
    pads = pa.Array.from_buffers(array.type, len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(zeros)])
    return pc.binary_join_element_wise(array, pads, _kernels.binary_scalar(b"", array.type))


def _add_word_sums(words: np.ndarray, word_offsets: np.ndarray, out: np.ndarray) -> None:
    """Add to ``out[i]`` the sum over the words ``w`` of string ``i`` of ``(w ^ w >> 29) * R**k``, k the word's
    position in the string: ``R**-first`` times the sum of ``(w ^ w >> 29) * R**j`` over the string's words j,
    counted from the step's first word.  The sums are one segmented sum (``reduceat``: 1.5 ms for 11 MB of
    words, against 2.5 ms for a prefix sum and two gathers)."""
    base = int(word_offsets[0])
    n_words = int(word_offsets[-1]) - base
    if not n_words:  # empty strings only: their sums are 0
        return
    chunk = words[base : base + n_words]
    starts = word_offsets[:-1] - base
    powers = _Powers.at_least(n_words + 1)
    mixed = np.empty(n_words + 1, dtype=np.uint64)  # a zero after the words: empty strings may start there
    mixed[-1] = 0
    with np.errstate(over="ignore"):
        np.right_shift(chunk, _WORD_SHIFT, out=mixed[:-1])
        np.bitwise_xor(mixed[:-1], chunk, out=mixed[:-1])
        np.multiply(mixed[:-1], powers.up[:n_words], out=mixed[:-1])
        sums = np.add.reduceat(mixed, starts)
        sums[word_offsets[1:] == word_offsets[:-1]] = 0  # reduceat gives an empty segment its first word
        out += sums * powers.down[starts]


def _inline_string_words_into(array: pa.Array, lengths: np.ndarray, ws: _Workspace, out: np.ndarray) -> None:
    """``_string_words_into`` for strings of at most 12 bytes, from their Arrow string views.

    A view of such a string is its 4-byte length and its bytes, zero-padded to
    12: words 0 and 1 of the string are fixed-width fields of the view, so no
    gather over the data buffer is needed (measured 3x faster on 11-byte
    strings).  The result is the same hash, bit for bit.
    """
    n = len(array)
    views = _kernels.inline_views(array)  # the views of nulls do not matter: the caller overwrites them
    buffer = views.buffers()[1]
    fields = np.frombuffer(buffer, dtype="<u4")[4 * views.offset :][: 4 * n].reshape(n, 4)
    # fields: length, bytes 0-3, 4-7, 8-11; word 0 is bytes 0-7, read in place (unaligned, 16 bytes apart)
    word_0 = np.ndarray(shape=(n,), dtype="<u8", buffer=buffer, offset=16 * views.offset + 4, strides=(16,))
    value, tmp = ws.value[:n], ws.tmp[:n]
    np.multiply(lengths.view(np.uint64), _GOLDEN, out=out)
    np.right_shift(word_0, _WORD_SHIFT, out=tmp)
    np.bitwise_xor(word_0, tmp, out=value)
    np.add(out, value, out=out)  # times R**0
    # word 1 is field 3 (its upper half is zero)
    np.copyto(value, fields[:, 3], casting="unsafe")
    np.right_shift(value, _WORD_SHIFT, out=tmp)
    np.bitwise_xor(value, tmp, out=value)
    np.multiply(value, _R, out=value)
    np.add(out, value, out=out)
    _mix_in_place(out, tmp)


# View layouts hold the same values as these, which the fingerprint reads.
_VIEWS_AS = {pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}


def value_words(array: pa.Array, ws: _Workspace | None = None) -> np.ndarray:
    """One uint64 per element that identifies its value (nulls included), as cheaply as possible.

    Fixed-width values of up to 8 bytes are their own bits; everything else
    gets a strong 64-bit hash.  The common types are written into ``ws`` (a
    fresh workspace if none is given) without temporaries; nested types, which
    recurse, allocate.  A column of 8-byte values without nulls (or NaNs) is
    its own words: the result is then a read-only view of its buffer.
    """
    n, t = len(array), array.type
    if isinstance(t, pa.BaseExtensionType):  # uuid, json, bool8, tensors, opaque, user types: their storage
        return value_words(array.storage, ws)
    if t in _VIEWS_AS:
        return value_words(array.cast(_VIEWS_AS[t]), ws)
    ws = ws or _Workspace(n)
    out = ws.words[:n]
    if n == 0 or pa.types.is_null(t) or array.null_count == n:
        out.fill(_NULL)
        return out
    if pa.types.is_dictionary(t):
        dictionary = value_words(array.dictionary)
        indices = value_words(array.indices)  # nulls become _NULL, clamped here and overwritten below
        out[:] = dictionary[np.minimum(indices, len(dictionary) - 1).astype(np.int64)] if len(dictionary) else indices
    elif pa.types.is_boolean(t):
        bits = np.unpackbits(_buffer_bytes(array.buffers()[1]), bitorder="little")[array.offset : array.offset + n]
        np.add(bits, 1, out=out, casting="unsafe")
    elif pa.types.is_floating(t):
        raw = _fixed_width_bytes(array)
        width = t.bit_width // 8
        is_nan = ws.flags[:n]
        np.isnan(raw.view(f"<f{width}"), out=is_nan)
        has_nan = is_nan.any()
        if width == 8 and not has_nan and not array.null_count:
            return raw.view("<u8")  # its own words: no copy
        np.copyto(out, raw.view(f"<u{width}"), casting="unsafe")
        if has_nan:
            out[is_nan] = _CANONICAL_NAN  # one NaN, whatever its payload
    elif (pa.types.is_integer(t) or pa.types.is_temporal(t)) and not pa.types.is_interval(t):
        raw = _fixed_width_bytes(array).view(f"<u{t.bit_width // 8}")
        nanoseconds = _NANOSECONDS.get(getattr(t, "unit", None), 1) if not pa.types.is_date(t) else 1
        if t.bit_width == 64 and not array.null_count and nanoseconds == 1:
            return raw  # its own words: no copy
        np.copyto(out, raw, casting="unsafe")
        if nanoseconds != 1:
            np.multiply(out, np.uint64(nanoseconds), out=out)
            if t.bit_width == 64:
                _rehash_past_nanoseconds(raw.view("<i8"), nanoseconds, out)
    elif pa.types.is_decimal(t) and t.bit_width != 128 and t.precision <= 38:  # (a value of any width, alike)
        return value_words(array.cast(pa.decimal128(t.precision, t.scale)), ws)
    elif pa.types.is_decimal(t):
        out[:] = _wide_words(_fixed_width_bytes(array).reshape(n, t.bit_width // 8))
    elif pa.types.is_fixed_size_binary(t):
        _string_words_into(array.cast(pa.binary()), ws, out)
    elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        _string_words_into(array, ws, out)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        first = int(offsets[0])  # ``values`` are the unsliced child's: only this slice's are hashed
        values = array.values.slice(first, int(offsets[-1]) - first)
        lengths = np.diff(offsets)
        if (lengths == lengths[0]).all():  # (embeddings written as lists: one size, hashed as vectors are)
            _lists_of_a_size_into(values, int(lengths[0]), out)
        else:
            out[:] = _sequence_hashes(_mix(value_words(values)), offsets - first)
    elif pa.types.is_fixed_size_list(t):
        size = t.list_size
        _lists_of_a_size_into(array.values.slice(array.offset * size, n * size), size, out)
    elif pa.types.is_struct(t):
        words = np.full(n, np.uint64(t.num_fields), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for child in array.flatten():
                words = _mix(words * _GOLDEN + value_words(child))
        out[:] = words
    else:
        raise TypeError(f"unsupported Arrow type {t}")
    if array.null_count:
        valid = np.unpackbits(_buffer_bytes(array.buffers()[0]), bitorder="little")[array.offset : array.offset + n]
        np.copyto(out, _NULL, where=valid == 0)
    return out


def _buffer_bytes(buffer: pa.Buffer | None) -> np.ndarray:
    return np.zeros(0, dtype=np.uint8) if buffer is None else np.frombuffer(buffer, dtype=np.uint8)


def _fixed_width_bytes(array: pa.Array) -> np.ndarray:
    """The value bytes of a fixed-width array, offset applied."""
    width = array.type.bit_width // 8
    return _buffer_bytes(array.buffers()[1])[array.offset * width : (array.offset + len(array)) * width]


def _wide_words(rows: np.ndarray) -> np.ndarray:
    """A strong hash of each row of a (n, width) byte matrix, for values wider than 8 bytes."""
    words = np.zeros((len(rows), -(-rows.shape[1] // 8) * 8), dtype=np.uint8)
    words[:, : rows.shape[1]] = rows
    h = np.zeros(len(rows), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for word in words.view("<u8").T:
            h = _mix(h * _GOLDEN + word)
    return h


# Elements of fixed-size lists hashed at a time: a block's words and their hashes stay in the caches
FIXED_LIST_BLOCK = 2**15


def _lists_of_a_size_into(values: pa.Array, size: int, out: np.ndarray) -> None:
    """``_sequence_hashes`` of lists of ``size`` elements each (vectors), of ``values`` in order, into ``out``:
    the same hashes, taken in blocks of rows whose elements stay in the caches, each list a row of a block and
    each position a column (where offsets, positions and prefix sums over every element made a vector column
    13 passes over memory: 72 MiB/s of 768 floats a row)."""
    with np.errstate(over="ignore"):
        positions = np.arange(size, dtype=np.uint64) * _M1
        length = np.uint64(size) * _M2
        rows = max(1, FIXED_LIST_BLOCK // max(size, 1))
        for start in range(0, len(out), rows):
            stop = min(start + rows, len(out))
            elements = _mix(value_words(values.slice(start * size, (stop - start) * size)).reshape(stop - start, size))
            elements += positions
            _mix_in_place(elements, np.empty_like(elements))
            out[start:stop] = _mix(elements.sum(axis=1, dtype=np.uint64) + length)


def _sequence_hashes(element_hashes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Hash of each list element_hashes[offsets[i]:offsets[i+1]], order-sensitive."""
    start = offsets[0]
    lengths = np.diff(offsets)
    elements = element_hashes[start : offsets[-1]]
    position = np.arange(len(elements), dtype=np.int64) - np.repeat(offsets[:-1] - start, lengths)
    with np.errstate(over="ignore"):
        contributions = _mix(elements + position.astype(np.uint64) * _M1)
    return _mix(_segment_sums(contributions, offsets - start) + lengths.astype(np.uint64) * _M2)


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Wrapping sums of values[offsets[i]:offsets[i+1]], empty segments included."""
    with np.errstate(over="ignore"):
        cumulative = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(values, dtype=np.uint64)])
        return cumulative[offsets[1:]] - cumulative[offsets[:-1]]
