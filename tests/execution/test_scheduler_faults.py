"""Faults the scheduler must survive without losing results, leaking budget or
poisoning keys: an executor that breaks its contract, a store that cannot write, a
poller that dies."""

from __future__ import annotations

import pytest

from milo_ray.core.rollouts import RolloutRequest
from milo_ray.core.tasks import Task
from milo_ray.execution.budget import BudgetLedger
from milo_ray.execution.scheduler import RolloutScheduler
from milo_ray.harness.model import Harness
from milo_ray.store import MemoryRunStore

EXECUTOR = {"_target_": "milo_ray.execution.fake.SleepExecutor", "seconds": 0.01}
H = Harness.from_source("def build_agent(model, backend):\n    return 'faults'\n")
TASKS = {t.task_id: t for t in [Task("ok", "search", "x", 30.0, 1000, {}),
                                Task("bad", "search", "x", 30.0, 1000, {"score": 1.5})]}


class FlakyStore(MemoryRunStore):
    """A memory store whose rollout writes fail while ``failing`` is set (a full disk)."""

    failing = False

    def append_rollouts(self, results):
        if self.failing:
            raise OSError("no space left on device")
        return super().append_rollouts(results)


@pytest.fixture()
def sched(ray_local):
    store = FlakyStore(run_id="faults")
    s = RolloutScheduler(EXECUTOR, TASKS, store, model_id="m", run_id="faults", budget=BudgetLedger(executions=20),
                         max_retries=1, retry_backoff_s=0.01, progress=False)
    s.add_harness(H)
    yield s, store
    s.close()


def _req(task_id: str, idx: int = 0) -> RolloutRequest:
    return RolloutRequest(H.harness_id, task_id, idx, seed=3)


def test_a_result_outside_the_executor_contract_is_retried_then_recorded_as_infra(sched):
    s, store = sched
    ok, bad = s.run([_req("ok"), _req("bad")])
    assert ok.score == 1.0 and ok.error_kind is None
    assert bad.error_kind == "infra" and "invalid result" in bad.error and "score=1.5" in bad.error
    rows = {r["task_id"]: r for r in store.read("rollouts").to_pylist()}
    assert rows["bad"]["error_kind"] == "infra" and rows["bad"]["attempts"] == 2
    assert s.budget.reserved == 0


def test_a_store_write_failure_fails_its_callers_and_nothing_else(sched):
    s, store = sched
    store.failing = True
    with pytest.raises(RuntimeError, match="no space left"):
        s.run([_req("ok", 1)])
    store.failing = False
    assert s.budget.reserved == 0 and s.budget.executions_used == 1  # it ran, so it was charged
    # Not poisoned: the key runs again and is stored this time.
    (again,) = s.run([_req("ok", 1)])
    assert again.score == 1.0 and store.read("rollouts").num_rows == 1


def test_a_dead_poller_releases_every_reservation_and_poisons_no_key(sched, monkeypatch):
    s, store = sched

    def boom(node, outcomes):
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(s, "_on_outcomes", boom)
    with pytest.raises(RuntimeError, match="scheduler bug"):
        s.run([_req("ok", 2), _req("ok", 3)])
    monkeypatch.undo()
    assert s.budget.reserved == 0 and not s._jobs
    assert all(not n.inflight for n in s._workers.values())
    results = s.run([_req("ok", 2), _req("ok", 3)])
    assert [r.score for r in results] == [1.0, 1.0]
