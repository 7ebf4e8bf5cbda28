"""Sphinx configuration of the django-cluster-jobs documentation (MyST Markdown pages)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

with (ROOT / "pyproject.toml").open("rb") as pyproject:
    _project = tomllib.load(pyproject)["project"]

project = "django-cluster-jobs"
author = "django-cluster-jobs contributors"
copyright = "django-cluster-jobs contributors"
release = _project["version"]
version = ".".join(release.split(".")[:2])

extensions = ["myst_parser", "sphinxcontrib.mermaid"]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: ```mermaid fences become diagrams (they also render as such on code forges);
# headings up to level 3 get anchors so pages can link to one setting or one check.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_fence_as_directive = ["mermaid"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"django-cluster-jobs {release}"
html_static_path: list[str] = []
