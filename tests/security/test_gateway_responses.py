"""The gateway's OpenAI Responses route (``/v1/responses``, what the Codex CLI speaks), driven
by the ``openai`` client's Responses API as a sandboxed CLI would drive it: each call, streamed
or not, goes to the configured model as a chat completion and is metered on the caller's grant
with the tokens and USD the upstream billed; a
revoked token is refused and costs nothing."""

from __future__ import annotations

import json
from urllib.parse import unquote, urlsplit

import pytest

from milo_ray.llm.client import use_secrets
from milo_ray.boundary.gateway.mutation import MutationGateway
from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, reply, tool_call

KEY = "sk-responses-route-canary-0a1b2c3d"
PRICES = {"usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0}
SHELL = {"type": "function", "name": "shell", "description": "run a command", "strict": False,
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}


def _answer(body: dict) -> Reply:
    """The scripted upstream: a tool call when asked to run something, text otherwise; the
    token counts differ per prompt so that each call's metering is told apart."""
    said = json.dumps(body["messages"])
    if "run ls" in said and '"role": "tool"' not in said:
        return tool_call("shell", {"cmd": "ls"}, prompt_tokens=23, completion_tokens=7)
    if "stream me" in said:
        return reply("streamed answer", prompt_tokens=17, completion_tokens=5)
    return reply("plain answer", prompt_tokens=11, completion_tokens=3)


@pytest.fixture(scope="module")
def route(tmp_path_factory):
    import httpx
    import openai

    with ScriptedOpenAIServer(_answer) as srv:
        gw = MutationGateway({"model": "openai/scripted", "api_base": srv.url, "api_key_env": "UPSTREAM_KEY",
                              "max_output_tokens": 64, "max_retries": 0, **PRICES})

        def client(token: str) -> openai.OpenAI:
            url = gw.base_url("openai")
            socket_path = unquote(urlsplit(url).netloc)
            http = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path))
            return openai.OpenAI(api_key=token, base_url="http://gateway" + urlsplit(url).path, http_client=http,
                                 max_retries=0)

        with use_secrets({"UPSTREAM_KEY": KEY}):
            yield gw, srv, client
        gw.close()


def _billed(srv: ScriptedOpenAIServer, since: int) -> tuple[int, int]:
    answered = srv.answered[since:]
    return sum(r.prompt_tokens for r in answered), sum(r.completion_tokens for r in answered)


def _price(tokens: tuple[int, int]) -> float:
    return (tokens[0] * PRICES["usd_per_mtok_input"] + tokens[1] * PRICES["usd_per_mtok_output"]) / 1e6


def test_a_plain_call_goes_to_the_configured_model_and_is_metered_as_the_upstream_billed(route):
    gw, srv, client = route
    token = gw.issue_token(role="mutator", caller="plain")
    since = len(srv.answered)
    got = client(token).responses.create(model="gpt-the-client-wants", input="say something", max_output_tokens=999,
                                         instructions="be brief", tool_choice="auto", tools=[SHELL])
    assert got.output_text == "plain answer"
    assert (got.usage.input_tokens, got.usage.output_tokens) == (11, 3)
    sent = srv.requests[-1]
    # The configured model and output cap, whatever the client asked (provider-run tools are
    # refused: tests/security/test_gateway_provider_tools.py).
    assert sent["model"] == "scripted" and sent["max_tokens"] == 64
    assert [t["function"]["name"] for t in sent["tools"]] == ["shell"] and "web_search_options" not in sent
    assert sent.get("tool_choice") in (None, "auto")
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    metered = gw.metered(token)
    assert (metered["input_tokens"], metered["output_tokens"]) == _billed(srv, since) == (11, 3)
    assert metered["calls"] == 1 and metered["cost_usd"] == pytest.approx(_price((11, 3)))


def test_a_streamed_call_delivers_responses_events_and_is_metered_as_the_upstream_billed(route):
    gw, srv, client = route
    token = gw.issue_token(role="mutator", caller="stream")
    since = len(srv.answered)
    events = list(client(token).responses.create(model="m", input=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "stream me"}]}], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "streamed answer"
    done = events[-1].response
    assert done.output_text == "streamed answer" and (done.usage.input_tokens, done.usage.output_tokens) == (17, 5)
    metered = gw.metered(token)
    assert (metered["input_tokens"], metered["output_tokens"]) == _billed(srv, since) == (17, 5)
    assert metered["cost_usd"] == pytest.approx(_price((17, 5)))


def test_a_tool_call_round_trip_streams_its_arguments_and_meters_both_calls(route):
    gw, srv, client = route
    token = gw.issue_token(role="mutator", caller="tools")
    since = len(srv.answered)
    ask = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run ls"}]}]
    events = list(client(token).responses.create(model="m", input=ask, tools=[SHELL], stream=True))
    (call,) = [e.item for e in events if e.type == "response.output_item.done"]
    assert call.type == "function_call" and call.name == "shell" and json.loads(call.arguments) == {"cmd": "ls"}
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == call.arguments
    follow = ask + [{"type": "function_call", "call_id": call.call_id, "name": "shell", "arguments": call.arguments},
                    {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}]
    second = client(token).responses.create(model="m", input=follow, tools=[SHELL])
    assert second.output_text == "plain answer"
    assert srv.requests[-1]["messages"][-1] == {"role": "tool", "content": "a.txt", "tool_call_id": call.call_id}
    metered = gw.metered(token)
    assert (metered["input_tokens"], metered["output_tokens"]) == _billed(srv, since) == (23 + 11, 7 + 3)
    assert metered["calls"] == 2


def test_a_revoked_or_unknown_token_is_refused_and_costs_nothing(route):
    import openai

    gw, srv, client = route
    token = gw.issue_token(role="mutator", caller="revoked")
    client(token).responses.create(model="m", input="say something")
    gw.revoke_token(token)
    answered = len(srv.answered)
    for stream in (False, True):
        with pytest.raises(openai.AuthenticationError, match="ended"):
            client(token).responses.create(model="m", input="say something", stream=stream)
    with pytest.raises(openai.AuthenticationError, match="unknown"):
        client("not-a-token").responses.create(model="m", input="say something")
    assert len(srv.answered) == answered and gw.metered(token)["calls"] == 1


def test_a_request_the_gateway_cannot_honour_is_refused_before_anything_is_spent(route):
    import openai

    gw, srv, client = route
    token = gw.issue_token(role="mutator", caller="bad")
    answered = len(srv.answered)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client(token).responses.create(model="m", input="more", previous_response_id="resp_123")
    with pytest.raises(openai.BadRequestError, match="input"):
        client(token).responses.create(model="m", input=[])
    assert len(srv.answered) == answered and gw.metered(token)["calls"] == 0
