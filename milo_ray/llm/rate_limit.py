"""Request and token rate limits per provider account, shared by every run on the cluster.

A provider limits an account, not a process nor a run: the rollouts of a run call the
model from many Ray workers at once, and the jobs of a sweep (each its own run, in its
own Ray namespace) call it at the same time. So the limit (``model.rpm``, ``model.tpm``:
the account's limit) is kept in one place per *account* -- the provider, the NAME of the
key's environment variable and the api base (:func:`account_of`; never the key itself) --
for the whole cluster.

* :class:`RateBudget`: the plain decision object. Request slots are spaced
  ``window_s / rpm`` apart (a token bucket of size one: no bursts, so no 60-s window,
  however it is aligned, ever sees more than ``rpm`` requests plus one); tokens are
  counted in a sliding window of ``window_s`` from the usage callers report after each
  call, and a new request waits while the window's tokens have reached ``tpm``. A
  request's own tokens are unknown until it returns, so concurrent requests admitted
  under the cap can overshoot it by their own size; the next ones then wait longer.
* :class:`RateLimitActor`: a thin Ray actor around one budget, *detached* and named per
  account in the cluster-wide namespace :data:`CLUSTER_NAMESPACE`, found or created with
  ``get_if_exists`` by whoever asks first (any run's driver, any sweep job's): it outlives
  the run that made it, so a run that ends never takes the limit away from the runs still
  calling. Two model configs on one account share it; when they give different limits the
  lower holds (:meth:`RateBudget.lower_to`) and a warning says so.
* :class:`SharedRateLimiter`: a LangChain ``BaseRateLimiter`` (``acquire`` /
  ``aacquire``) plus :meth:`~SharedRateLimiter.report_tokens`; it talks to the actor
  when Ray is initialized and to a process-wide budget per account otherwise.

Waits are decided by the budget and slept by the caller: the actor never blocks, so one
actor serves any number of waiting callers.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

from langchain_core.rate_limiters import BaseRateLimiter

from milo_ray.llm.accounts import account_of

MINUTE_S = 60.0
_ACTOR_PREFIX = "milo_ray.rate_limit:"
# The Ray namespace of everything shared by every run on a cluster (each run's driver has a
# namespace of its own): a named actor is found only within its namespace.
CLUSTER_NAMESPACE = "milo_ray_cluster"

log = logging.getLogger(__name__)


class RateBudget:
    """Request spacing for ``rpm`` and a sliding token window for ``tpm`` (either None:
    unlimited). ``window_s`` is the minute (tests shorten it); ``clock`` returns seconds."""

    def __init__(self, rpm: int | None, tpm: int | None, *, window_s: float = MINUTE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        for name, value in (("rpm", rpm), ("tpm", tpm)):
            if value is not None and int(value) < 1:
                raise ValueError(f"model.{name}={value}: must be an integer >= 1 (or null: unlimited)")
        if window_s <= 0:
            raise ValueError(f"RateBudget: window_s={window_s} must be > 0")
        self.rpm, self.tpm, self.window_s, self._clock = rpm, tpm, float(window_s), clock
        self._next_slot = float("-inf")
        self._spent: deque[tuple[float, int]] = deque()  # (reported at, tokens), oldest first
        self._spent_total = 0

    def lower_to(self, rpm: int | None, tpm: int | None) -> bool:
        """Hold the lower of the current limits and these (None: unlimited); whether one fell."""
        lowered = False
        if rpm is not None and (self.rpm is None or int(rpm) < self.rpm):
            self.rpm, lowered = int(rpm), True
        if tpm is not None and (self.tpm is None or int(tpm) < self.tpm):
            self.tpm, lowered = int(tpm), True
        return lowered

    def _expire(self, now: float) -> None:
        while self._spent and self._spent[0][0] <= now - self.window_s:
            self._spent_total -= self._spent.popleft()[1]

    def _token_ready_at(self, t: float) -> float:
        """The earliest time >= t at which the window's tokens are under ``tpm``."""
        if self.tpm is None or self._spent_total < self.tpm:
            return t
        remaining = self._spent_total
        for at, tokens in self._spent:  # oldest first: each one leaves the window at at + window_s
            remaining -= tokens
            if remaining < self.tpm:
                return max(t, at + self.window_s)
        return t  # unreachable: the window empties eventually

    def reserve(self, *, blocking: bool = True) -> float | None:
        """Reserve the next request slot: the seconds the caller must wait before sending.
        ``blocking=False``: reserve only a slot free now (0.0), else reserve nothing (None)."""
        now = self._clock()
        self._expire(now)
        start = self._token_ready_at(max(now, self._next_slot))
        if not blocking and start > now:
            return None
        if self.rpm is not None:
            self._next_slot = start + self.window_s / self.rpm
        return max(0.0, start - now)

    def report(self, tokens: int) -> None:
        """Count the tokens (input + output) of a finished request against ``tpm``."""
        if self.tpm is None or tokens <= 0:
            return
        now = self._clock()
        self._expire(now)
        self._spent.append((now, int(tokens)))
        self._spent_total += int(tokens)

    def spent(self) -> int:
        """Tokens counted in the current window."""
        self._expire(self._clock())
        return self._spent_total


class RateLimitActor:
    """One account's :class:`RateBudget` in a Ray actor (decorated when first used, so this
    module imports without Ray). Methods never block: waits are slept by the callers."""

    def __init__(self, rpm: int | None, tpm: int | None, window_s: float = MINUTE_S) -> None:
        self.budget = RateBudget(rpm, tpm, window_s=window_s)

    def reserve(self, blocking: bool = True) -> float | None:
        return self.budget.reserve(blocking=blocking)

    def report(self, tokens: int) -> None:
        self.budget.report(tokens)

    def declare(self, rpm: int | None, tpm: int | None) -> tuple[Any, ...]:
        """A config of this account gives these limits: the lower ones hold. Returns the
        limits held before and now: (rpm, tpm) before, then :meth:`limits`."""
        before = (self.budget.rpm, self.budget.tpm)
        self.budget.lower_to(rpm, tpm)
        return (*before, *self.limits())

    def limits(self) -> tuple[int | None, int | None, float]:
        return self.budget.rpm, self.budget.tpm, self.budget.window_s


# Process-wide state: the local budgets (no Ray) and the actor handles, each by account.
_local: dict[str, tuple[RateBudget, threading.Lock]] = {}
_actors: dict[str, Any] = {}
_declared: set[tuple[str, int | None, int | None]] = set()
_warned: set[tuple[str, Any, Any, Any]] = set()
_registry_lock = threading.Lock()


def _ray_ready() -> bool:
    ray = sys.modules.get("ray")  # never import Ray just to learn that nobody started it
    return ray is not None and ray.is_initialized()


def actor_name(account: str) -> str:
    return _ACTOR_PREFIX + str(account)


def _note_limits(account: str, want: tuple[Any, Any], before: tuple[Any, Any], have: tuple[Any, Any]) -> None:
    """Warn (once per process and case) when a config's limits differ from those its
    account held (``before`` it declared them) or holds now (``have``): the lower hold."""
    want, before, have = tuple(want), tuple(before), tuple(have)
    said = []
    if want != have:
        said.append(f"model.rpm={want[0]}, model.tpm={want[1]}: the provider account {account} is limited to "
                    f"rpm={have[0]}, tpm={have[1]} across the cluster (another config on the same account gives a "
                    "lower limit; the lower holds)")
    if before != have:
        said.append(f"model.rpm={want[0]}, model.tpm={want[1]}: lowers the limit of the provider account {account} "
                    f"from rpm={before[0]}, tpm={before[1]} (another config's) for every run on the cluster (the lower "
                    "holds)")
    for what in said:
        with _registry_lock:
            if what in _warned:
                continue
            _warned.add(what)
        log.warning("%s", what)


def _actor(account: str, rpm: int | None, tpm: int | None, window_s: float) -> Any:
    """The account's actor, these limits declared to it (once per process and limits)."""
    import ray

    with _registry_lock:
        handle = _actors.get(account)
        declared = (account, rpm, tpm) in _declared
    if handle is None:
        remote = ray.remote(num_cpus=0, max_restarts=-1)(RateLimitActor)
        # Detached, in the cluster's namespace: every run's driver and worker, every sweep
        # job, finds the same one, and it outlives the run that created it. On the head
        # node, which an autoscaler never removes.
        handle = remote.options(name=actor_name(account), namespace=CLUSTER_NAMESPACE, lifetime="detached",
                                get_if_exists=True, resources={"node:__internal_head__": 0.001}).remote(
            rpm, tpm, window_s)
        with _registry_lock:
            handle = _actors.setdefault(account, handle)
    if not declared:
        before_rpm, before_tpm, *have = ray.get(handle.declare.remote(rpm, tpm))
        if float(have[2]) != float(window_s):
            raise ValueError(f"rate limit of {account}: its window is {have[2]} s on this cluster, not {window_s} s")
        _note_limits(account, (rpm, tpm), (before_rpm, before_tpm), tuple(have[:2]))
        with _registry_lock:
            _declared.add((account, rpm, tpm))
    return handle


class SharedRateLimiter(BaseRateLimiter):
    """The rate limit of one provider account for every caller on the cluster.

    ``account``: the :func:`account_of` label; ``rpm`` / ``tpm``: the limits this config
    gives (the account holds the lowest any config gave). ``acquire`` / ``aacquire`` take a
    request slot (waiting for it when ``blocking``); :meth:`report_tokens` counts a
    finished request's tokens against ``tpm``. Picklable: it carries only the account and
    the limits and finds the budget (Ray actor or process-local) where it is used."""

    def __init__(self, account: str, rpm: int | None, tpm: int | None, *, window_s: float = MINUTE_S) -> None:
        RateBudget(rpm, tpm, window_s=window_s)  # validate here, where the config is known
        self.account, self.rpm, self.tpm, self.window_s = str(account), rpm, tpm, float(window_s)
        if _ray_ready():
            _actor(self.account, rpm, tpm, self.window_s)  # declared (and the limits compared) where the config is
        else:
            self._local()

    def __getstate__(self) -> dict[str, Any]:
        return {"account": self.account, "rpm": self.rpm, "tpm": self.tpm, "window_s": self.window_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _local(self) -> tuple[RateBudget, threading.Lock]:
        with _registry_lock:
            if self.account not in _local:
                _local[self.account] = (RateBudget(self.rpm, self.tpm, window_s=self.window_s), threading.Lock())
            budget, lock = _local[self.account]
        with lock:
            before = (budget.rpm, budget.tpm)
            budget.lower_to(self.rpm, self.tpm)
            have = (budget.rpm, budget.tpm)
        _note_limits(self.account, (self.rpm, self.tpm), before, have)
        return budget, lock

    def _handle(self) -> Any:
        return _actor(self.account, self.rpm, self.tpm, self.window_s)

    def _reserve(self, blocking: bool) -> float | None:
        if _ray_ready():
            import ray

            return ray.get(self._handle().reserve.remote(blocking))
        budget, lock = self._local()
        with lock:
            return budget.reserve(blocking=blocking)

    def acquire(self, *, blocking: bool = True) -> bool:
        wait = self._reserve(blocking)
        if wait is None:
            return False
        if wait > 0:
            time.sleep(wait)
        return True

    async def aacquire(self, *, blocking: bool = True) -> bool:
        if _ray_ready():
            wait = await self._handle().reserve.remote(blocking)
        else:
            wait = self._reserve(blocking)  # a dict update under a lock: never blocks the loop for long
        if wait is None:
            return False
        if wait > 0:
            await asyncio.sleep(wait)
        return True

    def report_tokens(self, tokens: int) -> None:
        # Reported even when this config gives no tpm: another config may limit the account's.
        if tokens <= 0:
            return
        if _ray_ready():
            # Fire and forget: the actor processes calls in order, so the next reserve sees it.
            self._handle().report.remote(int(tokens))
            return
        budget, lock = self._local()
        with lock:
            budget.report(int(tokens))


def rate_limiter_for(cfg: Any, *, window_s: float = MINUTE_S) -> SharedRateLimiter | None:
    """The shared limiter of ``cfg`` (a ModelConfig or its mapping) from ``rpm`` / ``tpm``,
    the limits of its provider account (:func:`account_of`); None when both are unlimited."""
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    rpm, tpm = get("rpm"), get("tpm")
    if rpm is None and tpm is None:
        return None
    return SharedRateLimiter(account_of(cfg), None if rpm is None else int(rpm), None if tpm is None else int(tpm),
                             window_s=window_s)
