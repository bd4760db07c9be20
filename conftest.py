"""What the docstring examples run against (``pytest --doctest-modules daskpile``).

Each example runs in a fresh directory holding ``data/`` (30,000 rows sorted by ``id``, in 3
Parquet files, with ``label`` 0 then 1) and ``shuffled/`` (``shuffle_parquet("data/",
"shuffled/", piles=4, seed=1)``), on Dask's threaded scheduler. So the examples of the API
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
        yield
