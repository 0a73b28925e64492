"""Per-model request and token rate limits shared by every process of a run.

A provider limits an account, not a process: the rollouts of a run call the same model
from many Ray workers at once, so the limit (``model.rpm``, ``model.tpm``) is kept in
one place per model id.

* :class:`RateBudget`: the plain decision object. Request slots are spaced
  ``window_s / rpm`` apart (a token bucket of size one: no bursts, so no 60-s window,
  however it is aligned, ever sees more than ``rpm`` requests plus one); tokens are
  counted in a sliding window of ``window_s`` from the usage callers report after each
  call, and a new request waits while the window's tokens have reached ``tpm``. A
  request's own tokens are unknown until it returns, so concurrent requests admitted
  under the cap can overshoot it by their own size; the next ones then wait longer.
* :class:`RateLimitActor`: a thin Ray actor around one budget, named per model id in
  the run's namespace and owned by the process that first asks for it (the driver, when
  it builds a limiter before starting work), so it lives and dies with the run.
* :class:`SharedRateLimiter`: a LangChain ``BaseRateLimiter`` (``acquire`` /
  ``aacquire``) plus :meth:`~SharedRateLimiter.report_tokens`; it talks to the actor
  when Ray is initialized and to a process-wide budget otherwise.

Waits are decided by the budget and slept by the caller: the actor never blocks, so one
actor serves any number of waiting callers.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

from langchain_core.rate_limiters import BaseRateLimiter

MINUTE_S = 60.0
_ACTOR_PREFIX = "milo_ray.rate_limit:"


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
    """One model's :class:`RateBudget` in a Ray actor (decorated when first used, so this
    module imports without Ray). Methods never block: waits are slept by the callers."""

    def __init__(self, rpm: int | None, tpm: int | None, window_s: float = MINUTE_S) -> None:
        self.budget = RateBudget(rpm, tpm, window_s=window_s)

    def reserve(self, blocking: bool = True) -> float | None:
        return self.budget.reserve(blocking=blocking)

    def report(self, tokens: int) -> None:
        self.budget.report(tokens)

    def limits(self) -> tuple[int | None, int | None, float]:
        return self.budget.rpm, self.budget.tpm, self.budget.window_s


# Process-wide state: the local budgets (no Ray) and the actor handles. Holding a handle
# here keeps a named, non-detached actor alive for as long as this process lives.
_local: dict[tuple[str, int | None, int | None, float], tuple[RateBudget, threading.Lock]] = {}
_actors: dict[tuple[str, str], tuple[Any, tuple[Any, ...]]] = {}
_registry_lock = threading.Lock()


def _ray_ready() -> bool:
    ray = sys.modules.get("ray")  # never import Ray just to learn that nobody started it
    return ray is not None and ray.is_initialized()


def actor_name(model_id: str) -> str:
    return _ACTOR_PREFIX + str(model_id)


def _actor(model_id: str, rpm: int | None, tpm: int | None, window_s: float) -> Any:
    import ray

    key = (ray.get_runtime_context().namespace, model_id)
    want = (rpm, tpm, float(window_s))
    with _registry_lock:
        if key not in _actors:
            remote = ray.remote(num_cpus=0, max_restarts=-1)(RateLimitActor)
            handle = remote.options(name=actor_name(model_id), get_if_exists=True).remote(rpm, tpm, window_s)
            _actors[key] = (handle, tuple(ray.get(handle.limits.remote())))
        handle, have = _actors[key]
    if have != want:
        raise ValueError(f"model.rpm/model.tpm of {model_id}: this run already limits it to rpm={have[0]}, "
                         f"tpm={have[1]}; one model id has one limit per run")
    return handle


class SharedRateLimiter(BaseRateLimiter):
    """The rate limit of one model id for every caller of the run.

    ``acquire`` / ``aacquire`` take a request slot (waiting for it when ``blocking``);
    :meth:`report_tokens` counts a finished request's tokens against ``tpm``. Picklable:
    it carries only the limits and finds the budget (Ray actor or process-local) where
    it is used."""

    def __init__(self, model_id: str, rpm: int | None, tpm: int | None, *, window_s: float = MINUTE_S) -> None:
        RateBudget(rpm, tpm, window_s=window_s)  # validate here, where the config is known
        self.model_id, self.rpm, self.tpm, self.window_s = str(model_id), rpm, tpm, float(window_s)
        if _ray_ready():
            # The driver's handle owns the actor: it lives as long as the run's driver.
            _actor(self.model_id, rpm, tpm, self.window_s)

    def __getstate__(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "rpm": self.rpm, "tpm": self.tpm, "window_s": self.window_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _local(self) -> tuple[RateBudget, threading.Lock]:
        key = (self.model_id, self.rpm, self.tpm, self.window_s)
        with _registry_lock:
            if key not in _local:
                _local[key] = (RateBudget(self.rpm, self.tpm, window_s=self.window_s), threading.Lock())
            return _local[key]

    def _reserve(self, blocking: bool) -> float | None:
        if _ray_ready():
            import ray

            return ray.get(_actor(self.model_id, self.rpm, self.tpm, self.window_s).reserve.remote(blocking))
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
            handle = _actor(self.model_id, self.rpm, self.tpm, self.window_s)
            wait = await handle.reserve.remote(blocking)
        else:
            wait = self._reserve(blocking)  # a dict update under a lock: never blocks the loop for long
        if wait is None:
            return False
        if wait > 0:
            await asyncio.sleep(wait)
        return True

    def report_tokens(self, tokens: int) -> None:
        if self.tpm is None or tokens <= 0:
            return
        if _ray_ready():
            # Fire and forget: the actor processes calls in order, so the next reserve sees it.
            _actor(self.model_id, self.rpm, self.tpm, self.window_s).report.remote(int(tokens))
            return
        budget, lock = self._local()
        with lock:
            budget.report(int(tokens))


def rate_limiter_for(cfg: Any, *, window_s: float = MINUTE_S) -> SharedRateLimiter | None:
    """The shared limiter of ``cfg`` (a ModelConfig or its mapping) from ``rpm`` / ``tpm``
    keyed by its ``id`` (else ``solver``); None when both are unlimited."""
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    rpm, tpm = get("rpm"), get("tpm")
    if rpm is None and tpm is None:
        return None
    ident = get("id") or get("solver")
    if not ident:
        raise ValueError("model.rpm/model.tpm: the model has neither id nor solver to key its rate limit by")
    return SharedRateLimiter(str(ident), None if rpm is None else int(rpm), None if tpm is None else int(tpm),
                             window_s=window_s)
