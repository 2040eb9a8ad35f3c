"""Fixtures of the strata Python tests (run by ctest with PYTHONPATH=<build>/python)."""
import os

import pytest

import strata


@pytest.fixture
def store_path(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def store(store_path):
    s = strata.Store.open(store_path, host_budget="64MiB", staging="16MiB", chunk_size="1MiB",
                          workers=2)
    yield s
    if not s.closed:
        s.close()


@pytest.fixture
def strata_dir(tmp_path, monkeypatch):
    """An empty $STRATA_DIR (where strata.torch optimizers make their temporary stores)."""
    d = tmp_path / "strata_dir"
    d.mkdir()
    monkeypatch.setenv("STRATA_DIR", str(d))
    return d
