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

import numpy as np
import pyarrow as pa

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_NULL = np.uint64(0x6A09E667F3BCC909)
_MASK = (1 << 64) - 1


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

    >>> import pyarrow as pa
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
        return {"rows": self.rows, "sum": f"{self.sum:016x}", "xor": f"{self.xor:016x}"}

    @classmethod
    def from_json(cls, data: dict) -> Fingerprint:
        return cls(int(data["rows"]), int(data["sum"], 16), int(data["xor"], 16))

    def __str__(self) -> str:
        return f"{self.rows:,} rows, sum {self.sum:016x}, xor {self.xor:016x}"


def total(parts) -> Fingerprint:
    result = Fingerprint()
    for part in parts:
        result = result + part
    return result


def of(data: pa.Table | pa.RecordBatch) -> Fingerprint:
    """The fingerprint of the rows of a table or record batch."""
    hashes = row_hashes(data)
    with np.errstate(over="ignore"):
        return Fingerprint(len(hashes), int(hashes.sum(dtype=np.uint64)), int(np.bitwise_xor.reduce(hashes, initial=0)))


def row_hashes(data: pa.Table | pa.RecordBatch) -> np.ndarray:
    """One uint64 hash per row, combining every column in order."""
    h = np.zeros(data.num_rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i, name in enumerate(data.column_names):
            column = data.column(i)
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
            try:
                values = np.concatenate([array_hashes(c) for c in chunks]) if chunks else h[:0]
            except TypeError as e:
                raise TypeError(f"cannot fingerprint column {name!r}: {e}") from e
            h = _mix(h * _GOLDEN + values + np.uint64(i))
    return h


def array_hashes(array: pa.Array) -> np.ndarray:
    """One uint64 hash per element of an Arrow array (any offset, nulls included)."""
    n = len(array)
    t = array.type
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    if pa.types.is_null(t) or array.null_count == n:
        return np.full(n, _NULL, dtype=np.uint64)
    if pa.types.is_dictionary(t):
        values = array_hashes(array.dictionary)
        indices = array.indices.fill_null(0).to_numpy(zero_copy_only=False)
        h = values[indices] if len(values) else np.zeros(n, dtype=np.uint64)
    elif pa.types.is_boolean(t):
        h = _mix(array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64) + np.uint64(1))
    elif pa.types.is_floating(t):
        h = _float_hashes(array)
    elif pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        offsets = np.arange(n + 1, dtype=np.int64) * width
        data = _buffer_bytes(array.buffers()[1])[array.offset * width : (array.offset + n) * width]
        h = _variable_width_hashes(data, offsets)
    elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        offset_type = np.int64 if (pa.types.is_large_string(t) or pa.types.is_large_binary(t)) else np.int32
        offsets = np.frombuffer(array.buffers()[1], dtype=offset_type)[array.offset : array.offset + n + 1]
        data = _buffer_bytes(array.buffers()[2])
        h = _variable_width_hashes(data, offsets.astype(np.int64))
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        h = _sequence_hashes(array_hashes(array.values), offsets)
    elif pa.types.is_fixed_size_list(t):
        size = t.list_size
        child = array.values.slice(array.offset * size, n * size) if array.offset else array.values
        h = _sequence_hashes(array_hashes(child)[: n * size], np.arange(n + 1, dtype=np.int64) * size)
    elif _is_fixed_width(t):  # integers, decimals, dates, times, timestamps, durations
        h = _fixed_width_hashes(array, t.bit_width // 8)
    elif pa.types.is_struct(t):
        h = np.full(n, np.uint64(t.num_fields), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for i, child in enumerate(array.flatten()):
                h = _mix(h * _GOLDEN + array_hashes(child) + np.uint64(i))
    else:
        raise TypeError(f"unsupported Arrow type {t}")
    if array.null_count:
        h = np.where(array.is_null().to_numpy(zero_copy_only=False), _NULL, h)
    return h


def _is_fixed_width(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_decimal(t) or (pa.types.is_temporal(t) and not pa.types.is_interval(t))


def _buffer_bytes(buffer: pa.Buffer | None) -> np.ndarray:
    return np.zeros(0, dtype=np.uint8) if buffer is None else np.frombuffer(buffer, dtype=np.uint8)


def _fixed_width_hashes(array: pa.Array, width: int) -> np.ndarray:
    raw = _buffer_bytes(array.buffers()[1])[array.offset * width : (array.offset + len(array)) * width]
    if width in (1, 2, 4, 8):
        return _mix(raw.view(f"<u{width}").astype(np.uint64) + _GOLDEN)
    words = np.zeros((len(array), -(-width // 8) * 8), dtype=np.uint8)
    words[:, :width] = raw.reshape(len(array), width)
    h = np.zeros(len(array), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for word in words.view("<u8").T:
            h = _mix(h * _GOLDEN + word)
    return h


def _float_hashes(array: pa.Array) -> np.ndarray:
    values = array.fill_null(0).to_numpy(zero_copy_only=False)
    width = values.dtype.itemsize
    bits = values.view(f"<u{width}").astype(np.uint64)
    bits[np.isnan(values)] = np.uint64(0x7FF8000000000000)  # one NaN, whatever its payload
    return _mix(bits + _GOLDEN)


def _variable_width_hashes(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Hash of each byte string data[offsets[i]:offsets[i+1]].

    Works on 8-byte words counted from the start of each string, so the cost
    is per word, not per byte, and a string hashes the same wherever it sits
    in the buffer.
    """
    lengths = np.diff(offsets)
    words_per_row = (lengths + 7) >> 3
    word_starts = np.cumsum(words_per_row) - words_per_row
    word_index = np.arange(int(words_per_row.sum()), dtype=np.int64) - np.repeat(word_starts, words_per_row)
    byte_offset = np.repeat(offsets[:-1], words_per_row) + (word_index << 3)
    remaining = np.repeat(lengths, words_per_row) - (word_index << 3)

    # An unaligned 8-byte load, built from the two aligned words it straddles.
    padded = np.zeros((len(data) + 23) // 8 * 8, dtype=np.uint8)
    padded[: len(data)] = data
    aligned = padded.view("<u8")
    shift = ((byte_offset & 7) << 3).astype(np.uint64)
    low = aligned[byte_offset >> 3] >> shift
    high = np.where(shift == 0, np.uint64(0), aligned[(byte_offset >> 3) + 1] << (np.uint64(64) - shift))
    keep = np.where(
        remaining >= 8, np.uint64(_MASK), (np.uint64(1) << (np.minimum(remaining, 7) * 8).astype(np.uint64)) - 1
    )
    with np.errstate(over="ignore"):
        contributions = _mix(((low | high) & keep) + word_index.astype(np.uint64) * _M1)
        row_offsets = np.concatenate([[0], np.cumsum(words_per_row)])
        return _mix(_segment_sums(contributions, row_offsets) + lengths.astype(np.uint64) * _GOLDEN)


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
