"""The rate limit per provider account: request spacing for rpm, a token window for tpm,
shared by every process of every run on the cluster through one detached Ray actor. End-to-end tests send real HTTP through
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
from milo_ray.llm.rate_limit import (CLUSTER_NAMESPACE, RateBudget, SharedRateLimiter, account_of, actor_name,
                                     rate_limiter_for)
from milo_ray.config.schemas import ModelConfig
from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV, ScriptedOpenAIServer, reply, scripted_model

KEY = SCRIPTED_KEY_ENV


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def cfg(url: str, **kw) -> ModelConfig:
    # Each scripted server is its own account (its URL is the api base).
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
        limiter = rate_limiter_for(m)  # the driver finds (or creates) the account's actor
        task = ray.remote(num_cpus=1)(calls_from_a_worker)
        gate = Gate.remote()
        pids = ray.get([task.remote(m, warm, gate, 3), task.remote(m, warm, gate, 3)], timeout=120)
        assert limiter.acquire(blocking=True)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert len(srv.request_times) == 6
    # Slots are 0.5 s apart; arrivals jitter by the client's own overhead, so allow some.
    assert min(gaps(srv.request_times)) > 0.3, gaps(srv.request_times)
    assert sorted(srv.request_times)[-1] - sorted(srv.request_times)[0] > 5 * 0.5 - 0.3


def test_configs_on_one_account_share_one_limiter_whatever_their_model():
    """The account is (provider, key variable, api base): two models, two ids, one endpoint
    and key draw from one budget; another endpoint or key variable is another account."""
    base = f"http://accounts-{uuid.uuid4().hex[:8]}:8000/v1"
    a = rate_limiter_for(ModelConfig(solver="openai/small", api_base=base, rpm=1).check())
    b = rate_limiter_for(ModelConfig(solver="openai/large", id="large-run", api_base=base + "/", rpm=1).check())
    assert a.account == b.account == f"openai|OPENAI_API_KEY|{base}"
    assert a.acquire(blocking=False) is True
    assert b.acquire(blocking=False) is False  # the account's one slot of the minute is taken
    other_key = rate_limiter_for(ModelConfig(solver="openai/small", api_base=base, api_key_env="TEAM_B_KEY",
                                             rpm=1).check())
    other_base = rate_limiter_for(ModelConfig(solver="openai/small", api_base=base + "x", rpm=1).check())
    assert other_key.acquire(blocking=False) is True and other_base.acquire(blocking=False) is True


def test_the_account_is_named_by_the_key_variable_never_the_key(monkeypatch):
    monkeypatch.setenv("TEAM_KEY", "sk-account-secret-value")
    label = account_of(ModelConfig(solver="anthropic/claude", api_key_env="TEAM_KEY").check())
    assert label == "anthropic|TEAM_KEY|-" and "sk-account" not in label and "sk-account" not in actor_name(label)


def test_different_limits_on_one_account_hold_the_lower_with_a_warning(caplog):
    base = f"http://lower-{uuid.uuid4().hex[:8]}:8000/v1"
    clock_free = rate_limiter_for(ModelConfig(solver="openai/a", api_base=base, rpm=600).check())
    with caplog.at_level("WARNING", logger="milo_ray.llm.rate_limit"):
        strict = rate_limiter_for(ModelConfig(solver="openai/b", api_base=base, rpm=60).check())
        assert strict.acquire(blocking=False) is True
        # rpm=600 would free the next slot after 0.1 s; the account's rpm=60 holds it for 1 s.
        time.sleep(0.2)
        assert clock_free.acquire(blocking=False) is False
    said = [r.getMessage() for r in caplog.records]
    assert any("model.rpm=60," in m and "lowers the limit" in m and "from rpm=600" in m for m in said), said


def test_the_account_limiter_is_one_detached_actor_in_the_cluster_namespace(ray_local, caplog):
    """Found by name from any namespace's driver (each run has its own), outliving the run
    that made it; a second config's lower limit holds for everyone, with a warning."""
    ray = ray_local
    base = f"http://cluster-{uuid.uuid4().hex[:8]}:8000/v1"
    m = ModelConfig(solver="openai/a", api_base=base, rpm=120, tpm=50_000).check()
    limiter = rate_limiter_for(m)
    handle = ray.get_actor(actor_name(limiter.account), namespace=CLUSTER_NAMESPACE)
    with pytest.raises(ValueError):  # not in this driver's (the run's) own namespace
        ray.get_actor(actor_name(limiter.account))
    from ray._private.state import actors

    (info,) = [a for a in actors().values() if a["Name"] == actor_name(limiter.account)]
    assert info["IsDetached"], info
    assert ray.get(handle.limits.remote()) == (120, 50_000, 60.0)
    with caplog.at_level("WARNING", logger="milo_ray.llm.rate_limit"):
        rate_limiter_for(ModelConfig(solver="openai/b", api_base=base, rpm=30).check())
    assert ray.get(handle.limits.remote()) == (30, 50_000, 60.0)
    said = [r.getMessage() for r in caplog.records]
    assert any("model.rpm=30, model.tpm=None" in m and "rpm=30, tpm=50000" in m for m in said), said
    assert any("lowers the limit" in m and "from rpm=120" in m for m in said), said
    ray.kill(handle)  # detached: it would outlive this test's driver
