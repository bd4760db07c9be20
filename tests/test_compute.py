"""Where tasks run: daskpile's own LocalCluster settings, and the local scheduler without distributed."""

import os
import subprocess
import sys

import dask
from distributed import Client

from daskpile._compute import local_cluster


def test_the_local_cluster_runs_without_profiler_and_malloc_trimming():
    with local_cluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        environ = client.run(lambda: dict(os.environ))
        profiling = client.run(lambda: dask.config.get("distributed.worker.profile.enabled"))
    (worker_environ,) = environ.values()
    assert "MALLOC_TRIM_THRESHOLD_" not in worker_environ
    assert worker_environ["OMP_NUM_THREADS"] == "1"  # distributed's other pre-spawn settings stay
    assert list(profiling.values()) == [False]
    assert "MALLOC_TRIM_THRESHOLD_" in dask.config.get("distributed.nanny.pre-spawn-environ")  # only for that cluster


def test_a_run_without_a_cluster_imports_neither_distributed_nor_dask_dataframe(tmp_path):
    script = f"""
import sys
import daskpile
from daskpile.datasets import write_reference_dataset
write_reference_dataset({str(tmp_path / "in")!r}, rows=1000, files=2)
report = daskpile.shuffle_parquet({str(tmp_path / "in")!r}, {str(tmp_path / "out")!r}, piles=3, seed=1)
assert report.rows == 1000
print(sorted(m for m in ("distributed", "dask.dataframe") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
