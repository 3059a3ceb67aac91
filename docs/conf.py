"""Sphinx configuration of the Kernos documentation site (``bash scripts/docs``).

The site is written in MyST markdown and rendered with the PyData theme.  It
builds offline: no intersphinx, no fonts or scripts fetched at build time, and
no execution of notebooks (``scripts/docs`` runs the examples on a real kernel
first, into ``docs/examples``, and the build renders those outputs).  ``scripts/docs`` runs it with warnings as
errors, so a broken cross-reference or relative link fails the build.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "kernel"))  # autodoc imports kernos from the checkout

from kernos import __version__  # noqa: E402

project = "Kernos"
author = "Kernos developers"
copyright = "Kernos developers"
version = release = __version__

extensions = [
    "myst_nb",  # MyST markdown pages and the example notebooks (.ipynb)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
]

# docs/examples holds the example notebooks as run by scripts/execute-examples (not
# committed: the sources stay in the repository's examples/, where the tests run them).
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**/.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# --- MyST: links within the site are checked -----------------------------------
# A relative link to a page or a heading that does not exist is a warning (so an
# error in scripts/docs); headings up to level 3 get anchors ("page.md#anchor").
myst_all_links_external = False
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings: list[str] = []

# --- The example notebooks: rendered with the outputs of a real run ---------------
# They are committed with their outputs cleared (tests/examples checks that);
# scripts/execute-examples runs them on a real Kernos kernel, with the restarts and
# kills their cells ask for, which Sphinx's own execution could not do.  So the build
# itself executes nothing.
nb_execution_mode = "off"

# --- API reference ---------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# The docstrings are prose with ``literals`` (no Google or NumPy sections, so no
# napoleon).  The build is not nitpicky (-n): signatures and docstrings name
# private classes (kernos.analysis.Reach, kernos.store.snapshots.StoredGroup) and
# other packages' types (jupyter_client, git) that the reference does not
# document, and there is no intersphinx offline.  Links between the pages are
# checked all the same: MyST warns on every missing target.

# --- HTML ------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "Kernos"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_static_path: list[str] = []


# --- A module docstring shown as it is written -------------------------------------
# Some contracts are written as plain text laid out for a terminal (the harness
# protocol's request table), not as reStructuredText; they are shown verbatim.
def setup(app):  # type: ignore[no-untyped-def]
    import importlib
    import inspect

    from docutils import nodes
    from sphinx.util.docutils import SphinxDirective

    class VerbatimDocstring(SphinxDirective):
        """``{verbatim-docstring} kernos.harness.protocol``: the module's docstring, verbatim."""

        required_arguments = 1

        def run(self):  # type: ignore[no-untyped-def]
            name = self.arguments[0]
            module = importlib.import_module(name)
            self.env.note_dependency(module.__file__)
            text = inspect.getdoc(module) or ""
            return [nodes.literal_block(text, text, language="text")]

    app.add_directive("verbatim-docstring", VerbatimDocstring)
    return {"parallel_read_safe": True}
