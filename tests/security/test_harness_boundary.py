"""Every harness-channel attack, tried by a harness running for real: a bwrap sandbox, a
scripted OpenAI-compatible model behind the gateway, a Harbor task whose answer only its
hidden tests and solution hold. Each attack must be contained and the rollout recorded as
an ordinary 0-score rollout."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from milo_ray.benchmarks.harbor import HarborBenchmark
from milo_ray.execution.agent_executor import AgentExecutor
from milo_ray.testing.openai_server import ScriptedOpenAIServer, reply

from hostile import CALL_LOOP, HUNG_IMPORT, make_secret_task, recon_harness

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]  # cold harness processes / whole runs / a cluster: see .ci/run

KEY_ENV = "MILO_SECURITY_SOLVER_KEY"
KEY = "sk-canary-" + uuid.uuid4().hex
OTHER_ENV = "MILO_SECURITY_OTHER_KEY"  # another role's key, set only in the driver
OTHER = "sk-other-" + uuid.uuid4().hex
SANDBOX = {"_target_": "milo_ray.boundary.sandbox.bwrap.BwrapSandboxFactory"}
REPO = str(Path(__file__).resolve().parents[2])


def model_cfg(url: str, **extra) -> dict:
    return {"solver": "openai/scripted", "api_base": url, "api_key_env": KEY_ENV, "request_timeout_s": 30,
            "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 2.0, "max_retries": 0, **extra}


def _policy(body):
    return reply("hello back", prompt_tokens=11, completion_tokens=3)


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """One recon rollout, then an ordinary rollout on the same executor; everything the
    tests look at."""
    tmp = tmp_path_factory.mktemp("attack")
    os.environ[KEY_ENV], os.environ[OTHER_ENV] = KEY, OTHER
    task_dir = make_secret_task(tmp / "tasks")
    suite = HarborBenchmark(path=str(tmp / "tasks"), splits={"test": 1.0})
    run_dir = tmp / "run"
    run_dir.mkdir()
    canary = Path.home() / f".milo-canary-{uuid.uuid4().hex[:8]}"
    canary.write_text("canary-" + uuid.uuid4().hex)
    marker = f"31{uuid.uuid4().int % 10_000:04d}"
    scratch = tmp / "scratch"
    scratch.mkdir()
    out: dict = {"canary": canary.read_text(), "run_dir": run_dir, "task_dir": str(task_dir), "scratch": scratch}
    try:
        with ScriptedOpenAIServer(_policy) as srv:
            harness = recon_harness(canary=str(canary), run_dir=str(run_dir), task_dir=str(task_dir), marker=marker,
                                    provider=srv.url, root_only=_root_only_files())
            ex = AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX, scratch_dir=str(scratch), keep_scratch=True)

            async def go():
                res = await ex.aexecute(harness, suite.task("secret"), 0, 0)
                out["survivors"] = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True,
                                                  text=True).stdout.split()
                gw = await ex.gateway()
                out["late_call"] = await _call(gw.socket_path, _report_of(scratch)["token"])
                out["honest"] = await ex.aexecute(CALL_ONCE, suite.task("secret"), 0, 0)
                return res

            out["result"] = asyncio.run(go())
            out["billed"] = list(srv.answered)
            out["requests"] = list(srv.requests)
        out["report"] = _report_of(scratch)
    finally:
        canary.unlink()
        os.environ.pop(KEY_ENV, None)
        os.environ.pop(OTHER_ENV, None)
    return out


def _root_only_files(limit: int = 5) -> list[str]:
    """Host files under /etc that only root may read (beyond the ones the sandbox masks)."""
    import stat

    found = []
    for path in sorted(Path("/etc").glob("*")):
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file() and st.st_uid == 0 and not st.st_mode & stat.S_IROTH and path.name not in (
                "shadow", "shadow-", "gshadow", "gshadow-"):
            found.append(str(path))
    return found[:limit]


def _report_of(scratch: Path) -> dict:
    found = sorted(scratch.glob("*/grade/workspace/report.json")) or sorted(scratch.glob("*/*/workspace/report.json"))
    assert found, "the recon harness did not run"
    return json.loads(found[0].read_text())


async def _call(socket_path: str, token: str) -> tuple[int, str]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path)) as s:
        async with s.post("http://gateway/v1/chat/completions", headers={"Authorization": f"Bearer {token}"},
                          json={"model": "x", "messages": [{"role": "user", "content": "hi"}]}) as r:
            return r.status, await r.text()


from milo_ray.harness.model import Harness  # noqa: E402

CALL_ONCE = Harness.from_source('''
from langchain.agents import create_agent
def build_agent(model, backend):
    return create_agent(model, tools=[])
''', name="call-once")


def _everything(out: dict) -> str:
    return json.dumps(out["report"], default=str) + json.dumps(out["result"].trace, default=str)


def test_the_attack_ran_and_scored_zero(attacked):
    res = attacked["result"]
    assert "PATH" in attacked["report"]["environ"] and attacked["report"]["procs"]
    assert res.score == 0.0 and res.error_kind is None
    assert res.trace["trajectory"]["final"]["status"] == "completed"


def test_no_key_in_the_environment_or_the_chat_model(attacked):
    everything = _everything(attacked)
    assert KEY not in everything and OTHER not in everything
    assert KEY_ENV not in attacked["report"]["environ"] and OTHER_ENV not in attacked["report"]["environ"]
    assert "PATH=" in attacked["report"]["command_env"] and KEY_ENV not in attacked["report"]["command_env"]
    # The model holds only a per-rollout token for a loopback gateway.
    assert attacked["report"]["token"] and attacked["report"]["api_base"].startswith("http://127.0.0.1:")
    # ...and the provider saw the real key, never the token.
    assert all(KEY not in json.dumps(r) for r in attacked["requests"])


def test_canary_file_in_home_is_not_visible(attacked):
    assert attacked["report"]["canary"].startswith("ERR")
    assert attacked["canary"] not in _everything(attacked)


def test_no_host_path_of_the_run_the_task_or_the_checkout_is_visible(attacked):
    seen = json.dumps({k: attacked["report"][k] for k in ("procs", "walk", "environ", "home")})
    leaks = [path for path in (str(attacked["run_dir"]), attacked["task_dir"], str(attacked["scratch"]), REPO)
             if path in seen]
    assert leaks == []


def test_writing_into_the_run_dir_fails(attacked):
    assert attacked["report"]["write_run_dir"].startswith("ERR")
    assert list(attacked["run_dir"].iterdir()) == []


def test_a_double_forked_process_does_not_outlive_the_rollout(attacked):
    assert attacked["survivors"] == []


def test_patching_the_executor_inside_does_not_touch_the_next_rollout(attacked):
    honest = attacked["honest"]
    assert honest.score == 0.0 and honest.error_kind is None
    assert honest.trace["trajectory"]["final"]["model_calls"] == 1


def test_reward_tampering_does_not_reach_the_verifier(attacked):
    # Wrapped execute(), a planted reward file, a usercustomize hook in the home and a
    # planted /tests/test.sh: the verifier runs in a fresh sandbox with the real tests.
    assert attacked["result"].score == 0.0
    assert attacked["result"].trace["verifier"]["reward"] == {"reward": 0.0}


def test_the_task_dir_and_solution_are_unreachable(attacked):
    report = attacked["report"]
    assert report["task_dir"].startswith("ERR") and report["solution"].startswith("ERR")
    assert not any(p.endswith("solve.sh") for p in report["walk"])
    assert report.get("ran") is None  # nothing of /solution or /tests to run


def test_root_only_host_files_are_unreadable(attacked):
    assert attacked["report"]["uid"] != 0
    assert all(v.startswith("ERR") for v in attacked["report"]["root_files"].values())


def test_no_network_but_the_gateway(attacked):
    assert attacked["report"]["internet"].startswith("ERR")
    assert attacked["report"]["provider"].startswith("ERR")  # not even the host's loopback


def test_the_chat_model_reaches_the_gateway_without_the_relay_and_nothing_else(attacked):
    report = attacked["report"]
    # The relay (for other HTTP clients, at the model's api_base) is stopped: raw HTTP to it
    # fails, while the chat model still gets its answer over the rollout's gateway socket.
    assert report["relays_stopped"] == 1 and report["raw_call_after"].startswith("ERR")
    assert report["invoke"] == "hello back"
    assert report["other_endpoint"].startswith("ERR")  # the provider itself, bypassing the gateway


def test_tokens_come_from_the_gateway_not_from_the_harness(attacked):
    res = attacked["result"]
    billed = attacked["billed"][:2]  # the recon rollout's two calls (then the honest one's)
    assert attacked["report"]["invoke"] == "hello back" and '"hello back"' in attacked["report"]["raw_call"]
    assert res.input_tokens == sum(r.prompt_tokens for r in billed) == 22
    assert res.output_tokens == sum(r.completion_tokens for r in billed) == 6
    assert res.trace["trajectory"]["final"]["model_calls"] == 2
    assert res.cost_usd == pytest.approx((22 * 1.0 + 6 * 2.0) / 1e6)


def test_a_token_used_after_its_rollout_is_refused(attacked):
    status, text = attacked["late_call"]
    assert status == 401 and "ended" in text
    assert len(attacked["billed"]) == 3  # nothing was forwarded for the late call


def test_a_harness_looping_on_the_model_stops_at_the_call_cap(tmp_path):
    make_secret_task(tmp_path / "tasks")
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    os.environ[KEY_ENV] = KEY
    try:
        with ScriptedOpenAIServer(_policy) as srv:
            ex = AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX, max_model_calls=5)
            res = asyncio.run(ex.aexecute(CALL_LOOP, suite.task("secret"), 0, 0))
            billed = list(srv.answered)
    finally:
        os.environ.pop(KEY_ENV)
    assert res.trace["trajectory"]["final"]["status"] == "call_cap"
    assert res.trace["trajectory"]["final"]["model_calls"] == len(billed) == 5
    assert res.input_tokens == 5 * 11 and res.error_kind is None and res.score == 0.0


@pytest.mark.slow
def test_a_hung_import_is_stopped_at_the_cap_without_delaying_another_rollout(tmp_path):
    make_secret_task(tmp_path / "tasks")
    suite = HarborBenchmark(path=str(tmp_path / "tasks"), splits={"test": 1.0})
    os.environ[KEY_ENV] = KEY
    finished: list[str] = []
    try:
        with ScriptedOpenAIServer(_policy) as srv:
            ex = AgentExecutor(model=model_cfg(srv.url), sandbox=SANDBOX, startup_timeout_s=90)

            async def one(name, harness):
                res = await ex.aexecute(harness, suite.task("secret"), 0, 0)
                finished.append(name)
                return res

            async def both():
                return await asyncio.gather(one("hung", HUNG_IMPORT), one("honest", CALL_ONCE))

            hung, honest = asyncio.run(both())
    finally:
        os.environ.pop(KEY_ENV)
    assert finished == ["honest", "hung"]
    assert honest.error_kind is None and honest.trace["trajectory"]["final"]["model_calls"] == 1
    assert hung.error_kind == "harness" and "did not start within 90 s" in hung.error
