'''Source code of every harness mechanism, as it appears inside a harness file.

Each entry is real deepagents / langchain code: an ``AgentMiddleware`` subclass, a
``SubAgent`` spec dict, a system-prompt block constant or a ``@tool``. A template is
inserted verbatim as top-level definitions of ``harness.py``; the mechanism is then
wired into ``build_agent`` by one element in one of its assembly lists
(``prompt_blocks``, ``tools``, ``subagents``, ``middleware``). Parameters live as
keyword literals of the wiring call, with the same defaults on ``__init__`` so a
call without keywords still means the documented defaults.

Templates use ``{{``/``}}`` nowhere: they are plain text, not format strings.
'''

from __future__ import annotations

# Import lines a template needs; ``add_mechanism`` adds the missing ones.
IMPORT_LINES: dict[str, str] = {
    "os": "import os",
    "time": "import time",
    "Any": "from typing import Any",
    "AgentMiddleware": "from langchain.agents.middleware import AgentMiddleware",
    "hook_config": "from langchain.agents.middleware.types import hook_config",
    "AIMessage": "from langchain_core.messages import AIMessage",
    "ToolMessage": "from langchain_core.messages import ToolMessage",
    "tool": "from langchain_core.tools import tool",
    "create_deep_agent": "from deepagents import create_deep_agent",
    "create_agent": "from langchain.agents import create_agent",
    "RubricMiddleware": "from deepagents import RubricMiddleware",
}

CORE_TOOLS = '''
def make_core_tools(backend):
    """read_file, write_file and bash over the task sandbox: the smallest tool set
    that can read task inputs, produce graded files and change executed state."""

    @tool
    def read_file(file_path: str, offset: int = 0, limit: int = 2000) -> str:
        """Read up to `limit` lines of a file, starting after line `offset`."""
        r = backend.read(file_path, offset=offset, limit=limit)
        if r.error:
            return f"Error: {r.error}"
        return (r.file_data or {}).get("content", "")

    @tool
    def write_file(file_path: str, content: str) -> str:
        """Create or overwrite a file with `content`."""
        r = backend.write(file_path, content)
        return f"Error: {r.error}" if r.error else f"wrote {file_path}"

    @tool
    def bash(command: str) -> str:
        """Run a shell command in the sandbox; returns combined output and exit code."""
        r = backend.execute(command)
        return f"{r.output}\\n[exit code {r.exit_code}]"

    return [read_file, write_file, bash]
'''

SCIENTIST_PROTOCOL = '''
SCIENTIST_PROTOCOL = """\\
Work like an experimenter. (1) Pin the goal down first: turn it into a concrete
command or test that fails now and must pass when you are done; if none exists,
write the smallest one. (2) Say in one sentence what you believe causes the gap.
(3) Change only what that belief requires. (4) Re-run the very same check and read
its output. A failing re-run is evidence: refine the belief and iterate. Success is
the check passing in front of you, never an assumption."""
'''

PLAN_PROTOCOL = '''
PLAN_PROTOCOL = """\\
Plan, then solve. Read the task and list its concrete requirements: the exact files,
inputs, constraints and the end state a grader can check. Record one todo per required
step with write_todos before touching anything. Then execute the steps in order,
checking each intermediate result with a real command and keeping the todo list
current; when reality contradicts the plan, revise the plan."""
'''

DELEGATION_PROTOCOL = '''
DELEGATION_PROTOCOL = """\\
You lead a small team through the `task` tool. Keep your own context for the plan and
the decisions. Send the explorer to map the environment, hand well-scoped edits to the
coder with a precise objective and what to report, and before finishing always have the
verifier inspect the real end state. Trust the verifier's verdict over your own."""
'''

EXPLORER_SUBAGENT = '''
EXPLORER_SUBAGENT = {
    "name": "explorer",
    "description": "Read-only investigation of the environment; reports paths, wiring and facts.",
    "system_prompt": (
        "Investigate what the lead asks about with read-only commands: layout, relevant "
        "files, configuration, how components connect. Return a short factual summary "
        "with paths. Never modify anything."
    ),
}
'''

CODER_SUBAGENT = '''
CODER_SUBAGENT = {
    "name": "coder",
    "description": "Implements one well-scoped change and confirms it applied.",
    "system_prompt": (
        "Make exactly the change the lead scoped: edit the files or run the commands it "
        "needs, confirm the change took effect, and report what changed and any problem. "
        "Do not redesign the approach."
    ),
}
'''

VERIFIER_SUBAGENT = '''
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
'''

PLAN_NUDGE = '''
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
'''

PLAN_GATE = '''
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
'''

COMPLETION_GATE = '''
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
'''

RUBRIC_GATE = '''
DEFAULT_RUBRIC = """\\
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
'''

VERIFIER_GATE = '''
class IndependentVerifierGate(AgentMiddleware):
    """Stop only after a fresh SATISFIED verdict from the verifier sub-agent.

    "Fresh" means no file-changing tool call after the verdict. Near the deadline
    (elapsed >= relax_frac of the time budget) the gate relaxes so that a long
    re-verification cannot zero the attempt.
    """

    def __init__(self, max_gates: int = 2, relax_frac: float = 0.85, budget_s: float = 3600.0) -> None:
        super().__init__()
        self.max_gates = max_gates
        self.relax_frac = relax_frac
        self.budget_s = float(os.environ.get("MILO_RAY_TIME_CAP_S", budget_s))
        self._start = None
        self._gated = 0

    def _fresh_signoff(self, msgs) -> bool:
        for m in reversed(msgs):
            names = [c.get("name") for c in getattr(m, "tool_calls", None) or []]
            if any(n in ("write_file", "edit_file", "execute", "bash") for n in names):
                return False
            text = str(getattr(m, "content", ""))
            if "SATISFIED" in text and "NOT SATISFIED" not in text:
                return True
        return False

    def before_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        if self._start is None:
            self._start = time.monotonic()
        return None

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        msgs = state.get("messages") or []
        if not msgs or not isinstance(msgs[-1], AIMessage) or msgs[-1].tool_calls:
            return None
        elapsed = time.monotonic() - (self._start or time.monotonic())
        if elapsed >= self.relax_frac * self.budget_s or self._gated >= self.max_gates:
            return None
        if self._fresh_signoff(msgs):
            return None
        self._gated += 1
        directive = (
            "No fresh independent sign-off yet. Dispatch the verifier sub-agent on the "
            "current state, ask it to try to falsify the solution, fix what it finds."
        )
        return {"messages": [{"role": "user", "content": directive}], "jump_to": "model"}

    async def abefore_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        return self.before_model(state, runtime)

    @hook_config(can_jump_to=["model"])
    async def aafter_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        return self.after_model(state, runtime)
'''

DEADLINE_GOVERNOR = '''
class DeadlineGovernorMiddleware(AgentMiddleware):
    """Elapsed-time readouts on every model call, escalating at two thresholds.

    The clock starts at the first model call (monotonic). Past `warn_frac` of the
    budget the agent is told to converge; past `final_frac` to bank a valid state now.
    The budget comes from MILO_RAY_TIME_CAP_S when the runner sets it.
    """

    def __init__(self, warn_frac: float = 0.5, final_frac: float = 0.8, budget_s: float = 3600.0) -> None:
        super().__init__()
        self.warn_frac = warn_frac
        self.final_frac = final_frac
        self.budget_s = float(os.environ.get("MILO_RAY_TIME_CAP_S", budget_s))
        self._start = None

    def before_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        now = time.monotonic()
        if self._start is None:
            self._start = now
        frac = (now - self._start) / max(self.budget_s, 1.0)
        note = f"[clock] {now - self._start:.0f}s of {self.budget_s:.0f}s used."
        if frac >= self.final_frac:
            note += " Final phase: save a valid deliverable now and stop exploring."
        elif frac >= self.warn_frac:
            note += " Past the midpoint: converge on the current approach and verify it."
        return {"messages": [{"role": "user", "content": note}]}

    async def abefore_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        return self.before_model(state, runtime)
'''

SCAFFOLD_FLOOR = '''
class ScaffoldFloorMiddleware(AgentMiddleware):
    """One-shot directive on the first model call: create a minimal valid version of
    every deliverable before deep work, so a timeout is graded on something."""

    def __init__(self) -> None:
        super().__init__()
        self._fired = False

    def before_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        if self._fired:
            return None
        self._fired = True
        directive = (
            "Before deep work, create a minimal but valid version of every required "
            "deliverable (right path, format and structure), confirm it with a command, "
            "and keep it valid while you improve it."
        )
        return {"messages": [{"role": "user", "content": directive}]}

    async def abefore_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        return self.before_model(state, runtime)
'''

CONTEXT_CLAMP = '''
class ContextClampMiddleware(AgentMiddleware):
    """Clamp every tool observation to `max_chars` (head and tail kept) so one noisy
    command cannot flood the context window."""

    def __init__(self, max_chars: int = 12000) -> None:
        super().__init__()
        self.max_chars = max_chars

    def _clamp(self, result):
        if isinstance(result, ToolMessage) and isinstance(result.content, str):
            text = result.content
            if len(text) > self.max_chars:
                half = self.max_chars // 2
                cut = len(text) - 2 * half
                result.content = f"{text[:half]}\\n[... {cut} chars clamped ...]\\n{text[-half:]}"
        return result

    def wrap_tool_call(self, request, handler):
        return self._clamp(handler(request))

    async def awrap_tool_call(self, request, handler):
        return self._clamp(await handler(request))
'''

EDIT_TOOL = '''
def make_edit_tool(backend):
    """An exact-string replacement tool: safer than rewriting whole files."""

    @tool
    def replace_in_file(file_path: str, old: str, new: str) -> str:
        """Replace the single exact occurrence of `old` with `new` in a file."""
        r = backend.read(file_path, offset=0, limit=1_000_000)
        if r.error:
            return f"Error: {r.error}"
        text = (r.file_data or {}).get("content", "")
        count = text.count(old)
        if count != 1:
            return f"Error: expected exactly one occurrence of `old`, found {count}"
        w = backend.write(file_path, text.replace(old, new))
        return f"Error: {w.error}" if w.error else "replaced 1 occurrence"

    return replace_in_file
'''

SKILLS_LIBRARY = '''
PLAYBOOK = {
    "debugging": "Reproduce with the smallest command, read the full traceback, bisect inputs.",
    "packaging": "Check the interpreter and package versions first; prefer the project's lock file.",
    "services": "Start the service in the background, poll its port, read its log on failure.",
    "tests": "Run the narrowest failing test first, then the whole suite before finishing.",
    "data": "Inspect a few rows and the schema before transforming; validate the output shape.",
}


@tool
def consult_playbook(topic: str) -> str:
    """Return field-tested know-how for a topic (debugging, packaging, services, tests, data)."""
    key = topic.strip().lower()
    hits = [f"{k}: {v}" for k, v in PLAYBOOK.items() if k in key or key in k]
    return "\\n".join(hits) or "topics: " + ", ".join(sorted(PLAYBOOK))
'''

REFLECTION_MEMORY = '''
class ReflectionMemoryMiddleware(AgentMiddleware):
    """Keep the last `max_notes` failed tool calls as short lessons and show them to
    the model, so it does not repeat the same failing action."""

    def __init__(self, max_notes: int = 5) -> None:
        super().__init__()
        self.max_notes = max_notes
        self._notes: list[str] = []

    def _record(self, request, result):
        text = str(getattr(result, "content", ""))
        if text.startswith("Error") or "exit code 1" in text:
            name = request.tool_call.get("name", "?")
            self._notes = (self._notes + [f"{name} failed: {text[:160]}"])[-self.max_notes:]
        return result

    def wrap_tool_call(self, request, handler):
        return self._record(request, handler(request))

    async def awrap_tool_call(self, request, handler):
        return self._record(request, await handler(request))

    def before_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        if not self._notes:
            return None
        lessons = "Lessons from failed actions so far:\\n- " + "\\n- ".join(self._notes)
        self._notes = []
        return {"messages": [{"role": "user", "content": lessons}]}

    async def abefore_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        return self.before_model(state, runtime)
'''

ANTI_STUB = '''
class AntiStubGateMiddleware(AgentMiddleware):
    """When the agent would finish, scan what it wrote for stub markers and send it
    back (up to `max_gates` times) if placeholders remain."""

    MARKERS = ("TODO", "NotImplementedError", "placeholder", "stub", "pass  #")

    def __init__(self, max_gates: int = 1) -> None:
        super().__init__()
        self.max_gates = max_gates
        self._gated = 0

    def _stubs(self, msgs) -> list[str]:
        found = []
        for m in msgs:
            for call in getattr(m, "tool_calls", None) or []:
                body = str(call.get("args", {}))
                found += [k for k in self.MARKERS if k in body]
        return sorted(set(found))

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        msgs = state.get("messages") or []
        if not msgs or not isinstance(msgs[-1], AIMessage) or msgs[-1].tool_calls:
            return None
        stubs = self._stubs(msgs)
        if not stubs or self._gated >= self.max_gates:
            return None
        self._gated += 1
        directive = "Written files still contain stub markers (" + ", ".join(stubs) + "). Replace them with real logic."
        return {"messages": [{"role": "user", "content": directive}], "jump_to": "model"}

    @hook_config(can_jump_to=["model"])
    async def aafter_model(self, state: dict[str, Any], runtime) -> dict[str, Any] | None:
        return self.after_model(state, runtime)
'''
