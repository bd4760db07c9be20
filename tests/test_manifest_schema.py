"""The manifest of real runs against its published, versioned schema (daskpile/manifest.schema.json)."""

import json
from importlib.resources import files

import jsonschema
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import daskpile
from daskpile.datasets import write_reference_dataset

SCHEMA = json.loads(files("daskpile").joinpath("manifest.schema.json").read_text())


def check(dest) -> dict:
    manifest = daskpile.read_manifest(str(dest))
    jsonschema.validate(manifest, SCHEMA, format_checker=jsonschema.FormatChecker())
    return manifest


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifest") / "src"
    write_reference_dataset(str(root), rows=40_000, files=4)
    return str(root)


def test_the_schema_is_a_valid_json_schema_of_the_current_format():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    from daskpile.engine import _manifest  # (not an attribute of daskpile until imported)

    assert SCHEMA["properties"]["format"]["enum"] == [_manifest.FORMAT, _manifest.WINDOW_FORMAT]


@pytest.mark.parametrize(
    "options",
    [
        {"piles": 3, "seed": 1},
        {"piles": "auto", "memory_per_pile": 2**20},
        {"piles": 2, "seed": 2, "memory_per_pile": 600_000},  # piles over the budget are split
        {"piles": 3, "seed": 3, "rows_per_file": 7_000},
        {"piles": 3, "seed": 4, "verify": False},
    ],
    ids=["plain", "auto", "split", "rows_per_file", "no_verify"],
)
def test_manifests_of_real_runs_follow_the_schema(source, tmp_path, sync_scheduler, options):
    daskpile.shuffle_parquet(source, str(tmp_path / "out"), **options)
    manifest = check(tmp_path / "out")
    assert sum(manifest["rows_per_file"]) == manifest["rows"] == 40_000


def test_a_run_in_fewer_scratch_bands_follows_it(source, tmp_path, sync_scheduler, monkeypatch):
    """The band count is the run's, for resuming it, not the call's: the manifest's run does not record it."""
    from daskpile.engine import _scratch

    monkeypatch.setattr(_scratch, "bands_for", lambda *args: 2)
    daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=3, seed=1)
    assert "bands" not in check(tmp_path / "out")["run"]


def test_a_partitioned_lake_and_an_empty_source_follow_it(tmp_path, sync_scheduler):
    table = pa.table({"id": list(range(100)), "year": [2023, 2024] * 50})
    ds.write_dataset(table, tmp_path / "lake", format="parquet", partitioning=["year"], partitioning_flavor="hive")
    daskpile.shuffle_parquet(str(tmp_path / "lake"), str(tmp_path / "out"), piles=2, seed=1)
    assert check(tmp_path / "out")["source"]["partition_keys"] == {"year": "int32"}
    (tmp_path / "empty").mkdir()
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "empty" / "a.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "empty"), str(tmp_path / "none"), piles=2, seed=1)
    assert check(tmp_path / "none")["rows"] == 0


def test_a_manifest_off_the_schema_is_refused(source, tmp_path, sync_scheduler):
    """The variant that must fail: the schema is a contract, not a description that accepts anything."""
    daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, seed=1)
    manifest = check(tmp_path / "out")
    for broken in (
        {**manifest, "surprise": 1},
        {k: v for k, v in manifest.items() if k != "fingerprint"},
        {**manifest, "format": "daskpile/2"},
        {**manifest, "files": ["../escape.parquet"]},
        {**manifest, "fingerprint": {**manifest["fingerprint"], "sum": "not hex"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, SCHEMA)


def test_a_manifest_of_another_format_is_refused_not_misread(source, tmp_path, sync_scheduler):
    import json

    daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, seed=1)
    path = tmp_path / "out" / "_daskpile.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": "daskpile/3"}))
    with pytest.raises(ValueError, match=r"manifest format 'daskpile/3', and this daskpile reads 'daskpile/1' and"):
        daskpile.read_manifest(str(tmp_path / "out"))


def test_every_version_of_a_moving_window_follows_it(source, tmp_path, sync_scheduler):
    """daskpile/2: after an append, an expire that cuts a generation, a compaction; each kept version too."""
    table = pq.read_table(source)
    for day in range(2):
        (tmp_path / f"day-{day}").mkdir()
        pq.write_table(table.slice(day * 20_000, 20_000), tmp_path / f"day-{day}" / "a.parquet")
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(str(tmp_path / "day-0"), str(dest), piles=3, seed=1)
    daskpile.append(str(dest), str(tmp_path / "day-1"))
    assert check(dest)["format"] == "daskpile/2"
    plain = json.loads((dest / "gen-000001" / "_daskpile.json").read_text())
    plain["window"] = {"version": 1, "next_generation": 2, "file_piles": [], "generations": []}
    with pytest.raises(jsonschema.ValidationError):  # daskpile/1 with a window: a reader of 1 would misread it
        jsonschema.validate(plain, SCHEMA)
    daskpile.expire(str(dest), before=30_000, column="id")
    assert check(dest)["window"]["generations"][0]["cuts"] == [{"column": "id", "before": 30_000}]
    daskpile.compact(str(dest), retain=0)
    assert check(dest)["rows"] == 10_000
    for version in sorted((dest / "_daskpile_versions").glob("v-*.json")):
        manifest = json.loads(version.read_text())
        jsonschema.validate(manifest, SCHEMA, format_checker=jsonschema.FormatChecker())
