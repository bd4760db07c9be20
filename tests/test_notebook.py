"""The quick-start notebook runs headless from top to bottom, so it never rots."""

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = os.path.join(os.path.dirname(__file__), os.pardir, "notebooks", "quickstart.ipynb")


@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), (
        "commit it without outputs"
    )
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if any cell fails
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # the quality figure, before and after
    text = "".join(o.get("text", "") for o in outputs)
    assert "match: the result is a permutation" in text and "rank 0 of 4" in text


@pytest.mark.slow
def test_without_matplotlib_only_the_figures_cells_fail(tmp_path, monkeypatch):
    """A trial's `pip install -e .` had no matplotlib: ``%matplotlib inline`` in the first cell stopped the imports
    and the cluster there, and every later cell failed with NameError."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ModuleNotFoundError(\"No module named 'matplotlib'\")\n")
    path = os.pathsep.join(p for p in (str(blocker), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # (the kernel's process inherits it)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )  # fmt: skip
    client.execute()
    failed = [cell.source for cell in notebook.cells for o in cell.get("outputs", []) if o.output_type == "error"]
    assert len(failed) == 2 and all(source.endswith(".plot()  # needs matplotlib") for source in failed), failed
    text = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    assert "match: the result is a permutation" in text and "rank 0 of 4" in text
