"""No key value persists: a finished run of every method (eval, MILO, SSR), offline and with
every role a litellm client of a local scripted server, with canary values in the key
variables -- and those values smuggled into trajectories (the scripted model repeats them),
harness source and error texts (a user harness raises with them) -- leaves no canary in any
file under the run directory (zstd blobs decompressed, Parquet decoded), nor on the console.
Ray's own logs under RAY_TMPDIR are checked too (see the last test)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer
from milo_ray.testing.scripted_agents import mutator_policy
from milo_ray.testing.scripted_roles import by_model, judge_policy, orchestrator_policy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "execution"))
from real_tasks import make_task, solving_policy  # noqa: E402

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]  # each case is a run of the entry point (30-120 s)

CANARIES = {"CANARY_SOLVER_KEY": "sk-canary-solver-5f1e9a7c3b2d4e6f",
            "CANARY_BACKEND_KEY": "sk-canary-backend-8d7c6b5a4f3e2d1c"}
# Offline runs read no key; these are set anyway (as a user's shell would have them).
AMBIENT = {"OPENAI_API_KEY": "sk-canary-ambient-openai-11223344", "ANTHROPIC_API_KEY": "sk-ant-canary-ambient-5566"}
SMUGGLED = " ".join(CANARIES.values())

LEAKY_HARNESS = f'''
LEAKED = {SMUGGLED!r}  # a harness whose source holds the keys


def build_agent(model, backend):
    raise RuntimeError("cannot build: here are the keys " + LEAKED)
'''


def _leaky(policy):
    """A policy whose text answers also repeat the canary keys (a model told to)."""

    def answer(body):
        r = policy(body)
        if r.status == 200 and not r.tool_calls and isinstance(r.content, str):
            return Reply(content=f"{r.content}\n(keys: {SMUGGLED})", prompt_tokens=r.prompt_tokens,
                         completion_tokens=r.completion_tokens)
        return r

    return answer


def _orchestrator_or_graft(body):
    return mutator_policy(body) if body.get("tools") else orchestrator_policy(body)


SCRIPT = by_model({"solver": _leaky(solving_policy), "mutator": _leaky(mutator_policy),
                   "orchestrator": _orchestrator_or_graft, "judge": judge_policy, "optimizer": _leaky(mutator_policy)})


def _texts(root: Path):
    import zstandard

    for p in root.rglob("*"):
        if not p.is_file() or p.is_symlink():
            continue
        try:
            raw = p.read_bytes()
        except OSError:
            continue
        yield p, raw.decode("utf-8", "replace")
        if raw[:4] == b"\x28\xb5\x2f\xfd":
            yield p, zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 28).decode("utf-8", "replace")
        if p.suffix == ".parquet":
            yield p, json.dumps(pq.read_table(p).to_pylist(), default=str)


def _leaks(root: Path) -> list[tuple[str, str]]:
    values = {**CANARIES, **AMBIENT}
    return sorted({(str(p.relative_to(root)), name) for p, text in _texts(root) for name, v in values.items()
                   if v in text})


@pytest.fixture(scope="module")
def ray_tmp():
    # Short: Ray's socket paths must fit in 107 characters.
    d = tempfile.mkdtemp(prefix="rc-", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def _run(tmp: Path, ray_tmp: Path, *args: str, litellm: bool, srv: ScriptedOpenAIServer | None = None):
    run_dir = tmp / "run"
    env = {**os.environ, **CANARIES, **AMBIENT, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1",
           "RAY_TMPDIR": str(ray_tmp)}
    argv = [sys.executable, "-m", "milo_ray.run", *args, f"run.dir={run_dir}", "run.progress=false",
            "execution.num_cpus=2"]
    if litellm:
        argv += ["model=litellm", "model.solver=openai/solver", f"model.api_base={srv.url}",
                 "model.api_key_env=CANARY_SOLVER_KEY", "backend=litellm", "backend.model=openai/mutator",
                 f"backend.api_base={srv.url}", "backend.api_key_env=CANARY_BACKEND_KEY", "backend.retry_base_s=0.05",
                 "backend.agents.orchestrator.llm.model=openai/orchestrator",
                 "backend.agents.judge.llm.model=openai/judge", "backend.agents.optimizer.llm.model=openai/optimizer"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"
    return proc, run_dir


def _assert_clean(proc: subprocess.CompletedProcess, run_dir: Path) -> None:
    assert (run_dir / "report" / "report.html").is_file()  # the report is checked too
    leaks = _leaks(run_dir)
    assert not leaks, f"secret values found in the run directory: {leaks}"
    console = proc.stdout + proc.stderr
    assert not [n for n, v in {**CANARIES, **AMBIENT}.items() if v in console]


def _harbor(tmp: Path, n: int = 4) -> Path:
    tasks = tmp / "tasks"
    for i in range(n):
        make_task(tasks, f"answer-{i}")
    return tasks


LITELLM_CASES = {
    "eval": ("method=eval", "method.k=1", "method.names=[minimal,leaky]", "benchmark.splits={test: 1.0}"),
    "milo": ("method=milo_quick", "method.seeds=[minimal,leaky]", "method.num_islands=2", "method.search_size=2",
             "method.val_size=1", "method.k_search=1", "method.k_val=1", "method.k_test=1", "method.max_rounds=1",
             "method.patience=1", "method.round_sync=true", "benchmark.splits={search: 2, val: 1, test: 1}"),
    "ssr": ("+experiment=ssr_swepro", "method.initial=leaky", "method.scales=[1.0]", "method.b_v=[1]", "method.b_s=1",
            "method.b_f=1", "method.rollouts=1", "method.test_rollouts=1", "run.budget.executions=16",
            "benchmark.splits={train: 2, val: 1, test: 1}"),
}


@pytest.mark.parametrize("method", sorted(LITELLM_CASES))
def test_a_litellm_run_of_every_method_persists_no_key(method, tmp_path, ray_tmp):
    leaky = tmp_path / "leaky"
    leaky.mkdir()
    (leaky / "harness.py").write_text(LEAKY_HARNESS)
    tasks = _harbor(tmp_path)
    with ScriptedOpenAIServer(SCRIPT) as srv:
        proc, run_dir = _run(tmp_path, ray_tmp, *LITELLM_CASES[method], "benchmark=harbor",
                             f"benchmark.path={tasks}", f"benchmark.seeds=[minimal,{leaky}]", litellm=True, srv=srv)
        answered = len(srv.answered)
    assert answered > 0
    rollouts = [r for f in sorted((run_dir / "rollouts").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    # The smuggling happened: the leaky harness's rollouts failed with the (redacted) keys.
    assert any(r["error_kind"] == "harness" and "[redacted $CANARY_SOLVER_KEY]" in (r["error"] or "") for r in rollouts)
    _assert_clean(proc, run_dir)


@pytest.mark.parametrize("method", ["eval", "milo", "ssr"])
def test_an_offline_run_of_every_method_persists_no_key(method, tmp_path, ray_tmp):
    args = {"eval": ("method=eval", "method.k=1"), "milo": ("method=milo_quick", "method.max_rounds=1"),
            "ssr": ("+experiment=ssr_swepro", "run.budget.executions=120")}[method]
    proc, run_dir = _run(tmp_path, ray_tmp, *args, litellm=False)
    _assert_clean(proc, run_dir)


def test_rays_logs_hold_no_key(ray_tmp):
    if not any(ray_tmp.rglob("*.log")):
        pytest.skip("no Ray logs: run the litellm cases first (same module)")
    leaks = _leaks(ray_tmp)
    assert not leaks, f"secret values found in Ray's logs: {leaks}"
