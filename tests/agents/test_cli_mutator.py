"""The CLI mutator runs an installed coding-agent CLI in the shared workspace with the
shared instructions, reads the child back from out/, reports the CLI's usage, and
rejects (never raises for) a CLI that writes nothing, writes elsewhere, hangs past its
cap (its whole process group killed), fails, or is missing.

The CLIs here are small Python scripts named ``claude`` / ``codex`` put first on PATH:
like the real ones they get only the prompt, and find their paths in its text."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from milo_ray.agents.mutators.cli import CliMutator, parse_output
from milo_ray.agents.protocols import MutationRequest
from milo_ray.harness.model import Harness
from milo_ray.search.mutation import ValidationOptions, run_mutation

TARGET = "milo_ray.agents.mutators.cli.CliMutator"
SEED = Path(__file__).resolve().parents[2] / "milo_ray" / "harness" / "seeds" / "minimal"
CHANGED = "# the fake CLI's change: fewer steps\n"
NO_VALIDATION = ValidationOptions(enabled=False)

# What every fake does with the prompt: the paths a real CLI would read in it.
FAKE_HEAD = f"""#!{sys.executable}
import json, os, re, subprocess, sys, time
prompt = next((a for a in sys.argv[1:] if "Write the complete child harness" in a), "")
out = re.search(r"Write the complete child harness to `([^`]+)`", prompt).group(1)
parent = re.search(r"The parent harness: `([^`]+)`", prompt).group(1)
mode = os.environ.get("FAKE_MODE", "ok")
child = open(parent).read() + {CHANGED!r}
"""

FAKE_CLAUDE = FAKE_HEAD + textwrap.dedent("""
    if mode == "ok":
        open(out, "w").write(child)
    elif mode == "parent":
        open(parent, "w").write(child)
    elif mode == "fail":
        sys.stderr.write("starting\\nboom: invalid API key\\n")
        sys.exit(3)
    elif mode == "sleep":
        pids = os.environ["FAKE_PIDS"]
        kid = subprocess.Popen(["sleep", "60"])
        open(os.path.join(pids, "cli"), "w").write(str(os.getpid()))
        open(os.path.join(pids, "grandchild"), "w").write(str(kid.pid))
        time.sleep(60)
    print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "num_turns": 4,
                      "result": "Added a step limit\\nThe agent looped on failing commands.",
                      "total_cost_usd": 0.0421,
                      "usage": {"input_tokens": 1200, "cache_creation_input_tokens": 300,
                                "cache_read_input_tokens": 500, "output_tokens": 250}}))
""")

FAKE_CODEX = FAKE_HEAD + textwrap.dedent("""
    def emit(**e):
        print(json.dumps(e), flush=True)
    emit(type="thread.started", thread_id="t-1")
    emit(type="turn.started")
    emit(type="item.completed", item={"id": "item_0", "type": "reasoning", "text": "reading the parent"})
    emit(type="turn.completed", usage={"input_tokens": 1000, "cached_input_tokens": 800, "output_tokens": 100})
    open(out, "w").write(child)
    emit(type="item.completed", item={"id": "item_1", "type": "agent_message", "text": "Verify before stopping"})
    emit(type="turn.completed", usage={"input_tokens": 2000, "cached_input_tokens": 1500, "output_tokens": 300})
""")


@pytest.fixture
def bin_dir(tmp_path, monkeypatch):
    d = tmp_path / "bin"
    d.mkdir()
    for name, text in (("claude", FAKE_CLAUDE), ("codex", FAKE_CODEX)):
        (d / name).write_text(text)
        (d / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ.get('PATH', '')}")
    return d


def request(tmp: Path) -> MutationRequest:
    parent = Harness.from_dir(SEED, name="minimal")
    parent_dir = parent.write_to(tmp / "store" / "parent")
    evidence = tmp / "store" / "evidence"
    (evidence / "traces" / "task-a").mkdir(parents=True)
    (evidence / "report.md").write_text("task-a: failed (looped on a failing command)\n")
    (evidence / "traces" / "task-a" / "trajectory.json").write_text(json.dumps({"steps": []}))
    memory = f"# Island 0\n- root: pass rate 0.25, harness {parent_dir}/harness.py\n"
    workdir = tmp / "mutations" / "round-1"
    workdir.mkdir(parents=True)
    return MutationRequest(parent=parent, parent_dir=parent_dir, evidence_dir=evidence, memory_markdown=memory,
                           workdir=workdir, seed=7, context={"island": 0, "round": 1})


def spec(**kw) -> dict:
    # These tests are about the host mode (trusted_host); the sandboxed one, with its
    # gateway, is tests/agents/test_cli_mutator_sandbox.py.
    return {"_target_": TARGET, "trusted_host": True, **kw}


def test_claude_child_is_read_back_valid_with_the_usage_the_cli_reported(tmp_path, bin_dir):
    req = request(tmp_path)
    out = run_mutation(spec(preset="claude", env={"FAKE_MODE": "ok"}), req, time_cap_s=60,
                       validation=ValidationOptions(timeout_s=60))
    assert out.ok, out.reason
    assert out.child.source == req.parent.source + CHANGED
    assert out.usage.input_tokens == 1200 + 300 + 500  # cache reads and writes are input the model processed
    assert out.usage.output_tokens == 250
    assert out.usage.cost_usd == pytest.approx(0.0421)
    assert out.report.splitlines()[0] == "Added a step limit"
    # The transcript sits beside the workdir, never inside it (the runner reads every file
    # there as the child); the workspace is gone, the parent the run stored is untouched.
    stdout = req.workdir.parent / "round-1.cli-stdout.txt"
    assert json.loads(stdout.read_text())["total_cost_usd"] == 0.0421
    assert sorted(p.name for p in req.workdir.iterdir()) == ["harness.py"]
    assert not (req.workdir.parent / "round-1.cli-workspace").exists()
    assert (req.parent_dir / "harness.py").read_text() == req.parent.source


def test_codex_jsonl_usage_is_summed_over_turns_and_priced_from_tokens(tmp_path, bin_dir):
    req = request(tmp_path)
    out = run_mutation(spec(preset="codex", usd_per_mtok_input=1.0, usd_per_mtok_output=10.0), req,
                       time_cap_s=60, validation=NO_VALIDATION)
    assert out.ok, out.reason
    assert out.child.source.endswith(CHANGED)
    assert (out.usage.input_tokens, out.usage.output_tokens) == (3000, 400)  # cached tokens are part of input
    assert out.usage.cost_usd == pytest.approx((3000 * 1.0 + 400 * 10.0) / 1e6)
    assert out.report == "Verify before stopping"


def test_tokens_without_a_price_are_of_unknown_cost_never_free(tmp_path, bin_dir):
    out = run_mutation(spec(preset="codex"), request(tmp_path), time_cap_s=60, validation=NO_VALIDATION)
    assert out.ok, out.reason
    assert out.usage.tokens == 3400 and out.usage.cost_usd is None


def test_a_cli_that_writes_nothing_is_rejected_with_the_reason(tmp_path, bin_dir):
    out = run_mutation(spec(preset="claude", env={"FAKE_MODE": "nothing"}), request(tmp_path), time_cap_s=60,
                       validation=NO_VALIDATION)
    assert out.child is None
    assert "nothing was written to" in out.error and "out/harness.py" in out.error
    assert out.usage.cost_usd == pytest.approx(0.0421)  # the spend is real even without a child


def test_a_cli_that_edits_the_parent_copy_is_rejected_naming_the_path(tmp_path, bin_dir):
    req = request(tmp_path)
    out = run_mutation(spec(preset="claude", env={"FAKE_MODE": "parent"}), req, time_cap_s=60,
                       validation=NO_VALIDATION)
    assert out.child is None
    assert "wrote elsewhere" in out.error and "parent/harness.py" in out.error
    assert (req.parent_dir / "harness.py").read_text() == req.parent.source  # it edited a copy


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie is dead, waiting for a parent that does not reap


def test_a_cli_past_its_cap_is_killed_with_everything_it_started(tmp_path, bin_dir):
    pids = tmp_path / "pids"
    pids.mkdir()
    t0 = time.monotonic()
    out = run_mutation(spec(preset="claude", time_cap_s=1.5, env={"FAKE_MODE": "sleep", "FAKE_PIDS": str(pids)}),
                       request(tmp_path), time_cap_s=60, validation=NO_VALIDATION)
    assert time.monotonic() - t0 < 15
    assert out.child is None and out.error == "timed out after 1.5s"
    assert out.usage.cost_usd is None  # killed mid-run: its spend is unknown
    cli, grandchild = (int((pids / n).read_text()) for n in ("cli", "grandchild"))
    deadline = time.monotonic() + 5
    while (_alive(cli) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(cli), "the CLI survived its cap"
    assert not _alive(grandchild), "a process the CLI started survived the cap"


def test_a_failing_cli_is_rejected_naming_its_exit_code_and_stderr(tmp_path, bin_dir):
    out = run_mutation(spec(preset="claude", env={"FAKE_MODE": "fail"}, pass_env=["MILO_TEST_UNSET_KEY"]),
                       request(tmp_path), time_cap_s=60, validation=NO_VALIDATION)
    assert out.child is None
    assert "exited with code 3" in out.error and "boom: invalid API key" in out.error
    assert "MILO_TEST_UNSET_KEY" in out.error  # a key name passed but not set is named


def test_only_the_named_environment_reaches_the_cli(tmp_path, bin_dir, monkeypatch):
    monkeypatch.setenv("MILO_TEST_KEY", "k-123")
    monkeypatch.setenv("MILO_TEST_OTHER", "not passed")
    script = bin_dir / "envdump"
    script.write_text(f"#!{sys.executable}\nimport json, os\nprint(json.dumps(dict(os.environ)))\n")
    script.chmod(0o755)
    req = request(tmp_path)
    run_mutation(spec(command=["envdump", "{prompt}"], pass_env=["MILO_TEST_KEY"], env={"MODE": "x"}), req,
                 time_cap_s=60, validation=NO_VALIDATION)
    seen = json.loads((req.workdir.parent / "round-1.cli-stdout.txt").read_text())
    assert seen["MILO_TEST_KEY"] == "k-123" and seen["MODE"] == "x"
    assert "MILO_TEST_OTHER" not in seen


def test_a_missing_executable_is_rejected_with_a_clear_reason(tmp_path, bin_dir):
    out = run_mutation(spec(command="no-such-agent-cli -p {prompt}"), request(tmp_path), time_cap_s=60,
                       validation=NO_VALIDATION)
    assert out.child is None
    assert out.error == "executable 'no-such-agent-cli' not found on PATH"


@pytest.mark.parametrize("kw, field", [
    ({"command": ["claude", "-p", "{promt}"]}, "command"),
    ({"command": ["claude", "-p", "{prompt.upper}"]}, "command"),
    ({"command": ["claude", "--model", "{model}", "{prompt}"]}, "model"),
    ({"command": ["claude", "{prompt}"], "preset": "claude"}, "preset"),
    ({"preset": "aider"}, "preset"),
    ({"preset": "claude", "usage_format": "xml"}, "usage_format"),
    ({"preset": "claude", "env": {"ANTHROPIC_API_KEY": "sk-..."}}, "pass_env"),
    ({"preset": "claude", "usd_per_mtok_input": 1.0}, "usd_per_mtok_output"),
    ({"preset": "claude", "pass_env": ["ANTHROPIC_API_KEY"]}, "trusted_host"),
    ({"command": ["aider", "{prompt}"]}, "base_url_env"),
    ({"command": ["aider", "{prompt}"], "base_url_env": "B", "token_env": "T", "gateway_api": "grpc"}, "gateway_api"),
])
def test_bad_config_is_an_error_at_construction_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        CliMutator(**kw)


def test_the_claude_preset_lets_the_agent_read_lineage_files_outside_the_workspace(tmp_path, bin_dir):
    script = bin_dir / "argdump"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    script.chmod(0o755)
    other = Harness.from_dir(SEED).write_to(tmp_path / "lineage" / "node-2")
    req = request(tmp_path)
    req = MutationRequest(**{**req.__dict__, "memory_markdown": req.memory_markdown
                             + f"- node-2: rejected, harness {other}/harness.py\n"})
    agent = CliMutator(preset="claude", model="claude-sonnet-4-5", trusted_host=True)
    agent.argv[0] = "argdump"  # same argv, a CLI that prints it
    assert agent.mutate(req).child is None
    argv = json.loads((req.workdir.parent / "round-1.cli-stdout.txt").read_text())
    assert argv[argv.index("--model") + 1] == "claude-sonnet-4-5"
    # Another lineage node the snapshot names is readable; the parent is read in the workspace.
    assert argv[argv.index("--add-dir") + 1] == str(other.resolve())
    assert argv.count("--add-dir") == 1


def test_output_formats_are_read_as_the_clis_print_them():
    stream = "\n".join(json.dumps(x) for x in (
        {"type": "system", "subtype": "init"},
        {"type": "assistant", "message": {"content": []}},
        {"type": "result", "subtype": "success", "result": "done", "total_cost_usd": 0.5,
         "usage": {"input_tokens": 10, "output_tokens": 5}}))
    for fmt in ("claude_json", "auto"):
        got = parse_output(stream, fmt)
        assert (got.input_tokens, got.output_tokens, got.cost_usd, got.final_message) == (10, 5, 0.5, "done")
    verbose_array = json.dumps([{"type": "system"}, {"type": "result", "result": "ok", "usage": {"output_tokens": 2}}])
    assert parse_output(verbose_array, "claude_json").output_tokens == 2
    failed = json.dumps({"type": "result", "subtype": "error_max_turns", "is_error": True, "result": ""})
    assert parse_output(failed, "claude_json").error.startswith("error_max_turns")
    codex = '{"type":"thread.started"}\n{"type":"turn.failed","error":{"message":"stream ended"}}\n'
    got = parse_output(codex, "auto")
    assert got.format == "codex_jsonl" and got.error == "stream ended" and not got.tokens_reported
    plain = parse_output("I changed the harness.\n", "auto")
    assert plain.format == "none" and plain.cost_usd is None and plain.input_tokens == plain.output_tokens == 0


def test_a_prompt_past_the_argument_limit_is_rejected_pointing_at_prompt_file(tmp_path, bin_dir):
    agent = CliMutator(command=["claude", "-p", "{prompt}"], trusted_host=True)
    agent.argv[2] = "{prompt}" + "y" * 300_000  # an argument longer than Linux's 128 KiB per-argument limit
    out = agent.mutate(request(tmp_path))
    assert out.child is None and "{prompt_file}" in out.error


def test_any_cli_given_the_prompt_as_a_file_works_and_its_unreported_spend_is_unknown(tmp_path, bin_dir):
    script = bin_dir / "filecli"
    script.write_text(FAKE_HEAD.replace(
        'prompt = next(', 'prompt = open(sys.argv[sys.argv.index("--message-file") + 1]).read() or next(')
        + 'open(out, "w").write(child)\nprint("Changed the step limit.")\n')
    script.chmod(0o755)
    req = request(tmp_path)
    out = run_mutation(spec(command="filecli --message-file {prompt_file}", name="filecli"), req, time_cap_s=60,
                       validation=NO_VALIDATION)
    assert out.ok, out.reason
    assert out.report == "Changed the step limit."
    assert out.usage.tokens == 0 and out.usage.cost_usd is None
    assert "Write the complete child harness" in (req.workdir.parent / "round-1.cli-prompt.md").read_text()
