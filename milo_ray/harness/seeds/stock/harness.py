"""stock -- deepagents with its built-in defaults.

Thesis: measure out-of-the-box behaviour of the deepagents stack (todo planning,
filesystem tools including edit_file, a general-purpose sub-agent, summarization of
long contexts). Every editable surface -- prompt blocks, extra tools, sub-agents,
middleware -- is left empty, so this file shows exactly where a search may add things.
"""

from __future__ import annotations

from typing import Any

from deepagents import create_deep_agent


def build_agent(model, backend):
    """Assemble the agent around the injected model and sandbox backend.

    Each list below is an editable surface: prompt blocks are joined into the system
    prompt; tools, sub-agent specs and middleware go to create_deep_agent.
    """
    prompt_blocks: list[str] = []
    tools: list[Any] = []
    subagents: list[dict[str, Any]] = []
    middleware: list[Any] = []
    return create_deep_agent(
        model=model,
        backend=backend,
        system_prompt="\n\n".join(prompt_blocks) or None,
        tools=tools,
        subagents=subagents,
        middleware=middleware,
    )
