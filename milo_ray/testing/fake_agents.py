"""Agents with scripted behaviour for tests of the search machinery (importable by Ray
workers, which run candidate generation)."""

from __future__ import annotations

from pathlib import Path

from milo_ray.agents.protocols import MutationRequest, MutationResult
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
