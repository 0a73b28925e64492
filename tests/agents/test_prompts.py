"""The search agents' instruction templates: each renders from a real snapshot with every
placeholder filled (an island's lineage tree with on-disk node paths for MILO's mutator
and graft, ranked experience records for SSR's optimizer), paths as the agent sees them;
a missing or unknown value is refused, never sent to a model with a hole in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from milo_ray.agents.mutators.workspace import prepare, template_for
from milo_ray.agents.prompts import PromptError, names, placeholders, render, render_from
from milo_ray.agents.protocols import MutationRequest
from milo_ray.harness.model import Harness
from milo_ray.milo.events import Init, NodeRecorded, Progress
from milo_ray.milo.lineage import LineageNode
from milo_ray.milo.state import MiloState
from milo_ray.ssr import evidence as ev

SEED = Path(__file__).resolve().parents[2] / "milo_ray" / "harness" / "seeds" / "minimal"


def _store_node(root: Path, node_id: str, source: str) -> str:
    d = root / "nodes" / node_id
    d.mkdir(parents=True)
    (d / "harness.py").write_text(source)
    (d / "diff.patch").write_text(f"--- a/harness.py\n+++ b/harness.py\n+# {node_id}\n")
    return str(d / "harness.py")


def _island_snapshot(root: Path, parent: Harness) -> str:
    """The lineage tree MILO hands a mutator: a seed and a rejected child, each with the
    on-disk path of its harness.py (and diff.patch beside it)."""
    st = MiloState()
    node = dict(island=0, costs={"output_tokens": 1e5, "seconds": 600.0}, fitness=[0.5, 0.99, 0.9])
    st.apply(Init(search_tasks=["t1", "t2"], val_tasks=["v1"], task_pool=["t1", "t2"], islands=[0],
                  assignment={0: "deepagents"}))
    st.apply(NodeRecorded(LineageNode("s0", parent.harness_id, round=0, origin="seed", accuracy=0.5,
                                      behavior={"t1": 1.0, "t2": 0.0}, admitted=True, verdict_reason="admitted",
                                      harness_path=_store_node(root, "s0", parent.source), **node)))
    st.apply(NodeRecorded(LineageNode("0-1", "h-child", round=1, origin="mutation", parent="s0", accuracy=0.0,
                                      behavior={"t1": 0.0, "t2": 0.0}, admitted=False, verdict_reason="dominated",
                                      mutator="deepagents", mutation="reworded the system prompt",
                                      harness_path=_store_node(root, "0-1", parent.source + "# x\n"), **node)))
    st.apply(Progress(0, 1, 1))
    return st.islands[0].render(memory="lineage", mutator="deepagents")


def _request(tmp: Path, memory: str, **context) -> MutationRequest:
    parent = Harness.from_dir(SEED, name="minimal")
    parent_dir = parent.write_to(tmp / "run" / "parent")
    evidence = tmp / "run" / "evidence"
    (evidence / "traces" / "t2").mkdir(parents=True)
    (evidence / "report.md").write_text("t2: failed\n")
    (evidence / "traces" / "t2" / "trajectory.json").write_text('{"steps": []}')
    return MutationRequest(parent=parent, parent_dir=parent_dir, evidence_dir=evidence, memory_markdown=memory,
                           workdir=tmp / "run" / "work", seed=3, context=context)


def _records() -> list[ev.ExperienceRecord]:
    return [ev.ExperienceRecord("t2", 0, "h", 0.0, False, w=0.8, a=0.7, u=0.9, summary="It stopped before testing.",
                                suggestions=["Run the tests before finishing."], insights="Verify first.")]


@pytest.mark.parametrize("kind", ["mutate", "mutate_optimizer", "graft", "ssr_optimize", "ssr_optimize_optimizer"])
def test_coding_agent_instructions_render_from_a_real_snapshot_with_every_placeholder_filled(tmp_path, kind):
    parent = Harness.from_dir(SEED, name="minimal")
    if kind.startswith("ssr_optimize"):
        recs = _records()
        extra = {"artifact_entry": "optimize"} if kind == "ssr_optimize_optimizer" else {}
        req = _request(tmp_path, ev.render_memory(recs, k=1, n=1, evidence_dir=str(tmp_path / "run" / "evidence")),
                       records=[r.as_dict() for r in recs], scale=1, **extra)
    else:
        snapshot = _island_snapshot(tmp_path / "run", parent)
        ctx = {"parent_accuracy": 0.5, "parent_costs": {"output_tokens": 1e5}}
        if kind == "mutate_optimizer":
            ctx["artifact_entry"] = "optimize"
        if kind == "graft":
            donor = Harness.from_source(parent.source + "# donor\n", name="donor")
            ctx.update(mode="graft", co_parent_source=donor.source,
                       co_parent_dir=str(donor.write_to(tmp_path / "run" / "donor")), diagnosis="Island 0 is stuck.",
                       why="island 1 verifies its work", dest_island=0, donor_island=1)
        req = _request(tmp_path, snapshot, **ctx)
    assert template_for(req) == kind
    ws = prepare(req, tmp_path / "ws", agent_root="/workspace")
    text = render_from(kind, ws.values())
    assert "${" not in text and "/workspace/out/harness.py" in text and "/workspace/parent/harness.py" in text
    assert str(tmp_path / "run" / "parent") not in text  # the agent sees its copies, not the run's files
    # An optimizer program's instructions speak of optimize(), a harness's of build_agent().
    assert ("def optimize(values, *, seed, deadline)" in text) == kind.endswith("_optimizer")
    assert ("build_agent(model, backend)" in text) == (not kind.endswith("_optimizer"))
    if kind == "graft":
        assert "/workspace/co_parent/harness.py" in text and "Island 0 is stuck." in text
    if kind.startswith("ssr_optimize"):
        assert "It stopped before testing." in text and "/workspace/evidence/traces/<task_id>/trajectory.json" in text
    else:
        memory = (ws.root / "memory.md").read_text()
        assert str(tmp_path / "run" / "nodes" / "0-1" / "harness.py") in memory  # node paths stay readable
        assert sorted(ws.external_dirs()) == sorted(str(tmp_path / "run" / "nodes" / n) for n in ("s0", "0-1"))


def test_every_template_is_known_and_a_hole_or_a_typo_is_refused():
    assert {"mutate", "mutate_optimizer", "graft", "ssr_optimize", "ssr_optimize_optimizer", "orchestrator",
            "judge"} <= set(names())
    need = sorted(placeholders("mutate"))
    values = {k: "x" for k in need}
    assert "${" not in render("mutate", **values)
    with pytest.raises(PromptError, match=f"missing values \\['{need[0]}'\\]"):
        render("mutate", **{k: v for k, v in values.items() if k != need[0]})
    with pytest.raises(PromptError, match="unknown values \\['ouput_path'\\]"):
        render("mutate", **values, ouput_path="x")
    with pytest.raises(PromptError, match="no prompt template 'mutat'"):
        render("mutat")
