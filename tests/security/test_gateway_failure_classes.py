"""Who decides that a rollout failed for the infrastructure's sake: the gateway, never the
harness. A harness that writes a wrong answer and then provokes a provider 400 (or says
``endpoint_error`` about itself) is scored, not re-rolled; only a call the gateway saw fail
past its retries (429, 5xx, timeouts, dropped connections) makes an infrastructure
failure, and the run retries one harness's rollouts only so often. Real harnesses in real
bwrap sandboxes and real clients against the real gateway and a real HTTP upstream."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from milo_ray.core.rollouts import InfraFailure, RolloutRequest
from milo_ray.boundary.gateway.server import ModelGateway
from milo_ray.execution.outcomes import RetryPolicy, infra_result
from milo_ray.harness.model import Harness
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, error, reply

from hostile import make_secret_task

KEY_ENV = "MILO_FAILURE_CLASS_TEST_KEY"
SANDBOX = {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

# Each marker in a prompt makes the scripted provider answer so.
ANSWERS = {"PROVOKE-400": 400, "PROVOKE-401": 401, "PROVOKE-403": 403, "PROVOKE-404": 404, "PROVOKE-413": 413,
           "PROVOKE-422": 422, "OUTAGE-503": 503, "OUTAGE-500": 500, "OUTAGE-429": 429}


def _provider(body: dict) -> Reply:
    said = json.dumps(body.get("messages"))
    for marker, status in ANSWERS.items():
        if marker in said:
            return error(status)
    return reply("fine", prompt_tokens=12, completion_tokens=3)


def _cfg(url: str) -> dict:
    return {"solver": "openai/scripted", "api_base": url, "max_retries": 0, "usd_per_mtok_input": 1.0,
            "usd_per_mtok_output": 1.0, "max_output_tokens": 64}


def _calls(url: str, tmp_path, prompts: list[str]):
    """Each prompt sent in turn by the openai client on one grant; returns the grant."""
    import httpx
    import openai

    async def go():
        gw = ModelGateway(_cfg(url), tmp_path / "gw.sock")
        gw.set_key("sk-upstream")
        await gw.start()
        grant = gw.issue("h/t")
        client = openai.AsyncOpenAI(api_key=grant.token, base_url="http://gateway/v1", max_retries=0,
                                    http_client=httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=gw.socket_path)))
        for prompt in prompts:
            # A string is the prompt; a dict, more of the request (e.g. a provider-run tool).
            extra = prompt if isinstance(prompt, dict) else {}
            text = "hello" if extra else prompt
            try:
                await client.chat.completions.create(model="any", messages=[{"role": "user", "content": text}],
                                                     **extra)
            except openai.APIStatusError:
                pass
        await client.close()
        await gw.close()
        return grant

    return asyncio.run(go())


@pytest.mark.parametrize("marker", ["PROVOKE-400", "PROVOKE-401", "PROVOKE-403", "PROVOKE-404", "PROVOKE-413",
                                    "PROVOKE-422"])
def test_a_request_the_provider_refuses_is_the_requests_failure_never_the_endpoints(tmp_path, marker):
    with ScriptedOpenAIServer(_provider) as srv:
        grant = _calls(srv.url, tmp_path, ["hello", marker])
    (failure,) = grant.failures
    assert (failure["class"], failure["status"], failure["call"]) == ("request", ANSWERS[marker], 1)
    assert grant.endpoint_failure() is None


@pytest.mark.parametrize("marker", ["OUTAGE-503", "OUTAGE-500", "OUTAGE-429"])
def test_an_endpoint_failure_past_the_retries_is_classed_infra_by_the_gateway(tmp_path, marker):
    with ScriptedOpenAIServer(_provider) as srv:
        grant = _calls(srv.url, tmp_path, [marker])
    (failure,) = grant.failures
    assert (failure["class"], failure["status"]) == ("infra", ANSWERS[marker])
    assert grant.endpoint_failure() and str(ANSWERS[marker]) in grant.endpoint_failure()


def test_a_provoked_refusal_after_an_outage_leaves_no_endpoint_failure_to_claim(tmp_path):
    """Only the call the agent failed on counts: an outage the harness rode out earlier
    cannot be cashed in by a 400 it provokes later."""
    with ScriptedOpenAIServer(_provider) as srv:
        grant = _calls(srv.url, tmp_path, ["OUTAGE-503", "hello", "PROVOKE-400"])
    assert [f["class"] for f in grant.failures] == ["infra", "request"]
    assert grant.endpoint_failure() is None


@pytest.mark.parametrize("marker", ["PROVOKE-401", "PROVOKE-403"])
def test_a_refused_key_is_the_endpoints_failure_until_the_provider_has_accepted_it(tmp_path, marker):
    """A 401/403 before any answer may be the host's key going bad: infrastructure, so the
    run retries and records it instead of scoring every rollout 0. Once the key has been
    answered, the same status is the request's."""
    with ScriptedOpenAIServer(_provider) as srv:
        grant = _calls(srv.url, tmp_path, [marker, "hello", marker])
    assert [(f["class"], f["status"]) for f in grant.failures] == [("infra", ANSWERS[marker]),
                                                                  ("request", ANSWERS[marker])]
    assert grant.endpoint_failure() is None


def test_a_refused_request_after_an_outage_leaves_no_endpoint_failure_to_claim(tmp_path):
    web_search = {"tools": [{"type": "web_search"}]}
    with ScriptedOpenAIServer(_provider) as srv:
        grant = _calls(srv.url, tmp_path, ["OUTAGE-503", web_search])
    assert [f["class"] for f in grant.failures] == ["infra", "refused"]
    assert grant.endpoint_failure() is None


def test_refused_requests_are_counted_and_only_the_first_kept(tmp_path):
    """A harness may send any number of requests the gateway refuses: they cost the
    provider nothing, and the grant does not grow with them."""
    from milo_ray.boundary.gateway.ledger import KEPT_REFUSALS

    with ScriptedOpenAIServer(_provider) as srv:
        grant = _calls(srv.url, tmp_path, [{"tools": [{"type": "code_interpreter"}]}] * (KEPT_REFUSALS + 20))
        assert srv.requests == []
    assert grant.refusals == KEPT_REFUSALS + 20 and len(grant.failures) == KEPT_REFUSALS
    assert grant.calls == []


def test_one_harness_cannot_make_the_run_retry_it_without_end():
    policy = RetryPolicy(max_retries=3, backoff_s=0.0, max_harness_retries=4)
    granted = [policy.backoff(1, "greedy") for _ in range(6)]
    assert granted == [0.0, 0.0, 0.0, 0.0, None, None]
    # Another harness keeps its own retries; the per-rollout bound still holds for it.
    assert policy.backoff(1, "other") == 0.0 and policy.backoff(4, "other") is None
    result = infra_result(RolloutRequest("greedy", "t", 0, seed=1), 1, "model endpoint: 503", policy)
    assert result.error_kind == "infra" and "max_harness_retries" in result.error
    with pytest.raises(ValueError, match="max_harness_retries"):
        RetryPolicy(max_harness_retries=-1)


def test_the_scheduler_stops_retrying_a_harness_once_it_used_the_runs_retries(ray_local):
    """Three rollouts of one harness whose every attempt is an infrastructure failure: each
    may be retried 3 times, the harness 2 times in all, so 5 attempts run, not 12."""
    from milo_ray.core.tasks import Task
    from milo_ray.execution.scheduler import RolloutScheduler
    from milo_ray.store import MemoryRunStore

    harness = Harness.from_source("def build_agent(model, backend):\n    return 'flaky'\n")
    # SleepExecutor reports the task's out-of-contract score: an infrastructure failure.
    tasks = {"bad": Task("bad", "search", "x", 30.0, 1000, {"score": 1.5})}
    store = MemoryRunStore(run_id="bound")
    sched = RolloutScheduler({"_target_": "milo_ray.execution.fake.SleepExecutor", "seconds": 0.0}, tasks, store,
                             model_id="m", run_id="bound", max_retries=3, retry_backoff_s=0.0,
                             max_harness_retries=2, progress=False)
    try:
        sched.add_harness(harness)
        results = sched.run([RolloutRequest(harness.harness_id, "bad", i, seed=1) for i in range(3)])
    finally:
        sched.close()
    assert all(r.error_kind == "infra" for r in results)
    assert sum(r.attempts for r in results) == 3 + 2
    assert sum("max_harness_retries" in r.error for r in results) >= 1


# --- real harnesses in bwrap ---------------------------------------------------------------
_HARNESS = '''
from langchain_core.messages import AIMessage, HumanMessage


class _Agent:
    def __init__(self, model):
        self.model = model

    async def astream(self, inputs, config=None, stream_mode=None):
        with open("/app/answer.txt", "w") as f:
            f.write("0000")  # a wrong answer
        yield {{"messages": [HumanMessage(content="task"), AIMessage(content="answered")]}}
        # Now ask the provider for something it answers with an error, and fail on it:
        # the model client's exception makes the harness process report endpoint_error.
        await self.model.ainvoke({prompt!r})


def build_agent(model, backend):
    return _Agent(model)
'''


def _run(srv, tmp_path, prompt: str):
    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.execution.agent_executor import AgentExecutor

    make_secret_task(tmp_path / "tasks")
    task = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0}).task("secret")
    harness = Harness.from_source(_HARNESS.format(prompt=prompt), name="reroll")
    executor = AgentExecutor(model={**_cfg(srv.url), "api_key_env": KEY_ENV, "request_timeout_s": 30},
                             sandbox=SANDBOX)
    return asyncio.run(executor.aexecute(harness, task, 0, 0))


@pytest.mark.slow
@needs_bwrap
def test_a_harness_that_provokes_a_400_after_a_wrong_answer_is_scored_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "local-test-key")
    with ScriptedOpenAIServer(_provider) as srv:
        result = _run(srv, tmp_path, "PROVOKE-400 please")
    # No InfraFailure: the rollout is the harness's failure, graded as it stands.
    assert result.error_kind == "harness" and result.score == 0.0
    assert "gateway recorded none" in result.error  # its endpoint_error claim kept, not believed
    (failure,) = result.trace["trajectory"]["gateway_failures"]
    assert (failure["class"], failure["status"]) == ("request", 400)


@pytest.mark.slow
@needs_bwrap
def test_a_harness_whose_call_the_endpoint_failed_is_an_infrastructure_failure(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "local-test-key")
    with ScriptedOpenAIServer(_provider) as srv:
        with pytest.raises(InfraFailure, match="503") as info:
            _run(srv, tmp_path, "OUTAGE-503 now")
    assert len(info.value.model_calls) == 1 and info.value.model_calls[0]["error"]
