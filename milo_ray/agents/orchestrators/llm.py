"""MILO's orchestrator as an LLM agent (papers/000 §4.1.3, App. C.2).

Owns :class:`LLMOrchestrator`. Phase 1 (:meth:`LLMOrchestrator.decide`) is one chat
call: the instructions (template ``prompts/orchestrator.md``: the role, the stalled
island, the four diagnoses, the four moves, the move limit, the exact JSON shape) and
the population snapshot plus the structured search state as the user message. The
answer is parsed into a JSON object; validating it against the search configuration
is the loop's job (:mod:`milo_ray.milo.orchestrator`), which re-asks once with the
validation error (``state["reask"]``) when it cannot be executed. Phase 2
(:meth:`LLMOrchestrator.graft`) writes a Graft child with the deepagents coding agent
in its ``graft`` instructions.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import asdict
from typing import Any, Mapping

from milo_ray.agents.orchestrators.schema import DIAGNOSES, LOCI
from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.agents.prompts import render
from milo_ray.llm.role_llm import RoleLLM, ask, chat_model
from milo_ray.llm.usage import AgentReply

WHERE = "backend.agents.orchestrator.llm"
_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)\n?```", re.S)

STATE_KEYS = ("trigger", "islands", "assignment", "pool", "search_tasks", "task_pool", "regret", "max_moves",
              "patience", "mutator_stats", "next_island")
REASK = ("Your previous answer (above) cannot be executed: {error}\n"
         "Answer again with the corrected decision: ONLY the JSON object, following every rule of the instructions.")


def parse_answer(text: str) -> Any:
    """The decision object of an answer: the whole text as JSON, or the first fenced
    block holding a JSON object. Anything else is returned as the raw text, which the
    loop's validation refuses (and re-asks with the reason)."""
    for candidate in [text.strip(), *(m.group(1).strip() for m in _FENCE.finditer(text))]:
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return text


def _previous_text(previous: Any) -> str:
    """The previous answer as the assistant turn that produced it."""
    if isinstance(previous, str):
        return previous
    try:
        return json.dumps(previous, indent=1, sort_keys=True)
    except (TypeError, ValueError):
        return repr(previous)


def _nodes_table(islands: list[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per island, every evaluated harness with the tasks it passes at all: what the
    model compares to find a donor island or a crowded-out niche. Zero rates are left
    out to keep the message short (a task missing from ``passes`` is a 0)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for s in islands:
        rows = []
        for n in s.get("nodes") or []:
            rows.append({"node_id": n["node_id"], "accuracy": n.get("accuracy"), "admitted": n.get("admitted"),
                         "is_root": n.get("is_root"), "origin": n.get("origin"),
                         "passes": {t: round(float(v), 2) for t, v in sorted((n.get("behavior") or {}).items())
                                    if v > 0}})
        out[str(s["island"])] = rows
    return out


class LLMOrchestrator:
    """The orchestrator agent on a chat model.

    llm: the role's model spec (``RoleLLM`` fields; ``backend.agents.orchestrator.llm``).
    graft_time_cap_s, graft_recursion_limit: the graft coding agent's wall-clock cap
    and LangGraph step limit.

    Thread-safe and re-entrant: :meth:`decide` keeps no per-call state, and the chat
    model and the graft agent are each built once, under a lock, on first use.
    """

    def __init__(self, llm: Mapping[str, Any] | RoleLLM, *, name: str | None = None,
                 graft_time_cap_s: float = 2700.0, graft_recursion_limit: int = 300) -> None:
        self.llm = RoleLLM.of(llm, where=WHERE)
        # The graft agent takes the spec as configured (it checks it itself).
        self.llm_spec = dict(llm) if isinstance(llm, Mapping) else asdict(self.llm)
        self.name = name or "llm-orchestrator"
        if float(graft_time_cap_s) <= 0:
            raise ValueError(f"backend.agents.orchestrator.graft_time_cap_s={graft_time_cap_s}: must be > 0")
        if int(graft_recursion_limit) < 1:
            raise ValueError(f"backend.agents.orchestrator.graft_recursion_limit={graft_recursion_limit}: must be >= 1")
        self.graft_time_cap_s = float(graft_time_cap_s)
        self.graft_recursion_limit = int(graft_recursion_limit)
        self._lock = threading.Lock()
        self._model: Any = None
        self._grafter: Any = None

    # --- phase 1: diagnose and intervene ---------------------------------------------------
    def messages(self, snapshot_markdown: str, state: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The conversation of one decide call (with the re-ask turns when ``state``
        has ``reask``). ``state`` is what ``milo_ray.milo.orchestrator.build_inputs`` builds."""
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"LLMOrchestrator.decide: state lacks {missing} (build it with build_inputs)")
        islands = sorted(int(s["island"]) for s in state["islands"])
        assignment = {int(k): v for k, v in state["assignment"].items()}
        system = render(
            "orchestrator",
            trigger=state["trigger"],
            patience=state["patience"],
            max_moves=state["max_moves"],
            islands=", ".join(str(j) for j in islands),
            assignment=", ".join(f"{j} -> {m}" for j, m in sorted(assignment.items())),
            pool=", ".join(state["pool"]),
            next_island=state["next_island"],
            search_size=len(state["search_tasks"]),
            kinds=", ".join(DIAGNOSES),
            loci=", ".join(LOCI),
        )
        facts = {
            "stalled_island": state["trigger"],
            "assignment": {str(j): m for j, m in sorted(assignment.items())},
            "mutator_pool": list(state["pool"]),
            "mutator_stats": state["mutator_stats"],
            "search_tasks": list(state["search_tasks"]),
            "task_pool": list(state["task_pool"]),
            "regret": {t: round(float(v), 3) for t, v in sorted(state["regret"].items())},
            "harnesses": _nodes_table(state["islands"]),
        }
        user = (f"{snapshot_markdown.rstrip()}\n\n# Search state (JSON)\n\n"
                f"{json.dumps(facts, indent=1, sort_keys=True)}\n\n"
                f"Diagnose island {state['trigger']} and answer with the decision JSON object only.")
        msgs: list[tuple[str, str]] = [("system", system), ("user", user)]
        reask = state.get("reask")
        if reask:
            msgs += [("assistant", _previous_text(reask.get("previous"))),
                     ("user", REASK.format(error=reask.get("error", "it is not a valid decision")))]
        return msgs

    def decide(self, snapshot_markdown: str, state: dict[str, Any], seed: int) -> AgentReply[Any]:
        """One chat call; the parsed decision object (or the raw text when the answer is
        not one) and its usage. ``seed`` is not sent: the role's temperature (0 by
        default) is what makes the answer repeatable. A failed call is
        ``{"error": ...}`` with the usage's error, never an exception."""
        text, usage = ask(self.llm, self.messages(snapshot_markdown, state), model=self._chat_model())
        if text is None:
            return AgentReply({"error": usage.error}, usage)
        return AgentReply(parse_answer(text), usage)

    def _chat_model(self) -> Any:
        with self._lock:
            if self._model is None:
                self._model = chat_model(self.llm)
            return self._model

    # --- phase 2: write the Graft child --------------------------------------------------
    def graft(self, request: MutationRequest) -> MutationResult:
        """The Graft child, written by the deepagents coding agent with the graft
        instructions (``request.context`` carries the co-parent and the diagnosis)."""
        return self._graft_agent().mutate(request)

    def _graft_agent(self) -> Any:
        with self._lock:
            if self._grafter is None:
                # Imported here: deciding needs no coding-agent stack.
                from milo_ray.agents.mutators.deepagents import DeepAgentsMutator

                self._grafter = DeepAgentsMutator(
                    llm=dict(self.llm_spec), name=f"{self.name}:graft", instructions="graft",
                    time_cap_s=self.graft_time_cap_s, recursion_limit=self.graft_recursion_limit)
            return self._grafter
