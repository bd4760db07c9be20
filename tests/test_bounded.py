"""Memory bounded by a piece of input and a pile, not by the size of a file or the dataset."""

import json
import os
import subprocess
import sys
import textwrap

import dask
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import file_bytes, read_output

import daskpile
from daskpile import _passes

ROWS_PER_GROUP = 20_000


def write_many_row_groups(path, rows: int, start: int = 0) -> None:
    rng = np.random.default_rng(start)
    table = pa.table(
        {
            "id": np.arange(start, start + rows),
            "x": rng.normal(size=rows),
            "s": pa.array([f"row {i}" for i in range(start, start + rows)]),
        }
    )
    pq.write_table(table, path, row_group_size=ROWS_PER_GROUP)


@pytest.fixture(scope="module")
def big_files(tmp_path_factory):
    source = tmp_path_factory.mktemp("bounded") / "in"
    source.mkdir()
    write_many_row_groups(source / "a.parquet", 200_000)  # 10 row groups
    write_many_row_groups(source / "b.parquet", 50_000, start=200_000)  # 3 row groups
    return str(source)


def group_bytes(path) -> int:
    return pq.read_metadata(path).row_group(0).total_byte_size


def test_row_groups_are_grouped_into_pieces(big_files):
    meta = pq.read_metadata(os.path.join(big_files, "a.parquet"))
    one = meta.row_group(0).total_byte_size
    assert _passes.row_group_pieces(meta, 10**12) == [list(range(10))]
    assert _passes.row_group_pieces(meta, int(3.5 * one)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert _passes.row_group_pieces(meta, 1) == [[g] for g in range(10)]  # never less than a row group


def test_a_file_larger_than_blocksize_is_shuffled_in_pieces(big_files, tmp_path, client):
    blocksize = 3 * group_bytes(os.path.join(big_files, "a.parquet"))
    report = daskpile.shuffle_parquet(big_files, str(tmp_path / "out"), piles=5, seed=1, blocksize=blocksize)
    out = read_output(tmp_path / "out")
    source = pa.concat_tables(pq.read_table(os.path.join(big_files, f)) for f in ["a.parquet", "b.parquet"])
    assert out.sort_by("id").equals(source)  # every row exactly once, values intact
    assert report.fingerprint is not None and daskpile.verify(big_files, str(tmp_path / "out")).ok
    # the same bytes on the local scheduler: pieces are decided by the data and blocksize, not the cluster
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(big_files, str(tmp_path / "sync"), piles=5, seed=1, blocksize=blocksize)
    assert file_bytes(tmp_path / "out") == file_bytes(tmp_path / "sync")


PEAK_SCRIPT = """
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
from daskpile import _passes, _scratch
from daskpile._storage import filesystem
path, scratch, blocksize = sys.argv[1], sys.argv[2], int(sys.argv[3])
fs, _ = filesystem(path)
run = _scratch.Scratch.create(scratch, None, 1)
result = _passes.scatter_parquet_file(fs, path, 0, 4, 1, run, pq.read_schema(path), True, blocksize=blocksize)
print(json.dumps({"peak": pa.default_memory_pool().max_memory(), "pieces": result.pieces, "rows": result.rows}))
"""


def scatter_peak(path, scratch, blocksize) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PEAK_SCRIPT), path, scratch, str(blocksize)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def test_pass_1_memory_is_bounded_by_blocksize_not_by_the_file(big_files, tmp_path):
    """Arrow's peak allocation in a fresh process scattering one 10-row-group file, whole and in pieces."""
    path = os.path.join(big_files, "a.parquet")
    whole = scatter_peak(path, str(tmp_path / "whole"), 10**12)
    pieces = scatter_peak(path, str(tmp_path / "pieces"), group_bytes(path))
    assert whole["pieces"] == 1 and pieces["pieces"] == 10 and whole["rows"] == pieces["rows"] == 200_000
    assert pieces["peak"] < whole["peak"] / 4, (pieces, whole)
