"""The shuffle is a uniformly random permutation, and the tests can tell when it is not.

Every statistical test here uses fixed seeds, so its outcome is reproducible;
the stated alpha is the chance that a correct shuffle would fail it with seeds
drawn at random.  Each test is run against a deliberately biased shuffle too,
which must fail it: a test that cannot fail proves nothing.
"""

import contextlib
import itertools
import math

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import over_processes, read_output, write_parts
from scipy import stats

import daskpile
from daskpile import _kernels, _random
from daskpile.datasets import reference_table

ALPHA = 1e-3
ORDERS = list(itertools.permutations(range(4)))


def order_counts(orders) -> np.ndarray:
    index = {order: i for i, order in enumerate(ORDERS)}
    counts = np.zeros(len(ORDERS), dtype=int)
    for order in orders:
        counts[index[tuple(order)]] += 1
    return counts


def uniformity_pvalue(counts) -> float:
    return stats.chisquare(counts).pvalue


def tiny_input():
    """4 rows in 2 partitions: the smallest case where partition structure could leak."""
    return dd.from_pandas(pd.DataFrame({"x": [0, 1, 2, 3]}), npartitions=2, sort=False)


def api_orders(part, seeds):
    ddf = tiny_input()
    return [daskpile.shuffle(ddf, piles=3, seed=seed).compute()["x"].tolist() for seed in seeds]


@pytest.mark.slow
def test_all_24_orders_equally_likely_through_the_api(two_processes):
    """720 seeds through daskpile.shuffle (scratch files and all), 3 piles: chi-square, 23 dof.

    30 expected per order; the kernel test below runs 200 per order for more power.
    """
    counts = order_counts(over_processes(two_processes, api_orders, range(720)))
    assert (counts > 0).all()
    assert uniformity_pvalue(counts) > ALPHA


def kernel_shuffle(partitions, piles, seed, permute_piles=True, key_pieces=True):
    """The two passes composed in memory, exactly as the Dask graphs compose them.

    A partition is a list of rows, or a list of pieces (lists of rows), as a
    Parquet file too large for memory is read.
    """
    slices = []
    for k, part in enumerate(partitions):
        pieces = part if isinstance(part[0], list) else [part]
        for p, rows in enumerate(pieces):
            rng = _random.generator(seed, _random.SCATTER, k, p if key_pieces else 0)
            batch, counts = _kernels.scatter(pa.table({"x": rows}), piles, rng)
            offsets = _kernels.offsets(counts)
            slices.append([batch.slice(o, n) for o, n in zip(offsets, counts, strict=False)])
    out = []
    for j in range(piles):
        pile = pa.Table.from_batches([s[j] for s in slices])
        if permute_piles:
            pile = _kernels.permute(pile, _random.generator(seed, _random.GATHER, j))
        out += pile["x"].to_pylist()
    return out


def kernel_orders(part, seeds, partitions, piles, key_pieces=True):
    return [kernel_shuffle(partitions, piles, seed, key_pieces=key_pieces) for seed in seeds]


@pytest.mark.slow
@pytest.mark.parametrize("piles", [1, 3, 7])
def test_all_24_orders_equally_likely_for_the_kernels(piles, two_processes):
    """4,800 seeds of the kernels alone, for several pile counts (piles > rows included)."""
    counts = order_counts(over_processes(two_processes, kernel_orders, range(4800), [[0, 1], [2, 3]], piles))
    assert uniformity_pvalue(counts) > ALPHA


@pytest.mark.slow
def test_all_24_orders_equally_likely_when_a_file_is_read_in_pieces(two_processes):
    """Partition 0 read as two one-row pieces (a file larger than blocksize), partition 1 whole."""
    pieces = [[[0], [1]], [2, 3]]
    counts = order_counts(over_processes(two_processes, kernel_orders, range(4800), pieces, 3))
    assert uniformity_pvalue(counts) > ALPHA
    # teeth: pieces drawing from the same generator send rows 0 and 1 to the same pile
    biased = order_counts(over_processes(two_processes, kernel_orders, range(4800), pieces, 3, False))
    assert uniformity_pvalue(biased) < ALPHA


@pytest.mark.slow
def test_the_uniformity_test_has_teeth():
    """Two plausible wrong shuffles must fail the same test."""
    # Within-partition shuffle only: what ddf.sample(frac=1) does.
    rng_orders = []
    for seed in range(2400):
        rng = np.random.default_rng(seed)
        rng_orders.append(list(rng.permutation([0, 1])) + list(rng.permutation([2, 3])))
    assert uniformity_pvalue(order_counts(rng_orders)) < ALPHA
    # Piles without the in-memory permutation of pass 2: rows of a pile keep their input order.
    biased = order_counts(kernel_shuffle([[0, 1], [2, 3]], 3, seed, permute_piles=False) for seed in range(2400))
    assert uniformity_pvalue(biased) < ALPHA


@pytest.mark.slow
def test_the_api_test_has_teeth(sync_scheduler):
    """ddf.sample(frac=1), run through Dask like the API test, fails it."""
    ddf = tiny_input()
    orders = [ddf.sample(frac=1, random_state=seed).compute()["x"].tolist() for seed in range(240)]
    counts = order_counts(orders * 10)
    assert uniformity_pvalue(counts) < ALPHA


# -- at scale: 1 M rows sorted by id, label 0 then 1 --------------------------------------------

ROWS = 1_000_000


def order_quality_failures(ids: np.ndarray, labels: np.ndarray, file_rows: list[int]) -> list[str]:
    """Which randomness checks an output order fails; [] for a good shuffle.

    Three checks, each at alpha 1e-3 (family-wise alpha <= 3e-3):
    - input decile x output decile table, chi-square for independence (81 dof);
    - rank correlation of input and output position: |r| * sqrt(n) is N(0, 1) for a random order;
    - label count of every output file within Binomial(rows, 1/2) bounds, Bonferroni over files.
    """
    n = len(ids)
    failures = []
    table = np.zeros((10, 10))
    np.add.at(table, (ids * 10 // n, np.arange(n) * 10 // n), 1)
    chi2 = stats.chi2_contingency(table, correction=False).pvalue
    if chi2 < ALPHA:
        failures.append(f"decile chi-square p={chi2:.3g}")
    r = np.corrcoef(ids, np.arange(n))[0, 1]  # ids are 0..n-1 so they are their own ranks
    if abs(r) * math.sqrt(n) > stats.norm.isf(ALPHA / 2):
        failures.append(f"rank correlation {r:.4f}")
    bounds = np.cumsum([0, *file_rows])
    for j in range(len(file_rows)):
        ones, rows = int(labels[bounds[j] : bounds[j + 1]].sum()), file_rows[j]
        if rows and stats.binomtest(ones, rows, 0.5).pvalue < ALPHA / len(file_rows):
            failures.append(f"file {j}: {ones}/{rows} labels are 1")
    return failures


@pytest.fixture(scope="module")
def sorted_source(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "src"
    write_parts(reference_table(0, ROWS, ROWS), path, parts=10)
    return str(path)


@pytest.mark.slow
def test_one_million_sorted_rows_come_out_random(client, sorted_source, tmp_path):
    report = daskpile.shuffle_parquet(sorted_source, str(tmp_path / "out"), piles=32, seed=2026)
    out = read_output(tmp_path / "out")
    ids = out["id"].to_numpy()
    assert np.array_equal(np.sort(ids), np.arange(ROWS))  # exact permutation of the ids
    rows_per_file = daskpile.read_manifest(str(tmp_path / "out"))["rows_per_pile"]
    assert sum(rows_per_file) == ROWS and report.rows == ROWS
    assert order_quality_failures(ids, out["label"].to_numpy(), rows_per_file) == []


@pytest.mark.slow
def test_the_scale_checks_have_teeth(client, sorted_source, tmp_path):
    """What users reach for instead: ddf.sample(frac=1) (within-partition shuffle) must fail."""
    sampled = dd.read_parquet(sorted_source).sample(frac=1, random_state=1)
    out = sampled.compute()
    rows_per_partition = sampled.map_partitions(len).compute().tolist()
    failures = order_quality_failures(out["id"].to_numpy(), out["label"].to_numpy(), rows_per_partition)
    assert any("chi-square" in f for f in failures)
    assert any("rank correlation" in f for f in failures)
    assert any("labels are 1" in f for f in failures)


# -- a moving window: generations appended and expired, read through the loader -------------------


def window_orders(part, seeds, tmp_path, biased: bool = False) -> list[tuple]:
    """The loader's epoch-0 order of a window: generation 0 (rows 10, 11), appends of [0, 1] and [2, 3],
    generation 0 expired; window seed and loader seed both the seed's.

    ``biased``: the appends send their rows to piles in turn (row k to pile k mod 3) instead of drawing
    them: new rows go to the end of fixed piles, without a random pile draw.
    """
    import unittest.mock

    tmp_path = tmp_path / f"part-{part}"
    for name, rows in [("g0", [10, 11]), ("g1", [0, 1]), ("g2", [2, 3])]:
        (tmp_path / name).mkdir(parents=True)
        pq.write_table(pa.table({"x": pa.array(rows, pa.int64())}), tmp_path / name / "a.parquet")
    in_turn = unittest.mock.patch.object(
        _kernels, "random_piles", lambda rng, rows, piles: (np.arange(rows) % piles).astype(np.uint16)
    )
    orders = []
    for seed in seeds:
        dest = str(tmp_path / f"w{seed}")
        daskpile.shuffle_parquet(str(tmp_path / "g0"), dest, piles=3, seed=seed, verify=False)
        with in_turn if biased else contextlib.nullcontext():
            daskpile.append(dest, str(tmp_path / "g1"), verify=False)
            daskpile.append(dest, str(tmp_path / "g2"), verify=False)
        daskpile.expire(dest, keep_generations=2, retain=0)
        loader = daskpile.PileLoader(dest, batch_size=4, seed=seed, prefetch=0)
        orders.append(tuple(np.concatenate([batch["x"].to_numpy() for batch in loader]).tolist()))
    return orders


@pytest.mark.slow
def test_all_24_orders_of_a_window_equally_likely_through_append_expire_and_the_loader(two_processes, tmp_path):
    """480 seeds through the real append, expire and loader code (20 per order): chi-square, 23 dof, alpha 1e-3."""
    counts = order_counts(over_processes(two_processes, window_orders, range(480), tmp_path))
    assert (counts > 0).all()
    assert uniformity_pvalue(counts) > ALPHA


@pytest.mark.slow
def test_the_window_test_has_teeth(sync_scheduler, tmp_path):
    """Appends without a random pile draw fail it: rows 0 and 2 always share a pile, so do 1 and 3."""
    counts = order_counts(window_orders(0, range(48), tmp_path, biased=True))  # p about 1e-14 here
    assert uniformity_pvalue(counts) < ALPHA


def lines_path_orders(part, seeds, tmp_path, second_pass: str = "eager") -> list[list[int]]:
    """Orders of 4 lines shuffled by shuffle_parquet, the file cut into two byte ranges (two tasks)."""
    tmp_path = tmp_path / f"part-{part}"
    tmp_path.mkdir()
    path = tmp_path / "four.txt"
    path.write_bytes(b"0\n1\n2\n3\n")
    orders = []
    for seed in seeds:
        out = tmp_path / f"{second_pass}-{seed}"
        daskpile.shuffle_parquet(str(path), str(out), 3, seed=seed, blocksize=64, verify=False, second_pass=second_pass)
        orders.append([int(line) for line in read_output(out).column("line").to_pylist()])
    return orders


@pytest.mark.slow
def test_all_24_orders_equally_likely_through_the_lines_path(two_processes, tmp_path):
    """480 seeds through a text file read in two ranges of 4 bytes, 3 piles: chi-square, 23 dof, 20 per order."""
    counts = order_counts(over_processes(two_processes, lines_path_orders, range(480), tmp_path))
    assert uniformity_pvalue(counts) > ALPHA


@pytest.mark.slow
def test_the_lines_path_test_has_teeth(sync_scheduler, tmp_path):
    """Piles left unpermuted (a lazy result read by a plain reader) keep lines of one range in order."""
    assert uniformity_pvalue(order_counts(lines_path_orders(0, range(96), tmp_path, "lazy"))) < ALPHA
