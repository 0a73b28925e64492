"""A resumed run's time limit counts what its earlier sessions already ran."""

from __future__ import annotations

import pytest

from milo_ray.manifest import elapsed_before
from milo_ray.store.memory import MemoryRunStore


def test_sessions_that_stopped_count_until_they_finished():
    history = [{"started_at": 100.0, "finished_at": 160.0}, {"started_at": 500.0, "finished_at": 530.0},
               {"started_at": 900.0}]
    assert elapsed_before(history, []) == pytest.approx(90.0)


def test_a_killed_session_counts_until_its_last_stored_activity():
    history = [{"started_at": 100.0}, {"started_at": 500.0}]
    # activity of the killed session, and some of the current one (which is not counted)
    assert elapsed_before(history, [120.0, 170.0, 140.0, 505.0, None]) == pytest.approx(70.0)


def test_a_killed_session_that_stored_nothing_counts_nothing_and_a_fresh_run_counts_nothing():
    assert elapsed_before([{"started_at": 100.0}, {"started_at": 500.0}], [600.0]) == 0.0
    assert elapsed_before([{"started_at": 100.0}], [120.0]) == 0.0


def test_activity_is_read_from_events_and_rollouts_of_a_store():
    from milo_ray.run import _activity_times

    store = MemoryRunStore(run_id="t")
    assert _activity_times(store) == []
    store.event("x", {}, time=123.0)
    assert 123.0 in _activity_times(store)


def test_the_deadline_counts_the_earlier_sessions():
    from milo_ray.manifest import deadline_for

    assert deadline_for(None, 50.0) is None
    assert deadline_for(600, 0.0, now=1000.0) == 1600.0
    assert deadline_for(600, 590.0, now=1000.0) == 1010.0
    assert deadline_for(600, 601.0, now=1000.0) < 1000.0  # already out of time on resume


def test_milo_stops_at_the_runs_deadline(tmp_path, ray_local):
    import time

    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.context import RunContext
    from milo_ray.milo.config import MiloConfig
    from milo_ray.milo.loop import MiloRun

    bench = SurrogateBenchmark(preset="surrogate_tb21", seed=0)
    store = MemoryRunStore(run_id="t")

    def run(seconds_left):
        ctx = RunContext(run_id="t", run_dir=tmp_path, seed=0, store=store, benchmark=bench, scheduler=None,
                         model_id="m", resumed=True, deadline=time.monotonic() + seconds_left,
                         agents={"mutators": [{"_target_": "milo_ray.agents.mutators.offline.OfflineMutator"}],
                                            "orchestrator": {"_target_": "x"}})
        return MiloRun(MiloConfig(), ctx)

    assert not run(60.0).out_of_time()
    assert run(-1.0).out_of_time()
