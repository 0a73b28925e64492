"""The LLM experience judge (SSR §4.1): one chat call turns one trajectory of the
current harness and its verifier feedback into a raw verdict (``VERDICT_SCHEMA``).

The instructions are the ``judge`` prompt template; the user message carries the task
id, the outcome (score, resolved, time-out, errors, the verifier's output, failed
tests of the ctrf report, the pool's statistics) and the trajectory, condensed to the
judge's budget by :func:`milo_ray.agents.judges.condense.condense` when it is longer.

The judge does not validate its answer: :func:`milo_ray.ssr.evidence.judge_one` does,
and re-asks with ``feedback['reask'] = {"error": ..., "previous": ...}``; the judge
then puts its previous answer and what was wrong with it into the conversation, so the
model corrects that answer instead of starting over. A failed call (after the model
config's transport retries) is ``AgentReply(None, usage)`` with ``usage.error``: the
caller counts it as a failed attempt and keeps its usage.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Mapping

from milo_ray.agents.judges.condense import CondenseInfo, condense, render
from milo_ray.agents.judges.schema import VERDICT_SCHEMA
from milo_ray.agents.prompts import render as render_prompt
from milo_ray.llm.role_llm import RoleLLM, ask, chat_model
from milo_ray.llm.usage import AgentReply, AgentUsage

# Share of the model's context the trajectory may take by default. The rest holds the
# instructions (~1.5k tokens), the outcome block (bounded by the caps below), a re-ask's
# previous answer, the answer itself, and the error of the chars/4 token estimate
# (code and JSON often tokenize denser than 4 chars per token).
TRAJECTORY_SHARE = 0.6
# Caps on the outcome block, so a huge test report cannot crowd out the trajectory.
MAX_FAILED_TESTS = 20
TEST_MESSAGE_CHARS = 1000
VERIFIER_OUTPUT_CHARS = 4000
ERROR_CHARS = 2000
PREVIOUS_ANSWER_CHARS = 8000


def _clip(text: Any, limit: int) -> str:
    text = str(text)
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}[... {len(text) - 2 * half} chars omitted ...]{text[len(text) - half:]}"


def _failed_tests(ctrf: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    """(tests, failed, lines of the first failed tests) of a ctrf report."""
    results = ctrf.get("results") if isinstance(ctrf.get("results"), Mapping) else ctrf
    tests = [t for t in (results.get("tests") or []) if isinstance(t, Mapping)]
    failed = [t for t in tests if t.get("status") not in ("passed", "skipped")]
    lines = []
    for t in failed[:MAX_FAILED_TESTS]:
        why = " ".join(str(t[k]) for k in ("message", "trace") if t.get(k))
        lines.append(f"- {t.get('name', '?')} [{t.get('status', '?')}]" + (f": {_clip(why, TEST_MESSAGE_CHARS)}"
                                                                           if why else ""))
    if len(failed) > MAX_FAILED_TESTS:
        lines.append(f"- ... and {len(failed) - MAX_FAILED_TESTS} more failed tests")
    return len(tests), len(failed), lines


def outcome_text(feedback: Mapping[str, Any]) -> str:
    """The outcome block of the user message, from a ``judge_items`` feedback dict."""
    score = float(feedback.get("score", 0.0))
    lines = [f"- score: {score:g}", f"- resolved: {'yes' if feedback.get('resolved', score >= 1.0) else 'no'}"]
    if feedback.get("timed_out"):
        lines.append("- timed out: yes (the run was stopped at its time cap)")
    if feedback.get("error"):
        kind = feedback.get("error_kind") or "unknown"
        lines.append(f"- error ({kind}): {_clip(feedback['error'], ERROR_CHARS)}")
    verifier = feedback.get("verifier")
    if isinstance(verifier, Mapping):
        if verifier.get("error"):
            lines.append(f"- verifier error: {_clip(verifier['error'], ERROR_CHARS)}")
        if verifier.get("output"):
            lines.append("- verifier output (its end):\n```\n" + _clip(verifier["output"], VERIFIER_OUTPUT_CHARS)
                         + "\n```")
    ctrf = feedback.get("ctrf")
    if isinstance(ctrf, Mapping) and ctrf:
        n, k, failed = _failed_tests(ctrf)
        lines.append(f"- tests: {n} run, {k} not passed" + (":" if failed else ""))
        lines.extend(f"  {x}" for x in failed)
    pool = feedback.get("pool")
    if isinstance(pool, Mapping) and pool.get("tasks"):
        lines.append(f"- the harness on all {pool['tasks']} training tasks of this round: "
                     f"{pool.get('resolved_rate', 0.0):.0%} resolved, {pool.get('timeout_rate', 0.0):.0%} timed out, "
                     f"mean score {pool.get('mean_score', 0.0):.2f}")
    return "\n".join(lines)


def user_message(task_id: str, feedback: Mapping[str, Any], shown: dict[str, Any], info: CondenseInfo) -> str:
    return (f"# Task {task_id}\n\n## Outcome\n\n{outcome_text(feedback)}\n\n## Trajectory\n\n{info.describe()}\n\n"
            f"```json\n{render(shown)}\n```\n\nJudge this trajectory: answer with the JSON object only.")


class LLMJudge:
    """The experience judge as one chat call per trajectory (see the module docstring).

    ``llm``: the role's model settings (:class:`RoleLLM` or its mapping);
    ``max_trajectory_tokens``: the trajectory's budget (estimated tokens; default
    ``TRAJECTORY_SHARE`` of ``llm.context_tokens``)."""

    def __init__(self, llm: "RoleLLM | Mapping[str, Any]", *, name: str | None = None,
                 max_trajectory_tokens: int | None = None) -> None:
        self.llm = RoleLLM.of(llm, where="backend.agents.judge.llm")
        self.name = name or f"llm-judge:{self.llm.model}"
        ctx = self.llm.context_tokens
        if max_trajectory_tokens is None:
            max_trajectory_tokens = int(TRAJECTORY_SHARE * ctx)
        elif not 1 <= int(max_trajectory_tokens) < ctx:
            raise ValueError(f"LLMJudge.max_trajectory_tokens={max_trajectory_tokens}: must be >= 1 and below "
                             f"the model's context_tokens={ctx} (room is needed for the instructions and the answer)")
        self.max_trajectory_tokens = int(max_trajectory_tokens)
        self.instructions = render_prompt("judge", keys=", ".join(VERDICT_SCHEMA["properties"]),
                                          schema=json.dumps(VERDICT_SCHEMA))
        self._model: Any = None
        self._lock = threading.Lock()

    def _chat(self) -> Any:
        # One chat model per judge, built on first use: judge calls run on a thread pool.
        with self._lock:
            if self._model is None:
                self._model = chat_model(self.llm)
            return self._model

    def messages(self, trajectory: Any, feedback: Mapping[str, Any], task_id: str
                 ) -> tuple[list[tuple[str, str]], CondenseInfo]:
        """The conversation of one ask (a re-ask when ``feedback['reask']`` is set)."""
        traj = trajectory if isinstance(trajectory, dict) else {"trajectory": trajectory}
        shown, info = condense(traj, self.max_trajectory_tokens)
        msgs = [("system", self.instructions), ("user", user_message(task_id, feedback, shown, info))]
        reask = feedback.get("reask")
        if isinstance(reask, Mapping) and reask.get("previous"):
            # A call that failed in transport left no answer to correct: it is simply asked again.
            msgs += [("assistant", _clip(reask["previous"], PREVIOUS_ANSWER_CHARS)),
                     ("user", f"Your answer was rejected: {reask.get('error') or 'it is not a valid verdict'}\n"
                              "Answer again with ONLY one corrected JSON object with the keys "
                              f"{', '.join(VERDICT_SCHEMA['properties'])}; every score a number in [0, 1].")]
        return msgs, info

    def judge(self, trajectory: dict[str, Any], feedback: dict[str, Any], task_id: str) -> AgentReply[Any]:
        msgs, info = self.messages(trajectory, feedback, task_id)
        if not info.fits:
            return AgentReply(None, AgentUsage(error=(
                f"trajectory of task {task_id} does not fit the judge's budget of {self.max_trajectory_tokens} "
                f"tokens even condensed (about {info.tokens}); raise max_trajectory_tokens or context_tokens")))
        text, usage = ask(self.llm, msgs, model=self._chat())
        return AgentReply(text, usage)
