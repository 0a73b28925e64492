"""One scripted OpenAI-compatible server answering every role of a search at once.

A run with ``backend=litellm`` and ``model=litellm`` sends the solver's, the mutators',
the orchestrator's, the judge's and the optimizer's calls to endpoints; pointing them
all at one :class:`~milo_ray.testing.openai_server.ScriptedOpenAIServer` and giving each
role its own model name (``openai/solver``, ``openai/judge``...) lets the server tell
them apart: litellm sends the name without its provider prefix as the request's
``model``. :func:`by_model` routes each request to that role's policy, and the server's
``billed_by_model()`` is then the provider's bill per role, to reconcile with the run's
``agent_calls``.

The judge and orchestrator policies here answer the way a careful model would, from
what the request says (the orchestrator reads the search state the prompt carries);
the coding-agent policies are in :mod:`milo_ray.testing.scripted_agents`.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Callable

from milo_ray.testing.openai_server import Reply, reply

Policy = Callable[[dict[str, Any]], Reply]

JUDGE_TOKENS = (400, 90)
ORCHESTRATOR_TOKENS = (900, 120)


def by_model(policies: dict[str, Policy]) -> Policy:
    """A server script sending each request to the policy of its ``model`` (an unknown
    model is an HTTP 404, as a provider answers it)."""

    def answer(body: dict[str, Any]) -> Reply:
        policy = policies.get(str(body.get("model")))
        return Reply(status=404) if policy is None else policy(body)

    return answer


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _last_user(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return _text(users[-1]) if users else ""


def judge_policy(body: dict[str, Any]) -> Reply:
    """A valid verdict whose scores depend on the trajectory it was shown (so records
    differ and the submodular ranking has something to order)."""
    seen = _last_user(body)
    h = int(hashlib.sha256(seen.encode()).hexdigest()[:8], 16)
    verdict = {"w": round(0.3 + (h % 60) / 100, 2), "a": round(0.4 + (h // 60 % 50) / 100, 2),
               "u": round(0.5 + (h // 3000 % 40) / 100, 2),
               "summary": f"The agent wrote its answer without checking it (record {h % 997}).",
               "suggestions": ["Add a verification step that runs the task's own checks before finishing."],
               "insights": "Checking the output before stopping transfers to every task.",
               "failure_modes": ["lax_verification"], "mechanisms": ["verify_before_finish"]}
    return reply(json.dumps(verdict), prompt_tokens=JUDGE_TOKENS[0], completion_tokens=JUDGE_TOKENS[1])


_STATE = re.compile(r"# Search state \(JSON\)\s*(\{.*\})\s*\n\s*Diagnose", re.S)


def orchestrator_policy(body: dict[str, Any]) -> Reply:
    """A decision for the stalled island read from the search state in the prompt: give
    it another mutator of the pool, and when another island exists, graft that island's
    best into it (two moves, the limit)."""
    m = _STATE.search(_last_user(body))
    if m is None:
        return reply("I cannot find the search state.", prompt_tokens=ORCHESTRATOR_TOKENS[0], completion_tokens=5)
    state = json.loads(m.group(1))
    j = int(state["stalled_island"])
    current = state["assignment"].get(str(j))
    others = [mu for mu in state["mutator_pool"] if mu != current]
    decision: dict[str, Any] = {"diagnosis": f"Island {j} stopped improving under {current}; its children repeat "
                                             "the same edit.", "kind": "dry_mutator", "loci": ["variation"]}
    if others:
        decision["reassign"] = [{"island": j, "mutator": others[0], "why": "a different mutator"}]
    donors = sorted(int(i) for i in state["assignment"] if int(i) != j)
    if donors:
        decision["recombine"] = [{"dest_island": j, "donor_island": donors[0], "why": "borrow the donor's strengths"}]
    return reply(json.dumps(decision), prompt_tokens=ORCHESTRATOR_TOKENS[0], completion_tokens=ORCHESTRATOR_TOKENS[1])
