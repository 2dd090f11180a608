"""Shared test helpers, imported as `tests.helpers.<module>` (pyproject puts the repo on pythonpath)."""
