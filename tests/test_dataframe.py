import gc
import os

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

import daskpile


def frame(rows: int) -> pd.DataFrame:
    i = np.arange(rows)
    return pd.DataFrame(
        {
            "i8": (i % 100).astype("int8"),
            "u64": i.astype("uint64"),
            "nullable": pd.array(np.where(i % 7 == 0, None, i), dtype="Int32"),
            "f": np.where(i % 5 == 0, np.nan, i / 3),
            "b": i % 2 == 0,
            "s": [f"s{x}" for x in i],
            "cat": pd.Categorical([f"c{x % 3}" for x in i], categories=["c2", "c0", "c1"]),
            "when": pd.date_range("2024-01-01", periods=rows, freq="min", tz="UTC"),
        },
        index=pd.Index(i * 10, name="key"),
    )


def test_partitions_are_piles_and_rows_keep_their_index(client):
    df = frame(1000)
    ddf = dd.from_pandas(df, npartitions=4)
    shuffled = daskpile.shuffle(ddf, piles=9, seed=3)
    assert shuffled.npartitions == 9
    out = shuffled.compute()
    assert not out.index.equals(df.index)  # really reordered
    pd.testing.assert_frame_equal(out.sort_index(), ddf.compute())
    parts = [shuffled.get_partition(j).compute() for j in range(9)]
    pd.testing.assert_frame_equal(pd.concat(parts), out)


def test_dtypes_match_meta(client):
    ddf = dd.from_pandas(frame(100), npartitions=3)
    shuffled = daskpile.shuffle(ddf, piles=2, seed=0)
    pd.testing.assert_series_equal(shuffled.dtypes, ddf.dtypes)
    pd.testing.assert_series_equal(shuffled.compute().dtypes, ddf.dtypes)


def test_after_user_transformations_and_csv(client, tmp_path):
    df = frame(300)
    df[["i8", "f", "s"]].to_csv(tmp_path / "a.csv")
    ddf = dd.read_csv(str(tmp_path / "*.csv"), blocksize=2000)
    ddf = ddf[ddf.i8 > 10].assign(g=lambda d: d.i8 * 2)
    expected = ddf.compute()
    out = daskpile.shuffle(ddf, piles=5, seed=1).compute()
    pd.testing.assert_frame_equal(out.sort_values("key").reset_index(drop=True), expected.reset_index(drop=True))


def test_read_parquet_input_to_parquet_writes_one_file_per_pile(client, tmp_path):
    frame(500).to_parquet(tmp_path / "in.parquet")
    ddf = dd.read_parquet(str(tmp_path / "in.parquet"))
    daskpile.shuffle(ddf, piles=6, seed=2).to_parquet(str(tmp_path / "out"))
    files = sorted(f for f in os.listdir(tmp_path / "out") if f.endswith(".parquet"))
    assert len(files) == 6
    back = dd.read_parquet(str(tmp_path / "out")).compute()
    pd.testing.assert_frame_equal(back.sort_index(), ddf.compute(), check_categorical=False)


def test_empty_partitions_and_empty_input(sync_scheduler):
    ddf = dd.from_pandas(frame(50), npartitions=5)
    filtered = ddf[ddf.u64 < 10]  # later partitions become empty
    out = daskpile.shuffle(filtered, piles=4, seed=0).compute()
    pd.testing.assert_frame_equal(out.sort_index(), filtered.compute())
    nothing = ddf[ddf.u64 > 10**6]
    result = daskpile.shuffle(nothing, piles=3, seed=0)
    assert result.npartitions == 3 and len(result.compute()) == 0


def test_single_row_and_more_piles_than_rows(sync_scheduler):
    one = dd.from_pandas(frame(1), npartitions=1)
    pd.testing.assert_frame_equal(daskpile.shuffle(one, piles=8, seed=0).compute(), one.compute())
    three = dd.from_pandas(frame(3), npartitions=1)
    out = daskpile.shuffle(three, piles=1, seed=0).compute()
    pd.testing.assert_frame_equal(out.sort_index(), three.compute())


def test_scratch_lives_as_long_as_the_result(sync_scheduler, tmp_path):
    ddf = dd.from_pandas(frame(100), npartitions=2)
    shuffled = daskpile.shuffle(ddf, piles=3, seed=0, scratch=str(tmp_path))
    derived = shuffled[["s"]]
    del shuffled
    gc.collect()
    assert len(derived.compute()) == 100
    (run_dir,) = list(tmp_path.iterdir())
    assert sorted(p.name for p in run_dir.iterdir()) == ["scatter-000000.arrow", "scatter-000001.arrow"]
    del derived
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_not_a_dataframe():
    with pytest.raises(TypeError, match="dask DataFrame"):
        daskpile.shuffle(pd.DataFrame({"x": [1]}), piles=2)
    with pytest.raises(ValueError, match="piles"):
        daskpile.shuffle(dd.from_pandas(frame(4), npartitions=1), piles=0)


def test_threaded_scheduler_without_a_client():
    ddf = dd.from_pandas(frame(200), npartitions=3)
    with dask.config.set(scheduler="threads"):
        out = daskpile.shuffle(ddf, piles=4, seed=0).compute()
    pd.testing.assert_frame_equal(out.sort_index(), ddf.compute(scheduler="sync"))
