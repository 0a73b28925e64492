'''Source code of every harness mechanism, as it appears inside a harness file.

Each entry is real deepagents / langchain code: an ``AgentMiddleware`` subclass, a
``SubAgent`` spec dict, a system-prompt block constant or a ``@tool``. A template is
inserted verbatim as top-level definitions of ``harness.py``; the mechanism is then
wired into ``build_agent`` by one element in one of its assembly lists
(``prompt_blocks``, ``tools``, ``subagents``, ``middleware``). Parameters live as
keyword literals of the wiring call, with the same defaults on ``__init__`` so a
call without keywords still means the documented defaults.

Templates use ``{{``/``}}`` nowhere: they are plain text, not format strings.

A mechanism one of the seed harnesses carries is written once, in that seed
(``milo_ray/harness/seeds/<name>/harness.py``, a file users and mutators read whole):
its template is read from there (:func:`_from_seed`), so the seed and the template
cannot drift. The mechanisms no seed carries are written out here.
'''

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

# The seed harnesses' directory (milo_ray.harness.seeds: data files, never imported).
_SEEDS_DIR = Path(__file__).resolve().parents[1] / "seeds"


@lru_cache(maxsize=None)
def _seed_definitions(seed: str) -> dict[str, str]:
    """Top-level name -> the source text defining it, in seed harness ``seed``."""
    return definitions((_SEEDS_DIR / seed / "harness.py").read_text(encoding="utf-8"))


def definitions(source: str) -> dict[str, str]:
    """Top-level name -> the source text of the class, function or assignment defining it."""
    out: dict[str, str] = {}
    for stmt in ast.parse(source).body:
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out[stmt.name] = ast.get_source_segment(source, stmt)
        elif isinstance(stmt, ast.Assign):
            out.update((t.id, ast.get_source_segment(source, stmt)) for t in stmt.targets if isinstance(t, ast.Name))
    return out


def _from_seed(seed: str, *names: str) -> str:
    """The template of a mechanism the seed ``seed`` carries: its definitions ``names``,
    as the seed writes them, in the layout of a written-out template (a leading and a
    trailing newline, two blank lines between definitions)."""
    definitions = _seed_definitions(seed)
    missing = [n for n in names if n not in definitions]
    if missing:
        raise LookupError(f"the seed harness {seed!r} no longer defines {missing}, which the mechanism templates "
                          "are read from: restore them there or write the template out in templates.py")
    return "\n" + "\n\n\n".join(definitions[n] for n in names) + "\n"

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

# Written once, in the seeds.
CORE_TOOLS = _from_seed('minimal', 'make_core_tools')
SCIENTIST_PROTOCOL = _from_seed('reproduce_first', 'SCIENTIST_PROTOCOL')
PLAN_PROTOCOL = _from_seed('plan_and_solve', 'PLAN_PROTOCOL')
DELEGATION_PROTOCOL = _from_seed('division_of_labor', 'DELEGATION_PROTOCOL')
EXPLORER_SUBAGENT = _from_seed('division_of_labor', 'EXPLORER_SUBAGENT')
CODER_SUBAGENT = _from_seed('division_of_labor', 'CODER_SUBAGENT')
VERIFIER_SUBAGENT = _from_seed('division_of_labor', 'VERIFIER_SUBAGENT')
PLAN_NUDGE = _from_seed('plan_and_solve', 'PlanNudgeMiddleware')
PLAN_GATE = _from_seed('plan_and_solve', 'PlanCompletionGateMiddleware')
COMPLETION_GATE = _from_seed('division_of_labor', 'CompletionGateMiddleware')
RUBRIC_GATE = _from_seed('reproduce_first', 'DEFAULT_RUBRIC', 'DefaultRubricGate')

# Carried by no seed.

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
