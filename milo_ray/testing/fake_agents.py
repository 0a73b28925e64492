"""Agents with scripted behaviour for tests of the search machinery (importable by Ray
workers, which run candidate generation)."""

from __future__ import annotations

from pathlib import Path

from milo_ray.llm.client import secret
from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.llm.usage import AgentUsage
from milo_ray.harness.model import ENTRY_FILE, Harness


class SameEditFirstOptimizer:
    """Writes one and the same edit on its first call for a candidate and a distinct
    edit on every later call (a re-draw reuses the candidate's workspace, where the
    calls are counted)."""

    def mutate(self, request: MutationRequest) -> MutationResult:
        counter = Path(request.workdir) / "calls"
        n = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(n))
        i = request.context["candidate_index"]
        tail = "# one common edit\n" if n == 1 else f"# edit {n} of candidate {i}\n"
        source = request.parent.files[ENTRY_FILE] + tail
        return MutationResult(Harness({**request.parent.files, ENTRY_FILE: source}), report="edit")


class CountingMutator:
    """Appends one line per construction and per call to ``log`` (``init <pid>`` /
    ``call <pid>``), reports fixed usage, and writes a distinct child per seed: tests
    read the log to count constructions per process and calls."""

    name = "counting"

    def __init__(self, log: str, input_tokens: int = 0, output_tokens: int = 0, cost_usd: float | None = 0.0,
                 sleep_s: float = 0.0) -> None:
        import os

        self.log, self.sleep_s = Path(log), float(sleep_s)
        self.usage = (int(input_tokens), int(output_tokens), cost_usd)
        with self.log.open("a") as f:
            f.write(f"init {os.getpid()}\n")

    def mutate(self, request: MutationRequest) -> MutationResult:
        import os
        import time

        with self.log.open("a") as f:
            f.write(f"call {os.getpid()}\n")
        if self.sleep_s:
            time.sleep(self.sleep_s)  # a hung agent when the sleep outlasts the cap
        source = request.parent.files[ENTRY_FILE] + f"# edit for seed {request.seed}\n"
        i, o, usd = self.usage
        return MutationResult(Harness({**request.parent.files, ENTRY_FILE: source}), report="edited",
                              usage=AgentUsage(input_tokens=i, output_tokens=o, cost_usd=usd))

    def graft(self, request: MutationRequest) -> MutationResult:
        return self.mutate(request)


class ScriptedOutputMutator:
    """Answers by ``mode``: ``crash`` raises, ``nothing`` returns no child, ``workdir``
    writes the child into the workdir, ``same`` returns the parent, ``broken``
    returns a child that does not compile."""

    name = "scripted-output"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def mutate(self, request: MutationRequest) -> MutationResult:
        parent = request.parent.files[ENTRY_FILE]
        if self.mode == "crash":
            raise RuntimeError("boom")
        if self.mode == "nothing":
            return MutationResult(None, report="gave up")
        if self.mode == "workdir":
            (Path(request.workdir) / ENTRY_FILE).write_text(parent + "# written to the workdir\n")
            return MutationResult(None, report="wrote it", usage=AgentUsage(input_tokens=7))
        if self.mode == "same":
            return MutationResult(request.parent, report="no change")
        if self.mode == "broken":
            return MutationResult(Harness({ENTRY_FILE: "def build_agent(model, backend)\n    return 1\n"}))
        raise ValueError(f"unknown mode {self.mode!r}")


class SlowToBuildMutator(CountingMutator):
    """A constructor that hangs for ``build_s`` seconds (a client that cannot connect)."""

    def __init__(self, log: str, build_s: float) -> None:
        import time

        time.sleep(build_s)
        super().__init__(log)


class EvidenceReadingMutator:
    """Reads what an LLM coding agent would read: the parent's ``harness.py``, the
    evidence report, and the file the memory text and ``context['memory_path']`` point
    at; writes all of it into the child, so tests see what reached the agent."""

    name = "evidence-reader"

    def mutate(self, request: MutationRequest) -> MutationResult:
        import re

        seen = [Path(request.parent_dir, ENTRY_FILE).read_text(), Path(request.evidence_dir, "report.md").read_text()]
        for path in re.findall(r"(/\S+\.md)", request.memory_markdown):
            seen.append(Path(path).read_text())
        seen.append(Path(request.context["memory_path"]).read_text())
        note = "".join(f"# read: {line}\n" for text in seen[1:] for line in text.splitlines())
        return MutationResult(Harness({ENTRY_FILE: seen[0] + note}), report="read the evidence")


class EnvReportingMutator:
    """Writes a child and reports the value of key variable ``name`` as an agent in the
    process that ran it reads it (``<unset>`` when absent), and whether that process's
    environment holds it: what reaches a mutation's worker, and how."""

    name = "env-reporting"

    def __init__(self, variable: str) -> None:
        self.variable = variable

    def mutate(self, request: MutationRequest) -> MutationResult:
        import os

        value = secret(self.variable) or "<unset>"
        in_env = "in-env" if self.variable in os.environ else "not-in-env"
        child = Harness.from_source(request.parent.source + f"# env {value}\n", name="child")
        return MutationResult(child, report=f"{value} {in_env}")


class GatewayLoopMutator:
    """A mutator whose agent loop calls its model ``calls`` times through this process's
    model gateway (:class:`~milo_ray.boundary.gateway.mutation.MutationGateway`, as the
    LLM mutators do), then writes a child and reports the gateway's metered usage; with
    ``hang_s`` it then waits that long first (a hung agent when it outlasts the time cap).
    For tests of the search agents' call journal."""

    name = "gateway-loop"

    def __init__(self, llm: dict, calls: int = 3, hang_s: float = 0.0) -> None:
        from milo_ray.llm.role_llm import RoleLLM

        self.llm = RoleLLM.of(llm, where="gateway-loop.llm")
        self.calls, self.hang_s = int(calls), float(hang_s)

    def mutate(self, request: MutationRequest) -> MutationResult:
        import time

        from milo_ray.llm.role_llm import metered_chat_model
        from milo_ray.boundary.gateway.mutation import MutationGateway

        t0 = time.monotonic()
        with metered_chat_model(self.llm, MutationGateway.shared(self.llm), role="mutator", caller=self.name) as call:
            for _ in range(self.calls):
                call.model.invoke("again")
            if self.hang_s:
                time.sleep(self.hang_s)
        source = request.parent.files[ENTRY_FILE] + f"# edit for seed {request.seed}\n"
        return MutationResult(Harness({**request.parent.files, ENTRY_FILE: source}), report="edited",
                              usage=call.usage(seconds=time.monotonic() - t0))
