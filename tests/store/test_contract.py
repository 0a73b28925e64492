"""Both stores pass the same contract suite (``milo_ray/testing/store_contract.py``)."""

from __future__ import annotations

import itertools

import pytest

from milo_ray.store import MemoryRunStore, ParquetRunStore
from milo_ray.testing.store_contract import RunStoreContract


class _Memory:
    def new(self, **_flush_options):  # nothing to flush in memory
        return MemoryRunStore(run_id="mem-run")

    def reopen(self, store):
        return store  # no persistence: the same object is the same run


class _Parquet:
    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self._ids = itertools.count()
        self._open: list[ParquetRunStore] = []

    def new(self, **flush_options):
        store = ParquetRunStore(self.tmp_path / f"run-{next(self._ids)}", **flush_options)
        self._open.append(store)
        return store

    def reopen(self, store):
        store.close()
        again = ParquetRunStore(store.root, flush_rows=store.flush_rows, flush_seconds=store.flush_seconds)
        self._open.append(again)
        return again

    def close_all(self):
        for s in self._open:
            s.close()


@pytest.fixture(params=["memory", "parquet"])
def backend(request, tmp_path):
    if request.param == "memory":
        yield _Memory()
        return
    b = _Parquet(tmp_path)
    yield b
    b.close_all()


class TestRunStoreContract(RunStoreContract):
    pass
