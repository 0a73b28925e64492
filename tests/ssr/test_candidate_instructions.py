"""An SSR candidate's request names the artifact's entry, so its optimizer agent gets the
instructions for what it edits: an agent harness or an optimizer program."""

from __future__ import annotations

from pathlib import Path

import pytest

from milo_ray.agents.mutators.workspace import template_for
from milo_ray.harness.model import Harness
from milo_ray.search.mutation import MutationRequest
from milo_ray.ssr import evidence as ev
from milo_ray.ssr.children import ChildMaker


@pytest.mark.parametrize("entry, template", [("build_agent", "ssr_optimize"), ("optimize", "ssr_optimize_optimizer")])
def test_a_candidates_instructions_follow_the_benchmarks_artifact(tmp_path, entry, template):
    maker = ChildMaker(cfg=None, seed=0, optimizer_spec=None, optimizer_name="opt", forbidden=(), tasks={},
                       store=None, calls=None, emit=lambda e: None, work=tmp_path, entry=entry)
    recs = [ev.ExperienceRecord("t1", 0, "h", 0.2, False, w=0.5, a=0.5, u=0.5, summary="stalled early")]
    ctx = maker.request_context(recs, rnd=1, i=0)
    assert ctx["scale"] == 1 and ctx["records"][0]["task_id"] == "t1"
    req = MutationRequest(parent=Harness.from_source("def optimize(values, *, seed, deadline):\n    return values\n"),
                          parent_dir=Path(tmp_path), evidence_dir=Path(tmp_path), memory_markdown="",
                          workdir=Path(tmp_path), seed=0, context=ctx)
    assert template_for(req) == template
