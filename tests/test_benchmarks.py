"""A tiny run of the benchmark suite, to prove it works; timings are never asserted."""

import json
import os
import shutil
import subprocess
import sys

import pytest

RUN = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "run.py")
SYSTEMS = ["daskpile 64 piles", "daskpile 64 piles, threads", "duckdb ORDER BY random()", "floor: pyarrow copy"]


@pytest.mark.slow
def test_tiny_benchmark_run(tmp_path):
    pytest.importorskip("duckdb")
    args = [sys.executable, RUN, "--size", "tiny", "--reps", "1", "--systems", *SYSTEMS]
    args += ["--data-dir", str(tmp_path / "data"), "--results-dir", str(tmp_path / "results")]
    completed = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((tmp_path / "results" / "tiny.json").read_text())
    summary = results["summary"]
    assert set(summary) == set(SYSTEMS) and all(entry["ok"] for entry in summary.values())
    assert summary["daskpile 64 piles"]["scratch_mib"] > 0 and summary["daskpile 64 piles"]["peak_rss_mib"] > 0
    assert summary["duckdb ORDER BY random()"]["vs_duckdb"] == 1.0
    assert results["meta"]["machine"]["cores"] == os.cpu_count()
    table = (tmp_path / "results" / "tiny.md").read_text()
    assert "| daskpile 64 piles |" in table and "| scratch MiB |" in table
    (tmp_path / "results" / "tiny.md").unlink()
    render = [sys.executable, RUN, "--render", str(tmp_path / "results" / "tiny.json")]
    subprocess.run(render, check=True, capture_output=True, timeout=120)
    assert (tmp_path / "results" / "tiny.md").read_text() == table
    if "matplotlib" in results["meta"]["machine"]["versions"] or _has("matplotlib"):
        assert (tmp_path / "results" / "tiny.png").stat().st_size > 1000


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_profile_stages_compares_pile_counts(tmp_path):
    script = os.path.join(os.path.dirname(RUN), "profile_stages.py")
    args = [sys.executable, script, "--size", "tiny", "--piles", "4", "16", "--data-dir", str(tmp_path / "data")]
    completed = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
    lines = completed.stdout.splitlines()  # after "generating dataset tiny ..."
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("tiny, stage after stage")) :]
    assert lines[0].startswith("tiny, stage after stage, CPU seconds (median of 1)")
    assert "4 piles" in lines[1] and "16 piles" in lines[1] and "+12 piles" in lines[1]
    assert any(line.lstrip().startswith("pass 2: write Parquet") for line in lines)
    assert lines[-1].startswith("  ratio 16 / 4 piles: ")


def test_a_run_never_sees_what_a_killed_run_left(tmp_path):
    """A benchmark killed mid-run leaves daskpile's unfinished run in its scratch; the next run must start clean."""
    import tempfile

    import daskpile.engine._run as run_state
    from daskpile._storage import filesystem, full_url
    from daskpile.engine._passes import BLOCKSIZE

    sys.path.insert(0, os.path.dirname(RUN))
    import run as bench

    source = bench.dataset("tiny", str(tmp_path))
    dest = str(tmp_path / "out")
    fs, path = filesystem(dest)
    left = run_state.RunSpec((), (), piles=8, seed=1, dest=full_url(fs, path), blocksize=BLOCKSIZE)
    name = f"daskpile-{run_state.scratch_name(full_url(fs, path))}"
    scratches = [os.path.join(tempfile.gettempdir(), name), os.path.join(dest + "-tmp", name)]
    try:
        for scratch in scratches:  # where the killed run's scratch was, whichever temporary directory it used
            os.makedirs(scratch)
            run_state.write(fs, scratch, left)
        result = bench.run_one("daskpile 64 piles, threads", source, dest)
    finally:
        for scratch in scratches:
            shutil.rmtree(scratch, ignore_errors=True)
    assert result["ok"], result.get("error")


@pytest.mark.slow
def test_the_text_benchmark_runs(tmp_path):
    """Every system of benchmarks/text.py on 20,000 lines; terashuf left out with its reason (no source here)."""
    pytest.importorskip("duckdb")
    text = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "text.py")
    args = [sys.executable, text, "--reps", "1", "--rows", "20000", "--data-dir", str(tmp_path / "data")]
    args += ["--results-dir", str(tmp_path / "results"), "--terashuf-source", str(tmp_path / "nowhere")]
    completed = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((tmp_path / "results" / "text-20000.json").read_text())
    assert all(entry["ok"] for entry in results["summary"].values()), [r for r in results["runs"] if not r["ok"]]
    assert {"shuf", "daskpile lines to lines, threads"} <= set(results["summary"])
    assert "no terashuf source" in results["meta"]["terashuf"]
    lines = results["summary"]["daskpile lines to lines, threads"]
    # the same bytes, permuted, and the manifest
    assert 0 < lines["output_mib"] - results["summary"]["shuf"]["output_mib"] < 0.1


@pytest.mark.slow
def test_the_object_columns_benchmark_runs():
    """benchmarks/dataframe_objects.py end to end on 2,000 rows: both systems, both list columns."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "dataframe_objects.py")
    completed = subprocess.run(
        [sys.executable, script, "--rows", "2000", "--reps", "1"], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.count("daskpile.shuffle(ddf), ") == 2 and completed.stdout.count("to_parquet, ") == 2
