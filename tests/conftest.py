import concurrent.futures
import multiprocessing
import multiprocessing.util
import os
import pathlib
import shutil
import tempfile

import dask
import pytest
from _util import PROCESSES
from distributed import Client, LocalCluster

# The session's temporary directory is its own: every default scratch (the system's temporary directory) is
# in it, and it goes at the end.  A run that fails or is interrupted keeps its scratch on purpose (a rerun
# resumes from it), named from dest's path: left in /tmp, it would meet a later session's test whose tmp_path
# happens to be the same.  Set before anything reads it (the cluster's workers and the command's subprocesses
# inherit TMPDIR); not named daskpile-*, which is scratch.  pytest's tmp_paths stay where they were, kept by
# pytest's own rule (the last three sessions'), for a failed test's files to be looked at.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
SESSION_TMP = tempfile.mkdtemp(prefix="tests-of-daskpile-")
os.environ["TMPDIR"] = tempfile.tempdir = SESSION_TMP
# The directory itself goes after multiprocessing's own temporary directory in it (pymp-*), which its exit
# finalizer (priority -100) removes and would find gone
multiprocessing.util.Finalize(None, shutil.rmtree, (SESSION_TMP,), {"ignore_errors": True}, exitpriority=-200)


@pytest.fixture(scope="session", autouse=True)
def no_scratch_left_in_tmp():
    """Remove what the session left in its temporary directory: the scratch its runs left.

    Only the session's: another process's live scratch in /tmp (a notebook's shuffle, another session) is
    never touched, as a sweep of every new /tmp/daskpile-* did.
    """
    yield
    for path in pathlib.Path(SESSION_TMP).iterdir():
        if not path.name.startswith("pymp-"):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


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
