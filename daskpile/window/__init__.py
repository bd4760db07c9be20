"""Moving windows: piles as circular buffers in time, new rows appended to random piles, old ones expired.

- ``snapshot``: the window's generations, the versions of its manifest, the change under way, retired files;
- ``append``: a new generation, scattered into the piles;
- ``expire``: dropping generations by count or by a column's values;
- ``compact``: each pile's generations merged into one permuted file;
- ``discard``: dropping an unfinished change.
"""

from daskpile.window.append import append
from daskpile.window.compact import compact
from daskpile.window.discard import discard
from daskpile.window.expire import expire
from daskpile.window.snapshot import WindowBusyError, WindowReport

__all__ = ["WindowBusyError", "WindowReport", "append", "compact", "discard", "expire"]
