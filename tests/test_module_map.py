"""The module map of CONTRIBUTING.md is the code's: every module has its row, and imports only what its row allows.

The table has a row per ``.py`` file of ``daskpile/``: its path, its layer, what it owns, and the
daskpile modules it may import.  A "may import" cell is ``nothing``, ``anything``, or a
comma-separated list of layers in the plural (``leaves``, ``sources``, ``blocks``,
``operations``: every module of that layer) and backticked module names relative to
``daskpile`` (`` `_storage` ``, `` `sources.parquet` ``).  Imports are read from the source with
``ast``, those inside functions included; nothing is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"leaves": "leaf", "sources": "sources", "blocks": "block", "operations": "operation", "front": "front"}
HEADER = re.compile(r"^\| *module *\| *layer *\| *owns *\| *may import *\|\n\|[-| ]+\|\n", re.M)


def module_name(path: Path) -> str:
    """``daskpile/sources/__init__.py`` -> ``daskpile.sources``; ``daskpile/engine/_run.py`` -> its module."""
    parts = path.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_on_disk() -> dict[str, Path]:
    return {module_name(p.relative_to(ROOT)): p for p in sorted((ROOT / "daskpile").rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The daskpile modules a module imports, anywhere in it (inside functions too)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x, from ..sources import y
                base = ".".join([*package[: len(package) - node.level + 1], node.module or ""]).rstrip(".")
            else:
                base = node.module or ""
            # ``from daskpile.engine import _run`` imports the module daskpile.engine._run; ``from daskpile import
            # verify``, daskpile
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return {imported for imported in found if imported.split(".")[0] == "daskpile"} - {name}


def read_map(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(module -> layer, module -> its may-import cell) from the table of a contributor guide."""
    header = HEADER.search(text)
    assert header, "no table headed | module | layer | owns | may import |"
    layers, cells = {}, {}
    for line in text[header.end() :].splitlines():
        if not line.startswith("|"):
            break
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(row) == 4, f"a row of the module map has {len(row)} cells, not 4: {line}"
        path, layer, _owns, may_import = row
        match = re.fullmatch(r"`(daskpile/[\w/]+\.py)`", path)
        assert match, f"a module is named by its path in backticks (`daskpile/engine/_run.py`), not {path!r}"
        name = module_name(Path(match[1]))
        assert name not in layers, f"{match[1]} has two rows"
        assert layer in LAYERS.values(), f"{match[1]}: the layer {layer!r} is none of {sorted(LAYERS.values())}"
        layers[name], cells[name] = layer, may_import
    return layers, cells


def allowed_by(cell: str, layers: dict[str, str]) -> set[str] | None:
    """The modules a may-import cell allows; None for anything."""
    if cell in ("anything", "nothing"):
        return None if cell == "anything" else set()
    allowed = set()
    for token in (t.strip() for t in cell.split(",")):
        if token in LAYERS:
            allowed |= {name for name, layer in layers.items() if layer == LAYERS[token]}
        elif match := re.fullmatch(r"`([\w.]+)`", token):
            assert f"daskpile.{match[1]}" in layers, f"the may-import cell {cell!r} names {token}, which has no row"
            allowed.add(f"daskpile.{match[1]}")
        else:
            raise AssertionError(f"cannot read {token!r} in the may-import cell {cell!r}")
    return allowed


def rows_that_differ(layers: dict[str, str], on_disk: dict[str, Path]) -> list[str]:
    return [f"{name} has no row in the module map" for name in sorted(set(on_disk) - set(layers))] + [
        f"the module map has a row for {name}, which does not exist" for name in sorted(set(layers) - set(on_disk))
    ]


def forbidden_imports(layers: dict[str, str], cells: dict[str, str], on_disk: dict[str, Path]) -> list[str]:
    wrong = []
    for name, path in on_disk.items():
        allowed = allowed_by(cells[name], layers) if name in cells else set()
        if allowed is not None:
            wrong += [f"{name} imports {m}" for m in sorted(imports_of(name, path, set(on_disk)) - allowed)]
    return wrong


@pytest.fixture(scope="module")
def guide() -> str:
    return (ROOT / "CONTRIBUTING.md").read_text()


def test_every_module_has_a_row_and_every_row_a_module(guide):
    problems = rows_that_differ(read_map(guide)[0], modules_on_disk())
    assert not problems, "CONTRIBUTING.md's module map is not the package:\n" + "\n".join(problems)


def test_every_module_imports_only_what_its_row_allows(guide):
    problems = forbidden_imports(*read_map(guide), modules_on_disk())
    assert not problems, "imports CONTRIBUTING.md's module map does not allow:\n" + "\n".join(problems)


def test_the_checks_have_teeth(guide, tmp_path):
    """A row for no module, a module without a row, and an import inside a function that its row forbids."""
    on_disk = modules_on_disk()
    header = HEADER.search(guide)[0]
    extra = guide.replace(header, header + "| `daskpile/_gone.py` | leaf | nothing | nothing |\n", 1)
    assert "the module map has a row for daskpile._gone, which does not exist" in rows_that_differ(
        read_map(extra)[0], on_disk
    )
    without = re.sub(r"^\| `daskpile/_words\.py` \|.*\n", "", guide, flags=re.M)
    assert "daskpile._words has no row in the module map" in rows_that_differ(read_map(without)[0], on_disk)

    words = tmp_path / "_words.py"  # a leaf, so its row allows nothing
    words.write_text(
        on_disk["daskpile._words"].read_text() + "\n\ndef later():\n    from daskpile.engine import _run\n"
    )
    wrong = forbidden_imports(*read_map(guide), {**on_disk, "daskpile._words": words})
    assert "daskpile._words imports daskpile.engine._run" in wrong
    with pytest.raises(AssertionError, match="has no row"):
        allowed_by("leaves, `_gone`", read_map(guide)[0])


def test_every_test_file_has_its_row_in_the_test_table():
    """CONTRIBUTING's table of the test files says what each covers: five files had no row."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    rows = re.findall(r"^\| `tests/(test_\w+\.py)` \|", text, re.M)
    assert sorted(rows) == sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
