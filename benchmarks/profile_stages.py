"""Where the time of a shuffle goes: each stage of both passes, run one after the other.

    python benchmarks/profile_stages.py [--size A] [--piles 64 512] [--reps 3]

Runs the same kernels as the Dask tasks, in-process and in sequence, and
prints the CPU seconds of every stage summed over the dataset, so that what
bounds the wall time on N cores is visible (about sum / N when the stages
parallelise well).  CPU time is the whole process's (pyarrow's Parquet reader
decodes on a thread of its own), which a busy neighbour on a shared VM
disturbs less than wall time.  With one pile count, each stage's system share
is shown too: on a VM whose freed memory goes back to its host, the kernel's
time to hand pages back (page cache for scratch and output, fresh pages for
Arrow's buffers) is a large part of some stages (B, 2026-11-30: 20 of 57 s).  With several pile counts (run alternately,
``--reps`` times each, medians shown) it also prints what each pile beyond the
first count costs: the fixed cost per pile, which is what makes many small
piles slower than a few large ones.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import resource
import shutil
import statistics
import sys
import tempfile

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import dataset  # noqa: E402

from daskpile import _kernels, _random  # noqa: E402
from daskpile._storage import filesystem  # noqa: E402
from daskpile.checks import _fingerprint  # noqa: E402
from daskpile.engine import _scratch  # noqa: E402
from daskpile.engine._passes import existing, write_parquet  # noqa: E402
from daskpile.sources.parquet import _read_table_single_threaded  # noqa: E402


def profile(files: list[str], piles: int) -> dict[str, float]:
    """CPU seconds of each stage of a whole shuffle of ``files`` into ``piles`` piles, stage after stage, and
    of each its system share (keyed ``SYSTEM + stage``)."""
    work = tempfile.mkdtemp(prefix="daskpile-profile-")
    fs, _ = filesystem(work)
    run = _scratch.Scratch.create(work, None, len(files))
    run = dataclasses.replace(run, bands=_scratch.band_bounds(piles))  # as shuffle_parquet writes scratch
    seconds: dict[str, float] = collections.defaultdict(float)

    def timed(stage, fn, *a):
        before = resource.getrusage(resource.RUSAGE_SELF)
        result = fn(*a)
        after = resource.getrusage(resource.RUSAGE_SELF)
        seconds[stage] += after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        seconds[SYSTEM + stage] += after.ru_stime - before.ru_stime
        return result

    try:
        for k, path in enumerate(files):
            table = timed("pass 1: read Parquet", _read_table_single_threaded, path)
            timed("pass 1: fingerprint", _fingerprint.of, table)
            rng = _random.generator(1, _random.SCATTER, k)
            grouped, counts = timed("pass 1: assign piles + group (take)", _kernels.scatter, table, piles, rng)
            timed("pass 1: write scratch IPC", run.write, k, 0, grouped, counts)
        outs = [os.path.join(work, "out", f"part-{j}.parquet") for j in range(piles)]
        timed("pass 2: list finished piles", existing, fs, outs)  # the tasks list dest, once each
        with _scratch.PileReader(run) as reader:
            for j, out in enumerate(outs):
                batches = timed("pass 2: read scratch slices", reader.pile, j)
                table = timed("pass 2: concatenate", pa.Table.from_batches, batches)
                order = timed("pass 2: draw the permutation", _draw_permutation, j, table.num_rows)
                permuted = timed("pass 2: permute (take)", _kernels.take, table, order)
                timed("pass 2: fingerprint", _fingerprint.of, permuted)
                timed("pass 2: write Parquet", write_parquet, permuted, fs, out)
    finally:
        shutil.rmtree(work)
    return seconds


def _draw_permutation(pile: int, rows: int) -> np.ndarray:
    return _random.generator(1, _random.GATHER, pile).permutation(rows)


SYSTEM = "system: "


def report(size: str, runs: dict[int, list[dict[str, float]]]) -> str:
    """The median seconds of each stage per pile count, and with two or more counts the cost of each added pile."""
    counts = sorted(runs)
    stages = [s for s in runs[counts[0]][0] if not s.startswith(SYSTEM)]
    median = {p: {s: statistics.median(r[s] for r in runs[p]) for s in runs[p][0]} for p in counts}
    totals = {p: sum(median[p][s] for s in stages) for p in counts}
    reps = len(runs[counts[0]])
    lines = [f"{size}, stage after stage, CPU seconds (median of {reps})"]
    if len(counts) == 1:
        p = counts[0]
        system = {s: median[p][SYSTEM + s] for s in stages}
        lines[0] += f", {p} piles: {totals[p]:.1f} s of work, {sum(system.values()):.1f} s of it system"
        lines += [
            f"  {s:<36} {median[p][s]:6.2f} s  {100 * median[p][s] / totals[p]:4.0f} %   system {system[s]:5.2f} s"
            for s in stages
        ]
        return "\n".join(lines)
    first, last = counts[0], counts[-1]
    added = last - first
    header = "".join(f"{f'{p} piles':>11}" for p in counts)
    lines.append(f"  {'stage':<36}{header}{f'+{added} piles':>13}{'per pile':>11}")
    for stage in [*stages, "total"]:
        values = [totals[p] if stage == "total" else median[p][stage] for p in counts]
        extra = values[-1] - values[0]
        cells = "".join(f"{v:9.2f} s" for v in values)
        lines.append(f"  {stage:<36}{cells}{extra:+11.2f} s{1e3 * extra / added:8.2f} ms")
    lines.append(f"  ratio {last} / {first} piles: {totals[last] / totals[first]:.2f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="A")
    parser.add_argument("--piles", type=int, nargs="+", default=[64])
    parser.add_argument("--reps", type=int, default=1, help="runs of each pile count, alternating")
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--files", type=int, default=None, help="only the first N files of the dataset")
    args = parser.parse_args(argv)
    source = dataset(args.size, args.data_dir)
    files = sorted(os.path.join(source, f) for f in os.listdir(source) if f.endswith(".parquet"))[: args.files]
    profile(files[:1], args.piles[0])  # first calls load libraries and warm caches: not part of any stage
    runs: dict[int, list[dict[str, float]]] = {p: [] for p in args.piles}
    for _ in range(args.reps):
        for piles in args.piles:
            runs[piles].append(profile(files, piles))
    print(report(args.size, runs))


if __name__ == "__main__":
    main()
