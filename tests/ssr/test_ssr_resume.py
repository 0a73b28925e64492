"""Kill an SSR run (at exact points, and once by SIGKILL at a seeded moment), resume it
on the same run directory, and hold the result to one uninterrupted run.

SSR resume fast-forwards through the run's recorded decisions (``milo_ray/ssr/loop.py``):
judged records, evidence orders and optimizer answers are read back from the events,
finished rollouts come back from the scheduler's cache and ``StoreWriter`` skips rows
already stored. So a resumed run must store every event, experience record, harness
row, agent call and rollout exactly once, end exactly where the uninterrupted run
ends, and never ask the judge or the optimizer again for an answer it recorded.

Each run is its own process (``ssr_resume_runner.py``: own Ray instance, the real
scheduler, a Parquet store that writes every row at once). Starting Ray costs more
than the search itself, so the scenarios run side by side, a few processes at a time,
each resume as soon as its victim is dead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from ssr_resume_runner import CALLS, DIE_EXIT_CODE, RAY_START_FAILED, SIZES, trajectory_digest

# The module fixture runs nine search processes, each starting Ray (minutes on two busy cores).
pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("ssr_resume_runner.py")
TABLES = ("events", "experience", "harnesses", "rollouts", "agent_calls")

# Each kill point leaves a different partial state for the resume to complete.
KILL_POINTS = {
    # The optimizer answered, its answers (ssr.candidate) and the children's harness rows
    # are stored; the round's ssr.candidates event is not: the children are read back.
    "before_candidates_r0": "ssr.candidates:round=0",
    # Stage 2's rollouts are stored, its result is not: resume mid-race from the cache.
    "before_stage2_result_r0": "ssr.stage_result:round=0,stage=2",
    # The new parent's refresh rollouts, judged records and experience rows are stored,
    # its ssr.refresh event (the evidence order) is not: nothing is judged again.
    "before_refresh_r1": "ssr.refresh:round=1",
    # The same point, then the run directory is moved and its workspace/ deleted: the
    # resume has only the store's tables and blobs, as when resumed from a bucket.
    "moved_before_refresh_r1": "ssr.refresh:round=1",
}
MOVED = {"moved_before_refresh_r1"}
SIGKILL = "sigkill_after_rollouts"
FINISHED = "finished"  # resuming a run that had finished (run by the reference's process)
SCENARIOS = [*KILL_POINTS, SIGKILL, FINISHED]

# SIGKILL once this many rollouts are stored: a seeded draw between the first racing
# rollout (the round-0 refresh is done, judged and handed to the optimizer) and well
# before the end of the search.
KILL_AFTER_ROLLOUTS = int(np.random.default_rng(2026).integers(SIZES["train"] + 1, 70))

# Only so that a hung process fails the test instead of stalling CI; below
# pytest-timeout's 600 s so that the fixture still ends every process it started.
TIMEOUT_S = 540
# Runner processes at once: each starts its own Ray instance, and on two busy cores
# many simultaneous starts time out.
MAX_PARALLEL = 4


@dataclass
class Scenario:
    name: str
    run_dir: Path
    before: dict[str, list[dict]]  # the store right after the kill (the reference's, for FINISHED)
    after: dict[str, list[dict]]  # the store after the resume
    summary: dict  # what the resumed run returned
    calls: list[dict]  # judge/optimizer calls of both sessions, as logged by the runner


@dataclass
class Reference:
    tables: dict[str, list[dict]]
    summary: dict


# ---------------------------------------------------------------------------- running
def _start(run_dir: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(RUNNER.parent), os.environ.get("PYTHONPATH", "")])}
    # stderr to a file, not a pipe: a pipe nobody reads while the other runs go on
    # could fill up and block its writer.
    with open(out.with_suffix(".log"), "ab") as log:
        return subprocess.Popen([sys.executable, str(RUNNER), str(run_dir), str(out), *extra], env=env,
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)


def _end_group(p: subprocess.Popen) -> None:
    """End whatever is left of a run's process group (its private Ray instance: the
    runner skips Ray's shutdown, a killed runner never gets to it)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _finish(p: subprocess.Popen, out: Path, expected: int, what: str) -> None:
    rc = p.wait()
    _end_group(p)
    log = out.with_suffix(".log")
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    assert rc == expected, f"{what}: exit code {rc}, expected {expected}\n{tail}"


class _RolloutCounter:
    """Rollout rows stored so far in a live run (part files are renamed into place
    whole and never change, so each is read once)."""

    def __init__(self, run_dir: Path) -> None:
        self.dir, self.rows = run_dir / "rollouts", {}

    def __call__(self) -> int:
        import pyarrow.parquet as pq

        for part in self.dir.glob("part-*.parquet") if self.dir.is_dir() else ():
            if part.name not in self.rows:
                try:
                    self.rows[part.name] = pq.read_metadata(part).num_rows
                except OSError:
                    pass
        return sum(self.rows.values())


def _read(run_dir: Path) -> dict[str, list[dict]]:
    from milo_ray.store.parquet import open_run

    store = open_run(run_dir)
    return {t: store.read(t).to_pylist() for t in TABLES}


def _calls(run_dir: Path) -> list[dict]:
    path = run_dir / CALLS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass(eq=False)
class _Job:
    """One runner process to run (again, if Ray failed to start), and what follows it."""

    name: str
    run_dir: Path
    out: Path
    args: tuple[str, ...]
    expected: int  # exit code
    then: Callable[[], None] = lambda: None
    proc: subprocess.Popen | None = None
    starts: int = 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Reference, dict[str, Scenario]]:
    """Every scenario, MAX_PARALLEL processes at a time; each resume is queued as soon
    as its victim is dead."""
    root = tmp_path_factory.mktemp("ssr-resume")
    dirs = {name: root / name for name in SCENARIOS}
    for d in dirs.values():
        d.mkdir()
    run_dirs = {name: d / "run" for name, d in dirs.items()}
    before: dict[str, dict] = {}
    found: dict[str, Reference] = {}
    queue: deque[_Job] = deque()

    def resume(name: str) -> None:
        queue.append(_Job(f"{name}: resume", run_dirs[name], dirs[name] / "resumed.json", ("--resume",), 0))

    def killed(name: str) -> Callable[[], None]:
        def then() -> None:
            before[name] = _read(dirs[name] / "run")
            if name in MOVED:
                run_dirs[name] = dirs[name] / "moved" / "run"
                run_dirs[name].parent.mkdir()
                shutil.move(str(dirs[name] / "run"), str(run_dirs[name]))
                shutil.rmtree(run_dirs[name] / "workspace")
            resume(name)

        return then

    def reference_done() -> None:
        found["ref"] = Reference(_read(root / "reference"), json.loads((root / "reference.json").read_text()))
        before[FINISHED] = found["ref"].tables

    sig = _Job(f"{SIGKILL}: victim (exit code 0: it ended before it could be killed)", dirs[SIGKILL] / "run",
               dirs[SIGKILL] / "victim.json", (), -signal.SIGKILL, killed(SIGKILL))
    # The reference process then resumes a copy of its finished run (FINISHED).
    queue.extend([_Job("reference run", root / "reference", root / "reference.json",
                       ("--then-resume-copy", str(dirs[FINISHED] / "run"), str(dirs[FINISHED] / "resumed.json")),
                       0, reference_done), sig])
    queue.extend(_Job(f"{name}: victim (the kill point was never reached)", dirs[name] / "run",
                      dirs[name] / "victim.json", ("--die-before", spec), DIE_EXIT_CODE, killed(name))
                 for name, spec in KILL_POINTS.items())
    stored, running, sig_killed = _RolloutCounter(sig.run_dir), [], False
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while queue or running:
            assert time.monotonic() < deadline, "the runs did not finish"
            while queue and len(running) < MAX_PARALLEL:
                job = queue.popleft()
                job.proc, job.starts = _start(job.run_dir, job.out, *job.args), job.starts + 1
                running.append(job)
            if sig in running and not sig_killed and stored() >= KILL_AFTER_ROLLOUTS:
                os.killpg(sig.proc.pid, signal.SIGKILL)  # the driver and its Ray instance, mid-run
                sig_killed = True
            for job in [j for j in running if j.proc.poll() is not None]:
                running.remove(job)
                if job.proc.returncode == RAY_START_FAILED and job.starts < 3:
                    _end_group(job.proc)
                    queue.appendleft(job)  # infrastructure, not the run: start it again
                    continue
                _finish(job.proc, job.out, job.expected, job.name)
                job.then()
            time.sleep(0.05)
    finally:
        for job in running:  # on a failure, leave no run behind
            _end_group(job.proc)
            job.proc.wait()
    scenarios = {name: Scenario(name, run_dirs[name], before[name], _read(run_dirs[name]),
                                json.loads((dirs[name] / "resumed.json").read_text()), _calls(run_dirs[name]))
                 for name in SCENARIOS}
    return found["ref"], scenarios


@pytest.fixture
def reference(runs) -> Reference:
    return runs[0]


@pytest.fixture(params=SCENARIOS)
def scenario(request, runs) -> Scenario:
    return runs[1][request.param]


@pytest.fixture(params=[*KILL_POINTS, SIGKILL])
def victim(request, runs) -> Scenario:
    return runs[1][request.param]


def _duplicates(rows: list[dict], *cols: str) -> dict:
    counts = Counter(tuple(r[c] for c in cols) for r in rows)
    return {k: n for k, n in counts.items() if n > 1}


# ---------------------------------------------------------------------------- the kills
def test_every_victim_died_mid_run_with_work_left_to_resume(victim, reference):
    """Guards the scenarios themselves: a kill after the end, or before anything was
    stored, or after the event it should precede, would test less than it claims."""
    before, ref = victim.before, reference.tables
    assert 0 < len(before["rollouts"]) < len(ref["rollouts"])
    assert len(before["events"]) < len(ref["events"])
    if victim.name == SIGKILL:
        assert len(before["rollouts"]) >= KILL_AFTER_ROLLOUTS
    else:
        kind, _, conds = KILL_POINTS[victim.name].partition(":")
        want = dict(c.split("=", 1) for c in conds.split(","))

        def hits(events):
            return [e for e in events if e["kind"] == kind
                    and all(str({**e, **json.loads(e["payload"])}.get(f)) == v for f, v in want.items())]

        assert len(hits(ref["events"])) == 1 and not hits(before["events"])


def test_every_victim_paid_for_judge_and_optimizer_calls_before_dying(scenario):
    """The recording reaches the log from the judge's threads and the optimizer's Ray
    workers, and every kill comes after paid calls: the precondition of the no-repeat test
    below (otherwise its assertion would hold for want of calls)."""
    first = Counter(c["agent"] for c in scenario.calls if c["session"] == "first")
    assert first["judge"] > 0 and first["optimizer"] > 0


# ---------------------------------------------------------------------------- the store
def test_resume_stores_no_event_twice(scenario):
    assert not _duplicates(scenario.after["events"], "kind", "round", "harness_id", "payload")


def test_resume_stores_no_experience_record_twice(scenario):
    assert not _duplicates(scenario.after["experience"], "harness_id", "round", "task_id")


def test_resume_stores_no_harness_row_twice(scenario):
    assert not _duplicates(scenario.after["harnesses"], "harness_id", "round")


def test_resume_executes_no_rollout_twice(scenario):
    assert not _duplicates(scenario.after["rollouts"], "cache_key")


def test_resumed_store_holds_exactly_the_uninterrupted_history(scenario, reference):
    """Nothing missing, nothing extra: the events (apart from the one resume marker),
    experience records, harness rows and rollout keys of the uninterrupted run."""
    after, ref = scenario.after, reference.tables

    def events(rows):
        return Counter((e["kind"], e["round"], e["harness_id"], e["payload"]) for e in rows
                       if e["kind"] != "ssr.resume")

    assert [e["kind"] for e in after["events"]].count("ssr.resume") == 1
    assert events(after["events"]) == events(ref["events"])

    def experience(rows):
        return Counter((r["harness_id"], r["round"], r["task_id"], r["w"], r["a"], r["u"], r["judge_error"])
                       for r in rows)

    assert experience(after["experience"]) == experience(ref["experience"])

    def harnesses(rows):  # created_at and the generation time in `extra` are wall-clock
        return Counter((r["harness_id"], r["round"], r["origin"], r["parent_id"], r["evidence_scale"],
                        r["validation_error"], r["source_ref"]) for r in rows)

    assert harnesses(after["harnesses"]) == harnesses(ref["harnesses"])

    def rollouts(rows):
        return Counter((r["cache_key"], r["harness_id"], r["task_id"], r["rollout_idx"], r["score"]) for r in rows)

    assert rollouts(after["rollouts"]) == rollouts(ref["rollouts"])


# ---------------------------------------------------------------------------- the outcome
def test_resumed_run_reaches_the_uninterrupted_final_state(scenario, reference):
    """Same incumbent, same selections round by round, same stop, same budget spent,
    same rollouts stored and the same test-split results."""
    got, want = scenario.summary, reference.summary
    for key in ("final_harness", "initial_harness", "history", "rounds", "stop_reason", "executions_used",
                "candidates_generated", "final_test", "test_final", "test_initial", "final_true_quality"):
        assert got[key] == want[key], key
    keys = [{r["cache_key"] for r in tables["rollouts"]} for tables in (scenario.after, reference.tables)]
    assert keys[0] == keys[1]


# ---------------------------------------------------------------------------- agent calls
def _recorded_steps(scenario: Scenario) -> set[tuple[str, str]]:
    """The judge and optimizer calls whose answers the store held when the victim died,
    in the runner's call terms: (judge, task + trajectory), (optimizer, call)."""
    from milo_ray.store.parquet import open_run

    store, steps = open_run(scenario.run_dir), set()
    for e in scenario.before["events"]:
        p = json.loads(e["payload"])
        if e["kind"] == "ssr.judged":
            trace = store.get_blob(p["trace_ref"]) if p["trace_ref"] else {}
            steps.add(("judge", f"{p['task_id']}/{trajectory_digest((trace or {}).get('trajectory', {}))}"))
        elif e["kind"] == "ssr.candidate":
            steps.add(("optimizer", f"{e['harness_id']}/r{e['round']}/c{p['index']}/s{p['seed']}"))
    return steps


def _step(call: dict) -> tuple[str, str]:
    return (call["agent"], f"{call['task_id']}/{call['trajectory']}" if call["agent"] == "judge" else call["call"])


def test_resume_repeats_no_judge_or_optimizer_call_made_before_the_kill(scenario):
    """No recorded answer is asked for again (DESIGN §5.11). Only a SIGKILL can land
    while calls are in flight; the kills at exact points fall between paid steps, so
    there nothing at all may be asked again."""
    first = [c for c in scenario.calls if c["session"] == "first"]
    made = {(c["agent"], c["call"]) for c in first}
    repeated = [c for c in scenario.calls if c["session"] == "resume" and (c["agent"], c["call"]) in made]
    recorded = _recorded_steps(scenario)
    assert not [c for c in repeated if _step(c) in recorded], "a recorded answer was asked for again"
    if scenario.name != SIGKILL:
        assert not repeated, f"{len(repeated)} of {len(made)} calls made before the kill were made again"


def test_resumed_agent_calls_equal_the_uninterrupted_runs(scenario, reference):
    """The ledger: the same judge, optimizer and embedder calls, each recorded once."""
    got, want = scenario.after["agent_calls"], reference.tables["agent_calls"]
    assert not _duplicates(got, "call_id")
    assert Counter(r["role"] for r in got) == Counter(r["role"] for r in want)
    assert {r["call_id"] for r in got} == {r["call_id"] for r in want}
    assert {r["role"] for r in want} == {"judge", "optimizer", "embedder"}
    # Calls only: the offline optimizer's token estimate counts its prompt, which names
    # paths inside the run directory, and every scenario has its own.
    for role in ("judge", "optimizer", "embedder"):
        assert scenario.summary["spend_by_role"][role]["calls"] == reference.summary["spend_by_role"][role]["calls"]
