"""``discard``: drop a window's unfinished change, leaving the current version as it is."""

from __future__ import annotations

import posixpath

from daskpile._storage import full_url, redacting_errors, remove_tree
from daskpile.engine import _run as run_state
from daskpile.engine._scratch import Scratch
from daskpile.window import snapshot
from daskpile.window.snapshot import Window, WindowReport, report


@redacting_errors
@snapshot.one_change_at_a_time
def discard(dest: str, *, storage_options: dict | None = None) -> WindowReport:
    """Drop the change under way in the window ``dest`` (an interrupted append, expire or compact).

    The files it was writing (a generation the current version does not
    list) and its scratch are removed; the current version is untouched.

    Examples
    --------
    >>> import daskpile
    >>> daskpile.discard("window/").summary
    'nothing under way'
    """
    window = Window.load(dest, storage_options)
    pending = snapshot.read_pending(window.fs, window.path)
    if pending is None:
        return report(window, False, "nothing under way")
    generation = pending.get("generation")
    if _committed(window, pending):  # stopped after its commit, before it cleared its mark: nothing to drop
        snapshot.finish(window.fs, window.path)
        return report(window, False, _committed_already(window, pending))
    if generation is not None and generation not in {g.number for g in window.generations}:
        directory = posixpath.join(window.path, snapshot.generation_dir(generation))
        remove_tree(window.fs, directory)
        name = run_state.scratch_name(full_url(window.fs, directory))
        Scratch.create(pending.get("scratch"), storage_options, 0, name=name, make=False).remove()
    snapshot.finish(window.fs, window.path)
    return report(window, True, f"discarded the unfinished {pending['description']}")


def _committed(window: Window, pending: dict) -> bool:
    """Whether the change ``pending`` records was committed: its generation is in the window (an append, a
    compaction), or the window moved past the version it began on (an expire; one change at a time)."""
    generation = pending.get("generation")
    if generation is not None:
        return generation in {g.number for g in window.generations}
    began = pending.get("version")  # (marks written before daskpile recorded it have none)
    return began is not None and window.version > began


def _committed_already(window: Window, pending: dict) -> str:
    said = f"the {pending['description']} was committed (the window is at version {window.version}) before it was"
    said += " stopped: nothing to discard"
    if pending["command"] == "append":
        said += (
            f"; its rows are generation {pending['generation']}: to drop them, daskpile expire {window.url} "
            f"--generation {pending['generation']}"
        )
    return said
