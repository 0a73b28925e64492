"""One gateway socket per grant: a rollout's token is worth something only on its own
socket, which only its own sandbox is shown, and only while its grant lives.

The first tests drive the gateway directly (a scripted OpenAI-compatible model behind it);
the last runs two rollouts for real in bwrap sandboxes, one of them a thief holding the
other's live token."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from milo_ray.boundary.gateway.server import ModelGateway
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

KEY_ENV = "MILO_PER_GRANT_TEST_KEY"
KEY = "sk-per-grant-" + uuid.uuid4().hex
ASK = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


def model_cfg(url: str) -> dict:
    return {"solver": "openai/scripted", "api_base": url, "api_key_env": KEY_ENV, "request_timeout_s": 30,
            "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0, "max_retries": 0}


def _policy(body):
    return reply("ok", prompt_tokens=7, completion_tokens=2)


async def _post(where: str, token: str | None, body: dict = ASK) -> tuple[int, str]:
    """POST a chat completion to the gateway at ``where`` (a Unix socket path, or an
    ``http://`` loopback base)."""
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if where.startswith("http://"):
        session, url = aiohttp.ClientSession(), f"{where}/v1/chat/completions"
    else:
        session, url = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=where)), \
            "http://gateway/v1/chat/completions"
    async with session as s:
        async with s.post(url, headers=headers, json=body) as r:
            return r.status, await r.text()


async def _gateway(url: str, tmp_path: Path) -> ModelGateway:
    gw = ModelGateway(model_cfg(url), tmp_path / "gw" / "gw.sock")
    gw.set_key(KEY)
    await gw.start()
    return gw


def _sandbox_dir(tmp_path: Path, name: str) -> Path:
    where = tmp_path / name
    where.mkdir()
    return where


def test_a_token_is_refused_on_another_grants_socket_and_its_grant_is_charged_nothing(tmp_path):
    async def go(url):
        gw = await _gateway(url, tmp_path)
        try:
            victim = await gw.issue_bound("victim", _sandbox_dir(tmp_path, "a"), call_cap=10)
            thief = await gw.issue_bound("thief", _sandbox_dir(tmp_path, "b"), call_cap=10)
            out = {"own": await _post(victim.socket_path, victim.token),
                   "stolen": await _post(thief.socket_path, victim.token),
                   "forged": await _post(thief.socket_path, "not-a-token"),
                   "bare": await _post(thief.socket_path, None)}
            return out, victim, thief
        finally:
            await gw.close()

    with ScriptedOpenAIServer(_policy) as srv:
        out, victim, thief = asyncio.run(go(srv.url))
        answered = len(srv.answered)
    assert out["own"][0] == 200
    for name in ("stolen", "forged", "bare"):
        status, text = out[name]
        assert status == 403 and "wrong_socket" in text, (name, out[name])
    assert answered == 1  # nothing of the refused requests went upstream
    # The victim is charged its own call only, and notes no refusal of the thief's use.
    assert len(victim.calls) == 1 and victim.refusals == 0 and victim.tokens() == 9
    # The refusals are the socket's own grant's: the thief's.
    assert thief.calls == [] and thief.refusals == 3
    assert [f["class"] for f in thief.failures] == ["refused"] * 3 and thief.failures[0]["status"] == 403


def test_a_bound_token_is_refused_on_the_shared_socket_and_the_loopback_port(tmp_path):
    async def go(url):
        gw = await _gateway(url, tmp_path)
        try:
            loopback = await gw.listen_loopback()
            bound = await gw.issue_bound("rollout", _sandbox_dir(tmp_path, "a"))
            host = gw.issue("in-process agent")  # no socket of its own: the shared listeners' grant
            return {"shared": await _post(gw.socket_path, bound.token), "loopback": await _post(loopback, bound.token),
                    "host_on_bound": await _post(bound.socket_path, host.token),
                    "host_on_shared": await _post(gw.socket_path, host.token)}, bound, host
        finally:
            await gw.close()

    with ScriptedOpenAIServer(_policy) as srv:
        out, bound, host = asyncio.run(go(srv.url))
    assert out["shared"][0] == 403 and out["loopback"][0] == 403 and out["host_on_bound"][0] == 403
    assert out["host_on_shared"][0] == 200
    # The bound grant is charged nothing, and notes only what came in on its own socket
    # (the host grant's token), not its own token's use elsewhere.
    assert bound.calls == [] and bound.refusals == 1 and len(host.calls) == 1


def test_a_token_is_refused_on_every_socket_once_its_grant_ended(tmp_path):
    import aiohttp

    async def go(url):
        gw = await _gateway(url, tmp_path)
        try:
            ended = await gw.issue_bound("ended", _sandbox_dir(tmp_path, "a"))
            live = await gw.issue_bound("live", _sandbox_dir(tmp_path, "b"))
            host = gw.issue("in-process agent")
            # A connection its socket accepted while the grant lived, kept open past its end
            # (the second request can only travel on it: the socket file is gone by then).
            kept = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=ended.socket_path, force_close=False))
            async with kept.post("http://gateway/v1/chat/completions", json=ASK,
                                 headers={"Authorization": f"Bearer {ended.token}"}) as r:
                before = (r.status, await r.text())
            gw.end(ended)
            async with kept.post("http://gateway/v1/chat/completions", json=ASK,
                                 headers={"Authorization": f"Bearer {host.token}"}) as r:
                kept_after = (r.status, await r.text())
            await kept.close()
            out = {"before": before, "kept_after": kept_after, "gone": os.path.lexists(ended.socket_path),
                   "on_live": await _post(live.socket_path, ended.token),
                   "on_shared": await _post(gw.socket_path, ended.token)}
            try:
                await _post(ended.socket_path, ended.token)
                out["own"] = "answered"
            except Exception as exc:  # nothing listens there any more
                out["own"] = type(exc).__name__
            # Its own-made directory goes with it.
            own_dir = await gw.issue_bound("no dir given")
            gw.end(own_dir)
            out["own_dir_gone"] = not Path(own_dir.socket_path).parent.exists()
            return out, ended, live
        finally:
            await gw.close()

    with ScriptedOpenAIServer(_policy) as srv:
        out, ended, live = asyncio.run(go(srv.url))
        answered = len(srv.answered)
    assert out["before"][0] == 200 and out["gone"] is False and out["own"] != "answered"
    assert out["kept_after"][0] == 401, out["kept_after"]  # not even a host grant's token
    assert out["on_live"][0] == 403 and out["on_shared"][0] == 401 and "ended" in out["on_shared"][1]
    assert out["own_dir_gone"] and answered == 1 and len(ended.calls) == 1 and live.calls == []


def test_concurrent_grants_are_each_billed_exactly_their_own_calls(tmp_path):
    wants = [3, 1, 5, 2, 4, 6]

    async def one(gw, i, n):
        grant = await gw.issue_bound(f"r{i}", _sandbox_dir(tmp_path, f"s{i}"))
        statuses = []
        for _ in range(n):
            statuses.append((await _post(grant.socket_path, grant.token,
                                         {"model": "x", "messages": [{"role": "user", "content": f"r{i}"}]}))[0])
            await asyncio.sleep(0)
        return grant, statuses

    async def go(url):
        gw = await _gateway(url, tmp_path)
        try:
            return await asyncio.gather(*(one(gw, i, n) for i, n in enumerate(wants)))
        finally:
            await gw.close()

    def by_sender(body):
        n = int(body["messages"][0]["content"][1:])
        return reply("ok", prompt_tokens=10 + n, completion_tokens=1)

    with ScriptedOpenAIServer(by_sender) as srv:
        done = asyncio.run(go(srv.url))
    for i, ((grant, statuses), n) in enumerate(zip(done, wants)):
        assert statuses == [200] * n
        assert len(grant.calls) == n and grant.tokens() == n * (11 + i), grant.label


def test_a_search_agents_bound_token_is_accepted_on_its_own_socket_only(tmp_path):
    from urllib.parse import unquote, urlsplit

    from milo_ray.llm.client import use_secrets
    from milo_ray.boundary.gateway.mutation import MutationGateway

    with ScriptedOpenAIServer(_policy) as srv:
        gw = MutationGateway({"model": "openai/scripted", "api_base": srv.url, "api_key_env": KEY_ENV,
                              "max_retries": 0})
        try:
            with use_secrets({KEY_ENV: KEY}):
                token, other = (gw.issue_token(role="mutator", caller=c) for c in ("cli", "other"))
            own = gw.bind_token(token)
            shared = unquote(urlsplit(gw.base_url("openai")).netloc)
            loopback = gw.local_url("openai")[: -len("/openai/v1")]
            out = {"own": asyncio.run(_post(own, token)), "shared": asyncio.run(_post(shared, token)),
                   "loopback": asyncio.run(_post(loopback, token)), "other_on_own": asyncio.run(_post(own, other))}
            gw.revoke_token(token)
            out["metered"], out["other_metered"] = gw.metered(token), gw.metered(other)
            out["gone"] = not os.path.exists(own) and not os.path.exists(os.path.dirname(own))
        finally:
            gw.close()
        answered = len(srv.answered)
    assert out["own"][0] == 200 and out["gone"]
    assert out["shared"][0] == 403 and out["loopback"][0] == 403 and out["other_on_own"][0] == 403
    assert answered == 1 and out["metered"]["calls"] == 1 and out["other_metered"]["calls"] == 0


# --- for real: a thief harness in a bwrap sandbox ---------------------------------------

VICTIM = '''
import asyncio
from langchain_core.messages import AIMessage, HumanMessage


class _Agent:
    def __init__(self, model):
        self.model = model

    async def astream(self, inputs, config=None, stream_mode=None):
        # Leaks its own token in its prompt (the test's model plays the channel a thief
        # would have used) and keeps calling until the model says stop.
        for _ in range(600):
            answer = await self.model.ainvoke("victim " + str(self.model.api_key))
            if "stop" in str(answer.content):
                break
            await asyncio.sleep(0.1)
        yield {"messages": [HumanMessage(content=inputs["messages"][0]["content"]), AIMessage(content="done")]}


def build_agent(model, backend):
    return _Agent(model)
'''

THIEF = '''
import json, os, socket
from langchain_core.messages import AIMessage, HumanMessage

STOLEN = {stolen!r}
GUESSED = {guessed!r}   # host paths of other gateway sockets


def _post(path, token):
    body = json.dumps({{"model": "x", "messages": [{{"role": "user", "content": "thief stolen"}}]}}).encode()
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: g\\r\\nConnection: close\\r\\n"
                  b"Content-Type: application/json\\r\\nAuthorization: Bearer " + token.encode() +
                  b"\\r\\nContent-Length: " + str(len(body)).encode() + b"\\r\\n\\r\\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data.decode(errors="replace").split("\\r\\n")[0]
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()


def _walk(top):
    found = []
    for root, dirs, files in os.walk(top, onerror=lambda e: found.append("unreadable " + str(e.filename))):
        found += [os.path.join(root, n) for n in dirs + files]
    return found


def _recon():
    report = {{"own_socket": "/run/milo/gateway/gateway.sock",
              "stolen_on_own": _post("/run/milo/gateway/gateway.sock", STOLEN),
              "guessed": {{p: [os.path.lexists(p), _post(p, STOLEN)] for p in GUESSED}},
              "run": _walk("/run"), "tmp": _walk("/tmp"),
              "mountinfo": open("/proc/self/mountinfo").read()}}
    with open("/app/report.json", "w") as f:
        json.dump(report, f)
    return report


class _Agent:
    def __init__(self, model, report):
        self.model, self.report = model, report

    async def astream(self, inputs, config=None, stream_mode=None):
        await self.model.ainvoke("thief own")  # its own token, on its own socket: billed to it
        yield {{"messages": [HumanMessage(content=inputs["messages"][0]["content"]),
                            AIMessage(content=json.dumps(self.report)[:2000])]}}


def build_agent(model, backend):
    return _Agent(model, _recon())
'''


@pytest.mark.slow  # two cold harness processes in bwrap sandboxes
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_sandboxed_thief_cannot_spend_a_live_rollouts_token_nor_see_its_socket(tmp_path):
    from hostile import make_secret_task

    from milo_ray.benchmarks.harbor import HarborBenchmark
    from milo_ray.execution.agent_executor import AgentExecutor
    from milo_ray.harness.model import Harness

    make_secret_task(tmp_path / "tasks", agent_timeout_s=120)
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    # Short: the host path of the victim's socket must be one a client could connect to.
    scratch = Path(tempfile.mkdtemp(prefix="milo-pg-"))
    leaked: dict = {}
    state = {"thief_done": False}

    def policy(body):
        text = str(body["messages"][-1]["content"])
        if text.startswith("victim "):
            leaked.setdefault("token", text.split(" ", 1)[1])
            return reply("stop" if state["thief_done"] else "more", prompt_tokens=5, completion_tokens=1)
        return reply("ok", prompt_tokens=3, completion_tokens=1)

    os.environ[KEY_ENV] = KEY
    try:
        with ScriptedOpenAIServer(policy) as srv:
            ex = AgentExecutor(model=model_cfg(srv.url), sandbox={"_target_":
                               "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"},
                               scratch_dir=str(scratch), keep_scratch=True, warm_processes=0, max_model_calls=1000)

            async def go():
                gw = await ex.gateway()
                victim = asyncio.ensure_future(ex.aexecute(Harness.from_source(VICTIM, name="victim"),
                                                           suite.task("secret"), 0, 0))
                for _ in range(1200):
                    if "token" in leaked or victim.done():
                        break
                    await asyncio.sleep(0.1)
                assert "token" in leaked, f"the victim never called its model: {victim.done() and victim.result()}"
                victim_grant = gw.grants.find(leaked["token"])
                guessed = [victim_grant.socket_path, gw.socket_path]
                thief_src = THIEF.format(stolen=leaked["token"], guessed=guessed)
                try:
                    thief = await ex.aexecute(Harness.from_source(thief_src, name="thief"), suite.task("secret"), 1, 0)
                finally:
                    state["thief_done"] = True
                return await victim, thief, victim_grant

            victim, thief, victim_grant = asyncio.run(go())
            victim_asks = sum(1 for r in srv.requests if str(r["messages"][-1]["content"]).startswith("victim "))
            stolen_asks = sum(1 for r in srv.requests if "stolen" in str(r["messages"][-1]["content"]))
        reports = [json.loads(p.read_text()) for p in scratch.glob("*/grade/workspace/report.json")]
    finally:
        os.environ.pop(KEY_ENV, None)
        shutil.rmtree(scratch, ignore_errors=True)

    assert len(reports) == 1, "the thief did not run"
    report = reports[0]
    # Its own socket refused the stolen live token; nothing of it went upstream.
    assert report["stolen_on_own"].startswith("HTTP/1.1 403"), report["stolen_on_own"]
    assert stolen_asks == 0
    # The host paths of the victim's socket and the worker's shared socket are nothing here.
    # (A path longer than a socket address holds cannot even be tried: nothing answers either way.)
    guessed = report["guessed"]
    assert all(not there and answer in ("FileNotFoundError", "OSError") for there, answer in guessed.values()), guessed
    # The sandbox shows one gateway socket, its own, and no trace of another rollout's.
    seen = report["run"] + report["tmp"]
    assert [p for p in seen if p.endswith(".sock")] == [report["own_socket"]], seen
    victim_dir = Path(victim_grant.socket_path).parent.parent.name
    assert victim_dir not in report["mountinfo"] and victim_dir not in json.dumps(seen)
    assert report["mountinfo"].count("/run/milo/gateway ") == 1
    # Each rollout is billed exactly its own calls: the victim all of its asks, the thief its one.
    assert victim.error_kind is None and thief.error_kind is None
    assert victim_asks >= 1
    assert victim.input_tokens == 5 * victim_asks and victim.output_tokens == victim_asks
    assert thief.input_tokens == 3 and thief.output_tokens == 1
    assert victim_grant.refusals == 0 and victim_grant.failures == []
