"""Maintenance tools run from the repository root: `python -m tools.docs_blocks`, `python tools/code_shape.py`."""
