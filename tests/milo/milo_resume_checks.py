"""Kill-and-resume of MILO runs for the tests: sessions of ``milo_resume_runner.py``
killed at exact points (``--die-before``/``--die-after`` an event) or by SIGKILL at
seeded random moments, and the invariants a resumed run's store and agent-call record
must satisfy.

The checks read only what a run leaves on disk: the ``events`` and ``harnesses``
(and ``rollouts``) tables of the run directory, read with ``pyarrow.dataset`` as
any user would, and the runner's ``agent_call_log.jsonl``. They hold for lock-step
and free-running runs alike; only the lock-step run is also compared with an
uninterrupted run (free-running runs are not timing-deterministic).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milo_resume_runner import CALL_LOG, CONFIG, DIE_EXIT_CODE

RUNNER = Path(__file__).with_name("milo_resume_runner.py")

SESSION_TIMEOUT_S = 420


# ---------------------------------------------------------------------- processes
class RayInstance:
    """One private Ray instance that every session of a test module joins: starting Ray
    costs seconds per process, and these tests start many short sessions. Each session
    is its own Ray job, so a killed session's actors and tasks die with it."""

    def __init__(self, log: Path) -> None:
        self._err = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, str(RUNNER), "--hold-ray"], env=_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err, start_new_session=True)
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError("the Ray instance did not start: " + log.read_text()[-2000:])
        info = json.loads(line)
        self.address, self.auth_mode = info["address"], info["auth_mode"]

    def env(self) -> dict[str, str]:
        return {"RAY_AUTH_MODE": self.auth_mode} if self.auth_mode else {}

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()  # the holder shuts Ray down and exits
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
        self._err.close()


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(RUNNER.parent), env.get("PYTHONPATH", "")])
    env.update(extra or {})
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the session's process group (the driver and anything it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class SessionFailed(AssertionError):
    """A session did not end the way its step planned (crashed, missed its kill point,
    finished before its SIGKILL)."""


@dataclass
class KilledRun:
    """A run directory driven through its sessions. ``before[s]`` is the work (node and
    decision ids) the store held when session ``s`` started; ``state`` is the final
    state the last session reported; ``failure`` says why the run could not be driven
    to its end (the store then holds what the sessions wrote until then)."""

    run_dir: Path
    free: bool
    ray: RayInstance | None
    before: list[set[str]] = field(default_factory=list)
    kills: list[str] = field(default_factory=list)
    state: dict[str, Any] | None = None
    failure: str | None = None

    def _start(self, *extra: str) -> tuple[subprocess.Popen, Path]:
        s = len(self.before)
        self.before.append(recorded_work(self.run_dir) if s else set())
        out = self.run_dir.parent / f"{self.run_dir.name}.session{s}.json"
        err = open(self.run_dir.parent / f"{self.run_dir.name}.session{s}.err", "wb")
        args = [sys.executable, str(RUNNER), str(self.run_dir), str(out), *(["--resume"] if s else []),
                *(["--free"] if self.free else []), *(["--ray-address", self.ray.address] if self.ray else []), *extra]
        proc = subprocess.Popen(args, env=_env(self.ray.env() if self.ray else None), stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
        err.close()
        return proc, out

    def _stderr(self) -> str:
        return (self.run_dir.parent / f"{self.run_dir.name}.session{len(self.before) - 1}.err").read_text()[-3000:]

    def die_at(self, point: str) -> None:
        """One session that ends itself at ``point``: ``"before KIND:FIELD=VALUE,..."``
        (right before that event is stored) or ``"after KIND:..."`` (right after it is
        stored, before the driver applies it)."""
        when, spec = point.split(" ", 1)
        assert when in ("before", "after"), point
        proc, _ = self._start(f"--die-{when}", spec)
        try:
            rc = proc.wait(timeout=SESSION_TIMEOUT_S)
        finally:
            _kill_group(proc)
        if rc != DIE_EXIT_CODE:
            raise SessionFailed(f"kill point {point!r} was never reached (exit {rc}): {self._stderr()}")
        self.kills.append(point)

    def sigkill_after(self, more_events: int, delay_s: float) -> None:
        """One session SIGKILLed ``delay_s`` after it has stored ``more_events`` events
        (waiting on stored progress puts the kill at a known stage of the run; the
        delay puts it at an arbitrary moment inside that stage)."""
        target = count_events(self.run_dir) + more_events
        proc, _ = self._start()
        deadline = time.monotonic() + SESSION_TIMEOUT_S
        try:
            while count_events(self.run_dir) < target and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(delay_s)
            alive = proc.poll() is None
        finally:
            _kill_group(proc)
        if not alive:
            raise SessionFailed(f"the session ended before its kill at {target} events + {delay_s:.2f}s: "
                                f"{self._stderr()}")
        self.kills.append(f"SIGKILL at {count_events(self.run_dir)} events ({target} + {delay_s:.2f}s)")

    def complete(self) -> dict[str, Any]:
        """One session that runs to the end; the final state it reports."""
        proc, out = self._start()
        try:
            rc = proc.wait(timeout=SESSION_TIMEOUT_S)
        finally:
            _kill_group(proc)
        if rc != 0:
            raise SessionFailed(f"session {len(self.before) - 1} failed after kills {self.kills}: {self._stderr()}")
        self.state = json.loads(out.read_text())
        return self.state


@dataclass(frozen=True)
class Sigkill:
    """A kill step: SIGKILL the session after it stored between ``lo`` and ``hi`` more
    events (drawn from the scenario's seeded generator), plus a random delay of up
    to ``max_delay_s``."""

    lo: int
    hi: int
    max_delay_s: float = 0.4


def drive(run: KilledRun, steps: list[str | Sigkill], seed: int) -> KilledRun:
    """Drive ``run`` through one session per kill step, then a final session to the end.
    The kill moments are reproducible: they derive from ``seed`` alone. A session that
    fails stops the drive and is kept in ``run.failure``: every invariant can still be
    checked on what the store holds (a broken resume often writes the evidence of what
    it redid before it crashes)."""
    rng = random.Random(seed)
    try:
        for step in steps:
            if isinstance(step, Sigkill):
                run.sigkill_after(rng.randint(step.lo, step.hi), round(rng.uniform(0.0, step.max_delay_s), 2))
            else:
                run.die_at(step)
        run.complete()
    except SessionFailed as e:
        run.failure = str(e)
    return run


# ---------------------------------------------------------------------- reading a run
def _table(run_dir: Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.dataset as ds

    path = run_dir / name
    if not path.is_dir() or not any(path.glob("*.parquet")):
        return []
    return ds.dataset(str(path), format="parquet").to_table().to_pylist()  # dot-prefixed temp files are ignored


def events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``milo.*`` events in write order, payloads decoded."""
    rows = [r for r in _table(run_dir, "events") if str(r["kind"]).startswith("milo.")]
    for r in rows:
        p = r["payload"]
        r["payload"] = json.loads(p) if isinstance(p, str) else (p or {})
    return sorted(rows, key=lambda r: r["seq"])


def count_events(run_dir: Path) -> int:
    """Events stored so far, cheaply: the runner's store flushes every row to its own
    part file (``flush_rows=1``), so the part files count the rows without reading them."""
    d = run_dir / "events"
    return sum(1 for _ in d.glob("*.parquet")) if d.is_dir() else 0


def recorded_work(run_dir: Path) -> set[str]:
    """Work ids whose result the store holds: node ids (a mutation's or graft's child)
    and decision ids (an orchestrator call)."""
    out = set()
    for e in events(run_dir):
        if e["kind"] == "milo.node":
            out.add(e["payload"]["node"]["node_id"])
        elif e["kind"] in ("milo.decision", "milo.decision_invalid"):
            out.add(e["payload"]["decision_id"])
    return out


def agent_calls(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / CALL_LOG
    lines = path.read_text().splitlines() if path.exists() else []
    return [c for c in (json.loads(line) for line in lines if line.strip()) if c["agent"] != "session"]


# ---------------------------------------------------------------------- invariants
def _fmt(rows: list[dict[str, Any]]) -> str:
    return "; ".join(f"seq {r['seq']} {r['kind']} {json.dumps(r['payload'], sort_keys=True)[:160]}" for r in rows)


def assert_initialized_once(run_dir: Path) -> None:
    inits = [e for e in events(run_dir) if e["kind"] == "milo.init"]
    assert len(inits) == 1, f"{len(inits)} milo.init events (a resumed run re-initialized): {_fmt(inits)}"


def assert_each_node_recorded_once(run_dir: Path) -> None:
    by_id = collections.defaultdict(list)
    for e in events(run_dir):
        if e["kind"] == "milo.node":
            by_id[e["payload"]["node"]["node_id"]].append(e)
    twice = {n: rows for n, rows in by_id.items() if len(rows) > 1}
    assert not twice, "nodes recorded more than once: " + " | ".join(f"{n}: {_fmt(r)}" for n, r in twice.items())


# Kinds whose rows each record a step that happens once per key in a run; a second row
# with the same key means a resumed session redid that step.
UNIQUE_KEY = {
    "milo.init": lambda p: (),
    "milo.node": lambda p: p["node"]["node_id"],
    "milo.heldout": lambda p: p["node_id"],
    "milo.decision": lambda p: p["decision_id"],
    "milo.decision_invalid": lambda p: p["decision_id"],
    "milo.move_done": lambda p: (p["decision_id"], p["index"]),
    "milo.intervention_done": lambda p: p["decision_id"],
    "milo.island": lambda p: p["island"],
    "milo.curriculum": lambda p: p["version"],
    "milo.refit": lambda p: (p["node_id"], p["changes"]["search_version"]),
    "milo.step": lambda p: json.dumps(p["rounds"], sort_keys=True),
    "milo.summary": lambda p: (),
}


def _once_keys(e: dict[str, Any]) -> list[str]:
    k, p = e["kind"], e["payload"]
    keys = [json.dumps([k, UNIQUE_KEY[k](p)])] if k in UNIQUE_KEY else []
    # An orchestrator move has one outcome: the island it created, the graft child it
    # recorded, or its failure; a second one means the move was carried out again.
    if k in ("milo.island", "milo.move_failed") and "index" in p:
        keys.append(json.dumps(["move outcome", p["decision_id"], int(p["index"])]))
    elif k == "milo.node" and p["node"]["origin"] == "graft":
        did, _, i = p["node"]["node_id"].rpartition("-g")  # graft child ids are <decision>-g<move>
        keys.append(json.dumps(["move outcome", did, int(i)]))
    return keys


def assert_no_step_recorded_twice(run_dir: Path) -> None:
    seen: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in events(run_dir):
        for key in _once_keys(e):
            seen[key].append(e)
    twice = [rows for rows in seen.values() if len(rows) > 1]
    assert not twice, "steps recorded more than once: " + " | ".join(_fmt(r) for r in twice)


def assert_each_round_closed_once(run_dir: Path) -> None:
    """Per island, ``milo.progress`` rows close rounds 1, 2, ... in order, once each.
    The only other progress rows are a graft's held-out gain on the island (same round
    count, stall reset to 0), at most one per graft child recorded on the island."""
    evs = events(run_dir)
    grafts = collections.Counter(e["payload"]["node"]["island"] for e in evs
                                 if e["kind"] == "milo.node" and e["payload"]["node"]["origin"] == "graft")
    closed: dict[int, int] = collections.defaultdict(int)
    gains: dict[int, int] = collections.defaultdict(int)
    for e in evs:
        if e["kind"] != "milo.progress":
            continue
        p = e["payload"]
        j, r = int(p["island"]), int(p["rounds_done"])
        if r == closed[j] + 1:
            closed[j] = r
        elif r == closed[j] and p["stall"] == 0:
            gains[j] += 1
        else:
            raise AssertionError(f"island {j} had closed {closed[j]} rounds; then: {_fmt([e])}")
    extra = {j: (n, grafts[j]) for j, n in gains.items() if n > grafts[j]}
    assert not extra, f"more held-out-gain progress rows than graft children (island: rows, grafts): {extra}"


def harness_rows(run_dir: Path) -> collections.Counter:
    """The ``harnesses`` table as a multiset of (node id or "", harness id)."""
    out: collections.Counter = collections.Counter()
    for h in _table(run_dir, "harnesses"):
        extra = h.get("extra") or {}
        extra = json.loads(extra) if isinstance(extra, str) else extra
        out[(extra.get("node_id") or "", h["harness_id"])] += 1
    return out


def expected_harness_rows(run_dir: Path) -> collections.Counter:
    """What the recorder writes in a run, as the events say: one row per node, and one
    per seed evaluated at initialization that got no island."""
    out: collections.Counter = collections.Counter()
    for e in events(run_dir):
        p = e["payload"]
        if e["kind"] == "milo.init":
            placed = {int(i) for members in p["members"].values() for _, i in members}
            out.update(("", s["harness_id"]) for i, s in enumerate(p["seeds"]) if i not in placed)
        elif e["kind"] == "milo.node":
            out[(p["node"]["node_id"], p["node"]["harness_id"] or f"none:{p['node']['node_id']}")] += 1
    return out


def assert_harness_rows_match_events(run_dir: Path) -> None:
    """The ``harnesses`` table holds exactly one row per node and per island-less seed."""
    actual, expected = harness_rows(run_dir), expected_harness_rows(run_dir)
    assert actual == expected, (f"harnesses rows missing: {dict(expected - actual)}; "
                                f"repeated or without their event: {dict(actual - expected)}")


def assert_no_rollout_run_twice(run_dir: Path) -> None:
    keys = collections.Counter(r["cache_key"] for r in _table(run_dir, "rollouts") if r.get("error_kind") != "infra")
    twice = {k: n for k, n in keys.items() if n > 1}
    assert not twice, f"{len(twice)} rollouts stored more than once (solver calls repeated), e.g. {list(twice)[:3]}"


def assert_no_recorded_work_redone(run: KilledRun) -> None:
    """No session calls an agent for work whose result the store already held when it
    started (a mutation or graft whose node is recorded, a decision that is recorded),
    and no session calls an agent twice for the same work. A call in flight at a kill
    left no result, so the next session may repeat it."""
    calls = agent_calls(run.run_dir)
    redone = [c for c in calls if c["work"] in run.before[c["session"]]]
    assert not redone, (f"agent calls for work already recorded when their session started (kills: {run.kills}): "
                        f"{[(c['session'], c['agent'], c['work']) for c in redone]}")
    per_session = collections.Counter((c["session"], c["agent"], c["work"]) for c in calls)
    twice = [k for k, n in per_session.items() if n > 1]
    assert not twice, f"agent calls repeated within one session: {twice}"


def assert_run_finished(run: KilledRun) -> None:
    """The resumed run finished: every island (speciated ones too) closed max_rounds
    rounds, in the final state and in the store; every orchestrator decision the store
    records had each of its moves and itself marked done; the run stopped as finished."""
    from milo_ray.milo.orchestrator import moves_of

    want = CONFIG["max_rounds"]
    assert run.failure is None, run.failure
    short = {j: isl["rounds"] for j, isl in run.state["islands"].items() if isl["rounds"] != want}
    assert not short, f"islands that did not run {want} rounds (kills: {run.kills}): {short}"
    evs = events(run.run_dir)
    closed = collections.defaultdict(int)
    for e in evs:
        if e["kind"] == "milo.progress":
            j = int(e["payload"]["island"])
            closed[j] = max(closed[j], int(e["payload"]["rounds_done"]))
    assert {str(j): n for j, n in closed.items()} == {j: want for j in run.state["islands"]}
    decisions = {e["payload"]["decision_id"]: e["payload"]["decision"] for e in evs if e["kind"] == "milo.decision"}
    moves_done = {(e["payload"]["decision_id"], int(e["payload"]["index"]))
                  for e in evs if e["kind"] == "milo.move_done"}
    done = {e["payload"]["decision_id"] for e in evs if e["kind"] == "milo.intervention_done"}
    unfinished = {did: [i for i in range(len(moves_of(d))) if (did, i) not in moves_done]
                  for did, d in decisions.items() if did not in done}
    assert not unfinished, f"interventions never finished (decision: moves not done; kills: {run.kills}): {unfinished}"
    stops = [e["payload"] for e in evs if e["kind"] == "milo.stop"]
    assert stops and stops[-1]["reason"] == "finished", stops


def assert_same_state(expected: dict, actual: dict) -> None:
    """Lineage (every node's harness, parents, verdict, mutator, held-out score),
    assignment and per-island round and stall counters are equal."""
    assert actual["assignment"] == expected["assignment"]
    assert actual["islands"].keys() == expected["islands"].keys()
    for j in expected["islands"]:
        assert actual["islands"][j]["rounds"] == expected["islands"][j]["rounds"], j
        assert actual["islands"][j]["stall"] == expected["islands"][j]["stall"], j
        assert actual["islands"][j]["nodes"] == expected["islands"][j]["nodes"], j
