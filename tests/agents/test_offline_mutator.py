"""Offline mutator: diagnosis from evidence, history-aware scope, personalities."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.agents.mutators import OfflineCandidateOptimizer, OfflineMutator
from milo_ray.agents.protocols import MutationRequest
from milo_ray.benchmarks import surrogate_traces as TR
from milo_ray.benchmarks.surrogate import SurrogateBenchmark
from milo_ray.core.rollouts import RolloutResult
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
        ["- [s0] depth 0 · seed | acc 0.700 | verdict: admitted"] +
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


# ------------------------------------------------------------------ multiscale (SSR)
def _records(n_per_mode: dict[str, int], resolved: int = 0, seed: int = 0) -> list[dict]:
    """Judge-style records: failures labelled with their mode and the mechanisms the
    judge suggests for it (most specific first), plus resolved records."""
    rng = np.random.default_rng(seed)
    out = []
    for mode, n in n_per_mode.items():
        mechs = sorted((m for m, s in MECHANISMS.items() if mode in s.addresses),
                       key=lambda m: (len(MECHANISMS[m].addresses), m))[:3]
        for i in range(n):
            w, a, u = 0.4 + 0.3 * rng.random(), 0.8, 0.75 + 0.15 * rng.random()
            out.append({"task_id": f"{mode}-{i}", "score": 0.0, "resolved": False, "w": w, "a": a, "u": u,
                        "q": a * u, "summary": f"Task failed; the trace shows {mode.replace('_', ' ')}.",
                        "suggestions": [f"Add {m}: {MECHANISMS[m].description}" for m in mechs],
                        "failure_modes": [mode], "mechanisms": mechs})
    for i in range(resolved):
        out.append({"task_id": f"ok-{i}", "score": 1.0, "resolved": True, "w": 0.25, "a": 0.15, "u": 0.9,
                    "q": 0.135, "summary": "Task resolved.", "suggestions": ["No change needed."],
                    "failure_modes": [], "mechanisms": []})
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def _prefixes(records: list[dict], fractions=(0.25, 0.5, 0.75, 1.0)) -> list[list[dict]]:
    return [records[: int(np.ceil(f * len(records)))] for f in fractions]


def _n_changes(res) -> int:
    return len(res.report.splitlines()[0].split(" & "))


def test_larger_evidence_prefix_makes_at_least_as_many_changes(tmp_path):
    parent = load_seeds(["reproduce_first"])[0]
    for trial in range(6):
        recs = _records({"deadline_overrun": 12, "missing_knowhow": 8, "premature_completion": 6,
                         "lax_verification": 5, "tool_misuse": 2}, resolved=47, seed=trial)
        counts = []
        for i, prefix in enumerate(_prefixes(recs)):
            res = OfflineCandidateOptimizer().mutate(
                _request(tmp_path, parent, tmp_path / "none", 100 * trial + i, context={"records": prefix}))
            assert res.child is not None, res.error
            counts.append(_n_changes(res))
        assert counts == sorted(counts), counts
        assert counts[-1] >= 3 and counts[0] <= 2, counts


def test_full_prefix_redesign_covers_every_recurring_failure_mode(tmp_path):
    parent = load_seeds(["stock"])[0]
    modes = {"deadline_overrun": 10, "missing_knowhow": 8, "context_overflow": 6, "tool_misuse": 5}
    recs = _records(modes, resolved=20)
    res = OfflineCandidateOptimizer().mutate(_request(tmp_path, parent, tmp_path / "none", 3, context={"records": recs}))
    changed = _changed_mechanisms(parent.source, res.child.source)
    for mode in modes:
        assert any(mode in MECHANISMS[n].addresses for n in changed), (mode, changed)


def test_distinct_prefixes_give_distinct_children_in_most_trials(tmp_path):
    parent = load_seeds(["reproduce_first"])[0]
    distinct = 0
    for trial in range(10):
        recs = _records({"deadline_overrun": 9, "missing_knowhow": 7, "premature_completion": 5,
                         "lax_verification": 4, "context_overflow": 2}, resolved=40, seed=trial)
        ids = {OfflineCandidateOptimizer().mutate(
            _request(tmp_path, parent, tmp_path / "none", 10 * trial + i, context={"records": p})).child.harness_id
            for i, p in enumerate(_prefixes(recs))}
        distinct += len(ids) >= 3
    assert distinct >= 8, distinct


def test_candidate_optimizer_never_adds_a_mechanism_that_conflicts_with_one_present(tmp_path):
    for name in ("reproduce_first", "plan_and_solve"):
        parent = load_seeds([name])[0]
        before = set(detect_mechanisms(parent.source))
        for seed in range(15):
            recs = _records({"premature_completion": 8, "lax_verification": 8, "missing_knowhow": 6},
                            resolved=10, seed=seed)
            res = OfflineCandidateOptimizer("explorer").mutate(
                _request(tmp_path, parent, tmp_path / "none", seed, context={"records": recs}))
            after = detect_mechanisms(res.child.source)
            for n in after:
                assert not any(c in after for c in MECHANISMS[n].conflicts), (name, seed, sorted(after))
            assert before <= set(after)


def test_time_pressed_harness_gets_no_new_stop_gate(tmp_path):
    from milo_ray.agents.mutators.multiscale import is_gate

    parent = load_seeds(["reproduce_first"])[0]
    before = detect_mechanisms(parent.source)
    for seed in range(15):
        recs = _records({"deadline_overrun": 14, "premature_completion": 6, "lax_verification": 5}, resolved=10,
                        seed=seed)
        res = OfflineCandidateOptimizer("bold").mutate(
            _request(tmp_path, parent, tmp_path / "none", seed, context={"records": recs}))
        after = detect_mechanisms(res.child.source)
        assert not [n for n in after if n not in before and is_gate(n)], sorted(after)
        for n, params in before.items():  # no present gate bounces more often
            for p in ("max_gates", "max_iterations"):
                if p in params and n in after:
                    assert after[n][p] <= params[p]
        assert "time-pressed" in res.report


def test_present_mechanism_that_under_fires_gets_tuned(tmp_path):
    from milo_ray.harness.mechanisms import add_mechanism

    parent = load_seeds(["stock"])[0]
    parent = parent.with_source(add_mechanism(add_mechanism(parent.source, "deadline_governor"), "scaffold_floor"))
    recs = _records({"deadline_overrun": 12}, resolved=5)
    tuned = 0
    for seed in range(10):
        res = OfflineCandidateOptimizer().mutate(
            _request(tmp_path, parent, tmp_path / "none", seed, context={"records": recs}))
        before, after = detect_mechanisms(parent.source), detect_mechanisms(res.child.source)
        gov = after.get("deadline_governor", {})
        tuned += gov.get("warn_frac", 0.5) < before["deadline_governor"]["warn_frac"] or \
            gov.get("final_frac", 0.8) != before["deadline_governor"]["final_frac"]
    assert tuned >= 8, tuned


def test_candidate_optimizer_is_deterministic_given_the_seed(tmp_path):
    parent = load_seeds(["reproduce_first"])[0]
    recs = _records({"deadline_overrun": 9, "missing_knowhow": 7, "premature_completion": 5}, resolved=30)
    a = OfflineCandidateOptimizer().mutate(_request(tmp_path, parent, tmp_path / "none", 7, context={"records": recs}))
    b = OfflineCandidateOptimizer().mutate(_request(tmp_path, parent, tmp_path / "none", 7, context={"records": recs}))
    assert a.child.harness_id == b.child.harness_id and a.report == b.report
