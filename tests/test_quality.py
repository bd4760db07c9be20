"""The shuffle quality report: it passes uniform permutations at its stated
false-positive rate and fails orders that keep structure, each for the right reason."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import write_parts
from scipy import stats

import daskpile
from daskpile._storage import filesystem
from daskpile.checks._quality import chi_square_cdf, chi_square_sf, poisson_cdf, poisson_sf
from daskpile.datasets import write_reference_dataset

ROWS = 20_000
ALPHA = 1e-3  # per check; 5 checks, so at most 0.5 % of uniform shuffles fail the report (Bonferroni)


def ordered(order: np.ndarray, directory, parts: int = 4) -> str:
    """Write the rows of a sorted dataset (id, label by halves) in ``order``, as ``parts`` files."""
    ids = np.asarray(order, dtype=np.int64)
    table = pa.table({"id": ids, "label": (ids >= len(ids) // 2).astype(np.int8)})
    write_parts(table, directory, parts)
    return str(directory)


def failed(report) -> set[str]:
    return {c.name for c in report.checks if not c.passed}


def test_p_values_match_scipy():
    for x, dof in [(0.5, 81), (60.0, 81), (81.0, 81), (120.0, 81), (400.0, 81), (3.84, 1), (30.0, 9)]:
        assert chi_square_sf(x, dof) == pytest.approx(stats.chi2.sf(x, dof), rel=1e-9, abs=1e-300)
        assert chi_square_cdf(x, dof) == pytest.approx(stats.chi2.cdf(x, dof), rel=1e-9, abs=1e-300)
    for k, mean in [(0, 1.0), (1, 1.0), (3, 1.0), (12, 1.0), (5, 20.0), (40, 20.0), (1500, 1999.0), (2100, 1999.0)]:
        assert poisson_sf(k, mean) == pytest.approx(stats.poisson.sf(k - 1, mean), rel=1e-9, abs=1e-300)
        assert poisson_cdf(k, mean) == pytest.approx(stats.poisson.cdf(k, mean), rel=1e-9, abs=1e-300)


def test_a_daskpile_result_passes_and_its_input_fails_every_check(sync_scheduler, tmp_path):
    source, dest = tmp_path / "sorted", tmp_path / "shuffled"
    write_reference_dataset(source, rows=100_000, files=4)
    daskpile.shuffle_parquet(str(source), str(dest), piles=8, seed=1)

    after = daskpile.quality(str(dest), order_column="id", label_column="label")
    assert after.ok, after
    assert len(after.files) == 8 and after.rows == 100_000
    assert abs(after.rank_correlation) < 0.02 and after.longest_run <= 3
    assert after.entropy_bits > 15

    before = daskpile.quality(str(source), order_column="id", label_column="label")
    assert not before.ok
    assert failed(before) == {c.name for c in before.checks}  # every check fails
    assert before.rank_correlation == pytest.approx(1.0)
    assert before.longest_run == 100_000 and before.entropy_bits == 0
    assert "NOT uniformly shuffled" in str(before) and "consistent with a uniform shuffle" in str(after)


@pytest.mark.parametrize("output_format", ["csv", "arrow", "jsonl", "lines"])
def test_a_result_in_any_output_format_is_measured_and_its_sorted_files_fail(sync_scheduler, tmp_path, output_format):
    """quality refused every result but Parquet ("reads Parquet results only"): a corpus shuffled into lines
    or JSON lines could not be checked.  Its files are read as verify reads them."""
    from daskpile.engine import _manifest, _outputs

    dest = tmp_path / "shuffled"
    if output_format == "lines":  # the line is the key: zero-padded positions sort in the input's order
        source, order_column = tmp_path / "lines.txt", "line"
        source.write_text("".join(f"{i:08d}\n" for i in range(ROWS)))
        daskpile.shuffle_parquet(str(source), str(dest), piles=4, seed=1, format="lines", output_format="lines")
    else:
        source, order_column = tmp_path / "sorted", "id"
        write_reference_dataset(source, rows=ROWS, files=2)
        daskpile.shuffle_parquet(str(source), str(dest), piles=4, seed=1, output_format=output_format)
    labels = {} if output_format == "lines" else {"label_column": "label"}
    report = daskpile.quality(str(dest), order_column=order_column, **labels)
    assert report.ok and report.rows == ROWS and len(report.files) == 4, report

    fs, dest_path = filesystem(str(dest))
    manifest = _manifest.read_at(fs, dest_path)
    output, schema = _outputs.of_manifest(manifest), _manifest.arrow_schema(manifest)
    for path in sorted(dest.glob("part-*")):  # each file sorted: the order is left in runs
        table = _outputs.read(fs, str(path), output, schema).sort_by(order_column)
        if output_format == "arrow":
            with pa.ipc.new_file(path, table.schema) as writer:
                writer.write_table(table)
        else:
            path.write_bytes(b"".join(b.to_pybytes() for b in _outputs.serialize(table, output)))
    sorted_files = daskpile.quality(str(dest), order_column=order_column, **labels)
    assert {"successions", "neighbours within 10"} <= failed(sorted_files), sorted_files


def test_json_lines_kept_as_written_are_measured_by_their_fields(sync_scheduler, tmp_path):
    """JSON lines in, the same lines out: the result's one column is the lines, and quality refused every
    field ("'id' is not a column (columns: json)").  Its fields are read from the lines."""
    source, dest = tmp_path / "events.jsonl", tmp_path / "shuffled"
    # (one document of 3 MB: pyarrow's JSON reader refused it, past two blocks of 1 MiB, where shuffle read it)
    text = ["x"] * ROWS
    text[7] = "y" * 3_000_000
    source.write_text("".join(f'{{"id": {i}, "label": "l{i % 3}", "text": "{text[i]}"}}\n' for i in range(ROWS)))
    daskpile.shuffle_parquet(str(source), str(dest), piles=4, seed=1, output_format="jsonl")
    report = daskpile.quality(str(dest), order_column="id", label_column="label")
    assert report.ok and report.rows == ROWS and len(report.files) == 4, report

    for path in sorted(dest.glob("part-*")):  # each file's lines sorted by their id: the order left in runs
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(sorted(lines, key=lambda line: int(line.split(",")[0].split(":")[1]))))
    sorted_files = daskpile.quality(str(dest), order_column="id", label_column="label")
    assert {"successions", "neighbours within 10"} <= failed(sorted_files), sorted_files
    with pytest.raises(KeyError, match=r"'idx' is not a field of the JSON lines of '.*part-0000\d.jsonl'.*id, label"):
        daskpile.quality(str(dest), order_column="idx")


@pytest.mark.slow
def test_uniform_permutations_pass(tmp_path):
    """20 uniform permutations with fixed seeds: each passes (expected failures 20 x 0.5 % = 0.1)."""
    for seed in range(20):
        order = np.random.default_rng(seed).permutation(ROWS)
        report = daskpile.quality(ordered(order, tmp_path / f"s{seed}"), "id", "label", alpha=ALPHA)
        assert report.ok, (seed, str(report))


def test_orders_with_structure_left_fail(tmp_path):
    """The biased variants, so the checks are known to have teeth."""
    rng = np.random.default_rng(7)
    ids = np.arange(ROWS)

    # ddf.sample(frac=1): each input file shuffled within itself
    within_files = np.concatenate([rng.permutation(part) for part in np.array_split(ids, 4)])
    report = daskpile.quality(ordered(within_files, tmp_path / "within"), "id", "label")
    assert {"rank correlation", "decile chi-square", "label balance per file"} <= failed(report)

    # random piles but no permutation inside them (pass 2 skipped)
    piles = rng.integers(0, 4, ROWS)
    unpermuted = np.concatenate([ids[piles == j] for j in range(4)])
    report = daskpile.quality(ordered(unpermuted, tmp_path / "unpermuted"), "id", "label")
    assert {"successions", "neighbours within 10"} <= failed(report)

    # pairs of consecutive rows kept together, pairs shuffled: no trend, so the correlation cannot see it
    pairs = rng.permutation(ROWS // 2)
    paired = np.stack([2 * pairs, 2 * pairs + 1], axis=1).ravel()
    report = daskpile.quality(ordered(paired, tmp_path / "paired"), "id", "label")
    assert {"successions", "neighbours within 10"} <= failed(report)
    assert "rank correlation" not in failed(report) and report.longest_run == 2


@pytest.mark.slow
def test_orders_too_even_to_be_random_fail(tmp_path):
    """From the quality trial: every check rejected one tail only, so orders that keep input neighbours apart
    on purpose passed: rows dealt to piles round-robin (the trap the algorithm page names), a stride through
    the input, labels dealt out evenly.  Each must fail, for its own reason."""
    rng = np.random.default_rng(11)
    ids = np.arange(ROWS)

    # rows assigned to piles round-robin (id % piles), each pile permuted whole, a file a pile: with 7 piles the
    # labels are dealt out too evenly; with 64, no two output neighbours are within 10 input positions
    round_robin = np.concatenate([rng.permutation(ids[ids % 7 == j]) for j in range(7)])
    report = daskpile.quality(ordered(round_robin, tmp_path / "round-robin", parts=7), "id", "label")
    assert "label balance per file" in failed(report) and "(too even)" in str(report), report
    round_robin = np.concatenate([rng.permutation(ids[ids % 64 == j]) for j in range(64)])
    report = daskpile.quality(ordered(round_robin, tmp_path / "round-robin-64", parts=64), "id", "label")
    assert {"neighbours within 10", "decile chi-square"} <= failed(report) and "(too few)" in str(report), report

    # a sorted table read by 1,000 readers in turn: deterministic, every decile spread evenly
    stride = np.lexsort((ids // 1_000, ids % 1_000))
    report = daskpile.quality(ordered(stride, tmp_path / "stride"), "id", "label")
    assert {"decile chi-square", "neighbours within 10"} <= failed(report), report

    # reversed: every output neighbour was an input neighbour, said as such
    report = daskpile.quality(ordered(ids[::-1], tmp_path / "reversed"), "id")
    successions = next(c for c in report.checks if c.name == "successions")
    assert not successions.passed and successions.statistic == ROWS - 1 and report.longest_run == ROWS


def test_batches_of_one_label_fail_however_balanced_the_files(tmp_path):
    """From the quality trial: every training batch of one label passed, the label check being per file.  A
    uniform permutation, with a label independent of the rows' positions, sorted by that label within every
    two batches: files and positions as random as before, batches of nearly one label each."""
    rng = np.random.default_rng(5)
    order, label = rng.permutation(ROWS), rng.integers(0, 2, ROWS).astype(np.int8)
    for start in range(0, ROWS, 2 * 1250):
        window = slice(start, start + 2 * 1250)
        kept = np.argsort(label[window], kind="stable")
        order[window], label[window] = order[window][kept], label[window][kept]
    write_parts(pa.table({"id": order, "label": label}), tmp_path / "sorted-pairs", 4)
    report = daskpile.quality(str(tmp_path / "sorted-pairs"), "id", "label", batch_size=1250)
    assert failed(report) == {"label balance per batch"}, report
    assert "over 16 batches of 1,250 rows (too uneven)" in str(report)
    report = daskpile.quality(str(tmp_path / "sorted-pairs"), "id", "label", batch_size=5000)  # (whole files)
    assert report.ok, report
    uniform = daskpile.quality(ordered(rng.permutation(ROWS), tmp_path / "uniform"), "id", "label", batch_size=1250)
    assert uniform.ok and "label balance per batch" in {c.name for c in uniform.checks}
    with pytest.raises(ValueError, match="batch_size must be at least 2"):
        daskpile.quality(str(tmp_path / "uniform"), "id", "label", batch_size=1)


@pytest.mark.slow
def test_a_rare_label_bunched_in_the_files_last_batches_fails_per_batch(tmp_path):
    """A label of 1 % at the end of every file: most of its rows were in the files' last partial batches, which
    the per-batch check leaves out, so it was pooled away as rarer than 5 a batch and the check not run, the
    verdict uniform (a quality trial).  Its average is of every row now; at the files' starts it failed already."""
    rng = np.random.default_rng(0)
    rows = 200_000
    cases = [("at-ends", True, 0.99), ("at-starts", False, 0.99), ("in-tails", True, 0.995), ("rarer", True, 0.998)]
    for name, rare_last, common in cases:
        # (0.5 %: 500 rows a file, all in its last partial batch of 672 rows, in no whole batch: left out of the
        # table, the verdict was uniform; 0.2 %, under 5 a batch, pooled with the commonest: not run; the reviews)
        label = np.where(rng.random(rows) < common, "common", "rare")
        for k, ids in enumerate(np.array_split(rng.permutation(rows), 2)):
            ids = ids[np.argsort((label[ids] == "rare") == rare_last, kind="stable")]
            (tmp_path / name).mkdir(exist_ok=True)
            pq.write_table(pa.table({"id": ids, "label": label[ids]}), tmp_path / name / f"part-{k}.parquet")
        report = daskpile.quality(str(tmp_path / name), "id", "label")
        assert "label balance per batch" in failed(report), report
    # a categorical label (pandas' Categorical, a dictionary in Arrow), and one of no value: counted as before
    categorical = tmp_path / "categorical"
    ids = rng.permutation(20_000)
    kinds = pa.array(np.where(ids % 3 == 0, "a", "b")).dictionary_encode()
    write_parts(pa.table({"id": ids, "label": kinds, "none": pa.nulls(20_000)}), categorical, 2)
    assert daskpile.quality(str(categorical), "id", "label").ok
    assert daskpile.quality(str(categorical), "id", "none").labels == [None]
    # a column of too many labels is refused before a Gram matrix of labels squared is made (114 GiB for ids)
    ids = rng.permutation(200_000)
    write_parts(pa.table({"id": ids, "label": ids.astype(str)}), tmp_path / "ids", 1)
    with pytest.raises(ValueError, match="label column 'label' has 200,000 distinct values"):
        daskpile.quality(str(tmp_path / "ids"), "id", "label")


@pytest.mark.slow
def test_label_balance_per_batch_with_rare_labels_and_where_it_cannot_run(tmp_path):
    """From the review: rare labels pooled into a column still too rare made uniform orders fail far above
    alpha, and the check was left out of the report without a word where it could not run.  The chi-square's
    statistic is that of the batches x labels table, computed from each file's Gram matrix."""
    from daskpile.checks._quality import _batch_counts, _chi_square, _label_balance_per_batch

    rng = np.random.default_rng(9)
    label = rng.choice(4, size=8 * 1024, p=[0.95, 0.045, 0.003, 0.002])
    table = np.stack([np.bincount(b, minlength=4) for b in label.reshape(8, 1024)])
    rows = np.bincount(label, minlength=4)
    found = _label_balance_per_batch([_batch_counts(pa.chunked_array([label]), 1024)], [0, 1, 2, 3], rows, 1024, 1e-3)
    rare = table[:, 2] + table[:, 3]  # two labels a batch holds fewer than 5 of: pooled, and so joining label 0
    pooled = np.stack([table[:, 0], table[:, 1], rare] if rare.mean() >= 5 else [table[:, 0] + rare, table[:, 1]], 1)
    assert found.statistic == pytest.approx(_chi_square(pooled.astype(float)))
    for seed in range(10):  # uniform orders of a label with rare values: they pass
        ids = np.random.default_rng(seed).permutation(ROWS)
        rare = pa.table({"id": ids, "label": np.where(ids % 500 == 0, 2, ids % 7 == 0).astype(np.int8)})
        write_parts(rare, tmp_path / f"rare-{seed}", 4)
        report = daskpile.quality(str(tmp_path / f"rare-{seed}"), "id", "label")
        assert report.ok and "label balance per batch" in {c.name for c in report.checks}, report
    report = daskpile.quality(ordered(np.arange(3_000), tmp_path / "short", parts=4), "id", "label")
    assert report.not_run == (("label balance per batch", "fewer than 2 whole batches of 1,024 rows in a file"),)
    assert "label balance per batch        not run: fewer than 2 whole batches" in str(report)
    assert report.to_json()["not_run"] == [{"name": "label balance per batch", "why": report.not_run[0][1]}]
    tiny = daskpile.quality(ordered(np.arange(100), tmp_path / "tiny", parts=1), "id")
    assert tiny.not_run == (("decile chi-square", "under 500 rows"),)
    # NaN labels, in two files: one label (each file's NaN was another key, and the batches' raised KeyError)
    ids = rng.permutation(5_000)
    nan_labels = pa.table({"id": ids, "label": np.where(ids % 3 == 0, np.nan, (ids % 2).astype(float))})
    write_parts(nan_labels, tmp_path / "nan", 2)
    report = daskpile.quality(str(tmp_path / "nan"), "id", "label")
    assert report.ok and len(report.labels) == 3 and report.label_counts.sum() == 5_000, report


def test_manifest_order_is_the_reading_order(sync_scheduler, tmp_path):
    source, dest = tmp_path / "sorted", tmp_path / "shuffled"
    write_reference_dataset(source, rows=5_000, files=2)
    report = daskpile.shuffle_parquet(str(source), str(dest), piles=12, seed=2)
    assert daskpile.quality(str(dest), "id").files == report.files


def test_plot(tmp_path):
    report = daskpile.quality(ordered(np.arange(ROWS), tmp_path / "in"), "id", "label")
    fig = report.plot(str(tmp_path / "q.png"))
    assert os.path.getsize(tmp_path / "q.png") > 10_000
    assert len(fig.axes) == 3  # histogram, its colour bar, label shares
    assert len(daskpile.quality(str(tmp_path / "in"), "id").plot().axes) == 2  # no label column


def test_bad_columns_are_named(tmp_path):
    directory = ordered(np.arange(100), tmp_path / "in")
    # named with the dataset, not with the file read first, as if that file alone lacked it
    with pytest.raises(KeyError, match=r"'idx' is not a column of .*/in \(columns: id"):
        daskpile.quality(directory, "idx")
    with pytest.raises(KeyError, match=r"'kind' is not a column of .*/in \("):
        daskpile.quality(directory, "id", "kind")
    pq.write_table(pa.table({"id": [1, 1, 2], "label": [0, 0, 1]}), tmp_path / "dup.parquet")
    with pytest.raises(ValueError, match="order column 'id' has duplicate values"):
        daskpile.quality(str(tmp_path / "dup.parquet"), "id")
    pq.write_table(pa.table({"id": [1, None, 2], "label": [0, 0, 1]}), tmp_path / "null.parquet")
    with pytest.raises(ValueError, match="order column 'id' has 1 null values"):
        daskpile.quality(str(tmp_path / "null.parquet"), "id")
    pq.write_table(pa.table({"id": np.arange(300), "label": np.arange(300)}), tmp_path / "many.parquet")
    with pytest.raises(ValueError, match="label column 'label' has 300 distinct values"):
        daskpile.quality(str(tmp_path / "many.parquet"), "id", "label")


def test_an_input_of_text_is_said_to_be_given_as_parquet(tmp_path):
    """A CSV user's trial: the help says to give the input too, and their CSV input was said to match "no
    Parquet files", named as a dest."""
    (tmp_path / "in.csv").write_text("id\n1\n2\n")
    (tmp_path / "texts").mkdir()
    with pytest.raises(ValueError, match=r"^quality reads a daskpile result by its folder .*/in\.csv' is csv; give"):
        daskpile.quality(str(tmp_path / "in.csv"), "id")
    with pytest.raises(FileNotFoundError, match="matches no Parquet files"):  # (a folder: as before)
        daskpile.quality(str(tmp_path / "texts"), "id")


def test_tiny_datasets(tmp_path):
    pq.write_table(pa.table({"id": [5]}), tmp_path / "one.parquet")
    report = daskpile.quality(str(tmp_path / "one.parquet"), "id")
    assert report.ok and report.rows == 1 and report.longest_run == 1


@pytest.mark.parametrize("case", ["uniform", "within files", "paired"])
def test_file_by_file_and_in_memory_give_the_same_figures(sync_scheduler, tmp_path, case, monkeypatch):
    """Integer positions 0..n-1 are measured file by file; the same order as floats (any other key) in memory."""
    monkeypatch.setattr("daskpile.checks._order_stats.CHUNK_ROWS", 777)  # files of about 2,900 rows: chunks meet too
    rng = np.random.default_rng(3)
    ids = {
        "uniform": rng.permutation(ROWS),
        "within files": np.concatenate([rng.permutation(p) for p in np.array_split(np.arange(ROWS), 7)]),
        "paired": np.stack([2 * (p := rng.permutation(ROWS // 2)), 2 * p + 1], axis=1).ravel(),
    }[case]
    label = (ids >= ROWS // 2).astype(np.int8)
    as_ints, as_floats = tmp_path / "ints", tmp_path / "floats"
    write_parts(pa.table({"id": ids + 1_000, "label": label}), as_ints, 7)  # a dense range, shifted
    write_parts(pa.table({"id": ids.astype(np.float64), "label": label}), as_floats, 7)
    by_file = daskpile.quality(str(as_ints), "id", "label")
    in_memory = daskpile.quality(str(as_floats), "id", "label")
    assert [(c.name, c.passed) for c in by_file.checks] == [(c.name, c.passed) for c in in_memory.checks]
    np.testing.assert_allclose([c.statistic for c in by_file.checks], [c.statistic for c in in_memory.checks])
    assert by_file.longest_run == in_memory.longest_run
    assert np.isclose(by_file.entropy_bits, in_memory.entropy_bits)
    assert (by_file.position_histogram == in_memory.position_histogram).all()


def test_repeated_positions_are_refused_file_by_file(tmp_path):
    ids = np.arange(ROWS)
    ids[5] = ids[ROWS - 5]  # one position twice (and one missing): still a dense range by min and max
    with pytest.raises(ValueError, match="repeated values"):
        daskpile.quality(ordered(ids, tmp_path / "twice"), "id")


@pytest.mark.slow
@pytest.mark.parametrize("key", ["timestamp", "sparse ints", "text"])
def test_a_sort_on_dask_gives_the_in_memory_figures(client, tmp_path, key, monkeypatch):
    """Past IN_MEMORY_ROWS, a key that is not a dense range is ranked by a sort on the cluster's workers
    (buckets of BUCKET_ROWS values, made small here so that there are many): the same figures as in memory."""
    rng = np.random.default_rng(5)
    ids = np.concatenate([rng.permutation(p) for p in np.array_split(np.arange(ROWS), 5)])  # structure left
    keys = {
        "timestamp": pa.array(ids * 1_000_003 + 1_600_000_000_000_000, pa.timestamp("us")),
        "sparse ints": pa.array(ids * 7 - 500, pa.int64()),
        "text": pa.array([f"k{i:09d}" for i in ids]),
    }[key]
    write_parts(pa.table({"key": keys, "label": (ids >= ROWS // 2).astype(np.int8)}), tmp_path / "data", 6)
    in_memory = daskpile.quality(str(tmp_path / "data"), "key", "label")
    monkeypatch.setattr("daskpile.checks._quality.IN_MEMORY_ROWS", 0)
    monkeypatch.setattr("daskpile.checks._ranks.BUCKET_ROWS", ROWS // 9)
    sorted_on_dask = daskpile.quality(str(tmp_path / "data"), "key", "label", scratch=str(tmp_path / "scratch"))
    assert [(c.name, c.passed) for c in sorted_on_dask.checks] == [(c.name, c.passed) for c in in_memory.checks]
    np.testing.assert_allclose([c.statistic for c in sorted_on_dask.checks], [c.statistic for c in in_memory.checks])
    assert sorted_on_dask.longest_run == in_memory.longest_run
    assert np.isclose(sorted_on_dask.entropy_bits, in_memory.entropy_bits)
    assert (sorted_on_dask.position_histogram == in_memory.position_histogram).all()
    assert not in_memory.ok and list((tmp_path / "scratch").iterdir()) == []  # its scratch removed


def test_a_sort_on_dask_refuses_repeated_keys(sync_scheduler, tmp_path, monkeypatch):
    monkeypatch.setattr("daskpile.checks._quality.IN_MEMORY_ROWS", 0)
    monkeypatch.setattr("daskpile.checks._ranks.BUCKET_ROWS", 1000)
    times = np.arange(ROWS) * 10
    times[7] = times[ROWS - 3]
    write_parts(pa.table({"t": pa.array(times, pa.timestamp("ms"))}), tmp_path / "data", 4)
    with pytest.raises(ValueError, match="repeated values"):
        daskpile.quality(str(tmp_path / "data"), "t", scratch=str(tmp_path / "scratch"))
    assert list((tmp_path / "scratch").iterdir()) == []


@pytest.mark.parametrize("sorted_on_dask", [False, True])
def test_nan_in_the_order_column_is_refused_either_way(sync_scheduler, tmp_path, monkeypatch, sorted_on_dask):
    if sorted_on_dask:
        monkeypatch.setattr("daskpile.checks._quality.IN_MEMORY_ROWS", 0)
    values = np.arange(ROWS, dtype=np.float64) * 0.5
    values[11] = np.nan
    write_parts(pa.table({"x": values}), tmp_path / "data", 3)
    with pytest.raises(ValueError, match="NaN"):
        daskpile.quality(str(tmp_path / "data"), "x")


def test_quality_reads_a_json_lines_result_whose_fields_change_type(tmp_path, sync_scheduler):
    """A corpus whose field is a number on some lines and a string on others, shuffled as written (what the
    text guide sends to --output-format jsonl): quality failed on Arrow's "changed from number to string"
    (a new user's trial)."""
    import json

    source = tmp_path / "c.jsonl"
    source.write_text("".join(json.dumps({"id": i, "label": "x" if i % 2 else 3}) + "\n" for i in range(1000)))
    daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), piles=2, seed=1, output_format="jsonl")
    report = daskpile.quality(str(tmp_path / "out"), order_column="id")
    assert report.rows == 1000
    with pytest.raises(KeyError, match=r"column 'idx' is not a field of the JSON lines of"):  # (not 1,000 nulls)
        daskpile.quality(str(tmp_path / "out"), order_column="idx")
    # lines Arrow's reader refuses and Python's reads, kept as written (a lone surrogate escape): read by Python's
    scraped = tmp_path / "scraped.jsonl"
    scraped.write_text(
        "".join(json.dumps({"id": i, "t": "\udc80" if i % 10 == 0 else "ok"}) + "\n" for i in range(500))
    )
    daskpile.shuffle_parquet(str(scraped), str(tmp_path / "out2"), piles=2, seed=1, output_format="jsonl")
    assert daskpile.quality(str(tmp_path / "out2"), order_column="id").rows == 500
