"""MILO and SSR on ARE scenarios from the command line, as a user runs them: three copies
of the fixture's single-turn scenario (one per split) in bubblewrap, a local
OpenAI-compatible server as the solver acting through the scenario's app tools, the
offline search agents and ARE's scripted judge. The runs must finish with every rollout
judged by ARE, and the evidence the mutators read must hold the judge's verdict and the
agent's actions in the world.

Slow, and needs ARE's interpreter (``scripts/are_env.sh``, then ``MILO_RAY_ARE_PYTHON``).
"""

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
from milo_ray.testing.are import are_interpreter

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
              pytest.mark.slow]  # whole runs; each rollout starts an ARE world (20-30 s)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "are" / "single_turn.json"
# The search scenario is the one the solver gets wrong (a misspelt recipient), so the
# evidence has a failure, its judge's rationale and the wrong action to read.
WRONG = "jon@example.com"


@pytest.fixture(scope="module", autouse=True)
def are_python() -> None:
    are_interpreter()


def _suite(tmp_path: Path) -> Path:
    """A JSONL suite of the fixture under three scenario ids; in the search one the user's
    message misspells John's address, which the solver follows, so ARE's judge fails it."""
    lines = []
    for sid in ("fwd-search", "fwd-val", "fwd-test"):
        data = json.loads(FIXTURE.read_text())
        data["metadata"]["definition"]["scenario_id"] = sid
        if sid == "fwd-search":
            for event in data["events"]:
                for arg in (event.get("action") or {}).get("args") or []:
                    if arg.get("name") == "content" and "john@example.com" in str(arg.get("value")) \
                            and event.get("class_name") != "OracleEvent":
                        arg["value"] = arg["value"].replace("john@example.com", WRONG)
        lines.append(json.dumps(data))
    path = tmp_path / "scenarios.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _split_file(tmp_path: Path, first: str) -> str:
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({first: ["fwd-search"], "val": ["fwd-val"], "test": ["fwd-test"]}))
    return f"benchmark.split_file={path}"


def scenario_policy(body: dict[str, Any]) -> Reply:
    """Forwards Greg's email to the address the user's message names with the scenario's
    tool, tells the user, stops. Answers from the conversation, so concurrent rollouts each
    get a coherent dialogue."""
    offered = {t.get("function", {}).get("name") for t in body.get("tools") or []}
    if "EmailClientV2__forward_email" not in offered:
        return reply("no scenario tools were offered")
    messages = body.get("messages", [])
    done = [m for m in messages if m.get("role") == "tool"]
    if not done:
        asked = " ".join(str(m.get("content")) for m in messages if m.get("role") == "user")
        recipient = re.search(r"[\w.]+@example\.com", asked)
        return tool_call("EmailClientV2__forward_email",
                         {"email_id": "greg_email", "recipients": [recipient.group(0) if recipient else "nobody"]},
                         prompt_tokens=300, completion_tokens=30)
    if len(done) == 1:
        return tool_call("AgentUserInterface__send_message_to_user", {"content": "Done: forwarded."},
                         prompt_tokens=350, completion_tokens=10)
    return reply("Forwarded.", prompt_tokens=380, completion_tokens=4)


def _run(tmp_path: Path, srv: ScriptedOpenAIServer, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    return run_cli_against(srv.url, tmp_path, *args, "benchmark=are", f"benchmark.path={_suite(tmp_path)}",
                           timeout=1200)


def _rows(run_dir: Path, table: str) -> list[dict]:
    return [r for f in sorted((run_dir / table).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def _assert_judged(run_dir: Path) -> list[dict]:
    from milo_ray.store.parquet import open_run

    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"
    rollouts = _rows(run_dir, "rollouts")
    assert rollouts and all(r["error_kind"] is None for r in rollouts), \
        [(r["task_id"], r["error_kind"], r["error"]) for r in rollouts if r["error_kind"]]
    store = open_run(run_dir)
    for r in rollouts:
        details = store.get_blob(r["trace_ref"])["verifier"]["details"]
        assert details["scenario_id"] == r["task_id"] and details["judge"] == "scripted"
        # The misspelt search scenario fails; the others pass.
        assert r["score"] == (0.0 if r["task_id"] == "fwd-search" else 1.0), (r["task_id"], details)
        assert details["actions"][0]["tool"] == "EmailClientV2__forward_email"
    return rollouts


def _assert_evidence_has_the_judgment(run_dir: Path) -> None:
    evidence = [p for p in run_dir.rglob("evidence") if p.is_dir() and (p / "report.md").is_file()]
    judged = [t for e in evidence for t in (e / "traces" / "fwd-search").glob("**/judged.md")]
    assert judged, sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))[:50]
    text = judged[0].read_text()
    assert "verdict: failure" in text and WRONG in text and "EmailClientV2__forward_email" in text, text


def test_milo_completes_on_are_scenarios_with_the_judgment_in_evidence(tmp_path):
    with ScriptedOpenAIServer(scenario_policy) as srv:
        proc, run_dir = _run(tmp_path, srv, "method=milo_quick", "method.seeds=[minimal,stock]",
                             "method.num_islands=2", "method.search_size=1", "method.val_size=1",
                             "method.k_search=1", "method.k_val=1", "method.k_test=1", "method.max_rounds=1",
                             "method.round_sync=true", _split_file(tmp_path, "search"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    rollouts = _assert_judged(run_dir)
    assert {r["split"] for r in rollouts} >= {"search", "val", "test"}
    assert any(h["origin"] == "mutation" for h in _rows(run_dir, "harnesses"))
    _assert_evidence_has_the_judgment(run_dir)


def test_ssr_completes_on_are_scenarios_with_the_judgment_in_evidence(tmp_path):
    with ScriptedOpenAIServer(scenario_policy) as srv:
        proc, run_dir = _run(tmp_path, srv, "method=ssr", "method.initial=minimal", "method.scales=[0.5,1.0]",
                             "method.stages=1", "method.b_v=[1]", "method.b_s=1", "method.b_f=1",
                             "method.rollouts=1", "method.test_rollouts=1", "method.patience=1",
                             "run.budget.executions=12", _split_file(tmp_path, "train"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    rollouts = _assert_judged(run_dir)
    assert {r["split"] for r in rollouts} >= {"train", "test"}
    assert any(h["origin"] == "ssr_candidate" for h in _rows(run_dir, "harnesses"))
    _assert_evidence_has_the_judgment(run_dir)
