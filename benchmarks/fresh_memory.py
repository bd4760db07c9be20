"""What writing into the page cache costs on this machine, with memory freed just before or long ago.

    python benchmarks/fresh_memory.py [--gib 4] [--pause 20] [--dir benchmarks/data]

Writes ``--gib`` GiB into 64 files (8 MiB writes, as a shuffle's scratch is
written), removes them, and does it again at once, then after ``--pause``
seconds, and prints the system CPU of each write.  On a VM whose balloon
device reports freed pages to the host (Linux's free page reporting), memory
freed a while ago must be handed back by the host when it is touched again:
the first and the paused writes then cost several times the one right after
a removal.  Every system that writes (daskpile's scratch and output, Dask's
p2p shards, DuckDB's spill) pays this, in proportion to the bytes it writes.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

FILES, WRITE_BYTES = 64, 8 << 20


def write_files(directory: str, gib: float) -> tuple[float, float]:
    """Write then remove ``gib`` GiB in ``FILES`` files; the wall and system CPU seconds of the writes."""
    buffer = os.urandom(WRITE_BYTES)
    paths = [os.path.join(directory, f"fresh-memory-{i}") for i in range(FILES)]
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for p in paths]
    try:
        for k in range(int(gib * 2**30 / WRITE_BYTES)):
            os.write(fds[k % FILES], buffer)
    finally:
        for fd in fds:
            os.close(fd)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    for p in paths:
        os.remove(p)
    return wall, after.ru_stime - before.ru_stime


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--pause", type=float, default=20.0, help="seconds to wait before the last write")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    for label in ("first", "right after a removal", f"after {args.pause:g} s"):
        if label.startswith("after"):
            time.sleep(args.pause)
        wall, system = write_files(args.dir, args.gib)
        print(f"{args.gib:g} GiB written, {label}: {wall:.2f} s wall, {system:.2f} s system CPU")


if __name__ == "__main__":
    main()
