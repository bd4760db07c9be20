import numpy as np
import pyarrow as pa
import pytest

from daskpile import _kernels, _random


def test_scatter_groups_rows_by_pile_and_counts_them():
    table = pa.table({"x": np.arange(1000)})
    batch, counts = _kernels.scatter(table, 7, _random.generator(1, _random.SCATTER, 0))
    assert counts.sum() == 1000 and len(counts) == 7
    seen = []
    for start, n in zip(_kernels.offsets(counts), counts, strict=False):
        pile = batch.slice(start, n).column("x").to_numpy()
        # Stable: rows keep their input order inside a pile.
        assert (np.diff(pile) > 0).all()
        seen.extend(pile.tolist())
    assert sorted(seen) == list(range(1000))


def test_scatter_is_a_pure_function_of_the_key():
    table = pa.table({"x": np.arange(500)})
    a = _kernels.scatter(table, 5, _random.generator(3, _random.SCATTER, 2))
    b = _kernels.scatter(table, 5, _random.generator(3, _random.SCATTER, 2))
    c = _kernels.scatter(table, 5, _random.generator(3, _random.SCATTER, 3))
    assert a[0].equals(b[0]) and (a[1] == b[1]).all()
    assert not a[0].equals(c[0])


@pytest.mark.parametrize("rows", [0, 1, 10])
def test_scatter_small_and_empty_tables(rows):
    table = pa.table({"x": pa.array(range(rows), pa.int64()), "s": pa.array(["a"] * rows)})
    batch, counts = _kernels.scatter(table, 4, _random.generator(0, _random.SCATTER, 0))
    assert isinstance(batch, pa.RecordBatch) and batch.num_rows == rows and counts.sum() == rows
    assert batch.schema == table.schema


def test_scatter_uses_32_bit_piles_beyond_65536():
    table = pa.table({"x": np.arange(100_000)})
    _, counts = _kernels.scatter(table, 70_000, _random.generator(0, _random.SCATTER, 0))
    assert len(counts) == 70_000 and counts.sum() == 100_000 and counts[65_536:].sum() > 0


def test_pile_draws_are_uniform():
    """Chi-square on 200k draws over 8 piles; alpha = 1e-4 with fixed seed. A skewed draw fails."""
    from scipy import stats

    table = pa.table({"x": np.arange(200_000)})
    _, counts = _kernels.scatter(table, 8, _random.generator(0, _random.SCATTER, 0))
    assert stats.chisquare(counts).pvalue > 1e-4
    skewed = counts.copy()
    skewed[0] += 1500
    skewed[1] -= 1500
    assert stats.chisquare(skewed).pvalue < 1e-4


def test_permute_is_a_permutation_keyed_by_seed():
    table = pa.table({"x": np.arange(1000)})
    a = _kernels.permute(table, _random.generator(1, _random.GATHER, 0))
    b = _kernels.permute(table, _random.generator(1, _random.GATHER, 0))
    c = _kernels.permute(table, _random.generator(2, _random.GATHER, 0))
    assert sorted(a["x"].to_pylist()) == list(range(1000))
    assert a.equals(b) and not a.equals(c)


@pytest.mark.parametrize("rows", [0, 1, 5, 100_003])
def test_a_permutation_is_numpys_drawn_in_arrows_memory(rows):
    """``_kernels.permutation`` gives ``Generator.permutation``'s numbers (the orders of every seed stay as they
    were), from Arrow's pool: a loader's order drawn from the C heap stayed in its thread's glibc arena once freed
    (the loader on B, 50-100 MiB more peak RSS), as int32: a group's order is held while its columns are taken,
    and in int64 a loader of one int64 column held it as large as the column (a trial: 9.9 piles at mix=2,
    prefetch=2, 7.9 in int32)."""
    before = pa.total_allocated_bytes()
    order = _kernels.permutation(_random.keyed(3, _random.LOAD_GROUP, 0, 0, 0), rows)
    assert order.tolist() == _random.keyed(3, _random.LOAD_GROUP, 0, 0, 0).permutation(rows).tolist()
    assert order.dtype == np.int32 and order.flags.writeable
    assert 4 * rows <= pa.total_allocated_bytes() - before < 8 * rows + 64  # (and no int64 copy left over)
    assert _kernels.as_arrow_indices(order).type == pa.int32()  # taken as they are, not copied to int64
    assert not rows or isinstance(order.base, pa.Buffer)
    # ...and the loader's orders are drawn so
    from daskpile.loader import plan

    group = plan.Group(stream=0, index=0, pieces=(plan.Piece(unit=0, start=0, stop=rows),))
    assert not rows or isinstance(plan.group_permutation(3, 0, group).base, pa.Buffer)
    assert not rows or isinstance(plan.pile_permutation(3, 0, 0, rows).base, pa.Buffer)


def test_seed_validation():
    assert isinstance(_random.resolve_seed(None), int)
    for bad in [-1, 1.5, "3", True]:
        with pytest.raises(ValueError, match="seed"):
            _random.resolve_seed(bad)


@pytest.mark.parametrize(
    "column",
    [
        pa.array(["a", None, "", "héllo", "exactly12byt", "x" * 5] * 50),
        pa.array(["thirteen bytes", "a", None] * 50),  # too long for the view path: Arrow's own take
        pa.array([b"\x00\x01", None, b"", b"\xff" * 12] * 50, pa.binary()),
        pa.array(["a", "bb", None] * 50, pa.large_string()),
        pa.array([b"a", None] * 50, pa.large_binary()),
        pa.array(["a", None, "ccc"] * 70).slice(5, 150),  # an offset into the buffers
        pa.chunked_array([["a", "bb"] * 50, [None, "ccc"] * 25, []]),  # several chunks, one empty
        pa.array([None] * 150, pa.string()),
        pa.array(["x"] * 150).dictionary_encode(),
    ],
    ids=["short", "long", "binary", "large_string", "large_binary", "sliced", "chunked", "all_null", "dictionary"],
)
@pytest.mark.parametrize("view_take_min_rows", [0, 10**9], ids=["views", "arrow"])
def test_take_is_arrows_take(column, view_take_min_rows, monkeypatch):
    monkeypatch.setattr(_kernels, "VIEW_TAKE_MIN_ROWS", view_take_min_rows)
    table = pa.table({"s": column, "i": np.arange(len(column))})
    indices = np.random.default_rng(0).permutation(len(column))
    taken = _kernels.take(table, indices)
    assert taken.schema == table.schema
    assert taken.equals(table.take(indices))
    assert _kernels.take(table.slice(0, 0), indices[:0]).num_rows == 0


def test_take_of_a_sliced_grid_of_vectors_takes_its_rows():
    """pyarrow's take of a sliced fixed-size list of fixed-size lists read the wrong rows."""
    grid = pa.array([[[i, -i]] * 3 for i in range(40)], pa.list_(pa.list_(pa.int16(), 2), 3))
    inner = pa.FixedSizeListArray.from_arrays(grid.values.slice(6, 60), 3)  # a slice of its values only
    for column in (grid.slice(7, 20), inner, pa.chunked_array([grid.slice(3, 5), grid.slice(30)])):
        indices = np.random.default_rng(0).permutation(len(column))
        expected = [column[int(i)].as_py() for i in indices]
        assert _kernels.take(pa.table({"g": column}), indices)["g"].to_pylist() == expected
        assert _kernels.TakeSource(column).take(_kernels.as_arrow_indices(indices)).to_pylist() == expected


def test_a_slice_of_a_list_column_measures_the_items_of_its_rows_only(monkeypatch):
    """A slice's ``values`` are the whole child's: each block of a fingerprint measured every item of the
    column again (lists of strings, 1 M rows: 3.5 s, quadratic, against 0.08)."""
    lists = pa.array([["ab", "cde"] * i for i in range(1000)])
    seen = []
    measure = _kernels.row_bytes

    def counting(array):
        seen.append(len(array))
        return measure(array)

    monkeypatch.setattr(_kernels, "row_bytes", counting)
    part = lists.slice(500, 3)
    assert counting(part).tolist() == [4 + 13 * i for i in (500, 501, 502)]  # an offset; 2 + 4 and 3 + 4 a pair
    assert seen == [3, 2 * (500 + 501 + 502)]  # the slice, then its items
    fixed = pa.array([["ab", "c"]] * 1000, pa.list_(pa.string(), 2)).slice(10, 3)
    seen.clear()
    assert counting(fixed).tolist() == [11] * 3 and seen == [3, 6]
