"""plan_and_solve -- plan first, then execute step by step.

Thesis: the most common multi-step failure is the silently skipped step. The prompt
asks for the concrete requirements and an exhaustive todo plan before acting; a nudge
before the first model call makes the plan a written artifact (write_todos), and a
plan-completion gate sends the agent back over every step, with a concrete check each,
when it first tries to stop.
"""

from __future__ import annotations

from typing import Any

from deepagents import create_deep_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage
from langchain.agents.middleware.types import hook_config


PLAN_PROTOCOL = """\
Plan, then solve. Read the task and list its concrete requirements: the exact files,
inputs, constraints and the end state a grader can check. Record one todo per required
step with write_todos before touching anything. Then execute the steps in order,
checking each intermediate result with a real command and keeping the todo list
current; when reality contradicts the plan, revise the plan."""


class PlanNudgeMiddleware(AgentMiddleware):
    """Before the very first model call, ask for a written todo plan before any action."""

    def __init__(self) -> None:
        super().__init__()
        self._nudged = False

    def before_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        if self._nudged:
            return None
        self._nudged = True
        if any(isinstance(m, AIMessage) for m in state.get("messages") or []):
            return None
        directive = (
            "First extract the concrete requirements and write a complete step-by-step "
            "plan with write_todos; only then start executing it."
        )
        return {"messages": [{"role": "user", "content": directive}]}

    async def abefore_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        return self.before_model(state, runtime)


class PlanCompletionGateMiddleware(AgentMiddleware):
    """When the agent tries to stop, send it back over its plan up to `max_gates` times."""

    def __init__(self, max_gates: int = 1) -> None:
        super().__init__()
        self.max_gates = max_gates
        self._gated = 0

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        msgs = state.get("messages") or []
        if not msgs or not isinstance(msgs[-1], AIMessage) or msgs[-1].tool_calls:
            return None
        if self._gated >= self.max_gates:
            return None
        self._gated += 1
        directive = (
            "Before stopping, walk every todo and prove with a concrete command that it "
            "is done and correct. Fix any step that is missing or wrong, then finish."
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
    prompt_blocks: list[str] = [PLAN_PROTOCOL]
    tools: list[Any] = []
    subagents: list[dict[str, Any]] = []
    middleware: list[Any] = [PlanNudgeMiddleware(), PlanCompletionGateMiddleware(max_gates=1)]
    return create_deep_agent(
        model=model,
        backend=backend,
        system_prompt="\n\n".join(prompt_blocks) or None,
        tools=tools,
        subagents=subagents,
        middleware=middleware,
    )
