"""Offline mutator: diagnosis from evidence, history-aware scope, personalities."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.agents.mutators import OfflineCandidateOptimizer, OfflineMutator
from milo_ray.agents.protocols import MutationRequest
from milo_ray.benchmarks import surrogate_traces as TR
from milo_ray.benchmarks.surrogate import SurrogateBenchmark
from milo_ray.execution.types import RolloutResult
from milo_ray.harness.evidence import write_evidence_dir
from milo_ray.harness.mechanisms import FAILURE_MODES, MECHANISMS, detect_mechanisms
from milo_ray.harness.seeds import load_seeds

BENCH = SurrogateBenchmark("surrogate_swepro", seed=0)


def _evidence(tmp, harness, mode, n=8, noise=0.1, seed=0):
    rng = np.random.default_rng(seed)
    results = []
    for t in BENCH.tasks("train")[:n]:
        shown = TR.shown_ending(mode, noise, rng)
        n_tests = t.metadata["n_tests"]
        trace = {"trajectory": TR.trajectory(t, harness.harness_id, 0, "m", shown, 100.0, 1000,
                                             mode == "deadline_overrun", rng),
                 "ctrf": TR.ctrf(t.task_id, n_tests, 0, shown, 100.0)}
        results.append(RolloutResult(harness.harness_id, t.task_id, 0, score=0.0, trace=trace))
    return write_evidence_dir(tmp / f"ev-{mode}", harness, results, BENCH.tasks("train")[:n])


def _request(tmp, parent, evidence, seed, memory="", context=None):
    pdir = parent.write_to(tmp / f"parent-{parent.harness_id}")
    return MutationRequest(parent=parent, parent_dir=pdir, evidence_dir=evidence, memory_markdown=memory,
                           workdir=tmp / f"work-{seed}", seed=seed, context=context or {})


def _changed_mechanisms(parent_src, child_src):
    before, after = detect_mechanisms(parent_src), detect_mechanisms(child_src)
    return {n for n in after if n not in before or after[n] != before[n]}


@pytest.mark.parametrize("mode", FAILURE_MODES)
def test_mutator_targets_the_dominant_failure_mode_in_most_trials(tmp_path, mode):
    parent = load_seeds(["stock"])[0]
    ev = _evidence(tmp_path, parent, mode)
    hits = 0
    for seed in range(50):
        res = OfflineMutator("conservative").mutate(_request(tmp_path, parent, ev, seed))
        assert res.child is not None, res.error
        changed = _changed_mechanisms(parent.source, res.child.source)
        hits += any(mode in MECHANISMS[n].addresses for n in changed)
    assert hits >= 35, f"{mode}: {hits}/50"


def test_same_seed_same_child_and_report(tmp_path):
    parent = load_seeds(["plan_and_solve"])[0]
    ev = _evidence(tmp_path, parent, "lax_verification")
    a = OfflineMutator("bold").mutate(_request(tmp_path, parent, ev, 5))
    b = OfflineMutator("bold").mutate(_request(tmp_path, parent, ev, 5))
    assert a.child.harness_id == b.child.harness_id and a.report == b.report
    assert (tmp_path / "work-5" / "harness.py").read_text() == a.child.source


def test_rejected_edits_are_not_retried_and_stuck_parents_get_structural_edits(tmp_path):
    parent = load_seeds(["reproduce_first"])[0]
    ev = _evidence(tmp_path, parent, "deadline_overrun")
    first = OfflineMutator("conservative").mutate(_request(tmp_path, parent, ev, 1))
    label = first.report.splitlines()[0]
    memory = "\n".join(
        [f"- [s0] depth 0 · seed | acc 0.700 | verdict: admitted"] +
        [f"  - [c{i}] depth 1 · mutation | diff +3/-0 | Δacc -0.010 | mutation: {lab} | verdict: rejected (dominated)"
         for i, lab in enumerate([label, "add skills_library", "add edit_tool"])])
    again = OfflineMutator("conservative").mutate(_request(tmp_path, parent, ev, 1, memory, {"parent_node": "s0"}))
    assert again.report.splitlines()[0] != label
    assert "scope: structural" in again.report
    changed = _changed_mechanisms(parent.source, again.child.source)
    assert len(changed) + len(set(detect_mechanisms(parent.source)) - set(detect_mechanisms(again.child.source))) >= 2


def test_sloppy_mutator_sometimes_writes_children_that_validation_rejects(tmp_path):
    try:
        from milo_ray.harness.validate import validate
    except ImportError:  # pragma: no cover - validation module absent
        validate = None
    parent = load_seeds(["division_of_labor"])[0]
    ev = _evidence(tmp_path, parent, "context_overflow")
    bad = []
    for seed in range(30):
        res = OfflineMutator("sloppy").mutate(_request(tmp_path, parent, ev, seed))
        try:
            compile(res.child.source, "harness.py", "exec")
        except SyntaxError:
            bad.append(res.child)
    assert 3 <= len(bad) <= 20
    if validate is not None:
        assert not validate(bad[0]).ok
    for seed in range(30):  # a careful personality never does
        compile(OfflineMutator("conservative").mutate(_request(tmp_path, parent, ev, seed)).child.source, "h", "exec")


def test_candidate_optimizer_diagnoses_from_experience_records(tmp_path):
    parent = load_seeds(["stock"])[0]
    records = [{"task_id": f"t{i}", "summary": "The agent hit the time limit and timed out with nothing saved.",
                "suggestions": ["pace the work against the deadline"], "w": 0.9, "a": 0.8, "u": 0.9, "q": 0.72}
               for i in range(6)]
    records.append({"task_id": "t9", "summary": "Edit failed with invalid arguments.", "suggestions": [],
                    "w": 0.2, "a": 0.5, "u": 0.5, "q": 0.25})
    hits = 0
    for seed in range(20):
        res = OfflineCandidateOptimizer().mutate(
            _request(tmp_path, parent, tmp_path / "none", seed, context={"records": records}))
        hits += any("deadline_overrun" in MECHANISMS[n].addresses
                    for n in _changed_mechanisms(parent.source, res.child.source))
    assert hits >= 14
