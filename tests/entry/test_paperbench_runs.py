"""MILO and SSR on PaperBench from the command line, as a user runs them: the fixture's
three papers in bubblewrap, a local OpenAI-compatible server as the solver (it reads the
paper's config with the harness's shell tool and writes a partial submission with its
write_file tool), the offline search agents, and the scripted grader. The runs must
finish, every rollout carry its graded tree, the grader's calls be ``agent_calls`` rows of
role ``grader``, and the evidence the mutators read hold each leaf's verdict and reason."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer, reply, run_cli_against, tool_call

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]  # whole runs of cold harness processes in sandboxes

PAPERS = Path(__file__).resolve().parents[1] / "fixtures" / "paperbench" / "papers"

# What the scripted solver writes for each paper: every Code Development term of the
# rubric but one, so each paper scores below 1 and its failed leaf has a reason to read.
SUBMISSIONS = {
    "tiny-attention": ("attention.py", "def scaled_dot_product(q, k, v):\n    return q @ k.T @ v\n"),
    "tiny-layernorm": ("layernorm.py", "def layer_norm(x, eps=1e-5):\n    return (x - x.mean()) / (x.var() + eps)\n"),
    "tiny-momentum": ("momentum.py", "def momentum_step(p, g, velocity, mu, lr):\n"
                                     "    velocity = mu * velocity - lr * g\n    return p + velocity, velocity\n"),
}
MISSING = {"tiny-attention": "impl-mask", "tiny-layernorm": "norm-affine"}  # the leaves left to fail


def _tool_names(body: dict[str, Any]) -> set[str]:
    return {t.get("function", {}).get("name") for t in body.get("tools") or []}


def paper_policy(body: dict[str, Any]) -> Reply:
    """Reads /home/paper/config.yaml with the harness's shell tool, writes that paper's
    submission with its write_file tool, then stops. Answers from the conversation, so
    concurrent rollouts each get a coherent dialogue."""
    msgs = body.get("messages", [])
    results = [str(m.get("content")) for m in msgs if m.get("role") == "tool"]
    shell = next((n for n in ("bash", "execute") if n in _tool_names(body)), None)
    if not results:
        if shell is None:
            return tool_call("read_file", {"file_path": "/home/paper/config.yaml"}, prompt_tokens=300,
                             completion_tokens=20)
        return tool_call(shell, {"command": "cat /home/paper/config.yaml"}, prompt_tokens=300, completion_tokens=20)
    if len(results) == 1:
        paper = re.search(r"id: (\S+)", results[0])
        name, text = SUBMISSIONS.get(paper.group(1) if paper else "", ("notes.md", "no paper found\n"))
        return tool_call("write_file", {"file_path": f"/home/submission/{name}", "content": text},
                         prompt_tokens=400, completion_tokens=60)
    return reply("The submission is written.", prompt_tokens=450, completion_tokens=8)


def _run(tmp_path: Path, srv: ScriptedOpenAIServer, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    return run_cli_against(srv.url, tmp_path, *args, "benchmark=paperbench", f"benchmark.path={PAPERS}",
                           "executor.grader.scripted=true")


def _rows(run_dir: Path, table: str) -> list[dict]:
    return [r for f in sorted((run_dir / table).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def _leaves(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node] if "sub_tasks" not in node else [lf for c in node["sub_tasks"] for lf in _leaves(c)]


def _assert_graded_and_metered(run_dir: Path) -> list[dict]:
    from milo_ray.store.parquet import open_run

    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"
    rollouts = _rows(run_dir, "rollouts")
    assert rollouts and all(r["error_kind"] is None for r in rollouts), \
        [(r["task_id"], r["error_kind"], r["error"]) for r in rollouts if r["error_kind"]]
    store = open_run(run_dir)
    grader_rows = [c for c in _rows(run_dir, "agent_calls") if c["role"] == "grader"]
    leaves_graded = 0
    for r in rollouts:
        trace = store.get_blob(r["trace_ref"])
        details = trace["verifier"]["details"]
        graded = [lf for lf in _leaves(details["tree"]) if lf["status"] == "graded"]
        assert graded and all(lf["reason"] for lf in graded), details
        assert r["score"] == pytest.approx(details["score"])
        assert r["score"] < 1.0 if r["task_id"] in MISSING else r["score"] == 1.0, (r["task_id"], r["score"])
        assert len(trace["grader"]["calls"]) == details["plan"]["leaves_graded"]
        leaves_graded += details["plan"]["leaves_graded"]
    # One grader call per graded leaf of every rollout, each a row of role grader.
    assert len(grader_rows) == leaves_graded
    assert all(c["model"] == "scripted-grader" and c["input_tokens"] > 0 for c in grader_rows)
    assert all(c["role"] != "solver" or c["model"] != "scripted-grader" for c in _rows(run_dir, "agent_calls"))
    return rollouts


def _assert_evidence_has_leaf_verdicts(run_dir: Path) -> None:
    """Every evidence directory a mutator was handed names each failed leaf with its reason."""
    evidence = [p for p in run_dir.rglob("evidence") if p.is_dir() and (p / "report.md").is_file()]
    assert evidence, sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))[:50]
    checked = 0
    for edir in evidence:
        for paper, leaf in MISSING.items():
            tdir = edir / "traces" / paper
            if not tdir.is_dir():
                continue
            graded = (tdir / "graded.md").read_text()
            assert f"**FAIL** `{leaf}`" in graded and "reason: missing from the submission" in graded, graded
            checked += 1
    assert checked >= 1


def _split_file(tmp_path: Path, first: str) -> str:
    # Searched on and tested on: papers that score below 1, so the evidence and the report have a failed leaf.
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({first: ["tiny-attention"], "val": ["tiny-momentum"], "test": ["tiny-layernorm"]}))
    return f"benchmark.split_file={path}"


@pytest.fixture(scope="module")
def milo_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("milo")
    with ScriptedOpenAIServer(paper_policy) as srv:
        proc, run_dir = _run(tmp_path, srv, "method=milo_quick", "method.seeds=[minimal,stock]",
                             "method.num_islands=2", "method.search_size=1", "method.val_size=1",
                             "method.k_search=1", "method.k_val=1", "method.k_test=1", "method.max_rounds=1",
                             "method.round_sync=true", _split_file(tmp_path, "search"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir


def test_milo_completes_on_paperbench_with_the_grader_metered_and_leaf_verdicts_in_evidence(milo_run):
    rollouts = _assert_graded_and_metered(milo_run)
    assert {r["split"] for r in rollouts} >= {"search", "val", "test"}
    assert any(h["origin"] == "mutation" for h in _rows(milo_run, "harnesses"))
    _assert_evidence_has_leaf_verdicts(milo_run)


def test_the_report_shows_the_best_harnesss_rubric_subscores_and_leaf_verdicts(milo_run, tmp_path):
    from milo_ray import results
    from milo_ray.report import write_report
    from milo_ray.testing import browser

    page = write_report(milo_run, tmp_path / "report")
    html = page.read_text()
    res = results.load_run(milo_run)
    final = results.final_test(res)
    best = final.iloc[int(final["pr_at_k"].to_numpy().argmax())]
    tested = [r for r in _rows(milo_run, "rollouts") if r["harness_id"] == best["harness_id"] and r["split"] == "test"]
    section = html[html.index('<section id="rubric">'):]
    section = section[: section.index("</section>")]
    assert best["harness_id"][:10] in section
    # One table row per final-test rollout of that harness, its score the rollout's own.
    table = section[section.index('id="rubric-table"'): section.index("</table>")]
    assert table.count("<tr>") == 1 + len(tested) and tested
    for r in tested:
        assert f'data-v="{r["task_id"]}"' in table and f'data-v="{float(r["score"])!r}"' in table
    # Every leaf of the tree, with its verdict and the grader's reason, collapsed.
    assert "<details class=\"graded\"" in section and "<details open" not in section
    assert 'data-leaf="norm-fn" data-verdict="PASS"' in section and "reason: every named term occurs" in section
    assert 'data-leaf="norm-affine" data-verdict="FAIL"' in section
    assert "reason: missing from the submission: gamma, beta" in section
    if browser.chromium() is not None:
        assert browser.overflowing_tables(page, width=1400) == []


def test_ssr_completes_on_paperbench_with_the_grader_metered_and_leaf_verdicts_in_evidence(tmp_path):
    with ScriptedOpenAIServer(paper_policy) as srv:
        proc, run_dir = _run(tmp_path, srv, "method=ssr", "method.initial=minimal", "method.scales=[0.5,1.0]",
                             "method.stages=1", "method.b_v=[1]", "method.b_s=1", "method.b_f=1",
                             "method.rollouts=1", "method.test_rollouts=1", "method.patience=1",
                             "run.budget.executions=12", _split_file(tmp_path, "train"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    rollouts = _assert_graded_and_metered(run_dir)
    assert {r["split"] for r in rollouts} >= {"train", "test"}
    assert any(h["origin"] == "ssr_candidate" for h in _rows(run_dir, "harnesses"))
    _assert_evidence_has_leaf_verdicts(run_dir)
