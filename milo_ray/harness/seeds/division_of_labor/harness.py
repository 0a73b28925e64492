"""division_of_labor -- a lead agent with explorer, coder and verifier sub-agents.

Thesis: one context that explores, implements and verifies does all three worse.
Each role runs in its own isolated context and reports conclusions back through the
`task` tool, so the lead keeps a clean context for planning. The verifier inspects the
real end state independently, and a completion gate will not let the lead stop before
the verifier has actually been dispatched (bounded by max_gates so a stuck run ends).
"""

from __future__ import annotations

from typing import Any

from deepagents import create_deep_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage
from langchain.agents.middleware.types import hook_config


DELEGATION_PROTOCOL = """\
You lead a small team through the `task` tool. Keep your own context for the plan and
the decisions. Send the explorer to map the environment, hand well-scoped edits to the
coder with a precise objective and what to report, and before finishing always have the
verifier inspect the real end state. Trust the verifier's verdict over your own."""


EXPLORER_SUBAGENT = {
    "name": "explorer",
    "description": "Read-only investigation of the environment; reports paths, wiring and facts.",
    "system_prompt": (
        "Investigate what the lead asks about with read-only commands: layout, relevant "
        "files, configuration, how components connect. Return a short factual summary "
        "with paths. Never modify anything."
    ),
}


CODER_SUBAGENT = {
    "name": "coder",
    "description": "Implements one well-scoped change and confirms it applied.",
    "system_prompt": (
        "Make exactly the change the lead scoped: edit the files or run the commands it "
        "needs, confirm the change took effect, and report what changed and any problem. "
        "Do not redesign the approach."
    ),
}


VERIFIER_SUBAGENT = {
    "name": "verifier",
    "description": "Independently checks the real end state; answers SATISFIED or NOT SATISFIED.",
    "system_prompt": (
        "Assume the work is not done until you have seen otherwise. Re-derive the task's "
        "requirements yourself, read produced files back, run the tests, exercise the "
        "service, and try to falsify the solution. Answer SATISFIED only when every "
        "requirement was checked; otherwise NOT SATISFIED with the concrete discrepancy."
    ),
}


class CompletionGateMiddleware(AgentMiddleware):
    """Refuse to stop until the `verifier` sub-agent has actually been dispatched.

    Evidence-based: the transcript must contain a `task` call naming the verifier.
    Bounded by `max_gates` so a stuck run still ends.
    """

    def __init__(self, max_gates: int = 1, verifier_name: str = "verifier") -> None:
        super().__init__()
        self.max_gates = max_gates
        self.verifier_name = verifier_name
        self._gated = 0

    def _dispatched(self, msgs) -> bool:
        for m in msgs:
            for call in getattr(m, "tool_calls", None) or []:
                if self.verifier_name in str(call.get("args", {})).lower():
                    return True
        return False

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        msgs = state.get("messages") or []
        if not msgs or not isinstance(msgs[-1], AIMessage) or msgs[-1].tool_calls:
            return None
        if self._dispatched(msgs) or self._gated >= self.max_gates:
            return None
        self._gated += 1
        directive = (
            "The work has not been independently verified. Dispatch the verifier "
            "sub-agent with the task tool, act on its verdict, and only then finish."
        )
        return {"messages": [{"role": "user", "content": directive}], "jump_to": "model"}

    @hook_config(can_jump_to=["model"])
    async def aafter_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        return self.after_model(state, runtime)


def build_agent(model, backend):
    """Assemble the agent around the injected model and sandbox backend.

    Each list below is an editable surface: prompt blocks are joined into the system
    prompt; tools, sub-agent specs and middleware go to create_deep_agent.
    """
    prompt_blocks: list[str] = [DELEGATION_PROTOCOL]
    tools: list[Any] = []
    subagents: list[dict[str, Any]] = [EXPLORER_SUBAGENT, CODER_SUBAGENT, VERIFIER_SUBAGENT]
    middleware: list[Any] = [CompletionGateMiddleware(max_gates=1)]
    return create_deep_agent(
        model=model,
        backend=backend,
        system_prompt="\n\n".join(prompt_blocks) or None,
        tools=tools,
        subagents=subagents,
        middleware=middleware,
    )
