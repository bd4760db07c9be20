import numpy as np
import pyarrow as pa

from daskpile import _kernels, _random, _scratch
from daskpile._storage import filesystem


def test_one_file_per_partition_one_batch_per_pile(tmp_path):
    fs, _ = filesystem(str(tmp_path))
    table = pa.table(
        {
            "x": np.arange(100),
            "d": pa.array([f"v{i % 3}" for i in range(100)]).dictionary_encode(),
        }
    )
    grouped, counts = _kernels.scatter(table, 6, _random.generator(0, _random.SCATTER, 0))
    path = _scratch.scratch_path(str(tmp_path), 0)
    _scratch.write_piles(fs, path, grouped, counts)
    assert [p.name for p in tmp_path.iterdir()] == ["scatter-000000.arrow"]  # no temporary left behind
    rows = []
    with _scratch.PileReader(_scratch.Scratch(fs, str(tmp_path), 1)) as reader:
        for j, n in enumerate(counts):
            (batch,) = reader.pile(j)
            assert batch.num_rows == n and batch.schema == table.schema
            rows += batch.column("x").to_pylist()
    assert sorted(rows) == list(range(100))


def test_empty_piles_are_empty_batches(tmp_path):
    fs, _ = filesystem(str(tmp_path))
    table = pa.table({"x": [1, 2]})
    grouped, counts = _kernels.scatter(table, 50, _random.generator(0, _random.SCATTER, 0))
    _scratch.write_piles(fs, _scratch.scratch_path(str(tmp_path), 0), grouped, counts)
    with _scratch.PileReader(_scratch.Scratch(fs, str(tmp_path), 1)) as reader:
        assert sum(reader.pile(j)[0].num_rows for j in range(50)) == 2


def test_scratch_directory_lifetime(tmp_path):
    run = _scratch.Scratch.create(str(tmp_path), None, partitions=2)
    assert run.fs.isdir(run.directory) and run.directory.startswith(str(tmp_path))
    run.remove()
    assert list(tmp_path.iterdir()) == []
