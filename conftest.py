"""What the docstring examples run against (``pytest --doctest-modules daskpile``).

Each example runs in a fresh directory holding ``data/`` (30,000 rows sorted by ``id``, in 3
Parquet files, with ``label`` 0 then 1) and ``shuffled/`` (``shuffle_parquet("data/",
"shuffled/", piles=4, seed=1)``), on Dask's threaded scheduler.  The examples of
``daskpile.window`` have ``day-1/`` and ``day-2/`` (10,000 rows each, ids going on) and ``window/``:
``data/`` shuffled, then ``day-1/`` appended (generations 0 and 1). So the examples of the API
reference run as written; only those that need an object store or a cluster are skipped.
"""

import importlib.util

import pytest

# daskpile.torch imports torch, an optional extra (make test-torch installs it).
collect_ignore = [] if importlib.util.find_spec("torch") else ["daskpile/torch.py"]


@pytest.fixture(autouse=True)
def _docstring_example_directory(request, tmp_path, monkeypatch, doctest_namespace):
    if not isinstance(request.node, pytest.DoctestItem):
        yield
        return
    import dask

    from daskpile import shuffle_parquet
    from daskpile.datasets import write_reference_dataset

    write_reference_dataset(str(tmp_path / "data"), rows=30_000, files=3)
    monkeypatch.chdir(tmp_path)
    with dask.config.set(scheduler="threads"):
        shuffle_parquet("data/", "shuffled/", piles=4, seed=1)
        if request.node.name.startswith("daskpile.window"):
            _window_examples(tmp_path)
        yield


def _window_examples(directory) -> None:
    import pyarrow.parquet as pq

    import daskpile
    from daskpile.datasets import reference_table

    for day in (1, 2):
        (directory / f"day-{day}").mkdir()
        pq.write_table(reference_table(20_000 + 10_000 * day, 30_000 + 10_000 * day, 10**9),
                       directory / f"day-{day}" / "part.parquet")  # fmt: skip
    daskpile.shuffle_parquet("data/", "window/", piles=4, seed=1)
    daskpile.append("window/", "day-1/")
