"""Fixtures for trainer tests: tiny shard folders (the run helpers are in tests/helpers/trainer_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.data.shards import prepare


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> Path:
    """512 generated docs, 16 rows per row group: 32 row groups in 4 shards."""
    d = tmp_path_factory.mktemp("data") / "shards"
    prepare(d, None, 512, 16, 8, seed=0)
    return d


@pytest.fixture(scope="session")
def small_shards(tmp_path_factory) -> Path:
    """64 docs, 2 rows per row group: 32 small row groups, so a short run reads a whole epoch."""
    d = tmp_path_factory.mktemp("small") / "shards"
    prepare(d, None, 64, 2, 8, seed=0)
    return d
