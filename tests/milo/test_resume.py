"""Kill MILO runs mid-run, resume them from the store, and check that the resumed run
redid nothing the store already held (DESIGN §5.11: state is a projection of events;
resume never repeats a paid agent call) and finished the run.

A deterministic restart from scratch reaches the same final state as a resume (the
rollout cache makes re-evaluation free), so comparing final states alone cannot tell
a resume from a restart. These tests therefore read the store (the ``events``,
``harnesses`` and ``rollouts`` tables) and the runner's record of agent calls: one
initialization, one row per node, per held-out score, per move, per closed round; no
mutation, graft or orchestrator decision whose result was stored before a kill is
called again after it. Lock-step runs must also reach the uninterrupted run's exact
lineage, assignment and stall counters; free-running runs (not timing-deterministic)
must run every island's rounds to the end.

Each scenario is one run directory driven through several sessions (a kill, a resume
that is killed again, ... and a final resume), so every kill point costs one short
session rather than a whole run; every session joins one Ray instance the module keeps.
"""

from __future__ import annotations

import pytest

import milo_resume_checks as checks
from milo_resume_checks import KilledRun, RayInstance, Sigkill, drive

pytestmark = pytest.mark.slow  # the module's sessions take ~3 minutes together

# One scenario per mode: a run directory driven through a session per kill step, then
# a final resume. Kill points ("before"/"after" an event) each leave a different step
# half done; Sigkill steps (seeded) kill at an arbitrary moment a few stored events
# into the session. A lock-step run stores 58 events; a free-running one ~40 to ~55,
# depending on the interleaving (Sigkill ranges leave room for the shortest).
SCENARIOS = {
    "lockstep": [  # points in the order the run reaches them
        "after milo.init",  # initialization recorded, nothing of it applied or seeded
        "before milo.node:island=1,origin=seed",  # island 0 seeded, island 1 not yet
        "after milo.node:node_id=0-1",  # a round's (rejected) child recorded, not applied, no harnesses row yet
        "before milo.heldout:node_id=d0-1-g0",  # a graft's child recorded, its held-out score and the move not
        "before milo.refit:island=1",  # a curriculum change recorded, island 0 re-fitted, island 1 not yet
        Sigkill(2, 8),  # somewhere in the next intervention or the second step (the next point is ~16 events on)
        "before milo.progress:island=0,rounds_done=2",  # an admitted child and its held-out score in, round open
        "before milo.move_done:decision_id=d1-2,kind=speciate",  # a new island created, the move not marked done
        Sigkill(2, 10),  # somewhere in the new island's rounds
    ],
    # Free-running islands interleave differently from run to run: only points every
    # run reaches, whatever the interleaving, then SIGKILLs.
    "free": [
        "before milo.node:island=1,origin=seed",  # initialization half done (the same in both modes)
        "after milo.node:node_id=0-1",  # a child recorded, not applied, its round not closed
        "before milo.move_done:index=0",  # an orchestrator move carried out, not marked done
        Sigkill(2, 6),
        Sigkill(2, 6),
    ],
}


@pytest.fixture(scope="module")
def ray_instance(tmp_path_factory):
    ray = RayInstance(tmp_path_factory.mktemp("ray") / "ray.err")
    yield ray
    ray.close()


@pytest.fixture(scope="module")
def lockstep_reference(tmp_path_factory, ray_instance) -> KilledRun:
    """One uninterrupted lock-step run: the state every resumed lock-step run must reach."""
    run = KilledRun(tmp_path_factory.mktemp("reference") / "run", free=False, ray=ray_instance)
    run.complete()
    return run


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def killed_run(request, tmp_path_factory, ray_instance) -> KilledRun:
    mode = request.param
    run = KilledRun(tmp_path_factory.mktemp(mode) / "run", free=mode == "free", ray=ray_instance)
    return drive(run, SCENARIOS[mode], seed=sorted(SCENARIOS).index(mode))


def test_checks_hold_for_an_uninterrupted_run(lockstep_reference):
    # The invariants are properties of any run, not artefacts of a kill: an
    # uninterrupted run satisfies each of them (so a failure below is the resume's).
    run = lockstep_reference
    for check in (checks.assert_initialized_once, checks.assert_each_node_recorded_once,
                  checks.assert_no_step_recorded_twice, checks.assert_each_round_closed_once,
                  checks.assert_harness_rows_match_events, checks.assert_no_rollout_run_twice):
        check(run.run_dir)
    checks.assert_no_recorded_work_redone(run)
    checks.assert_run_finished(run)
    # The agent-call checks mean something only if the runner's logging agents ran.
    agents = {c["agent"] for c in checks.agent_calls(run.run_dir)}
    assert agents == {"mutator", "orchestrator.decide", "orchestrator.graft"}, agents


def test_a_resumed_run_is_initialized_once(killed_run):
    checks.assert_initialized_once(killed_run.run_dir)


def test_a_resumed_run_records_each_node_once(killed_run):
    checks.assert_each_node_recorded_once(killed_run.run_dir)


def test_a_resumed_run_records_each_step_once(killed_run):
    # held-out scores, decisions, moves, new islands, curriculum changes, re-fits, steps
    checks.assert_no_step_recorded_twice(killed_run.run_dir)


def test_a_resumed_run_closes_each_island_round_once(killed_run):
    checks.assert_each_round_closed_once(killed_run.run_dir)


def test_a_resumed_run_never_redoes_an_agent_call_whose_result_was_stored(killed_run):
    checks.assert_no_recorded_work_redone(killed_run)


def test_a_resumed_run_never_reruns_a_stored_rollout(killed_run):
    checks.assert_no_rollout_run_twice(killed_run.run_dir)


def test_a_resumed_run_keeps_one_harness_row_per_node_and_unplaced_seed(killed_run):
    # The harnesses table is written beside the event log, not replayed from it: a kill
    # right after milo.init (the island-less seeds' rows not yet written) or right after
    # a milo.node event (its row not yet written) leaves rows the resumed run must add,
    # once, and a kill before a node's event must not leave a stray row.
    checks.assert_harness_rows_match_events(killed_run.run_dir)


def test_a_resumed_run_finishes_every_round_and_intervention(killed_run):
    checks.assert_run_finished(killed_run)


def test_a_resumed_lockstep_run_reaches_the_uninterrupted_state(killed_run, lockstep_reference):
    if killed_run.free:
        pytest.skip("free-running islands are not timing-deterministic: no exact state to compare")
    assert killed_run.failure is None, killed_run.failure
    checks.assert_same_state(lockstep_reference.state, killed_run.state)
