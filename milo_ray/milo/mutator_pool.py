"""The mutator pool G (papers/000 §4.1.2): mutator specs, the island -> mutator
assignment m^(r), the seats each spec may use at once, the per-mutation time cap, and
the fair queue that hands seats out.

Owns the plain objects, unit-tested without Ray: :class:`MutatorPool` (specs by name,
seats, accounts, the assignment as a projection of MILO's events), :class:`FairSeats`
(seats of one resource shared fairly by several keys: the islands of a run, or the runs
of a cluster) and :func:`account_of` (which mutators share an account). The Ray actors
that hold them during a run live in :mod:`milo_ray.milo.mutator_pool_actor`.

Seats: a spec's ``seats`` key is how many of its mutations may run at once. Without
it the spec gets ``method.mutator_concurrency`` seats in this run only (one run's
limit, as before seats existed). With it the limit is the account's: every spec of
every run on the cluster that uses the same account (:func:`account_of`) draws from one
count, held by a detached actor (a CLI agent or a provider account limits concurrent
sessions, whichever run opens them).
"""

from __future__ import annotations

import hashlib
import shlex
from collections import deque
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from milo_ray.llm.accounts import key_env
from milo_ray.milo.events import Init, IslandFounded, Reassign

SEATS_KEY = "seats"  # a pool-level key of a mutator spec: never handed to the mutator's constructor


@dataclass(frozen=True)
class Lease:
    """A granted seat: the mutation ``lease_id`` of island ``island`` runs ``mutator``
    (its ``spec``, without pool keys) under the cap ``time_cap_s``."""

    lease_id: str
    island: int
    mutator: str
    spec: dict[str, Any]
    time_cap_s: float


def seats_of(spec: Mapping[str, Any], index: int = 0) -> int | None:
    """A spec's declared ``seats`` (None: not declared); ``ValueError`` names the key."""
    seats = spec.get(SEATS_KEY)
    if seats is None:
        return None
    if isinstance(seats, bool) or not isinstance(seats, int) or seats < 1:
        raise ValueError(f"backend.agents.mutators[{index}].{SEATS_KEY}={seats!r}: expected an integer >= 1 "
                         "(concurrent mutations the mutator's account allows), or leave it out "
                         "(method.mutator_concurrency per run)")
    return int(seats)


def account_of(spec: Mapping[str, Any]) -> tuple[str, str]:
    """(a readable label, a stable key) of the account a mutator spec's sessions count
    against. A CLI agent (``preset``/``command``): its binary. An LLM agent (``llm`` or
    ``gateway.llm``): the provider key's variable name and the api base. Anything else:
    its class and name. The key is a hash: an api base may carry credentials, and no
    key value is ever read (only the variable's name)."""
    if spec.get("preset") or spec.get("command"):
        label = "cli:" + _cli_binary(spec)
    else:
        llm = spec.get("llm")
        gateway = spec.get("gateway")
        if not isinstance(llm, Mapping) and isinstance(gateway, Mapping) and isinstance(gateway.get("llm"), Mapping):
            llm = gateway["llm"]
        if isinstance(llm, Mapping) and llm.get("model"):
            # No key variable named: the one litellm reads for the provider (as the rate limits' accounts).
            var = key_env({"api_key_env": llm.get("api_key_env"), "solver": str(llm["model"])}) \
                or "provider:" + str(llm["model"]).split("/", 1)[0]
            label = f"api:{var}"
            return label, _digest(label, str(llm.get("api_base") or ""))
        label = f"agent:{spec.get('_target_')}:{spec.get('name') or spec.get('personality') or ''}"
    return label, _digest(label)


def _cli_binary(spec: Mapping[str, Any]) -> str:
    if spec.get("preset"):
        from milo_ray.agents.mutators.cli import PRESETS  # only for CLI specs

        preset = PRESETS.get(str(spec["preset"]))
        return str(preset["command"][0]) if preset else str(spec["preset"])
    command = spec["command"]
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    return argv[0].rsplit("/", 1)[-1] if argv else ""


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


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
    """Specs by name, their seats and accounts, the time cap, and the assignment.

    The assignment changes only by :meth:`apply` of MILO's events (``milo.init``,
    ``milo.reassign``, ``milo.island``) or by :meth:`assign`, so a pool rebuilt from a
    run's events holds the run's assignment."""

    def __init__(self, specs: Sequence[Mapping[str, Any]], *, time_cap_s: float = 2700.0,
                 max_concurrent: int | Mapping[str, int] = 8) -> None:
        if not specs:
            raise ValueError("mutator pool: no mutator specs (backend.agents.mutators is empty)")
        if time_cap_s <= 0:
            raise ValueError(f"mutator pool: time_cap_s={time_cap_s} must be > 0")
        names = spec_names(specs)
        declared = {n: seats_of(s, i) for i, (n, s) in enumerate(zip(names, specs))}
        self.specs: dict[str, dict[str, Any]] = {n: {k: v for k, v in s.items() if k != SEATS_KEY}
                                                 for n, s in zip(names, specs)}
        self.names = names
        self.time_cap_s = float(time_cap_s)
        if isinstance(max_concurrent, Mapping):
            per_run = {n: int(max_concurrent.get(n, 8)) for n in names}
        else:
            per_run = {n: int(max_concurrent) for n in names}
        # Declared seats replace the per-run default: the account's limit is also this run's.
        self.limits = {n: declared[n] if declared[n] is not None else per_run[n] for n in names}
        for n, lim in self.limits.items():
            if lim < 1:
                raise ValueError(f"mutator pool: concurrency limit of {n!r} is {lim}; must be >= 1")
        # name -> (label, key) of the account whose seats the cluster shares; None: this run's own seats.
        self.accounts: dict[str, tuple[str, str] | None] = {
            n: account_of(specs[i]) if declared[n] is not None else None for i, n in enumerate(names)}
        self.assignment: dict[int, str] = {}

    def apply(self, event: Any) -> None:
        """Follow an assignment event of the run (others are not the pool's)."""
        if isinstance(event, Init):
            for j, name in event.assignment.items():
                self.assign(int(j), name)
        elif isinstance(event, (Reassign, IslandFounded)):
            self.assign(event.island, event.mutator)

    def lease(self, lease_id: str, island: int) -> Lease:
        """The seat island ``island``'s next mutation asks for: its mutator now, the spec
        and the cap."""
        name = self.mutator_for(island)
        return Lease(str(lease_id), int(island), name, self.spec(name), self.time_cap_s)

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


@dataclass
class _Request:
    lease_id: str
    key: Hashable
    limit: int
    seq: int


class FairSeats:
    """Seats of one resource, handed to waiting requests fairly across keys.

    A request asks for one seat under its own ``limit`` (it is granted while fewer than
    ``limit`` seats are held). When seats free up, the waiting key holding the fewest
    seats goes first (ties: its oldest request), so no key starves while another holds
    the seats: an island with one mutation queued is served before a second seat goes to
    an island already holding one. Requests are idempotent by lease id (a holder that
    lost its answer asks again and gets the same seat). A seat may be given a deadline
    (:meth:`hold_until`), after which :meth:`expire` takes it back: a holder that died
    cannot keep a shared account's seat. No clock of its own: callers pass ``now``.
    """

    def __init__(self) -> None:
        self.held: dict[str, tuple[Hashable, float | None]] = {}  # lease id -> (key, expires at)
        self._waiting: dict[Hashable, deque[_Request]] = {}
        self._queued: dict[str, _Request] = {}
        self._seq = 0

    def request(self, lease_id: str, key: Hashable, limit: int) -> list[str]:
        """Queue a request (a no-op for a lease already held or queued); returns the
        leases granted by this call (they hold seats from now on)."""
        if int(limit) < 1:
            raise ValueError(f"seat limit {limit} must be >= 1")
        if lease_id not in self.held and lease_id not in self._queued:
            req = _Request(lease_id, key, int(limit), self._seq)
            self._seq += 1
            self._queued[lease_id] = req
            self._waiting.setdefault(key, deque()).append(req)
        return self._grant()

    def release(self, lease_id: str) -> list[str]:
        """Free a held seat or withdraw a queued request (unknown ids are ignored);
        returns the leases granted in its place."""
        self.held.pop(lease_id, None)
        req = self._queued.pop(lease_id, None)
        if req is not None:
            self._waiting[req.key].remove(req)
        return self._grant()

    def adopt(self, lease_id: str, key: Hashable, *, expires_at: float | None = None) -> None:
        """Hold a seat granted before (a holder's state rebuilt): held whatever the limit."""
        self.release(lease_id)
        self.held[lease_id] = (key, expires_at)

    def hold_until(self, lease_id: str, expires_at: float) -> None:
        """Give a held seat a deadline (a grant has none)."""
        self.held[lease_id] = (self.held[lease_id][0], float(expires_at))

    def expire(self, now: float) -> list[str]:
        """Take back seats whose deadline passed; returns the leases granted instead."""
        for lease_id in [k for k, (_, t) in self.held.items() if t is not None and t <= now]:
            del self.held[lease_id]
        return self._grant()

    def next_deadline(self) -> float | None:
        deadlines = [t for _, t in self.held.values() if t is not None]
        return min(deadlines) if deadlines else None

    def waiting(self) -> list[str]:
        return sorted(self._queued, key=lambda k: self._queued[k].seq)

    def holders(self) -> dict[Hashable, int]:
        """key -> seats it holds."""
        out: dict[Hashable, int] = {}
        for key, _ in self.held.values():
            out[key] = out.get(key, 0) + 1
        return out

    def _grant(self) -> list[str]:
        granted: list[str] = []
        while True:
            held_by = self.holders()
            heads = [q[0] for q in self._waiting.values() if q and len(self.held) < q[0].limit]
            if not heads:
                return granted
            req = min(heads, key=lambda r: (held_by.get(r.key, 0), r.seq))
            self._waiting[req.key].popleft()
            del self._queued[req.lease_id]
            self.held[req.lease_id] = (req.key, None)
            granted.append(req.lease_id)
