"""A request cannot make the provider act for the caller outside the sandbox: on every
route the gateway serves (chat completions, Responses, Messages), any tool that is not one
the client runs itself -- web search, file search, code interpreter, MCP, Anthropic's
server tools, and any type not yet invented -- is refused with a 400 naming it, before
anything goes upstream, and noted on the grant. Real ``openai`` and ``anthropic`` clients
against the real gateway and a real HTTP upstream."""

from __future__ import annotations

import pytest

from milo_ray.llm.client import use_secrets
from milo_ray.boundary.gateway.mutation import MutationGateway
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

FUNCTION = {"type": "function", "function": {"name": "shell", "description": "run a command",
                                              "parameters": {"type": "object", "properties": {}}}}
RESPONSES_FUNCTION = {"type": "function", "name": "shell", "description": "run a command",
                      "parameters": {"type": "object", "properties": {}}}
ANTHROPIC_CUSTOM = {"name": "shell", "description": "run a command", "input_schema": {"type": "object"}}

CHAT_PROVIDER_TOOLS = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
                       {"type": "code_interpreter"}, {"type": "mcp", "server_url": "https://example.com/mcp"},
                       {"type": "a_tool_type_invented_tomorrow"}]
RESPONSES_PROVIDER_TOOLS = [{"type": "web_search"}, {"type": "web_search_preview"},
                            {"type": "file_search", "vector_store_ids": ["vs_1"]},
                            {"type": "code_interpreter", "container": {"type": "auto"}},
                            {"type": "mcp", "server_label": "x", "server_url": "https://example.com/mcp"},
                            {"type": "image_generation"}, {"type": "local_shell"},
                            {"type": "namespace", "tools": [RESPONSES_FUNCTION, {"type": "web_search"}]}]
ANTHROPIC_SERVER_TOOLS = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                          {"type": "web_fetch_20250910", "name": "web_fetch"},
                          {"type": "code_execution_20250522", "name": "code_execution"},
                          {"type": "bash_20250124", "name": "bash"}]


@pytest.fixture(scope="module")
def gateway():
    import anthropic
    import openai

    with ScriptedOpenAIServer(lambda body: reply("ok", prompt_tokens=9, completion_tokens=2)) as srv:
        gw = MutationGateway({"model": "openai/scripted", "api_base": srv.url, "api_key_env": "UPSTREAM_KEY",
                              "max_output_tokens": 64, "max_retries": 0})

        def clients(token: str):
            # The gateway's loopback port (the in-process agents' way in); the socket is the same app.
            return (openai.OpenAI(api_key=token, base_url=gw.local_url("openai"), max_retries=0),
                    anthropic.Anthropic(api_key=token, base_url=gw.local_url("anthropic"), max_retries=0))

        with use_secrets({"UPSTREAM_KEY": "sk-upstream"}):
            yield gw, srv, clients
        gw.close()


def _grant(gw, token):
    return gw._gateway.grants.find(token)


def _refused_everywhere(gw, srv, token, attempts) -> None:
    import anthropic
    import openai

    before = len(srv.requests)
    for name, attempt in attempts:
        with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as info:
            attempt()
        assert info.value.status_code == 400 and name in str(info.value), (name, info.value)
    assert len(srv.requests) == before  # nothing went upstream
    grant = _grant(gw, token)
    assert grant.calls == [] and [f["class"] for f in grant.failures] == ["refused"] * len(attempts)


def test_provider_run_tools_are_refused_on_the_chat_route_before_anything_goes_upstream(gateway):
    gw, srv, clients = gateway
    token = gw.issue_token(role="mutator", caller="chat")
    chat = clients(token)[0].chat.completions
    ask = {"model": "m", "messages": [{"role": "user", "content": "search the web"}]}
    attempts = [(tool["type"], lambda tool=tool: chat.create(**ask, tools=[FUNCTION, tool]))
                for tool in CHAT_PROVIDER_TOOLS]
    attempts.append(("web_search_options", lambda: chat.create(**ask, web_search_options={})))
    attempts.append(("tool_choice", lambda: chat.create(**ask, tools=[FUNCTION],
                                                        tool_choice={"type": "web_search"})))
    attempts.append(("web_search", lambda: chat.create(**ask, stream=True, tools=[{"type": "web_search"}])))
    _refused_everywhere(gw, srv, token, attempts)


def test_provider_run_tools_are_refused_on_the_responses_route(gateway):
    gw, srv, clients = gateway
    token = gw.issue_token(role="mutator", caller="responses")
    responses = clients(token)[0].responses
    attempts = [(tool["type"] if tool["type"] != "namespace" else "web_search",
                 lambda tool=tool: responses.create(model="m", input="look it up", tools=[RESPONSES_FUNCTION, tool]))
                for tool in RESPONSES_PROVIDER_TOOLS]
    attempts.append(("tool_choice", lambda: responses.create(model="m", input="x", tools=[RESPONSES_FUNCTION],
                                                             tool_choice={"type": "web_search_preview"})))
    attempts.append(("file_search", lambda: responses.create(model="m", input="x", stream=True,
                                                             tools=[{"type": "file_search", "vector_store_ids": ["v"]}])))
    _refused_everywhere(gw, srv, token, attempts)


def test_anthropic_server_tools_and_the_mcp_connector_are_refused_on_the_messages_route(gateway):
    gw, srv, clients = gateway
    token = gw.issue_token(role="mutator", caller="messages")
    messages = clients(token)[1].messages
    ask = {"model": "claude-x", "max_tokens": 32, "messages": [{"role": "user", "content": "fetch a page"}]}
    attempts = [(tool["type"], lambda tool=tool: messages.create(**ask, tools=[ANTHROPIC_CUSTOM, tool]))
                for tool in ANTHROPIC_SERVER_TOOLS]
    attempts.append(("mcp_servers", lambda: messages.create(**ask, extra_body={"mcp_servers": [
        {"type": "url", "url": "https://example.com/mcp", "name": "x"}]})))
    _refused_everywhere(gw, srv, token, attempts)


def test_tools_the_client_runs_itself_are_still_served_on_every_route(gateway):
    gw, srv, clients = gateway
    token = gw.issue_token(role="mutator", caller="client-tools")
    openai_client, anthropic_client = clients(token)
    before = len(srv.requests)
    assert openai_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 tools=[FUNCTION], tool_choice="auto").choices[0].message.content == "ok"
    assert openai_client.responses.create(model="m", input="hi", tools=[RESPONSES_FUNCTION]).output_text == "ok"
    answer = anthropic_client.messages.create(model="c", max_tokens=32, tools=[ANTHROPIC_CUSTOM],
                                              messages=[{"role": "user", "content": "hi"}])
    assert answer.content[0].text == "ok"
    sent = srv.requests[before:]
    assert len(sent) == 3 and all([t["function"]["name"] for t in r["tools"]] == ["shell"] for r in sent)
    grant = _grant(gw, token)
    assert len(grant.calls) == 3 and not grant.failures
