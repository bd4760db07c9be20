"""Hugging Face ``datasets`` layouts as sources, without ``datasets`` installed: the files as it writes them
(``save_to_disk``: Arrow streams and the ``state.json`` listing them; ``push_to_hub``: Parquet files named by
split), its features kept in the schema metadata, and its splits kept apart."""

import json

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from _util import read_output

import daskpile

FEATURES = {"id": {"dtype": "int64", "_type": "Value"}, "label": {"names": ["neg", "pos"], "_type": "ClassLabel"}}


def hf_table(start: int, rows: int, features: dict = FEATURES) -> pa.Table:
    """Rows as ``datasets`` writes them: its features under the schema metadata key ``huggingface``."""
    table = pa.table({"id": pa.array(range(start, start + rows), pa.int64()), "label": [i % 2 for i in range(rows)]})
    return table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def write_stream(table: pa.Table, path) -> None:
    with ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table)


def save_to_disk(folder, parts: int = 2, rows: int = 500):
    """A folder as ``Dataset.save_to_disk`` writes it (datasets 5.2): Arrow streams, state.json, dataset_info.json."""
    folder.mkdir()
    names = [f"data-{i:05d}-of-{parts:05d}.arrow" for i in range(parts)]
    for i, name in enumerate(names):
        write_stream(hf_table(i * rows, rows), folder / name)
    state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": "f00", "_split": None}
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "dataset_info.json").write_text(json.dumps({"features": FEATURES}))
    return folder


def test_a_saved_dataset_is_its_listed_files_with_its_features(sync_scheduler, tmp_path):
    """A ``map`` or ``filter`` of a dataset loaded from its folder writes a ``cache-*.arrow`` beside its data,
    which ``load_from_disk`` does not read: it was shuffled in as data (every row twice, verified), and the
    features (a ClassLabel's names) were dropped from Arrow sources."""
    saved = save_to_disk(tmp_path / "saved")
    write_stream(hf_table(0, 500), saved / "cache-3f26a1b2c4d5e6f7.arrow")  # the same rows, mapped
    report = daskpile.shuffle_parquet(str(saved), str(tmp_path / "out"), piles=3, seed=1)
    assert report.rows == 1000 and report.skipped_files == [str(saved / "cache-3f26a1b2c4d5e6f7.arrow")]
    out = read_output(tmp_path / "out")
    assert sorted(out["id"].to_pylist()) == list(range(1000))
    for part in sorted((tmp_path / "out").glob("*.parquet")):
        metadata = pq.read_schema(part).metadata
        assert json.loads(metadata[b"huggingface"])["info"]["features"] == FEATURES
    assert daskpile.verify(str(saved), str(tmp_path / "out")).ok


def test_an_arrow_source_keeps_its_schema_metadata_in_every_output_format(sync_scheduler, tmp_path):
    (tmp_path / "src").mkdir()
    write_stream(hf_table(0, 300).replace_schema_metadata({"team": "ml"}), tmp_path / "src" / "a.arrow")
    for output_format in ("parquet", "arrow"):
        dest = tmp_path / f"out-{output_format}"
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(dest), piles=2, seed=1, output_format=output_format)
        part = sorted(dest.glob("part-*"))[0]
        schema = pq.read_schema(part) if output_format == "parquet" else ipc.open_file(part).schema
        assert schema.metadata[b"team"] == b"ml"


def test_a_dataset_dict_is_refused_naming_its_splits(sync_scheduler, tmp_path):
    (tmp_path / "dict").mkdir()
    save_to_disk(tmp_path / "dict" / "train")
    save_to_disk(tmp_path / "dict" / "test")
    (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(ValueError, match=r"is a Hugging Face DatasetDict \(splits test, train\): give the folder"):
        daskpile.shuffle_parquet(str(tmp_path / "dict"), str(tmp_path / "out"), piles=2)
    assert not (tmp_path / "out").exists()
    assert daskpile.shuffle_parquet(str(tmp_path / "dict" / "train"), str(tmp_path / "out"), piles=2).rows == 1000


def test_a_folder_of_several_splits_is_refused_and_a_glob_takes_one(sync_scheduler, tmp_path):
    """A clone of a Hub repository (data/train-00000-of-00002.parquet, data/test-...): its test rows were
    shuffled into its training rows."""
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    (tmp_path / "repo" / "README.md").write_text("---\nlicense: mit\n---\n")
    for split, start in (("train", 0), ("test", 10_000)):
        for i in range(2):
            pq.write_table(hf_table(start + 100 * i, 100), data / f"{split}-{i:05d}-of-00002.parquet")
    with pytest.raises(ValueError, match=r"holds the files of the splits test, train .*'.*/repo/\*\*/train-\*'"):
        daskpile.shuffle_parquet(str(tmp_path / "repo"), str(tmp_path / "out"), piles=2)
    assert not (tmp_path / "out").exists()
    report = daskpile.shuffle_parquet(str(tmp_path / "repo" / "**" / "train-*"), str(tmp_path / "out"), piles=2)
    assert report.rows == 200
    # shards of other names are data, as before: a day's (Apache Beam's default names), a language's
    for i, name in enumerate(["events-2024-01-01", "events-2024-01-02", "en", "fr"]):
        folder = tmp_path / ("beam" if i < 2 else "lang")
        folder.mkdir(exist_ok=True)
        pq.write_table(hf_table(100 * i, 100), folder / f"{name}-00000-of-00001.parquet")
    for folder in ("beam", "lang"):
        assert daskpile.shuffle_parquet(str(tmp_path / folder), str(tmp_path / f"out-{folder}"), piles=2).rows == 200


def test_class_labels_named_otherwise_are_refused_strict_and_dropped_unified(sync_scheduler, tmp_path):
    """A ClassLabel whose names differ between files: its codes mean other labels in each, and every output
    file took the first file's names."""
    (tmp_path / "src").mkdir()
    swapped = {**FEATURES, "label": {"names": ["pos", "neg"], "_type": "ClassLabel"}}
    pq.write_table(hf_table(0, 100), tmp_path / "src" / "a.parquet")
    pq.write_table(hf_table(100, 100, swapped), tmp_path / "src" / "b.parquet")
    with pytest.raises(ValueError, match=r"b\.parquet.*label: Hugging Face feature .*\"pos\", \"neg\".* instead of"):
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2)
    assert not (tmp_path / "out").exists()
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, schema="unify")
    assert b"huggingface" not in (pq.read_schema(sorted((tmp_path / "out").glob("*.parquet"))[0]).metadata or {})
    # the same features in every file: kept, unified too
    pq.write_table(hf_table(100, 100), tmp_path / "src" / "b.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out2"), piles=2, schema="unify")
    assert b"huggingface" in pq.read_schema(sorted((tmp_path / "out2").glob("*.parquet"))[0]).metadata
