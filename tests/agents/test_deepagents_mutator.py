"""The deepagents mutator end to end, offline: a real deepagents agent in a real bwrap
sandbox, talking through litellm to a local scripted OpenAI-compatible server whose
policies act like coding agents (milo_ray.testing.scripted_agents)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from milo_ray.agents.mutators.deepagents import AGENT_ROOT, DeepAgentsMutator, OutOnlyBackend, transcript_path
from milo_ray.agents.protocols import MutationRequest
from milo_ray.harness.seeds import load_seeds
from milo_ray.search.mutation import ValidationOptions, run_mutation
from milo_ray.testing import scripted_agents as sa
from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV, Reply, ScriptedOpenAIServer, reply, tool_call

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="the mutator's sandbox needs bwrap"),
              pytest.mark.usefixtures("key_env")]

KEY = SCRIPTED_KEY_ENV
TARGET = "milo_ray.agents.mutators.deepagents.DeepAgentsMutator"
OUTPUT = f"{AGENT_ROOT}/out/harness.py"
PARENT = f"{AGENT_ROOT}/parent/harness.py"
NO_VALIDATION = ValidationOptions(enabled=False)


def spec(srv: ScriptedOpenAIServer, **kw: Any) -> dict[str, Any]:
    return {"_target_": TARGET, "llm": {"model": "openai/scripted", "api_base": srv.url, "api_key_env": KEY,
                                        "max_retries": 0}, "time_cap_s": 60.0, **kw}


def make_request(root: Path, *, memory: str = "", context: dict[str, Any] | None = None,
                 task: str = "t1") -> MutationRequest:
    """A parent (the minimal seed) with a small evidence directory of one failed task."""
    parent = load_seeds(["minimal"])[0]
    pdir = parent.write_to(root / "nodes" / "parent")
    ev = root / "evidence"
    (ev / "traces" / task).mkdir(parents=True)
    (ev / "report.md").write_text(f"# Evidence\n\n| task | passed |\n|---|---|\n| {task} | no |\n")
    (ev / "traces" / task / "trajectory.json").write_text(json.dumps({"steps": [{"role": "user", "content": "go"}]}))
    return MutationRequest(parent=parent, parent_dir=pdir, evidence_dir=ev, memory_markdown=memory,
                           workdir=root / "work", seed=11, context=context or {})


def served_tokens(srv: ScriptedOpenAIServer) -> tuple[int, int]:
    return sum(r.prompt_tokens for r in srv.answered), sum(r.completion_tokens for r in srv.answered)


def first_prompt(srv: ScriptedOpenAIServer) -> str:
    return sa.instructions(srv.requests[0])


def tool_texts(srv: ScriptedOpenAIServer) -> list[str]:
    return [sa.text_of(m.get("content")) for m in sa.tool_results(srv.requests[-1])]


def test_a_child_written_by_the_agent_is_read_back_validated_and_paid_for(tmp_path):
    req = make_request(tmp_path)
    with ScriptedOpenAIServer(sa.mutator_policy) as srv:
        out = run_mutation(spec(srv), req, time_cap_s=120, validation=ValidationOptions(timeout_s=120))
        tokens = served_tokens(srv)
    assert out.ok, out.reason
    # The parent's source, read through the agent's read_file, plus the marker line.
    assert out.child.source.startswith(req.parent.source.rstrip("\n"))
    assert sa.MARKER in out.child.source and out.child.source != req.parent.source
    assert set(out.child.files) == {"harness.py"}  # the transcript is not part of the child
    assert out.report.startswith(sa.REPORT_LINE)
    assert (out.usage.input_tokens, out.usage.output_tokens) == tokens == (2300, 480)
    assert out.usage.error is None and out.usage.seconds > 0
    saved = json.loads(transcript_path(req).read_text())
    assert transcript_path(req).parent == req.workdir.parent
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert saved["messages"][2]["content"].count("def build_agent") == 1
    assert all("timestamp" in m for m in saved["messages"]) and len(saved["calls"]) == 3
    # The instructions named the paths as the agent sees them.
    assert f"`{PARENT}`" in first_prompt(srv) and f"`{OUTPUT}`" in first_prompt(srv)


def test_an_agent_that_writes_nothing_is_rejected_with_the_reason(tmp_path):
    memory = "# Experience records (1 of 1)\n\n## 1. t1 (score 0.00)\n\nIt stopped before testing.\n"
    req = make_request(tmp_path, memory=memory, context={"records": [{"task_id": "t1"}], "scale": 1})
    with ScriptedOpenAIServer(sa.idle_policy) as srv:
        out = run_mutation(spec(srv), req, time_cap_s=120, validation=NO_VALIDATION)
    assert out.child is None
    assert out.error == f"no child: nothing was written to {OUTPUT}"
    assert out.usage.error == out.error and out.usage.input_tokens == sa.REPORT_TOKENS[0]
    # An SSR request: the ranked records are inline, the raw runs are files.
    prompt = first_prompt(srv)
    assert "It stopped before testing." in prompt and f"{AGENT_ROOT}/evidence/traces/t1/trajectory.json" in prompt
    assert "(1 experience records)" in prompt


def test_a_shell_write_outside_the_output_is_rejected_naming_the_path(tmp_path):
    req = make_request(tmp_path)
    before = (req.parent_dir / "harness.py").read_text()
    with ScriptedOpenAIServer(sa.stray_write_policy) as srv:
        out = run_mutation(spec(srv), req, time_cap_s=120, validation=NO_VALIDATION)
    assert out.child is None
    assert out.error == f"no child at {OUTPUT}; the agent wrote elsewhere: {PARENT}"
    assert (req.parent_dir / "harness.py").read_text() == before  # the agent only had a copy


def test_the_file_tools_refuse_writes_outside_the_output(tmp_path):
    req = make_request(tmp_path)
    with ScriptedOpenAIServer(sa.refused_write_policy) as srv:
        out = run_mutation(spec(srv), req, time_cap_s=120, validation=NO_VALIDATION)
    told = tool_texts(srv)
    assert len(told) == 1 and told[0].startswith(f"read-only: write only under {AGENT_ROOT}/out/")
    assert out.child is None and out.error == f"no child: nothing was written to {OUTPUT}"
    assert "read-only" in out.report


def test_the_backend_refusal_sees_through_dot_dot_and_prefixes():
    b = OutOnlyBackend(None, f"{AGENT_ROOT}/out")  # type: ignore[arg-type]  # refusal needs no sandbox
    assert b.refusal(f"{AGENT_ROOT}/out/harness.py") is None
    assert b.refusal(f"{AGENT_ROOT}/out/lib/util.py") is None
    assert b.refusal("out/harness.py") is None  # relative to the workspace
    for bad in (f"{AGENT_ROOT}/out/../parent/harness.py", f"{AGENT_ROOT}/outside.py", f"{AGENT_ROOT}/out",
                "/tmp/x.py", "/large_tool_results/call_1"):
        assert b.refusal(bad) is not None, bad
    up = b.upload_files([("/tmp/a", b"x")])
    assert up[0].error.startswith("read-only")


def test_an_agent_slower_than_its_cap_is_stopped_quickly(tmp_path):
    req = make_request(tmp_path)
    with ScriptedOpenAIServer(sa.slow_policy(60.0)) as srv:
        DeepAgentsMutator(spec(srv)["llm"]).gateway().local_url()  # start the gateway (litellm) outside the clock
        t0 = time.monotonic()
        out = run_mutation(spec(srv, time_cap_s=2.0), req, time_cap_s=20, validation=NO_VALIDATION)
        elapsed = time.monotonic() - t0
    assert out.child is None and out.error == "timed out after 2s"
    assert out.usage.cost_usd is None  # the cut-off call's spend is unknown
    assert elapsed < 15, elapsed
    assert json.loads(transcript_path(req).read_text())["error"] == "timed out after 2s"


def test_graft_renders_the_graft_instructions_and_writes_the_child(tmp_path):
    donor = load_seeds(["plan_and_solve"])[0]
    ddir = donor.write_to(tmp_path / "nodes" / "donor")
    req = make_request(tmp_path, context={"mode": "graft", "co_parent_source": donor.source,
                                          "co_parent_dir": str(ddir), "dest_island": 0, "donor_island": 2,
                                          "diagnosis": "island 0 stops before verifying its work",
                                          "why": "island 2 plans and checks each step"})
    with ScriptedOpenAIServer(sa.mutator_policy) as srv:
        out = run_mutation(spec(srv, instructions="graft"), req, time_cap_s=120, validation=NO_VALIDATION,
                           call="graft")
    assert out.ok, out.reason
    assert sa.MARKER in out.child.source
    prompt = first_prompt(srv)
    assert f"`{AGENT_ROOT}/co_parent/harness.py`" in prompt
    assert "island 0 stops before verifying its work" in prompt and "island 2 plans and checks each step" in prompt
    flat = " ".join(prompt.split())
    assert "Island 0 has stalled" in flat and "island 2 has a mechanism" in flat


def test_lineage_nodes_named_by_the_snapshot_are_readable_at_their_host_paths(tmp_path):
    # tmp_path is under the host's /tmp, which the sandbox replaces with a private one.
    node = tmp_path / "run" / "nodes" / "n1"
    node.mkdir(parents=True)
    (node / "harness.py").write_text("# node n1: the sibling that passed t1\n")
    # A trajectory may quote any host path; only lineage node directories are mounted.
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "notes.txt").write_text("not for the agent\n")
    reads = [str(node / "harness.py"), str(other / "notes.txt")]
    req = make_request(tmp_path, memory=f"- n1 (admitted, pass 0.5): {reads[0]}\n- it ran cat {reads[1]}\n")

    def policy(body: dict[str, Any]) -> Reply:
        done = len(sa.tool_results(body))
        if done < len(reads):
            return tool_call("read_file", {"file_path": reads[done]}, call_id=f"call_{done}")
        return reply("read them")

    with ScriptedOpenAIServer(policy) as srv:
        out = DeepAgentsMutator(spec(srv)["llm"]).mutate(req)
    node_read, other_read = tool_texts(srv)
    assert "the sibling that passed t1" in node_read
    assert "not for the agent" not in other_read and "file_not_found" in other_read
    assert out.error == f"no child: nothing was written to {OUTPUT}"


def test_the_constructor_checks_its_fields_without_calling_the_model():
    llm = {"model": "openai/scripted", "api_base": "http://127.0.0.1:9", "api_key_env": KEY}
    m = DeepAgentsMutator(llm)
    assert m.name == "deepagents:openai/scripted"
    with pytest.raises(ValueError, match="mutator.instructions"):
        DeepAgentsMutator(llm, instructions="rewrite")
    with pytest.raises(ValueError, match="mutator.sandbox"):
        DeepAgentsMutator(llm, sandbox={"no_such_option": 1})
    with pytest.raises(ValueError, match="mutator.time_cap_s"):
        DeepAgentsMutator(llm, time_cap_s=0)
    with pytest.raises(ValueError, match="llm.model"):
        DeepAgentsMutator({"api_base": "http://127.0.0.1:9"})


def test_one_instance_serves_concurrent_mutations_each_with_its_own_usage(tmp_path):
    from milo_ray.search.mutation import run_mutations

    reqs = [make_request(tmp_path / f"r{i}", task=f"t{i}") for i in range(2)]
    with ScriptedOpenAIServer(sa.mutator_policy) as srv:
        outs = run_mutations(spec(srv), reqs, time_cap_s=120, validation=NO_VALIDATION, max_concurrent=2,
                             use_ray=False)
    assert all(o.ok for o in outs), [o.reason for o in outs]
    assert [(o.usage.input_tokens, o.usage.output_tokens) for o in outs] == [(2300, 480)] * 2
    # Each call answered its own conversation (the evidence listing differs).
    assert outs[0].child.harness_id != outs[1].child.harness_id


def test_a_failing_endpoint_is_an_error_with_usage_never_an_exception(tmp_path):
    req = make_request(tmp_path)
    with ScriptedOpenAIServer([Reply(status=500)]) as srv:
        out = DeepAgentsMutator(spec(srv)["llm"]).mutate(req)
    assert out.child is None and out.error.startswith("model call failed: "), out.error
    assert out.usage.error == out.error and len(srv.requests) == 1  # max_retries=0


def test_the_step_limit_stops_the_agent_with_an_error_naming_it(tmp_path):
    req = make_request(tmp_path)
    with ScriptedOpenAIServer(sa.mutator_policy) as srv:
        out = DeepAgentsMutator(spec(srv)["llm"], recursion_limit=3).mutate(req)
    assert out.child is None and out.error == "stopped at the step limit (recursion_limit=3 graph steps)"
    assert out.usage.input_tokens == sa.READ_TOKENS[0]
