"""`python -m milo_ray.run` against a real model endpoint and real tasks, as a user runs
it: a local OpenAI-compatible server stands in for the provider, Harbor task directories
for the task set, bubblewrap for the sandbox. Also: no secret from the environment ever
lands in the run directory. (MILO and SSR on real tasks, every search role real too:
test_search_agents_real.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from milo_ray.testing.openai_server import ScriptedOpenAIServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "execution"))
from real_tasks import make_task, solving_policy  # noqa: E402

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]  # cold harness processes / whole runs / a cluster: see .ci/run

SECRETS = {"OPENAI_API_KEY": "sk-test-9f8e7d6c5b4a39281706", "MY_SERVICE_TOKEN": "tok-0a1b2c3d4e5f60718293",
           "DB_SECRET": "hunter2-is-not-a-password-77", "HF_API_KEY_2": "hf_zyxwvutsrqponm123456"}


def _cli(cwd: Path, *args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "milo_ray.run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def _texts(run_dir: Path):
    """Every byte of the run directory as text: raw files, zstd blobs decompressed,
    Parquet tables decoded."""
    import zstandard

    for p in run_dir.rglob("*"):
        if not p.is_file():
            continue
        raw = p.read_bytes()
        yield p, raw.decode("utf-8", "replace")
        if raw[:4] == b"\x28\xb5\x2f\xfd":  # zstd frame
            yield p, zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 28).decode("utf-8", "replace")
        if p.suffix == ".parquet":
            yield p, json.dumps(pq.read_table(p).to_pylist(), default=str)


def test_eval_on_harbor_tasks_against_a_local_endpoint_and_no_secret_reaches_the_run_dir(tmp_path):
    tasks = tmp_path / "tasks"
    for name in ("answer-a", "answer-b", "answer-c"):
        make_task(tasks, name)
    env = {**os.environ, **SECRETS, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
    run_dir = tmp_path / "run"
    with ScriptedOpenAIServer(solving_policy) as srv:
        # No model.api_key_env: openai/ models read OPENAI_API_KEY, as litellm does.
        proc = _cli(tmp_path, "method=eval", "method.k=1", "method.names=[minimal,stock]", "model=litellm",
                    "model.solver=openai/scripted", f"model.api_base={srv.url}", "benchmark=harbor", f"benchmark.path={tasks}", "benchmark.splits={test: 1.0}",
                    f"run.dir={run_dir}", "run.progress=false", "run.report=false", "execution.num_cpus=2", env=env)
        served = len(srv.answered)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    rows = [r for f in sorted((run_dir / "rollouts").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len(rows) == 2 * 3 and all(r["score"] == 1.0 and r["error_kind"] is None for r in rows)
    calls = [r for f in sorted((run_dir / "agent_calls").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len([c for c in calls if c["role"] == "solver"]) == served
    assert sum(r["input_tokens"] for r in rows) == sum(c["input_tokens"] for c in calls if c["role"] == "solver")
    # The gateways journaled every call, and each is the one its rollout reported.
    journal = [json.loads(line) for f in (run_dir / "journal").glob("calls-*.jsonl") for line in f.read_text().splitlines()]
    assert [r["op"] for r in journal].count("end") == served and not any(":interrupted" in c["call_id"] for c in calls)
    leaks = [(str(p.relative_to(run_dir)), name) for p, text in _texts(run_dir) for name, value in SECRETS.items()
             if value in text]
    assert not leaks, f"secret values found in the run directory: {leaks}"
    assert not [name for name, value in SECRETS.items() if value in proc.stdout + proc.stderr]


def test_eval_of_a_seed_on_the_bundled_suite_against_a_local_endpoint(tmp_path):
    env = {**os.environ, "OPENAI_API_KEY": "local", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
    with ScriptedOpenAIServer(solving_policy) as srv:
        proc = _cli(tmp_path, "method=eval", "model=litellm", "model.solver=openai/scripted",
                    f"model.api_base={srv.url}", "benchmark=harbor", "method.k=1", "method.names=[minimal]",
                    f"run.dir={tmp_path / 'run'}", "run.progress=false", "run.report=false", "execution.num_cpus=2", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for f in sorted((tmp_path / "run" / "rollouts").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    from milo_ray.benchmarks.harbor import HarborBenchmark

    assert sorted(r["task_id"] for r in rows) == sorted(t.task_id for t in HarborBenchmark().tasks("test"))
    assert all(r["error_kind"] is None and r["input_tokens"] > 0 for r in rows)


def test_a_task_the_sandbox_cannot_run_is_refused_by_name_before_the_run(tmp_path):
    tasks = tmp_path / "tasks"
    make_task(tasks, "fine")
    needy = make_task(tasks, "needs-apt")
    (needy / "environment" / "Dockerfile").write_text("FROM debian:12\nWORKDIR /app\nRUN apt-get install -y jq\n")
    proc = _cli(tmp_path, "method=eval", "executor.agent=oracle", "benchmark=harbor", f"benchmark.path={tasks}",
                "benchmark.splits={test: 1.0}", f"run.dir={tmp_path / 'run'}", env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "needs-apt" in proc.stderr and "sandbox=docker" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_harness_executor_without_a_model_endpoint_is_refused_in_one_line(tmp_path):
    proc = _cli(tmp_path, "method=eval", "benchmark=harbor", f"run.dir={tmp_path / 'run'}",
                env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert proc.returncode == 2
    assert "model.solver" in proc.stderr and "model=litellm" in proc.stderr
    assert not (tmp_path / "run").exists()
