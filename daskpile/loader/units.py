"""What a loader reads: the files (units) of a pile dataset, their rows, whether they are lazy piles."""

from __future__ import annotations

import contextlib
import dataclasses
import decimal
import functools
import hashlib
import itertools
import json
import numbers
import operator
import posixpath
import re
import warnings
from concurrent.futures import ThreadPoolExecutor

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from daskpile._kernels import integer_or_boolean, integer_vector_depth, vector_leaf_paths
from daskpile._storage import FileVersion, filesystem, full_url, is_local, listed_infos, stamp_size
from daskpile._words import count
from daskpile.engine import _manifest, _outputs
from daskpile.sources import hive
from daskpile.sources.listing import literal_prefix
from daskpile.sources.parquet import INT96_UNIT, open_parquet, parquet_errors
from daskpile.sources.schemas import without_views

DASK_NULL_INDEX = "__null_dask_index__"  # what Dask's to_parquet writes for an unnamed index: not data
FOOTER_THREADS = 16  # footers are small reads, so on an object store their latency, not the cores, bounds them


@dataclasses.dataclass(frozen=True)
class Units:
    """The files of a pile dataset in a fixed order, the rows the loader takes from each.

    A unit is one file, or for a moving window a pile: its files, one per
    generation, loaded and permuted together.  ``lazy``: the units are piles
    not permuted as a whole (``second_pass="lazy"``, or a window's piles), so
    a part of one must be a random part, not a row range.  ``rows`` are after
    ``filter``, when there is one.  ``version``: of a window's manifest (0 for a shuffle result, None
    without a manifest).
    """

    fs: fsspec.AbstractFileSystem
    paths: tuple[tuple[str, ...], ...]  # the files of each unit
    rows: np.ndarray
    lazy: bool
    schema: pa.Schema
    filter: ds.Expression | None  # noqa: F821 - pyarrow.dataset, imported only with filters
    version: int | None = None
    keys: FolderKeys | None = None  # key=value folders above the files (``to_parquet(partition_on=...)``)
    # Of the integer and boolean columns: those holding a null in some file, and those of which it is not
    # known (a result written before daskpile recorded it, files without null counts): see ``_numpy``
    nulls: frozenset[str] = frozenset()
    uncounted: frozenset[str] = frozenset()
    # Each file's version when the loader was made (None where the store lists none): a file read is that
    # version, or the loader says the dataset changed, not rows of two shuffles in one epoch
    versions: tuple[tuple[FileVersion | None, ...], ...] = ()
    content: str = ""  # see ``content_key``
    content_before: str | None = None  # the key states saved before pile stamps were part of it had, if other
    # a manifest or a footer stamp says daskpile wrote the files (else they are some folder's, maybe in order)
    from_daskpile: bool = True

    def url(self, unit: int) -> str:
        files = self.paths[unit]
        more = f" (and {len(files) - 1} more files of its pile)" if len(files) > 1 else ""
        return full_url(self.fs, files[0]) + more

    @property
    def total(self) -> int:
        return int(self.rows.sum())

    @functools.cached_property
    def key(self) -> str:
        """What tells these units from others' (another shuffle of the same rows): their files' names and rows,
        not where the files are, so that a copy elsewhere resumes a loader's state."""
        names = [[posixpath.basename(p) for p in files] for files in self.paths]
        return hashlib.sha256(json.dumps([names, self.rows.tolist()]).encode()).hexdigest()[:16]

    @functools.cached_property
    def selection(self) -> str | None:
        """Which rows of each file the filter selects, as a digest (None: every row, or no filter): filters that
        select as many rows of each file, and other ones (fold 0 against fold 1), refuse each other's states.
        Taken when a state is first taken or loaded, not when the loader is made: it reads the filter's columns
        whole, where counting the rows lets statistics skip row groups (a sorted file of 16 M rows: 0.39 s
        against 0.04)."""
        if self.filter is None:
            return None
        paths = [path for files in self.paths for path in files]
        with ThreadPoolExecutor(FOOTER_THREADS) as pool:
            selected = list(pool.map(lambda p: _selected(self.fs, p, self.filter, self.keys), paths))
        if all(s is None for s in selected):
            return None
        return hashlib.sha256(json.dumps(selected).encode()).hexdigest()[:16]

    def listed(self, unit: int, file: int = 0) -> FileVersion | None:
        """The version of a unit's file when the loader was made."""
        return self.versions[unit][file] if self.versions else None


def content_key(manifest: dict | None, infos: list[dict | None], stamps: list[bytes | None] = ()) -> str:
    """What tells a shuffle's files from another shuffle's of the same rows into files of the same names and
    rows (one pile, ``rows_per_file``), which ``Units.key`` does not: a result's seed and fingerprints, a
    window's generations; of other datasets, the files' sizes and footer stamps (``shuffle(ddf).to_parquet``'s
    seed, ``shuffle_parquet``'s pile stamp: two seeds' files of fixed-width columns have one size, and a state
    resumed on the other repeated rows, a new user's trial).  A copy of the files, with their manifest, has the
    same."""
    if manifest is not None:
        generations = (manifest.get("window") or {}).get("generations", [])
        said = [
            manifest.get("seed"),
            manifest.get("fingerprint"),
            manifest.get("file_fingerprints"),
            [[g.get(k) for k in ("number", "seed", "fingerprint", "created")] for g in generations],
        ]
    else:
        said = [None if info is None else info.get("size") for info in infos]
        if any(stamps):  # (files without one keep the key states saved before stamps had)
            said = [said, [None if stamp is None else stamp.decode("utf-8", "replace") for stamp in stamps]]
    return hashlib.sha256(json.dumps(said, sort_keys=True, default=str).encode()).hexdigest()[:16]


def discover(
    path: str | list[str], storage_options: dict | None, filters=None, version: int | None = None, columns=None
) -> Units:
    """The units of ``path``: a daskpile result's files as its manifest lists them, else Parquet files by name.

    A manifest gives the rows without reading a footer; other datasets have
    their footers read, in threads.  With ``filters`` (pyarrow DNF or an
    expression), the rows that pass are counted once, here, so that every
    rank can plan the epoch.  A window's units are its piles, as the version
    ``_daskpile.json`` holds (or ``version``) lists them.  Files without a
    manifest must agree on the ``columns`` read (all: the first file's).
    """
    if version is not None and (isinstance(version, bool) or not isinstance(version, numbers.Integral) or version < 0):
        raise ValueError(f"version must be a version number, 0 or more, got {version!r}")
    fs, paths, manifest = _manifest.result_files(path, storage_options, role="path")
    _outputs.require_parquet(manifest, full_url(fs, path), "PileLoader")
    if manifest is None:
        paths = _in_one_order(fs, paths)
    if version is not None and version != (None if manifest is None else _manifest.version_of(manifest)):
        if manifest is None:
            raise ValueError(f"version={version}: {path!r} is not a daskpile result")
        current = _manifest.version_of(manifest)
        if "window" not in manifest:
            raise ValueError(f"version={version}: {path!r} is a shuffle result, not a moving window: its version is 0")
        if version > current:
            raise ValueError(f"version={version}: the window {path!r} is at version {current}")
        directory = filesystem(path, storage_options)[1]
        manifest = _manifest.window_version(fs, directory, version)
        paths = [posixpath.join(directory, name) for name in manifest["files"]]
    expression = None if filters is None else _expression(filters, lambda: _filtered_schema(fs, paths, manifest))
    infos = check_listed_files(fs, paths, manifest) if manifest is not None else None
    window = (manifest or {}).get("window")
    keys = FolderKeys.below(path, fs, paths, storage_options) if manifest is None else None
    if manifest is not None and expression is None:
        file_rows = np.array(manifest["rows_per_file"], dtype=np.int64)
        schema = _manifest.arrow_schema(manifest)
        lazy = manifest.get("second_pass") == "lazy"
        counted = None
    else:
        with ThreadPoolExecutor(FOOTER_THREADS) as pool:
            counted = list(pool.map(lambda p: _count(fs, p, expression, keys), paths))
        file_rows = np.array([c.rows for c in counted], dtype=np.int64)
        if manifest is not None:  # counted after the filter: the files must still hold what the manifest says
            for path, c, listed in zip(paths, counted, manifest["rows_per_file"], strict=True):
                check_rows(full_url(fs, path), c.total, listed, since="the result was written")
        if manifest is None:
            _check_same_columns(fs, paths, [c.schema for c in counted], columns)
            if isinstance(path, str):  # (files named one by one may be piles of two shuffles on purpose)
                _check_one_shuffle(fs, paths, counted)
        schema = counted[0].schema if keys is None else _with_keys(counted[0].schema, keys)
        # files of a lazy result named one by one or by a glob: their footers say they are lazy piles
        lazy = any(c.lazy for c in counted)
    # Views (string_view, list_view: Polars and DataFusion write them) are read as their large forms: Arrow's
    # take and filter select neither, and a batch sliced from views holds its whole pile's strings
    schema = without_views(schema)
    version = None if manifest is None else _manifest.version_of(manifest)
    nulls, uncounted = _nulls(manifest, counted, keys, schema)
    if infos is None:
        infos = [c.info for c in counted]
    listed = {p: None if info is None else FileVersion.listed(fs, info) for p, info in zip(paths, infos, strict=True)}
    content = content_key(manifest, infos, [c.stamp or c.pile for c in counted] if manifest is None else ())
    # (files named one by one, which shuffle_parquet's pile stamps tell apart now: states saved before keep theirs)
    before = content_key(manifest, infos, [c.stamp for c in counted]) if manifest is None else None
    ours = manifest is not None or any(c.stamp or c.pile for c in counted)
    if window is not None:
        file_piles, piles = window["file_piles"], manifest["piles"]
    elif keys is not None:
        file_piles, piles = _piles_by_name(paths)
    else:
        units = tuple((p,) for p in paths)
        versions = tuple((listed[p],) for p in paths)
        return Units(fs, units, file_rows, lazy, schema, expression, version, None, nulls, uncounted, versions, content,
                     content_before=before, from_daskpile=ours)  # fmt: skip
    units = pile_files(paths, file_piles, piles)
    rows = np.bincount(np.array(file_piles, dtype=np.int64), weights=file_rows, minlength=piles).astype(np.int64)
    # a pile of several files (generations, key values) is in their order, so it is read whole and
    # permuted as a lazy pile is
    lazy = lazy or any(len(u) > 1 for u in units)
    versions = tuple(tuple(listed[p] for p in files) for files in units)
    return Units(fs, units, rows, lazy, schema, expression, version, keys, nulls, uncounted, versions, content,
                 content_before=before, from_daskpile=ours)  # fmt: skip


def _nulls(manifest: dict | None, counted, keys: FolderKeys | None, schema: pa.Schema):
    """(nulls, uncounted) of ``Units``: from the manifest's record, else from the footers read already."""
    numeric = frozenset(f.name for f in schema if integer_or_boolean(f.type))
    if manifest is not None:
        recorded = manifest.get("null_columns")
        return (numeric & frozenset(recorded), frozenset()) if recorded is not None else (frozenset(), numeric)
    nulls = frozenset().union(*(c.nulls for c in counted))
    if keys is not None:  # a key folder of no value (__HIVE_DEFAULT_PARTITION__) is a null of its column
        nulls |= {f.name for values in keys.values.values() for f, v in zip(keys.schema, values, strict=True)
                  if not v.is_valid}  # fmt: skip
    return nulls & numeric, frozenset().union(*(c.uncounted for c in counted)) & numeric


def _in_one_order(fs, paths: list[str]) -> list[str]:
    """Files named by a list in name order, as a folder's are: each rank plans the epoch from its own list, and
    lists made on each machine (``glob.glob``, ``os.listdir``) come in any order (one in another order on a
    rank lost and repeated rows).  A file named twice is refused: its rows would be read twice an epoch."""
    ordered = sorted(paths)
    twice = [a for a, b in itertools.pairwise(ordered) if a == b]
    if twice:
        raise ValueError(f"{full_url(fs, twice[0])!r} is named twice: its rows would be read twice an epoch")
    return ordered


DASK_PART = re.compile(r"part\.([0-9]+)\.parquet")  # Dask's to_parquet names: part.<partition>.parquet


def _piles_by_name(paths: list[str]) -> tuple[list[int], int]:
    """Each file's pile when the files are Dask's ``part.N.parquet`` in key folders, and how many piles.

    ``shuffle(ddf).to_parquet(partition_on=...)`` writes pile 3's rows as
    ``day=mon/part.3.parquet``, ``day=tue/part.3.parquet``...: read alone,
    each would give batches of one day.  Files named otherwise (pyarrow's
    ``part-0.parquet`` in every folder of a lake) are each a unit of their
    own: grouping them by name could make most of a lake one unit, read whole.

    >>> _piles_by_name(["d=1/part.0.parquet", "d=2/part.0.parquet", "d=2/part.1.parquet"])
    ([0, 0, 1], 2)
    >>> _piles_by_name(["d=1/part-0.parquet", "d=2/part-0.parquet"])
    ([0, 1], 2)
    """
    parts = [DASK_PART.fullmatch(posixpath.basename(p)) for p in paths]
    if not all(parts):
        return list(range(len(paths))), len(paths)
    numbers = sorted({int(m.group(1)) for m in parts})
    pile = {n: i for i, n in enumerate(numbers)}
    return [pile[int(m.group(1))] for m in parts], len(numbers)


@dataclasses.dataclass(frozen=True)
class FolderKeys:
    """The key=value folders of a dataset's files, as columns: their schema and each file's values."""

    schema: pa.Schema
    values: dict[str, tuple]  # file path -> its key values (Arrow scalars), in schema order

    @classmethod
    def below(cls, root: str | list[str], fs, paths: list[str], storage_options) -> FolderKeys | None:
        """The keys of the folders between directory ``root`` and ``paths``, or None when there are none.

        Below the directory the loader was given (or a glob's part before its
        first wildcard), anywhere in the paths of a list of files, as
        pyarrow.dataset and Dask read a hive dataset.  A key that is also a
        column of the files is left to the files.  Types as pyarrow infers them.
        """
        # a directory, or a glob's part before its first wildcard; a list's paths are read whole
        prefix = (
            ""
            if not isinstance(root, str)
            else literal_prefix(filesystem(root, storage_options)[1].rstrip("/") + "/") + "/"
        )
        pairs = [hive.folder_keys(p[len(prefix) :]) if p.startswith(prefix) else [] for p in paths]
        if not any(pairs):
            return None
        with open_parquet(fs, paths[0]) as parquet:
            columns = set(parquet.schema_arrow.names)
        pairs = [[(key, value) for key, value in found if key not in columns] for found in pairs]
        if not any(pairs):
            return None
        urls = [full_url(fs, p) for p in paths]
        schema = hive.key_schema(pairs, "hive", urls)
        values = {p: hive.key_values(k, schema, u) for p, k, u in zip(paths, pairs, urls, strict=True)}
        return cls(schema, values)

    def value(self, path: str, name: str) -> pa.Scalar:
        """The value of key ``name`` for the file ``path``."""
        return self.values[path][self.schema.get_field_index(name)]

    def expression(self, path: str):
        """The file's keys as a pyarrow.dataset partition expression, from which its key columns are filled."""
        import pyarrow.dataset as ds

        terms = [
            ds.field(f.name).is_null() if not v.is_valid else ds.field(f.name) == v
            for f, v in zip(self.schema, self.values[path], strict=True)
        ]
        return functools.reduce(operator.and_, terms)


def _with_keys(schema: pa.Schema, keys: FolderKeys) -> pa.Schema:
    """A file's schema and the key columns after it, as pyarrow.dataset reads a hive dataset."""
    clash = [name for name in keys.schema.names if name in schema.names]
    if clash:
        raise ValueError(f"column {clash[0]!r} is both in the files and a key=value folder above them")
    return pa.schema([*schema, *keys.schema], metadata=schema.metadata)


def pile_files(paths: list[str], file_piles: list[int], piles: int) -> tuple[tuple[str, ...], ...]:
    """The files of each pile of a window, in their order, in one pass.

    >>> pile_files(["a", "b", "c"], [1, 0, 1], 2)
    (('b',), ('a', 'c'))
    """
    grouped: list[list[str]] = [[] for _ in range(piles)]
    for path, pile in zip(paths, file_piles, strict=True):
        grouped[pile].append(path)
    return tuple(tuple(g) for g in grouped)


def _expression(filters, schema_of=lambda: None) -> ds.Expression:  # noqa: F821
    """The dataset expression of ``filters`` (pyarrow's tuples, or an expression), where a ``decimal.Decimal``
    compared with a decimal column of the schema ``schema_of()`` gives (asked for only then: it may read a
    footer) is first brought to the column's scale (``_at_scale``).

    pyarrow 21 compares a decimal column with a decimal of another scale as if the value's digits were at the
    column's scale: ``price > Decimal("5")`` on a decimal(12, 2) column as ``price > 0.05`` (994 rows of 1,000
    where 499 are).
    """
    import pyarrow.dataset as ds  # only with filters: it imports pandas (0.3 s, holding the GIL)

    if isinstance(filters, ds.Expression):
        return filters
    try:
        expression = pq.filters_to_expression(filters)  # checks their form, and is the answer when no scale differs
    except (ValueError, TypeError, IndexError) as e:  # ("not enough values to unpack (expected 3, got 2)")
        raise ValueError(
            f"filters={filters!r} is not a filter: give (column, op, value) terms, in a list (all must hold) or a list "
            f"of lists (any list must), or a pyarrow.dataset expression ({e})"
        ) from None
    # One conjunction of terms, or a list of them; a term is a tuple or a list (filters read from JSON or YAML)
    conjunctions = [filters] if isinstance(filters[0][0], str) else filters
    conjunctions = [[tuple(term) for term in conjunction] for conjunction in conjunctions]
    terms = [term for conjunction in conjunctions for term in conjunction]
    if not any(_decimals(value) for _, _, value in terms):
        return expression
    scales = {f.name: f.type.scale for f in schema_of() or () if pa.types.is_decimal(f.type)}
    if not any(name in scales and _decimals(value) for name, _, value in terms):
        return expression

    def predicate(name, op, value):
        if name in scales and _decimals(value):
            return _at_scale(name, op, value, scales[name])
        return pq.filters_to_expression([(name, op, value)])

    return functools.reduce(
        operator.or_,
        (functools.reduce(operator.and_, (predicate(*term) for term in conjunction)) for conjunction in conjunctions),
    )


def _decimals(value) -> bool:
    values = value if isinstance(value, (list, tuple, set)) else [value]
    return any(isinstance(v, decimal.Decimal) and v.is_finite() for v in values)


def _at_scale(name: str, op: str, value, scale: int):
    """``name op value`` with every decimal value at ``scale``, the column's; a value between two of the
    column's steps (4.999 at scale 2) is compared with the step below or above it, as exactly."""
    import pyarrow.dataset as ds

    field = ds.field(name)
    step = decimal.Decimal(1).scaleb(-scale)
    context = decimal.Context(prec=80)

    def down(v):
        return v.quantize(step, rounding=decimal.ROUND_FLOOR, context=context)

    def up(v):
        return v.quantize(step, rounding=decimal.ROUND_CEILING, context=context)

    def exact(v):
        return not isinstance(v, decimal.Decimal) or not v.is_finite() or down(v) == v

    if op in ("in", "not in"):
        # A value between two steps equals no row: it leaves the set
        kept = [down(v) if isinstance(v, decimal.Decimal) and v.is_finite() else v for v in value if exact(v)]
        member = field.isin(kept)
        return member if op == "in" else ~member
    if exact(value):
        value = down(value) if isinstance(value, decimal.Decimal) and value.is_finite() else value
        return pq.filters_to_expression([(name, op, value)])
    below, above = down(value), up(value)
    if op in ("=", "=="):  # no row: false, or null for a null, as the comparison would be
        return (field > below) & (field < above)
    if op == "!=":
        return (field <= below) | (field >= above)
    return {">": field > below, ">=": field >= above, "<": field < above, "<=": field <= below}[op]


def _filtered_schema(fs, paths: list[str], manifest: dict | None) -> pa.Schema | None:
    """The schema filters are given against: the manifest's, or the first file's footer's."""
    if manifest is not None:
        return _manifest.arrow_schema(manifest)
    if not paths:
        return None
    with open_parquet(fs, paths[0]) as parquet:
        return parquet.schema_arrow


@dataclasses.dataclass(frozen=True)
class _Counted:
    rows: int  # that pass the filter
    schema: pa.Schema
    lazy: bool
    total: int  # in the file
    nulls: frozenset[str] = frozenset()  # integer and boolean columns with a null, by the footer's null counts
    uncounted: frozenset[str] = frozenset()  # integer and boolean columns the footer has no null count of
    info: dict | None = None  # the file's, as the store lists it (size and version), before its footer was read
    stamp: bytes | None = None  # its footer's ``shuffle(ddf).to_parquet`` stamp (see ``content_key``)
    pile: bytes | None = None  # its footer's ``shuffle_parquet`` pile stamp


def _count(fs, path: str, expression, keys: FolderKeys | None) -> _Counted:
    info = _info(fs, path)
    with open_parquet(fs, path) as parquet:
        footer = parquet.metadata.metadata or {}
        pile = footer.get(_manifest.PILE_METADATA_KEY)
        lazy = bool(pile) and json.loads(pile).get("lazy", False)
        stamp = footer.get(_manifest.SHUFFLE_METADATA_KEY)
        schema, total = without_views(parquet.schema_arrow), parquet.metadata.num_rows  # (read so: see Units)
        nulls, uncounted = _null_counts(parquet.metadata, schema)
        if expression is None:
            return _Counted(total, schema, lazy, total, nulls, uncounted, info, stamp, pile)
    with parquet_errors(full_url(fs, path)), _filter_errors([*schema.names, *(keys.schema.names if keys else [])]):
        dataset = parquet_dataset(fs, path, keys, schema if keys is None else _with_keys(schema, keys))
        return _Counted(dataset.count_rows(filter=expression), schema, lazy, total, nulls, uncounted, info, stamp, pile)


def _selected(fs, path: str, expression, keys: FolderKeys | None) -> str | None:
    """Which rows of a file ``expression`` selects, as a digest; None if it selects every one."""
    with open_parquet(fs, path) as parquet:
        schema = without_views(parquet.schema_arrow)
    with parquet_errors(full_url(fs, path)):
        dataset = parquet_dataset(fs, path, keys, schema if keys is None else _with_keys(schema, keys))
        passed = dataset.to_table(columns={"passed": expression}).column("passed").fill_null(False)
    if pc.all(passed).as_py() in (True, None):  # (None: a file of no rows)
        return None
    return hashlib.sha256(np.packbits(passed.to_numpy())).hexdigest()[:16]


def _info(fs, path: str) -> dict | None:
    """``fs.info`` of a file (an object store's from its listing of the folder, just made), None if unknown."""
    try:
        return fs.info(path)
    except (OSError, NotImplementedError, ValueError):  # (not there: the footer's read names it)
        return None


def _null_counts(footer: pq.FileMetaData, schema: pa.Schema) -> tuple[frozenset[str], frozenset[str]]:
    """The integer and boolean columns of a file with a null, and those its footer has no null count of."""
    wanted = {f.name for f in schema if integer_or_boolean(f.type)}
    # Only those columns' chunks: a wide file of many row groups has row groups x columns of them
    columns = {i: footer.schema.column(i).path for i in range(footer.num_columns)}
    columns = {i: name for i, name in columns.items() if name in wanted}
    nulls, uncounted = set(), set()
    for group in range(footer.num_row_groups if columns else 0):
        row_group = footer.row_group(group)
        if not row_group.num_rows:  # (an empty pile's, written by Dask's to_parquet without statistics)
            continue
        for i, name in columns.items():
            stats = row_group.column(i).statistics
            if stats is None or not stats.has_null_count:
                uncounted.add(name)
            elif stats.null_count:
                nulls.add(name)
    return frozenset(nulls), frozenset(uncounted)


def numpy_would_refuse(units: Units, columns: list[str]) -> tuple[str, str, int | None, str] | None:
    """(column, kind, value, file) of a column that ``output='numpy'`` would refuse part way through an epoch,
    found in the files' footers when the loader is made: ``"wide"``, integers past 2**53 in a column holding a
    null (float64 would round them; ``value``, one of them), or ``"vectors"``, vectors of integers or booleans
    with a null (a null vector too).  None if no footer says so: footers without statistics leave it to the
    batch that holds one.  Read only where such a column is read: a footer a file."""
    schema = units.schema
    wide = {n for n in columns if n in units.nulls and _int64(schema.field(n).type)}
    vectors = {n: integer_vector_depth(schema.field(n).type) for n in columns if n in schema.names}
    vectors = {n: depth for n, depth in vectors.items() if depth}
    if not (wide or vectors):
        return None
    paths = [path for files in units.paths for path in files]
    # Once a process and those it forks: a DataLoader's workers, made again each epoch, make their loaders again
    key = (units.key, units.content, tuple(sorted(wide)), tuple(sorted(vectors)), full_url(units.fs, paths[0]))
    if key not in _NUMPY_REFUSALS:
        _NUMPY_REFUSALS[key] = _numpy_refusal_in(units, paths, wide, vectors)
    return _NUMPY_REFUSALS[key]


_NUMPY_REFUSALS: dict[tuple, tuple | None] = {}


def _numpy_refusal_in(units: Units, paths: list[str], wide: set[str], vectors: dict[str, int]) -> tuple | None:
    def found_in(path: str):
        with open_parquet(units.fs, path) as parquet:
            return _refused_in(parquet.metadata, wide, vectors)

    with ThreadPoolExecutor(FOOTER_THREADS) as pool:
        for path, found in zip(paths, pool.map(found_in, paths), strict=True):
            if found is not None:
                return (*found, full_url(units.fs, path))
    return None


def _int64(kind: pa.DataType) -> bool:
    return kind in (pa.int64(), pa.uint64())


def _refused_in(footer: pq.FileMetaData, wide: set[str], vectors: dict[str, int]) -> tuple | None:
    """``numpy_would_refuse``'s finding in one footer; ``vectors``: each vector column's depth."""
    # The leaves of those columns only (a wide file has row groups x columns of chunks), by their whole paths:
    # a column "g.note" beside a vector "g" is not one of its leaves
    leaves = {path: name for name, depth in vectors.items() for path in vector_leaf_paths(name, depth)}
    columns = {i: footer.schema.column(i).path for i in range(footer.num_columns)}
    columns = {i: path for i, path in columns.items() if path in wide or path in leaves}
    for group in range(footer.num_row_groups if columns else 0):
        row_group = footer.row_group(group)
        for i, path in columns.items():
            stats = row_group.column(i).statistics
            if stats is None:
                continue
            if path in leaves and stats.has_null_count and stats.null_count:
                return leaves[path], "vectors", None
            if path in wide and stats.has_min_max:
                for value in (stats.min, stats.max):
                    if isinstance(value, int) and abs(value) > EXACT_IN_FLOAT64:
                        return path, "wide", value
    return None


EXACT_IN_FLOAT64 = 2**53


def check_listed_files(fs, paths: list[str], manifest: dict) -> list[dict | None]:
    """Every file the manifest lists is there, as large as when it was written: a missing or cut file is named
    when the loader is made, not when an epoch reaches it.  One listing a directory; returns what it listed
    of each file (Nones from a store that cannot list)."""
    try:
        infos = listed_infos(fs, paths)
    except (OSError, NotImplementedError, ValueError):  # a store that cannot list (http): found when read
        return [None] * len(paths)
    stamps = manifest.get("file_stamps") or []
    written = [stamp_size(s) for s in stamps] if len(stamps) == len(paths) else [None] * len(paths)
    for path, info, expected in zip(paths, infos, written, strict=True):
        if info is None:
            raise FileNotFoundError(f"{full_url(fs, path)}, a file of the dataset's manifest, is missing")
        found = info.get("size")
        if expected is not None and found is not None and found != expected:
            raise ValueError(
                f"{full_url(fs, path)} has {found:,} bytes, the manifest said {expected:,}: it changed (or was cut "
                "short) since the result was written"
            )
    return infos


def _check_same_columns(fs, paths: list[str], schemas: list[pa.Schema], columns=None) -> None:
    """Files without a manifest must have the first one's columns and types (those read, with ``columns``):
    named, not an error mid-epoch, nor a column left out of every batch."""
    first = {f.name: f.type for f in schemas[0] if columns is None or f.name in columns}
    for path, schema in zip(paths[1:], schemas[1:], strict=True):
        these = {f.name: f.type for f in schema if columns is None or f.name in columns}
        if these == first:
            continue
        missing = [n for n in first if n not in these]
        extra = [n for n in these if n not in first]
        other = [f"{n} is {these[n]}, not {first[n]}" for n in first if n in these and these[n] != first[n]]
        said = [
            *([f"it lacks {', '.join(map(repr, missing))}"] if missing else []),
            *([f"it has {', '.join(map(repr, extra))} too"] if extra else []),
            *other,
        ]
        raise ValueError(
            f"{full_url(fs, path)} has other columns than {full_url(fs, paths[0])}, the dataset's first file: "
            f"{'; '.join(said)}"
        )


def _check_one_shuffle(fs, paths: list[str], counted: list[_Counted]) -> None:
    """Refuse a folder holding part of a shuffle beside the files of another, as their footers' stamps tell:
    Dask's ``to_parquet`` of fewer piles into a folder leaves the earlier write's other part files, and a trial's
    loader read 45,163 rows of a 30,000-row source, as ``dd.read_parquet`` would, rows twice and nothing said.
    Whole shuffles side by side (``to_parquet(append=True)``, a glob over two results) are read."""
    shuffles: dict[tuple[int, int], tuple[str, set]] = {}  # (seed, piles) -> (its first file, its piles seen)
    for path, c in zip(paths, counted, strict=True):
        stamp = _stamp_of(c)
        if stamp is not None:
            seed, piles, pile = stamp
            # (a pile of to_parquet(partition_on=...) is a file of one name in each key folder)
            shuffles.setdefault((seed, piles), (path, set()))[1].add(posixpath.basename(path) if pile is None else pile)
    # (shuffle_parquet and to_parquet write every pile's file, an empty one too: to_parquet(partition_on=...), into
    # key=value folders, writes none for an empty pile, so its files do not say by their count that some are missing)
    folders = {posixpath.dirname(path) for path in paths}
    in_one_folder = len(folders) == 1 and "=" not in posixpath.basename(next(iter(folders), ""))
    if len(shuffles) == 1 and (all(c.pile for c in counted) or (in_one_folder and all(c.stamp for c in counted))):
        (seed, piles), (path, seen) = next(iter(shuffles.items()))
        if len(seen) < piles:
            _warn_of_missing_piles(fs, seed, piles, path, len(seen))
    if len(shuffles) < 2:
        return
    for (seed, piles), (path, seen) in shuffles.items():
        if len(seen) < piles:
            other = next(first for key, (first, _) in shuffles.items() if key != (seed, piles))
            raise ValueError(
                f"{full_url(fs, path)} is one of {count(len(seen), 'pile')} of a shuffle into {piles:,} (seed "
                f"{seed}), beside the files of another shuffle ({full_url(fs, other)}), their footers say: a write "
                "of fewer piles into a folder leaves the earlier write's other part files; remove them (or write "
                "with overwrite=True), or name the files to read"
            )


def _warn_of_missing_piles(fs, seed: int, piles: int, path: str, seen: int) -> None:
    """Warn that the files named hold ``seen`` piles of a shuffle only, as their footers say: a glob over a result
    some of whose files are gone reads fewer rows every epoch (a glob naming a few piles on purpose, a sample, is
    warned too: said once, when the loader is made)."""
    warnings.warn(
        f"the files named hold {seen:,} of the {piles:,} piles of the shuffle (seed {seed}) their footers name, "
        f"{full_url(fs, posixpath.dirname(path))} among them: the others are missing, and every epoch reads these "
        "rows only (a shuffle writes a file for every pile, an empty one too)",
        stacklevel=5,  # (the caller's line, above PileLoader.__init__, redacting_errors and discover)
    )


def _stamp_of(c: _Counted) -> tuple[int, int, int | None] | None:
    """(seed, piles, the pile, if the stamp says it) of the shuffle that wrote a file, by its footer's stamp."""
    for stamp in (c.stamp, c.pile):
        with contextlib.suppress(ValueError, TypeError, KeyError):  # (none, or not one daskpile wrote)
            said = json.loads(stamp)
            pile = said.get("pile")
            return int(said["seed"]), int(said["piles"]), None if pile is None else int(pile)
    return None


def check_rows(url: str, found: int, expected: int, what: str = "", since: str = "the loader was made") -> None:
    """Refuse a file whose rows (``what``: that pass the filter) are not those the dataset said."""
    if found != expected:
        raise ValueError(
            f"{url} has {found:,} rows{' that ' + what if what else ''}, the dataset said {expected:,}: "
            f"it changed since {since} (or its manifest is wrong)"
        )


@contextlib.contextmanager
def _filter_errors(names: list[str]):
    """A filter on a column the files do not have: named as such, not as a file Arrow cannot read."""
    try:
        yield
    except pa.ArrowNotImplementedError as e:
        if "has no kernel matching input types" not in str(e):
            raise
        raise ValueError(f"filters: a value of another type than its column's ({str(e).splitlines()[0]})") from None
    except pa.ArrowInvalid as e:
        if "Precision is not great enough" in str(e) or "Decimal precision out of range" in str(e):
            # (an int, or a Decimal of more digits, beside a decimal column: Arrow casts both to one decimal)
            raise ValueError(
                f"filters: a value of another type than its column's ({str(e).splitlines()[0]}): compare a decimal "
                "column with a decimal.Decimal, or a float"
            ) from None
        missing = re.search(r"No match for FieldRef\.Name\((.*?)\) in ", str(e))
        if missing is None:
            raise
        raise ValueError(
            f"filters: {missing.group(1)!r} is not a column of the dataset, whose columns are "
            + ", ".join(name for name in names if name != DASK_NULL_INDEX)
        ) from None


def _parquet_format(ds):
    """Parquet as daskpile reads it (``INT96_UNIT``), in ``pyarrow.dataset`` (passed in: imported late)."""
    return ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit=INT96_UNIT))


def parquet_dataset(fs, path: str, keys: FolderKeys | None = None, schema: pa.Schema | None = None):
    """One file as a ``pyarrow.dataset``, for a filter; with ``keys``, ``schema`` (the file's and the keys')
    and the file's key columns filled from its folders.

    Imported here, only with filters or keys: ``pyarrow.dataset`` imports pandas (0.3 s, holding the GIL).
    """
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    if keys is None:  # (``schema``: the file's, its views as their large forms, which Arrow's filter selects)
        return ds.dataset(path, filesystem=fs, format=_parquet_format(ds), schema=schema)
    arrow_fs = pafs.LocalFileSystem() if is_local(fs) else pafs.PyFileSystem(pafs.FSSpecHandler(fs))
    return ds.FileSystemDataset.from_paths(
        [path], schema=schema, format=_parquet_format(ds), filesystem=arrow_fs, partitions=[keys.expression(path)]
    )
