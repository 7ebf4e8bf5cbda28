#!/usr/bin/env bash
# Build the documentation (Sphinx, MyST Markdown) into docs/_build/html, warnings as errors.
# The build runs in $VENV (default .venv), with the project installed with its 'docs' extra;
# PYTHON and VENV work as for make demo and make test (scripts/lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_venv docs
say "Building the docs into docs/_build/html (warnings are errors)"
# -E re-reads every page, so warnings of unchanged pages are reported again on every build.
"$VENV/bin/python" -m sphinx -W --keep-going -E -b html docs docs/_build/html
say "Docs built: docs/_build/html/index.html"
