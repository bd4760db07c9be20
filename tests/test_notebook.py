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
