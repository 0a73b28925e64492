"""reproduce_first -- reproduce, hypothesize, change minimally, re-verify; rubric-gated.

Thesis: agents that win fixing tasks do not start by editing. They first turn the goal
into a check that fails now, change the smallest thing, and re-run the same check. The
prompt makes that protocol the spine of the loop, and deepagents' RubricMiddleware
(subclassed here to carry a default rubric, since the gate is dormant without one)
has a grader sub-agent re-read the transcript whenever the agent would finish and
bounce it back with specifics while a criterion is unmet.
"""

from __future__ import annotations

from typing import Any

from deepagents import create_deep_agent
from deepagents import RubricMiddleware


SCIENTIST_PROTOCOL = """\
Work like an experimenter. (1) Pin the goal down first: turn it into a concrete
command or test that fails now and must pass when you are done; if none exists,
write the smallest one. (2) Say in one sentence what you believe causes the gap.
(3) Change only what that belief requires. (4) Re-run the very same check and read
its output. A failing re-run is evidence: refine the belief and iterate. Success is
the check passing in front of you, never an assumption."""


DEFAULT_RUBRIC = """\
Done means every criterion holds, with the command output visible in the transcript:
1. The failure or requirement was reproduced or pinned down by a concrete command
   before any change.
2. The change is minimal and aimed at the identified cause; nothing unrelated moved.
3. The same defining check was re-run after the change and its passing output shown.
4. Every requested output, path, format and value was checked against the task."""


class DefaultRubricGate(RubricMiddleware):
    """deepagents' RubricMiddleware with a built-in default rubric.

    RubricMiddleware is dormant unless the invocation state carries a `rubric`; this
    subclass supplies DEFAULT_RUBRIC when the caller gave none, so the plain
    build_agent(model, backend) + invoke({"messages": ...}) contract activates the gate.
    A grader sub-agent re-reads the transcript each time the agent would finish.
    """

    def __init__(self, model, max_iterations: int = 2, rubric: str = DEFAULT_RUBRIC) -> None:
        super().__init__(model=model, max_iterations=max_iterations)
        self.default_rubric = rubric

    def _with_rubric(self, state):
        if state.get("rubric"):
            return state, {}
        return {**state, "rubric": self.default_rubric}, {"rubric": self.default_rubric}

    def before_agent(self, state, runtime):
        state, extra = self._with_rubric(state)
        update = super().before_agent(state, runtime) or {}
        return {**update, **extra} or None

    async def abefore_agent(self, state, runtime):
        state, extra = self._with_rubric(state)
        update = await super().abefore_agent(state, runtime) or {}
        return {**update, **extra} or None


def build_agent(model, backend):
    """Assemble the agent around the injected model and sandbox backend.

    Each list below is an editable surface: prompt blocks are joined into the system
    prompt; tools, sub-agent specs and middleware go to create_deep_agent.
    """
    prompt_blocks: list[str] = [SCIENTIST_PROTOCOL]
    tools: list[Any] = []
    subagents: list[dict[str, Any]] = []
    middleware: list[Any] = [DefaultRubricGate(model=model, max_iterations=2)]
    return create_deep_agent(
        model=model,
        backend=backend,
        system_prompt="\n\n".join(prompt_blocks) or None,
        tools=tools,
        subagents=subagents,
        middleware=middleware,
    )
