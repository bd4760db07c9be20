import concurrent.futures
import multiprocessing
import pathlib
import shutil
import tempfile

import dask
import pytest
from _util import PROCESSES
from distributed import Client, LocalCluster


@pytest.fixture(scope="session", autouse=True)
def no_scratch_left_in_tmp():
    """Remove the default scratch directories the session's runs leave in the temporary directory.

    A run that fails or is interrupted keeps its scratch there on purpose (a rerun resumes from it), and
    its name comes from dest's path: left behind, it would meet a later session's test whose tmp_path
    happens to be the same, as an unfinished run of another source.  What is new is taken as the
    session's: two sessions at once on one machine remove each other's live scratch (runs then fail
    with FileNotFoundError in /tmp/daskpile-*), so run one at a time.
    """
    root = pathlib.Path(tempfile.gettempdir())
    before = set(root.glob("daskpile-*"))
    yield
    for path in set(root.glob("daskpile-*")) - before:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    """A real LocalCluster with two worker processes, shared by the whole session."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    with Client(cluster) as client:
        yield client


@pytest.fixture
def sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


@pytest.fixture(scope="session")
def two_processes():
    """Two fresh processes for ``_util.over_processes``, started once for the session."""
    with concurrent.futures.ProcessPoolExecutor(PROCESSES, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool
