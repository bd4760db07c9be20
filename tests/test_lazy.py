"""The lazy second pass: piles written unpermuted, permuted by the loader; quality and verify read them right."""

import json

import dask
import numpy as np
import pyarrow.parquet as pq
import pytest

import daskpile
from tests._util import daskpile_in_process, sorted_source

ROWS = 24_000


@pytest.fixture(scope="module")
def lazy(tmp_path_factory):
    root = tmp_path_factory.mktemp("lazy")
    source = sorted_source(root / "source", ROWS, files=4)
    with dask.config.set(scheduler="sync"):
        report = daskpile.shuffle_parquet(source, str(root / "lazy"), piles=3, seed=2, second_pass="lazy")
    return source, str(root / "lazy"), report


def test_piles_are_written_in_scatter_order_and_marked_lazy(lazy):
    _, dest, report = lazy
    manifest = daskpile.read_manifest(dest)
    assert manifest["second_pass"] == "lazy" and manifest["run"]["second_pass"] == "lazy"
    for path in report.files:  # rows of a sorted source stay in input order inside each pile
        assert np.all(np.diff(pq.read_table(path, columns=["id"])["id"].to_numpy()) > 0)
    jsonschema = pytest.importorskip("jsonschema")
    from importlib.resources import files

    jsonschema.validate(manifest, json.loads(files("daskpile").joinpath("manifest.schema.json").read_text()))


def test_verify_and_quality_understand_it(lazy):
    """quality measures the order the loader gives; read in file order, the same files fail it."""
    source, dest, report = lazy
    assert daskpile.verify(source, dest).ok
    measured = daskpile.quality(dest, order_column="id", label_column="label")
    assert measured.ok
    # said, since plain readers get another order (from the quality trial: nothing said which was measured)
    said = "measured in the order PileLoader reads in epoch 0 (seed"
    assert said in str(measured) and "a plain reader of the files gets each pile unpermuted" in str(measured)
    assert measured.to_json()["read_as"].startswith("the order PileLoader reads in epoch 0")
    plain = daskpile.quality(report.files, order_column="id")
    assert not plain.ok and plain.read_as is None  # a plain reader: pile order only


def test_quality_measures_the_loaders_epoch_zero(lazy):
    _, dest, report = lazy
    loader = daskpile.PileLoader(dest, batch_size=ROWS, seed=report.seed, columns=["id"])
    (batch,) = list(loader)
    measured = daskpile.quality(dest, order_column="id")
    rank = batch["id"].to_numpy()
    rho = np.corrcoef(np.arange(ROWS), rank)[0, 1]
    assert measured.rank_correlation == pytest.approx(rho, abs=1e-9)


def test_ranks_reading_parts_of_lazy_piles_get_random_parts(lazy):
    """8 ranks over 3 lazy piles each take part of a pile: a uniform random part, not a row range.

    Each rank's mean id is within 4.5 sd of a uniform sample's (false-positive
    rate under 1e-4 over the 8 ranks). The biased variant, row ranges cut
    from the piles as a plain reader would, must fail.
    """
    _, dest, report = lazy

    def worst_z(id_sets):
        z = []
        for chosen in id_sets:
            n = len(chosen)
            sd = np.sqrt((ROWS**2 - 1) / 12 / n * (1 - n / ROWS))
            z.append(abs(chosen.mean() - (ROWS - 1) / 2) / sd)
        return max(z)

    per_rank = []
    for rank in range(8):
        loader = daskpile.PileLoader(dest, batch_size=1000, seed=9, rank=rank, world_size=8, columns=["id"])
        per_rank.append(np.concatenate([b["id"].to_numpy() for b in loader]))
    assert sorted(np.concatenate(per_rank).tolist()) == list(range(ROWS))
    assert worst_z(per_rank) < 4.5
    ranges = [pq.read_table(path)["id"].to_numpy() for path in report.files]
    cut = [part for pile in ranges for part in np.array_split(pile, 3)]
    assert worst_z(cut) > 4.5


def test_rows_per_file_is_refused_with_it(lazy, tmp_path):
    source, _, _ = lazy
    with pytest.raises(ValueError, match="would cut piles apart"):
        daskpile.shuffle_parquet(source, str(tmp_path / "x"), piles=3, second_pass="lazy", rows_per_file=100)
    with pytest.raises(ValueError, match="second_pass must be 'eager' or 'lazy'"):
        daskpile.shuffle_parquet(source, str(tmp_path / "x"), piles=3, second_pass="later")


def test_command_line_lazy_and_its_retry(lazy, tmp_path):
    source, _, _ = lazy
    dest = str(tmp_path / "out")
    args = ["shuffle", source, dest, "--piles", "3", "--seed", "2", "--lazy", "--scheduler", "sync", "-q"]
    assert daskpile_in_process(*args).returncode == 0
    assert daskpile.read_manifest(dest)["second_pass"] == "lazy"
    retry = daskpile_in_process(*args)
    assert retry.returncode == 0
    eager = daskpile_in_process(*[a for a in args if a != "--lazy"])
    assert eager.returncode != 0 and "second_pass 'eager' instead of 'lazy'" in eager.stderr


def test_lazy_piles_are_parquet_and_the_refusal_says_so_in_the_commands_words(tmp_path):
    source = sorted_source(tmp_path / "src", 100, files=1)
    done = daskpile_in_process("shuffle", source, str(tmp_path / "out"), "--lazy", "--output-format", "lines")
    assert done.returncode == 2 and not (tmp_path / "out").exists()
    assert (
        "second_pass='lazy' (--lazy) leaves the permuting to PileLoader, which reads Parquet piles: "
        "not with output_format='lines' (--output-format lines)"
    ) in done.stderr, done.stderr
