"""The mechanism catalog: what each harness mechanism is, which failure modes it
addresses, its parameters, and how it is written into and wired into a harness.

Mechanisms are drawn from MILO (papers/000): the seeds' prompt protocols, plan nudge
and plan-completion gate, explorer/coder/verifier sub-agents with a completion gate
(App. B.3), deepagents' rubric gate (B12), the expert add-ons of Tab. 10 (context
clamp, edit tool, skills library, reflection memory, deadline awareness) and the
mechanisms of MILO's best harness (independent-verifier gate, scaffold floor, deadline
governor, anti-stub check; App. D.2). The code of each lives in ``templates.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from milo_ray.harness.mechanisms import templates as T

FAILURE_MODES: tuple[str, ...] = (
    "premature_completion",  # success declared at a wrong state
    "deadline_overrun",  # the time cap zeroes (or truncates) the attempt
    "lax_verification",  # the self-check is weaker than the hidden grader
    "missing_knowhow",  # the agent does not know how to do a step
    "context_overflow",  # the context fills with noise and the agent loses the thread
    "tool_misuse",  # malformed or destructive tool calls, thrashing on tool errors
)

# The assembly lists of build_agent a mechanism can be wired into.
SLOTS: tuple[str, ...] = ("prompt_blocks", "tools", "subagents", "middleware")
KINDS: tuple[str, ...] = ("framework", "prompt", "tool", "subagent", "middleware")


@dataclass(frozen=True)
class MechanismSpec:
    """One harness mechanism.

    symbol: the top-level name the template defines and the wiring references.
    slot: the build_agent list that wires it (None for the framework mechanism).
    wiring: the list element; ``{kwargs}`` is replaced by ``k=v`` literals of params.
    extra_symbols: further top-level names the template defines (removed with it).
    hooks: methods a middleware class must define to count as present (a class
    whose hooks were deleted no longer has the effect).
    requires: mechanisms the wiring needs to be valid code (sub-agents need the
    deepagents stack); ``add_mechanism`` adds them first.
    synergies / conflicts: mechanisms whose effect compounds with / fights this one
    (documentation for mutators; the surrogate's quality model encodes the numbers).
    grid: parameter values an exhaustive search may try.
    """

    name: str
    description: str
    addresses: tuple[str, ...]
    kind: str
    symbol: str
    slot: str | None
    template: str
    wiring: str
    params: dict[str, Any] = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    extra_symbols: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    synergies: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)


_MW_IMPORTS = ("Any", "AgentMiddleware", "AIMessage")
_GATE_IMPORTS = _MW_IMPORTS + ("hook_config",)

_SPECS: list[MechanismSpec] = [
    MechanismSpec(
        "deepagents_stack",
        "Build on create_deep_agent: todo planning, filesystem tools with edit_file, a "
        "general-purpose sub-agent and context summarization instead of a bare tool loop.",
        ("context_overflow", "tool_misuse"),
        "framework", "create_deep_agent", None, "", "",
        imports=("create_deep_agent",),
    ),
    MechanismSpec(
        "scientist_protocol",
        "System-prompt protocol: reproduce/pin down, hypothesize, minimal change, re-run the same check.",
        ("lax_verification", "premature_completion"),
        "prompt", "SCIENTIST_PROTOCOL", "prompt_blocks", T.SCIENTIST_PROTOCOL, "SCIENTIST_PROTOCOL",
        synergies=("rubric_gate",), conflicts=("plan_protocol",),
    ),
    MechanismSpec(
        "plan_protocol",
        "System-prompt protocol: extract requirements, write an exhaustive todo plan, execute step by step.",
        ("premature_completion", "missing_knowhow"),
        "prompt", "PLAN_PROTOCOL", "prompt_blocks", T.PLAN_PROTOCOL, "PLAN_PROTOCOL",
        synergies=("plan_nudge", "plan_gate"), conflicts=("scientist_protocol",),
    ),
    MechanismSpec(
        "delegation_protocol",
        "System-prompt protocol for a lead agent that delegates to explorer/coder/verifier sub-agents.",
        ("context_overflow",),
        "prompt", "DELEGATION_PROTOCOL", "prompt_blocks", T.DELEGATION_PROTOCOL, "DELEGATION_PROTOCOL",
        synergies=("explorer_subagent", "coder_subagent", "verifier_subagent"),
    ),
    MechanismSpec(
        "plan_nudge",
        "Middleware: before the first model call, ask for a written todo plan before acting.",
        ("premature_completion",),
        "middleware", "PlanNudgeMiddleware", "middleware", T.PLAN_NUDGE, "PlanNudgeMiddleware({kwargs})",
        imports=_MW_IMPORTS, hooks=("before_model",), synergies=("plan_protocol", "plan_gate"),
    ),
    MechanismSpec(
        "plan_gate",
        "Middleware: when the agent would stop, send it back to confirm every plan step (max_gates times).",
        ("premature_completion",),
        "middleware", "PlanCompletionGateMiddleware", "middleware", T.PLAN_GATE,
        "PlanCompletionGateMiddleware({kwargs})",
        params={"max_gates": 1}, imports=_GATE_IMPORTS, hooks=("after_model",),
        synergies=("plan_nudge", "plan_protocol"), grid={"max_gates": (1, 2, 3)},
    ),
    MechanismSpec(
        "explorer_subagent",
        "Sub-agent: read-only explorer with its own context; reports findings to the lead.",
        ("context_overflow", "missing_knowhow"),
        "subagent", "EXPLORER_SUBAGENT", "subagents", T.EXPLORER_SUBAGENT, "EXPLORER_SUBAGENT",
        requires=("deepagents_stack",), synergies=("delegation_protocol",),
    ),
    MechanismSpec(
        "coder_subagent",
        "Sub-agent: implements one well-scoped change in an isolated context.",
        ("tool_misuse", "context_overflow"),
        "subagent", "CODER_SUBAGENT", "subagents", T.CODER_SUBAGENT, "CODER_SUBAGENT",
        requires=("deepagents_stack",), synergies=("delegation_protocol",),
    ),
    MechanismSpec(
        "verifier_subagent",
        "Sub-agent: independent, adversarial check of the real end state (SATISFIED / NOT SATISFIED).",
        ("lax_verification",),
        "subagent", "VERIFIER_SUBAGENT", "subagents", T.VERIFIER_SUBAGENT, "VERIFIER_SUBAGENT",
        requires=("deepagents_stack",), synergies=("completion_gate", "verifier_gate"),
    ),
    MechanismSpec(
        "completion_gate",
        "Middleware: refuse to stop until the verifier sub-agent was dispatched (max_gates times).",
        ("premature_completion",),
        "middleware", "CompletionGateMiddleware", "middleware", T.COMPLETION_GATE,
        "CompletionGateMiddleware({kwargs})",
        params={"max_gates": 1}, imports=_GATE_IMPORTS, hooks=("after_model",),
        synergies=("verifier_subagent",), grid={"max_gates": (1, 2, 3)},
    ),
    MechanismSpec(
        "rubric_gate",
        "deepagents RubricMiddleware with a default reproduce-first rubric: a grader re-reads the "
        "transcript whenever the agent would finish (max_iterations bounces).",
        ("premature_completion", "lax_verification"),
        "middleware", "DefaultRubricGate", "middleware", T.RUBRIC_GATE, "DefaultRubricGate(model=model{kwargs})",
        params={"max_iterations": 2}, imports=("RubricMiddleware",), extra_symbols=("DEFAULT_RUBRIC",),
        hooks=("before_agent",), synergies=("scientist_protocol",), conflicts=("verifier_gate",),
        grid={"max_iterations": (1, 2, 3)},
    ),
    MechanismSpec(
        "verifier_gate",
        "Middleware: stop only after a fresh SATISFIED verdict from the verifier sub-agent; relaxes "
        "after relax_frac of the time budget (MILO's independent-verifier gate).",
        ("premature_completion", "lax_verification"),
        "middleware", "IndependentVerifierGate", "middleware", T.VERIFIER_GATE,
        "IndependentVerifierGate({kwargs})",
        params={"max_gates": 2, "relax_frac": 0.85}, imports=_GATE_IMPORTS + ("os", "time"),
        hooks=("after_model",), synergies=("verifier_subagent", "deadline_governor"),
        conflicts=("rubric_gate",), grid={"max_gates": (1, 2, 3), "relax_frac": (0.7, 0.85, 1.0)},
    ),
    MechanismSpec(
        "deadline_governor",
        "Middleware: elapsed-time readout on every model call; converge past warn_frac, bank a "
        "valid state past final_frac of the budget.",
        ("deadline_overrun",),
        "middleware", "DeadlineGovernorMiddleware", "middleware", T.DEADLINE_GOVERNOR,
        "DeadlineGovernorMiddleware({kwargs})",
        params={"warn_frac": 0.5, "final_frac": 0.8}, imports=_MW_IMPORTS + ("os", "time"),
        hooks=("before_model",), synergies=("scaffold_floor", "verifier_gate"),
        grid={"warn_frac": (0.4, 0.5, 0.6), "final_frac": (0.7, 0.8, 0.9)},
    ),
    MechanismSpec(
        "scaffold_floor",
        "Middleware: first-call directive to create a minimal valid version of every deliverable "
        "before deep work, so a timeout still earns partial credit.",
        ("deadline_overrun",),
        "middleware", "ScaffoldFloorMiddleware", "middleware", T.SCAFFOLD_FLOOR, "ScaffoldFloorMiddleware({kwargs})",
        imports=_MW_IMPORTS, hooks=("before_model",), synergies=("deadline_governor", "anti_stub_check"),
    ),
    MechanismSpec(
        "context_clamp",
        "Middleware: clamp each tool observation to max_chars (head and tail kept).",
        ("context_overflow",),
        "middleware", "ContextClampMiddleware", "middleware", T.CONTEXT_CLAMP, "ContextClampMiddleware({kwargs})",
        params={"max_chars": 12000}, imports=("AgentMiddleware", "ToolMessage"), hooks=("wrap_tool_call",),
        grid={"max_chars": (4000, 12000, 40000)},
    ),
    MechanismSpec(
        "edit_tool",
        "Tool: exact single-occurrence string replacement instead of whole-file rewrites.",
        ("tool_misuse",),
        "tool", "make_edit_tool", "tools", T.EDIT_TOOL, "make_edit_tool(backend)", imports=("tool",),
    ),
    MechanismSpec(
        "skills_library",
        "Tool: a playbook of field-tested know-how the agent can consult by topic.",
        ("missing_knowhow",),
        "tool", "consult_playbook", "tools", T.SKILLS_LIBRARY, "consult_playbook",
        imports=("tool",), extra_symbols=("PLAYBOOK",),
    ),
    MechanismSpec(
        "reflection_memory",
        "Middleware: remembers the last max_notes failed tool calls as lessons shown to the model.",
        ("tool_misuse", "missing_knowhow"),
        "middleware", "ReflectionMemoryMiddleware", "middleware", T.REFLECTION_MEMORY,
        "ReflectionMemoryMiddleware({kwargs})",
        params={"max_notes": 5}, imports=_MW_IMPORTS, hooks=("wrap_tool_call", "before_model"),
        grid={"max_notes": (3, 5, 10)},
    ),
    MechanismSpec(
        "anti_stub_check",
        "Middleware: when the agent would finish, reject stub markers left in written files.",
        ("premature_completion",),
        "middleware", "AntiStubGateMiddleware", "middleware", T.ANTI_STUB, "AntiStubGateMiddleware({kwargs})",
        params={"max_gates": 1}, imports=_GATE_IMPORTS, hooks=("after_model",),
        synergies=("scaffold_floor",), grid={"max_gates": (1, 2)},
    ),
]

MECHANISMS: dict[str, MechanismSpec] = {s.name: s for s in _SPECS}
SYMBOL_TO_MECHANISM: dict[str, str] = {s.symbol: s.name for s in _SPECS}


def spec(name: str) -> MechanismSpec:
    try:
        return MECHANISMS[name]
    except KeyError:
        raise ValueError(f"mechanism {name!r}: unknown; choose one of {sorted(MECHANISMS)}") from None


def mechanisms_addressing(mode: str) -> list[str]:
    """Names of the mechanisms whose ``addresses`` include ``mode`` (catalog order)."""
    if mode not in FAILURE_MODES:
        raise ValueError(f"failure mode {mode!r}: unknown; choose one of {FAILURE_MODES}")
    return [s.name for s in _SPECS if mode in s.addresses]
