"""The eval method's summary event is stored once per run, even when a session was killed
after storing it and before the run was marked finished (found by scripts/kill_trials.py)."""

from types import SimpleNamespace

from milo_ray.evaluation import EVAL_SUMMARY, _record_once
from milo_ray.store.memory import MemoryRunStore


def _kinds(store):
    return [e["kind"] for e in store.read("events").to_pylist()]


def test_a_resumed_run_does_not_store_the_same_summary_again():
    store = MemoryRunStore(run_id="r")
    payload = {"split": "test", "k": 2, "rows": [{"name": "minimal", "pass_at_k": 0.875}]}
    _record_once(SimpleNamespace(store=store, resumed=False), EVAL_SUMMARY, payload)
    _record_once(SimpleNamespace(store=store, resumed=True), EVAL_SUMMARY, dict(payload))
    assert _kinds(store) == [EVAL_SUMMARY]


def test_a_resumed_run_with_a_different_summary_stores_it():
    # A resume that completed more waves (say the first session hit its time limit) reports anew.
    store = MemoryRunStore(run_id="r")
    _record_once(SimpleNamespace(store=store, resumed=False), EVAL_SUMMARY, {"k": 1})
    _record_once(SimpleNamespace(store=store, resumed=True), EVAL_SUMMARY, {"k": 2})
    assert _kinds(store) == [EVAL_SUMMARY, EVAL_SUMMARY]
