"""The shared end-of-run services: the final test is outside the budget and scores
each harness on every test task k times; ground truth comes from the benchmark when
it has one; harness rows are written once per key, also across a resume."""

from __future__ import annotations

import asyncio

import pytest

from milo_ray.core.rollouts import RolloutRequest, RolloutResult
from milo_ray.core.seeds import final_test_seed
from milo_ray.harness.model import Harness
from milo_ray.search.final_test import FinalTest, true_quality, true_score
from milo_ray.search.recording import HarnessRecorder
from milo_ray.store.memory import MemoryRunStore

A = Harness.from_source("def build_agent(model, backend):\n    return 'a'\n", name="a")
B = Harness.from_source("def build_agent(model, backend):\n    return 'b'\n", name="b")


class Task:
    def __init__(self, task_id):
        self.task_id = task_id


class Bench:
    """Three test tasks; no ground truth."""

    def tasks(self, split):
        return [Task(f"{split}-{i}") for i in range(3)]


class TruthBench(Bench):
    def true_quality(self, harness, split):
        return {"score": 0.75 if harness.name == "a" else 0.25}


class Sched:
    """Scores 1 for harness a, 0 for b; remembers what it was asked and how."""

    def __init__(self):
        self.calls, self.added = [], []

    def add_harness(self, h):
        self.added.append(h.harness_id)

    def run(self, reqs, *, count_budget=True):
        self.calls.append((list(reqs), count_budget))
        return [RolloutResult(r.harness_id, r.task_id, r.rollout_idx, 1.0 if r.harness_id == A.harness_id else 0.0)
                for r in reqs]

    async def arun(self, reqs, *, count_budget=True):
        return self.run(reqs, count_budget=count_budget)


def test_final_test_runs_every_task_k_times_outside_the_budget():
    sched = Sched()
    ft = FinalTest(sched, TruthBench(), split="test", k=2, seed=7, method="ssr", stage="test", group="g")
    rows = ft.rows([("final", A), ("initial", B)], round=3)
    assert [r.name for r in rows] == ["final", "initial"]
    assert [r.pr_at_k for r in rows] == [1.0, 0.0]
    assert [r.true_score for r in rows] == [0.75, 0.25]
    assert sched.added == [A.harness_id, B.harness_id]
    for reqs, counted in sched.calls:
        assert counted is False
        assert len(reqs) == 6 and {(r.task_id, r.rollout_idx) for r in reqs} == {
            (f"test-{i}", j) for i in range(3) for j in range(2)}
        assert {(r.split, r.stage, r.group, r.round, r.seed, r.method) for r in reqs} == {
            ("test", "test", "g", 3, final_test_seed(7), "ssr")}
    assert [r.pr_at_k for r in asyncio.run(ft.arows([("x", A)]))] == [1.0]


def test_final_test_rollouts_never_have_a_search_rollouts_cache_key():
    # The search's rollouts carry the run seed; the final test's draw from a namespace of
    # its own, so the same (harness, task, rollout index) is a different rollout.
    search = RolloutRequest(A.harness_id, "test-0", 0, 7)
    sched = Sched()
    FinalTest(sched, Bench(), split="test", k=1, seed=7, method="m").rows([("a", A)])
    tested = [r for reqs, _ in sched.calls for r in reqs]
    assert final_test_seed(7) != 7
    assert {r.key("model") for r in tested}.isdisjoint({search.key("model")})
    assert search.key("model") in {RolloutRequest(A.harness_id, t, 0, 7).key("model") for t in ("test-0",)}


class SearchedSched(Sched):
    """A scheduler whose store holds the search's (budgeted) rollouts on test-0 and one
    earlier final-test rollout (unbudgeted) on test-1."""

    def __init__(self):
        super().__init__()
        self.store = MemoryRunStore(run_id="r")
        self.store.append_rollouts([RolloutResult(A.harness_id, "test-0", 0, 1.0, cache_key="s", budgeted=True),
                                    RolloutResult(A.harness_id, "test-1", 0, 1.0, cache_key="f", budgeted=False)])


def test_a_test_split_the_search_ran_on_also_gets_rows_over_the_held_out_tasks_alone():
    ft = FinalTest(SearchedSched(), TruthBench(), split="test", k=1, seed=0, method="m")
    assert ft.held_out_ids == ["test-1", "test-2"]
    full = ft.rows([("a", A), ("b", B)])
    assert [r.n_tasks for r in full] == [3, 3]
    assert [(r.name, r.n_tasks, r.pr_at_k, r.true_score) for r in ft.held_out] == [("a", 2, 1.0, None),
                                                                                     ("b", 2, 0.0, None)]
    assert ft.record()["held_out_task_ids"] == ["test-1", "test-2"]
    # every figure of a held-out row is over the held-out tasks' rollouts alone
    ft = FinalTest(TokenSched(), Bench(), split="test", k=1, seed=0, method="m")
    [full] = ft.rows([("a", A)])
    [held] = ft.held_out
    assert (full.mean_output_tokens, full.timeouts) == (20.0, 1) and (held.mean_output_tokens, held.timeouts) == (25.0, 0)


class TokenSched(SearchedSched):
    """test-i's rollout spends 10 * (i + 1) output tokens; test-0's times out."""

    def run(self, reqs, *, count_budget=True):
        out = super().run(reqs, count_budget=count_budget)
        for r in out:
            i = int(r.task_id.rsplit("-", 1)[1])
            r.output_tokens, r.timed_out = 10 * (i + 1), i == 0
        return out


def test_a_test_split_the_search_never_ran_is_held_out_as_a_whole():
    ft = FinalTest(Sched(), Bench(), split="test", k=1, seed=0, method="m")
    ft.rows([("a", A)])
    assert ft.held_out_ids == ft.task_ids and ft.held_out == []
    assert ft.record()["held_out_task_ids"] == ft.task_ids


def test_ground_truth_only_where_the_benchmark_has_it():
    assert true_quality(Bench(), A, "test") is None and true_score(Bench(), A, "test") is None
    assert true_score(TruthBench(), B, "test") == 0.25
    rows = FinalTest(Sched(), Bench(), split="test", k=1, seed=0, method="m").rows([("a", A)])
    assert rows[0].true_score is None


def test_recorder_writes_each_key_once_and_remembers_across_resume():
    store = MemoryRunStore(run_id="r")
    per_round = HarnessRecorder(store, key=lambda row: (row["harness_id"], row["round"]), resumed=False)
    assert per_round.record(A, round=0, origin="seed") is True
    assert per_round.record(A, round=0, origin="seed") is False
    assert per_round.record(A, round=1, origin="ssr_candidate") is True
    again = HarnessRecorder(store, key=lambda row: (row["harness_id"], row["round"]), resumed=True)
    assert again.record(A, round=1, origin="ssr_candidate") is False and (A.harness_id, 0) in again
    rows = store.read("harnesses").to_pylist()
    assert len(rows) == 2
    assert store.get_blob(rows[0]["source_ref"]) is not None
    once = HarnessRecorder(store)  # default key: the harness id
    assert once.record(B, origin="seed") is True and once.record(A, origin="seed") is False


def test_final_test_refuses_zero_rollouts_per_task():
    with pytest.raises(ValueError, match="k=0"):
        FinalTest(Sched(), Bench(), split="test", k=0, seed=0, method="m")


def test_a_one_task_split_is_scored_without_an_interval_not_a_crash(capsys):
    from milo_ray.search.scores import print_scores, summarize

    one = summarize("a", A, [RolloutResult(A.harness_id, "t0", i, s) for i, s in enumerate((1.0, 0.5))], ["t0"], 2)
    assert (one.pr_at_k, one.pr_ci, one.rr_ci) == (0.75, None, None)
    two = summarize("a", A, [RolloutResult(A.harness_id, t, 0, s) for t, s in (("t0", 1.0), ("t1", 0.0))],
                    ["t0", "t1"], 1)
    assert two.pr_ci is not None and two.pr_ci[0] <= 0.5 <= two.pr_ci[1]
    print_scores("test", [one, two])
    assert "1 task: no CI" in capsys.readouterr().out
