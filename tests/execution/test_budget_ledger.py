"""BudgetLedger: reservations are atomic, spend is exact under contention."""

from __future__ import annotations

import math
import threading

import pytest

from milo_ray.execution.budget import BudgetExceeded, BudgetLedger


def test_a_batch_that_does_not_fit_is_refused_whole_and_books_nothing():
    ledger = BudgetLedger(executions=5)
    ledger.reserve(3)
    with pytest.raises(BudgetExceeded, match="only 2 of 5"):
        ledger.reserve(3)
    assert ledger.reserved == 3 and ledger.executions_used == 0
    assert ledger.remaining_executions() == 2
    assert ledger.can_afford(2) and not ledger.can_afford(3)


def test_executions_are_exact_under_threaded_contention():
    ledger = BudgetLedger(executions=1000)
    refused = []

    def worker():
        while True:
            try:
                ledger.reserve(1)
            except BudgetExceeded:
                refused.append(1)
                return
            ledger.commit(tokens=3, cost_usd=0.5)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ledger.executions_used == 1000
    assert ledger.tokens_used == 3000 and ledger.cost_used_usd == pytest.approx(500.0)
    assert ledger.reserved == 0 and len(refused) == 16


def test_token_cap_stops_new_reservations_once_reached():
    ledger = BudgetLedger(tokens=100)
    ledger.reserve(2)
    ledger.commit(tokens=60)
    assert not ledger.spend_exhausted()
    ledger.commit(tokens=60)  # in-flight work may overshoot a soft cap...
    assert ledger.spend_exhausted()
    with pytest.raises(BudgetExceeded, match="token/cost budget spent"):
        ledger.reserve(1)  # ...but nothing new starts
    ledger.reserve(0)  # an all-cached batch still passes


def test_cost_cap_stops_new_reservations_once_reached():
    ledger = BudgetLedger(cost_usd=1.0)
    ledger.reserve(1)
    ledger.commit(cost_usd=1.0)
    assert not ledger.can_afford(1)


def test_released_reservations_return_to_the_pool():
    ledger = BudgetLedger(executions=2)
    ledger.reserve(2)
    ledger.release(1)
    assert ledger.remaining_executions() == 1
    with pytest.raises(RuntimeError):
        ledger.release(5)


def test_restore_counts_spend_from_before_a_resume():
    ledger = BudgetLedger(executions=10)
    ledger.restore(executions=7, tokens=70, cost_usd=0.7)
    assert ledger.remaining_executions() == 3 and ledger.tokens_used == 70
    assert BudgetLedger().remaining_executions() == math.inf


@pytest.mark.parametrize("kwargs", [{"executions": -1}, {"tokens": "many"}, {"cost_usd": float("nan")}])
def test_bad_caps_name_the_field(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        BudgetLedger(**kwargs)


def test_commit_without_reservation_is_an_error():
    with pytest.raises(RuntimeError, match="without a matching reserve"):
        BudgetLedger().commit()


def test_stored_rollouts_are_charged_on_resume_including_infra_failures():
    import pyarrow as pa

    rows = pa.table({
        "input_tokens": [10, 0, 5],
        "output_tokens": [1, 0, 2],
        "cost_usd": [0.1, 0.0, 0.2],
        "error_kind": [None, "infra", "harness"],
    })
    ledger = BudgetLedger(executions=5)
    ledger.restore_from_rollouts(rows)
    assert ledger.executions_used == 3 and ledger.tokens_used == 18
    assert ledger.cost_used_usd == pytest.approx(0.3) and ledger.remaining_executions() == 2
    ledger.restore_from_rollouts(rows.slice(0, 0))
    assert ledger.executions_used == 3


def test_rollouts_run_outside_the_budget_are_not_charged_on_resume():
    import pyarrow as pa

    rows = pa.table({
        "input_tokens": [10, 100, 5],
        "output_tokens": [1, 100, 2],
        "cost_usd": [0.1, 9.0, 0.2],
        "budgeted": [True, False, None],  # None: written before the column existed
    })
    ledger = BudgetLedger(executions=5)
    ledger.restore_from_rollouts(rows)
    assert ledger.executions_used == 2 and ledger.tokens_used == 18
    assert ledger.cost_used_usd == pytest.approx(0.3)
