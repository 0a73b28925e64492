"""ARE scenarios run for real in ARE's own interpreter (milo_ray/benchmarks/are/host.py via
episode.py) on this project's two fixtures (tests/fixtures/are/): the reference solution
scores 1, a wrong action fails on ARE's deterministic checks without any LLM call, and an
agent reaches the environment only through the scenario's app tools.

Slow (an ARE process takes 20-30 s to load and preprocess a scenario on a small machine)
and needs the ARE interpreter: ``scripts/are_env.sh``, then ``MILO_RAY_ARE_PYTHON``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from milo_ray.benchmarks.are.episode import Episode, score_of
from milo_ray.boundary.inside.task_tools import WAIT_TOOL, channel_tools
from milo_ray.testing.are import are_interpreter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "are"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def are_python() -> Path:
    return are_interpreter()


class CountingGrader:
    """The grader role as the verifier sees it, counting calls; answers like a lenient judge."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def ask(self, system: str, user: str, *, purpose: str) -> str:
        self.calls.append(purpose)
        return "[[True]]"


@pytest.mark.parametrize("fixture", ["single_turn.json", "multi_turn.json"])
def test_oracle_scores_one(fixture, are_python, tmp_path):
    grader = CountingGrader()
    ep = Episode(FIXTURES / fixture, tmp_path / "tools.sock", mode="oracle", judge="scripted", grader=grader,
                 python=are_python, log=tmp_path / "host.log")
    try:
        ep.wait_ready()
        verdict = ep.finish()
    finally:
        ep.close()
    assert score_of(verdict) == (1.0, None), (verdict, (tmp_path / "host.log").read_text()[-3000:])
    assert grader.calls == [] and verdict["judge_llm_calls"] == 0


def _drive(ep: Episode, recipient: str) -> None:
    tools = {t.name: t for t in channel_tools(str(ep.socket))}
    # The user's first message was delivered before the tools were served (the agent has it
    # as its instruction): it is no notification.
    note = tools[WAIT_TOOL].invoke({"timeout_s": 0})
    assert "Forward Greg's email" not in note
    # Only the scenario's app tools: an environment-side method (one that makes an email
    # arrive) or an app's state is no tool of the agent's.
    assert "EmailClientV2__send_email_to_user_only" not in tools
    assert "EmailClientV2__add_email" not in tools and "EmailClientV2__folders" not in tools
    assert all("__" in name for name in tools if name != WAIT_TOOL)
    tools["EmailClientV2__forward_email"].invoke({"email_id": "greg_email", "recipients": [recipient]})
    tools["AgentUserInterface__send_message_to_user"].invoke({"content": "Done: forwarded."})


def test_wrong_recipient_fails_with_no_llm_call(are_python, tmp_path):
    grader = CountingGrader()
    ep = Episode(FIXTURES / "single_turn.json", tmp_path / "tools.sock", mode="agent", judge="grader", grader=grader,
                 python=are_python, log=tmp_path / "host.log")
    try:
        ep.wait_ready()
        _drive(ep, "jon@example.com")
        verdict = ep.finish()
    finally:
        ep.close()
    assert score_of(verdict) == (0.0, None), verdict
    assert grader.calls == [] and verdict["judge_llm_calls"] == 0


def test_harness_reaches_environment_through_its_tools_only(are_python, tmp_path):
    import json
    import socket

    ep = Episode(FIXTURES / "single_turn.json", tmp_path / "tools.sock", mode="agent", judge="scripted",
                 python=are_python, log=tmp_path / "host.log")
    try:
        ep.wait_ready()
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(ep.socket))
            f = s.makefile("rb")
            for name in ("EmailClientV2__send_email_to_user_only", "EmailClientV2__folders", "scenario",
                         "EmailClientV2__get_state", "EmailClientV2__load_state"):
                s.sendall(json.dumps({"op": "call", "name": name, "args": {}}).encode() + b"\n")
                reply = json.loads(f.readline())
                assert not reply["ok"] and "no tool named" in reply["error"], (name, reply)
        _drive(ep, "john@example.com")
        verdict = ep.finish()
    finally:
        ep.close()
    # The refused calls changed nothing: the right actions through the tools still pass.
    assert score_of(verdict) == (1.0, None), verdict


class ScriptedVerdicts(CountingGrader):
    """A grader whose every answer is ``answer`` (ARE's checkers read [[True]]/[[Success]]
    or [[False]]/[[Failure]]); ``refuse`` makes every call a spent budget."""

    def __init__(self, answer: str = "", refuse: bool = False) -> None:
        super().__init__()
        self.answer, self.refuse = answer, refuse

    def ask(self, system: str, user: str, *, purpose: str) -> str:
        from milo_ray.core.tasks import GraderRefused

        self.calls.append(purpose)
        if self.refuse:
            raise GraderRefused("grading budget spent")
        return self.answer


@pytest.mark.parametrize("grader,score", [(ScriptedVerdicts("[[True]]\n[[Success]]"), 1.0),
                                          (ScriptedVerdicts("[[False]]\n[[Failure]]"), 0.0),
                                          (ScriptedVerdicts(refuse=True), 0.0)],
                         ids=["grader_accepts", "grader_rejects", "budget_spent"])
def test_free_text_in_the_agents_own_words_is_judged_by_the_grader_role(grader, score, are_python, tmp_path):
    ep = Episode(FIXTURES / "single_turn.json", tmp_path / "tools.sock", mode="agent", judge="grader", grader=grader,
                 python=are_python, log=tmp_path / "host.log")
    try:
        ep.wait_ready()
        tools = {t.name: t for t in channel_tools(str(ep.socket))}
        tools["EmailClientV2__forward_email"].invoke({"email_id": "greg_email", "recipients": ["john@example.com"]})
        tools["AgentUserInterface__send_message_to_user"].invoke(
            {"content": "I have sent Greg's music list on to John as you asked."})
        verdict = ep.finish()
    finally:
        ep.close()
    assert score_of(verdict)[0] == score, verdict
    assert grader.calls and all(p.startswith("are:") for p in grader.calls)
    assert ep.grader_calls == len(grader.calls) and ep.grader_refused == (len(grader.calls) if grader.refuse else 0)
    assert ep.grader_failed == 0


def test_a_multi_turn_scenario_releases_its_next_turn_and_a_reply_through_the_wait_tool(are_python, tmp_path):
    ep = Episode(FIXTURES / "multi_turn.json", tmp_path / "tools.sock", mode="agent", judge="scripted",
                 python=are_python, log=tmp_path / "host.log")
    try:
        ep.wait_ready()
        tools = {t.name: t for t in channel_tools(str(ep.socket))}
        tools["EmailClientV2__send_email"].invoke({"recipients": ["ana@example.com"], "subject": "Lunch",
                                                  "content": "Are you free for lunch on Friday?"})
        tools["AgentUserInterface__send_message_to_user"].invoke({"content": "Sent."})
        # The judge releases the second turn once the first is done; Ana's reply comes 30
        # simulated seconds later, which the wait jumps over instead of passing them.
        heard = ""
        for _ in range(6):
            heard += tools[WAIT_TOOL].invoke({"timeout_s": 60})
            if "email received from ana@example.com" in heard:
                break
        assert "email Bob" in heard and "email received from ana@example.com" in heard, heard
        tools["EmailClientV2__send_email"].invoke({"recipients": ["bob@example.com"], "subject": "Lunch with Ana",
                                                  "content": "Ana is free for lunch on Friday."})
        tools["AgentUserInterface__send_message_to_user"].invoke({"content": "Told Bob."})
        verdict = ep.finish()
    finally:
        ep.close()
    assert score_of(verdict) == (1.0, None), (verdict, (tmp_path / "host.log").read_text()[-3000:])


def test_the_worlds_apps_reach_no_host_file_through_a_models_arguments(are_python, tmp_path):
    # ARE's email client reads an attachment from any path it is given and saves
    # downloads to any directory: the world runs jailed, so neither reaches the host.
    import uuid

    secret = Path.home() / f".milo-are-secret-{uuid.uuid4().hex}"
    token = uuid.uuid4().hex
    secret.write_text(token)
    drop = tmp_path / "dropped"
    drop.mkdir()
    (tmp_path / "sock").mkdir()
    ep = Episode(FIXTURES / "single_turn.json", tmp_path / "sock" / "tools.sock", mode="agent", judge="scripted",
                 python=are_python, log=tmp_path / "host.log")
    try:
        ep.wait_ready()
        tools = {t.name: t for t in channel_tools(str(ep.socket))}
        stolen = tools["EmailClientV2__send_email"].invoke({"recipients": ["x@example.com"], "subject": "s",
                                                            "content": "c", "attachment_paths": [str(secret)]})
        assert token not in stolen and "Error" in stolen, stolen
        sent = tools["EmailClientV2__send_email"].invoke({"recipients": ["x@example.com"], "subject": "t",
                                                          "content": "c", "attachment_paths": ["/etc/hostname"]})
        email_id = sent.strip().strip('"')
        tools["EmailClientV2__download_attachments"].invoke({"email_id": email_id, "folder_name": "SENT",
                                                            "path_to_save": str(drop)})
        listed = tools["EmailClientV2__list_emails"].invoke({"folder_name": "SENT"})
        assert token not in listed
        ep.finish()
    finally:
        ep.close()
        secret.unlink()
    assert list(drop.iterdir()) == [], "a download reached the host's disk"
