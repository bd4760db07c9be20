"""Sphinx configuration: Markdown pages (MyST), the API from the docstrings, the command line from click.

Built with warnings as errors (``make docs``, ``tests/test_docs.py``), so a broken link,
reference or docstring fails the build.
"""

import daskpile

project = "daskpile"
author = "the daskpile authors"
release = version = daskpile.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_click",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links resolve, and are checked

# Every cross-reference must resolve; the types of the libraries daskpile builds on are named
# in signatures but not documented here (the build runs offline, without their inventories).
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(pa|pyarrow|pd|pandas|dd|dask|distributed|fsspec|np|numpy|matplotlib)\b.*")]
autodoc_typehints = "description"
autodoc_member_order = "bysource"
# daskpile.torch imports torch, an optional extra the docs build does without.
autodoc_mock_imports = ["torch"]
napoleon_numpy_docstring = True
napoleon_google_docstring = False

html_theme = "pydata_sphinx_theme"
html_title = "daskpile"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}

# Options are copied from the page: "--piles" must not become an en dash.
smartquotes = False
