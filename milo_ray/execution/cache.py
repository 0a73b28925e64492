"""The scheduler's result cache: a rollout key runs at most once per run.

Finished results are kept by ``RolloutRequest.key(model_id)``: the ones finished in
this process, and, loaded from the store on first request, the ones a previous
session stored (resume). Infrastructure failures are never cached: a later request
(or a resume) runs them again, as the store's ``completed_keys()`` implies.
"""

from __future__ import annotations

from typing import Any, Iterable

from milo_ray.core.rollouts import RolloutResult


class ResultCache:
    def __init__(self, store: Any) -> None:
        self.store = store
        self._results: dict[str, RolloutResult] = {}
        # Keys completed in the store; their results are read only when requested, since a
        # resumed run asks again for a fraction of what it stored.
        self._stored_keys: set[str] = set(store.completed_keys())

    def load(self, keys: Iterable[str]) -> None:
        """Read the stored results of ``keys`` that are not in memory yet, in one query."""
        wanted = [k for k in set(keys) if k not in self._results and k in self._stored_keys]
        if not wanted:
            return
        for key, result in self.store.get_rollouts(wanted).items():
            if result.error_kind != "infra":
                self._results.setdefault(key, result)

    def get(self, key: str) -> RolloutResult | None:
        """The finished result of ``key`` (loading it from the store if needed), else None."""
        self.load([key])
        return self._results.get(key)

    def __contains__(self, key: str) -> bool:
        """Whether ``key``'s result is in memory (call :meth:`load` first for stored keys)."""
        return key in self._results

    def __getitem__(self, key: str) -> RolloutResult:
        return self._results[key]

    def add(self, result: RolloutResult) -> None:
        """Keep a result the driver just stored (an infra failure is not kept)."""
        if result.error_kind != "infra":
            self._results[result.cache_key] = result
            self._stored_keys.add(result.cache_key)
