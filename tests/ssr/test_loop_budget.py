"""SSR's driver rules without Ray: an in-process scheduler stand-in runs the real
surrogate executor, the store is the real in-memory store, and a small rule-based
optimizer adds the mechanisms the records name."""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest

from milo_ray.agents.embedder import HashingEmbedder
from milo_ray.agents.judges.offline import OfflineJudge
from milo_ray.context import RunContext
from milo_ray.execution.budget import BudgetLedger
from milo_ray.ssr.loop import SSRMethod
from milo_ray.store.memory import MemoryRunStore
from ssr_inprocess import InProcessScheduler, RuleOptimizer
from ssr_slice import SliceBenchmark

N_TRAIN, N_VAL, N_TEST = 12, 6, 6
RACE_CFG = dict(b_v=[2, 2], b_s=2, b_f=2, rollouts=2)  # the racing parameters of every run here


@pytest.fixture(autouse=True)
def _in_process_candidates(monkeypatch):
    # The optimizer stand-in lives in this test module, which Ray workers cannot
    # import; these tests are about the driver's rules, so generate in threads.
    monkeypatch.setattr("milo_ray.ssr.candidates.use_ray", lambda: False)


@pytest.fixture(scope="module")
def bench():
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark

    return SliceBenchmark(SurrogateBenchmark(preset="surrogate_swepro", seed=0),
                          {"train": N_TRAIN, "val": N_VAL, "test": N_TEST})


def _run(tmp_path, bench, budget, *, inert=False, seed=3, tokens=None, **cfg):
    store = MemoryRunStore(run_id="t")
    sched = InProcessScheduler(bench, store, BudgetLedger(executions=budget, tokens=tokens))
    agents = {"judge": OfflineJudge(), "optimizer": RuleOptimizer(inert), "embedder": HashingEmbedder(64)}
    ctx = RunContext(run_id="t", run_dir=tmp_path, seed=seed, store=store, benchmark=bench, scheduler=sched,
                     model_id="offline", agents=agents)
    params = dict(initial="minimal", **RACE_CFG, test_rollouts=3, evaluate_initial=True)
    params.update(cfg)
    summary = SSRMethod(**params).run(ctx)
    return summary, store, sched


@pytest.mark.parametrize("budget", [11, 40, 130])
def test_total_search_executions_never_exceed_budget(tmp_path, bench, budget):
    summary, store, sched = _run(tmp_path, bench, budget)
    rows = store.read("rollouts").to_pylist()
    search = [r for r in rows if r["stage"] != "test"]
    assert sched.budget.executions_used == len(search) == summary["executions_used"] <= budget
    # the test evaluation ran outside the budget: 3 per test task per tested harness
    assert len(rows) - len(search) == 3 * N_TEST * (2 if summary["improved"] else 1)


def test_refresh_that_does_not_fit_returns_the_incumbent(tmp_path, bench):
    summary, store, _ = _run(tmp_path, bench, N_TRAIN - 1)
    assert summary["stop_reason"] == "budget" and not summary["improved"]
    assert summary["executions_used"] == 0 and summary["candidates_generated"] == 0
    assert [e["kind"] for e in store.read("events").to_pylist()].count("ssr.refresh_unaffordable") == 1


def _payloads(store, kind):
    return [json.loads(e["payload"]) for e in sorted(store.read("events").to_pylist(), key=lambda e: e["seq"])
            if e["kind"] == kind]


def _next_stage_cost(store, cfg):
    """R·(|A|+1)·|B_r| of the stage after the last one that ran in round 0, rebuilt from
    the events: A = the children racing (all of them before stage 1, the survivors of the
    last stage after it), B_r = min(quota, unused tasks) per class (validation, parent
    successes, parent failures), a short class not refilled from another."""
    refresh = _payloads(store, "ssr.refresh")[0]
    racing = _payloads(store, "ssr.candidates")[0]["racing"]
    stages = _payloads(store, "ssr.stage")
    results = _payloads(store, "ssr.stage_result")
    active = results[-1]["survivors"] if results else racing
    used = {k: sum(len(s["batch"][k]) for s in stages) for k in ("validation", "success", "failure")}
    available = {"validation": N_VAL, "success": refresh["resolved"], "failure": refresh["tasks"] - refresh["resolved"]}
    quota = {"validation": cfg["b_v"][len(stages)], "success": cfg["b_s"], "failure": cfg["b_f"]}
    batch = sum(min(quota[k], available[k] - used[k]) for k in quota)
    return cfg["rollouts"] * (len(active) + 1) * batch


@pytest.mark.parametrize("budget, stages_run", [
    # refresh 12, then 30 left: enough for the loop's cheapest first stage (one child +
    # parent: 2 x 2 x 6 = 24), so candidates are generated, but stage 1 with every racer
    # does not fit and is refused by the race
    (N_TRAIN + 30, 0),
    # refresh 12 + stage 1 (36) leaves 32; stage 2 with the survivors does not fit
    (N_TRAIN + 68, 1),
])
def test_stage_that_does_not_fit_is_not_started(tmp_path, bench, budget, stages_run):
    summary, store, sched = _run(tmp_path, bench, budget)
    stages, results = _payloads(store, "ssr.stage"), _payloads(store, "ssr.stage_result")
    assert summary["candidates_generated"] > 0, "precondition: the round got as far as racing"
    # Exactly the stages that fit were started, and each one ran to its result: the
    # refused stage was never announced, so no started stage had to be aborted by the ledger.
    assert [s["stage"] for s in stages] == [r["stage"] for r in results] == list(range(1, stages_run + 1))
    assert _payloads(store, "ssr.stage_aborted") == []
    # The refusal itself: what was left when the next stage came up is less than that
    # stage's R·(|A|+1)·|B_r| (DESIGN §4.3), and nothing of it ran.
    spent_before = N_TRAIN + sum(s["executions"] for s in stages)
    remaining = budget - spent_before
    assert 0 < remaining < _next_stage_cost(store, RACE_CFG)
    [selection] = _payloads(store, "ssr.selection")
    assert selection["stop_reason"] == "budget" and selection["completed_stages"] == stages_run
    assert selection["executions"] == spent_before - N_TRAIN
    if stages_run == 0:
        assert not selection["replaced"], "no completed stage: the parent is kept"
    assert summary["stop_reason"] == "budget"
    assert summary["executions_used"] == sched.budget.executions_used == spent_before <= budget
    race_stages = {r["stage"] for r in store.read("rollouts").to_pylist() if r["stage"].startswith("race")}
    assert race_stages == {f"race-{i}" for i in range(1, stages_run + 1)}


@pytest.mark.parametrize("patience", [1, 5])
def test_a_run_whose_last_race_the_budget_cut_short_stops_on_the_budget_as_the_race_says(tmp_path, bench,
                                                                                          patience):
    # Stage 1 does not fit (see above): the race stops on the budget and keeps the parent,
    # which with patience 1 also exhausts patience; the run says what its race says.
    summary, store, _ = _run(tmp_path, bench, N_TRAIN + 30, patience=patience)
    [selection] = _payloads(store, "ssr.selection")
    assert selection["stop_reason"] == "budget" and not selection["replaced"]
    assert summary["stop_reason"] == "budget"
    [stopped] = _payloads(store, "ssr.stop")
    assert stopped["reason"] == "budget"


def test_patience_stops_after_rounds_without_strict_improvement(tmp_path, bench):
    summary, store, _ = _run(tmp_path, bench, 10_000, inert=True, initial="stock", patience=2)
    assert summary["stop_reason"] == "patience"
    assert not any(h["replaced"] for h in summary["history"])
    assert summary["rounds"] == 2 and summary["executions_used"] == N_TRAIN  # nothing raced
    cands = [h for h in store.read("harnesses").to_pylist() if h["origin"] == "ssr_candidate"]
    assert cands and all("duplicate" in h["validation_error"] for h in cands)
    # the parent kept: records reused, one refresh only
    assert [e["kind"] for e in store.read("events").to_pylist()].count("ssr.refresh") == 1


def test_accepted_update_refreshes_all_training_tasks(tmp_path, bench):
    summary, store, _ = _run(tmp_path, bench, 10_000, patience=2, candidate_cap=12)
    rows = store.read("rollouts").to_pylist()
    refreshed = Counter(r["harness_id"] for r in rows if r["stage"] == "refresh")
    parents = {summary["initial_harness"]} | {h["selected"] for h in summary["history"] if h["replaced"]}
    assert set(refreshed) <= parents
    for h in refreshed:
        assert refreshed[h] == N_TRAIN
    assert summary["candidates_generated"] <= 12
    # every racing rollout is fresh for its round: racing never reuses a refresh trajectory
    race = [r for r in rows if r["stage"].startswith("race")]
    assert all(r["rollout_idx"] >= 1 for r in race)


def test_untested_initial_harness_is_not_reported_with_the_final_scores(tmp_path, bench):
    summary, store, _ = _run(tmp_path, bench, 10_000, seed=0, patience=2, candidate_cap=12, evaluate_initial=False)
    assert summary["improved"], "seed 0 on this slice accepts an update (precondition of the check below)"
    tested = {r["harness_id"] for r in store.read("rollouts").to_pylist() if r["stage"] == "test"}
    assert tested == {summary["final_harness"]}
    assert "test_initial" not in summary
    assert [r["harness_id"] for r in summary["final_test"]] == [summary["final_harness"]]


class TokensRunOutAtTheSecondRefresh(InProcessScheduler):
    """Other spend (say, a concurrent job's) uses up the token cap just as the loop asks
    for its second refresh; the ledger then refuses that batch."""

    def run(self, reqs, *, count_budget=True):
        if count_budget and any(r.stage == "refresh" and r.round >= 1 for r in reqs):
            self.budget.restore(executions=0, tokens=self.budget.tokens, cost_usd=0.0)
        return super().run(reqs, count_budget=count_budget)


def test_token_cap_spent_before_a_refresh_stops_the_run_with_the_incumbent(tmp_path, bench, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "InProcessScheduler", TokensRunOutAtTheSecondRefresh)
    # seed 0 accepts an update in round 0, so round 1 starts with a refresh of the new parent
    summary, store, sched = _run(tmp_path, bench, 10_000, seed=0, patience=2, candidate_cap=12, tokens=10**12)
    assert summary["stop_reason"] == "budget" and summary["improved"]
    kinds = [e["kind"] for e in store.read("events").to_pylist()]
    assert kinds.count("ssr.refresh_aborted") == 1 and kinds.count("ssr.refresh") == 1
    search = [r for r in store.read("rollouts").to_pylist() if r["stage"] != "test"]
    assert all(r["round"] == 0 for r in search), "nothing of round 1 ran"
    assert summary["executions_used"] == len(search) == sched.budget.executions_used
    assert summary["final_test"], "the incumbent is still evaluated on the test split"
