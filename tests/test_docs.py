"""The documentation is built and checked like code.

- The Sphinx site builds with warnings as errors: a broken link, anchor, cross-reference or
  docstring fails it, and the command-line reference in it is generated from the command.
- Every example runs. Each page's ``python`` blocks run in order, in one namespace, in a fresh
  directory holding ``data/`` (30,000 rows sorted by ``id``, in 3 Parquet files); ``pycon``
  blocks run as doctests. Every ``daskpile ...`` line of a shell block is parsed by the real
  command; those on local paths also run (on the threaded scheduler), those naming a cluster or
  an object store only parse, since none is reachable from here. A ``python`` block whose first
  line is ``# needs torch`` runs where torch is installed (``make test-torch``).
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from daskpile.cli import cli
from daskpile.datasets import write_reference_dataset

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
OUTSIDE_THE_SITE = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "benchmarks" / "README.md",
    ROOT / "deploy" / "README.md",
]
PAGES = [*sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts), *OUTSIDE_THE_SITE]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.M | re.S,
)
PYTHON = {"python", "py", "python3", "ipython", "ipython3"}
SHELLS = {"sh", "bash", "shell", "console"}
# Blocks that are not examples: output, configuration, and the site's own directives.
NOT_EXAMPLES = {"text", "json", "yaml", "toml", "{toctree}", "{include}", "{eval-rst}", "{click}", "{literalinclude}"}


def code_blocks(page: Path) -> list[tuple[str, str, int]]:
    """(language, code, line) of every fenced block of a Markdown page, indented ones (in lists) included.

    ``{code-block} python`` is a python block; an untagged block is an error (Sphinx would guess).
    """
    text = page.read_text()
    blocks = []
    for m in FENCE.finditer(text):
        info = m["info"].split()
        lang = info[1] if info[:1] in (["{code-block}"], ["{code}"]) and len(info) > 1 else (info or [""])[0]
        body = "\n".join(line.removeprefix(m["indent"]) for line in m["body"].splitlines())
        blocks.append(("python" if lang in PYTHON else lang, body, text.count("\n", 0, m.start()) + 1))
    return blocks


def daskpile_lines(code: str) -> list[str]:
    """The ``daskpile`` command lines of a shell block: prompts and comments stripped, continuations joined."""
    lines, current = [], ""
    for raw in code.splitlines():
        line = raw.removeprefix("$ ").rstrip()
        if current:
            current += " " + line.rstrip("\\").strip()
        elif line.startswith("daskpile ") or line == "daskpile":
            current = line.rstrip("\\").strip()
        if current and not line.endswith("\\"):
            lines.append(current)
            current = ""
    return lines


def is_synopsis(line: str) -> bool:
    """A usage line (``daskpile shuffle SOURCE... DEST [--piles N]``), not a command to run."""
    words = line.split("#")[0].split()
    return "[" in line or "..." in line or any(re.fullmatch(r"[A-Z][A-Z_]{2,}", w) for w in words)


def parse(args: list[str]):
    """The command and its parameters as the real command line parses them, or click's error."""
    import click

    group = click.Context(cli, info_name="daskpile")
    command = cli.get_command(group, args[0]) if args else None
    if command is None:
        raise click.UsageError(f"no such command {args[:1]}")
    with command.make_context(args[0], list(args[1:]), parent=group) as context:
        return args[0], context.params


@pytest.fixture
def in_example_dir(tmp_path, monkeypatch):
    write_reference_dataset(str(tmp_path / "data"), rows=30_000, files=3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "threads")  # the commands' --scheduler
    return tmp_path


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_example_of_the_page_runs(page, in_example_dir):
    import dask

    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for lang, code, line in code_blocks(page):
        where = f"{page_id(page)}:{line}"
        needs = re.match(r"# needs (\w+)\n", code)  # an optional extra: run where it is installed
        if lang == "python" and needs and importlib.util.find_spec(needs[1]) is None:
            continue
        if lang == "python":
            with dask.config.set(scheduler="threads"):
                exec(compile(code, where, "exec"), namespace)
            ran += 1
        elif lang == "pycon":
            test = doctest.DocTestParser().get_doctest(code, namespace, where, str(page), line)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            runner.run(test)
            assert runner.summarize(verbose=False).failed == 0, where
            ran += 1
        elif lang in SHELLS:
            for command in daskpile_lines(code):
                ran += run_command(command.split(" #")[0], where)
        else:
            assert lang in NOT_EXAMPLES, f"{where}: a ```{lang} block is neither checked nor known not to be code"
    if ran == 0:
        pytest.skip("no example on this page")


def run_command(command: str, where: str) -> int:
    if is_synopsis(command):
        return 0
    args = shlex.split(command)[1:]
    if "--help" in args or "-h" in args or "--version" in args:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, f"{where}: {command!r} exited {result.exit_code}: {result.output}"
        return 1
    try:
        name, _params = parse(args)
    except Exception as e:  # click's usage errors, raised with the message the user would see
        raise AssertionError(f"{where}: {command!r} does not parse: {e}") from e
    if any("://" in a for a in args) or name == "demo":
        return 1  # a cluster or an object store that is not here; the demo is `make demo`
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, f"{where}: {command!r} exited {result.exit_code}: {result.output}"
    return 1


def test_a_command_that_does_not_parse_fails_the_check():
    """The biased variant: a misspelt option, a wrong value and an unknown command are caught."""
    for command in ["daskpile shuffle a b --pile 4", "daskpile shuffle a b --piles many", "daskpile shufle a b"]:
        with pytest.raises(AssertionError, match="does not parse"):
            run_command(command, "here")
    assert parse(["shuffle", "a", "b", "--piles", "4"])[1]["piles"] == 4


def test_no_example_escapes_the_check(tmp_path):
    """The variant that must fail: fences the collector once skipped silently are run, or refused."""
    page = tmp_path / "page.md"
    page.write_text(
        "~~~py\nraise SystemExit\n~~~\n\n- item\n\n  ```python3\n  x = 1\n  ```\n\n"
        "```{code-block} python\ny = 2\n```\n\n```\nuntagged\n```\n"
    )
    assert [(lang, code) for lang, code, _ in code_blocks(page)] == [
        ("python", "raise SystemExit"), ("python", "x = 1"), ("python", "y = 2"), ("", "untagged"),
    ]  # fmt: skip


def test_shell_lines_are_read_as_a_terminal_would():
    code = "$ daskpile shuffle a/ b/ \\\n    --piles 4  # four\npip install daskpile\ndaskpile verify a/ b/\n"
    assert daskpile_lines(code) == ["daskpile shuffle a/ b/ --piles 4  # four", "daskpile verify a/ b/"]
    assert is_synopsis("daskpile shuffle SOURCE... DEST [--piles N]")
    assert not is_synopsis("daskpile shuffle data/ out/ --piles 4")
    assert not is_synopsis("daskpile shuffle data/ out/ --pile 4 --scratch $TMPDIR")  # a variable, not a placeholder


@pytest.mark.slow
def test_the_site_builds_without_a_warning_and_documents_every_option(tmp_path):
    out = tmp_path / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"},
    )
    assert build.returncode == 0, build.stderr
    reference = (out / "reference" / "cli.html").read_text()
    for name, command in cli.commands.items():
        for parameter in command.params:
            for option in getattr(parameter, "opts", []):
                if option.startswith("-"):
                    assert f"{option}" in reference, f"daskpile {name} {option} is not in the built reference"
    api = (out / "reference" / "api.html").read_text()
    for name in ("shuffle", "shuffle_parquet", "verify", "quality", "plan_piles", "read_manifest"):
        assert f'id="daskpile.{name}"' in api, f"daskpile.{name} is not in the built API reference"


@pytest.mark.parametrize("page", OUTSIDE_THE_SITE, ids=page_id)
def test_the_links_of_pages_outside_the_site_resolve(page):
    """GitHub renders these; Sphinx does not check them, so this does."""
    text = FENCE.sub("", page.read_text())
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets
    for target in targets:
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        assert (page.parent / target.split("#")[0]).exists(), f"{page_id(page)} links to {target}, which does not exist"
