"""The search's coding agents reach their model only through the model gateway.

MILO's mutator, MILO's graft agent (the orchestrator's) and SSR's optimizer are one
deepagents agent; each call's chat model gets a loopback base URL of the process's
:class:`~milo_ray.boundary.gateway.mutation.MutationGateway` and a token for that call.
Run for real (deepagents, langchain, litellm, bwrap) against a scripted OpenAI-compatible
upstream that records the credentials it is sent: the upstream sees the key only from
the gateway, the chat model holds no key, the token is refused once the call ended, and
the call's usage is what the upstream billed, as the gateway metered it (including a
retry the agent never saw)."""

from __future__ import annotations

import json
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from milo_ray.llm.client import use_secrets
from milo_ray.agents.mutators.deepagents import DeepAgentsMutator, transcript_path
from milo_ray.agents.orchestrators.llm import LLMOrchestrator
from milo_ray.harness.seeds import load_seeds
from milo_ray.testing import scripted_agents as sa
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deepagents_mutator import make_request  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the agent's sandbox needs bwrap")

KEY_ENV = "MILO_TEST_SEARCH_GW_KEY"
CANARY_KEY = "sk-search-agent-canary-0a1b2c3d4e5f"
PRICES = {"usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0}


class KeyRecordingServer(ScriptedOpenAIServer):
    """The scripted upstream, also recording the credential of every request."""

    def __init__(self, script: Any) -> None:
        super().__init__(script)
        self.credentials: list[str] = []

    def _handler(self) -> Any:
        base, server = super()._handler(), self

        class Handler(base):  # type: ignore[misc, valid-type]
            def do_POST(self) -> None:  # noqa: N802
                server.credentials.append(self.headers.get("Authorization", ""))
                super().do_POST()

        return Handler


def failing_once(policy: Any) -> Any:
    """``policy``, after one HTTP 500 the gateway retries (the agent never sees it)."""
    state = {"failed": False}

    def answer(body: dict[str, Any]) -> Reply:
        if not state["failed"]:
            state["failed"] = True
            return Reply(status=500)
        return policy(body)

    return answer


def llm(srv: ScriptedOpenAIServer) -> dict[str, Any]:
    return {"model": "openai/scripted", "api_base": srv.url, "api_key_env": KEY_ENV, "max_retries": 1,
            "retry_base_s": 0.01, "retry_max_s": 0.05, **PRICES}


def graft_request(root: Path) -> Any:
    donor = load_seeds(["plan_and_solve"])[0]
    ddir = donor.write_to(root / "nodes" / "donor")
    return make_request(root, context={"mode": "graft", "co_parent_source": donor.source, "co_parent_dir": str(ddir),
                                       "dest_island": 0, "donor_island": 1, "diagnosis": "island 0 stalls",
                                       "why": "island 1 checks its work"})


def ssr_request(root: Path) -> Any:
    memory = "# Experience records (1 of 1)\n\n## 1. t1 (score 0.00)\n\nIt stopped before testing.\n"
    return make_request(root, memory=memory, context={"records": [{"task_id": "t1"}], "scale": 1})


# role -> (its agent's call, its request, the instructions it follows): the three search
# agents that run a model loop, built as conf/backend/litellm.yaml builds them.
AGENTS = {
    "mutator": (lambda spec: DeepAgentsMutator(spec, name="deepagents").mutate, make_request, "mutate"),
    "graft": (lambda spec: LLMOrchestrator(spec).graft, graft_request, "graft"),
    "optimizer": (lambda spec: DeepAgentsMutator(spec, name="ssr-optimizer").mutate, ssr_request, "ssr_optimize"),
}


@pytest.fixture
def captured(monkeypatch):
    """The chat model each agent call is given (recorded as deepagents receives it)."""
    import deepagents

    models: list[Any] = []
    real = deepagents.create_deep_agent

    def create(model: Any, *args: Any, **kwargs: Any) -> Any:
        models.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(deepagents, "create_deep_agent", create)
    monkeypatch.delenv(KEY_ENV, raising=False)  # the key exists only as the task's secret
    return models


def _post(url: str, token: str) -> tuple[int, str]:
    body = json.dumps({"messages": [{"role": "user", "content": "again"}]}).encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize("role", sorted(AGENTS))
def test_a_search_agent_calls_its_model_only_through_the_gateway_and_is_charged_what_it_metered(
        role, tmp_path, captured):
    build, make, instructions = AGENTS[role]
    req = make(tmp_path)
    with KeyRecordingServer(failing_once(sa.mutator_policy)) as srv:
        with use_secrets({KEY_ENV: CANARY_KEY}):
            out = build(llm(srv))(req)
        assert out.child is not None, out.error
        assert sa.MARKER in out.child.source

        # The chat model the agent ran with holds a token and the gateway's loopback
        # address: neither the key nor the upstream endpoint.
        (model,) = captured
        assert CANARY_KEY not in repr(vars(model)) and model.api_key != CANARY_KEY
        assert model.api_base.startswith("http://127.0.0.1:") and srv.url not in repr(vars(model))

        # The upstream was sent the key, by the gateway alone: every request it saw
        # (the failed first attempt too) carried the key, none the agent's token.
        assert srv.credentials == [f"Bearer {CANARY_KEY}"] * len(srv.requests)
        assert len(srv.requests) == len(srv.answered) + 1  # the one retried 500

        # The usage is the gateway's ledger: what the upstream billed, priced by the
        # role's prices, with the retry the agent never saw.
        billed_in = sum(r.prompt_tokens for r in srv.answered)
        billed_out = sum(r.completion_tokens for r in srv.answered)
        assert (billed_in, billed_out) == (2300, 480)
        assert (out.usage.input_tokens, out.usage.output_tokens) == (billed_in, billed_out)
        assert out.usage.cost_usd == pytest.approx((billed_in * 1.0 + billed_out * 2.0) / 1e6)
        assert out.usage.retries == 1
        saved = json.loads(transcript_path(req).read_text())
        assert saved["instructions"] == instructions
        calls = saved["calls"]
        assert len(calls) == len(srv.answered) and sum(c["retries"] for c in calls) == 1

        # The call's token ended with the call: refused, and nothing more reaches the upstream.
        status, payload = _post(model.api_base + "/chat/completions", model.api_key)
        assert status == 401 and "ended" in payload, (status, payload)
        assert len(srv.requests) == len(srv.answered) + 1


def test_each_call_gets_its_own_token(tmp_path, captured):
    with KeyRecordingServer(sa.mutator_policy) as srv:
        agent = DeepAgentsMutator(llm(srv))
        with use_secrets({KEY_ENV: CANARY_KEY}):
            first = agent.mutate(make_request(tmp_path / "a"))
            second = agent.mutate(make_request(tmp_path / "b", task="t2"))
    assert first.child is not None and second.child is not None
    tokens = [m.api_key for m in captured]
    assert len(set(tokens)) == 2
    # Each call is charged its own calls only.
    assert [(o.usage.input_tokens, o.usage.output_tokens) for o in (first, second)] == [(2300, 480)] * 2


def test_a_missing_key_is_named_before_any_model_call(tmp_path, captured):
    with KeyRecordingServer(sa.mutator_policy) as srv:
        out = DeepAgentsMutator(llm(srv)).mutate(make_request(tmp_path))
    assert out.child is None and f"the environment variable {KEY_ENV} is not set" in out.error, out.error
    assert out.error.startswith("mutator setup failed: ") and not srv.requests and not captured
    assert out.usage.cost_usd == 0.0 and out.usage.tokens == 0
