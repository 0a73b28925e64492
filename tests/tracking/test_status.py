"""RunStatus from events written to a store: a resumed run's status catches up without
re-publishing closed rounds; spend skips solver calls (inside their rollouts); ETA is
the nearest of time limit, execution budget and MILO's round limit."""

from __future__ import annotations

from milo_ray.execution.budget import BudgetLedger
from milo_ray.milo.events import HeldOut, Init, NodeRecorded, Progress, Reassign
from milo_ray.milo.lineage import LineageNode
from milo_ray.store.memory import MemoryRunStore
from milo_ray.tracking.status import RunStatus


def _emit(store, ev, **cols) -> None:
    store.event(ev.kind, ev.to_payload(), **cols)


def _node(node_id: str, island: int, rnd: int, acc: float, admitted: bool = True) -> NodeRecorded:
    return NodeRecorded(LineageNode(node_id, f"h{node_id}", island, rnd, "seed" if rnd == 0 else "mutation",
                                    accuracy=acc, admitted=admitted, fitness=[acc, 0.0]))


def _milo_round_one(store) -> None:
    _emit(store, Init(["t1"], ["v1"], ["t1"], [0, 1], {0: "bold", 1: "conservative"}))
    _emit(store, _node("s0", 0, 0, 0.5))
    _emit(store, _node("s1", 1, 0, 0.6))
    _emit(store, HeldOut(0, "s0", 0.4))
    _emit(store, HeldOut(1, "s1", 0.7))
    _emit(store, _node("0-1", 0, 1, 0.9))
    _emit(store, _node("1-1", 1, 1, 0.95, admitted=False))  # rejected: not the island's best
    _emit(store, HeldOut(0, "0-1", 0.8))
    _emit(store, Progress(0, 1, 0), island=0, round=1)
    _emit(store, Progress(1, 1, 1), island=1, round=1)


def test_a_resumed_run_catches_up_silently_and_publishes_only_new_rounds():
    store = MemoryRunStore()
    _milo_round_one(store)
    status, seen = RunStatus(max_rounds=3), []
    status.subscribe(seen.append)
    status.replay(store)
    store.add_listener(status.observe)
    assert seen == []
    assert status.lines()[:2] == [
        "island 0  mutator bold  round 1  best search 0.900  held-out 0.800  stall 0",
        "island 1  mutator conservative  round 1  best search 0.600  held-out 0.700  stall 1",
    ]
    _emit(store, Reassign(1, "bold", "d1"))
    _emit(store, Progress(1, 2, 2), island=1, round=2)
    assert status.lines()[1] == "island 1  mutator bold  round 2  best search 0.600  held-out 0.700  stall 2"
    island, run = seen
    assert (island.step, island.metrics) == (2, {"island1/stall": 2.0, "island1/round": 2.0,
                                                  "island1/best_search_accuracy": 0.6,
                                                  "island1/heldout_accuracy": 0.7})
    # Run-wide numbers are stepped by rounds closed in the whole run, earlier sessions counted.
    assert run.step == 3 and run.metrics["best_heldout_accuracy"] == 0.8 and run.metrics["best_search_accuracy"] == 0.9
    assert status.lines()[-1].startswith("run  best held-out 0.800 (island 0)  search 0.900 (island 0)  spend 0 tokens")


def test_spend_counts_rollouts_and_agent_calls_but_not_solver_calls_twice():
    status = RunStatus()
    status.observe("rollouts", [{"input_tokens": 100, "output_tokens": 20, "cost_usd": 0.5},
                                {"input_tokens": 1, "output_tokens": 2, "cost_usd": None}])
    status.observe("agent_calls", [{"role": "mutator", "input_tokens": 10, "output_tokens": 5, "cost_usd": 0.25},
                                   {"role": "solver", "input_tokens": 100, "output_tokens": 20, "cost_usd": 0.5}])
    s = status.spend()
    assert (s.tokens, s.cost_usd, s.unpriced) == (138, 0.75, 1)
    assert "spend 138 tokens $0.7500 (+1 unpriced)" in status.lines()[-1]


def test_eta_is_the_nearest_of_time_limit_budget_and_round_limit():
    now = [100.0]
    ledger = BudgetLedger(executions=100)
    status = RunStatus(budget=ledger, deadline=1000.0, max_rounds=4, clock=lambda: now[0])
    assert status.eta_s() == 900.0  # nothing done yet: only the time limit is known
    ledger.reserve(25)
    for _ in range(25):
        ledger.commit()
    now[0] = 150.0  # 25 executions in 50 s: 75 left take 150 s
    assert status.eta_s() == 150.0
    store = MemoryRunStore()
    store.add_listener(status.observe)
    _milo_round_one(store)
    _emit(store, Progress(0, 2, 0), island=0, round=2)
    _emit(store, Progress(1, 2, 0), island=1, round=2)  # 2 of 4 rounds in 50 s: 50 s more
    assert status.eta_s() == 50.0
    assert status.lines()[-1].endswith("executions 25/100  eta 00:50")


def test_a_failing_store_listener_never_fails_the_write():
    store = MemoryRunStore()
    seen = []

    def broken(table, rows):
        raise RuntimeError("listener bug")

    store.add_listener(broken)
    store.add_listener(lambda table, rows: seen.append((table, [r["seq"] for r in rows])))
    store.event("x.one", {"a": 1})
    store.append("events", [{"kind": "x.two"}, {"kind": "x.three"}])
    assert [r["kind"] for r in store.read("events").to_pylist()] == ["x.one", "x.two", "x.three"]
    assert seen == [("events", [0]), ("events", [1, 2])]
