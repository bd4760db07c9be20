"""``expire``: drop the oldest generations of a window, by count or by the values of a column."""

from __future__ import annotations

import dataclasses
import posixpath
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from daskpile._storage import redacting_errors
from daskpile._words import count
from daskpile.engine import _manifest
from daskpile.sources.parquet import open_parquet, parquet_errors
from daskpile.window import snapshot
from daskpile.window.snapshot import Generation, Window, WindowReport, report

READ_THREADS = 16  # one column of each file: small reads, bound by latency on an object store


@redacting_errors
@snapshot.one_change_at_a_time
def expire(
    dest: str,
    *,
    keep_generations: int | None = None,
    before=None,
    column: str | None = None,
    generations: list[int] | None = None,
    storage_options: dict | None = None,
    retain: str | float | None = None,
) -> WindowReport:
    """Drop generations from the window ``dest``: all but the newest ``keep_generations``, those before a value,
    or the ``generations`` named.

    Only a new version of the manifest is written (and, for
    ``keep_generations`` and ``before``, the dropped generations' source files
    and rows' fingerprints are remembered, so that :func:`append` refuses them): no data file is read
    for ``keep_generations``, and only ``column`` for ``before``.  The files
    dropped stay for readers of older versions until ``retain`` has passed,
    and are removed by a later command.  A generation whose rows straddle
    ``before`` stays, marked so that :func:`compact` removes just its rows
    before the value.  Expiring what is already expired does nothing.

    Parameters
    ----------
    dest
        A window (or a ``shuffle_parquet`` result, its generation 0).
    keep_generations
        Keep the newest this many generations (at least 1).
    before, column
        Drop the generations all of whose rows have ``column`` below
        ``before`` (a value of the column's type, or a string cast to it, such
        as ``"2026-11-01"`` for a timestamp; a time zone's column wants the
        offset, ``"2026-11-01T00:00:00+00:00"``).  A null is never before
        the value: a generation with nulls stays, its other rows before the
        value cut at the next compact.  Cuts marked by several calls all
        apply.
    generations
        Drop these generations (numbers, as the report lists them): a day
        whose files were corrected upstream, before it is appended again.
    storage_options
        Passed to fsspec.
    retain
        As for :func:`append`.

    Returns
    -------
    WindowReport

    Examples
    --------
    >>> import daskpile
    >>> report = daskpile.expire("window/", keep_generations=1)  # window/: generations 0 and 1
    >>> report.generations, report.rows
    ([1], 10000)
    """
    if sum(way is not None for way in (keep_generations, before, generations)) != 1:
        raise ValueError(
            "give one of keep_generations (--keep N), before and column (--before VALUE --column C), or "
            "generations (--generation N)"
        )
    if before is not None and not column:
        raise ValueError("before (--before) needs the column (--column) whose values it is compared with")
    if keep_generations is not None and (isinstance(keep_generations, bool) or int(keep_generations) < 1):
        raise ValueError(f"keep_generations must be a positive integer, got {keep_generations!r}")
    window = Window.load(dest, storage_options)
    key = {"keep_generations": keep_generations, "before": None if before is None else str(before), "column": column}
    if generations is not None:
        generations = key["generations"] = _known_generations(window, generations)
    snapshot.check_idle(window.fs, window.path, "expire", key)
    removed = snapshot.collect(window, retain)
    # marked while the column is read (minutes, on a large window), so that no other change starts meanwhile
    snapshot.begin(window, "expire", key, _describe(key), None)
    try:
        if keep_generations:
            kept = list(window.generations[-int(keep_generations) :])
        elif generations is not None:
            kept = [g for g in window.generations if g.number not in generations]
            if not kept:
                raise ValueError(
                    f"dropping generation{'s' if len(generations) > 1 else ''} {', '.join(map(str, generations))} "
                    f"would leave the window {window.url} empty: append the new files first, then drop these"
                )
        else:
            kept = _cut(window, column, before)
            if not kept:  # (as by name: a mistyped year emptied the window, and the command said it had done so)
                raise ValueError(
                    f"every row of the window {window.url} has {column} before {before}: expiring them would leave "
                    "it empty. Is the value the one meant? If so, append the new files first, then expire"
                )
        _refuse_leaving_no_rows(window, kept, keep_generations)
        if kept == list(window.generations):
            return report(window, False, "nothing to expire", removed=removed)
        dropped = [g for g in window.generations if g.number not in {k.number for k in kept}]
        marked = [g.number for g in kept if g.cuts and g not in window.generations]
        if generations is None:  # (generations dropped by name are to be appended again, corrected)
            snapshot.record_expired(window.fs, window.path, dropped)
        window = window.commit(kept, retain=retain)
    finally:
        snapshot.finish(window.fs, window.path)
    removed += snapshot.collect(window, retain)  # those due now (all of them with retain=0)
    done = []
    if dropped:
        listed = ", ".join(str(g.number) for g in dropped)
        done.append(f"expired generation{'s' if len(dropped) > 1 else ''} {listed} "
                    f"({count(sum(g.rows for g in dropped), 'row')})")  # fmt: skip
    if marked:
        listed = ", ".join(str(n) for n in marked)
        done.append(f"the rows of generation{'s' if len(marked) > 1 else ''} {listed} with {column} before "
                    f"{before} go at the next compact")  # fmt: skip
    return report(window, True, "; ".join(done), removed=removed)


def _refuse_leaving_no_rows(window: Window, kept: list[Generation], keep_generations: int | None) -> None:
    """Refuse to keep only generations without rows (empty days) of a window that has some: ``--keep 2`` after
    two empty days emptied a window of 12,000 rows, and said it had expired them."""
    if any(g.rows for g in kept) or not any(g.rows for g in window.generations):
        return
    empty = ", ".join(str(g.number) for g in kept)
    if keep_generations:
        holding = next(n for n in range(len(kept) + 1, len(window.generations) + 1) if window.generations[-n].rows)
        newest = window.generations[-holding].number
        way = f"keep the newest {holding} (--keep {holding}) to keep the rows of generation {newest}"
    else:
        way = "append the new files first, then expire"
    raise ValueError(
        f"the generations kept ({empty}) hold no rows (days appended empty): expiring the others would leave the "
        f"window {window.url} empty; {way}"
    )


def _known_generations(window: Window, generations) -> list[int]:
    """``generations`` as sorted numbers; one the window never had is refused (one expired since is not)."""
    if isinstance(generations, (int, str)) or not generations:
        raise ValueError(f"generations must be a non-empty list of generation numbers, got {generations!r}")
    numbers = sorted({int(n) for n in generations})
    unknown = [n for n in numbers if not 0 <= n < window.next_generation]
    if unknown:
        held = ", ".join(str(g.number) for g in window.generations)
        raise ValueError(f"the window {window.url} has no generation {', '.join(map(str, unknown))} (it holds {held})")
    for n in numbers:  # merged into a compacted generation: its rows are in that one's files, with other days'
        into = next((g for g in window.generations if n in g.compacted and n != g.number), None)
        if into is not None:
            raise ValueError(
                f"generation {n} was compacted into generation {into.number}, with generations "
                f"{', '.join(map(str, into.compacted))}: its rows cannot be dropped alone; drop generation "
                f"{into.number} to drop them all"
            )
    return numbers


def _describe(key: dict) -> str:
    """What the expire does, as the name of a change ("the unfinished ...", "the ... was committed")."""
    if key.get("generations") is not None:
        return f"expiry of generations {', '.join(map(str, key['generations']))}"
    if key["keep_generations"] is not None:
        return f"expiry keeping the newest {key['keep_generations']} generations"
    return f"expiry of the rows with {key['column']} before {key['before']}"


def _cut(window: Window, column: str, before) -> list[Generation]:
    """The generations with a row at or after ``before`` in ``column``; those with rows on both sides marked."""
    schema = _manifest.arrow_schema(window.base)
    if column not in schema.names:
        raise KeyError(f"column {column!r} is not in the window {window.url} (columns: {', '.join(schema.names)})")
    value = _as_type(before, schema.field(column).type, column)
    rule = {"column": column, "before": _json_value(value)}
    kept = []
    for g in window.generations:
        low, high, nulls = _range(window, g, column)
        if not nulls and (high is None or pc.less(high, value).as_py()):
            continue  # every row before the value (a null is never before it)
        if low is not None and pc.less(low, value).as_py() and rule not in g.cuts:
            g = dataclasses.replace(g, cuts=(*g.cuts, rule))  # every cut marked applies at the compact
        kept.append(g)
    return kept


def _as_type(value, type_: pa.DataType, column: str) -> pa.Scalar:
    """``value`` as a scalar of the column's type (of its values, for a dictionary column)."""
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    # the value is kept in the manifest as JSON (a time as ISO text) and cast back at the compact
    if not (pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_timestamp(type_)
            or pa.types.is_date(type_) or pa.types.is_string(type_) or pa.types.is_large_string(type_)):  # fmt: skip
        raise ValueError(
            f"column {column!r} is of type {type_}: expire by the values of a number, a date, a timestamp or text"
        )
    try:
        return pa.scalar(value).cast(type_) if not isinstance(value, pa.Scalar) else value.cast(type_)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        zone = getattr(type_, "tz", None)
        hint = f" (the column's times are in {zone}: give the value with its offset, 2026-11-01T00:00:00+00:00)"
        raise ValueError(
            f"before={value!r} cannot be compared with column {column!r} of type {type_}: {e}{hint if zone else ''}"
        ) from None


def _json_value(value: pa.Scalar):
    python = value.as_py()
    return python.isoformat() if hasattr(python, "isoformat") else python


def _range(window: Window, generation: Generation, column: str):
    """The least and greatest value of ``column`` in a generation, and whether it has nulls: its files, one column."""
    with ThreadPoolExecutor(READ_THREADS) as pool:
        parts = list(pool.map(lambda name: _min_max(window, name, column), generation.files))
    lows = [low for low, _, _ in parts if low is not None]
    highs = [high for _, high, _ in parts if high is not None]
    low = min(lows, key=lambda s: s.as_py()) if lows else None
    high = max(highs, key=lambda s: s.as_py()) if highs else None
    return low, high, any(nulls for _, _, nulls in parts)


def _min_max(window: Window, name: str, column: str):
    path = posixpath.join(window.path, name)
    with open_parquet(window.fs, path) as parquet, parquet_errors(f"{window.url}/{name}"):
        values = parquet.read(columns=[column], use_threads=False).column(0)
    if pa.types.is_dictionary(values.type):
        values = pa.chunked_array([c.dictionary_decode() for c in values.chunks], values.type.value_type)
    found = pc.min_max(values)
    low, high = found["min"], found["max"]
    unordered = values.null_count > 0  # a null (or NaN) is never before the value: its generation stays
    if pa.types.is_floating(values.type):
        unordered = unordered or pc.any(pc.is_nan(values)).as_py() is True
    return (low if low.is_valid else None), (high if high.is_valid else None), unordered
