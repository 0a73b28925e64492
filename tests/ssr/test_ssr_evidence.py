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


def test_rer_order_trades_quality_for_coverage():
    # t0 and t1 are duplicates of high quality; t2 is distinct, a little lower in
    # quality but more important: coverage ranks it before the duplicate.
    recs = _recs([0.9, 0.9, 0.85])
    recs[1].embedding = recs[0].embedding.copy()
    recs[0].w = recs[1].w = 0.3
    recs[2].w = 1.0
    rer = ev.order_records(recs, "rer", np.random.default_rng(0))
    quality = ev.order_records(recs, "quality_only", np.random.default_rng(0))
    assert quality == ["t0", "t1", "t2"]
    assert rer.index("t2") < rer.index("t1")


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
