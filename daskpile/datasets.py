"""A reference dataset with the strongest possible order, for demos, tests and benchmarks.

Rows are sorted by ``id``; ``label`` is 0 for the first half and 1 for the
second, so any order left over from the input shows up at once.
"""

from __future__ import annotations

import posixpath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from daskpile._storage import filesystem


def reference_table(start: int, stop: int, total: int, seed: int = 0) -> pa.Table:
    """Rows ``start`` to ``stop`` of the reference dataset of ``total`` rows.

    >>> reference_table(0, 3, 6).column("label").to_pylist()
    [0, 0, 0]
    """
    ids = np.arange(start, stop, dtype=np.int64)
    rng = np.random.default_rng([seed, start])
    return pa.table(
        {
            "id": ids,
            "label": (ids >= total // 2).astype(np.int8),
            "x": rng.standard_normal(len(ids)),
            "y": rng.uniform(size=len(ids)),
            "z": rng.standard_normal(len(ids)).astype(np.float32),
            "ts": pa.array(ids * 1_000_000 + 1_600_000_000_000_000, type=pa.timestamp("us")),
            "name": pc.binary_join_element_wise("row-", pa.array(ids).cast(pa.string()), ""),
        }
    )


def write_reference_dataset(
    dest: str, rows: int, files: int, *, seed: int = 0, storage_options: dict | None = None
) -> list[str]:
    """Write the reference dataset as ``files`` Parquet files of consecutive ids.

    >>> write_reference_dataset("/tmp/ref", rows=1_000_000, files=10)  # doctest: +SKIP
    """
    fs, path = filesystem(dest, storage_options)
    fs.makedirs(path, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    paths = []
    for k in range(files):
        file_path = posixpath.join(path, f"input-{k:05d}.parquet")
        with fs.open(file_path, "wb") as f:
            pq.write_table(reference_table(int(bounds[k]), int(bounds[k + 1]), rows, seed), f)
        paths.append(file_path)
    return paths
