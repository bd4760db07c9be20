import concurrent.futures
import multiprocessing

import dask
import pytest
from _util import PROCESSES
from distributed import Client, LocalCluster


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
