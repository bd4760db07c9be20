"""``compact``: merge each pile's generations into one permuted file, applying the cuts ``expire`` marked."""

from __future__ import annotations

import dataclasses
import datetime
import posixpath

import dask
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daskpile import _kernels, _random
from daskpile._compute import compute, total_threads
from daskpile._storage import full_url, is_local, redacting_errors, remove_tree
from daskpile._words import count
from daskpile.checks import _fingerprint
from daskpile.checks._fingerprint import Fingerprint
from daskpile.engine import _manifest, _passes, _sizing
from daskpile.engine._pipeline import VerificationError, _pile_groups
from daskpile.sources.parquet import open_parquet, parquet_errors
from daskpile.sources.schemas import nullable, with_geo_of_all
from daskpile.window import snapshot
from daskpile.window.snapshot import Generation, Window, WindowReport, nulls_of, report


@dataclasses.dataclass(frozen=True)
class _Compacted:
    pile: int
    name: str
    rows: int
    fingerprint: Fingerprint
    cut: Fingerprint  # of the rows removed by the cuts


@redacting_errors
@snapshot.one_change_at_a_time
def compact(
    dest: str,
    *,
    storage_options: dict | None = None,
    progress: bool = False,
    retain: str | float | None = None,
) -> WindowReport:
    """Merge every pile's generations of the window ``dest`` into one permuted file: a full second pass.

    For readers that want plain files: after it, the window is one
    generation, each pile one file in a uniformly random order (keyed by
    seed, the new generation and the pile), read in file order like any
    ``shuffle_parquet`` result.  Rows ``expire`` marked (before a value, in a
    generation that straddled it) are removed here.  The rows written plus
    those removed are checked against the generations' fingerprints, and
    every file's rows against the count the manifest records (a generation
    appended with ``verify=False`` has no fingerprint, and neither has the
    compacted one then).  A window of one generation and no cut has nothing
    to compact.  Interrupted,
    it resumes from the piles it finished.

    Parameters
    ----------
    dest
        A window.
    storage_options, progress
        As for ``shuffle_parquet``.
    retain
        As for :func:`append`.

    Returns
    -------
    WindowReport

    Examples
    --------
    >>> import daskpile
    >>> report = daskpile.compact("window/")  # window/: generations 0 and 1
    >>> report.generations, report.rows, len(daskpile.read_manifest("window/")["files"])
    ([2], 40000, 4)
    """
    window = Window.load(dest, storage_options)
    pending = snapshot.read_pending(window.fs, window.path)
    if pending and pending["command"] == "compact" and pending["generation"] in {g.number for g in window.generations}:
        snapshot.finish(window.fs, window.path)  # interrupted after its version was written: done
        summary = f"compacted into generation {pending['generation']} already"
        return report(window, False, summary, removed=snapshot.collect(window, retain))
    key = {"version": window.version}
    snapshot.check_idle(window.fs, window.path, "compact", key)
    removed = snapshot.collect(window, retain)
    if len(window.generations) <= 1 and not any(g.cuts for g in window.generations):
        return report(window, False, "one generation and no cut: nothing to compact", removed=removed)
    numbers = [g.number for g in window.generations]
    _check_room(window)
    description = f"compaction of generations {', '.join(map(str, numbers))}"
    pending = snapshot.begin(window, "compact", key, description, window.next_generation)
    generation = pending["generation"]
    try:
        compacted = _merge_piles(window, generation, progress)
    except VerificationError:  # nothing to resume: the window stays as it was, with no change under way
        remove_tree(window.fs, posixpath.join(window.path, snapshot.generation_dir(generation)))
        snapshot.finish(window.fs, window.path)
        raise
    new = _generation(window, generation, compacted)
    window = window.commit([new], next_generation=generation + 1, retain=retain)
    snapshot.finish(window.fs, window.path)
    removed += snapshot.collect(window, retain)  # those due now (all of them with retain=0)
    cut = _fingerprint.total(c.cut for c in compacted)
    removed_rows = f", {count(cut.rows, 'row')} cut" if cut.rows else ""
    summary = (
        f"compacted generations {', '.join(map(str, numbers))} into generation {generation} "
        f"({count(new.rows, 'row')}{removed_rows})"
    )
    return report(window, True, summary, generation=generation, removed=removed)


def _check_room(window: Window) -> None:
    """Refuse before beginning where a local disk cannot hold the compacted copy beside the window's files
    (about their size: it failed halfway on "No space left on device", its change left under way)."""
    if not is_local(window.fs):
        return
    found = window.fs.find(window.path, withdirs=False, detail=True)
    listed = {posixpath.join(window.path, name) for g in window.generations for name in g.files}
    # (less what an interrupted compaction wrote already: a resumed one was refused the space it had taken)
    written = posixpath.join(window.path, snapshot.generation_dir(window.next_generation)) + "/"
    nbytes = sum(info["size"] for path, info in found.items() if path in listed) - sum(
        info["size"] for path, info in found.items() if path.startswith(written)
    )
    _sizing.check_room(window.fs, window.path, nbytes, "window", "expire generations first (daskpile expire)")


def _merge_piles(window: Window, generation: int, progress: bool) -> list[_Compacted]:
    """Every pile merged, in Dask tasks of a few piles each; checked against the generations' fingerprints."""
    files_of_pile: list[list[tuple[str, tuple, int]]] = [[] for _ in range(window.piles)]
    for g in window.generations:
        for name, pile, rows in zip(g.files, g.file_piles, g.rows_per_file, strict=True):
            files_of_pile[pile].append((name, g.cuts, rows))
    directory = snapshot.generation_dir(generation)
    # (as appends conform to it: a window made by a daskpile whose plans kept nested fields' flags may have taken
    # nulls inside its lists since)
    schema = nullable(_manifest.arrow_schema(window.base))
    tasks = [
        dask.delayed(_merge_group)(
            window.fs, window.path, [(j, files_of_pile[j]) for j in group], window.seed, generation, window.piles,
            directory, schema, dask_key_name=f"daskpile-compact-{group[0]:06d}-{window.seed}-{generation}",
        )
        for group in _pile_groups(list(range(window.piles)), total_threads())
    ]  # fmt: skip
    compacted = sorted((c for group in compute(tasks, progress=progress) for c in group), key=lambda c: c.pile)
    recorded = [Fingerprint.from_json(g.fingerprint) if g.fingerprint else None for g in window.generations]
    if all(r is not None for r in recorded):
        before = _fingerprint.total(recorded)
        after = _fingerprint.total(c.fingerprint for c in compacted) + _fingerprint.total(c.cut for c in compacted)
        if before != after:
            raise VerificationError(
                f"compacting {window.url}: the generations recorded {before}, the rows written and cut add up to "
                f"{after}; the window's manifest is unchanged"
            )
    return compacted


def _merge_group(fs, path, piles, seed, generation, total_piles, directory, schema) -> list[_Compacted]:
    """A few piles, one after the other (memory holds one pile): read, cut, permute, write."""
    results = []
    for pile, files in piles:
        name = posixpath.join(directory, _manifest.part_name(pile, total_piles))
        target = posixpath.join(path, name)
        stamp = {"pile": pile, "piles": total_piles, "seed": seed, "compacted_into": generation,
                 "from": [f for f, _, _ in files], "cuts": [list(rules) for _, rules, _ in files]}  # fmt: skip
        found = _passes.pile_stamp(fs, target)
        if found is not None and all(found.get(k) == v for k, v in stamp.items()):
            results.append(_Compacted(pile, name, found["rows"], *_fingerprints(found)))
            continue
        kept, cut, read = [], Fingerprint(), []
        for file_name, rules, recorded_rows in files:
            table = _read(fs, path, file_name)
            read.append((table.schema, table.num_rows))
            if table.num_rows != recorded_rows:  # what a fingerprint would catch, for generations without one
                raise VerificationError(
                    f"compacting {full_url(fs, path)}: {file_name} holds {count(table.num_rows, 'row')}, the "
                    f"window's manifest recorded {recorded_rows:,}: it changed since it was written; the window's "
                    "manifest is unchanged"
                )
            if rules:
                table, keep = _kernels.selectable(table), _kept(table, rules)
                cut = cut + _fingerprint.of(table.filter(pc.invert(keep)))
                table = table.filter(keep)
            kept.append(table.cast(schema) if not table.schema.equals(schema) else table)
        merged = pa.concat_tables(kept) if kept else _kernels.empty_table(schema)
        rng = _random.keyed(seed, _random.COMPACT, generation, pile)
        merged = _kernels.permute(merged, rng)
        stamp.update(rows=merged.num_rows, cut=cut.to_json())
        # (a GeoParquet window's: the merged files' extent, not the window's first data's)
        # (a file written before its stamp said so has the window's first bbox: it gives none, and the union none)
        files = [s if _passes.stamp_of(s).get(_passes.GEO_OF_ROWS) else s.remove_metadata() for s, _ in read]
        geo = with_geo_of_all(schema, files, [n for _, n in read])
        _, written = _passes._write_stamped(merged, fs, target, geo, stamp, True)
        results.append(_Compacted(pile, name, merged.num_rows, written, cut))
        del merged, kept
    return results


def _fingerprints(stamp: dict) -> tuple[Fingerprint, Fingerprint]:
    return Fingerprint.from_json(stamp["fingerprint"]), Fingerprint.from_json(stamp["cut"])


def _read(fs, path: str, name: str) -> pa.Table:
    with open_parquet(fs, posixpath.join(path, name)) as parquet, parquet_errors(name):
        return parquet.read(use_threads=False)


def _kept(table: pa.Table, rules: tuple[dict, ...]) -> pa.ChunkedArray:
    """Which rows stay: for every cut, ``column`` null or at or after ``before`` (a null is never before)."""
    keep = pa.chunked_array([pa.array(np.ones(table.num_rows, dtype=bool))])
    for rule in rules:
        values = table.column(rule["column"])
        if pa.types.is_dictionary(values.type):
            values = pa.chunked_array([c.dictionary_decode() for c in values.chunks], values.type.value_type)
        value = pa.scalar(rule["before"]).cast(values.type)
        after = pc.fill_null(pc.greater_equal(values, value), True)
        if pa.types.is_floating(values.type):  # a NaN, as a null, is never before the value
            after = pc.or_(after, pc.fill_null(pc.is_nan(values), False))
        keep = pc.and_(keep, after)
    return keep


def _generation(window: Window, number: int, compacted: list[_Compacted]) -> Generation:
    merged = window.generations
    return Generation(
        number=number,
        files=tuple(c.name for c in compacted),
        file_piles=tuple(c.pile for c in compacted),
        rows_per_file=tuple(c.rows for c in compacted),
        # the rows written, checked against the generations' fingerprints only if every one has one
        fingerprint=_fingerprint.total(c.fingerprint for c in compacted).to_json()
        if all(g.fingerprint for g in merged)
        else None,
        source_files=tuple(s for g in merged for s in g.source_files),
        source_stamps=tuple(s for g in merged for s in g.source_stamps),
        seed=window.seed,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        compacted=tuple(n for g in merged for n in (g.compacted or (g.number,))),
        null_columns=nulls_of(merged),
    )
