"""Run storage (DESIGN §3): the ``RunStore`` contract, its Parquet and in-memory
implementations, the table schemas, and ``open_run`` for analysis."""

from milo_ray.store.base import TABLES, RunStore
from milo_ray.store.core import StoreClosed
from milo_ray.store.memory import MemoryRunStore
from milo_ray.store.parquet import ParquetRunStore, open_run
from milo_ray.store.schema import SCHEMA_VERSION, SCHEMAS

__all__ = [
    "TABLES",
    "RunStore",
    "StoreClosed",
    "MemoryRunStore",
    "ParquetRunStore",
    "open_run",
    "SCHEMA_VERSION",
    "SCHEMAS",
]
