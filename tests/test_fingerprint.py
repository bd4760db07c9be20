import datetime
import decimal
import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _util import every_type_table

from daskpile import _kernels
from daskpile.checks import _fingerprint
from daskpile.checks._fingerprint import Fingerprint


@pytest.fixture(scope="module")
def table():
    return every_type_table(500)


def test_order_and_chunking_do_not_matter(table):
    f = _fingerprint.of(table)
    assert f.rows == 500
    shuffled = table.take(np.random.default_rng(0).permutation(500))
    assert _fingerprint.of(shuffled) == f
    rechunked = pa.concat_tables([table.slice(0, 7), table.slice(7, 300), table.slice(307)])
    assert _fingerprint.of(rechunked) == f
    assert _fingerprint.of(table.combine_chunks()) == f
    assert _fingerprint.of(table.slice(100)) + _fingerprint.of(table.slice(0, 100)) == f
    assert _fingerprint.of(table.combine_chunks().to_batches()[0]) == f


def test_a_value_hashes_the_same_wherever_it_sits():
    values = ["", "a", "ab", "abcdefgh", "abcdefghi", "x" * 100, None]
    alone = [_fingerprint.value_words(pa.array([v]))[0] for v in values]
    for pad in range(9):
        padded = pa.array(["y" * pad, *values])
        assert _fingerprint.value_words(padded)[1:].tolist() == alone
        assert _fingerprint.value_words(padded.slice(1)).tolist() == alone
    assert len(set(alone)) == len(values)


def test_nulls_nan_and_dictionaries_hash_by_value():
    nan_payload = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)
    assert _fingerprint.of(pa.table({"f": pa.array(nan_payload)})) == _fingerprint.of(pa.table({"f": [float("nan")]}))
    # A null hashes alike whatever bytes lie under it.
    under_a = pa.array([5, 1], mask=np.array([True, False]))
    under_b = pa.array([9, 1], mask=np.array([True, False]))
    assert _fingerprint.value_words(under_a).tolist() == _fingerprint.value_words(under_b).tolist()
    plain = pa.array(["a", "b", None, "a"])
    assert _fingerprint.value_words(plain.dictionary_encode()).tolist() == _fingerprint.value_words(plain).tolist()
    other_dictionary = pa.DictionaryArray.from_arrays(pa.array([1, 0, None, 1]), pa.array(["b", "a"]))
    assert _fingerprint.value_words(other_dictionary).tolist() == _fingerprint.value_words(plain).tolist()


def test_any_changed_value_lost_or_duplicated_row_changes_it(table):
    """Teeth: the fingerprint must notice each kind of damage, in every column."""
    f = _fingerprint.of(table)
    assert _fingerprint.of(table.slice(1)) != f
    assert _fingerprint.of(pa.concat_tables([table, table.slice(3, 1)])) != f
    # Swap one row's value with another row's, column by column: rows change, counts do not.
    for name in table.column_names:
        values = table[name].combine_chunks()
        if values.null_count == len(values):
            continue
        i = 1  # row 1 is not null in any column
        j = next(k for k in range(2, len(values)) if values[k] != values[i] and values[k].is_valid)
        idx = np.arange(len(values))
        idx[i] = j
        damaged = table.set_column(table.column_names.index(name), name, values.take(idx))
        assert _fingerprint.of(damaged) != f, name


def test_swapping_values_between_columns_changes_it():
    a = pa.table({"x": [1, 2], "y": [2, 1]})
    b = pa.table({"x": [1, 1], "y": [2, 2]})
    assert _fingerprint.of(a) != _fingerprint.of(b)


def test_json_round_trip():
    f = Fingerprint(3, 2**64 - 1, 12345)
    assert Fingerprint.from_json(f.to_json()) == f


def test_unsupported_type_names_the_column():
    table = pa.table({"ok": [1], "weird": pa.array([(1, 2, 3)], pa.month_day_nano_interval())})
    with pytest.raises(TypeError, match="weird"):
        _fingerprint.of(table)


@pytest.mark.parametrize("string_type", [pa.string(), pa.large_string(), pa.binary()])
def test_block_path_is_position_independent_for_long_and_short_strings(string_type):
    values = ["", "a", "abcdefgh", "abcdefghi", "x" * 31, "y" * 33, "z" * 1000, None]
    rows = [_fingerprint.row_hashes(pa.table({"s": pa.array([v], string_type)}))[0] for v in values]
    assert len(set(rows)) == len(values)
    for pad in range(1, 10):
        table = pa.table({"s": pa.array(["p" * pad * 7, *values], string_type)})
        assert _fingerprint.row_hashes(table)[1:].tolist() == rows
        assert _fingerprint.row_hashes(table.slice(1)).tolist() == rows


def test_blocks_do_not_change_the_result(monkeypatch):
    table = pa.table(
        {
            "s": [f"value-{i}" * (i % 9) for i in range(5000)],
            "i": range(5000),
            "l": [list(range(i % 7)) for i in range(5000)],
        }
    )
    whole = _fingerprint.of(table), _fingerprint.of_columns(table)
    monkeypatch.setattr(_fingerprint, "BLOCK_ROWS", 333)
    assert (_fingerprint.of(table), _fingerprint.of_columns(table)) == whole
    monkeypatch.setattr(_fingerprint, "BLOCK_BYTES", 1000)  # blocks cut by the bytes of their values too
    assert len(list(_fingerprint._blocks(table))) > 5000 * 8 // 1000
    assert (_fingerprint.of(table), _fingerprint.of_columns(table)) == whole


@pytest.mark.parametrize("block", [2**15, 7, 1])
def test_fixed_size_lists_hash_as_lists_of_their_size_do(monkeypatch, block):
    """Vectors, and lists all of one size, are hashed in blocks of rows (``_lists_of_a_size_into``), by the
    formula of every list: a result verified before keeps its fingerprint."""
    monkeypatch.setattr(_fingerprint, "FIXED_LIST_BLOCK", block)
    rng = np.random.default_rng(0)
    values = rng.standard_normal(300 * 4).astype(np.float32)
    values[[5, 17]] = np.nan
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(values, mask=np.arange(len(values)) % 97 == 3), 4)
    vectors = pa.array([None if i % 50 == 1 else v for i, v in enumerate(vectors.to_pylist())], vectors.type)
    grids = pa.array([[[i, -i]] * 3 for i in range(300)], pa.list_(pa.list_(pa.int16(), 2), 3))
    empty = pa.array([[]] * 300, pa.list_(pa.int8(), 0))
    lists = pa.array(values.reshape(-1, 4).tolist(), pa.list_(pa.float32()))
    nested = pa.array([[[i, -i]] * 3 for i in range(300)], pa.list_(pa.list_(pa.int16())))
    cases = (vectors, vectors.slice(13, 200), grids.slice(7), empty, lists.slice(3), nested, pa.array([[1.5], None]))
    for array in cases:
        if pa.types.is_fixed_size_list(array.type):
            size = array.type.list_size
            child, offsets = (
                array.values.slice(array.offset * size, len(array) * size),
                np.arange(len(array) + 1) * size,
            )
        else:
            offsets = np.asarray(array.offsets)
            child, offsets = array.values.slice(offsets[0], offsets[-1] - offsets[0]), offsets - offsets[0]
        expected = _fingerprint._sequence_hashes(_fingerprint._mix(_fingerprint.value_words(child)), offsets)
        expected[np.asarray(array.is_null())] = _fingerprint._NULL
        assert _fingerprint.value_words(array).tolist() == expected.tolist()


def test_each_column_s_fingerprint_cuts_the_table_in_blocks_once(monkeypatch):
    """Cut again for each column, by a look at every column's bytes: a table's columns were looked at as many
    times as it has columns (verify of 2,001 columns took 80 s, against 12 s)."""
    table = pa.table({f"s{i}": [f"value-{j}" for j in range(1000)] for i in range(50)})
    looks = []
    measure = _fingerprint._value_bytes
    monkeypatch.setattr(_fingerprint, "_value_bytes", lambda data: looks.append(1) or measure(data))
    assert len(_fingerprint.of_columns(table)) == 50 and len(looks) == 1


def test_a_block_of_large_values_is_cut_by_their_bytes():
    """Blocks of 32,768 rows whatever they held: a block of 1 MB images padded a copy of all of them."""
    table = pa.table({"id": range(40), "image": pa.array([b"x" * 2**20] * 40, pa.binary())})
    blocks = list(_fingerprint._blocks(table))
    assert sum(rows for _, rows in blocks) == 40 and max(rows for _, rows in blocks) <= 8
    assert [start for start, _ in blocks] == list(itertools.accumulate([0] + [rows for _, rows in blocks[:-1]]))


def test_a_slice_of_a_list_column_hashes_the_items_of_its_rows_only(monkeypatch):
    """A slice's ``values`` are the whole child's: each block hashed every item of the column (1 M rows of
    ten numbers, 31 blocks: 3.8 s, against 0.35)."""
    lists = pa.array([[i] * 10 for i in range(100_000)])
    seen = []
    value_words = _fingerprint.value_words

    def counting(array, ws=None):
        seen.append(len(array))
        return value_words(array, ws)

    monkeypatch.setattr(_fingerprint, "value_words", counting)
    part = lists.slice(500, 20)
    assert counting(part).tolist() == value_words(pa.array([[i] * 10 for i in range(500, 520)])).tolist()
    assert seen[:2] == [20, 200]  # the slice, then its 200 items


@pytest.mark.parametrize("string_type", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_short_strings_hash_the_same_on_the_view_path(string_type):
    # Blocks whose strings are all <= 12 bytes are hashed from Arrow string views; a block with one
    # longer string takes the general path.  Both must give every string the same hash.
    rng = np.random.default_rng(7)
    values = ["".join(map(chr, rng.integers(33, 127, size=rng.integers(0, 13)))) for _ in range(2000)]
    values[5] = None
    short = pa.array(values, string_type).slice(3)
    assert _fingerprint.INLINE_STRING_BYTES == 12 and max(len(v or "") for v in values) == 12
    forced_general = pa.concat_arrays([short, pa.array(["l" * 13], string_type)])
    assert _fingerprint.value_words(short).tolist() == _fingerprint.value_words(forced_general)[:-1].tolist()


# The fingerprints of HASH_VERSION 5, pinned: resume and verify compare fingerprints written by other
# runs, so a change to the row hash that keeps the version number would report false mismatches (or
# reuse stale work).  If this fails on purpose, bump HASH_VERSION and pin the new values.  (Version 5
# changed only times past int64 nanoseconds, which these columns do not hold: its values are version 4's.)
HASH_VERSION_5 = {
    "id": "a68dc75ebb3e26c4 38154fa08ff6feae",
    "i8": "dffe393a7f650389 a84e312f04d70617",
    "i32": "80bd0728e65f1c01 b03f33d93bac9509",
    "u8": "25db07e3b4aae569 e5a678893391193b",
    "u64": "167bec34d28d609b 57d2eaf1cd20d80d",
    "nullable_int": "8e657e35b9a2765a 0458ccf5e043a2a0",
    "f32": "7df4ec5abc80c912 d652236433b8d820",
    "f64_nan": "594dcb86dd645965 75f12d804b217a0d",
    "flag": "ca99ff5526bfcc6e eeb68caef7350b9c",
    "s": "473ef238f9b0fb96 f9c09f48bc9400f2",
    "ls": "0993410ef1098c14 76a33f3144cb8b54",
    "bin": "31dd21a377a19a3d 072134bea1cdf2c7",
    "ts": "19f680070550dd80 03ee2ff438fcf728",
    "ts_tz": "86fa86cc4514e299 4142aa6439e5b7fb",
    "dec": "2fe243c6224d4228 a91ac5b2c5f5bf16",
    "cat": "8b81397a48c6eac9 4adb6145d7811e59",
    "lst": "981f0605fb285d94 1f58975bf7dda5d8",
    "st": "e6cd806091c58595 38567b7ec38110c3",
    "all_null": "48b000e49ed4b6f8 0000000000000000",
    "long": "d2ef957691199116 77e6b36a3699a804",  # 1 to 43 bytes: the inline, word and tail paths
    "*": "771540392ec54eef 3610522cdf2b22d9",  # every column of the table, in order
}


def test_the_row_hash_of_a_version_never_changes(table):
    assert _fingerprint.HASH_VERSION == 5
    table = table.append_column("long", pa.array(["x" * (i % 41) + str(i) for i in range(500)]))
    found = {name: _fingerprint.of(table.select([name])) for name in HASH_VERSION_5 if name != "*"}
    found["*"] = _fingerprint.of(table)
    assert {name: f"{f.sum:016x} {f.xor:016x}" for name, f in found.items()} == HASH_VERSION_5


def test_long_strings_hash_the_same_whatever_the_chunks_of_their_tails(monkeypatch):
    """Tails are hashed in chunks of rows to stay in cache; the chunking must not change a hash."""
    rng = np.random.default_rng(3)
    values = [bytes(rng.integers(0, 256, size=int(n), dtype=np.uint8)) for n in rng.integers(0, 600, size=20_000)]
    table = pa.table({"b": pa.array(values, pa.binary()), "s": pa.array([v.hex() for v in values])})
    chunked = _fingerprint.of(table)
    monkeypatch.setattr(_fingerprint, "TAIL_WORDS", 2**40)
    assert _fingerprint.of(table) == chunked
    monkeypatch.setattr(_fingerprint, "TAIL_WORDS", 1)
    assert _fingerprint.of(table) == chunked


@pytest.mark.parametrize("tail_words", [1, 3, 2**16])
def test_a_string_hashes_alike_alone_and_among_others_empty_ones_included(monkeypatch, tail_words):
    """Each string's words are summed over its own segment of the step's words: an empty string (no
    words, its segment starting where the next string's does, or past the last word) must add nothing."""
    monkeypatch.setattr(_fingerprint, "TAIL_WORDS", tail_words)
    values = [b"", b"a" * 17, b"", b"", b"b" * 9, b"c" * 40, b"", b"d" * 8, b"", b""]
    together = _fingerprint.value_words(pa.array(values, pa.binary())).tolist()
    alone = [_fingerprint.value_words(pa.array([v, b"e" * 13], pa.binary()))[0] for v in values]
    assert together == alone


def test_strings_near_2_gib_hash_as_their_large_type(monkeypatch):
    """Padding each string to whole words adds up to 7 bytes a string: past int32 offsets, the large type."""
    values = ["x" * 20, "yz" * 30, None, "w" * 13]
    expected = _fingerprint.value_words(pa.array(values, pa.large_string())).tolist()
    spy = _PaddedSpy(_fingerprint._padded_to_words)
    monkeypatch.setattr(_fingerprint, "_padded_to_words", spy)
    small = pa.array(values, pa.string())
    assert _fingerprint.value_words(small).tolist() == expected
    assert spy.types == [pa.string()]
    # as if the values were 2 GiB: the check compares the data's span, plus the pads, to _kernels.OFFSETS_LIMIT
    monkeypatch.setattr(_kernels, "OFFSETS_LIMIT", 99)
    assert _fingerprint.value_words(small).tolist() == expected
    assert spy.types[-1] == pa.large_string()


@pytest.mark.parametrize(
    "a,b",
    [
        (b"abcdefghabcdefg\0", b"abcdefgh`bcdefg"),  # a length against word 1
        (b"abc!xyz!abcaxyza", b"abcaxyzaabc!xyz!"),  # two words swapped, differing in their top bits only
        (b"abcDefgHxxxxxxxxabcdefgh", b"abcdefghxxxxxxxxabcDefgH"),  # case flips moved two words on
        (b"abc\xe9" * 4, b"abci" * 4),  # bit 7 of bytes 3 and 7 of two words
    ],
)
def test_structured_changes_change_the_hash(a, b):
    """Differences confined to a word's top bits are where a sum of multiplied words is weakest."""
    words = _fingerprint.value_words(pa.array([a, b], pa.binary()))
    assert words[0] != words[1]


def test_case_flips_in_words_apart_change_the_hash():
    """Bytes i and i + 4 of one word upper-cased, or of another word 1 or 2 words on: 0 of 20,000 hash alike."""
    rng = np.random.default_rng(11)
    lower = rng.integers(ord("a"), ord("z") + 1, size=(20_000, 48), dtype=np.uint8)
    one, other = lower.copy(), lower.copy()
    rows = np.arange(len(lower))
    first, distance = rng.integers(0, 3, size=len(lower)), rng.integers(1, 3, size=len(lower))
    byte = rng.integers(0, 4, size=len(lower))
    for shift in (0, 4):
        one[rows, 8 * first + byte + shift] ^= 0x20
        other[rows, 8 * (first + distance) + byte + shift] ^= 0x20
    a = _fingerprint.value_words(pa.array([bytes(r) for r in one], pa.binary()))
    b = _fingerprint.value_words(pa.array([bytes(r) for r in other], pa.binary()))
    assert not (a == b).any()


def test_a_line_longer_than_the_shared_powers_does_not_grow_them():
    """Powers for a step longer than the shared tables are the step's own: kept, they would pin twice the line."""
    shared = len(_fingerprint._POWERS.up)
    long_line = pa.array([b"x" * (8 * shared + 100), b"short but over twelve"], pa.binary())
    expected = _fingerprint.value_words(long_line).tolist()
    assert len(_fingerprint._POWERS.up) == shared
    # the same hash as if the powers were shared: a table's first entries are the same whatever its length
    assert _fingerprint._Powers(8).up.tolist() == _fingerprint._POWERS.up[:8].tolist()
    assert expected[1] == _fingerprint.value_words(pa.array([b"short but over twelve"], pa.binary()))[0]


class _PaddedSpy:
    def __init__(self, wrapped):
        self.wrapped, self.types = wrapped, []

    def __call__(self, array, lengths):
        self.types.append(array.type)
        return self.wrapped(array, lengths)


@pytest.mark.parametrize(
    ("values", "kinds"),
    [
        (pa.array([1_577_840_523_456_789, None, -300_000_000], pa.timestamp("us", "UTC")), ["ns"]),
        (pa.array([1_577_840_523, None, -3], pa.timestamp("s")), ["ms", "us", "ns"]),
        (pa.array([5, None, -3], pa.duration("ms")), ["us", "ns"]),
        (pa.array([3_723, None], pa.time32("s")), ["ms"]),
    ],
    ids=["timestamp", "timestamp-s", "duration", "time"],
)
def test_a_time_hashes_alike_in_every_unit_that_holds_it(values, kinds):
    """Version 4: a result rewritten with its times in another unit (a tool that writes nanoseconds) holds the
    same instants, and verify said its values differ.  Another instant still differs."""
    unit = values.type.unit
    for kind in kinds:
        other = pa.timestamp(kind, values.type.tz) if pa.types.is_timestamp(values.type) else None
        other = other or (pa.duration(kind) if pa.types.is_duration(values.type) else pa.time32(kind))
        assert _fingerprint.of(pa.table({"t": values.cast(other)})) == _fingerprint.of(pa.table({"t": values})), unit
    integers = pa.int64() if values.type.bit_width == 64 else pa.int32()
    moved = pa.compute.add(values.cast(integers), pa.scalar(1, integers)).cast(values.type)
    assert _fingerprint.of(pa.table({"t": moved})) != _fingerprint.of(pa.table({"t": values}))


def test_a_time_past_int64_nanoseconds_hashes_alike_in_every_unit_and_unlike_its_wrapped_value():
    """Version 5: Spark's 0001-01-01 and 9999-12-31 (INT96), or year 3000 in microseconds, hashed as their
    nanoseconds wrapped in 64 bits: alike the instants pyarrow reads them as (1754-08-30, 1816-03-29), so a
    result holding those passed verify."""
    instants = [datetime.datetime(1, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59, 999_999),
                datetime.datetime(3000, 1, 1, 0, 0, 1, 250_000), datetime.datetime(2024, 1, 1), None]  # fmt: skip
    us = pa.array(instants, pa.timestamp("us"))
    for kind in ("ms", "s"):
        kept = pc.cast(us, pa.timestamp(kind), safe=False)  # (whole seconds, or milliseconds, of each)
        back = kept.cast(pa.timestamp("us"))
        assert _fingerprint.value_words(kept).tolist() == _fingerprint.value_words(back).tolist(), kind
    nanoseconds = us.cast(pa.int64()).fill_null(0).to_numpy() * np.int64(1000)  # wrapped, as pyarrow reads INT96
    wrapped = pa.array(nanoseconds, mask=us.is_null().to_numpy(zero_copy_only=False)).cast(pa.timestamp("ns"))
    mine, theirs = _fingerprint.value_words(us), _fingerprint.value_words(wrapped)
    assert [a == b for a, b in zip(mine.tolist(), theirs.tolist(), strict=True)] == [False, False, False, True, True]
    late = pa.array([instants[1]], pa.timestamp("us"))
    assert _fingerprint.value_words(late) != _fingerprint.value_words(pc.add(late, pa.scalar(1, pa.duration("us"))))
    durations = pa.array([10**17, -(10**17)], pa.duration("us"))  # three thousand years, each way
    assert (
        _fingerprint.value_words(durations).tolist()
        == _fingerprint.value_words(durations.cast(pa.duration("ms"))).tolist()
    )


def test_a_decimal_hashes_alike_in_every_width_that_holds_it():
    values = pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-99.01")], pa.decimal128(10, 2))
    for kind in (pa.decimal32(9, 2), pa.decimal64(10, 2), pa.decimal256(10, 2), pa.decimal128(20, 2)):
        assert _fingerprint.of(pa.table({"d": values.cast(kind)})) == _fingerprint.of(pa.table({"d": values}))
    rescaled = values.cast(pa.decimal128(11, 3))  # another scale: the same numbers, other values to Arrow
    assert _fingerprint.of(pa.table({"d": rescaled})) != _fingerprint.of(pa.table({"d": values}))
