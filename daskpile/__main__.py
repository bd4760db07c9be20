"""The ``daskpile`` command (also ``python -m daskpile``)."""

import signal
import sys


def main() -> None:
    """The console script's entry point: ``daskpile.cli`` imported here, where Ctrl-C can stop it in one line."""
    try:
        from daskpile.cli import main as run
    except KeyboardInterrupt:
        print("daskpile: interrupted", file=sys.stderr)
        sys.exit(130)
    try:
        run(console_script=True)
    finally:
        # The command is over and has said how it ended; Python's exit (closing the fork server, distributed's
        # atexit hooks) would turn a late Ctrl-C into exit status -2.
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    main()
