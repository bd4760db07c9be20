"""What writing into the page cache costs on this machine: with memory freed just before or long ago, and
by the size of each write.

    python benchmarks/fresh_memory.py [--gib 4] [--pause 20] [--dir benchmarks/data]
    python benchmarks/fresh_memory.py --gib 1 --pause 15 --write-kib 1024 8192 1024 8192

Without ``--write-kib``: writes ``--gib`` GiB into 64 files in 8 MiB writes,
removes them, and does it again at once, then after ``--pause`` seconds, and
prints the system CPU of each write.  On a VM whose balloon device reports
freed pages to the host (Linux's free page reporting), memory freed a while
ago must be handed back by the host when it is touched again: the first and
the paused writes then cost several times the one right after a removal.

With ``--write-kib``: for each size in turn, after a pause of ``--pause``
seconds (so that every size starts alike, on memory freed long ago), writes
``--gib`` GiB in writes of that size.  A write of more than 2 MiB lets the
kernel cache the file in 2 MiB pages, which come from exactly the free blocks
the balloon reported; smaller writes are cached in small pages.  On this
project's VM (2026-11-28), 1 GiB after 12-20 s: 2.2-2.8 s of system CPU in
writes of 4-8 MiB, 0.23-0.35 s in writes of 64 KiB to 2 MiB.  So daskpile
never writes more than 1 MiB at once (``daskpile._storage.write_in_pieces``).
"""

from __future__ import annotations

import argparse
import os
import resource
import time

FILES, WRITE_BYTES = 64, 8 << 20


def write_files(directory: str, gib: float, write_bytes: int = WRITE_BYTES) -> tuple[float, float]:
    """Write then remove ``gib`` GiB in ``FILES`` files; the wall and system CPU seconds of the writes."""
    buffer = os.urandom(write_bytes)
    paths = [os.path.join(directory, f"fresh-memory-{i}") for i in range(FILES)]
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for p in paths]
    try:
        for k in range(int(gib * 2**30 / write_bytes)):
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
    parser.add_argument("--write-kib", type=int, nargs="+", help="compare these write sizes, each after a pause")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    if args.write_kib:
        for kib in args.write_kib:
            time.sleep(args.pause)
            wall, system = write_files(args.dir, args.gib, kib << 10)
            print(
                f"{args.gib:g} GiB in writes of {kib:,} KiB, after {args.pause:g} s: {wall:.2f} s wall, "
                f"{system:.2f} s system CPU"
            )
        return
    for label in ("first", "right after a removal", f"after {args.pause:g} s"):
        if label.startswith("after"):
            time.sleep(args.pause)
        wall, system = write_files(args.dir, args.gib)
        print(f"{args.gib:g} GiB written, {label}: {wall:.2f} s wall, {system:.2f} s system CPU")


if __name__ == "__main__":
    main()
