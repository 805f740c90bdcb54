"""Engram service benchmark (issue 8): ``.venv/bin/python -m tools.bench --help``."""
