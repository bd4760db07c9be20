"""``PileLoader`` against a plain read of the same files: rows/s, peak memory, co-batch rates, shuffle quality.

    python benchmarks/loader.py --size A --reps 3          # 10 M rows, 64 piles
    python benchmarks/loader.py --size B --reps 3 --no-quality
    python benchmarks/loader.py --size tiny --reps 1 --no-quality   # proves the script works
    python benchmarks/loader.py --render benchmarks/results/loader-A.json   # rewrite the table only

The reference dataset is shuffled once, eagerly and lazily (``second_pass="lazy"``),
into ``data/<size>-piles-<P>`` and ``data/<size>-piles-<P>-lazy`` with seed 0,
and kept for later runs.  Then, in turns over ``--reps`` rounds, each system
reads one epoch in a fresh process, after the files it reads have been put in
the page cache:

- ``plain read``: the eager piles file by file with pyarrow, in name order,
  every batch touched: ``pq.read_table`` cut into ``--batch-size`` slices, and
  ``ParquetFile.iter_batches``.  The faster is the upper limit ("x plain read").
- ``PileLoader``: over the eager and the lazy piles, ``--prefetch`` and each
  ``--mix``, ``output="arrow"``.

Each child reports its own epoch seconds, CPU seconds, peak RSS (VmHWM), its
RSS before the epoch (imports and set-up) and the peak of pyarrow's memory
pool.  The bound for a loader is ``(prefetch + mix + 1)`` piles + 200 MiB,
where a pile is the Arrow size of the largest pile file.

Then, once: the loader's stages run one after the other on one thread (read,
permutation, take, batching: where the time goes), the co-batch rates of each
``mix`` (``PileLoader.co_batch_rate()``, from the plans alone), and the
quality of the orders at equal memory: PileLoader against a tf.data-style
recipe over the sorted input (shuffled file order, interleave of
``--interleave`` files, a shuffle buffer as many rows as the loader holds),
and MosaicML Streaming py1e when ``--mosaic-python`` names a Python that has
``mosaicml-streaming``.  Results go to ``results/loader-<size>.{json,md}``;
a ``## Notes`` section written by hand at the end of the ``.md`` is kept
when the file is rewritten.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

START = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import SIZES, dataset, machine  # noqa: E402

BOUND_EXTRA_MIB = 200
NOTES = "## Notes"


# ---------------------------------------------------------------- the child: one system, one epoch


def _status(key: str) -> float:
    """A line of /proc/self/status in MiB (VmHWM: peak resident set; VmRSS: now)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def child(spec: dict) -> dict:
    """One epoch of one system in this (fresh) process: the figures of its own that the parent cannot see."""
    import pyarrow as pa

    kind, batch_size = spec["kind"], spec["batch_size"]
    import pyarrow.parquet as pq

    if kind != "loader":  # pq.read_table imports it on its first call: 0.25 s, and 51 MiB the loader never takes
        import pyarrow.dataset

    files = sorted(glob.glob(os.path.join(spec["path"], "*.parquet")))
    setup = time.perf_counter()
    if kind == "loader":
        import daskpile

        loader = daskpile.PileLoader(
            spec["path"], batch_size=batch_size, seed=0, prefetch=spec["prefetch"], mix=spec["mix"], output="arrow"
        )
    ready = time.perf_counter()
    rss_before = _status("VmRSS")
    cpu = time.process_time()
    rows = batches = 0
    first = None
    if kind == "loader":
        for batch in loader:
            rows += batch.num_rows
            batches += 1
            first = first or time.perf_counter()
    elif kind == "plain-table":
        for path in files:
            table = pq.read_table(path)
            for start in range(0, table.num_rows, batch_size):
                rows += table.slice(start, batch_size).num_rows
                batches += 1
                first = first or time.perf_counter()
    elif kind == "plain-iter":
        for path in files:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
                rows += batch.num_rows
                batches += 1
                first = first or time.perf_counter()
    else:
        raise ValueError(kind)
    done = time.perf_counter()
    result = {
        "startup_s": setup - START,
        "setup_s": ready - setup,
        "epoch_s": done - ready,
        "first_batch_s": (first or done) - ready,
        "cpu_s": time.process_time() - cpu,
        "rows": rows,
        "batches": batches,
        "peak_rss_mib": _status("VmHWM"),
        "rss_before_mib": rss_before,
        "arrow_peak_mib": pa.default_memory_pool().max_memory() / 2**20,
        "arrow_pool": pa.default_memory_pool().backend_name,
    }
    if kind == "loader":
        result["waited_s"] = loader.stats.waited + loader.stats.first_wait
        result["groups"] = loader.stats.groups
        result["daskpile"] = os.path.dirname(daskpile.__file__)
    return result


def profile_child(spec: dict) -> dict:
    """The loader's work for one epoch, stage after stage on this thread: wall and CPU seconds of each.

    The epoch's groups (eager piles, one stream: a piece is a whole pile) as
    the loader plans them; each read as the loader reads a local file
    (``ParquetFile(pre_buffer=False).read_row_groups``), permuted by its
    ``group_permutation`` with ``_kernels.take``, and cut into batches.  Then,
    for comparison, ``pq.read_table`` of the same files (the plain read's
    reader).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from daskpile import _kernels
    from daskpile.loader.plan import EpochPlan, group_permutation
    from daskpile.loader.units import discover

    units = discover(spec["path"], None)
    plan = EpochPlan.build(units.rows, seed=0, epoch=0, canonical=1, mix=spec["mix"])
    seconds: dict[str, list[float]] = {}

    def timed(stage, fn, *args):
        wall, cpu = time.perf_counter(), time.process_time()
        out = fn(*args)
        entry = seconds.setdefault(stage, [0.0, 0.0])
        entry[0] += time.perf_counter() - wall
        entry[1] += time.process_time() - cpu
        return out

    def read(paths):  # a unit's files: one, for a pile written by a shuffle
        parts = []
        for path in paths:
            parquet = pq.ParquetFile(path, pre_buffer=False)
            parts.append(parquet.read_row_groups(list(range(parquet.num_row_groups))))
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def batch_all(table):
        size = spec["batch_size"]
        return sum(table.slice(start, size).num_rows for start in range(0, table.num_rows, size))

    for group in plan.groups[0]:
        tables = [timed("read (ParquetFile.read_row_groups)", read, units.paths[p.unit]) for p in group.pieces]
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        order = timed("permutation (Philox)", group_permutation, 0, 0, group)
        taken = timed("take (_kernels.take of the group)", _kernels.take, table, order)
        timed("batching (slices)", batch_all, taken)
        del tables, table, taken
    for paths in units.paths:
        for path in paths:
            timed("for comparison: pq.read_table", pq.read_table, path)
    return seconds


# ---------------------------------------------------------------- the parent


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=os.path.dirname(HERE), capture_output=True, text=True, check=True).stdout


def use_commit(rev: str) -> dict:
    """Import daskpile from ``rev`` (here and in every child): its ``daskpile/`` exported to a temporary directory.

    The working tree may be changing while a benchmark runs; a commit does not.
    """
    commit = git("rev-parse", "--verify", rev + "^{commit}").strip()
    root = os.path.join(tempfile.gettempdir(), f"daskpile-{commit[:12]}")
    if not os.path.exists(os.path.join(root, "daskpile", "__init__.py")):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        archive = subprocess.run(["git", "archive", commit, "daskpile"], cwd=os.path.dirname(HERE),
                                 capture_output=True, check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
    os.environ["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, root)
    import daskpile

    return {"commit": commit, "dirty": False, "path": os.path.dirname(daskpile.__file__)}


def working_tree() -> dict:
    """The daskpile this run imports from the working tree: HEAD, and whether daskpile/ differs from it."""
    import daskpile

    commit = git("rev-parse", "HEAD").strip()
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--", "daskpile").strip()),
            "path": os.path.dirname(daskpile.__file__)}  # fmt: skip


def piles_of(size: str, data_dir: str, piles: int, lazy: bool) -> str:
    """The reference dataset shuffled into ``piles`` piles with seed 0 (eager or lazy), made once and kept."""
    import dask

    import daskpile

    dest = os.path.join(data_dir, f"{size}-piles-{piles}" + ("-lazy" if lazy else ""))
    if not os.path.exists(os.path.join(dest, "_daskpile.json")):
        print(f"shuffling {size} into {dest} ...", flush=True)
        with dask.config.set(scheduler="threads"):
            daskpile.shuffle_parquet(
                dataset(size, data_dir), dest, piles=piles, seed=0, overwrite=True,
                second_pass="lazy" if lazy else "eager",
            )  # fmt: skip
    return dest


def pile_sizes(path: str) -> dict:
    """Arrow size in memory of every pile file: the largest is the unit of the memory bound."""
    import pyarrow.parquet as pq

    sizes = [pq.read_table(f).nbytes for f in sorted(glob.glob(os.path.join(path, "*.parquet")))]
    rows = [pq.ParquetFile(f).metadata.num_rows for f in sorted(glob.glob(os.path.join(path, "*.parquet")))]
    return {
        "largest_mib": max(sizes) / 2**20,
        "median_mib": statistics.median(sizes) / 2**20,
        "rows_median": statistics.median(rows),
        "rows_max": max(rows),
        "files_mib": sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "*.parquet"))) / 2**20,
    }


def settle(path: str) -> None:
    """Untimed: no dirty pages being written back, the files of ``path`` in the page cache."""
    os.sync()
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            while f.read(16 << 20):
                pass


def spawn(mode: str, spec: dict, timeout: float | None = None) -> dict:
    args = [sys.executable, os.path.abspath(__file__), mode, json.dumps(spec)]
    env = {**os.environ, **spec.get("env", {})}
    completed = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    if completed.returncode:
        return {"ok": False, "error": completed.stderr.strip()[-2000:]}
    return {"ok": True, **json.loads(completed.stdout.strip().splitlines()[-1])}


def systems(eager: str, lazy: str, args) -> dict[str, dict]:
    common = {"batch_size": args.batch_size}
    found = {
        f"plain read: pq.read_table, {args.batch_size}-row slices": {"kind": "plain-table", "path": eager},
        f"plain read: ParquetFile.iter_batches({args.batch_size})": {"kind": "plain-iter", "path": eager},
    }
    for mix in args.mix:
        found[f"PileLoader eager, prefetch {args.prefetch}, mix {mix}"] = {
            "kind": "loader", "path": eager, "prefetch": args.prefetch, "mix": mix,
        }  # fmt: skip
        if mix == 1:
            found[f"PileLoader lazy, prefetch {args.prefetch}, mix 1"] = {
                "kind": "loader", "path": lazy, "prefetch": args.prefetch, "mix": 1,
            }  # fmt: skip
    # mimalloc's transparent huge pages off, as the daskpile command runs (for the limit too)
    found[f"plain read: pq.read_table, {args.batch_size}-row slices, MIMALLOC_ALLOW_THP=0"] = {
        "kind": "plain-table", "path": eager, "env": {"MIMALLOC_ALLOW_THP": "0"},
    }  # fmt: skip
    if args.prefetch != 0:
        found["PileLoader eager, prefetch 0, mix 1"] = {"kind": "loader", "path": eager, "prefetch": 0, "mix": 1}
    if 1 in args.mix:  # Arrow's jemalloc pool gives freed pages back sooner than its default, mimalloc
        found[f"PileLoader eager, prefetch {args.prefetch}, mix 1, ARROW_DEFAULT_MEMORY_POOL=jemalloc"] = {
            "kind": "loader", "path": eager, "prefetch": args.prefetch, "mix": 1,
            "env": {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc"},
        }  # fmt: skip
        # mimalloc keeps pages freed by one thread for reuse (10 ms by default) while others allocate: the peak
        # RSS past the pool's own (B: 440-500 MiB against a pool peak of 260); 0 gives them back at once
        found[f"PileLoader eager, prefetch {args.prefetch}, mix 1, MIMALLOC_PURGE_DELAY=0"] = {
            "kind": "loader", "path": eager, "prefetch": args.prefetch, "mix": 1,
            "env": {"MIMALLOC_PURGE_DELAY": "0"},
        }  # fmt: skip
        found[f"PileLoader eager, prefetch {args.prefetch}, mix 1, MIMALLOC_ALLOW_THP=0"] = {
            "kind": "loader", "path": eager, "prefetch": args.prefetch, "mix": 1,
            "env": {"MIMALLOC_ALLOW_THP": "0"},
        }  # fmt: skip
    return {name: {**spec, **common} for name, spec in found.items()}


def summarise(runs: list[dict], names: list[str], pile_mib: float) -> dict:
    summary = {}
    for name in names:
        ok = [r for r in runs if r["system"] == name and r["ok"]]
        if not ok:
            errors = [r["error"] for r in runs if r["system"] == name]
            summary[name] = {"ok": False, "error": errors[0] if errors else "not run"}
            continue
        rates = [r["rows"] / r["epoch_s"] for r in ok]
        entry = {
            "ok": True,
            "runs": len(ok),
            "rows": ok[0]["rows"],
            "rows_per_s_median": statistics.median(rates),
            "rows_per_s_min": min(rates),
            "rows_per_s_max": max(rates),
            "epoch_s_median": statistics.median(r["epoch_s"] for r in ok),
            "first_batch_s_median": statistics.median(r["first_batch_s"] for r in ok),
            "cpu_s_median": statistics.median(r["cpu_s"] for r in ok),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in ok),
            "rss_before_mib": statistics.median(r["rss_before_mib"] for r in ok),
            "arrow_peak_mib": max(r["arrow_peak_mib"] for r in ok),
        }
        if "waited_s" in ok[0]:
            entry["waited_s_median"] = statistics.median(r["waited_s"] for r in ok)
            spec = ok[0]["spec"]
            entry["bound_mib"] = (spec["prefetch"] + spec["mix"] + 1) * pile_mib + BOUND_EXTRA_MIB
        summary[name] = entry
    plain = [e["rows_per_s_median"] for n, e in summary.items() if n.startswith("plain read") and e["ok"]]
    for entry in summary.values():
        if entry["ok"] and plain:
            entry["vs_plain"] = entry["rows_per_s_median"] / max(plain)
    return summary


def co_batch(eager: str, mixes: list[int], batch_size: int) -> list[dict]:
    import daskpile

    rates = []
    for mix in mixes:
        started = time.perf_counter()
        result = daskpile.PileLoader(eager, batch_size=batch_size, seed=0, mix=mix).co_batch_rate()
        rates.append({"mix": mix, "rate": result.rate, "ideal": result.ideal, "pairs": result.pairs,
                      "seconds": time.perf_counter() - started})  # fmt: skip
    return rates


# ---------------------------------------------------------------- quality of the orders


def order_quality(ids, labels, file_starts, window: int = 1024) -> dict:
    """Rank correlation of id and position, share of windows off by 3 sigma, longest run from one input file."""
    import numpy as np

    n = len(ids)
    ranks = np.empty(n, dtype=np.float64)
    ranks[np.argsort(ids, kind="stable")] = np.arange(n)
    rho = float(np.corrcoef(ranks, np.arange(n, dtype=np.float64))[0, 1])
    whole = n // window
    counts = np.asarray(labels[: whole * window], dtype=np.int64).reshape(whole, window).sum(axis=1)
    off = float(np.mean(np.abs(counts - window / 2) > 3 * math.sqrt(window / 4))) if whole else float("nan")
    source = np.searchsorted(file_starts, ids, side="right") - 1
    cuts = np.flatnonzero(np.diff(source)) + 1
    runs = np.diff(np.concatenate(([0], cuts, [n])))
    return {"rows": n, "rank_corr": rho, "windows_off": off, "windows": whole, "longest_run": int(runs.max())}


def interleave(files: list, cycle: int) -> list:
    """tf.data's ``interleave(cycle_length=cycle, block_length=1)``: one row of each open file in turn; an
    exhausted file's slot takes the next file."""
    import numpy as np

    pending, slots, out = list(files), [], []
    while pending or slots:
        while pending and len(slots) < cycle:
            slots.append(pending.pop(0))
        step = min(len(s) for s in slots)
        out.append(np.stack([s[:step] for s in slots], axis=1).ravel())
        slots = [s[step:] for s in slots if len(s) > step]
    return out


def shuffle_buffer(n: int, size: int, rng):
    """tf.data's ``shuffle(size)`` over positions 0..n-1: a uniformly random element of the buffer leaves, the
    next one enters; at the end the buffer drains in a uniformly random order."""
    import numpy as np

    size = min(size, n)
    buffer = list(range(size))
    picks = rng.integers(0, size, n - size).tolist()
    out = [0] * (n - size)
    for t, j in enumerate(picks):
        out[t] = buffer[j]
        buffer[j] = size + t
    return np.concatenate((np.array(out, dtype=np.int64), np.array(buffer, dtype=np.int64)[rng.permutation(size)]))


def quality(args, source: str, eager: str, lazy: str, pile_rows: float) -> dict:
    import numpy as np
    import pyarrow.parquet as pq

    import daskpile

    inputs = [pq.read_table(f, columns=["id", "label"]) for f in sorted(glob.glob(os.path.join(source, "*.parquet")))]
    ids_per_file = [t["id"].to_numpy() for t in inputs]
    labels_per_file = [t["label"].to_numpy() for t in inputs]
    file_starts = np.array([int(i[0]) for i in ids_per_file])
    all_ids, all_labels = np.concatenate(ids_per_file), np.concatenate(labels_per_file)
    rows = len(all_ids)
    orders: dict[str, dict] = {}

    def measure(name, ids, labels, **extra):
        started = time.perf_counter()
        orders[name] = {**order_quality(ids, labels, file_starts), **extra}
        print(f"  {name}: {orders[name]} ({time.perf_counter() - started:.1f} s)", flush=True)

    rng = np.random.default_rng(0)
    order = rng.permutation(rows)
    measure("full random permutation", all_ids[order], all_labels[order], memory="the dataset")
    for mix in args.mix:
        held = args.prefetch + mix
        for name, path in [("eager", eager), ("lazy", lazy)] if mix == 1 else [("eager", eager)]:
            loader = daskpile.PileLoader(path, batch_size=args.batch_size, seed=0, prefetch=args.prefetch, mix=mix,
                                         columns=["id", "label"])  # fmt: skip
            batches = list(loader)
            measure(f"PileLoader {name}, mix {mix}, epoch 0",
                    np.concatenate([b["id"].to_numpy() for b in batches]),
                    np.concatenate([b["label"].to_numpy() for b in batches]),
                    memory=f"{held} piles ({held * pile_rows:,.0f} rows)")  # fmt: skip
    buffers = {f"equal to mix {mix}": round((args.prefetch + mix) * pile_rows) for mix in args.mix}
    buffers["the usual 10 k"] = 10_000
    for what, size in buffers.items():
        rng = np.random.default_rng(0)
        offsets = np.cumsum([0, *(len(i) for i in ids_per_file)])
        files = [np.arange(offsets[k], offsets[k + 1]) for k in rng.permutation(len(ids_per_file))]  # row numbers
        stream = np.concatenate(interleave(files, args.interleave))
        started = time.perf_counter()
        positions = stream[shuffle_buffer(rows, size, rng)]
        seconds = time.perf_counter() - started
        measure(f"tf.data recipe: shuffled files, interleave {args.interleave}, buffer {size:,} ({what})",
                all_ids[positions], all_labels[positions], memory=f"{size:,} rows",
                simulated_s=round(seconds, 1))  # fmt: skip
    result = {"rows": rows, "orders": orders}
    if args.mosaic_python:
        result["mosaic"] = mosaic(args, ids_per_file, labels_per_file, file_starts, measure)
    return result


MOSAIC_SCRIPT = r"""
import json, os, sys, time
import numpy as np
work, rows_per_shard, batch_size, full_sizes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
import streaming
from streaming import MDSWriter, StreamingDataset
from streaming.base.shuffle import get_shuffle
from streaming.base.util import merge_index
ids = np.load(os.path.join(work, "ids.npy")); shards = np.load(os.path.join(work, "shards.npy"))
mds = os.path.join(work, "mds")
started = time.perf_counter()
for k in range(int(shards.max()) + 1):
    with MDSWriter(out=os.path.join(mds, f"part-{k:05d}"), columns={"id": "int64"}, size_limit=1 << 30) as w:
        for i in ids[shards == k].tolist():
            w.write({"id": i})
merge_index(mds, keep_local=True)
written = time.perf_counter() - started
dataset = StreamingDataset(local=mds, remote=None, shuffle=True, shuffle_algo="py1e", shuffle_seed=0,
                           num_canonical_nodes=1, batch_size=batch_size)
started = time.perf_counter()
order = np.fromiter((sample["id"] for sample in dataset), dtype=np.int64, count=len(ids))
iterated = time.perf_counter() - started
block = dataset.shuffle_block_size
sizes = np.bincount(shards)
planned = get_shuffle("py1e", sizes, 1, 0, 0, block)
np.save(os.path.join(work, "order.npy"), order)
full = get_shuffle("py1e", np.array(full_sizes, dtype=np.int64), 1, 0, 0, block)
np.save(os.path.join(work, "full.npy"), full)
print(json.dumps({"version": streaming.__version__, "block": int(block), "write_s": written, "iterate_s": iterated,
                  "plan_matches": bool(np.array_equal(ids[planned], order))}))
"""


def mosaic(args, ids_per_file, labels_per_file, file_starts, measure) -> dict:
    """MosaicML Streaming py1e (1 canonical node, seed 0, its default block): real iteration over an MDS copy of
    the first ``--mosaic-rows-per-shard`` rows of each input file, and the planned order of the whole dataset."""
    import numpy as np

    work = tempfile.mkdtemp(prefix="daskpile-mosaic-")
    try:
        per = args.mosaic_rows_per_shard
        subset_ids = np.concatenate([i[:per] for i in ids_per_file])
        subset_labels = np.concatenate([lab[:per] for lab in labels_per_file])
        shards = np.concatenate([np.full(min(per, len(i)), k) for k, i in enumerate(ids_per_file)])
        np.save(os.path.join(work, "ids.npy"), subset_ids)
        np.save(os.path.join(work, "shards.npy"), shards)
        sizes = json.dumps([len(i) for i in ids_per_file])
        command = [args.mosaic_python, "-c", MOSAIC_SCRIPT, work, str(per), str(args.batch_size), sizes]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if completed.returncode:
            lines = completed.stderr.strip().splitlines()
            return {"ok": False, "error": lines[-1] if lines else f"exit {completed.returncode}"}
        info = json.loads(completed.stdout.strip().splitlines()[-1])
        order = np.load(os.path.join(work, "order.npy"))
        label_of = dict(zip(subset_ids.tolist(), subset_labels.tolist(), strict=True))
        labels = np.array([label_of[i] for i in order.tolist()], dtype=np.int8)
        measure(f"MosaicML Streaming py1e, iterated: {len(order):,} rows, {len(ids_per_file)} shards of {per:,}",
                order, labels, memory="shards it caches")  # fmt: skip
        full = np.load(os.path.join(work, "full.npy"))
        all_ids, all_labels = np.concatenate(ids_per_file), np.concatenate(labels_per_file)
        measure("MosaicML Streaming py1e, planned order (get_shuffle) of the whole dataset",
                all_ids[full], all_labels[full], memory="shards it caches")  # fmt: skip
        return {"ok": True, **info, "subset_rows": len(order), "rows_per_shard": per}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the report


def markdown(result: dict) -> str:
    meta, summary = result["meta"], result["summary"]
    meta.setdefault("daskpile", {"commit": "unknown", "dirty": True})
    m, piles = meta["machine"], meta["pile_size"]
    lines = [
        f"{meta['size']}: {meta['rows']:,} rows, {meta['piles']} piles of {piles['rows_median']:,.0f} rows "
        f"(median); batch {meta['batch_size']}; {m['cores']} cores, {m['memory_gib']} GiB ({m['cpu']}); "
        f"pyarrow {m['versions'].get('pyarrow', '?')}; {meta['date']}; {meta['reps']} runs each, alternating, "
        "warm page cache"
        + (
            f"; load average {meta['load_average']['start'][0]:.2f} before, {meta['load_average']['end'][1]:.2f} "
            "over the last 5 minutes after"
            if "load_average" in meta
            else ""
        ),
        "",
        f"Command: `{meta['command']}`",
        "",
        f"daskpile measured: commit {meta['daskpile']['commit'][:7]}"
        + (" with uncommitted changes to daskpile/" if meta["daskpile"]["dirty"] else "")
        + (" (exported with `--commit`)" if "--commit" in meta["command"] else " (the working tree)")
        + ".",
        "",
        f"A pile in memory (Arrow size of a pile file): {piles['largest_mib']:.1f} MiB the largest, "
        f"{piles['median_mib']:.1f} MiB the median; the eager piles are {piles['files_mib']:,.0f} MiB on disk. "
        f"Bound: (prefetch + mix + 1) x {piles['largest_mib']:.1f} MiB + {BOUND_EXTRA_MIB} MiB.",
        "",
        "## Throughput and memory",
        "",
        "Each run is one epoch in a fresh process. M rows/s is rows over the epoch's seconds (set-up and imports "
        "apart); x plain read divides by the faster plain read. Peak RSS is the child's VmHWM, the highest of the "
        "runs; RSS before is after imports and set-up, before the first batch. Arrow peak: pyarrow's memory pool.",
        "",
        "| system | M rows/s, median (min-max) | x plain read | epoch s | first batch s | waited s | CPU s "
        "| peak RSS MiB | RSS before MiB | Arrow peak MiB | bound MiB | within bound |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, e in summary.items():
        if not e["ok"]:
            reason = e["error"].strip().splitlines()[-1][:150].replace("|", "/") if e.get("error") else ""
            lines.append(f"| {name} | failed: {reason} |" + " |" * 10)
            continue
        bound = f"{e['bound_mib']:,.0f}" if "bound_mib" in e else ""
        within = ("yes" if e["peak_rss_mib"] <= e["bound_mib"] else "**no**") if "bound_mib" in e else ""
        waited = f"{e['waited_s_median']:.2f}" if "waited_s_median" in e else ""
        lines.append(
            f"| {name} | {e['rows_per_s_median'] / 1e6:.2f} ({e['rows_per_s_min'] / 1e6:.2f}-"
            f"{e['rows_per_s_max'] / 1e6:.2f}) | {e.get('vs_plain', 0):.2f} | {e['epoch_s_median']:.2f} "
            f"| {e['first_batch_s_median']:.3f} | {waited} | {e['cpu_s_median']:.2f} | {e['peak_rss_mib']:,.0f} "
            f"| {e['rss_before_mib']:,.0f} | {e['arrow_peak_mib']:,.0f} | {bound} | {within} |"
        )
    lines += ["", "waited s: the loader's consumer waiting for its load thread (`loader.stats`), first group included."]
    if result.get("stages"):
        lines += ["", "## Where the loader's time goes", "",
                  "The loader's calls for one epoch of the eager piles, stage after stage on one thread (no "
                  f"prefetch thread), median of {result['stages_reps']} runs in fresh processes. CPU includes "
                  "pyarrow's reader threads.", ""]  # fmt: skip
        mixes = list(result["stages"])
        lines.append("| stage | " + " | ".join(f"mix {k}: wall s | CPU s" for k in mixes) + " |")
        lines.append("| --- |" + " --- | --- |" * len(mixes))
        names = list(result["stages"][mixes[0]])
        for stage in [*names, "sum of the loader's stages"]:
            cells = []
            for k in mixes:
                stages = result["stages"][k]
                if stage == "sum of the loader's stages":
                    wall = sum(v[0] for s, v in stages.items() if not s.startswith("for comparison"))
                    cpu = sum(v[1] for s, v in stages.items() if not s.startswith("for comparison"))
                else:
                    wall, cpu = stages[stage]
                cells.append(f"{wall:.3f} | {cpu:.3f}")
            lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    if result.get("co_batch"):
        lines += ["", "## Co-batch rate", "",
                  f"`PileLoader(piles, batch_size={meta['batch_size']}, seed=0, mix=k).co_batch_rate()`: of the "
                  "pairs of rows in one batch of epoch 0, the share again in one batch of epoch 1; ideal is that "
                  "share for two independent uniform permutations.", "",
                  "| mix | rate | ideal | rate / ideal | pairs |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for c in result["co_batch"]:
            lines.append(f"| {c['mix']} | {c['rate']:.3g} | {c['ideal']:.3g} | {c['rate'] / c['ideal']:.1f} "
                         f"| {c['pairs']:,} |")  # fmt: skip
    q = result.get("quality")
    if q:
        lines += ["", "## Quality of the orders at equal memory", "",
                  f"Over the sorted input ({q['rows']:,} rows; `label` 0 for the first half of the ids, 1 for the "
                  "second), one epoch, seed 0. Rank corr.: Spearman correlation of id and output position. Windows "
                  f"off: share of consecutive {meta['batch_size']}-row windows whose label count is more than 3 sigma "
                  "from Binomial(1024, 1/2) (an ideal shuffle: about 0.0027). Longest run: most consecutive rows "
                  "from one input file. The tf.data recipe is simulated in Python over row numbers, exactly as "
                  "its `interleave(block_length=1)` and `shuffle(buffer)` draw; its buffer holds as many rows as "
                  "the loader's (prefetch + mix) piles.", "",
                  "| order | memory | rows | rank corr. | windows off | longest run |",
                  "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for name, o in q["orders"].items():
            lines.append(f"| {name} | {o['memory']} | {o['rows']:,} | {o['rank_corr']:.4f} | {o['windows_off']:.4f} "
                         f"| {o['longest_run']:,} |")  # fmt: skip
        mos = q.get("mosaic")
        if mos is None:
            lines += ["", "MosaicML Streaming: not run (no `--mosaic-python`)."]
        elif not mos["ok"]:
            lines += ["", f"MosaicML Streaming: failed: `{mos['error']}`"]
        else:
            lines += ["", f"MosaicML Streaming {mos['version']}: `StreamingDataset(shuffle_algo='py1e', "
                      f"shuffle_seed=0, num_canonical_nodes=1, batch_size={meta['batch_size']})`, default "
                      f"`shuffle_block_size` {mos['block']:,}. Iterated over an MDS copy of the first "
                      f"{mos['rows_per_shard']:,} rows of each input file ({mos['subset_rows']:,} rows: "
                      f"{mos['iterate_s']:.0f} s in Python, so not the whole dataset); its order "
                      f"{'equals' if mos['plan_matches'] else 'does NOT equal'} the planned one of "
                      "`streaming.base.shuffle.get_shuffle`, which gives the whole dataset's order without "
                      "reading it."]  # fmt: skip
    return "\n".join(lines) + "\n"


def write(stem: str, result: dict) -> None:
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    notes = ""
    if os.path.exists(stem + ".md"):
        with open(stem + ".md") as f:
            old = f.read()
        if NOTES in old:
            notes = "\n" + old[old.index(NOTES) :]
            print(f"kept the hand-written {NOTES!r} of {stem}.md: check that they still hold", flush=True)
    table = markdown(result)
    with open(stem + ".md", "w") as f:
        f.write(table + notes)
    print(table)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="A")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--piles", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--prefetch", type=int, default=1)
    parser.add_argument("--mix", type=int, nargs="+", default=[1, 2, 4], help="the eager loader's mix values")
    parser.add_argument("--systems", nargs="*", help="names as printed in the table (default: all)")
    parser.add_argument("--no-quality", action="store_true", help="skip the quality of the orders")
    parser.add_argument("--no-stages", action="store_true", help="skip the stage-after-stage profile")
    parser.add_argument("--interleave", type=int, default=4, help="files the tf.data recipe interleaves")
    parser.add_argument("--mosaic-python", default=os.environ.get("BENCH_MOSAIC_PYTHON"),
                        help="a Python with mosaicml-streaming, in a venv of its own")  # fmt: skip
    parser.add_argument("--mosaic-rows-per-shard", type=int, default=25_000)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a child is given up")
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--render", metavar="JSON", help="only rewrite the .md of a results JSON")
    parser.add_argument("--commit", help="measure this commit's daskpile (git archive to a temporary directory), "
                        "not the working tree's")  # fmt: skip
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            result = json.load(f)
        write(args.render.removesuffix(".json"), result)
        return result

    measured = use_commit(args.commit) if args.commit else working_tree()
    print(f"daskpile measured: {measured}", flush=True)
    load_start = os.getloadavg()
    source = dataset(args.size, args.data_dir)
    eager = piles_of(args.size, args.data_dir, args.piles, lazy=False)
    lazy = piles_of(args.size, args.data_dir, args.piles, lazy=True)
    piles = pile_sizes(eager)
    table = systems(eager, lazy, args)
    names = [n for n in table if not args.systems or n in args.systems]
    runs = []
    for rep in range(args.reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]  # who goes first takes turns
        for name in order:
            settle(table[name]["path"])
            try:
                result = spawn("--child", table[name], args.timeout)
            except subprocess.TimeoutExpired:
                result = {"ok": False, "error": f"timed out after {args.timeout:.0f} s"}
            runs.append({"system": name, "spec": table[name], **result})
            rate = f"{result['rows'] / result['epoch_s'] / 1e6:.2f} M rows/s, " if result["ok"] else "FAILED "
            peak = f"peak {result['peak_rss_mib']:,.0f} MiB" if result["ok"] else result["error"][-300:]
            print(f"[{rep + 1}/{args.reps}] {name}: {rate}{peak}", flush=True)
    summary = summarise(runs, names, piles["largest_mib"])

    stages = {}
    if not args.no_stages:
        for mix in sorted({1, max(args.mix)}):
            samples = []
            for _ in range(args.reps):
                settle(eager)
                out = spawn("--profile-child", {"path": eager, "mix": mix, "batch_size": args.batch_size})
                if out.pop("ok"):
                    samples.append(out)
                else:
                    print(f"stage profile, mix {mix}: FAILED {out['error'][-300:]}", flush=True)
            if samples:
                medians = {s: [statistics.median(x[s][i] for x in samples) for i in (0, 1)] for s in samples[0]}
                stages[str(mix)] = medians
    rates = co_batch(eager, sorted({1, 2, 4, *args.mix}), args.batch_size)
    for c in rates:
        print(f"co-batch mix {c['mix']}: rate {c['rate']:.3g}, ideal {c['ideal']:.3g}", flush=True)
    quality_result = None
    if not args.no_quality:
        print("quality of the orders ...", flush=True)
        quality_result = quality(args, source, eager, lazy, piles["rows_median"])

    meta = {
        "size": args.size,
        "rows": SIZES[args.size][0],
        "piles": args.piles,
        "batch_size": args.batch_size,
        "prefetch": args.prefetch,
        "mix": args.mix,
        "reps": args.reps,
        "pile_size": piles,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "command": "python benchmarks/loader.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "daskpile": measured,
        "load_average": {"start": load_start, "end": os.getloadavg()},  # 1, 5, 15 minutes: was anything else busy?
    }
    elsewhere = {r["daskpile"] for r in runs if r.get("daskpile")} - {measured["path"]}
    if elsewhere:
        raise RuntimeError(f"children imported daskpile from {elsewhere}, not {measured['path']}")
    result = {"meta": meta, "summary": summary, "stages": stages, "stages_reps": args.reps, "co_batch": rates,
              "quality": quality_result, "runs": runs}  # fmt: skip
    os.makedirs(args.results_dir, exist_ok=True)
    write(os.path.join(args.results_dir, f"loader-{args.size}"), result)
    return result


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] in ("--child", "--profile-child"):
        run = child if sys.argv[1] == "--child" else profile_child
        print(json.dumps(run(json.loads(sys.argv[2]))), flush=True)
    else:
        main()
