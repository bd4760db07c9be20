"""The schema policy: which files may be shuffled together, and the schema their rows take.

``strict`` (the default): every file has the reference file's columns and
types.  Differences that change no value pass and are conformed to the
reference: column order, the nullable flag, ``string`` against
``large_string`` (and binary, list likewise), a view type against its
plain forms (the plan takes no view type: ``without_views``), and a column
written as ``null`` (a zero-row file written by pandas or Polars).

``unify``: the union of the columns by name, types promoted as
``pyarrow.unify_schemas(promote_options="permissive")`` does (dictionary
columns take their value type when another file has plain values), missing
columns as nulls.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

POLICIES = ("strict", "unify")
# "window": an append into a moving window, checked as strictly; "first file": files other than Parquet, which
# take the first file's columns and types (no unify for them)
STRICT = ("strict", "window", "first file")


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"schema must be 'strict' or 'unify', got {policy!r}")
    return policy


def without_range_index(schema: pa.Schema) -> pa.Schema:
    """Drop a pandas RangeIndex from the metadata: it numbers the input's rows, meaningless after a shuffle."""
    pandas_meta = schema.pandas_metadata
    if pandas_meta and any(isinstance(c, dict) for c in pandas_meta.get("index_columns", [])):
        pandas_meta["index_columns"] = [c for c in pandas_meta["index_columns"] if not isinstance(c, dict)]
        schema = schema.with_metadata({**schema.metadata, b"pandas": json.dumps(pandas_meta).encode()})
    return schema


def nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column nullable, and every nested field but a map's keys: a column the reference
    file declares never null (Spark's, a typed writer's) may hold nulls in other files (a later day appended
    to a window), which the rows written must take.  Spark writes ``array<bigint>`` with ``containsNull``
    false or true as the array was built, so a lake of daily jobs differs so inside its lists and structs too.

    >>> nullable(pa.schema([pa.field("id", pa.int64(), nullable=False)])).field("id").nullable
    True
    >>> nullable(pa.schema([("v", pa.list_(pa.field("element", pa.int64(), nullable=False)))])).field("v").type
    ListType(list<element: int64>)
    """
    fields = [f.with_nullable(True).with_type(_nullable_inside(f.type)) for f in schema]
    if all(f.equals(g) for f, g in zip(fields, schema, strict=True)):
        return schema
    return pa.schema(fields, metadata=schema.metadata)


def _nullable_inside(kind: pa.DataType) -> pa.DataType:
    """``kind`` with its nested fields nullable, but a map's keys (never null in Arrow) and extension types'."""
    return _rebuilt(kind, lambda f: f.with_nullable(True).with_type(_nullable_inside(f.type)), keys=False)


def _rebuilt(kind: pa.DataType, change, keys: bool = True) -> pa.DataType:
    """``kind`` (a list, struct or map; else itself) with ``change`` made to each of its fields (a map's keys only
    with ``keys``), and ``kind`` itself where that changes none: ``pa.map_`` would name its entries "entries"."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        value = change(kind.value_field)
        if value.equals(kind.value_field, check_metadata=True):
            return kind
        if pa.types.is_fixed_size_list(kind):
            return pa.list_(value, kind.list_size)
        return pa.large_list(value) if pa.types.is_large_list(kind) else pa.list_(value)
    if pa.types.is_struct(kind):
        fields = [kind.field(i) for i in range(kind.num_fields)]
        changed = [change(f) for f in fields]
        same = all(c.equals(f, check_metadata=True) for c, f in zip(changed, fields, strict=True))
        return kind if same else pa.struct(changed)
    if pa.types.is_map(kind):
        key, item = change(kind.key_field) if keys else kind.key_field, change(kind.item_field)
        if key.equals(kind.key_field, check_metadata=True) and item.equals(kind.item_field, check_metadata=True):
            return kind
        return pa.map_(key, item, kind.keys_sorted)
    return kind


# Spark reads a file's columns and their types from this key of its footer, if there, not from the file's
# schema.  Copied from the source's files, it may no longer describe the rows: key=value folders become
# columns it does not list, so Spark did not see them; INT96 timestamps (its "timestamp") are written as
# timestamps without a time zone, which it then refused to read.
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


def without_stale_spark_schema(schema: pa.Schema, unified: bool = False) -> pa.Schema:
    """``schema`` without Spark's schema key where it does not describe its columns, so that Spark reads them
    from the files' own schema.  A ``unified`` schema's key is the first file's, whatever the others promoted.

    >>> spark = '{"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": true, "metadata": {}}]}'
    >>> schema = pa.schema([("id", pa.int64())], metadata={SPARK_SCHEMA_KEY: spark})
    >>> SPARK_SCHEMA_KEY in without_stale_spark_schema(schema).metadata  # it does
    True
    >>> SPARK_SCHEMA_KEY in (without_stale_spark_schema(schema.append(pa.field("day", pa.int32()))).metadata or {})
    False
    """
    metadata = dict(schema.metadata or {})
    if SPARK_SCHEMA_KEY not in metadata:
        return schema
    try:
        fields = {f["name"]: f["type"] for f in json.loads(metadata[SPARK_SCHEMA_KEY])["fields"]}
    except (ValueError, KeyError, TypeError):
        fields = None
    stale = unified or fields is None or sorted(fields) != sorted(schema.names)
    for name, kind in (fields or {}).items():
        found = schema.field(name).type if name in schema.names else None
        # Spark's timestamp is an instant, stored adjusted to UTC: a column without a time zone is not one
        stale = stale or (kind == "timestamp" and found is not None and pa.types.is_timestamp(found) and not found.tz)
    if stale:
        del metadata[SPARK_SCHEMA_KEY]
    return schema.with_metadata(metadata)


# Marks a column a file stores as INT96 (``marked_int96``): Spark's timestamp, an instant stored adjusted to UTC,
# which pyarrow reads without a time zone since Impala stored local times so
INT96 = b"daskpile.int96"


def marked_int96(schema: pa.Schema, parquet_schema) -> pa.Schema:
    """``schema`` with its top-level columns stored as INT96 marked (field metadata ``INT96``)."""
    stored = {parquet_schema.column(i).path for i in range(len(parquet_schema))
              if parquet_schema.column(i).physical_type == "INT96"}  # fmt: skip
    if not stored:
        return schema
    fields = [f.with_metadata({**(f.metadata or {}), INT96: b"1"}) if f.name in stored else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def unify(schemas: list[pa.Schema], urls: list[str]) -> pa.Schema:
    """Union by name of the files' schemas, in order of first appearance; the first one's metadata.

    An impossible promotion names the column and the two files.  A column of
    timestamps without a time zone that some files store as INT96 takes a
    time zone of UTC from files that store it with one: Spark wrote both as
    its timestamp, an instant, before and after its ``outputTimestampType``
    moved from INT96 to TIMESTAMP_MICROS.
    """
    types: dict[str, pa.DataType] = {}
    first_seen: dict[str, str] = {}
    everywhere: dict[str, int] = {}
    int96: dict[str, bool] = {}  # whether the column's type so far is only files' INT96
    agreed: dict[str, dict] = {}  # the field metadata every file holding the column has
    nested: dict[str, dict | None] = {}  # its nested fields' typing metadata, None where files disagree
    for schema, url in zip(schemas, urls, strict=True):
        for field in schema:
            everywhere[field.name] = everywhere.get(field.name, 0) + 1
            stored_int96 = INT96 in (field.metadata or {})
            if field.name not in types:
                types[field.name], first_seen[field.name] = field.type, url
                int96[field.name] = stored_int96
                agreed[field.name] = reading_metadata(field)
                nested[field.name] = typing_metadata(field, nested_only=True)
                continue
            metadata = reading_metadata(field)
            agreed[field.name] = {k: v for k, v in agreed[field.name].items() if metadata.get(k) == v}
            if typing_metadata(field, nested_only=True) != nested[field.name]:
                nested[field.name] = None  # (files disagree: the unified column keeps none of its fields')
            merged = _merge(types[field.name], field.type, int96[field.name], stored_int96)
            int96[field.name] = int96[field.name] and stored_int96
            if merged is None:
                raise ValueError(
                    f"column {field.name!r} is {types[field.name]} in {first_seen[field.name]!r} and {field.type} "
                    f"in {url!r}: no type holds both, so the files cannot be unified"
                )
            if _widened_past_38_digits(merged, types[field.name], field.type):
                raise ValueError(
                    f"column {field.name!r} is {types[field.name]} in {first_seen[field.name]!r} and {field.type} "
                    f"in {url!r}: the type that holds both, {merged}, has more than 38 digits, which Polars, "
                    "DuckDB and Spark cannot read: cast the files' column to one type first"
                )
            types[field.name] = merged
    # not null only where every file has the column and says so (as pa.unify_schemas decides)
    nullable = {
        n: n in {f.name for s in schemas for f in s if f.nullable} or everywhere[n] < len(schemas) for n in types
    }
    _refuse_names_differing_in_case(list(types), schemas, urls)
    types = {n: t if nested[n] is not None else _without_nested_metadata(t) for n, t in types.items()}
    fields = [pa.field(n, t, nullable=nullable[n], metadata=agreed[n] or None) for n, t in types.items()]
    metadata = dict(schemas[0].metadata or {}) if schemas else {}
    if any(_pandas_layout(s) != _pandas_layout(schemas[0]) for s in schemas):
        metadata.pop(b"pandas", None)  # it describes some files' columns, not the union's (an index in one alone)
    features = hugging_face_features(schemas[0]) if schemas else None
    if any(hugging_face_features(s) != features for s in schemas) or set(features or types) != set(types):
        metadata.pop(HUGGING_FACE, None)  # (as pandas': some files' features, or other columns than the union's)
    return pa.schema(fields, metadata=metadata or None)


def _refuse_names_differing_in_case(names: list[str], schemas: list[pa.Schema], urls: list[str]) -> None:
    """A ValueError for columns of different files whose names differ only in case (``userId``, ``userid``):
    unified, they were two columns, each null in the other's rows, which Spark refuses to read ("Found duplicate
    column(s)") and DuckDB reads as ``userid_1``; Spark, Hive and DuckDB read such files as one column.  Names
    that one file holds both of are its own columns, kept."""
    spellings: dict[str, list[str]] = {}
    for name in names:
        spellings.setdefault(name.casefold(), []).append(name)
    for same in (group for group in spellings.values() if len(group) > 1):
        if any(sum(name in schema.names for name in same) > 1 for schema in schemas):
            continue
        where = [next(url for schema, url in zip(schemas, urls, strict=True) if name in schema.names) for name in same]
        said = " and ".join(f"{name!r} (in {url!r})" for name, url in zip(same, where, strict=True))
        raise ValueError(
            f"columns {said} differ only in case: unified they would be {len(same)} columns, each null in the "
            "other's rows, which Spark refuses to read and Spark, Hive and DuckDB read as one; rename them to one "
            "spelling first"
        )


GEO = b"geo"  # GeoParquet's file metadata: per geometry column, the bbox and types of the file's geometries


def with_geo_of_all(schema: pa.Schema, files: list[pa.Schema], rows: list[int] | None = None) -> pa.Schema:
    """``schema`` with GeoParquet metadata that holds for every output file: each holds rows of every input
    file, so each column's ``bbox`` is the union of the files' (dropped where one has none, or one crosses the
    antimeridian) and its ``geometry_types`` the union of theirs (``[]``, which GeoParquet reads as unknown,
    where one says unknown or has no GeoParquet metadata).  The first file's alone would say its rows' extent
    and types: a reader that skips files by bbox (Sedona) would skip the others' rows.  Files of no rows (``rows``,
    each file's, if given) add nothing: GeoPandas writes an empty frame's without a bbox, or with NaNs.

    >>> geo = lambda box: pa.schema([], metadata={"geo": json.dumps({"columns": {"g": {"bbox": box,
    ...     "geometry_types": ["Point"]}}})})
    >>> json.loads(with_geo_of_all(geo([0, 0, 1, 1]), [geo([0, 0, 1, 1]), geo([5, -1, 6, 0])]).metadata[b"geo"])
    {'columns': {'g': {'bbox': [0, -1, 6, 1], 'geometry_types': ['Point']}}}
    """
    first = _geo(schema)
    if first is None:
        return schema
    found = [_geo(f) for f, n in zip(files, rows or [1] * len(files), strict=True) if n]
    columns = {}
    for name, column in first.get("columns", {}).items():
        if not isinstance(column, dict):
            columns[name] = column
            continue
        theirs = [(g or {}).get("columns", {}).get(name) or {} for g in found]
        merged = dict(column)
        bbox = _union_of_boxes([c.get("bbox") for c in theirs])
        if bbox is None:
            merged.pop("bbox", None)
        else:
            merged["bbox"] = bbox
        if "geometry_types" in column:
            kinds = [c.get("geometry_types") for c in theirs]
            known = all(isinstance(k, list) and k for k in kinds)
            merged["geometry_types"] = sorted({t for k in kinds for t in k}) if known else []
        columns[name] = merged
    merged_geo = {**first, "columns": columns}
    return schema.with_metadata({**schema.metadata, GEO: json.dumps(merged_geo).encode()})


def _geo(schema: pa.Schema) -> dict | None:
    found = (schema.metadata or {}).get(GEO)
    if found is None:
        return None
    try:
        geo = json.loads(found)
    except ValueError:
        return None
    return geo if isinstance(geo, dict) and isinstance(geo.get("columns", {}), dict) else None


def _union_of_boxes(boxes: list) -> list | None:
    """The box [min..., max...] that holds every one of ``boxes``, or None if one is missing, malformed, or
    crosses the antimeridian (its min x above its max x: a union of such is not a min and a max)."""
    if not boxes or any(not isinstance(b, list) or len(b) not in (4, 6) or len(b) != len(boxes[0]) for b in boxes):
        return None
    if any(not all(isinstance(v, (int, float)) and math.isfinite(v) for v in b) for b in boxes):
        return None  # (NaNs: an older GeoPandas' empty frame; min and max of them depend on the order)
    half = len(boxes[0]) // 2
    if any(b[0] > b[half] for b in boxes):
        return None
    return [min(b[i] for b in boxes) for i in range(half)] + [max(b[i] for b in boxes) for i in range(half, 2 * half)]


HUGGING_FACE = b"huggingface"


def hugging_face_features(schema: pa.Schema) -> dict | None:
    """The Hugging Face ``datasets`` features a file's schema metadata records, by column, or None.

    ``datasets`` keeps there what Arrow's types do not say: a ``ClassLabel``'s
    names, that a struct of bytes and a path is an ``Image``.

    >>> hugging_face_features(pa.schema([("label", pa.int64())], metadata={
    ...     "huggingface": '{"info": {"features": {"label": {"names": ["neg", "pos"], "_type": "ClassLabel"}}}}'}))
    {'label': {'names': ['neg', 'pos'], '_type': 'ClassLabel'}}
    """
    found = (schema.metadata or {}).get(HUGGING_FACE)
    if found is None:
        return None
    try:
        features = json.loads(found)["info"]["features"]
    except (ValueError, KeyError, TypeError):
        return None
    return features if isinstance(features, dict) else None


def _widened_past_38_digits(merged: pa.DataType, a: pa.DataType, b: pa.DataType) -> bool:
    """Whether unifying two types took a decimal256 (over 38 digits) where neither had one, nested too."""
    return _has_decimal256(merged) and not (_has_decimal256(a) or _has_decimal256(b))


def _has_decimal256(kind: pa.DataType) -> bool:
    if pa.types.is_decimal256(kind):
        return True
    if pa.types.is_dictionary(kind):
        return _has_decimal256(kind.value_type)
    return any(_has_decimal256(kind.field(i).type) for i in range(kind.num_fields))


def _pandas_layout(schema: pa.Schema) -> dict | None:
    """A schema's pandas metadata without who wrote it (pandas and pyarrow versions)."""
    found = (schema.metadata or {}).get(b"pandas")
    if found is None:
        return None
    try:
        layout = json.loads(found)
    except ValueError:
        return {"unreadable": found}
    return {k: v for k, v in layout.items() if k not in ("creator", "pandas_version")}


def _merge(a: pa.DataType, b: pa.DataType, a_int96: bool = False, b_int96: bool = False) -> pa.DataType | None:
    """The type that holds the values of both, or None; ``a_int96``: ``a`` is that of INT96 columns only.

    >>> _merge(pa.timestamp("us", "UTC"), pa.timestamp("ns", "Europe/Paris"))  # instants, in any zone
    TimestampType(timestamp[ns, tz=UTC])
    >>> _merge(pa.timestamp("us"), pa.timestamp("us", "UTC"), a_int96=True)  # Spark's instants, both
    TimestampType(timestamp[us, tz=UTC])
    >>> _merge(pa.int64(), pa.decimal128(5, 2))  # 19 digits and 2 places, as DuckDB unites them
    Decimal128Type(decimal128(21, 2))
    """
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b) and ((a_int96 and b.tz) or (b_int96 and a.tz)):
        return _merge(a if a.tz else pa.timestamp(a.unit, "UTC"), b if b.tz else pa.timestamp(b.unit, "UTC"))
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b) and a.tz and b.tz and a.tz != b.tz:
        # Arrow stores both as UTC instants: only their display differs (pyarrow refuses to merge them)
        finer = max((a, b), key=lambda t: ["s", "ms", "us", "ns"].index(t.unit)).unit
        return pa.timestamp(finer, "UTC")
    for x, y in [(_decoded(a), _decoded(b)), (_decoded(b), _decoded(a))]:
        if pa.types.is_decimal(x) and pa.types.is_integer(y):
            # pyarrow promotes int64 and decimal(5, 2) to decimal(20, 2), to which it then casts no int64 (it
            # counts 19 digits and 2 places: "Precision is not great enough"); DuckDB's union, decimal(21, 2)
            precision = max(x.precision - x.scale, _INTEGER_DIGITS[y.bit_width, pa.types.is_signed_integer(y)])
            precision += x.scale
            if precision > 76:  # (no decimal holds both)
                return None
            return pa.decimal128(precision, x.scale) if precision <= 38 else pa.decimal256(precision, x.scale)
    for x, y in [(a, b), (_decoded(a), _decoded(b))]:
        try:
            merged = pa.unify_schemas([pa.schema([("c", x)]), pa.schema([("c", y)])], promote_options="permissive")
            return merged.field("c").type
        except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


# The decimal digits of an integer type's largest magnitude, by (bits, signed): 2**63 - 1 has 19
_INTEGER_DIGITS = {(8, True): 3, (16, True): 5, (32, True): 10, (64, True): 19}
_INTEGER_DIGITS.update({(8, False): 3, (16, False): 5, (32, False): 10, (64, False): 20})


def _decoded(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


_SAME_VALUES = [
    (pa.types.is_string, pa.types.is_large_string),
    (pa.types.is_binary, pa.types.is_large_binary),
]
# Layouts of the same values that Arrow's take and filter do not select from (pyarrow 26: "no kernel matching
# input types (string_view, int64)"), and their plain forms, which the plan's schema takes: Polars, DataFusion
# and DuckDB write views, and any reader reads the result's values alike.
_VIEW_FORMS = [
    (pa.types.is_string_view, pa.types.is_string, pa.types.is_large_string),
    (pa.types.is_binary_view, pa.types.is_binary, pa.types.is_large_binary),
]


def _variable_list(kind: pa.DataType) -> bool:
    return any(
        is_kind(kind)
        for is_kind in (pa.types.is_list, pa.types.is_large_list, pa.types.is_list_view, pa.types.is_large_list_view)
    )


def without_views(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its view types, nested ones too, as their large forms (``string_view`` as
    ``large_string``, ``list_view`` as ``large_list``): the same values, in a layout Arrow's kernels select.

    >>> without_views(pa.schema([("s", pa.string_view()), ("l", pa.list_(pa.binary_view()))])).types
    [DataType(large_string), ListType(list<item: large_binary>)]
    """
    fields = [f.with_type(view_free(f.type)) for f in schema]
    return (
        schema
        if all(f.type.equals(g.type) for f, g in zip(fields, schema, strict=True))
        else pa.schema(fields, metadata=schema.metadata)
    )


def table_without_views(table: pa.Table) -> pa.Table:
    """``table`` with its view columns as their large forms (``without_views``); ``table`` itself if it has none.

    >>> table_without_views(pa.table({"s": pa.array(["a"], pa.string_view())})).schema.types
    [DataType(large_string)]
    >>> plain = pa.table({"n": [1]})
    >>> table_without_views(plain) is plain  # (no copy, no cast: every Arrow IPC batch was cast before)
    True
    """
    schema = table.schema  # (a new object at each access: compared to itself, every table was cast)
    plain = without_views(schema)
    if plain is schema:
        return table
    columns = [cast_column(c, f.type) for c, f in zip(table.columns, plain, strict=True)]
    return pa.Table.from_arrays(columns, schema=plain)


def view_free(kind: pa.DataType) -> pa.DataType:
    """``kind`` with its views, nested ones too, as their large forms (``without_views``)."""
    if pa.types.is_string_view(kind):
        return pa.large_string()
    if pa.types.is_binary_view(kind):
        return pa.large_binary()
    if pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind):
        return pa.large_list(kind.value_field.with_type(view_free(kind.value_type)))
    if pa.types.is_dictionary(kind):
        return pa.dictionary(kind.index_type, view_free(kind.value_type), kind.ordered)
    return _rebuilt(kind, lambda f: f.with_type(view_free(f.type)))


def reading_metadata(field: pa.Field) -> dict[bytes, bytes]:
    """A column's metadata that tells readers how to read its values (Polars: an Enum's categories), without
    what identifies it (Parquet field ids) or daskpile's own marks.

    >>> reading_metadata(pa.field("e", pa.string(), metadata={"_PL_ENUM_VALUES2": "1;x", "PARQUET:field_id": "3"}))
    {b'_PL_ENUM_VALUES2': b'1;x'}
    """
    return {k: v for k, v in (field.metadata or {}).items() if k not in (FIELD_ID, INT96)}


# Metadata keys a reader takes as part of a column's type: Polars' Enum categories, an extension type pyarrow
# does not know (a CRS).  Other keys (Polars' Categorical tag, a description) may differ from file to file.
TYPING_KEYS = (b"_PL_ENUM_VALUES", b"ARROW:extension:")


def typing_metadata(field: pa.Field, nested_only: bool = False) -> dict[tuple[str, ...], dict[bytes, bytes]]:
    """The metadata of ``field`` and of its nested fields that readers take as part of the type, by path.

    >>> enum = pa.field("e", pa.string(), metadata={"_PL_ENUM_VALUES2": "1;x", "_PL_CATEGORICAL2": "0"})
    >>> typing_metadata(pa.field("l", pa.list_(enum)))
    {('l', 'element'): {b'_PL_ENUM_VALUES2': b'1;x'}}
    """
    found = {}

    def walk(f: pa.Field, path: tuple[str, ...]) -> None:
        typing = {k: v for k, v in (f.metadata or {}).items() if k.startswith(TYPING_KEYS)}
        if typing and (len(path) > 1 or not nested_only):
            found[path] = typing
        for child, name in _children(f.type):
            walk(child, (*path, name))

    walk(field, (field.name,))
    return found


def _children(kind: pa.DataType) -> list[tuple[pa.Field, str]]:
    """The nested fields of ``kind``, each with its name in a path (Iceberg's, where Arrow's vary by writer)."""
    if pa.types.is_struct(kind):
        return [(f, f.name) for f in kind.fields]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [(kind.value_field, LIST_ELEMENT)]
    if pa.types.is_map(kind):
        return [(kind.key_field, MAP_KEY), (kind.item_field, MAP_VALUE)]
    return []


def _without_nested_metadata(kind: pa.DataType) -> pa.DataType:
    """``kind`` with no metadata on its nested fields (a List(Enum) of other categories in other files)."""
    return _rebuilt(kind, lambda f: f.remove_metadata().with_type(_without_nested_metadata(f.type)))


def same_values(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a column of type ``actual`` holds its values unchanged as ``expected`` (strict mode's tolerance),
    nested types field by field (Polars writes large strings and lists at every level).

    >>> same_values(pa.struct([("b", pa.large_string())]), pa.struct([("b", pa.string())]))
    True
    >>> same_values(pa.map_(pa.large_string(), pa.int64()), pa.map_(pa.string(), pa.int32()))
    False
    """
    if actual.equals(expected) or pa.types.is_null(actual):
        return True
    if _variable_list(actual) and _variable_list(expected):  # (a file's list views too, read as lists)
        return same_values(actual.value_type, expected.value_type)
    if pa.types.is_fixed_size_list(actual) and pa.types.is_fixed_size_list(expected):
        return actual.list_size == expected.list_size and same_values(actual.value_type, expected.value_type)
    for one, other in _SAME_VALUES:
        if (one(actual) and other(expected)) or (other(actual) and one(expected)):
            return True
    for view, *plain in _VIEW_FORMS:  # (a file's views, read as the plan's plain form)
        if view(actual) and any(p(expected) for p in plain):
            return True
    if pa.types.is_struct(actual) and pa.types.is_struct(expected):
        theirs = {actual.field(i).name: actual.field(i) for i in range(actual.num_fields)}
        ours = [expected.field(i) for i in range(expected.num_fields)]
        if len(theirs) < actual.num_fields or len({f.name for f in ours}) < len(ours):  # a name twice: by position
            return actual.num_fields == len(ours) and all(_same_field(actual.field(i), f) for i, f in enumerate(ours))
        # by name: Arrow's cast puts them in the plan's order
        return set(theirs) == {f.name for f in ours} and all(_same_field(theirs[f.name], f) for f in ours)
    if pa.types.is_map(actual) and pa.types.is_map(expected):
        return same_values(actual.key_type, expected.key_type) and _same_field(actual.item_field, expected.item_field)
    return False


def _same_field(actual: pa.Field, expected: pa.Field) -> bool:
    """A nested field that holds its values unchanged: its name, its nulls allowed where the plan's are (a cast
    to a field that allows none fails on the first null, in pass 2), its values' type."""
    return (
        actual.name == expected.name
        and (expected.nullable or not actual.nullable)
        and same_values(actual.type, expected.type)
    )


@dataclasses.dataclass(frozen=True)
class Conformer:
    """Turns tables read from one file into the plan's schema: reorder, cast, fill missing columns, add keys."""

    schema: pa.Schema  # the plan's
    keys: dict  # this file's partition values (pa.Scalar) by column name
    casts: frozenset  # names of columns whose type changes
    missing: frozenset  # names of columns this file lacks (nulls)
    check_nulls: frozenset  # columns the plan says are never null and this file allows nulls in
    identity: bool
    renamed: tuple = ()  # (plan name, the file's name) of columns the file holds under another name
    echoed: frozenset = frozenset()  # partition keys the file holds as columns too (polars' partition_by)

    def __call__(self, table: pa.Table, url: str) -> pa.Table:
        """``table``, read from ``url``, in the plan's schema (metadata aside: the reader sets it once)."""
        if self.identity:
            return table
        n = table.num_rows
        columns = []
        for field in self.schema:
            if field.name in self.keys:
                if field.name in self.echoed:  # the file's own values, once they are seen to be the folder's
                    column = table.column(field.name)
                    _check_echo(column, self.keys[field.name], field.name, url)
                    columns.append(column if column.type.equals(field.type) else column.cast(field.type))
                    continue
                columns.append(pa.repeat(self.keys[field.name], n))
                continue
            if field.name in self.missing:
                columns.append(pa.nulls(n, field.type))
                continue
            column = table.column(dict(self.renamed).get(field.name, field.name))
            if field.name in self.check_nulls and column.null_count:
                raise ValueError(f"column {field.name!r} of {url!r} has nulls, which the dataset's schema forbids")
            if field.name in self.casts:
                try:
                    column = cast_column(column, field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                    raise ValueError(f"column {field.name!r} of {url!r} does not fit {field.type}: {e}") from None
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self.schema)


def cast_column(column: pa.ChunkedArray | pa.Array, kind: pa.DataType) -> pa.ChunkedArray | pa.Array:
    """``column.cast(kind)``, a list view to a list by its values in row order: pyarrow 26 casts a list view to
    a list that is not valid (its offsets are the views', which may be out of order, or short by one)."""
    if not (pa.types.is_list_view(column.type) or pa.types.is_large_list_view(column.type)):
        return column.cast(kind)
    chunks = []
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        lengths = np.asarray(pc.fill_null(pc.list_value_length(chunk), 0), dtype=np.int64)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]))
        values = pc.list_flatten(chunk).cast(kind.value_type)
        chunks.append(pa.LargeListArray.from_arrays(offsets, values, mask=chunk.is_null()).cast(kind))
    return pa.chunked_array(chunks, kind) if isinstance(column, pa.ChunkedArray) else chunks[0]


def _check_echo(column: pa.ChunkedArray, key: pa.Scalar, name: str, url: str) -> None:
    """A file's column that holds its partition folder's value: every row the folder's value, or ValueError."""
    try:
        values = column.cast(key.type)
        same = (
            values.null_count == len(values)
            if not key.is_valid
            else not values.null_count and pc.all(pc.equal(values, key)).as_py() in (True, None)
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        same = False
    if not same:
        other = next((v for v in column.to_pylist() if v != key.as_py()), None)
        raise ValueError(
            f"column {name!r} of {url!r} holds {other!r} where its partition folder says {name}={key.as_py()!r}: "
            "pass partitioning='none' (--partitioning none) to read the files' column and ignore the folders"
        )


def conformer(
    actual: pa.Schema,
    plan_schema: pa.Schema,
    keys: dict,
    policy: str,
    url: str,
    reference: str,
    field_ids: dict[int, tuple[str, ...]] | None = None,
    name_ids: dict[str, int] | None = None,
):
    """The ``Conformer`` of a file with schema ``actual``, or ValueError naming its differences from the plan.

    ``policy`` is "strict", "window" (strict, into a moving window's schema),
    "unify" (the plan's schema is the union of the
    files') or "table" (a table format's schema: files written before a column
    was added lack it).  With ``field_ids`` (Iceberg: field id -> its path of
    names now), a file's columns are its field ids, whatever they were called
    when it was written, and ids the table has dropped are not read; nested
    fields are read by name, so a file whose nested names no longer fit their
    ids is refused.  ``name_ids`` (an Iceberg table's name mapping: a column
    name -> its field id) gives the ids of the columns of a file written
    without them (a Hive table's, added to the table as it was).
    """
    data_fields = [f for f in plan_schema if f.name not in keys]
    data_names = {f.name for f in data_fields}
    names = _current_names(actual, field_ids, name_ids or {}) if field_ids else {f.name: f.name for f in actual}
    actual_fields = {names[f.name]: f for f in actual if names[f.name] is not None}
    renamed = tuple((new, old) for old, new in names.items() if new is not None and new != old)
    # A column the folders name too (polars' partition_by writes both): read from the folders, and checked to
    # hold their values in every row as it is read
    echoed = frozenset(n for n in actual_fields if n in keys) if policy != "table" else frozenset()
    problems = [f"{n}: unexpected column" for n in actual_fields if n not in data_names and n not in keys]
    if field_ids:
        problems += _nested_fields_misread(actual, names, field_ids)
    missing = frozenset(f.name for f in data_fields if f.name not in actual_fields)
    if policy in STRICT:
        problems += _features_differing(actual, plan_schema, data_names)
    casts, check_nulls = set(), set()
    for field in data_fields:
        found = actual_fields.get(field.name)
        if found is None:
            continue
        if not found.type.equals(field.type):
            if policy in STRICT and not same_values(found.type, field.type):
                problems.append(
                    f"{field.name}: {found.type} instead of {field.type}{_codes_hint(found.type, field.type)}"
                )
            casts.add(field.name)
        elif policy in STRICT and typing_metadata(found) != typing_metadata(field):
            problems.append(f"{field.name}: {_metadata_said(found)} instead of {_metadata_said(field)}")
        if found.nullable and not field.nullable:
            check_nulls.add(field.name)
    if policy in STRICT:
        problems += [f"{n}: missing" for n in sorted(missing)]
    if problems:
        hint = {
            "strict": "(schema='unify', --schema unify on the command line, takes the union of the files' columns)",
            "window": "(an append takes the window's columns and types: convert the files, or start a new window)",
            "first file": "(files other than Parquet take the first file's columns and types: convert them to those)",
        }.get(policy, "(a column renamed after the file was written?)")
        untyped = [f.name for f in data_fields if pa.types.is_null(f.type) and f.name in casts]
        if policy == "window" and untyped:  # (converting the day cannot help: a null column holds no value)
            hint = untyped_window_column(untyped[0])
        raise ValueError(f"schema of {url!r} differs from that of {reference!r}: {'; '.join(problems)} {hint}")
    identity = not keys and actual.remove_metadata().equals(pa.schema(data_fields).remove_metadata())
    return Conformer(
        plan_schema, dict(keys), frozenset(casts), missing, frozenset(check_nulls), identity, renamed, echoed
    )


def untyped_window_column(name: str | None = None) -> str:
    """Why a window's column of type null refuses a value, and what to do, wherever an append finds it.

    >>> untyped_window_column("coupon")[:46]
    "(the window's column 'coupon' is of type null:"
    """
    column = f"the window's column {name!r}" if name else "the window's column"
    return (
        f"({column} is of type null: no row of its first data held a value, so it can hold none; start a new "
        "window from data that gives the column its type, e.g. pandas' .astype('string') or a pyarrow schema)"
    )


def _features_differing(actual: pa.Schema, plan_schema: pa.Schema, names: set[str]) -> list[str]:
    """The columns whose Hugging Face features differ between a file and the plan (a ``ClassLabel``'s names in
    another order: its codes then mean other labels), where both record them."""
    theirs, ours = hugging_face_features(actual), hugging_face_features(plan_schema)
    if theirs is None or ours is None:
        return []
    return [
        f"{n}: Hugging Face feature {json.dumps(theirs[n])[:120]} instead of {json.dumps(ours[n])[:120]}"
        for n in sorted(names)
        if n in theirs and n in ours and theirs[n] != ours[n]
    ]


def _metadata_said(field: pa.Field) -> str:
    said = "; ".join(
        f"{'.'.join(path[1:]) + ' ' if len(path) > 1 else ''}{k.decode(errors='replace')}="
        f"{v.decode(errors='replace')[:60]!r}"
        for path, typing in sorted(typing_metadata(field).items()) for k, v in sorted(typing.items())
    )  # fmt: skip
    polars = " (Polars' Enum categories)" if "_PL_ENUM" in said else ""
    return f"metadata {said}{polars}" if said else "no such metadata"


def _codes_hint(actual: pa.DataType, expected: pa.DataType) -> str:
    """Why two categoricals of the same values differ, where that is the width of their codes."""
    if not (pa.types.is_dictionary(actual) and pa.types.is_dictionary(expected)):
        return ""
    if not actual.value_type.equals(expected.value_type):
        return ""
    return (
        f" (categories coded in {actual.index_type}, not {expected.index_type}: pandas codes a categorical in int8 "
        "up to 127 categories and in int16 beyond; data whose categories may grow wants wider codes, or the values)"
    )


FIELD_ID = b"PARQUET:field_id"
# The names Iceberg gives the fields inside a list and a map, in the paths of its field ids (``tables.field_paths``)
LIST_ELEMENT, MAP_KEY, MAP_VALUE = "element", "key", "value"


def _current_names(
    actual: pa.Schema, field_ids: dict[int, tuple[str, ...]], name_ids: dict[str, int]
) -> dict[str, str | None]:
    """Each column's name in the table now, by its field id, or the id the name mapping gives a column written
    without one (None: dropped); a column with neither keeps its name."""
    names = {}
    for field in actual:
        found = (field.metadata or {}).get(FIELD_ID) or name_ids.get(field.name)
        path = (field.name,) if found is None else field_ids.get(int(found), ())
        names[field.name] = path[0] if len(path) == 1 else None
    return names


def _nested_fields_misread(
    actual: pa.Schema, names: dict[str, str | None], field_ids: dict[int, tuple[str, ...]]
) -> list[str]:
    """The nested fields of a file that reading by name would misread: renamed since (read as nulls), or dropped
    with another field of their name added since (its values read as the new field's)."""
    ids_now = {path: field_id for field_id, path in field_ids.items()}
    problems = []

    def walk(kind: pa.DataType, path: tuple[str, ...]) -> None:
        for child, name in _children(kind):
            found, where = (child.metadata or {}).get(FIELD_ID), (*path, name)
            now = None if found is None else field_ids.get(int(found))
            if found is not None and now is not None and now != where:
                problems.append(f"{'.'.join(where)}: renamed {'.'.join(now)} (field id {int(found)})")
            elif found is not None and now is None and where in ids_now:
                problems.append(f"{'.'.join(where)}: dropped (field id {int(found)}), and added again as field id "
                                f"{ids_now[where]}")  # fmt: skip
            walk(child.type, where)

    for field in actual:
        if names.get(field.name) is not None:
            walk(field.type, (names[field.name],))
    if problems:
        problems[-1] += (
            " since the file was written: daskpile reads nested fields by name, and would read other values "
            "(rewrite the table's older files, e.g. by compacting it, first)"
        )
    return problems
