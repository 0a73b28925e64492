"""Scripted coding-agent policies for :class:`~milo_ray.testing.openai_server.ScriptedOpenAIServer`:
a "model" that drives a real coding agent (deepagents' tool protocol) the way a
mutator, a graft or an SSR optimizer would, answering from the conversation it is sent
(never from arrival order), so several agents can share one server.

Each policy is a function from the request body to a :class:`Reply`. The paths it acts
on are read from the instructions in the conversation: the parent harness (a path
ending in ``parent/harness.py``) and the output (``out/harness.py``), whatever root the
agent sees them under.

* :func:`mutator_policy`: ``read_file`` the parent, then ``write_file`` the output with
  the parent's source plus one marked line, then a short report;
* :func:`idle_policy`: answers with text alone (writes nothing);
* :func:`stray_write_policy`: changes the parent's copy with the shell, then reports;
* :func:`refused_write_policy`: ``write_file`` on the parent's copy (a coding agent's
  backend refuses it), then reports;
* :func:`slow_policy`: takes ``delay_s`` before its first answer.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable

from milo_ray.testing.openai_server import Reply, reply, tool_call

Policy = Callable[[dict[str, Any]], Reply]

# (prompt, completion) tokens of each scripted answer.
READ_TOKENS = (300, 20)
WRITE_TOKENS = (900, 400)
REPORT_TOKENS = (1100, 60)
# The first line of every report a policy writes.
REPORT_LINE = "Added a marker line to the harness."
MARKER = "# scripted edit"

_PARENT = re.compile(r"(/[\w.+/-]*/parent/harness\.py)")
_OUTPUT = re.compile(r"(/[\w.+/-]*/out/harness\.py)")
# deepagents' read_file output: notices, then a status header line ``@@ lines a-b of n @@``,
# then the file's lines verbatim. (Older versions numbered each row instead: a line
# number, ``.k`` for the k-th chunk of a long line, two spaces or a tab, the text.)
_HEADER = re.compile(r"^@@ .* @@$")
_ROW = re.compile(r"^\s*(\d+)(?:\.(\d+))?(?:  |\t)(.*)$")


def text_of(content: Any) -> str:
    """The text of an OpenAI message content (a string or a list of parts)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def instructions(body: dict[str, Any]) -> str:
    """The system and user texts of a request, joined."""
    return "\n".join(text_of(m.get("content")) for m in body.get("messages", []) if m.get("role") in ("system", "user"))


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body.get("messages", []) if m.get("role") == "tool"]


def tools_called(body: dict[str, Any]) -> list[str]:
    """Names of the tools the assistant has called so far, in order."""
    return [c.get("function", {}).get("name", "") for m in body.get("messages", []) if m.get("role") == "assistant"
            for c in (m.get("tool_calls") or [])]


def paths(body: dict[str, Any]) -> tuple[str, str]:
    """(parent harness path, output path) named in the instructions."""
    text = instructions(body)
    parent, out = _PARENT.search(text), _OUTPUT.search(text)
    if parent is None or out is None:
        raise ValueError("scripted agent: the instructions name no parent/harness.py or out/harness.py path")
    return parent.group(1), out.group(1)


def source_from_read(text: str) -> str:
    """A file's text from deepagents' ``read_file`` output: what follows the status
    header, or, without one, the numbered rows (chunks of a long line joined)."""
    rows = text.splitlines()
    for i, row in enumerate(rows):
        if _HEADER.match(row):
            return "\n".join(rows[i + 1:]) + "\n"
    lines: list[str] = []
    for row in rows:
        m = _ROW.match(row)
        if m is None:
            continue
        if m.group(2) is not None and lines:
            lines[-1] += m.group(3)
        else:
            lines.append(m.group(3))
    return "\n".join(lines) + "\n"


def marked(source: str, tag: str) -> str:
    """``source`` with one comment line added: a different, still valid harness."""
    return source.rstrip("\n") + f"\n\n{MARKER} {tag}\n"


def mutator_policy(body: dict[str, Any]) -> Reply:
    """Reads the parent, writes the marked child to the output, reports. The marker
    carries a hash of the instructions, so different requests get different children."""
    parent, out = paths(body)
    called = tools_called(body)
    if "read_file" not in called:
        return tool_call("read_file", {"file_path": parent, "offset": 0, "limit": 100_000}, call_id="call_read",
                         prompt_tokens=READ_TOKENS[0], completion_tokens=READ_TOKENS[1])
    if "write_file" not in called:
        read = text_of(tool_results(body)[-1].get("content"))
        tag = hashlib.sha256(instructions(body).encode()).hexdigest()[:12]
        return tool_call("write_file", {"file_path": out, "content": marked(source_from_read(read), tag)},
                         call_id="call_write", prompt_tokens=WRITE_TOKENS[0], completion_tokens=WRITE_TOKENS[1])
    return reply(f"{REPORT_LINE}\nRefinement: one comment line, to exercise the search.",
                 prompt_tokens=REPORT_TOKENS[0], completion_tokens=REPORT_TOKENS[1])


def idle_policy(body: dict[str, Any]) -> Reply:
    """Writes nothing: a text answer at once."""
    return reply("I read nothing and changed nothing.", prompt_tokens=REPORT_TOKENS[0],
                 completion_tokens=REPORT_TOKENS[1])


def stray_write_policy(body: dict[str, Any]) -> Reply:
    """Appends to the parent's copy through the shell (not the output), then reports."""
    parent, _ = paths(body)
    if "execute" not in tools_called(body):
        return tool_call("execute", {"command": f"echo '{MARKER} stray' >> {parent}"}, call_id="call_stray",
                         prompt_tokens=WRITE_TOKENS[0], completion_tokens=WRITE_TOKENS[1])
    return reply("I edited the parent in place.", prompt_tokens=REPORT_TOKENS[0], completion_tokens=REPORT_TOKENS[1])


def refused_write_policy(body: dict[str, Any]) -> Reply:
    """Tries ``write_file`` on the parent's copy, then reports whatever it was told."""
    parent, _ = paths(body)
    if "write_file" not in tools_called(body):
        return tool_call("write_file", {"file_path": parent, "content": f"{MARKER} overwrite\n"},
                         call_id="call_overwrite", prompt_tokens=WRITE_TOKENS[0], completion_tokens=WRITE_TOKENS[1])
    told = text_of(tool_results(body)[-1].get("content"))
    return reply(f"The write was refused: {told}", prompt_tokens=REPORT_TOKENS[0], completion_tokens=REPORT_TOKENS[1])


def slow_policy(delay_s: float, then: Policy = mutator_policy) -> Policy:
    """``then``, but every answer takes ``delay_s`` seconds (past a mutator's cap)."""

    def policy(body: dict[str, Any]) -> Reply:
        r = then(body)
        r.delay_s = delay_s
        return r

    return policy
