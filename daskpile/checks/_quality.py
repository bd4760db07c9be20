"""``quality``: measure how random the order of a dataset is.

Given a column holding each row's original position (an id), the output order
is compared with the input order by statistics that a uniform permutation
passes and any remaining structure fails:

- rank correlation of input and output positions (0 for a shuffle, 1 for the
  input itself);
- chi-square of the input-decile x output-decile table (rows from every part
  of the input should land everywhere in the output, but not too evenly);
- successions: output neighbours that were input neighbours too, in either
  order, with the longest such run (a random permutation has about two);
- the share of output neighbours within ``neighbours`` positions of each other
  in the input, against its expectation (neither too many nor too few);
- the entropy of the absolute differences of consecutive original positions
  (the measure MosaicML Streaming reports; 0 bits for the input order);
- with a label column, every output file's label counts against binomial
  (hypergeometric) bounds, and all of them against too even a spread; and
  every batch's (``batch_size`` consecutive rows), the batches against each
  other.

Each test has a false-positive rate of ``alpha`` on a uniform shuffle.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics

import dask
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from daskpile import _kernels
from daskpile._storage import as_urls, filesystem, full_url, redacting_errors
from daskpile._words import count
from daskpile.checks import _order_stats as _order
from daskpile.checks import _ranks
from daskpile.engine import _manifest, _outputs
from daskpile.loader.plan import EpochPlan, Group, group_permutation
from daskpile.loader.units import pile_files
from daskpile.sources.parquet import open_parquet
from daskpile.sources.text import detect, is_json_text, open_decompressed

MAX_LABELS = 100
UNIFORM_ENTROPY_SHORTFALL = 1.02  # bits under log2(rows - 1), for 1,000 to 2,000,000 rows uniformly shuffled
DECILE_ROWS = 500  # the fewest rows the decile chi-square is run on: 5 rows expected in each of its 100 cells


@dataclasses.dataclass(frozen=True)
class QualityCheck:
    """One statistical test of a :class:`~daskpile.QualityReport`: its statistic, p-value and verdict.

    Every parameter below is an attribute.

    Parameters
    ----------
    name
        The test, such as ``"rank correlation"``.
    statistic
        Its statistic.
    p_value
        The probability of a statistic at least as extreme on a uniform
        shuffle.
    passed
        Whether the p-value is at least the report's ``alpha`` (for label
        balance: whether every file is within its bounds).
    detail
        The statistic, its expectation and p-value in words.
    """

    name: str
    statistic: float
    p_value: float
    passed: bool
    detail: str


@dataclasses.dataclass(repr=False)
class QualityReport:
    """How random the row order of a dataset is, as :func:`quality` measured it.

    Its truth value is :attr:`ok`; ``print`` it for one line per check and a
    verdict.  Every parameter below is an attribute.

    Parameters
    ----------
    dest
        The URL measured (or ``"N files"`` for a list of files).
    rows
        The rows measured.
    files
        The URLs of the files, in the order read.
    order_column
        The column holding each row's original position.
    label_column
        The label column, or None.
    alpha
        The false-positive rate of each check.
    checks
        Every statistical test, in order: rank correlation, decile chi-square
        (from 500 rows), successions, neighbours within ``neighbours``, and
        with a label column, label balance per file and per batch (from two
        whole batches).
    rank_correlation
        Spearman's rank correlation of input and output positions: about 0
        for a uniform shuffle, +1 for the input order.
    longest_run
        Rows in the longest stretch of output neighbours that were input
        neighbours: 1 or 2 for a uniform shuffle, all of them for the input.
    near_share
        The share of output neighbours within ``neighbours`` input positions.
    near_expected
        That share's expectation for a uniform shuffle (about
        ``2 * neighbours / rows``).
    neighbours
        The distance that counts as near.
    entropy_bits
        The entropy, in bits, of the absolute differences of consecutive input
        positions: about log2(rows) - 1.02 for a uniform shuffle, 0 for the input
        order.
    position_histogram
        Rows counted by (input position bin, output position bin), 50 by 50:
        what :meth:`plot` draws.
    labels
        The label values, in the order of ``label_counts``'s columns; empty
        without a label column.
    label_counts
        Rows counted by (output file, label value); None without a label
        column.
    read_as
        The order measured, when it is not the files' in the order of
        ``files``: that of :class:`daskpile.PileLoader` in epoch 0, for a
        lazy result or a moving window, whose plain readers get another.
    not_run
        The checks not run, as (name, why): the decile chi-square under 500
        rows, the label balance per batch without two whole batches, or two
        labels a batch holds 5 rows of on average.
    """

    dest: str
    rows: int
    files: list[str]
    order_column: str
    label_column: str | None
    alpha: float
    checks: list[QualityCheck]
    rank_correlation: float
    longest_run: int
    near_share: float
    near_expected: float
    neighbours: int
    entropy_bits: float
    position_histogram: np.ndarray
    labels: list = dataclasses.field(default_factory=list)
    label_counts: np.ndarray | None = None
    read_as: str | None = None
    not_run: tuple = ()

    @property
    def ok(self) -> bool:
        """Whether every check passed, so the order is consistent with a uniform shuffle."""
        return all(c.passed for c in self.checks)

    def __bool__(self) -> bool:
        return self.ok

    def to_json(self) -> dict:
        """The report as JSON-ready data, what ``daskpile quality --json`` prints for each result.

        Returns
        -------
        dict
            The attributes, with ``ok`` added, ``files`` as their number, each
            check as a dict of ``name``, ``statistic``, ``p_value``, ``passed``
            and ``detail``, and without the histogram, labels and label counts.
        """
        return {
            "dest": self.dest,
            "rows": self.rows,
            "files": len(self.files),
            "order_column": self.order_column,
            "label_column": self.label_column,
            "alpha": self.alpha,
            "ok": self.ok,
            "rank_correlation": self.rank_correlation,
            "longest_run": self.longest_run,
            "near_share": self.near_share,
            "near_expected": self.near_expected,
            "neighbours": self.neighbours,
            "entropy_bits": self.entropy_bits,
            "read_as": self.read_as,
            "not_run": [{"name": name, "why": why} for name, why in self.not_run],
            "checks": [dataclasses.asdict(c) for c in self.checks],
        }

    def __str__(self) -> str:
        label = f", label column {self.label_column!r}" if self.label_column else ""
        lines = [
            f"order of {self.dest} ({count(self.rows, 'row')} in {count(len(self.files), 'file')}), "
            f"order column {self.order_column!r}{label}:"
        ]
        if self.read_as:
            lines.append(f"  measured in {self.read_as}")
        for c in self.checks:
            verdict = "ok  " if c.passed else "FAIL"
            lines.append(f"  {verdict} {c.name:<30} {c.detail}")
        lines += [f"       {name:<30} not run: {why}" for name, why in self.not_run]
        # (what a uniform shuffle gives, measured: the plug-in entropy of n - 1 differences, biased low)
        uniform_bits = max(math.log2(max(self.rows - 1, 1)) - UNIFORM_ENTROPY_SHORTFALL, 0.0)
        lines.append(
            f"       {'entropy of |consecutive diff|':<30} {self.entropy_bits:.2f} bits "
            f"(input order 0, a uniform shuffle about {uniform_bits:.2f})"
        )
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)

    @property
    def verdict(self) -> str:
        """The verdict in one line (consistent with a uniform shuffle, or which checks failed)."""
        failed = [c.name for c in self.checks if not c.passed]
        if failed:
            return f"NOT uniformly shuffled ({', '.join(failed)} failed at alpha={self.alpha:g})"
        return f"consistent with a uniform shuffle (each check at alpha={self.alpha:g})"

    __repr__ = __str__

    def plot(self, path: str | None = None):
        """Draw the input against output position histogram and, with labels, the label share per file.

        The first panel is a 2-D histogram of where rows were in the input
        against where they are in the output: evenly filled for a uniform
        shuffle, a diagonal for the input order.  With a label column, the second shows
        the share of each label (up to 10) in every output file, against its
        overall share.

        Parameters
        ----------
        path
            Where to save the figure as an image (PNG, or another format
            matplotlib knows by the extension).  Default None: not saved.

        Returns
        -------
        matplotlib.figure.Figure
            The figure, which a notebook displays.

        Raises
        ------
        ImportError
            If matplotlib is not installed: ``pip install 'daskpile[plot]'``.

        Examples
        --------
        >>> quality("shuffled/", order_column="id", label_column="label").plot("quality.png")
        <Figure size 1100x460 with 3 Axes>
        """
        try:
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError("the quality figure needs matplotlib: pip install 'daskpile[plot]'") from e
        panels = 2 if self.label_counts is not None else 1
        fig = Figure(figsize=(5.5 * panels, 4.6), layout="constrained")
        ax = fig.add_subplot(1, panels, 1)
        image = ax.imshow(self.position_histogram.T, origin="lower", extent=(0, 1, 0, 1), aspect="auto", cmap="viridis")
        fig.colorbar(image, ax=ax, label="rows")
        ax.set_xlabel("input position (fraction)")
        ax.set_ylabel("output position (fraction)")
        ax.set_title(f"rank correlation {self.rank_correlation:+.4f}")
        if self.label_counts is not None:
            ax = fig.add_subplot(1, panels, 2)
            sizes = self.label_counts.sum(axis=1)
            used = sizes > 0
            overall = self.label_counts.sum(axis=0) / max(self.rows, 1)
            for j, value in enumerate(self.labels[:10]):
                shares = self.label_counts[used, j] / sizes[used]
                ax.plot(np.flatnonzero(used), shares, ".", label=f"{self.label_column}={value}")
                ax.axhline(overall[j], color="grey", linewidth=0.8)
            ax.set_xlabel("output file")
            ax.set_ylabel("share of rows")
            ax.set_ylim(0, 1)
            ax.legend(loc="upper right", fontsize="small")
            ax.set_title("label share per output file")
        fig.suptitle(f"{self.dest}: {'uniform' if self.ok else 'NOT uniform'} at alpha={self.alpha:g}")
        if path is not None:
            fig.savefig(path, dpi=110)
        return fig


@redacting_errors
def quality(
    dest: str | list[str],
    order_column: str,
    label_column: str | None = None,
    *,
    neighbours: int = 10,
    alpha: float = 1e-3,
    storage_options: dict | None = None,
    scratch: str | None = None,
    batch_size: int = 1024,
) -> QualityReport:
    """Measure how random the row order of ``dest`` is against an original order.

    Only the order column and the label column are read (of a result in a
    text format, whole files, one a task), in parallel on the
    current Dask client (else on Dask's default local scheduler).  When the
    order column holds integers forming a dense range (ids 0..n-1, or any
    range without gaps), it is measured file by file on the workers, no
    process holding more than a file or a part of the range.  Any other key
    (timestamps, sparse ids, text) is ranked in memory up to
    ``IN_MEMORY_ROWS`` rows, and beyond by a sort on Dask through ``scratch``
    (a task holds a file or a bucket of 4 M values): memory does not grow
    with the row count.  A lazy result
    (``second_pass="lazy"``, piles left unpermuted) is measured in the order
    :class:`daskpile.PileLoader` gives it in epoch 0 with the result's seed,
    one rank and ``mix=1``: the order its readers get.

    The checks, each with false-positive rate ``alpha`` on a uniformly
    shuffled dataset (the report passes when all of them pass):

    - rank correlation of input and output positions (a z-test): about 0 for
      a uniform shuffle, +1 for the input order;
    - chi-square of the input-decile by output-decile table, on 81 degrees
      of freedom (from 500 rows), two-sided: a table too even fails too;
    - successions: output neighbours that were input neighbours too, in
      either order (a Poisson(2) test), with the longest such run;
    - the share of output neighbours within ``neighbours`` input positions of
      each other, against its expectation (about ``2 * neighbours / rows``),
      two-sided: rows kept apart on purpose fail too;
    - with ``label_column``, the label counts of every output file against
      hypergeometric bounds (Bonferroni over files and labels), and against
      too even a spread (a chi-square's lower tail), each side at alpha / 2;
    - with ``label_column``, the label counts of every batch of
      ``batch_size`` consecutive rows within a file (a chi-square of batches
      by labels, two-sided): batches of one label each fail it, whatever the
      files hold.

    The entropy of the absolute differences of consecutive input positions
    (MosaicML Streaming's measure: about log2(rows) - 1.02 bits for a
    shuffle, 0 for the input order) is reported, not tested.

    Parameters
    ----------
    dest
        A daskpile result, read in manifest order (in any output format:
        Parquet, Arrow, CSV, JSON lines or lines), or any Parquet directory
        or glob (read in name order), or a list of files (read in that order).
    order_column
        The column holding each row's original position, or any unique key
        that sorts in the original order (an id, a timestamp).  It may hold
        no nulls and no repeated values.
    label_column
        A categorical column (at most 100 distinct values) whose share in
        every output file is checked.  Default None: no label check.
    neighbours
        The distance, in input positions, within which two output neighbours
        count as near (at least 1).  Default 10.
    alpha
        The false-positive rate of each check on a uniform shuffle, between 0
        and 1.  Default 1e-3.
    storage_options
        Passed to fsspec for ``dest`` and ``scratch``.  Default None.
    scratch
        Where the sort of an order column that is not a dense range of
        integers writes, past ``IN_MEMORY_ROWS`` rows (about 30 bytes a
        row): a local path or an fsspec URL every worker reaches.  Default:
        the local temporary directory.  Removed when done.
    batch_size
        The rows of a training batch, for the label balance per batch (at
        least 2).  Default 1024.

    Returns
    -------
    QualityReport
        Every check with its statistic, p-value and verdict, and the figures
        behind them; true when every check passes.  ``print`` it, or draw it
        with :meth:`QualityReport.plot`.

    Raises
    ------
    ValueError
        If ``alpha`` or ``neighbours`` is out of range, the order column has
        nulls or repeated values, or the label column has more than 100
        distinct values.
    KeyError
        If a file lacks the order or label column.
    FileNotFoundError
        If ``dest`` does not exist or holds no Parquet file.

    Examples
    --------
    >>> report = quality("shuffled/", order_column="id", label_column="label")
    >>> report.ok, abs(report.rank_correlation) < 0.05
    (True, True)
    >>> quality("data/", order_column="id").ok  # the sorted input
    False
    >>> report.plot("quality.png")
    <Figure size 1100x460 with 3 Axes>
    """
    dest = as_urls(dest, "dest")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha!r}")
    if neighbours < 1:
        raise ValueError(f"neighbours must be at least 1, got {neighbours!r}")
    if batch_size < 2:
        raise ValueError(f"batch_size must be at least 2, got {batch_size!r}")
    fs, files, manifest = _result_files(dest, storage_options)
    result = _ResultFiles.of(fs, manifest)
    where = _where(dest, storage_options)
    _check_columns(fs, files, manifest, [order_column, label_column], where)
    files = _in_reading_order(files, manifest)
    read_as = None
    if any(isinstance(f, _LazyPile) for f in files):
        plain = "each pile unpermuted" if manifest.get("second_pass") == "lazy" else "another order"
        read_as = (
            f"the order PileLoader reads in epoch 0 (seed {manifest['seed']}, one rank, mix 1); a plain reader "
            f"of the files gets {plain}"
        )
    (described,) = dask.compute(
        [dask.delayed(_describe)(result, path, order_column, label_column, batch_size) for path in files]
    )
    rows_per_file = np.array([d.rows for d in described], dtype=np.int64)
    rows = int(rows_per_file.sum())
    nulls = sum(d.nulls for d in described)
    if nulls:
        raise ValueError(f"order column {order_column!r} has {nulls} null values")
    stats = _order_stats(result, files, described, order_column, rows_per_file, neighbours, scratch, storage_options)

    checks, not_run = [], []  # (not run: (name, why), said in the report)
    rho = stats.rank_correlation
    p = math.erfc(abs(rho) * math.sqrt(max(rows - 1, 0)) / math.sqrt(2)) if rows > 2 else 1.0
    checks.append(QualityCheck("rank correlation", rho, p, p >= alpha, f"{rho:+.5f} (input order +1), p={p:.3g}"))

    if 0 < rows < DECILE_ROWS:
        not_run.append(("decile chi-square", f"under {DECILE_ROWS} rows"))
    if rows >= DECILE_ROWS:  # at least 5 expected rows in each cell of the 10 x 10 table
        # Two-sided: a table too even (rows dealt to piles round-robin, a stride) is no more a uniform
        # shuffle's than one too uneven
        chi2 = _chi_square(stats.decile_table)
        p = two_sided(chi_square_cdf(chi2, 81), chi_square_sf(chi2, 81))
        even = " (too even)" if chi2 < 81 and p < alpha else ""
        checks.append(QualityCheck("decile chi-square", chi2, p, p >= alpha, f"{chi2:.1f} on 81 dof{even}, p={p:.3g}"))

    # Input neighbours side by side in the output, in either order: asymptotically Poisson(2)
    successions, longest = stats.successions, stats.longest
    expected = 2 * (rows - 1) / rows if rows else 0.0
    p = poisson_sf(successions, expected)
    checks.append(
        QualityCheck(
            "successions", successions, p, p >= alpha,
            f"{successions:,} output neighbours were input neighbours (expected {expected:.1f}), "
            f"longest run {count(longest, 'row')}, p={p:.3g}",
        )
    )  # fmt: skip

    # Two-sided: rows kept apart on purpose (none near another, where a uniform shuffle puts about
    # 2 * neighbours) are no more a uniform shuffle's than rows kept together
    near = stats.near
    k = min(neighbours, rows - 1)
    q = (2 * k * rows - k * (k + 1)) / (rows * (rows - 1)) if rows > 1 else 0.0
    mean = (rows - 1) * q
    p = two_sided(poisson_cdf(near, mean), poisson_sf(near, mean))
    near_share = near / max(rows - 1, 1)
    apart = " (too few)" if near < mean and p < alpha else ""
    checks.append(
        QualityCheck(
            f"neighbours within {neighbours}", near_share, p, p >= alpha,
            f"{near_share:.3g} of output neighbours (expected {q:.3g}){apart}, p={p:.3g}",
        )
    )  # fmt: skip

    labels, label_counts = [], None
    if label_column:
        labels, label_counts = _label_counts([d.labels for d in described], label_column)
        checks.append(_label_balance(label_counts, rows_per_file, alpha))
        per_batch = _label_balance_per_batch(
            [d.batches for d in described], labels, label_counts.sum(axis=0), batch_size, alpha
        )
        if isinstance(per_batch, str):
            not_run.append(("label balance per batch", per_batch))
        else:
            checks.append(per_batch)

    return QualityReport(
        dest=where,
        rows=rows,
        files=[full_url(fs, p) for f in files for p in (f.paths if isinstance(f, _LazyPile) else [f])],
        order_column=order_column,
        label_column=label_column,
        alpha=alpha,
        checks=checks,
        rank_correlation=rho,
        longest_run=longest,
        near_share=near_share,
        near_expected=q,
        neighbours=neighbours,
        entropy_bits=stats.entropy_bits,
        position_histogram=stats.histogram,
        labels=labels,
        label_counts=label_counts,
        read_as=read_as,
        not_run=tuple(not_run),
    )


@dataclasses.dataclass(frozen=True)
class _Described:
    """One file's order column in brief, and its label counts: all ``quality`` keeps of it in the first pass."""

    rows: int
    nulls: int
    integer: bool
    low: int | None
    high: int | None
    last: int | None
    labels: dict
    sample: np.ndarray  # evenly spaced order values, for the bounds of a sort on Dask
    batches: _Batches | None  # its whole batches' label counts, with a label column


def _result_files(dest: str | list[str], storage_options: dict | None):
    """``_manifest.result_files``, and a file of text that is not a result's folder said as such: quality reads a
    daskpile result in any format, but other files as Parquet (a trial's CSV input, given to see the difference,
    was said to match "no Parquet files")."""
    try:
        return _manifest.result_files(dest, storage_options)
    except FileNotFoundError as e:
        first = dest if isinstance(dest, str) else (dest or [""])[0]
        format, _ = detect(first.rstrip("/"))
        if format is None or format == "parquet" or "matches no Parquet files" not in str(e):
            raise
        raise ValueError(
            f"quality reads a daskpile result by its folder (of any output format), other data as Parquet: {first!r} "
            f"is {format}; give its result's folder, or, for an input, its rows in their order as Parquet (e.g. "
            "pyarrow's csv or json read_* then parquet.write_table)"
        ) from None


def _describe(
    result: _ResultFiles, path: str, order_column: str, label_column: str | None, batch_size: int
) -> _Described:
    columns = [order_column] + ([label_column] if label_column else [])
    order, *label = _read_columns(result, path, columns)
    integer = pa.types.is_integer(order.type)
    low, high = (pc.min(order).as_py(), pc.max(order).as_py()) if integer and len(order) else (None, None)
    last = order[len(order) - 1].as_py() if integer and len(order) else None
    labels, batches = {}, None
    if label:
        counted = pc.value_counts(label[0].combine_chunks())
        # (a column of more labels than label balance takes is refused before they are made Python values, and
        # before its batches' Gram matrix, labels squared: 114 GiB for a column of ids, a quality trial)
        if len(counted) > MAX_LABELS:
            raise _too_many_labels(label_column, len(counted), f" in {path}")
        values = [_one_nan(v) for v in counted.field("values").to_pylist()]
        labels = dict(zip(values, counted.field("counts").to_pylist(), strict=True))
        batches = _batch_counts(label[0], batch_size)
    return _Described(len(order), order.null_count, integer, low, high, last, labels, _ranks.sample(order), batches)


@dataclasses.dataclass(frozen=True)
class _Batches:
    """A file's whole batches by their label counts, in brief: ``gram[j, k]`` sums, over the batches, the count
    of ``values[j]`` times that of ``values[k]`` (all a chi-square of batches by labels needs, whatever labels
    it pools, in labels squared, not in batches)."""

    batches: int
    values: list
    gram: np.ndarray


def _batch_counts(label: pa.ChunkedArray, batch_size: int) -> _Batches:
    """The whole batches of ``batch_size`` consecutive rows of a file (a last partial one left out)."""
    whole = len(label) // batch_size
    if not whole:
        return _Batches(0, [], np.zeros((0, 0), dtype=np.int64))
    encoded = pc.dictionary_encode(label.slice(0, whole * batch_size).combine_chunks())
    values = encoded.dictionary.to_pylist()
    codes = encoded.indices.fill_null(len(values)).to_numpy(zero_copy_only=False).astype(np.int64)
    kinds = len(values) + 1  # (nulls last)
    cells = np.repeat(np.arange(whole, dtype=np.int64) * kinds, batch_size) + codes
    table = np.bincount(cells, minlength=whole * kinds).reshape(whole, kinds).astype(np.int64)
    return _Batches(whole, [*map(_one_nan, values), None], table.T @ table)


_NAN = float("nan")  # the one NaN label: NaNs are unequal to each other, and a dict finds this one by identity


def _one_nan(value):
    return _NAN if isinstance(value, float) and math.isnan(value) else value


IN_MEMORY_ROWS = 2_000_000  # an order column that is not a dense range is ranked in memory up to this


def _order_stats(
    result: _ResultFiles,
    files,
    described,
    order_column: str,
    rows_per_file,
    neighbours: int,
    scratch=None,
    storage_options=None,
) -> _order.OrderStats:
    """File by file when the order column is a dense range of integers (its values are the ranks, shifted);
    else from the whole rank array in memory, up to ``IN_MEMORY_ROWS``; else file by file from ranks sorted
    on Dask."""
    rows = int(rows_per_file.sum())
    lows = [d.low for d in described if d.rows]
    highs = [d.high for d in described if d.rows]
    dense = rows and all(d.integer for d in described) and max(highs) - min(lows) + 1 == rows
    offsets = np.concatenate(([0], np.cumsum(rows_per_file)[:-1])).tolist()
    if dense:
        low = min(lows)
        lasts = [d.last - low if d.rows else -1 for d in described]
        read_ranks = functools.partial(_read_ranks, result, order_column, low)
        return _order.by_file(read_ranks, files, offsets, lasts, rows, neighbours)
    if rows > IN_MEMORY_ROWS:
        read_order = functools.partial(_read_order, result, order_column)
        samples = [d.sample for d in described]
        ranked = _ranks.rank_files(read_order, files, rows_per_file.tolist(), samples, scratch, storage_options)
        try:
            indices = list(range(len(files)))
            return _order.by_file(ranked.read_ranks, indices, offsets, list(ranked.lasts), rows, neighbours)
        finally:
            ranked.remove()
    parts = dask.compute(*[dask.delayed(_read_columns)(result, path, [order_column]) for path in files])
    order = pa.chunked_array([p[0] for p in parts], type=parts[0][0].type if parts else pa.int64())
    if pa.types.is_floating(order.type) and pc.any(pc.is_nan(order)).as_py():
        raise ValueError(f"order column {order_column!r} has NaN values: it must identify each row's position")
    if rows and pc.count_distinct(order).as_py() != rows:
        raise ValueError(f"order column {order_column!r} has duplicate values: it must identify each row's position")
    rank = pc.rank(order, sort_keys="ascending", tiebreaker="first").to_numpy().astype(np.int64) - 1
    return _order.in_memory(rank, neighbours)


def _read_order(result: _ResultFiles, order_column: str, file) -> pa.ChunkedArray:
    (order,) = _read_columns(result, file, [order_column])
    return order


def _read_ranks(result: _ResultFiles, order_column: str, low: int, path: str) -> np.ndarray:
    (order,) = _read_columns(result, path, [order_column])
    return order.to_numpy().astype(np.int64) - low


def _check_columns(fs, files: list[str], manifest: dict | None, columns: list[str | None], where: str) -> None:
    """A column the result lacks, named with the result (the files' own check names the one file read first)."""
    if manifest is not None:
        schema = _manifest.arrow_schema(manifest)
        if is_json_text(schema):
            return  # the columns are the lines' fields, which each file's read names
        names = schema.names
    else:
        with open_parquet(fs, files[0]) as parquet:
            names = parquet.schema_arrow.names
    for name in columns:
        if name is not None and name not in names:
            raise KeyError(f"column {name!r} is not a column of {where} (columns: {', '.join(names)})")


def _where(dest, storage_options) -> str:
    if isinstance(dest, (list, tuple)):
        return count(len(dest), "file")
    fs, path = filesystem(dest, storage_options)
    return full_url(fs, path)


@dataclasses.dataclass(frozen=True)
class _LazyPile:
    """A pile of a lazy result or of a moving window (its files, one per generation), in epoch 0's order."""

    paths: tuple[str, ...]
    seed: int
    group: Group


def _in_reading_order(files: list[str], manifest: dict | None) -> list:
    """The files as readers get the rows: a lazy result or a window as PileLoader's epoch 0 (one rank, ``mix=1``)."""
    window = (manifest or {}).get("window")
    if manifest is None or (manifest.get("second_pass") != "lazy" and window is None):
        return files
    if window is None:
        units = [(f,) for f in files]
    else:
        units = list(pile_files(files, window["file_piles"], manifest["piles"]))
    if manifest.get("second_pass") != "lazy" and all(len(u) == 1 for u in units):
        return [u[0] for u in units]  # a compacted window: permuted piles, read in file order
    rows = np.bincount(
        np.array(window["file_piles"] if window else range(len(files)), dtype=np.int64),
        weights=manifest["rows_per_file"], minlength=len(units),
    ).astype(np.int64)  # fmt: skip
    (groups,) = EpochPlan.build(rows, seed=manifest["seed"], epoch=0, canonical=1, mix=1).groups
    return [_LazyPile(units[g.pieces[0].unit], manifest["seed"], g) for g in groups]


def _read_columns(result: _ResultFiles, file, columns: list[str]) -> list[pa.ChunkedArray]:
    paths = file.paths if isinstance(file, _LazyPile) else [file]
    tables = [result.read(path, columns) for path in paths]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if isinstance(file, _LazyPile):
        table = _kernels.take(table, group_permutation(file.seed, 0, file.group))
    return [table[name] for name in columns]


@dataclasses.dataclass(frozen=True)
class _ResultFiles:
    """How the files of ``dest`` are read: Parquet (a column at a time), or as a daskpile result's manifest
    says they were written (Arrow IPC, CSV, JSON lines, lines; whole files, as ``verify`` reads them)."""

    fs: object
    written_as: tuple[_outputs.Output, pa.Schema] | None = None

    @classmethod
    def of(cls, fs, manifest: dict | None) -> _ResultFiles:
        output = _outputs.of_manifest(manifest)
        return cls(fs, None if output.format == "parquet" else (output, _manifest.arrow_schema(manifest)))

    def read(self, path: str, columns: list[str]) -> pa.Table:
        if self.written_as is not None and is_json_text(self.written_as[1]):
            return self._read_json_fields(path, columns)
        if self.written_as is not None:
            return _outputs.read(self.fs, path, *self.written_as).select(columns)
        with open_parquet(self.fs, path) as parquet:
            names = parquet.schema_arrow.names
            for name in columns:
                if name not in names:
                    where = full_url(self.fs, path)
                    raise KeyError(f"column {name!r} is not in {where!r} (columns: {', '.join(names)})")
            return parquet.read(columns=columns, use_threads=False)

    def _read_json_fields(self, path: str, columns: list[str]) -> pa.Table:
        """``columns`` as fields of the JSON lines of a result kept as written (its one column is the lines)."""
        with open_decompressed(self.fs, path) as f:
            text = f.read()
        data = pa.py_buffer(text)  # (the same bytes, for Arrow's reader)
        where = full_url(self.fs, path)
        options = pa_json.ReadOptions(block_size=_json_block_size(data, where))
        try:
            table = pa_json.read_json(pa.BufferReader(data), read_options=options)
        except pa.ArrowInvalid as e:
            # A field of other types on other lines (what a result kept as written may hold): the fields asked
            # for alone, each of the first type that reads it on every line
            table = _json_fields_alone(text, options, columns, where)
            if table is None:
                raise ValueError(f"cannot read {where!r} as JSON lines: {e}") from e
        for name in columns:
            if name not in table.column_names:
                shown = ", ".join(table.column_names)
                raise KeyError(f"column {name!r} is not a field of the JSON lines of {where!r} (fields: {shown})")
        return table.select(columns)


_ORDER_TYPES = (pa.int64(), pa.float64(), pa.string(), pa.bool_())


def _json_fields_alone(text: bytes, options, columns: list[str], where: str) -> pa.Table | None:
    """``columns`` of JSON lines whose other fields change type from line to line, each read as the first of
    ``_ORDER_TYPES`` that holds it on every line; None if one is held by none."""
    data, found = pa.py_buffer(text), {}
    for name in columns:
        if json.dumps(name).encode() not in text:  # (no line has it: read so, its values are nulls)
            raise KeyError(f"column {name!r} is not a field of the JSON lines of {where!r}")
        for kind in _ORDER_TYPES:
            parse = pa_json.ParseOptions(explicit_schema=pa.schema([(name, kind)]), unexpected_field_behavior="ignore")
            try:
                found[name] = pa_json.read_json(pa.BufferReader(data), read_options=options, parse_options=parse)[name]
                break
            except (pa.ArrowInvalid, KeyError):
                continue
        else:
            # JSON Arrow's reader refuses that Python's reads (a lone surrogate escape, "\udc80", kept as written):
            # the field by Python's json, line by line (a check's rare path)
            lines = [line for line in text.splitlines() if line.strip()]
            try:
                found[name] = pa.array([json.loads(line).get(name) for line in lines])
            except (ValueError, AttributeError, pa.ArrowInvalid, pa.ArrowTypeError):
                return None
    return pa.table(found)


def _json_block_size(data: pa.Buffer, where: str) -> int:
    """A block for pyarrow's JSON reader longer than the longest line of ``data``, and 1 MiB at least: a line
    may then cross one block's end, not two, which its default of 1 MiB refused ("straddling object").

    >>> _json_block_size(pa.py_buffer(b'{"a": 1}\\n' + b"x" * 3_000_000 + b"\\n"), "f")
    3000002
    """
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
    starts = np.concatenate([[0], ends + 1])  # (the last line may lack its newline)
    longest = int(np.diff(np.append(starts, len(data))).max())
    if longest >= 2**31 - 1:  # (pyarrow's blocks are int32)
        raise ValueError(f"{where!r} holds a line of {longest:,} bytes, longer than quality reads (2 GiB)")
    return max(2**20, longest + 1)


def _label_counts(per_file: list[dict], label_column: str) -> tuple[list, np.ndarray]:
    """The label values, and rows by (file, value)."""
    values = list(dict.fromkeys(v for counts in per_file for v in counts))
    if len(values) > MAX_LABELS:
        raise _too_many_labels(label_column, len(values), "")
    values = sorted((v for v in values if v is not None), key=str) + ([None] if None in values else [])
    counts = np.array([[counts.get(v, 0) for v in values] for counts in per_file], dtype=np.int64)
    return values, counts.reshape(len(per_file), len(values))


def _too_many_labels(label_column: str, distinct: int, where: str) -> ValueError:
    return ValueError(
        f"label column {label_column!r} has {distinct:,} distinct values{where}; "
        f"label balance needs a categorical column (at most {MAX_LABELS})"
    )


def _label_balance(counts: np.ndarray, rows_per_file: np.ndarray, alpha: float) -> QualityCheck:
    """Every file's share of each label against hypergeometric bounds (too uneven: Bonferroni over files and
    labels), and the files' shares together against a chi-square's lower tail (too even: labels dealt out
    round-robin), each side at ``alpha / 2``."""
    n, files, kinds = int(rows_per_file.sum()), counts.shape[0], counts.shape[1]
    share = counts.sum(axis=0) / max(n, 1)
    sizes = rows_per_file[:, None].astype(np.float64)
    # Drawing a file's rows without replacement from n rows: hypergeometric variance.
    variance = sizes * share * (1 - share) * (n - sizes) / max(n - 1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(variance > 0, (counts - sizes * share) / np.sqrt(variance), 0.0)
    worst = float(np.abs(z).max(initial=0.0))
    bound = statistics.NormalDist().inv_cdf(1 - alpha / (4 * max(files * kinds, 1)))  # Bonferroni
    outside = int(np.count_nonzero((np.abs(z) > bound).any(axis=1)))
    p = min(1.0, math.erfc(worst / math.sqrt(2)) * files * kinds * 2)
    detail = f"worst file {worst:.1f} sigma from the overall share (bound {bound:.1f}), {outside} of {files} outside"
    dof = (files - 1) * (kinds - 1)
    expected = sizes * share
    if dof and (expected >= 5).all():  # (where the chi-square's distribution holds)
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        low = min(1.0, 2 * chi_square_cdf(chi2, dof))
        if low < p:
            p = low
            detail += f"; chi-square {chi2:.1f} on {dof} dof" + (" (too even)" if low < alpha else "")
    return QualityCheck("label balance per file", worst, p, p >= alpha and worst <= bound, detail)


def _label_balance_per_batch(
    per_file: list[_Batches], labels: list, label_rows: np.ndarray, batch_size: int, alpha: float
) -> QualityCheck | str:
    """The batches' label counts as a table of batches by labels, against independence (two-sided: batches of
    one label fail it, and so do batches dealt labels evenly), from the files' Gram matrices; or why it was not
    run.  Labels a batch holds fewer than 5 rows of on average are pooled, and the pool, if still that rare,
    joins the commonest label: the chi-square's distribution holds only above that.  That average is of every
    row (``label_rows``, by label), not of the whole batches' alone: a rare label bunched at the ends of files,
    in their last partial batches, was pooled away and the check not run (a quality trial).  To the table's
    chi-square is added that of its columns, the whole batches' labels, against every row's (the two together
    are the table against every row's shares), pooled where the whole batches hold fewer than 5 rows of a
    label: a label all of whose rows are in those partial batches, in no whole batch, was left out, and the
    verdict uniform (the review)."""
    index = {value: i for i, value in enumerate([*labels, None] if None not in labels else labels)}
    gram = np.zeros((len(index), len(index)), dtype=np.int64)
    batches = 0
    for f in per_file:
        if f is None or not f.batches:
            continue
        at = np.array([index[v] for v in f.values])
        np.add.at(gram, (at[:, None], at[None, :]), f.gram)
        batches += f.batches
    if batches < 2:
        return f"fewer than 2 whole batches of {batch_size:,} rows in a file"
    every = np.zeros(len(index))
    every[: len(label_rows)] = label_rows
    rows, everything = batches * batch_size, float(every.sum())
    share = every / max(everything, 1)
    within, within_dof = _batches_by_labels(gram, _pooled(every, share * batch_size), batch_size, batches)
    across, across_dof = 0.0, 0
    if rows < everything:  # (whole batches of every row: their labels are every row's)
        across, across_dof = _whole_batches_labels(gram, _pooled(every, share * rows), share, batch_size, everything)
    chi2, dof = within + across, within_dof + across_dof
    if dof < 1:
        return (
            f"a batch of {batch_size:,} rows holds 5 rows or more of fewer than 2 labels on average (the rarer "
            "labels pooled): too few for its chi-square"
        )
    p = two_sided(chi_square_cdf(chi2, dof), chi_square_sf(chi2, dof))
    side = (" (too even)" if chi2 < dof else " (too uneven)") if p < alpha else ""
    detail = f"chi-square {chi2:,.0f} on {dof:,} dof over {batches:,} batches of {batch_size:,} rows{side}, p={p:.3g}"
    return QualityCheck("label balance per batch", chi2, p, p >= alpha, detail)


def _pooled(every: np.ndarray, expected: np.ndarray) -> list[list[int]]:
    """Labels (indices, commonest first) grouped for a chi-square: each alone where ``expected`` holds 5 rows or
    more of it; the rarer pooled, and the pool, if still that rare, joined to the commonest label."""
    order = np.argsort(-every, kind="stable")
    groups = [[int(k)] for k in order if expected[k] >= 5]
    rare = [int(k) for k in order if expected[k] < 5 and every[k]]
    if rare and expected[rare].sum() >= 5:
        groups.append(rare)
    elif rare and groups:
        groups[0] += rare  # (the commonest label's column takes them)
    return groups


def _sums_by_group(gram: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """The Gram matrix of the groups' counts: sums over batches of count products, by group."""
    member = np.zeros((len(groups), len(gram)))
    for g, ks in enumerate(groups):
        member[g, ks] = 1
    return member @ gram @ member.T


def _batches_by_labels(gram: np.ndarray, groups: list[list[int]], batch_size: int, batches: int) -> tuple[float, int]:
    """Pearson's chi-square of the batches x groups table, given its columns, and its dof: sum over groups of
    (sum over batches of count^2) / (batch_size * column / rows), less rows (every batch of batch_size rows)."""
    if len(groups) < 2:
        return 0.0, 0
    grouped = _sums_by_group(gram, groups)
    column = grouped.sum(axis=1) / batch_size  # each group's rows in the whole batches (a batch's sum to batch_size)
    seen = column > 0  # (a group in no whole batch has no column here: the whole batches' labels say it)
    rows = batches * batch_size
    chi2 = float((np.diag(grouped)[seen] / (batch_size * column[seen] / rows)).sum() - rows)
    return chi2, (batches - 1) * max(int(seen.sum()) - 1, 0)


def _whole_batches_labels(
    gram: np.ndarray, groups: list[list[int]], share: np.ndarray, batch_size: int, everything: float
) -> tuple[float, int]:
    """Pearson's chi-square of the whole batches' rows by group against every row's shares, the whole batches'
    rows drawn from all of them without replacement (its finite-population factor), and its dof."""
    if len(groups) < 2:
        return 0.0, 0
    column = _sums_by_group(gram, groups).sum(axis=1) / batch_size
    rows = float(column.sum())
    expected = np.array([share[ks].sum() for ks in groups]) * rows
    return float(((column - expected) ** 2 / expected).sum() * (everything - 1) / (everything - rows)), len(groups) - 1


def _chi_square(table: np.ndarray) -> float:
    n = table.sum()
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / n
    return float(((table - expected) ** 2 / expected).sum())


def chi_square_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square(dof).

    >>> round(chi_square_sf(3.841458820694124, 1), 6)
    0.05
    """
    return _gamma_q(dof / 2, x / 2)


def chi_square_cdf(x: float, dof: int) -> float:
    """P(X <= x) for X ~ chi-square(dof).

    >>> round(chi_square_cdf(3.841458820694124, 1), 6)
    0.95
    """
    return _gamma_p(dof / 2, x / 2)


def two_sided(lower: float, upper: float) -> float:
    """The two-sided p-value of a statistic whose one-sided tails are ``lower`` and ``upper``.

    >>> two_sided(0.0004, 0.9996)
    0.0008
    """
    return min(1.0, 2 * min(lower, upper))


def poisson_cdf(k: int, mean: float) -> float:
    """P(X <= k) for X ~ Poisson(mean).

    >>> round(poisson_cdf(0, 20.0), 12)  # e^-20
    2.061e-09
    """
    if mean <= 0:
        return 1.0
    return _gamma_q(k + 1, mean)


def poisson_sf(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean).

    >>> round(poisson_sf(2, 1.0), 6)  # 1 - e^-1 (1 + 1)
    0.264241
    """
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    return _gamma_p(k, mean)


def _gamma_q(a: float, x: float) -> float:
    """The regularised upper incomplete gamma function Q(a, x)."""
    if x <= 0:
        return 1.0
    return 1.0 - _gamma_series(a, x) if x < a + 1 else _gamma_fraction(a, x)


def _gamma_p(a: float, x: float) -> float:
    """The regularised lower incomplete gamma function P(a, x) = 1 - Q(a, x)."""
    if x <= 0:
        return 0.0
    return _gamma_series(a, x) if x < a + 1 else 1.0 - _gamma_fraction(a, x)


# Each of the two converges fast, and keeps its precision in small tails, on
# its own side of x = a + 1 (Numerical Recipes, 6.2).
def _gamma_series(a: float, x: float) -> float:
    """P(a, x) by its power series."""
    term = total = 1.0 / a
    denominator = a
    while abs(term) > abs(total) * 1e-16:
        denominator += 1
        term *= x / denominator
        total += term
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_fraction(a: float, x: float) -> float:
    """Q(a, x) by its continued fraction (modified Lentz)."""
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h
