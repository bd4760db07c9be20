"""The ``daskpile`` command (also ``python -m daskpile``)."""

import gc
import os
import signal
import sys


def main() -> None:
    """The console script's entry point: ``daskpile.cli`` imported here, where Ctrl-C can stop it in one line."""
    # daskpile does no linear algebra; numpy's OpenBLAS would start a thread per core at import (0.05 s more
    # CPU to import numpy) that spin for a second, taking CPU from the command's own threads.  A LocalCluster's
    # workers get the same setting from distributed.  Set before numpy is imported; a value exported wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Arrow's allocator, mimalloc, asks for transparent huge pages on its arenas.  Each first touch of one then
    # takes and zeroes 2 MiB at once, which on a VM that reports freed memory to its host (free page reporting)
    # comes back from the host page by page: a lines shuffle of 5 M lines spent 26 % of its CPU samples zeroing
    # huge pages (``perf``), 2 % without them, and took 2.9 s against 3.5 (benchmarks/README.md, stop 82).
    # mimalloc's own switch, read once as pyarrow loads; a LocalCluster's workers inherit it.  A value exported
    # wins.
    os.environ.setdefault("MIMALLOC_ALLOW_THP", "0")
    try:
        from daskpile.cli import main as run
    except KeyboardInterrupt:
        print("daskpile: interrupted", file=sys.stderr)
        sys.exit(130)
    # The modules' objects live as long as the process: kept out of garbage collection, whose full collection at
    # exit walked them all (0.07-0.1 s of a command; the passes' own collections took 1 ms of a lines shuffle)
    gc.freeze()
    try:
        run(console_script=True)
    finally:
        # The command is over and has said how it ended; Python's exit (closing the fork server, distributed's
        # atexit hooks) would turn a late Ctrl-C into exit status -2.
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    main()
