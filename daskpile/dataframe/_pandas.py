"""Pandas partitions as Arrow tables and back, exactly, for ``shuffle(ddf)``.

A partition goes to Arrow column by column: the index first (unless what
follows the shuffle drops it), then every
column, named by position (``"0"`` is the index, ``"1"`` the first column), so
that labels of any type or repetition survive, and back to pandas with the
dtypes of the input's ``_meta``.  Each column takes the conversion its dtype
owns (``__arrow_array__`` and ``__from_arrow__`` for pandas' extension dtypes,
Arrow's own for numpy dtypes), so nullable integers never pass through floats
and Arrow-backed columns are not copied.

Columns of dtype ``object`` hold Python objects of any kind (strings mixed with
numbers, lists, dicts, bytes, ``datetime.time``; what pandas makes of nested
Parquet): Arrow would guess a type from each partition's values, differently
from one partition to the next, and change the values (a list comes back a
numpy array, NaN and None both come back None).  They are carried as pickles,
one per value: exact, at the cost of one ``pickle`` call per value (a few
microseconds).  So are the dtypes Arrow has no type for (complex, sparse), as
Dask's own shuffle carries them.  A partition's column of 1-D numpy arrays of one
dtype, what pandas makes of a Parquet list column (embeddings), is carried as
their bytes and dtype instead (``OBJECTS``): pickling an array took ten times as
long as the whole shuffle of a number.
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from dask.dataframe.utils import UNKNOWN_CATEGORIES

# A column of Python objects: each value's pickle; or, for a partition whose values are all 1-D numpy arrays of one
# fixed-width dtype, each one's bytes (raw) and that dtype
OBJECTS = pa.struct([("pickle", pa.large_binary()), ("dtype", pa.string()), ("raw", pa.large_binary())])
RAW_KINDS = "biufcmM"  # numpy's fixed-width kinds: bools, integers, floats, complex, timedeltas, datetimes


@dataclasses.dataclass(frozen=True)
class FrameCodec:
    """How the partitions of one Dask DataFrame go to Arrow and back.

    >>> meta = pd.DataFrame({"x": pd.array([1, None], dtype="Int64"), "o": [[1], {"a": 2}]})
    >>> codec = FrameCodec(meta.iloc[:0])
    >>> codec.to_pandas(codec.to_arrow(meta)).equals(meta)
    True
    """

    meta: pd.DataFrame
    index: bool = True  # False: the index is left out, and comes back a RangeIndex

    def __repr__(self) -> str:  # one line in an expression's tree (pprint), not the empty frame's three
        return f"FrameCodec(columns={list(self.meta.columns)!r}, index={self.index})"

    def to_arrow(self, frame: pd.DataFrame) -> pa.Table:
        """One partition as an Arrow table: the index, then the columns, named by position."""
        meta = self.meta
        if not frame.columns.equals(meta.columns):
            if len(frame.columns) != len(meta.columns) or not frame.columns.sort_values().equals(
                meta.columns.sort_values()
            ):
                raise ValueError(f"a partition has columns {list(frame.columns)}, the DataFrame {list(meta.columns)}")
            frame = frame[meta.columns]  # the same columns in another order: by label, as Dask aligns them
        if isinstance(frame.index, pd.MultiIndex):
            raise TypeError("daskpile cannot shuffle a partition with a MultiIndex (Dask DataFrames have none)")
        columns = [(frame.index, meta.index.dtype, f"the index ({meta.index.name!r})")] if self.index else []
        columns += [
            (frame.iloc[:, i], dtype, repr(label))
            for i, (label, dtype) in enumerate(zip(meta.columns, meta.dtypes.tolist(), strict=True))
        ]
        arrays = [_to_arrow(values, dtype, name) for values, dtype, name in columns]
        first = 0 if self.index else 1
        fields = [
            pa.field(str(first + k), array.type, metadata=_categories_note(values))
            for k, (array, (values, _, _)) in enumerate(zip(arrays, columns, strict=True))
        ]
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def label(self, position: str) -> str:
        """What ``to_arrow``'s column named ``position`` is, in words.

        >>> codec = FrameCodec(pd.DataFrame({"c": [1]}).iloc[:0])
        >>> codec.label("0"), codec.label("1")
        ('the index (None)', "column 'c'")
        """
        k = int(position) - 1  # (the index is "0", with or without it: column i is "i + 1")
        return f"the index ({self.meta.index.name!r})" if k < 0 else f"column {self.meta.columns[k]!r}"

    def to_pandas(self, table: pa.Table) -> pd.DataFrame:
        """A table made by ``to_arrow`` (or the concatenation of several) as pandas, with the dtypes of ``meta``."""
        meta = self.meta
        notes = [field.metadata for field in table.schema]
        if self.index:
            values = _to_pandas(table.column(0), meta.index.dtype, note=notes[0])
            # A categorical's dtype is the data's (Dask's meta may know only a placeholder category)
            dtype = None if isinstance(meta.index.dtype, pd.CategoricalDtype) else meta.index.dtype
            index = pd.Index(values, dtype=dtype, name=meta.index.name, copy=False)
        else:
            index = pd.RangeIndex(table.num_rows)
        first = 1 if self.index else 0
        columns = {
            i: _to_pandas(table.column(first + i), dtype, index, notes[first + i])
            for i, dtype in enumerate(meta.dtypes.tolist())
        }
        # Not copied (a pile's columns are its own), unless so many are numpy arrays that pandas would hold a
        # block each: 600 float columns gave a frame "highly fragmented" (a warning a pile in to_parquet, and
        # to_numpy() 16 ms against 0 for the input's partition); copied, they are one block a dtype
        fragmented = sum(isinstance(values, np.ndarray) for values in columns.values()) > FRAGMENTED_COLUMNS
        frame = pd.DataFrame(columns, index=index, copy=fragmented)
        return frame.set_axis(meta.columns, axis=1)


# pandas warns of a frame of more blocks than this (PerformanceWarning, "highly fragmented")
FRAGMENTED_COLUMNS = 100


def pickled(dtype) -> bool:
    """Whether a column of ``dtype`` is carried as pickles: Python objects, what Arrow has no type for, and
    categoricals of intervals, periods or Python objects (tuples), which Arrow's dictionaries do not carry."""
    if isinstance(dtype, pd.CategoricalDtype):
        categories = dtype.categories.dtype if dtype.categories is not None else None
        return isinstance(categories, (pd.IntervalDtype, pd.PeriodDtype)) or (
            _known(dtype) and isinstance(categories, np.dtype) and categories.kind == "O"
            and dtype.categories.inferred_type not in ("string", "empty")  # (cached on the Index: no scan a call)
        )  # fmt: skip
    # dtype.kind, not ``is np.dtype(object)``: an unpickled dtype is not numpy's singleton
    return isinstance(dtype, pd.SparseDtype) or (isinstance(dtype, np.dtype) and dtype.kind in "Oc")


def _known(dtype: pd.CategoricalDtype) -> bool:
    """Whether a categorical dtype of Dask's meta knows its categories (not only Dask's placeholder)."""
    return dtype.categories is not None and UNKNOWN_CATEGORIES not in dtype.categories


def _to_arrow(values: pd.Series | pd.Index, dtype, name: str) -> pa.Array | pa.ChunkedArray:
    """A column as Arrow, converted by the dtype the DataFrame says it has (``dtype``, from ``_meta``)."""
    if pickled(dtype):
        return _objects_to_arrow(values)
    try:
        if values.dtype != dtype:
            values = _as_meta_says(values, dtype, name)
        # numpy arrays without from_pandas, so NaN stays NaN (and costs no null bitmap)
        return pa.array(values.array if not isinstance(values.dtype, np.dtype) else values.to_numpy())
    except MetaMismatch:
        raise
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
        raise TypeError(f"daskpile cannot convert column {name} of dtype {values.dtype} to Arrow: {e}") from e


def _objects_to_arrow(values: pd.Series | pd.Index) -> pa.StructArray:
    """A column of Python objects as ``OBJECTS``: their pickles, or where every value is a 1-D numpy array of
    one fixed-width dtype, their bytes.

    >>> raw = _objects_to_arrow(pd.Series([np.array([1.5, 2.0]), np.array([], float)]))
    >>> raw.field("dtype").to_pylist(), raw.field("raw").to_pylist()[1], raw.field("pickle").null_count
    (['<f8', '<f8'], b'', 2)
    """
    n = len(values)
    arrays = _arrays_of_one_dtype(values)
    if arrays is None:
        pickles = pa.array([pickle.dumps(v, protocol=5) for v in values], type=pa.large_binary())
        return pa.StructArray.from_arrays(
            [pickles, pa.nulls(n, pa.string()), pa.nulls(n, pa.large_binary())], fields=list(OBJECTS)
        )
    dtype = arrays[0].dtype
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter((a.size for a in arrays), np.int64, n) * dtype.itemsize, out=offsets[1:])
    data = np.concatenate(arrays, dtype=dtype).view(np.uint8)  # (its byte order: numpy's default is native)
    raw = pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    dtypes = pa.array([dtype.str], pa.string()).take(np.zeros(n, np.int64))
    return pa.StructArray.from_arrays([pa.nulls(n, pa.large_binary()), dtypes, raw], fields=list(OBJECTS))


def _arrays_of_one_dtype(values: pd.Series | pd.Index) -> np.ndarray | None:
    """The values (an object array) where they are all 1-D numpy arrays of one fixed-width dtype, else None."""
    objects = values.to_numpy(dtype=object)
    if not len(objects) or type(objects[0]) is not np.ndarray or objects[0].dtype.kind not in RAW_KINDS:
        return None
    dtype = objects[0].dtype  # (a subclass of ndarray is pickled, as it is)
    return objects if all(type(v) is np.ndarray and v.ndim == 1 and v.dtype == dtype for v in objects) else None


def _objects_from_arrow(column: pa.ChunkedArray) -> np.ndarray:
    """An ``OBJECTS`` column as an object array of its values: the pickled unpickled, the raw as numpy arrays of
    their dtype, writable, each a view of its own rows of one copy of the bytes (not owning them, as a pickle's
    would: ``resize`` refuses them)."""
    pickles, dtypes, raws = (column.combine_chunks() if column.num_chunks else pa.array([], OBJECTS)).flatten()
    values = np.empty(len(raws), dtype=object)
    raw = raws.is_valid().to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(~raw)
    if len(rows):
        values[rows] = np.fromiter(
            (pickle.loads(v) for v in pickles.take(rows).to_pylist()), dtype=object, count=len(rows)
        )
    for dtype in pc.unique(dtypes.drop_null()).to_pylist():
        rows = np.flatnonzero(raw & pc.fill_null(pc.equal(dtypes, dtype), False).to_numpy(zero_copy_only=False))
        values[rows] = _arrays_in(raws.take(rows), np.dtype(dtype))
    return values


def _arrays_in(raw: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The values of a large binary array of raw bytes as numpy arrays of ``dtype`` (an object array): views
    of one writable copy of its bytes."""
    offsets = np.frombuffer(raw.buffers()[1], np.int64, len(raw) + 1, raw.offset * 8)
    nbytes = int(offsets[-1] - offsets[0])
    data = np.frombuffer(raw.buffers()[2], np.uint8, nbytes, int(offsets[0])) if nbytes else np.empty(0, np.uint8)
    flat = data.copy().view(dtype)
    bounds = ((offsets - offsets[0]) // dtype.itemsize).tolist()
    return np.fromiter((flat[a:b] for a, b in itertools.pairwise(bounds)), dtype=object, count=len(raw))


class MetaMismatch(TypeError):
    """A partition's column whose values the DataFrame's meta dtype cannot hold."""


def _as_meta_says(values: pd.Series | pd.Index, dtype, name: str):
    """A partition's column whose dtype differs from the DataFrame's, cast to it where that loses nothing.

    Dask's fused ``read_parquet`` gives object strings where its meta says
    string: the meta is what the result promises.  A cast that would change
    values is refused, naming the column, rather than done silently: numbers
    a narrower type cannot hold (a Parquet lake whose newer files widened an
    int32 to int64, a ``meta=`` that says int8), fractions under an integer
    meta, integers past 2**53 under a float one, missing values under a
    numpy integer other than as Dask reads them (``_with_missing``).  Where
    every value of the partition fits, the cast is made.
    """
    if isinstance(dtype, pd.CategoricalDtype):
        # Categories are the data's (Dask's meta may not know them; an empty partition of
        # read_parquet comes as object)
        return values if isinstance(values.dtype, pd.CategoricalDtype) else values.astype("category")
    if not values.notna().any():
        missing = _all_missing(values, dtype)
        if missing is not None:
            return missing
    what = name if name.startswith("the index") else f"column {name}"
    # (a meta Dask derived can be looser than the partitions: assign(t=dd.to_datetime(...)) of a read_csv frame
    # says float64 of its int64 columns, so a partition's index cannot be "cast first" to a type it already has)
    fix = (
        "give the DataFrame its partitions' meta (ddf = ddf.map_partitions(lambda part: part, "
        "meta=ddf.partitions[0].compute().iloc[:0]))"
        if name.startswith("the index")
        else f"cast it (ddf.astype({{{name}: ...}}))"
    )
    refused = (
        f"daskpile: {what} of a partition is {values.dtype}, the DataFrame's meta says {dtype}: {fix} first, "
        "or give map_partitions or from_delayed a meta= that matches"
    )
    if _missing_as_dask_reads_them(values, dtype):
        return _with_missing(values, dtype, refused)
    source, target = _kind(values.dtype), _kind(dtype)
    if {source, target} & {"number"} and {source, target} & {"time"}:  # 1 under a datetime meta is 1 ns
        raise MetaMismatch(f"{refused}; numbers and times do not convert")
    if target == "text" and source in ("number", "time"):  # 3 would become '3', 1.50 '1.5'
        raise MetaMismatch(f"{refused}; numbers and times would become text")
    # 'é' would become b'\xc3\xa9' (a lake of binary, then string; or Python's str, as from_delayed gives them)
    if (
        _is_binary(dtype)
        and values.notna().any()
        and (
            source == "text"
            or (source == "object" and pd.api.types.infer_dtype(values, skipna=True) in ("string", "mixed"))
        )
    ):
        raise MetaMismatch(f"{refused}; text would become bytes")
    if target == "text" and source == "object":
        # Dask's fused read_parquet gives strings as objects: those are cast.  Other objects are what
        # fillna(0) or where(..., -1) put in a string column: 0 would have become '0', b"x" 'x'
        held = pd.api.types.infer_dtype(values[values.notna()], skipna=True)  # (NaT too: what astype makes NA)
        if held not in ("string", "empty"):
            raise MetaMismatch(f"{refused}; it holds {held} values, which would become text")
    dropped = _fields_dropped(values.dtype, dtype)
    if dropped:  # Arrow casts a struct to one of fewer fields by dropping the others, without a word
        raise MetaMismatch(f"{refused}; converting would drop its field{'s' * (len(dropped) > 1)} {', '.join(dropped)}")
    try:
        with np.errstate(all="ignore"):
            cast = values.astype(dtype)
    except (TypeError, ValueError, OverflowError, NotImplementedError, pa.ArrowException) as e:
        raise MetaMismatch(f"{refused}; converting fails: {e}{_widening_advice(values.dtype, dtype, name)}") from None
    # Objects and text under a number or time meta too ("007" would become 7, 1.5 would become 1); not
    # strings under a string meta, which is what Dask's fused read_parquet gives
    checked = target in ("number", "time") and source in ("number", "time", "object", "text")
    if checked and not _holds_the_same_values(values, cast):
        raise MetaMismatch(
            f"{refused}; converting would change its values{_widening_advice(values.dtype, dtype, name)}"
        )
    return cast


def _all_missing(values: pd.Series | pd.Index, dtype):
    """A partition's column of no value (no rows, or every one missing) as missing values of ``dtype``, as Dask's
    compute gives it: nothing is lost.  An empty file of a lake that stored a string column as double, or a
    ``reindex`` that added a column, gives float64 NaN under a string or datetime meta.  A numpy integer or bool
    meta holds no missing value: as ``_with_missing``, its nullable form.  None where pandas makes no such column.

    >>> _all_missing(pd.Series([np.nan, np.nan]), np.dtype("datetime64[ns]")).tolist()
    [NaT, NaT]
    >>> _all_missing(pd.Series([np.nan]), np.dtype("bool")).dtype
    BooleanDtype
    """
    if isinstance(dtype, np.dtype) and dtype.kind in "iub" and len(values):
        if not isinstance(values, pd.Series):  # (an index takes no nullable form: refused as before)
            return None
        dtype = "boolean" if dtype.kind == "b" else f"{'U' if dtype.kind == 'u' else ''}Int{dtype.itemsize * 8}"
    try:
        missing = pd.Series(index=pd.RangeIndex(len(values)), dtype=dtype)
    except (TypeError, ValueError):  # (an interval of integers holds no NaN)
        return None
    if isinstance(values, pd.Index):
        return pd.Index(missing.array, name=values.name)
    return pd.Series(missing.array, index=values.index, name=values.name, copy=False)


def _widening_advice(held, meta, name: str) -> str:
    """The cast to advise where a partition's dtype ``held`` may be a wider form of the meta's: a lake whose newer
    files widened a type (int32 to int64, decimal(3, 2) to (4, 2), ms to ns) has the first file's as Dask's meta,
    while its compute gives each partition its own; the widest holds them all.  "" where it is not (an index
    takes no ``astype``)."""
    spelled = _spelled(held) if not name.startswith("the index") and _one_family(held, meta) else None
    if spelled is None:
        return ""
    return (
        f" (if the files' types widened, cast to the widest: ddf.astype({{{name}: {spelled}}}) holds this partition's)"
    )


def _one_family(dtype, other) -> bool:
    """Whether two dtypes are wider and narrower forms of one kind of value (integers, floats, datetimes,
    timedeltas, dates, decimals), so that the wider holds the narrower's values as they are.

    >>> _one_family(np.dtype("int64"), np.dtype("int32")), _one_family(np.dtype("m8[us]"), np.dtype("M8[ns]"))
    (True, False)
    """
    if _is_decimal(dtype) or _is_decimal(other):
        return _is_decimal(dtype) and _is_decimal(other)
    dates = [isinstance(d, pd.ArrowDtype) and pa.types.is_date(d.pyarrow_dtype) for d in (dtype, other)]
    kinds = [getattr(d, "kind", None) for d in (dtype, other)]
    return dates[0] == dates[1] and kinds[0] == kinds[1] and kinds[0] in ("i", "u", "f", "M", "m")


def _spelled(dtype) -> str | None:
    """``dtype`` as Python that gives it to ``astype``, or None.

    >>> _spelled(np.dtype("int64")), _spelled(pd.ArrowDtype(pa.decimal128(4, 2)))
    ("'int64'", 'pd.ArrowDtype(pa.decimal128(4, 2))')
    """
    if _is_decimal(dtype):  # ("decimal128(4, 2)[pyarrow]": pandas parses no parameters in a name)
        return f"pd.ArrowDtype(pa.{dtype.pyarrow_dtype})"
    try:
        return repr(str(dtype)) if pd.api.types.pandas_dtype(str(dtype)) == dtype else None
    except (TypeError, ValueError, NotImplementedError):
        return None


def _is_binary(dtype) -> bool:
    kind = dtype.pyarrow_dtype if isinstance(dtype, pd.ArrowDtype) else None
    return kind is not None and (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_binary_view(kind)
        or pa.types.is_fixed_size_binary(kind)
    )


def _is_decimal(dtype) -> bool:
    return isinstance(dtype, pd.ArrowDtype) and pa.types.is_decimal(dtype.pyarrow_dtype)


def _fields_dropped(source, target) -> list[str]:
    """The struct fields of Arrow-backed ``source`` that ``target`` lacks, at any depth (``user.email``), which a
    cast drops: a lake whose newer files added a field to a struct, read with ``dtype_backend="pyarrow"``, has the
    first file's struct as its meta (a trial's emails, gone).

    >>> struct = lambda *names: pd.ArrowDtype(pa.struct([(n, pa.string()) for n in names]))
    >>> _fields_dropped(struct("name", "email"), struct("name")), _fields_dropped(struct("name"), struct("name", "x"))
    (['email'], [])
    """
    if not (isinstance(source, pd.ArrowDtype) and isinstance(target, pd.ArrowDtype)):
        return []
    return _arrow_fields_dropped(source.pyarrow_dtype, target.pyarrow_dtype, "")


def _arrow_fields_dropped(source: pa.DataType, target: pa.DataType, where: str) -> list[str]:
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        names = {target.field(i).name: target.field(i).type for i in range(target.num_fields)}
        dropped = []
        for field in (source.field(i) for i in range(source.num_fields)):
            path = f"{where}{field.name}"
            if field.name not in names:
                dropped.append(path)
            else:
                dropped += _arrow_fields_dropped(field.type, names[field.name], f"{path}.")
        return dropped
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list, pa.types.is_list_view,
             pa.types.is_large_list_view)  # fmt: skip
    if any(is_a(source) for is_a in lists) and any(is_a(target) for is_a in lists):  # (large_list under list too)
        return _arrow_fields_dropped(source.value_type, target.value_type, where)
    if pa.types.is_map(source) and pa.types.is_map(target):
        return _arrow_fields_dropped(source.item_type, target.item_type, where)
    if pa.types.is_dictionary(source) and pa.types.is_dictionary(target):
        return _arrow_fields_dropped(source.value_type, target.value_type, where)
    return []


def _missing_as_dask_reads_them(values: pd.Series | pd.Index, dtype) -> bool:
    """Missing values of a column whose meta is a numpy integer or bool, as Dask's ``read_parquet`` gives a
    nullable column of Parquet: its meta says int64 (bool), a partition with a missing value is float64 with
    NaN (objects with None)."""
    if not isinstance(values, pd.Series):  # an index whose meta is an int or bool is refused: pd.Index forces it
        return False
    if not isinstance(dtype, np.dtype) or dtype.kind not in "iub" or not isinstance(values.dtype, np.dtype):
        return False
    return values.dtype.kind == ("O" if dtype.kind == "b" else "f") and bool(pd.isna(values).any())


def _with_missing(values: pd.Series | pd.Index, dtype: np.dtype, refused: str):
    """``values`` in pandas' nullable form of ``dtype`` (Arrow's type with nulls): integral floats and bools
    only, and in range, else refused.  ``_to_pandas`` gives them back as Dask read them."""
    nullable = "boolean" if dtype.kind == "b" else f"{'U' if dtype.kind == 'u' else ''}Int{dtype.itemsize * 8}"
    magnitude = values.abs().max() if dtype.kind in "iu" and dtype.itemsize == 8 else np.nan  # (NaN skipped)
    if np.isfinite(magnitude) and magnitude >= 2**53:  # (2**53 itself may be 2**53 + 1 rounded)
        # Dask's reader made them floats: rounded already, they would come back as integers that look exact
        raise MetaMismatch(
            f"{refused}; its integers past 2**53 are rounded in float64 (Dask's read_parquet gives an int64 "
            "column as float64 in a partition with a missing value): read it with dtype_backend='pyarrow' to keep "
            "them exact, or cast the column to float64 to shuffle them as they are"
        )
    try:
        if dtype.kind == "b" and pd.api.types.infer_dtype(values, skipna=True) not in ("boolean", "empty"):
            raise TypeError("values other than True and False")
        cast = values.astype(nullable)  # refuses fractions and values out of range ("cannot safely cast")
    except (TypeError, ValueError, OverflowError) as e:
        raise MetaMismatch(f"{refused}; converting fails: {e}") from None
    return cast


def _past_floats(column: pa.ChunkedArray) -> bool:
    """Whether an integer column holds a value that float64 cannot hold exactly (past 2**53 either way)."""
    low, high = pc.min_max(column).values()
    return (high.as_py() or 0) > 2**53 or (low.as_py() or 0) < -(2**53)


def _kind(dtype) -> str | None:
    """ "number" (integers, floats, booleans: numpy's, pandas' nullable or Arrow-backed), "time" (datetimes,
    timedeltas), "text", "object", or None."""
    kind = getattr(dtype, "kind", None)
    if isinstance(dtype, pd.CategoricalDtype):
        return None
    if isinstance(dtype, pd.StringDtype) or (
        isinstance(dtype, pd.ArrowDtype)
        and (
            pa.types.is_string(dtype.pyarrow_dtype)
            or pa.types.is_large_string(dtype.pyarrow_dtype)  # (Polars writes it)
            or pa.types.is_string_view(dtype.pyarrow_dtype)
        )
    ):
        return "text"
    return {"i": "number", "u": "number", "f": "number", "b": "number", "M": "time", "m": "time"}.get(
        kind, "object" if isinstance(dtype, np.dtype) and kind == "O" else None
    )


def _holds_the_same_values(values: pd.Series | pd.Index, cast: pd.Series | pd.Index) -> bool:
    """Whether ``cast`` holds every value of ``values``: in range, and unchanged when cast back."""
    if values.dtype.kind in "iu" and cast.dtype.kind in "iu" and len(values):
        limits = np.iinfo(np.dtype(getattr(cast.dtype, "numpy_dtype", cast.dtype)))
        low, high = values.min(), values.max()  # missing values skipped; all missing gives NA
        if not pd.isna(low) and (int(low) < limits.min or int(high) > limits.max):
            return False  # signed and unsigned wrap around and back: a round trip alone would not see it
    try:
        with np.errstate(all="ignore"):
            back = cast.astype(values.dtype)
    except (TypeError, ValueError, OverflowError):
        return False
    return pd.Series(back.array, copy=False).equals(pd.Series(values.array, copy=False))


def _to_pandas(column: pa.ChunkedArray, dtype, index: pd.Index | None = None, note: dict | None = None):
    """A column as a pandas array (or numpy array) of ``dtype``; ``note``: its Arrow field's metadata."""
    if pickled(dtype):
        values = _objects_from_arrow(column)
        # A Series, not the bare array, from which pandas would infer strings.
        return pd.Series(values, index=index, dtype=object).astype(dtype)
    if isinstance(dtype, pd.ArrowDtype):
        return pd.arrays.ArrowExtensionArray(column.cast(dtype.pyarrow_dtype))
    if hasattr(dtype, "__from_arrow__"):  # pandas' own extension dtypes: nullable, string, tz, period, interval
        return dtype.__from_arrow__(column)
    if isinstance(dtype, np.dtype) and dtype.kind in "iub" and column.null_count:
        # Missing values under a numpy integer or bool (see _with_missing): float64 with NaN, objects with None,
        # as Dask's read_parquet gives them; but integers past 2**53, which a float rounds (ids, hashes: they
        # may come from partitions without a missing value, read exactly), as pandas' nullable integers
        if dtype.kind in "iu" and _past_floats(column):
            return pd.api.types.pandas_dtype(f"{'U' if dtype.kind == 'u' else ''}Int64").__from_arrow__(column)
        return column.to_pandas().to_numpy()
    values = column.to_pandas()
    if isinstance(dtype, pd.CategoricalDtype):
        # Known categories are put back in the input's order (a pile's are in order of appearance);
        # where the data holds others (Dask's meta may not know them), the data's stand.
        categories = values.cat.categories
        if _known(dtype) and _same_kind(categories, dtype.categories) and categories.isin(dtype.categories).all():
            return pd.Categorical(values, dtype=_in_the_partitions_order(dtype, note))
        return _categories_as_noted(values.array, note)
    return values.to_numpy(dtype=dtype)


# A categorical column's field in a partition's table notes its categories' dtype: Arrow's dictionary
# gives strings back as pandas' default ``str``, whether they were ``string``, ``str`` or ``object``, and
# where Dask's meta does not know the categories (``cat.as_unknown()``, ``read_parquet``) only the
# partitions say which it was.
CATEGORIES_DTYPE_KEY = b"daskpile.categories_dtype"
# And the categories themselves, in the partition's order (see ``_in_the_partitions_order``), up to a number:
# the note is in every scratch file's schema, which pass 2 reads for every pile
CATEGORIES_KEY = b"daskpile.categories"
NOTED_CATEGORIES = 10_000


def _categories_note(values: pd.Series | pd.Index) -> dict | None:
    if not isinstance(values.dtype, pd.CategoricalDtype):
        return None
    categories = values.dtype.categories
    note = {CATEGORIES_DTYPE_KEY: pickle.dumps(categories.dtype, protocol=5)}
    if len(categories) <= NOTED_CATEGORIES:
        note[CATEGORIES_KEY] = pickle.dumps(categories, protocol=5)
    return note


def _in_the_partitions_order(dtype: pd.CategoricalDtype, note: dict | None) -> pd.CategoricalDtype:
    """The meta's categories in the order the (pile's first) partition holds them, when they are the same.

    Dask's meta may list them in another order than its partitions, and one that changes from one Python
    process to the next (``read_csv(include_path_column=True)``: a set's), which made the codes and the
    bytes written differ for the same seed.
    """
    noted = (note or {}).get(CATEGORIES_KEY)
    if noted is None:
        return dtype
    categories = pickle.loads(noted)
    if len(categories) != len(dtype.categories) or categories.equals(dtype.categories):
        return dtype
    if not categories.isin(dtype.categories).all():
        return dtype
    return pd.CategoricalDtype(categories.astype(dtype.categories.dtype), ordered=dtype.ordered)


def _same_kind(categories: pd.Index, known: pd.Index) -> bool:
    """Whether the data's categories compare with the meta's: times with a zone come back from Arrow's
    dictionary without it (UTC), and would match none, or the wrong ones."""
    zone = getattr(known.dtype, "tz", None)
    return zone is None or getattr(categories.dtype, "tz", None) is not None or not len(categories)


def _categories_as_noted(values: pd.Categorical, note: dict | None) -> pd.Categorical:
    if not len(values.categories) and (note or {}).get(CATEGORIES_KEY) is not None:
        # A pile of no row, or of missing values only: the categories its (first) partition had, as Dask's
        # concatenation of partitions keeps them
        categories = pickle.loads(note[CATEGORIES_KEY])
        return pd.Categorical.from_codes(values.codes, categories=categories, ordered=values.ordered)
    noted = (note or {}).get(CATEGORIES_DTYPE_KEY)
    if noted is None:
        return values
    dtype = pickle.loads(noted)
    if values.categories.dtype == dtype:
        return values
    categories = values.categories
    if getattr(dtype, "tz", None) is not None and getattr(categories.dtype, "tz", None) is None:
        categories = categories.tz_localize("UTC")  # Arrow's dictionary of zoned times gives their UTC
    try:
        categories = categories.astype(dtype)
    except (TypeError, ValueError):  # partitions whose categories disagree: the pile's first one noted
        return values
    return pd.Categorical.from_codes(values.codes, categories=categories, ordered=values.ordered)
