"""A fault-injecting OpenAI-compatible server: the scripted server of
:mod:`milo_ray.testing.openai_server`, misbehaving on chosen requests the way real
providers do, so that every role's handling of a bad endpoint is tested through real
litellm, langchain and HTTP.

:data:`FAULTS` names every fault. Transport faults break the answer (the request is
worth repeating: retried per the model config's ``max_retries``); content faults are
well-formed answers whose content is wrong (the role's policy decides: re-ask, score,
or pass the error back to the agent loop):

* ``429`` (with ``Retry-After``), ``500``, ``502``, ``503``: an HTTP error;
* ``drop_mid_body``: headers and half the body, then the connection closes;
* ``stream_cut``: a streamed answer cut before its last chunk (a plain request gets a
  whole answer: only streams can be cut mid-message);
* ``empty_body`` / ``truncated_json``: a 200 whose body is empty / stops halfway;
* ``slow``: an answer later than the client's ``request_timeout_s``;
* ``malformed_tool_args``: a tool call whose ``arguments`` are not JSON;
* ``judge_out_of_range``: a judge verdict with ``w = 1.7``;
* ``orchestrator_unknown``: an orchestrator decision naming an island and a mutator that
  do not exist.

:class:`FaultInjectingServer` answers from a normal policy (a function of the request
body, e.g. :func:`milo_ray.testing.scripted_roles.by_model`) except for the requests
:meth:`~FaultInjectingServer.inject` scheduled, and records which requests it broke
(``injected``). One server serves a whole test module: tests schedule their faults on it.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

from milo_ray.testing.openai_server import Reply, ScriptedOpenAIServer

Policy = Callable[[dict[str, Any]], Reply]

TRANSPORT_FAULTS = ("429", "500", "502", "503", "drop_mid_body", "stream_cut", "empty_body", "truncated_json", "slow")
CONTENT_FAULTS = ("malformed_tool_args", "judge_out_of_range", "orchestrator_unknown")
FAULTS = TRANSPORT_FAULTS + CONTENT_FAULTS

# A Retry-After short enough for tests, long enough to tell from the jittered backoff.
RETRY_AFTER_S = 0.2

BAD_VERDICT = {"w": 1.7, "a": 0.5, "u": 0.5, "summary": "An importance above one.",
               "suggestions": ["Check the output."], "insights": "None.", "failure_modes": [], "mechanisms": []}
UNKNOWN_DECISION = {"diagnosis": "Island 99 is stuck.", "kind": "dry_mutator", "loci": ["variation"],
                    "reassign": [{"island": 99, "mutator": "no-such-mutator", "why": "nothing real"}]}


def fault_reply(fault: str, good: Reply, *, slow_s: float) -> Reply:
    """The broken version of ``good`` (the answer the policy would have given)."""
    if fault in ("500", "502", "503"):
        return Reply(status=int(fault))
    if fault == "429":
        return Reply(status=429, headers={"Retry-After": f"{RETRY_AFTER_S:g}"})
    if fault in ("drop_mid_body", "stream_cut", "empty_body", "truncated_json"):
        return Reply(content=good.content or "partial", tool_calls=good.tool_calls, prompt_tokens=good.prompt_tokens,
                     completion_tokens=good.completion_tokens, fault=fault)
    if fault == "slow":
        return Reply(content=good.content, tool_calls=good.tool_calls, prompt_tokens=good.prompt_tokens,
                     completion_tokens=good.completion_tokens, delay_s=slow_s)
    if fault == "malformed_tool_args":
        name = good.tool_calls[0]["function"]["name"] if good.tool_calls else "write_file"
        return Reply(tool_calls=[{"id": "call_bad", "type": "function",
                                  "function": {"name": name, "arguments": '{"file_path": "/app/a.py", "content": '}}],
                     prompt_tokens=good.prompt_tokens or 10, completion_tokens=good.completion_tokens or 5)
    if fault == "judge_out_of_range":
        return Reply(content=json.dumps(BAD_VERDICT), prompt_tokens=good.prompt_tokens or 10,
                     completion_tokens=good.completion_tokens or 5)
    if fault == "orchestrator_unknown":
        return Reply(content=json.dumps(UNKNOWN_DECISION), prompt_tokens=good.prompt_tokens or 10,
                     completion_tokens=good.completion_tokens or 5)
    raise ValueError(f"fault={fault!r}: expected one of {', '.join(FAULTS)}")


class FaultInjectingServer(ScriptedOpenAIServer):
    """See the module docstring. ``policy``: the normal answers; ``slow_s``: how late a
    ``slow`` answer comes (give clients a shorter ``request_timeout_s``)."""

    def __init__(self, policy: Policy, *, slow_s: float = 2.0, model: str = "scripted") -> None:
        self._policy = policy
        self.slow_s = float(slow_s)
        self._pending: list[tuple[str, Callable[[dict[str, Any]], bool]]] = []
        self._faults_lock = threading.Lock()
        self.injected: list[tuple[int, str]] = []  # (request index, fault) of every broken answer
        super().__init__(self._answer_or_fault, model=model)

    def inject(self, fault: str, *, times: int = 1, when: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Break the next ``times`` requests that ``when`` accepts (default: any) with
        ``fault``; the others are answered by the policy."""
        if fault not in FAULTS:
            raise ValueError(f"fault={fault!r}: expected one of {', '.join(FAULTS)}")
        with self._faults_lock:
            self._pending.extend([(fault, when or (lambda body: True))] * int(times))

    def reset(self) -> None:
        """Forget scheduled faults and every recorded request (between tests)."""
        with self._faults_lock:
            self._pending.clear()
            self.injected.clear()
        with self._lock:
            self.requests.clear()
            self.request_times.clear()
            self.answered.clear()
            self.answered_models.clear()

    def pending(self) -> int:
        with self._faults_lock:
            return len(self._pending)

    def _answer_or_fault(self, body: dict[str, Any]) -> Reply:
        good = self._policy(body)
        with self._faults_lock:
            for i, (fault, when) in enumerate(self._pending):
                if when(body):
                    del self._pending[i]
                    self.injected.append((len(self.requests) - 1, fault))
                    return fault_reply(fault, good, slow_s=self.slow_s)
        return good
