"""Experience records: the judge re-ask rule, exclusion of judge failures, orderings
and evidence sets (SSR §4.1, §6.4 ablations)."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.ssr import evidence as ev


class ScriptedJudge:
    """Answers from a per-task script of raw outputs (the last one repeats)."""

    name = "scripted"

    def __init__(self, script):
        self.script = script
        self.calls = {}

    def judge(self, trajectory, feedback, task_id):
        n = self.calls.get(task_id, 0)
        self.calls[task_id] = n + 1
        answers = self.script[task_id]
        return answers[min(n, len(answers) - 1)]


GOOD = {"w": 0.6, "a": 0.8, "u": 0.5, "summary": "failed by stopping early", "suggestions": ["add plan_gate"],
        "insights": "gate completion", "failure_modes": ["premature_completion"], "mechanisms": ["plan_gate"]}


def _items(ids):
    return [ev.JudgeItem(t, {}, {"score": 0.0}, 0.0, False) for t in ids]


def test_malformed_answer_is_reasked_then_accepted():
    judge = ScriptedJudge({"t1": ["nope", {**GOOD, "w": 1.4}, GOOD]})
    [rec] = ev.judge_records(judge, _items(["t1"]), round=0, harness_id="h", retries=2)
    assert rec.ok and rec.attempts == 3 and judge.calls["t1"] == 3
    assert (rec.w, rec.a, rec.u) == (0.6, 0.8, 0.5) and rec.q == pytest.approx(0.4)
    assert rec.mechanisms == ["plan_gate"]


def test_persistent_bad_answer_becomes_a_judge_failure_never_clipped():
    judge = ScriptedJudge({"t1": [{**GOOD, "w": 1.4}], "t2": [GOOD]})
    recs = ev.judge_records(judge, _items(["t1", "t2"]), round=0, harness_id="h", retries=1)
    bad, good = recs
    assert judge.calls["t1"] == 2  # one ask + one re-ask
    assert not bad.ok and "'w'" in bad.judge_error
    assert bad.w is None and bad.q is None  # nothing clipped, nothing zero-filled
    row = bad.row()
    assert row["judge_error"] and row["w"] is None
    assert ev.order_records(recs, "quality_only", np.random.default_rng(0)) == ["t2"]


def test_crashing_judge_is_a_judge_failure():
    class Boom:
        def judge(self, *a):
            raise RuntimeError("endpoint down")

    [rec] = ev.judge_records(Boom(), _items(["t"]), round=0, harness_id="h", retries=0)
    assert not rec.ok and "endpoint down" in rec.judge_error


def _recs(qs):
    out = []
    for i, q in enumerate(qs):
        r = ev.ExperienceRecord(f"t{i}", 0, "h", 0.0, False, w=0.5, a=q, u=1.0, summary=f"s{i}")
        r.embedding = np.eye(len(qs), dtype=np.float32)[i]
        out.append(r)
    return out


def test_quality_only_sorts_by_q_with_index_ties():
    order = ev.order_records(_recs([0.2, 0.9, 0.2, 0.5]), "quality_only", np.random.default_rng(0))
    assert order == ["t1", "t3", "t0", "t2"]


def test_random_order_is_a_seeded_permutation():
    recs = _recs([0.1] * 8)
    a = ev.order_records(recs, "random", np.random.default_rng(5))
    assert sorted(a) == sorted(r.task_id for r in recs)
    assert a == ev.order_records(recs, "random", np.random.default_rng(5))


def _near_duplicate_pairs(cos: float):
    """Four records equal in importance and quality: t1 is a near-duplicate of t0
    (cosine ``cos``), t3 of t2, and the two pairs are orthogonal to each other."""
    sin = float(np.sqrt(1.0 - cos**2))
    z = np.array([[1, 0, 0, 0], [cos, sin, 0, 0], [0, 0, 1, 0], [0, 0, cos, sin]], dtype=np.float32)
    recs = _recs([0.6] * 4)
    for r, row in zip(recs, z):
        r.embedding = row
    return recs


def test_a_near_duplicate_record_ranks_after_a_dissimilar_one():
    # w and q are the same for every record, so neither importance nor quality can
    # order them: only the coverage term of F(Y) = sum_j w_j log(1 + sum_i q_i s_ij) can.
    # t0 and t2 tie on the first gain (each covers itself and its twin), t0 wins by
    # index; then t1 (already mostly covered by t0) gains less than t2, whose pair is
    # still uncovered, so the dissimilar t2 comes before the near-duplicate t1.
    recs = _near_duplicate_pairs(0.98)
    assert len({(r.w, r.q) for r in recs}) == 1
    rer = ev.order_records(recs, "rer", np.random.default_rng(0))
    assert rer == ["t0", "t2", "t1", "t3"]
    # Without similarity (equal w and q) the index order is all there is.
    assert ev.order_records(recs, "quality_only", np.random.default_rng(0)) == ["t0", "t1", "t2", "t3"]


def test_rer_greedy_picks_the_largest_coverage_gain_at_every_step():
    # The same records, checked against the objective itself: every record the order
    # adds is one with the largest marginal gain F(Y + i) - F(Y) (ties to the lower index).
    from milo_ray.kernels.submodular import clipped_cosine, coverage_objective

    recs = _near_duplicate_pairs(0.98)
    w, q = [r.w for r in recs], [r.q for r in recs]
    S = clipped_cosine(np.stack([r.embedding for r in recs]))
    order = [int(t[1:]) for t in ev.order_records(recs, "rer", np.random.default_rng(0))]
    chosen: list[int] = []
    for pick in order:
        base = coverage_objective(chosen, w, q, S)
        gains = {i: coverage_objective(chosen + [i], w, q, S) - base for i in range(4) if i not in chosen}
        best = max(gains.values())
        assert pick == min(i for i, g in gains.items() if g >= best - 1e-12), (chosen, gains)
        chosen.append(pick)


ORDER = [f"t{i}" for i in range(10)]
FR = [0.25, 0.5, 0.75, 1.0]


def test_multiscale_sets_are_nested_prefixes():
    sets = ev.evidence_sets(ORDER, FR, "rer", np.random.default_rng(0))
    assert [len(s) for s in sets] == [3, 5, 8, 10]
    for small, big in zip(sets, sets[1:]):
        assert big[: len(small)] == small


def test_fixed_strategies():
    rng = np.random.default_rng(0)
    fixed = ev.evidence_sets(ORDER, FR, "topk_fixed", rng)
    assert all(s == tuple(ORDER[:3]) for s in fixed) and len(fixed) == 4
    assert all(s == tuple(ORDER) for s in ev.evidence_sets(ORDER, FR, "fixed_n", rng))
    res = ev.evidence_sets(ORDER, FR, "topk_resampling", np.random.default_rng(1))
    assert all(len(s) == 3 and list(s) == sorted(s, key=ORDER.index) for s in res)
    assert len({s for s in res}) > 1  # independent subsets


@pytest.mark.parametrize("strategy", ["rer", "topk_fixed", "topk_resampling", "fixed_n"])
def test_no_evidence_gives_no_candidates_under_every_strategy(strategy):
    assert ev.evidence_sets([], FR, strategy, np.random.default_rng(0)) == []


def test_unknown_evidence_strategy_is_named_in_the_error():
    with pytest.raises(ValueError, match="evidence='best'"):
        ev.evidence_sets(ORDER, FR, "best", np.random.default_rng(0))


def test_memory_lists_summaries_suggestions_and_trace_location():
    recs = _recs([0.9, 0.5])
    recs[0].suggestions = ["add deadline_governor"]
    md = ev.render_memory(recs, k=2, n=10, evidence_dir="/x/evidence")
    assert "s0" in md and "add deadline_governor" in md and "/x/evidence/traces/" in md
