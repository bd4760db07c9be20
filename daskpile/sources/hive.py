"""Partition folders (``year=2024/month=03/``): their keys become columns of every row below them.

As ``pyarrow.dataset`` does with ``partitioning="hive"``: values are
URL-decoded, ``__HIVE_DEFAULT_PARTITION__`` is null, and a key's type is
``int32`` when every value of it is one, else ``string``, unless the user
declares the types (a ``pa.Schema``, or ``"year:int16,region:string"`` on the
command line).
"""

from __future__ import annotations

import re
import urllib.parse

import pyarrow as pa

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"
INT32 = (-(2**31), 2**31 - 1)


def parse_partitioning(value) -> pa.Schema | str | None:
    """``partitioning=`` as given: "hive" (discover), None or "none" (ignore folders), a schema, or "k:type,...".

    >>> parse_partitioning("year:int16,region:string")
    year: int16
    region: string
    """
    if value is None or value == "none":
        return None
    if value == "hive" or isinstance(value, pa.Schema):
        return value
    if type(value).__name__ == "HivePartitioning":  # (pyarrow.dataset imports pandas: not imported here)
        return value.schema
    if isinstance(value, str) and ":" in value:
        fields = []
        for item in value.split(","):
            name, _, type_name = item.partition(":")
            try:
                fields.append(pa.field(name.strip(), pa.type_for_alias(type_name.strip())))
            except ValueError:
                raise ValueError(
                    f"partitioning: {type_name.strip()!r} (for key {name.strip()!r}) is not an Arrow type "
                    "(string, int32, int64, date32, timestamp[us], ...)"
                ) from None
        return pa.schema(fields)
    raise ValueError(f"partitioning must be 'hive', 'none', a pyarrow schema or 'key:type,...', got {value!r}")


def folder_keys(path: str) -> list[tuple[str, str]]:
    """The (key, raw value) pairs of every key=value folder in a file's path.

    The whole path, as DuckDB reads it: a source given as ``lake/year=2024/``,
    a glob ``lake/year=*/*.parquet`` or a file inside the folder keeps ``year``
    (pyarrow.dataset drops it for a directory, and Dask with it).

    >>> folder_keys("/lake/year=2024/city=New%20York/part-0.parquet")
    [('year', '2024'), ('city', 'New York')]
    """
    pairs = []
    for segment in path.strip("/").split("/")[:-1]:
        key, sep, value = segment.partition("=")
        if sep and key:
            pairs.append((urllib.parse.unquote(key), urllib.parse.unquote(value)))
    return pairs


class UndeclaredKeysError(ValueError):
    """Partition folders whose keys the partitioning given does not declare (``keys``)."""

    def __init__(self, keys: list[str], url: str = "", declared: pa.Schema | None = None):
        where = f" (of {url!r})" if url else ""
        hint = ""
        if declared is not None:
            added = ",".join(f"{k}:string" for k in keys)
            spelled = ",".join([*(f"{f.name}:{f.type}" for f in declared), added])
            try:  # (a type the option cannot spell, decimal128(5, 2): the keys to add alone)
                said = f"--partitioning {spelled}" if parse_partitioning(spelled).names else ""
            except (ValueError, TypeError):
                said = f"add {added!r} to --partitioning, partitioning="
            hint = f": declare them too ({said}), or partitioning='hive' to infer every key's type"
        super().__init__(f"partition folders{where} have keys {keys} that partitioning= does not declare{hint}")
        self.keys = keys


def key_schema(per_file: list[list[tuple[str, str]]], declared: pa.Schema | str | None, where: list[str]) -> pa.Schema:
    """The partition columns: declared, or discovered from the folders with pyarrow's inference."""
    if declared is None:
        return pa.schema([])
    names: list[str] = []
    for pairs in per_file:
        for name, _ in pairs:
            if name not in names:
                names.append(name)
    for pairs, url in zip(per_file, where, strict=True):
        if (pairs and [n for n, _ in pairs] != names[: len(pairs)]) or (pairs and len(pairs) != len(names)):
            keys = [n for n, _ in pairs]
            if len(set(keys)) < len(keys):
                raise ValueError(f"partition folders of {url!r} name a key twice ({keys}): name each key once")
            others = ((u, [n for n, _ in p]) for p, u in zip(per_file, where, strict=True) if [n for n, _ in p] != keys)
            other = next(others, None)
            said = f"those of {other[0]!r} are {other[1]}" if other else f"the dataset's are {names}"
            raise ValueError(
                f"partition folders of {url!r} are {[n for n, _ in pairs]}, {said}: "
                "every file of a partitioned dataset must sit at the same depth of key=value folders"
            )
    if isinstance(declared, pa.Schema):
        missing = [n for n in names if n not in declared.names]
        if missing:
            url = next(url for pairs, url in zip(per_file, where, strict=True) if any(k in missing for k, _ in pairs))
            raise UndeclaredKeysError(missing, url, declared)
        return pa.schema([declared.field(n) for n in names])
    values = {n: [v for pairs in per_file for k, v in pairs if k == n and v != NULL_VALUE] for n in names}
    return pa.schema([pa.field(n, pa.int32() if _all_int32(values[n]) else pa.string()) for n in names])


def key_values(pairs: list[tuple[str, str]], schema: pa.Schema, url: str) -> tuple:
    """One file's key values, typed as ``schema`` says (null for the default partition or a missing key)."""
    found = dict(pairs)
    values = []
    for field in schema:
        raw = found.get(field.name)
        if raw is None or raw == NULL_VALUE:
            values.append(pa.scalar(None, field.type))
            continue
        try:
            values.append(pa.scalar(raw).cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ValueError(
                f"partition folder {field.name}={raw} of {url!r} is not of type {field.type}: {e}"
            ) from None
    return tuple(values)


_INTEGER = re.compile(r"-?[0-9]+")  # as pyarrow parses: not Python's int() (" 5", "1_000", "+5")


def _all_int32(values: list[str]) -> bool:
    return bool(values) and all(_INTEGER.fullmatch(v) and INT32[0] <= int(v) <= INT32[1] for v in values)
