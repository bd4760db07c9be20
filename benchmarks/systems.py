"""The systems compared by the benchmark; each runs alone in a fresh process.

    python benchmarks/systems.py SYSTEM SOURCE_DIR DEST_DIR

Prints one JSON line: the system's own timings (start-up apart from the shuffle
where it has one) and what it wrote.  The parent (run.py) measures the whole
process: wall time, CPU time and peak memory of the process tree.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

START = time.perf_counter()
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
# Memory limits for the bounded-memory runs (run.py --worker-memory / --duckdb-memory).
WORKER_MEMORY = os.environ.get("BENCH_WORKER_MEMORY", "auto")
DUCKDB_MEMORY = os.environ.get("BENCH_DUCKDB_MEMORY")


def local_cluster(secure: bool = True):
    """The cluster of every Dask system: the one the daskpile command starts (profiler and malloc trimming off).

    ``secure=False`` for the Dask DataFrame systems (p2p, ``shuffle(ddf)``): the command's cluster talks TLS,
    a notebook's plain ``LocalCluster`` does not, and p2p sends every row between the workers.
    """
    from distributed import Client

    from daskpile._compute import local_cluster as daskpile_local_cluster

    cluster = daskpile_local_cluster(
        secure, n_workers=THREADS, threads_per_worker=1, dashboard_address="127.0.0.1:0", memory_limit=WORKER_MEMORY
    )
    return cluster, Client(cluster)


def dataframe_cluster():
    """The cluster of the Dask DataFrame systems, its workers past importing dask.dataframe.

    A worker imports it with its first DataFrame task: 1.26 s on this machine, a
    cost a notebook's cluster pays once, not once per shuffle.  It counts as
    start-up, as the client's own import does; wall time includes it.
    """
    import importlib

    cluster, client = local_cluster(secure=False)
    client.run(importlib.import_module, "dask.dataframe")
    return cluster, client


def worker_restarts(client, pids_before: dict) -> int:
    """Workers whose process was replaced (the nanny restarts a worker killed for memory)."""
    return len(set(pids_before.values()) - set(client.run(os.getpid).values()))


def daskpile_parquet(source, dest, piles, threads_only=False):
    import dask

    import daskpile

    if threads_only:
        ready = time.perf_counter()
        with dask.config.set(scheduler="threads", num_workers=THREADS):
            report = daskpile.shuffle_parquet(source, dest, piles=piles, seed=1)
        return {
            "startup_s": ready - START,
            "shuffle_s": time.perf_counter() - ready,
            "scratch_bytes": report.scratch_bytes,
        }
    cluster, client = local_cluster()
    pids = client.run(os.getpid)
    ready = time.perf_counter()
    report = daskpile.shuffle_parquet(source, dest, piles=piles, seed=1)  # verified: fingerprints must match
    done = time.perf_counter()
    restarts = worker_restarts(client, pids)
    client.close()
    cluster.close()
    return {
        "startup_s": ready - START,
        "shuffle_s": done - ready,
        "scratch_bytes": report.scratch_bytes,
        "piles": report.piles,
        "worker_restarts": restarts,
    }


def daskpile_dataframe(source, dest):
    import dask.dataframe as dd

    import daskpile

    cluster, client = dataframe_cluster()
    ready = time.perf_counter()
    daskpile.shuffle(dd.read_parquet(source), piles=64, seed=1).to_parquet(dest, write_index=False)
    done = time.perf_counter()
    client.close()
    cluster.close()
    return {"startup_s": ready - START, "shuffle_s": done - ready}


def dask_p2p(source, dest):
    """What users write without daskpile (NeMo-Curator's Shuffle): random key, p2p shuffle, sample."""
    import dask.dataframe as dd
    import numpy as np

    cluster, client = dataframe_cluster()
    pids = client.run(os.getpid)
    ready = time.perf_counter()
    ddf = dd.read_parquet(source)

    def add_key(frame, partition_info=None):
        rng = np.random.default_rng([1, partition_info["number"]])
        return frame.assign(_key=rng.integers(0, 2**62, len(frame)))

    keyed = ddf.map_partitions(add_key, partition_info=True, meta={**ddf.dtypes.to_dict(), "_key": "int64"})
    shuffled = keyed.shuffle(on="_key", shuffle_method="p2p", npartitions=ddf.npartitions)
    shuffled = shuffled.map_partitions(lambda f: f.sample(frac=1, random_state=1).drop(columns="_key"))
    shuffled.to_parquet(dest, write_index=False)
    done = time.perf_counter()
    restarts = worker_restarts(client, pids)
    client.close()
    cluster.close()
    return {"startup_s": ready - START, "shuffle_s": done - ready, "worker_restarts": restarts}


def duckdb_sql(source, dest, shuffle: bool):
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {THREADS}")
    if DUCKDB_MEMORY:
        con.execute(f"SET memory_limit = '{DUCKDB_MEMORY}'")
    ready = time.perf_counter()
    order = "ORDER BY random()" if shuffle else ""
    con.execute(
        f"COPY (SELECT * FROM read_parquet('{source}/*.parquet') {order}) "
        f"TO '{dest}' (FORMAT parquet, PER_THREAD_OUTPUT)"
    )
    return {"startup_s": ready - START, "shuffle_s": time.perf_counter() - ready}


def pyarrow_copy(source, dest):
    import pyarrow.dataset as ds

    ready = time.perf_counter()
    ds.write_dataset(ds.dataset(source, format="parquet"), dest, format="parquet")
    return {"startup_s": ready - START, "shuffle_s": time.perf_counter() - ready}


def polars_sample(source, dest):
    import polars as pl

    ready = time.perf_counter()
    frame = pl.read_parquet(f"{source}/*.parquet")
    os.makedirs(dest, exist_ok=True)
    frame.sample(fraction=1.0, shuffle=True, seed=1).write_parquet(os.path.join(dest, "part-0.parquet"))
    return {"startup_s": ready - START, "shuffle_s": time.perf_counter() - ready}


SYSTEMS = {
    "daskpile 64 piles": lambda s, d: daskpile_parquet(s, d, 64),
    "daskpile 512 piles": lambda s, d: daskpile_parquet(s, d, 512),
    "daskpile 64 piles, threads": lambda s, d: daskpile_parquet(s, d, 64, threads_only=True),
    "daskpile 512 piles, threads": lambda s, d: daskpile_parquet(s, d, 512, threads_only=True),
    "daskpile auto piles": lambda s, d: daskpile_parquet(s, d, "auto"),
    "daskpile.shuffle(ddf)": daskpile_dataframe,
    "duckdb ORDER BY random()": lambda s, d: duckdb_sql(s, d, shuffle=True),
    "dask p2p + sample": dask_p2p,
    "polars sample": polars_sample,
    "floor: duckdb copy": lambda s, d: duckdb_sql(s, d, shuffle=False),
    "floor: pyarrow copy": pyarrow_copy,
}
PEER = "duckdb ORDER BY random()"
FLOORS = ["floor: duckdb copy", "floor: pyarrow copy"]


def output_bytes(dest: str) -> int:
    return sum(
        os.path.getsize(f) for f in glob.glob(os.path.join(dest, "**", "*"), recursive=True) if os.path.isfile(f)
    )


if __name__ == "__main__":
    name, source, dest = sys.argv[1:4]
    result = SYSTEMS[name](source, dest)
    result["output_bytes"] = output_bytes(dest)
    print(json.dumps(result), flush=True)
