"""Resume fast-forwards through SSR's recorded decisions, and SSR records its agent spend.

Without Ray: the in-process scheduler (whose cache includes the store's rollouts), the
in-memory store and counting agents. A run is "killed" right before a chosen event is
stored: the session raises, and agents still running in its threads die with it
instead of answering. The resume is a fresh session (scheduler, agents, agent-call
log) on the same store. The resumed run must store the uninterrupted run's history,
choose the same harness, hold the same ``agent_calls`` rows, and ask the judge and
the optimizer only what was not recorded before the kill.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from dataclasses import dataclass, field

import pytest

from milo_ray.agents.embedder import HashingEmbedder
from milo_ray.agents.judges.offline import OfflineJudge
from milo_ray.agents.protocols import MutationResult
from milo_ray.llm.usage import AgentReply, AgentUsage, reply_parts
from milo_ray.context import RunContext
from milo_ray.execution.budget import BudgetLedger
from milo_ray.search.agent_calls import AgentCallLog, RoleCap
from milo_ray.ssr.loop import SSRMethod
from milo_ray.search.events import EventLog
from milo_ray.store.memory import MemoryRunStore
from ssr_inprocess import InProcessScheduler, RuleOptimizer
from ssr_slice import SliceBenchmark

SIZES = {"train": 8, "val": 4, "test": 3}
# Seed 0 on this slice accepts a child in round 0, so round 1 refreshes and judges again.
CONFIG = dict(initial="minimal", scales=[0.5, 1.0], b_v=[2, 2], b_s=1, b_f=1, rollouts=2, stages=2, patience=2,
              test_rollouts=1, candidate_cap=8, judge_workers=2)
SEED = 0
JUDGE_USAGE = AgentUsage(input_tokens=100, output_tokens=10, cost_usd=0.001)
OPTIMIZER_USAGE = dict(input_tokens=500, output_tokens=50, cost_usd=0.01)

# Kill right before the first event matching kind:field=value,... (@N: the N-th match).
KILL_POINTS = {
    "mid_judging_r0": "ssr.judged:round=0@3",
    "after_judging_r0": "ssr.refresh:round=0",
    "mid_candidates_r0": "ssr.candidate:round=0@2",
    "after_candidates_r0": "ssr.candidates:round=0",
    "mid_race_r0": "ssr.stage_result:round=0,stage=2",
    "after_judging_r1": "ssr.refresh:round=1",
}
# Kills between two paid steps: nothing was in flight, so nothing may be asked again.
NOTHING_IN_FLIGHT = {"after_judging_r0", "after_candidates_r0", "mid_race_r0", "after_judging_r1"}


class Killed(BaseException):
    """The session's death (a BaseException: no ``except Exception`` in the code under
    test may survive it)."""


@dataclass
class Session:
    """One process's life: the calls its agents answered, and whether it is dead."""

    name: str
    calls: list[tuple] = field(default_factory=list)
    dead: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answered(self, call: tuple) -> None:
        with self.lock:
            if self.dead:
                raise Killed()
            self.calls.append(call)


class CountingJudge:
    """The offline judge (one per distinct input, so an answer depends on the input and
    the attempt only), reporting JUDGE_USAGE per call and logging each answered call
    as ("judge", round-free input digest, attempt, task_id, trace digest)."""

    name = "counting-judge"

    def __init__(self, session: Session, malformed_rate: float = 0.2) -> None:
        self.session, self.malformed_rate = session, malformed_rate
        self._inner: dict[str, OfflineJudge] = {}
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def judge(self, trajectory, feedback, task_id):
        digest = hashlib.sha256(json.dumps([trajectory, feedback, task_id], sort_keys=True, default=str)
                                .encode()).hexdigest()
        with self._lock:
            n = self._seen[digest]
            self._seen[digest] += 1
            inner = self._inner.setdefault(digest, OfflineJudge(malformed_rate=self.malformed_rate))
        out, _ = reply_parts(inner.judge(trajectory, feedback, task_id))
        self.session.answered(("judge", task_id, _digest(trajectory), n))
        return AgentReply(out, JUDGE_USAGE)


class CountingOptimizer(RuleOptimizer):
    """The rule optimizer, reporting OPTIMIZER_USAGE and logging each answered call as
    ("optimizer", round, candidate index, seed)."""

    name = "counting-optimizer"

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session

    def mutate(self, req):
        res = super().mutate(req)
        self.session.answered(("optimizer", req.context["round"], req.context["candidate_index"], req.seed))
        return MutationResult(res.child, res.report, res.error, usage=AgentUsage(**OPTIMIZER_USAGE))


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@pytest.fixture(autouse=True)
def _in_process_candidates(monkeypatch):
    monkeypatch.setattr("milo_ray.ssr.candidates.use_ray", lambda: False)  # the agents live in this module


@pytest.fixture(scope="module")
def bench():
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark

    return SliceBenchmark(SurrogateBenchmark(preset="surrogate_swepro", seed=0), SIZES)


def _session(tmp_path, bench, store, session, *, resumed=False, caps=None, **cfg):
    sched = InProcessScheduler(bench, store, BudgetLedger(executions=10_000))
    agents = {"judge": CountingJudge(session), "optimizer": CountingOptimizer(session),
              "embedder": HashingEmbedder(64)}
    calls = AgentCallLog(store, budget=sched.budget, caps=caps, resumed=resumed)
    ctx = RunContext(run_id="ff", run_dir=tmp_path, seed=SEED, store=store, benchmark=bench, scheduler=sched,
                     model_id="offline", resumed=resumed, agents=agents, agent_calls=calls)
    return SSRMethod(**{**CONFIG, **cfg}).run(ctx)


def _kill_before(monkeypatch, spec: str, session: Session) -> None:
    kind, _, rest = spec.partition(":")
    conds, _, nth = rest.partition("@")
    want = dict(c.split("=", 1) for c in conds.split(",") if c)
    seen = [0]
    event = EventLog.write

    def event_or_die(self, k, payload=None, **cols):
        if k == kind and all(str({**cols, **(payload or {})}.get(f)) == v for f, v in want.items()):
            seen[0] += 1
            if seen[0] == int(nth or 1):
                with session.lock:
                    session.dead = True
                raise Killed()
        return event(self, k, payload, **cols)

    monkeypatch.setattr(EventLog, "write", event_or_die)


def _tables(store) -> dict[str, list[dict]]:
    return {t: store.read(t).to_pylist() for t in ("events", "experience", "harnesses", "agent_calls")}


@pytest.fixture(scope="module")
def reference(bench, tmp_path_factory):
    import milo_ray.ssr.candidates as cands

    saved, cands.use_ray = cands.use_ray, lambda: False
    try:
        store, session = MemoryRunStore(run_id="ff"), Session("reference")
        summary = _session(tmp_path_factory.mktemp("ref"), bench, store, session)
    finally:
        cands.use_ray = saved
    return summary, _tables(store), session


def _recorded_steps(store_rows: dict[str, list[dict]], store) -> set[tuple]:
    """The judge and optimizer calls whose answers the events hold, in the agents' call terms."""
    steps = set()
    for e in store_rows["events"]:
        p = json.loads(e["payload"])
        if e["kind"] == "ssr.judged":
            trajectory = (store.get_blob(p["trace_ref"]) or {}).get("trajectory", {}) if p["trace_ref"] else {}
            steps.add(("judge", p["task_id"], _digest(trajectory)))
        elif e["kind"] == "ssr.candidate":
            steps.add(("optimizer", e["round"], p["index"], p["seed"]))
    return steps


def _step(call: tuple) -> tuple:
    return call[:3] if call[0] == "judge" else call


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_resume_fast_forwards_to_the_uninterrupted_run(point, tmp_path, bench, monkeypatch, reference):
    ref_summary, ref, ref_session = reference
    store = MemoryRunStore(run_id="ff")
    first, second = Session("first"), Session("resume")
    with monkeypatch.context() as m:
        _kill_before(m, KILL_POINTS[point], first)
        with pytest.raises(Killed):
            _session(tmp_path, bench, store, first)
    before = _tables(store)
    recorded = _recorded_steps(before, store)
    summary = _session(tmp_path, bench, store, second, resumed=True)
    after = _tables(store)

    assert first.calls and len(before["events"]) < len(ref["events"]), "precondition: killed mid-run after paid calls"
    # Only what was not recorded before the kill is asked again; a kill between two
    # paid steps repeats nothing.
    repeated = [c for c in second.calls if c in set(first.calls)]
    assert not [c for c in repeated if _step(c) in recorded], "a recorded judge/optimizer answer was asked again"
    if point in NOTHING_IN_FLIGHT:
        assert not repeated
    # The ledger holds exactly the uninterrupted run's calls, each once.
    assert Counter(r["call_id"] for r in after["agent_calls"]) == Counter(r["call_id"] for r in ref["agent_calls"]), \
        [(r["call_id"], r["error"]) for r in ref["agent_calls"] + after["agent_calls"] if r["error"]]
    assert Counter(r["role"] for r in after["agent_calls"]) == Counter(r["role"] for r in ref["agent_calls"])

    # Same history, same choice.
    def events(rows):
        return Counter((e["kind"], e["round"], e["harness_id"], e["payload"]) for e in rows
                       if e["kind"] != "ssr.resume")

    assert events(after["events"]) == events(ref["events"])

    def experience(rows):
        return Counter((r["harness_id"], r["round"], r["task_id"], r["w"], r["a"], r["u"], r["summary"],
                        r["judge_error"], tuple(r["embedding"] or ())) for r in rows)

    assert experience(after["experience"]) == experience(ref["experience"])

    def harnesses(rows):
        return Counter((r["harness_id"], r["round"], r["origin"], r["parent_id"], r["evidence_scale"],
                        r["validation_error"], r["source_ref"]) for r in rows)

    assert harnesses(after["harnesses"]) == harnesses(ref["harnesses"])
    for key in ("final_harness", "history", "rounds", "stop_reason", "executions_used", "candidates_generated",
                "final_test"):
        assert summary[key] == ref_summary[key], key
    for role in ("judge", "optimizer"):
        for k in ("calls", "input_tokens", "output_tokens"):
            assert summary["spend_by_role"][role][k] == ref_summary["spend_by_role"][role][k], (role, k)


def test_reference_run_reaches_every_kill_point(reference):
    """Guards the scenarios: round 0 accepts a child (so round 1 judges again) and every
    kill point is reached in the uninterrupted run."""
    summary, ref, _ = reference
    assert summary["history"][0]["replaced"] and summary["rounds"] >= 2
    kinds = Counter((e["kind"], e["round"]) for e in ref["events"])
    assert kinds[("ssr.refresh", 1)] == 1 and kinds[("ssr.judged", 0)] == SIZES["train"]
    assert kinds[("ssr.candidate", 0)] >= 2 and kinds[("ssr.stage_result", 0)] == 2


def test_agent_calls_hold_every_judge_and_optimizer_call_with_its_usage(reference):
    summary, ref, session = reference
    made = Counter(c[0] for c in session.calls)
    rows = ref["agent_calls"]
    for role, usage in (("judge", JUDGE_USAGE), ("optimizer", AgentUsage(**OPTIMIZER_USAGE))):
        mine = [r for r in rows if r["role"] == role]
        # On a mismatch, say which calls ended without an answer (their error column).
        assert len(mine) == made[role] > 0, [(r["call_id"], r["error"]) for r in mine if r["error"]]
        assert sum(r["input_tokens"] for r in mine) == usage.input_tokens * made[role]
        assert sum(r["output_tokens"] for r in mine) == usage.output_tokens * made[role]
        assert sum(r["cost_usd"] for r in mine) == pytest.approx(usage.cost_usd * made[role])
        spend = summary["spend_by_role"][role]
        assert spend["calls"] == made[role] and spend["input_tokens"] == usage.input_tokens * made[role]
    # Every judge attempt, re-asks of malformed answers included, is its own row.
    attempts = sum(json.loads(e["payload"])["attempts"] for e in ref["events"] if e["kind"] == "ssr.judged")
    assert made["judge"] == attempts > sum(1 for e in ref["events"] if e["kind"] == "ssr.judged")
    embeds = [r for r in rows if r["role"] == "embedder"]
    refreshes = sum(1 for e in ref["events"] if e["kind"] == "ssr.refresh")
    assert len(embeds) == refreshes and all(r["input_tokens"] == r["output_tokens"] == 0 for r in embeds)


@pytest.mark.parametrize("role, per_call", [("judge", JUDGE_USAGE.tokens),
                                            ("optimizer", AgentUsage(**OPTIMIZER_USAGE).tokens)])
def test_role_cap_stops_new_work_of_the_role_and_tests_the_incumbent(role, per_call, tmp_path, bench):
    """A cap reached by round 0's calls: the next round asks nothing more of the role,
    says why once, and the run ends normally with the incumbent tested."""
    store, session = MemoryRunStore(run_id="ff"), Session("capped")
    summary = _session(tmp_path, bench, store, session, caps={role: RoleCap(tokens=per_call)})
    events = sorted(store.read("events").to_pylist(), key=lambda e: e["seq"])
    [refusal] = [e for e in events if e["kind"] == "ssr.role_budget"]
    p = json.loads(refusal["payload"])
    assert p["role"] == role and f"run.budget.roles.{role}" in p["reason"]
    assert summary["stop_reason"] == f"budget:{role}"
    assert summary["final_test"] and summary["final_test"][0]["harness_id"] == summary["final_harness"]
    kind = "ssr.judged" if role == "judge" else "ssr.candidate"
    assert not [e for e in events if e["kind"] == kind and e["seq"] > refusal["seq"]]
    assert {r["round"] for r in store.read("agent_calls").to_pylist() if r["role"] == role} == {0}
    assert summary["spend_by_role"][role]["calls"] == sum(1 for c in session.calls if c[0] == role)
