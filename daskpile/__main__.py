"""``python -m daskpile``: the ``daskpile`` command."""

from daskpile.cli import main

if __name__ == "__main__":
    main()
