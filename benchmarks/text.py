"""Text corpora: daskpile against GNU shuf, terashuf and DuckDB on one file of JSON lines, side by side.

    python benchmarks/text.py --reps 3                     # 5 M JSON lines made from dataset A
    python benchmarks/text.py --reps 1 --rows 50000000     # the 10x file
    python benchmarks/text.py --reps 1 --rows 100000       # proves the script works

The file is dataset A's columns as JSON lines, written by DuckDB. Every system
runs in a fresh process with its own empty TMPDIR, the file in the page cache,
taking turns; wall time and the peak resident memory of its process tree are
measured from outside. terashuf (a C++ two-pass shuffler of text lines,
single-threaded) is built from its source (``--terashuf-source``, cloned there
from https://github.com/alexandres/terashuf when absent) with its own
Makefile's flags, or left out with the reason. Results go to benchmarks/results/text-<rows>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import SIZES, dataset, machine, peak_rss, save  # noqa: E402

DASKPILE = shutil.which("daskpile", path=os.path.dirname(sys.executable)) or "daskpile"


def corpus(rows: int, data_dir: str) -> str:
    """The first ``rows`` rows of the smallest reference dataset that has them, as JSON lines (made once)."""
    path = os.path.join(data_dir, f"text-{rows}.jsonl")
    if not os.path.exists(path):
        import duckdb

        size = next(name for name in ("tiny", "A", "B") if SIZES[name][0] >= rows)
        source = dataset(size, data_dir)
        print(f"writing {path} ...", flush=True)
        duckdb.sql(
            f"COPY (SELECT * FROM read_parquet('{source}/*.parquet') ORDER BY id LIMIT {rows}) "
            f"TO '{path}.tmp' (FORMAT json)"
        )
        os.replace(f"{path}.tmp", path)
    return path


def compile_daskpile() -> None:
    """Compile daskpile's bytecode, as installing it from a wheel does: an editable install run with
    PYTHONDONTWRITEBYTECODE set (as on this machine) compiles every module at every start, 0.1-0.15 s a run."""
    import compileall

    import daskpile

    compileall.compile_dir(os.path.dirname(daskpile.__file__), quiet=1)


TERASHUF_URL = "https://github.com/alexandres/terashuf"


def build_terashuf(source: str, build_dir: str) -> tuple[str | None, str]:
    """(the binary, how it was made) or (None, why not)."""
    if not os.path.exists(os.path.join(source, "terashuf.cc")):
        cloned = subprocess.run(["git", "clone", "--depth", "1", TERASHUF_URL, source], capture_output=True, text=True)
        if cloned.returncode:
            why = (cloned.stderr.strip().splitlines() or ["git failed"])[-1]
            return None, f"no terashuf source at {source}, and `git clone {TERASHUF_URL}` failed: {why}"
    os.makedirs(build_dir, exist_ok=True)
    binary = os.path.join(build_dir, "terashuf")
    subprocess.run(
        ["g++", "-std=c++11", "-O3", "-o", binary, os.path.join(source, "terashuf.cc")], check=True, capture_output=True
    )
    return binary, "g++ -std=c++11 -O3 (its Makefile's flags)"


def systems(src: str, out: str, terashuf: str | None) -> dict[str, tuple[list[str] | str, dict]]:
    """name -> (command, extra environment); a string command runs in a shell."""
    lines = [DASKPILE, "shuffle", src, out, "--format", "lines", "--output-format", "lines", "--piles", "64"]
    jsonl = [DASKPILE, "shuffle", src, out, "--output-format", "jsonl", "--piles", "64", "--seed", "1"]
    found = {
        "shuf": (["shuf", src, "-o", os.path.join(out, "shuffled.jsonl")], {}),
        "duckdb ORDER BY random() (JSON lines to JSON lines)": (
            [
                sys.executable,
                "-c",
                "import duckdb, sys; c = duckdb.connect(); c.execute('SET threads=2'); "
                "c.execute(f\"COPY (SELECT * FROM read_json('{sys.argv[1]}') ORDER BY random()) "
                "TO '{sys.argv[2]}/shuffled.jsonl' (FORMAT json)\")",
                src,
                out,
            ],
            {},
        ),
        "daskpile lines to lines, threads": ([*lines, "--seed", "1", "--scheduler", "threads", "-q"], {}),
        "daskpile lines to lines": ([*lines, "--seed", "1", "-q"], {}),
        # the command turns mimalloc's huge pages off (daskpile/__main__.py); this is it with them on
        "daskpile lines to lines, threads, MIMALLOC_ALLOW_THP=1": (
            [*lines, "--seed", "1", "--scheduler", "threads", "-q"],
            {"MIMALLOC_ALLOW_THP": "1"},
        ),
        "daskpile lines to lines, auto piles, threads": (
            [*lines[:-2], "--seed", "1", "--scheduler", "threads", "-q"],
            {},
        ),
        "daskpile JSON lines to JSON lines, threads": ([*jsonl, "--scheduler", "threads", "-q"], {}),
        "daskpile JSON lines to JSON lines, parsed, threads": (
            [*jsonl, "--read-option", "as_written=false", "--scheduler", "threads", "-q"],
            {},
        ),
        "daskpile JSON lines to Parquet, threads": (
            [DASKPILE, "shuffle", src, out, "--piles", "64", "--seed", "1", "--scheduler", "threads", "-q"],
            {},
        ),
    }
    if terashuf:
        for memory in ("0.2", "4"):
            command = f"{terashuf} < {src} > {os.path.join(out, 'shuffled.jsonl')}"
            found[f"terashuf {memory} GB"] = (command, {"MEMORY": memory, "SEED": "1"})
    return found


def run(name: str, command, env: dict, src: str, out: str, settle: float = 0.0) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    tmp = out + "-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if name.startswith(("shuf", "duckdb", "terashuf")):
        os.makedirs(out)
    os.sync()
    with open(src, "rb") as f:  # in the page cache, as for every system
        while f.read(16 << 20):
            pass
    # On a VM that hands freed memory back to its host, memory freed seconds ago costs ~10x more to touch
    # than memory freed just now (fresh_memory.py): without a pause, a system runs on what the one before
    # it (and its output, removed above) left warm. A pause starts every system alike, cold.
    time.sleep(settle)
    start = time.perf_counter()
    process = subprocess.Popen(
        command, shell=isinstance(command, str), env={**os.environ, "TMPDIR": tmp, **env}, stderr=subprocess.PIPE
    )
    peak, _ = peak_rss(process, start)
    wall = time.perf_counter() - start
    _, stderr = process.communicate()
    shutil.rmtree(tmp, ignore_errors=True)
    if process.returncode:
        return {"system": name, "ok": False, "error": stderr.decode()[-1000:]}
    written = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    return {"system": name, "ok": True, "wall_s": wall, "peak_mib": peak / 2**20, "output_mib": written / 2**20}


def summarise(runs: list[dict]) -> dict:
    summary = {}
    for name in dict.fromkeys(r["system"] for r in runs):
        ok = [r for r in runs if r["system"] == name and r["ok"]]
        if not ok:
            summary[name] = {"ok": False}
            continue
        walls = [r["wall_s"] for r in ok]
        summary[name] = {
            "ok": True,
            "wall_median_s": statistics.median(walls),
            "wall_min_s": min(walls),
            "wall_max_s": max(walls),
            "peak_mib": max(r["peak_mib"] for r in ok),
            "output_mib": ok[0]["output_mib"],
        }
    return summary


def markdown(summary: dict, meta: dict) -> str:
    m = meta["machine"]
    peers = {name: s["wall_median_s"] for name, s in summary.items() if s["ok"] and not name.startswith("daskpile")}
    columns = [name for name in ("shuf", "terashuf 0.2 GB") if name in peers]
    lines = [
        f"{meta['rows']:,} JSON lines ({meta['file_mib']:,.0f} MiB); {m['cores']} cores, {m['memory_gib']} GiB "
        f"({m['cpu']}); {meta['date']}; {meta['reps']} runs each, alternating"
        + (f", each after a pause of {meta['settle_s']:g} s" if meta.get("settle_s") else ", back to back")
        + f"; terashuf: {meta['terashuf']}",
        "",
        "| system | wall s, median (min-max) | peak MiB (tree) | output MiB | "
        + " | ".join(f"x {c}" for c in [*columns, "DuckDB"])
        + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in [*columns, "DuckDB"]) + " |",
    ]
    duckdb = next((v for k, v in peers.items() if k.startswith("duckdb")), None)
    for name, s in summary.items():
        if not s["ok"]:
            lines.append(f"| {name} | failed | | | " + " | ".join("" for _ in [*columns, "DuckDB"]) + " |")
            continue
        ratios = [f"{s['wall_median_s'] / peers[c]:.2f}" for c in columns]
        ratios.append(f"{s['wall_median_s'] / duckdb:.2f}" if duckdb else "")
        lines.append(
            f"| {name} | {s['wall_median_s']:.1f} ({s['wall_min_s']:.1f}-{s['wall_max_s']:.1f}) "
            f"| {s['peak_mib']:,.0f} | {s['output_mib']:,.0f} | " + " | ".join(ratios) + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--terashuf-source", default=os.path.join(HERE, "data", "terashuf"))
    parser.add_argument("--systems", nargs="*", help="names to run [all]")
    parser.add_argument(
        "--settle", type=float, default=0.0, help="seconds to wait before each run, so each starts on cold memory"
    )
    args = parser.parse_args(argv)
    src = corpus(args.rows, args.data_dir)
    compile_daskpile()
    out = os.path.join(args.data_dir, "text-out")
    terashuf, how = build_terashuf(args.terashuf_source, os.path.join(args.data_dir, "terashuf-build"))
    cases = systems(src, out, terashuf)
    if args.systems:
        cases = {k: v for k, v in cases.items() if k in args.systems}
    names = list(cases)
    runs = []
    for rep in range(args.reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            result = run(name, *cases[name], src, out, args.settle)
            runs.append(result)
            status = f"{result['wall_s']:.1f} s" if result["ok"] else "FAILED: " + result["error"][-300:]
            print(f"[{rep + 1}/{args.reps}] {name}: {status}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    meta = {
        "rows": args.rows,
        "file_mib": os.path.getsize(src) / 2**20,
        "reps": args.reps,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "terashuf": how,
        "settle_s": args.settle,
    }
    summary = summarise(runs)
    save(os.path.join(args.results_dir, f"text-{args.rows}"), meta, summary, runs, markdown(summary, meta))
    return summary


if __name__ == "__main__":
    main()
