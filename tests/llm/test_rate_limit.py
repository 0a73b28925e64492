"""The per-model rate limit: request spacing for rpm, a token window for tpm, shared by
every process of a run through one Ray actor. End-to-end tests send real HTTP through
litellm to the scripted server and measure when requests arrive there."""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
import time
import uuid

import pytest

from milo_ray.llm.client import build_chat_model
from milo_ray.llm.rate_limit import RateBudget, SharedRateLimiter, rate_limiter_for
from milo_ray.config.schemas import ModelConfig
from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV, ScriptedOpenAIServer, reply, scripted_model

KEY = SCRIPTED_KEY_ENV


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def cfg(url: str, **kw) -> ModelConfig:
    # A fresh id per test: limits are per model id and process-wide.
    return scripted_model(url, id=f"scripted-{uuid.uuid4().hex[:8]}", **kw)


def gaps(times: list[float]) -> list[float]:
    times = sorted(times)
    return [b - a for a, b in zip(times, times[1:])]


def test_rpm_spaces_reservations_evenly_and_never_bursts():
    clock = Clock()
    budget = RateBudget(rpm=60, tpm=None, clock=clock)
    assert [budget.reserve() for _ in range(3)] == [0.0, 1.0, 2.0]
    clock.t += 10  # idle time earns no burst: the next two are still a second apart
    assert [budget.reserve() for _ in range(2)] == [0.0, 1.0]


def test_non_blocking_reserve_takes_only_a_free_slot():
    clock = Clock()
    budget = RateBudget(rpm=60, tpm=None, clock=clock)
    assert budget.reserve(blocking=False) == 0.0
    assert budget.reserve(blocking=False) is None  # not free: nothing reserved
    clock.t += 1.0
    assert budget.reserve(blocking=False) == 0.0


def test_tpm_blocks_once_the_minute_is_spent_until_tokens_leave_the_window():
    clock = Clock()
    budget = RateBudget(rpm=None, tpm=1000, clock=clock)
    assert budget.reserve() == 0.0
    budget.report(600)
    clock.t += 10
    assert budget.reserve() == 0.0  # 600 < 1000: still open
    budget.report(500)  # 1100 spent in the window
    clock.t += 5
    assert budget.reserve() == pytest.approx(45.0)  # until the 600 reported at t=0 leave (t=60)
    clock.t += 45
    assert budget.spent() == 500 and budget.reserve() == 0.0


@pytest.mark.parametrize("field,kw", [("rpm", {"rpm": 0}), ("tpm", {"tpm": -5})])
def test_bad_limits_name_the_field(field, kw):
    with pytest.raises(ValueError, match=f"model.{field}="):
        ModelConfig(solver="openai/x", **kw).check()
    with pytest.raises(ValueError, match=f"model.{field}="):
        RateBudget(kw.get("rpm"), kw.get("tpm"))


def test_no_limits_no_limiter():
    assert rate_limiter_for(ModelConfig(solver="openai/x").check()) is None
    assert isinstance(rate_limiter_for(ModelConfig(solver="openai/x", rpm=10).check()), SharedRateLimiter)


def test_a_burst_of_calls_at_rpm_60_arrives_a_second_apart(key_env):
    n = 3
    with ScriptedOpenAIServer([reply("ok")]) as srv, ScriptedOpenAIServer([reply("warm")]) as warm_srv:
        build_chat_model(cfg(warm_srv.url)).invoke("warm up")  # client set-up, outside the measurement
        model = build_chat_model(cfg(srv.url, rpm=60))
        threads = [threading.Thread(target=model.invoke, args=("hi",)) for _ in range(n)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
    assert len(srv.request_times) == n
    assert min(gaps(srv.request_times)) > 0.85, gaps(srv.request_times)
    assert elapsed < (n - 1) * 1.0 + 3.0  # spaced, not stalled


def test_async_calls_take_their_slots_without_blocking_the_loop(key_env):
    with ScriptedOpenAIServer([reply("ok")]) as srv, ScriptedOpenAIServer([reply("warm")]) as warm_srv:
        model = build_chat_model(cfg(srv.url, rpm=150))  # 0.4 s apart

        async def burst():
            # litellm's async client is set up on first use, after the slot is taken:
            # warm it up on an unlimited model so arrivals measure the limiter.
            await build_chat_model(cfg(warm_srv.url)).ainvoke("warm up")
            await asyncio.gather(*(model.ainvoke("hi") for _ in range(3)))

        asyncio.run(burst())
    assert min(gaps(srv.request_times)) > 0.3, gaps(srv.request_times)


def test_a_pickled_limiter_shares_its_processes_budget():
    """A limiter crosses process boundaries by value; inside one process every copy
    draws from the same budget (here without Ray: the process-local fallback)."""
    a = SharedRateLimiter(f"m-{uuid.uuid4().hex[:8]}", rpm=1, tpm=None)
    b = pickle.loads(pickle.dumps(a))
    assert a.acquire(blocking=False) is True
    assert b.acquire(blocking=False) is False  # the one slot of the minute is taken


def test_without_rpm_the_same_burst_is_not_spaced(key_env):
    """The control of the test above: the spacing comes from the limit."""
    with ScriptedOpenAIServer([reply("ok")]) as srv:
        model = build_chat_model(cfg(srv.url))
        threads = [threading.Thread(target=model.invoke, args=("hi",)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert max(gaps(srv.request_times)) < 0.5, gaps(srv.request_times)


def test_tpm_holds_the_next_request_until_the_spent_tokens_expire(key_env):
    """The first answer reports 150 tokens against tpm=100 in a 1-s window: the second
    request waits for the window; with room left it does not."""
    for tpm, expect_wait in ((100, True), (10_000, False)):
        with ScriptedOpenAIServer([reply("ok", prompt_tokens=100, completion_tokens=50)]) as srv:
            m = cfg(srv.url, tpm=tpm)
            model = build_chat_model(m, rate_limiter=rate_limiter_for(m, window_s=1.0))
            model.invoke("first")
            model.invoke("second")
        (gap,) = gaps(srv.request_times)
        assert (gap > 0.8) == expect_wait, (tpm, gap)


def test_two_ray_workers_share_one_limit(key_env, ray_local):
    ray = ray_local

    @ray.remote(num_cpus=0)
    class Gate:
        """Both workers start calling together, so an unshared limit would show as
        pairs of simultaneous requests."""

        def __init__(self) -> None:
            self.arrived = 0

        def arrive(self) -> None:
            self.arrived += 1

        def open(self) -> bool:
            return self.arrived >= 2

    def calls_from_a_worker(m: ModelConfig, warm: ModelConfig, gate, n: int) -> int:
        # Defined here so that Ray ships it by value (tests/ is not importable on workers).
        os.environ[KEY] = "local-secret"
        # litellm's first request in a process sets up its client (a few hundred ms on a
        # busy machine) after the slot is taken; warm it up on an unlimited model so the
        # arrival times below measure the limiter.
        build_chat_model(warm).invoke("warm up")
        model = build_chat_model(m)  # the limiter of m.rpm, found by name in the run's namespace
        ray.get(gate.arrive.remote())
        while not ray.get(gate.open.remote()):
            time.sleep(0.01)
        for _ in range(n):
            model.invoke("hi")
        return os.getpid()

    with ScriptedOpenAIServer([reply("ok")]) as srv, ScriptedOpenAIServer([reply("warm")]) as warm_srv:
        m, warm = cfg(srv.url, rpm=120), cfg(warm_srv.url)  # rpm=120: one request per 0.5 s for the run
        limiter = rate_limiter_for(m)  # the driver creates (and owns) the model's actor
        with pytest.raises(ValueError, match="model.rpm/model.tpm"):
            rate_limiter_for(ModelConfig(**{**m.__dict__, "rpm": 5}))  # one model id, one limit
        task = ray.remote(num_cpus=1)(calls_from_a_worker)
        gate = Gate.remote()
        pids = ray.get([task.remote(m, warm, gate, 3), task.remote(m, warm, gate, 3)], timeout=120)
        assert limiter.acquire(blocking=True)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert len(srv.request_times) == 6
    # Slots are 0.5 s apart; arrivals jitter by the client's own overhead, so allow some.
    assert min(gaps(srv.request_times)) > 0.3, gaps(srv.request_times)
    assert sorted(srv.request_times)[-1] - sorted(srv.request_times)[0] > 5 * 0.5 - 0.3
