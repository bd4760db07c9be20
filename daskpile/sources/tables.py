"""Table formats: a folder with ``_delta_log/`` (Delta Lake) or ``metadata/*.metadata.json`` (Iceberg).

Such a folder also holds files its log has removed, so it is never read as
loose Parquet files.  The table's own library (``deltalake``, ``pyiceberg``;
the ``delta`` and ``iceberg`` extras) says which files are live at the
current version (or ``version=``), their partition values and the table's
schema.  Row-level deletes that those files do not show (Delta deletion
vectors, Iceberg delete files) are refused by name, never ignored.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
import urllib.parse

import pyarrow as pa

from daskpile._storage import exists, filesystem, full_url
from daskpile.sources.schemas import LIST_ELEMENT, MAP_KEY, MAP_VALUE

DELTA_LOG = "_delta_log"
ICEBERG_METADATA = "metadata"
_ICEBERG_VERSION = re.compile(r"^(?:v)?(\d+)[-.].*metadata\.json$")


@dataclasses.dataclass(frozen=True)
class TableFiles:
    """The live data files of a table at one version, with their partition values."""

    format: str  # "delta" or "iceberg"
    version: int
    schema: pa.Schema
    files: list[tuple[str, int, str, dict]]  # (path, size, stamp, {key: pa.Scalar})
    # Iceberg: columns are field ids; each id's path of names now, nested fields' too (``field_paths``)
    field_ids: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # Iceberg: the table's name mapping (``schema.name-mapping.default``), a column name -> its field id, for
    # files written without ids (a Hive table's, added as it was: Spark's add_files, pyiceberg's)
    name_ids: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def description(self) -> str:
        return f"{self.format} table at {'snapshot' if self.format == 'iceberg' else 'version'} {self.version}"


def table_format(fs, directory: str) -> str | None:
    """ "delta", "iceberg" or None for a plain folder."""
    if fs.isdir(posixpath.join(directory, DELTA_LOG)):
        return "delta"
    metadata = posixpath.join(directory, ICEBERG_METADATA)
    if fs.isdir(metadata) and any(n.endswith(".metadata.json") for n in fs.ls(metadata, detail=False)):
        return "iceberg"
    return None


def table_around(fs, directory: str) -> str | None:
    """The table folder that ``directory`` is, or lies inside, if any: its loose files include removed ones.

    Checks each ancestor up to the top (two listings each on an object store).
    """
    current = directory.rstrip("/")
    while current and current not in ("/", "."):
        if table_format(fs, current) is not None:
            return current
        parent = posixpath.dirname(current)
        if parent == current:
            break
        current = parent
    return None


def nested_table(paths: list[str], root: str) -> str | None:
    """A table folder below ``root`` among the listed ``paths`` (which must then not be read as loose files)."""
    for path in paths:
        parts = path[len(root) :].strip("/").split("/")
        for i, part in enumerate(parts[:-1]):
            if part == DELTA_LOG or (part == ICEBERG_METADATA and parts[-1].endswith(".metadata.json")):
                return posixpath.join(root, *parts[:i])
    return None


def read_table(fmt: str, url: str, storage_options: dict | None, version: int | None) -> TableFiles:
    return _delta(url, storage_options, version) if fmt == "delta" else _iceberg(url, storage_options, version)


def _require(module: str, extra: str, url: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise ImportError(
            f"{url!r} is {'an' if extra[0] in 'aeiou' else 'a'} {extra.capitalize()} table; reading it needs the "
            f"{module} package: pip install 'daskpile[{extra}]'"
        ) from None


def _delta(url: str, storage_options: dict | None, version: int | None) -> TableFiles:
    deltalake = _require("deltalake", "delta", url)
    import pyarrow.dataset as ds  # (imports pandas, as deltalake does anyway)

    fs, root = filesystem(url, storage_options)
    if version is not None and version < 0:
        raise ValueError(f"a Delta table's versions count from 0, and {version} was asked of {url!r}")
    try:
        table = deltalake.DeltaTable(
            full_url(fs, root), version=version, storage_options=_delta_options(storage_options)
        )
        dataset = table.to_pyarrow_dataset()  # refuses the reader features it cannot honour, by name
    except Exception as e:  # deltalake's errors have no common base class
        latest = _latest_delta_version(deltalake, full_url(fs, root), storage_options) if version else None
        if latest is not None and version > latest:
            raise ValueError(f"the Delta table {url!r} has no version {version} (its latest is {latest})") from None
        raise ValueError(f"cannot read the Delta table {url!r}: {_one_line(e)}") from None
    mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mapping != "none":
        raise ValueError(f"the Delta table {url!r} uses column mapping ({mapping!r}), which daskpile cannot read")
    actions = pa.table(table.get_add_actions(flatten=True))
    # The log's paths are URL-encoded once more than the files' (city=Paris%252Fx for city=Paris%2Fx).
    paths = [urllib.parse.unquote(p) for p in actions["path"].to_pylist()]
    sizes = dict(zip(paths, actions["size_bytes"].to_pylist(), strict=True))
    stamps = dict(zip(paths, actions["modification_time"].to_pylist(), strict=True))
    keys = tuple(table.metadata().partition_columns)
    files = []
    for fragment in dataset.get_fragments():
        relative = fragment.path
        if relative not in sizes:
            raise ValueError(f"the Delta table {url!r} lists {relative!r}, which its add actions do not describe")
        found = ds.get_partition_keys(fragment.partition_expression)
        values = {k: pa.scalar(found.get(k), dataset.schema.field(k).type) for k in keys}
        path = posixpath.join(root, relative)
        files.append((path, int(sizes[relative]), f"{sizes[relative]}:{stamps[relative]}", values))
    return TableFiles("delta", table.version(), dataset.schema, sorted(files, key=lambda f: f[0]))


def _latest_delta_version(deltalake, url: str, storage_options: dict | None) -> int | None:
    try:
        return deltalake.DeltaTable(url, storage_options=_delta_options(storage_options)).version()
    except Exception:  # (the table itself unreadable: its own error is said)
        return None


def _iceberg(url: str, storage_options: dict | None, version: int | None) -> TableFiles:
    _require("pyiceberg", "iceberg", url)
    from pyiceberg.table import StaticTable

    fs, root = filesystem(url, storage_options)
    metadata_path = _latest_iceberg_metadata(fs, root)
    try:
        table = StaticTable.from_metadata(full_url(fs, metadata_path), properties=_iceberg_options(storage_options))
        snapshot = table.current_snapshot() if version is None else table.snapshot_by_id(version)
        if version is not None and snapshot is None:
            raise ValueError(f"the Iceberg table {url!r} has no snapshot {version}")
        tasks = [] if snapshot is None else list(table.scan(snapshot_id=snapshot.snapshot_id).plan_files())
        # An older snapshot asked for is read with its own schema, as pyiceberg reads it (columns dropped since
        # were still there); the current one with the table's, as a scan of the table reads it (a column added
        # or renamed since its last snapshot changes no snapshot), asked for by its id or not, so that a result
        # and its verify, which asks for the snapshot the result records, read it alike
        current = table.current_snapshot()
        older = snapshot is not None and (current is None or snapshot.snapshot_id != current.snapshot_id)
        at_snapshot = table.schemas().get(snapshot.schema_id) if older else None
        at_snapshot = at_snapshot if at_snapshot is not None else table.schema()
        schema = at_snapshot.as_arrow()
        field_ids = field_paths(at_snapshot)
        name_ids = _name_mapping(table.metadata.properties.get("schema.name-mapping.default"), url)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"cannot read the Iceberg table {url!r}: {_one_line(e)}") from None
    deleted = [t.file.file_path for t in tasks if t.delete_files]
    if deleted:
        raise ValueError(
            f"the Iceberg table {url!r} has row-level delete files for {len(deleted)} data files "
            f"(the first: {deleted[0]!r}), which daskpile does not apply: compact the table first"
        )
    files = []
    for task in tasks:
        _, path = filesystem(task.file.file_path, storage_options)
        files.append((path, int(task.file.file_size_in_bytes), str(task.file.file_size_in_bytes), {}))
    schema = pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])  # without the field-id metadata
    snapshot_id = snapshot.snapshot_id if snapshot is not None else 0
    return TableFiles("iceberg", snapshot_id, schema, sorted(files, key=lambda f: f[0]), field_ids, name_ids)


def _name_mapping(mapping: str | None, url: str) -> dict[str, int]:
    """The top-level names of an Iceberg name mapping (JSON: ``[{"names": [...], "field-id": 1}, ...]``), each
    with its field id.

    >>> _name_mapping('[{"names": ["city", "town"], "field-id": 2}]', "t")
    {'city': 2, 'town': 2}
    """
    if not mapping:
        return {}
    try:
        return {name: int(entry["field-id"]) for entry in json.loads(mapping) for name in entry.get("names", ())}
    except (ValueError, TypeError, KeyError):
        raise ValueError(f"the Iceberg table {url!r} has a name mapping that is not one: {mapping[:200]!r}") from None


def field_paths(schema) -> dict[int, tuple[str, ...]]:
    """Every field id of an Iceberg schema, nested ones included, with its path of names.

    >>> from pyiceberg.schema import Schema  # doctest: +SKIP
    >>> from pyiceberg.types import NestedField, LongType, StructType  # doctest: +SKIP
    >>> field_paths(Schema(NestedField(1, "st", StructType(NestedField(2, "a", LongType())))))  # doctest: +SKIP
    {1: ('st',), 2: ('st', 'a')}
    """
    from pyiceberg.types import ListType, MapType, StructType

    paths = {}

    def walk(kind, path: tuple[str, ...]) -> None:
        if isinstance(kind, StructType):
            children = [(f.field_id, f.name, f.field_type) for f in kind.fields]
        elif isinstance(kind, ListType):
            children = [(kind.element_id, LIST_ELEMENT, kind.element_type)]
        elif isinstance(kind, MapType):
            children = [(kind.key_id, MAP_KEY, kind.key_type), (kind.value_id, MAP_VALUE, kind.value_type)]
        else:
            return
        for field_id, name, child in children:
            paths[field_id] = (*path, name)
            walk(child, (*path, name))

    walk(schema.as_struct(), ())
    return paths


def _latest_iceberg_metadata(fs, root: str) -> str:
    """The table's current metadata file: ``version-hint.text`` if there is one, else the highest version."""
    directory = posixpath.join(root, ICEBERG_METADATA)
    hint = posixpath.join(directory, "version-hint.text")
    names = [posixpath.basename(p) for p in fs.ls(directory, detail=False)]
    if exists(fs, hint):
        version = fs.cat_file(hint).decode().strip()
        for name in names:
            if name in (f"v{version}.metadata.json", f"{version}.metadata.json") or name.startswith(f"{version}-"):
                return posixpath.join(directory, name)
    versions = [(int(m.group(1)), n) for n in names if (m := _ICEBERG_VERSION.match(n))]
    if not versions:
        raise ValueError(f"{full_url(fs, directory)!r} holds no Iceberg metadata file")
    return posixpath.join(directory, max(versions)[1])


# fsspec's S3 options, and the names delta-rs and pyiceberg give them: only those given are passed on
# (the environment or a profile supplies the rest, as for fsspec).
_S3_OPTIONS = [  # (how fsspec's options give it, delta-rs's name, pyiceberg's name)
    (lambda so, client: so.get("key"), "AWS_ACCESS_KEY_ID", "s3.access-key-id"),
    (lambda so, client: so.get("secret"), "AWS_SECRET_ACCESS_KEY", "s3.secret-access-key"),
    (lambda so, client: so.get("token"), "AWS_SESSION_TOKEN", "s3.session-token"),
    (lambda so, client: client.get("endpoint_url") or so.get("endpoint_url"), "AWS_ENDPOINT_URL", "s3.endpoint"),
    (lambda so, client: client.get("region_name"), "AWS_REGION", "s3.region"),
    (lambda so, client: so.get("profile"), "AWS_PROFILE", "s3.profile-name"),
    (lambda so, client: "true" if so.get("anon") else None, "AWS_SKIP_SIGNATURE", "s3.anonymous"),
]


def _s3_options(storage_options: dict | None, which: int) -> dict:
    so = storage_options or {}
    client = so.get("client_kwargs") or {}
    return {names[which]: str(value) for get, *names in _S3_OPTIONS if (value := get(so, client))}


def _delta_options(storage_options: dict | None) -> dict | None:
    """delta-rs reads the environment's endpoint itself, but refuses one over http unless told to allow it."""
    options = _s3_options(storage_options, 0)
    if (options.get("AWS_ENDPOINT_URL") or _environment_endpoint() or "").startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    return options or None


def _iceberg_options(storage_options: dict | None) -> dict:
    """pyiceberg's S3 takes no endpoint or region from the environment (it asked real AWS where a MinIO was):
    they are passed on, as s3fs and delta-rs take them."""
    options = _s3_options(storage_options, 1)
    if "s3.endpoint" not in options and _environment_endpoint():
        options["s3.endpoint"] = _environment_endpoint()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if "s3.region" not in options and region:
        options["s3.region"] = region
    return options


def _environment_endpoint() -> str | None:
    """The S3 endpoint the environment gives (as botocore and delta-rs read it), if any."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _one_line(error: Exception) -> str:
    """A library's error on one line: delta-rs puts the cause ("URL scheme is not allowed") on later lines."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())
