"""minimal -- the bare tool loop.

Thesis: measure the backbone model with nothing shaping how it works. The task
instruction is the only user message, there is no system prompt, and the loop calls
the model, runs its tool calls and repeats until it stops calling tools. Three tools
are the least that lets it read task inputs, write graded files and change executed
state: read_file, write_file, bash. No planning, sub-agents, skills, memory,
middleware or summarization.
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.tools import tool

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
        return f"{r.output}\n[exit code {r.exit_code}]"

    return [read_file, write_file, bash]


def build_agent(model, backend):
    """Assemble the agent around the injected model and sandbox backend.

    Each list below is an editable surface: prompt blocks are joined into the system
    prompt, tools/middleware are passed to the agent constructor.
    """
    prompt_blocks: list[str] = []
    tools: list[Any] = [*make_core_tools(backend)]
    middleware: list[Any] = []
    return create_agent(
        model=model,
        tools=tools,
        system_prompt="\n\n".join(prompt_blocks) or None,
        middleware=middleware,
    )
