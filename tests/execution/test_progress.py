"""RolloutProgress: counters are exact, the live line renders, pipes stay quiet."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from milo_ray.core.rollouts import RolloutResult
from milo_ray.execution.progress import RolloutProgress

# A cluster, containers or whole command-line runs: the slow suite (pytest -m slow; .ci/run runs it).
pytestmark = pytest.mark.slow


def _result(**kw) -> RolloutResult:
    return RolloutResult("h", "t", 0, score=kw.pop("score", 1.0), **kw)


def test_counters_track_done_running_timeouts_errors_tokens_and_cost():
    p = RolloutProgress(enabled=False)
    p.add(4, n_cached=2)
    p.started(3)
    p.finished(_result(input_tokens=10, output_tokens=5, cost_usd=0.25))
    p.finished(_result(score=0.0, error_kind="harness"))
    p.retried()  # the third went back to the queue...
    assert p.summary()["running"] == 0
    p.started(1)  # ...and ran again
    p.finished(_result(score=0.0, timed_out=True))
    s = p.summary()
    assert (s["done"], s["total"], s["cached"], s["running"]) == (3, 4, 2, 0)
    assert s["timed_out"] == 1 and s["errors"] == 1 and s["retries"] == 1 and s["tokens"] == 15 and s["cost_usd"] == 0.25
    assert p.eta_s() is not None and p.eta_s() >= 0


def test_live_line_renders_to_a_terminal_console():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160)
    p = RolloutProgress(console=console)
    assert p.enabled
    p.add(2)
    p.started(2)
    p.finished(_result(input_tokens=1200, cost_usd=0.5))
    text = p.render().plain
    assert "1/2" in text and "running 1" in text and "1,200" in text and "$0.5000" in text
    p.close()
    assert "rollouts" in buf.getvalue()


def test_quiet_when_stdout_is_not_a_terminal_by_default(capsys):
    p = RolloutProgress()  # pytest captures stdout: not a TTY
    p.add(1)
    p.close()
    out = capsys.readouterr()
    assert not p.enabled and out.out == "" and out.err == ""


def test_enabled_without_a_terminal_writes_plain_periodic_lines_without_control_codes(capsys):
    stream = io.StringIO()
    p = RolloutProgress(enabled=True, stream=stream, interval_s=0.01)
    p.add(3)
    p.started(1)
    p.finished(_result(output_tokens=7))
    deadline = time.monotonic() + 10
    while stream.getvalue().count("[progress]") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.close()
    text = stream.getvalue()
    assert text.count("[progress]") >= 3  # periodic lines plus the final one
    assert "\x1b" not in text and text.splitlines()[-1].startswith("[progress] rollouts 1/3")
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------- run status lines
class _Status:
    """A stand-in run status: its lines and a version the display watches."""

    def __init__(self) -> None:
        self.version = 0
        self.text = ["island 0  round 0"]

    def lines(self) -> list[str]:
        return list(self.text)


def test_attached_status_lines_render_below_the_rollout_line():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160, color_system=None)
    p = RolloutProgress(console=console)
    status = _Status()
    p.attach(status)
    p.add(1)
    console.print(p.render())
    p.close()
    text = buf.getvalue()
    assert "rollouts 0/1  running 0  timed out 0  errors 0  tokens 0  cost $0.0000  eta --:--\nisland 0  round 0\n" in text


def test_plain_status_lines_are_written_when_the_status_changes_but_at_most_every_min_interval(capsys):
    stream = io.StringIO()
    status = _Status()
    p = RolloutProgress(enabled=True, stream=stream, interval_s=3600, min_interval_s=0.05)
    p.attach(status)
    p.add(2)

    def blocks() -> int:
        return stream.getvalue().count("[progress] rollouts")

    deadline = time.monotonic() + 10
    while blocks() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # nothing changed: no new block (the heartbeat is an hour away)
    assert blocks() == 1
    status.version, status.text = 1, ["island 0  round 1"]
    while blocks() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert blocks() == 2
    p.close()
    lines = stream.getvalue().splitlines()
    assert blocks() == 3 and lines[-2:] == ["[progress] rollouts 0/2  running 0  timed out 0  errors 0  tokens 0  cost $0.0000  eta --:--",
                                            "[progress] island 0  round 1"]
    assert "\x1b" not in stream.getvalue() and capsys.readouterr().out == ""


def test_a_failing_status_leaves_the_rollout_line_standing():
    class Broken(_Status):
        def lines(self) -> list[str]:
            raise RuntimeError("bug")

    stream = io.StringIO()
    p = RolloutProgress(enabled=True, stream=stream, interval_s=3600)
    p.attach(Broken())
    p.add(1)
    p.close()
    assert stream.getvalue().splitlines() == ["[progress] rollouts 0/1  running 0  timed out 0  errors 0  tokens 0  cost $0.0000  eta --:--"]


# ---------------------------------------------------------------- real runs, plain mode
def _matrix_module():
    path = Path(__file__).parents[1] / "entry" / "test_cli_matrix.py"
    spec = importlib.util.spec_from_file_location("_cli_matrix_constants", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory) -> tuple[Path, str]:
    """A tiny MILO and a tiny SSR run with run.progress=true and stderr a pipe (plain mode)."""
    m = _matrix_module()
    root = tmp_path_factory.mktemp("progress")
    common = ["run.progress=true", "execution.num_cpus=2"]
    jobs = {"milo": [*m.MILO_TINY, *common, f"run.dir={root / 'milo'}"],
            "ssr": ["method=ssr", *m.SSR_TINY, f"run.budget.executions={m.TRAIN_SIZE['surrogate_tb21'] + 20}", *common,
                    f"run.dir={root / 'ssr'}"]}
    (root / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, str(m.RUNNER), str(root / "jobs.json"), str(root / "out.json")], cwd=root,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    out = json.loads((root / "out.json").read_text()) if (root / "out.json").exists() else {}
    assert all(out.get(j, {}).get("code") == 0 for j in jobs), proc.stderr[-4000:]
    return root, proc.stderr


def _last_block(stderr: str, job: str) -> list[str]:
    """The job's last [progress] block (the one written when its scheduler closed)."""
    head, sep, _ = stderr.partition(f"[cli_jobs] {job}:")
    assert sep, stderr[-3000:]
    lines = [x[len("[progress] "):] for x in head.splitlines() if x.startswith("[progress] ")]
    start = max(i for i, x in enumerate(lines) if x.startswith("rollouts "))
    return lines[start:]


def _events(run_dir: Path, kind: str) -> list[dict]:
    rows = duckdb.sql(f"select payload from '{run_dir}/events/*.parquet' where kind = '{kind}' order by seq").fetchall()
    return [json.loads(p) for (p,) in rows]


def _tokens(run_dir: Path) -> int:
    rollouts = duckdb.sql(f"select coalesce(sum(input_tokens + output_tokens), 0) from '{run_dir}/rollouts/*.parquet'")
    total = int(rollouts.fetchall()[0][0])
    if list(run_dir.glob("agent_calls/*.parquet")):
        calls = duckdb.sql("select coalesce(sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)), 0) "
                           f"from '{run_dir}/agent_calls/*.parquet' where role <> 'solver'")
        total += int(calls.fetchall()[0][0])
    return total


def test_plain_milo_status_names_every_island_with_the_runs_own_values(plain_runs):
    root, stderr = plain_runs
    run_dir = root / "milo"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    islands = manifest["summary"]["islands"]
    block = _last_block(stderr, "milo")
    nodes = [e["node"] for e in _events(run_dir, "milo.node")]
    for j, isl in islands.items():
        search = max(n["accuracy"] for n in nodes if n["island"] == int(j) and n["admitted"] and n["accuracy"] is not None)
        want = (f"island {j}  mutator {isl['mutator']}  round {isl['rounds']}  best search {search:.3f}  "
                f"held-out {isl['heldout_accuracy']:.3f}  stall {isl['stall']}")
        assert want in block, (want, block)
    assert len([x for x in block if x.startswith("island ")]) == len(islands)
    best = manifest["summary"]["best"]
    run_line = block[-1]
    assert run_line.startswith(f"run  best held-out {best['heldout_accuracy']:.3f} (island {best['island']})"), run_line
    used = manifest["budget"]["executions_used"]
    assert f"spend {_tokens(run_dir):,} tokens $0.0000  executions {used}  eta" in run_line, run_line


def test_plain_ssr_status_names_round_stage_survivors_and_parent_score(plain_runs):
    root, stderr = plain_runs
    run_dir = root / "ssr"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    block = _last_block(stderr, "ssr")
    rnd = _events(run_dir, "ssr.round")[-1]
    sel = _events(run_dir, "ssr.selection")[-1]
    result = _events(run_dir, "ssr.stage_result")[-1]
    racing = _events(run_dir, "ssr.candidates")[-1]["racing"]
    stop = _events(run_dir, "ssr.stop")[-1]
    rounds = duckdb.sql(f"select round, harness_id from '{run_dir}/events/*.parquet' where kind = 'ssr.round' "
                        "order by seq").fetchall()
    last_round, parent = rounds[-1]
    assert rnd["stall"] is not None
    want = (f"ssr round {last_round}  stage {result['stage']}  surviving {len(result['survivors'])}/{len(racing)}  "
            f"parent {parent[:12]} score {sel['parent_score']:.3f}  stall {rnd['stall']}  stopped ({stop['reason']})")
    assert want in block, (want, block)
    incumbent = sel["best_child_score"] if sel["replaced"] else sel["parent_score"]
    cap = manifest["config"]["run"]["budget"]["executions"]
    assert block[-1].startswith(f"run  incumbent score {incumbent:.3f}  spend {_tokens(run_dir):,} tokens "), block[-1]
    assert f"executions {manifest['budget']['executions_used']}/{cap}  eta" in block[-1]
