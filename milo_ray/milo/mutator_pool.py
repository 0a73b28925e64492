"""The mutator pool G (papers/000 §4.1.2): mutator specs, the island -> mutator
assignment m^(r), per-spec concurrency limits and the per-mutation time cap.

Owns :class:`MutatorPool` (plain, unit-tested without Ray) and the async
:class:`MutatorPoolActor` shell that runs mutations through the shared runner
(:mod:`milo_ray.search.mutation`). A mutator that times out, crashes or returns
nothing yields a ``MutationOutcome`` with ``error`` set — the loop records it as a
rejected child.
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

import numpy as np
import ray

from milo_ray.agents.protocols import MutationRequest
from milo_ray.boundary.gateway.role_journal import RoleCallTicket
from milo_ray.search.mutation import MutationOutcome, ShippedFiles, ValidationOptions, run_mutation_async


def spec_names(specs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Stable, unique display names for specs: ``name`` if given, else the
    ``personality``/``model`` field, else the class name; duplicates get ``#k``."""
    out: list[str] = []
    for i, s in enumerate(specs):
        if "_target_" not in s:
            raise ValueError(f"mutator spec #{i} has no _target_ (got keys {sorted(s)}); see conf/backend/*.yaml")
        base = str(s.get("name") or s.get("personality") or s.get("model") or str(s["_target_"]).rsplit(".", 1)[-1])
        name, k = base, 2
        while name in out:
            name, k = f"{base}#{k}", k + 1
        out.append(name)
    return out


class MutatorPool:
    """Specs by name, the assignment, and the limits the actor enforces."""

    def __init__(self, specs: Sequence[Mapping[str, Any]], *, time_cap_s: float = 2700.0,
                 max_concurrent: int | Mapping[str, int] = 8) -> None:
        if not specs:
            raise ValueError("mutator pool: no mutator specs (backend.agents.mutators is empty)")
        if time_cap_s <= 0:
            raise ValueError(f"mutator pool: time_cap_s={time_cap_s} must be > 0")
        names = spec_names(specs)
        self.specs: dict[str, dict[str, Any]] = {n: dict(s) for n, s in zip(names, specs)}
        self.names = names
        self.time_cap_s = float(time_cap_s)
        if isinstance(max_concurrent, Mapping):
            self.limits = {n: int(max_concurrent.get(n, 8)) for n in names}
        else:
            self.limits = {n: int(max_concurrent) for n in names}
        for n, lim in self.limits.items():
            if lim < 1:
                raise ValueError(f"mutator pool: concurrency limit of {n!r} is {lim}; must be >= 1")
        self.assignment: dict[int, str] = {}

    def spec(self, name: str) -> dict[str, Any]:
        if name not in self.specs:
            raise ValueError(f"mutator {name!r} is not in the pool {self.names}")
        return dict(self.specs[name])

    def assign_initial(self, islands: Sequence[int], rng: np.random.Generator, default: str | None = None) -> dict[int, str]:
        """m^(1): ``default`` for every island if given, else uniform random from G."""
        if default is not None:
            self.spec(default)
        for j in islands:
            self.assignment[int(j)] = default if default is not None else self.names[int(rng.integers(len(self.names)))]
        return dict(self.assignment)

    def assign(self, island: int, name: str) -> None:
        """Set m_j (initial assignment, Reassign, or a speciated island's mutator)."""
        self.spec(name)
        self.assignment[int(island)] = name

    def mutator_for(self, island: int) -> str:
        try:
            return self.assignment[int(island)]
        except KeyError:
            raise ValueError(f"island {island} has no mutator assigned") from None


@ray.remote(num_cpus=0)
class MutatorPoolActor:
    """Async Ray shell: holds the pool and runs each mutation through the shared runner
    (:func:`milo_ray.search.mutation.run_mutation_async`: a Ray task per mutation, the
    mutator built once per worker process, the time cap, validation in a subprocess)
    under the spec's concurrency limit."""

    def __init__(self, specs: list, time_cap_s: float, max_concurrent: Any, task_num_cpus: float,
                 validation: ValidationOptions | None = None, scope: str | None = None,
                 env: dict | None = None) -> None:
        self._pool = MutatorPool(specs, time_cap_s=time_cap_s, max_concurrent=max_concurrent)
        self._sems = {n: asyncio.Semaphore(l) for n, l in self._pool.limits.items()}
        self._num_cpus = float(task_num_cpus)
        self._validation = validation
        self._scope = scope  # the run session whose agents the mutation tasks reuse
        self._env = dict(env or {})  # the agents' key variables, for mutation tasks on any node

    def names(self) -> list:
        return list(self._pool.names)

    def assignment(self) -> dict:
        return dict(self._pool.assignment)

    def assign(self, island: int, name: str) -> None:
        self._pool.assign(island, name)

    def mutator_for(self, island: int) -> str:
        return self._pool.mutator_for(island)

    async def mutate(self, name: str, request: MutationRequest, shipped: ShippedFiles | None = None,
                     ticket: RoleCallTicket | None = None) -> MutationOutcome:
        """``shipped``: the request's files, packed by the driver (this actor's node may
        not be the driver's machine: a ``ray://`` driver); ``ticket``: the journal ticket
        the agent's model calls are journaled under."""
        spec = self._pool.spec(name)
        async with self._sems[name]:
            return await run_mutation_async(spec, request, time_cap_s=self._pool.time_cap_s,
                                            validation=self._validation, num_cpus=self._num_cpus,
                                            scope=self._scope, env=self._env, shipped=shipped, ticket=ticket,
                                            keep_files=False)  # the driver keeps them (MiloRun._mutate)
