"""Sphinx configuration for the numba_hostfn documentation (build: see docs/index.md)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("NUMBA_HOSTFN_SIMULATOR", "1")  # autodoc imports; no GPU needed

import numba_hostfn  # noqa: E402

project = "numba_hostfn"
copyright = "2026, the numba_hostfn developers"
release = numba_hostfn.__version__
extensions = ["myst_parser", "sphinx.ext.autodoc", "numpydoc"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
autodoc_member_order = "bysource"
html_theme = "alabaster"
html_title = f"numba_hostfn {release}"
