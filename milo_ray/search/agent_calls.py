"""The agent ledger: one ``agent_calls`` row per agent call of any role, the run's
token and USD budget charged with it, and per-role caps.

The driver is the only writer (agents may run in Ray tasks or actors; their usage
comes back with their result and is recorded here). Each call has a ``call_id`` that
names what it was for (``mutate:i2:r7``, ``judge:r0:task-17:a1``); on resume the
stored rows are read back, so spend before the interruption still counts against
every cap, and :meth:`AgentCallLog.recorded` tells a method which paid calls it must
not make again.

Solver calls on resume (each paid call counted once, across any number of resumes):
a stored rollout row carries the tokens and USD of its final attempt, and the scheduler
restores the budget from those rows; the calls of attempts that failed are stored here
only, with ``:failed:`` in their id, and are charged again from here. A final attempt's
calls stored without their rollout row (the driver died between the two writes) ran and
were paid, and the rollout runs again: they are charged too -- a solver row is covered
by a rollout row only when that row has its cache key and began no later than the call.
The calls of an attempt that never reported at all (in flight when the driver was killed,
lost with a worker, cancelled when the run stopped) come from the gateways' journal
(:mod:`~milo_ray.boundary.gateway.call_journal`): :meth:`AgentCallLog.record_interrupted`
stores each once, with ``:interrupted:`` in its id, and charges a counted one once.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping

from milo_ray.llm.usage import ROLES, AgentUsage
from milo_ray.core.problems import Problem, raise_invalid


@dataclass(frozen=True)
class RoleCap:
    """Caps of one role; None: unlimited."""

    tokens: int | None = None
    cost_usd: float | None = None

    def reached(self, spent: "RoleSpend") -> bool:
        return (self.tokens is not None and spent.tokens >= self.tokens) or (
            self.cost_usd is not None and spent.cost_usd >= self.cost_usd)


def role_caps(config: Mapping[str, Any] | None) -> dict[str, RoleCap]:
    """``run.budget.roles`` as RoleCaps; an unknown role or a negative cap is
    :class:`~milo_ray.core.problems.InvalidSettings` naming every such field."""
    out: dict[str, RoleCap] = {}
    problems: list[Problem] = []
    for role, caps in (config or {}).items():
        if role not in ROLES:
            problems.append(Problem(f"run.budget.roles.{role}", "unknown role", f"roles are {', '.join(ROLES)}"))
            continue
        caps = dict(caps or {})
        for key in caps:
            if key not in ("tokens", "cost_usd"):
                problems.append(Problem(f"run.budget.roles.{role}.{key}", "unknown cap", "use tokens or cost_usd"))
            elif caps[key] is not None and caps[key] < 0:
                problems.append(Problem(f"run.budget.roles.{role}.{key}={caps[key]}",
                                        "must be >= 0 (or null for unlimited)"))
        if caps.get("tokens") is not None or caps.get("cost_usd") is not None:
            out[role] = RoleCap(tokens=caps.get("tokens"), cost_usd=caps.get("cost_usd"))
    raise_invalid(problems)
    return out


@dataclass
class RoleSpend:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    seconds: float = 0.0
    errors: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, u: AgentUsage) -> None:
        self.calls += 1
        self.input_tokens += int(u.input_tokens)
        self.output_tokens += int(u.output_tokens)
        if u.cost_usd is None:
            self.unpriced_calls += 1
        else:
            self.cost_usd += float(u.cost_usd)
        self.seconds += float(u.seconds)
        self.errors += int(u.error is not None)

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost_usd": round(self.cost_usd, 6), "unpriced_calls": self.unpriced_calls,
                "seconds": round(self.seconds, 3), "errors": self.errors}


class AgentCallLog:
    """Records agent calls, charges the run budget, enforces per-role caps.

    ``budget`` is the run's ``BudgetLedger`` (rollouts and agent calls share its token
    and USD caps) or None. Thread-safe: SSR judges records from a thread pool.

    A role capped in USD counts priced calls only: with an unpriced model its USD cap
    is never reached (``by_role()`` reports the unpriced calls), so cap its tokens.
    """

    def __init__(self, store: Any, *, budget: Any = None, caps: Mapping[str, RoleCap] | None = None,
                 resumed: bool = False, journal: Any = None) -> None:
        self.store = store
        self.budget = budget
        self.caps = dict(caps or {})
        # The search agents' journal (a RoleJournal; None: their calls are not journaled).
        self.journal = journal
        self._lock = threading.Lock()
        self._spend: dict[str, RoleSpend] = defaultdict(RoleSpend)
        self._ids: set[str] = set()
        if resumed:
            self._restore()

    def _restore(self) -> None:
        covering = _rollout_starts(self.store)
        for row in self.store.read("agent_calls").to_pylist():
            u = AgentUsage(int(row.get("input_tokens") or 0), int(row.get("output_tokens") or 0), row.get("cost_usd"),
                           float(row.get("latency_s") or 0.0), int(row.get("retries") or 0), row.get("error"))
            self._spend[row["role"]].add(u)
            self._ids.add(row["call_id"])
            self._charge(row["role"], u)
            if row["role"] == "solver" and self.budget is not None and _uncovered_solver_call(row["call_id"], covering):
                self.budget.charge(tokens=u.tokens, cost_usd=u.cost_usd)

    # --- writing -----------------------------------------------------------------------
    def ticket(self, call_id: str, role: str, model: str | None) -> Any:
        """The journal ticket of an agent call about to be made (a
        :class:`~milo_ray.boundary.gateway.role_journal.RoleCallTicket`): the agent's
        model calls are journaled under it. None when the run keeps no journal, or the
        agent has no ``model`` (an offline agent calls none)."""
        return None if self.journal is None or model is None else self.journal.ticket(call_id, role)

    def record(self, role: str, usage: AgentUsage, *, call_id: str, agent: str | None = None,
               model: str | None = None, island: int | None = None, candidate: int | None = None,
               round: int | None = None, covers: Any = None) -> None:
        """Store one call and charge its spend. A ``call_id`` already recorded (a resumed
        run replaying a step whose call was stored) is not stored or charged again.
        ``covers``: the call's journal ticket when ``usage`` is the agent's own account of
        that attempt's model calls (its journaled calls are then not recorded again)."""
        if role not in ROLES:
            raise ValueError(f"agent call role {role!r}: roles are {', '.join(ROLES)}")
        with self._lock:
            if call_id in self._ids:
                return
            if covers is not None and self.journal is not None:
                self.journal.cover(covers)  # before the row: see role_journal's recovery rule
            # Stored first: if the write fails nothing is marked or charged, so the
            # ledger never counts a call the store does not hold.
            self.store.append("agent_calls", [{
                "run_id": getattr(self.store, "run_id", None), "call_id": call_id, "role": role, "agent": agent,
                "model": model, "island": island, "candidate": candidate, "round": round,
                "input_tokens": int(usage.input_tokens), "output_tokens": int(usage.output_tokens),
                "cost_usd": usage.cost_usd, "latency_s": float(usage.seconds), "retries": int(usage.retries),
                "error": usage.error, "time": time.time()}])
            self._ids.add(call_id)
            self._spend[role].add(usage)
            self._charge(role, usage)

    def record_rollout_calls(self, result: Any) -> None:
        """Record the model calls of one real rollout (role ``solver``) from its inline
        trace (``trace["trajectory"]["calls"]``; simulated rollouts have none)."""
        trace = getattr(result, "trace", None) or {}
        trajectory = trace.get("trajectory")
        # An agent's trajectory is a dict with its calls; an optimizer run's is its score log.
        calls = (trajectory.get("calls") or []) if isinstance(trajectory, dict) else []
        self.record_solver_calls(calls, cache_key=result.cache_key, harness_id=result.harness_id, round=result.round)
        # The grader role's calls (a verifier that needs a model): charged as role grader,
        # to the run's budget and run.budget.roles.grader, never to the rollout's solver.
        grader = trace.get("grader") if isinstance(trace.get("grader"), dict) else {}
        for i, c in enumerate(grader.get("calls") or []):
            usage = AgentUsage(int(c.get("input_tokens") or 0), int(c.get("output_tokens") or 0), c.get("cost_usd"),
                               float(c.get("seconds") or 0.0), int(c.get("retries") or 0), c.get("error"))
            self.record("grader", usage, call_id=f"{result.cache_key}:grader:{float(c.get('started_at') or 0):.6f}:{i}",
                        agent=str(c.get("purpose") or "") or None, model=c.get("model"), round=result.round)

    def record_solver_calls(self, calls: list[dict[str, Any]], *, cache_key: str, harness_id: str,
                            round: int | None = None, failed_attempt: str | None = None) -> None:
        """Record model calls of one rollout attempt (role ``solver``). Each call's id is the
        rollout's cache key plus the call's start time and index: an attempt run again
        (after an infrastructure failure, or a crash) made new calls, recorded too.
        ``failed_attempt``: None for the calls of a stored result; ``"counted"`` for an
        attempt that failed in a budgeted batch (no stored row carries its calls, so a
        resumed run charges them from here), ``"uncounted"`` for one outside the budget."""
        if failed_attempt not in (None, "counted", "uncounted"):
            raise ValueError(f"failed_attempt={failed_attempt!r}: expected None, 'counted' or 'uncounted'")
        tag = {None: "", "counted": f"{FAILED_MARK}:", "uncounted": f"{FAILED_UNCOUNTED_MARK}:"}[failed_attempt]
        for i, c in enumerate(calls):
            usage = AgentUsage(int(c.get("input_tokens") or 0), int(c.get("output_tokens") or 0), c.get("cost_usd"),
                               float(c.get("seconds") or 0.0), int(c.get("retries") or 0), c.get("error"))
            self.record("solver", usage, call_id=f"{cache_key}:{tag}{float(c.get('started_at') or 0):.6f}:{i}",
                        agent=harness_id, model=c.get("model"), round=round)

    def record_interrupted(self, calls: list[Any]) -> int:
        """Store the journaled solver calls of attempts that never reported
        (:class:`~milo_ray.boundary.gateway.call_journal.UnrecordedCall`), each once:
        a finished one with its real usage, charged to the run's budget when its rollout
        counted; one still in flight with no usage (the provider's answer never came back)
        and its reason. Returns how many were new."""
        added, unknown = 0, 0
        for c in calls:
            tag = INTERRUPTED_MARK if c.counted else INTERRUPTED_UNCOUNTED_MARK
            call_id = f"{c.cache_key}:{tag}:{c.started_at:.6f}:{c.number}"
            if self.recorded(call_id):
                continue
            row = c.call or {}
            usage = AgentUsage(int(row.get("input_tokens") or 0), int(row.get("output_tokens") or 0),
                               row.get("cost_usd") if c.call is not None else None, float(row.get("seconds") or 0.0),
                               int(row.get("retries") or 0),
                               row.get("error") if c.call is not None else IN_FLIGHT_ERROR)
            self.record("solver", usage, call_id=call_id, agent=c.harness_id, model=row.get("model"))
            if c.counted and self.budget is not None and (usage.tokens or usage.cost_usd):
                self.budget.charge(tokens=usage.tokens, cost_usd=usage.cost_usd)
            added += 1
            unknown += c.call is None
        if added:
            self.store.event("model_calls_recovered", {"calls": added, "usage_unknown": unknown})
        return added

    def record_interrupted_roles(self, calls: list[Any]) -> int:
        """Store the journaled attempts of search agents' calls that no row covers
        (:class:`~milo_ray.boundary.gateway.role_journal.InterruptedRoleCall`), each once,
        under its role, charged like any call of that role. Returns how many were new."""
        added, unknown = 0, 0
        for c in calls:
            if c.role not in ROLES or self.recorded(c.row_id):
                continue
            self.record(c.role, c.usage, call_id=c.row_id)
            added += 1
            unknown += c.in_flight
        if added:
            self.store.event("agent_calls_recovered", {"calls": added, "model_calls_in_flight": unknown})
        return added

    def call_ids(self) -> set[str]:
        """Every stored call's id."""
        with self._lock:
            return set(self._ids)

    def _charge(self, role: str, usage: AgentUsage) -> None:
        # Solver calls happen inside rollouts, whose tokens and cost the scheduler
        # already charges (and restores on resume): charging them here would count twice.
        if self.budget is not None and role != "solver":
            self.budget.charge(tokens=usage.tokens, cost_usd=usage.cost_usd)

    # --- reading -----------------------------------------------------------------------
    def recorded(self, call_id: str) -> bool:
        with self._lock:
            return call_id in self._ids

    def allows(self, role: str) -> bool:
        """Whether new work of ``role`` may start: its own caps and the run's token/USD
        caps are not reached."""
        with self._lock:
            spent, cap = self._spend[role], self.caps.get(role)
            if cap is not None and cap.reached(spent):
                return False
        return self.budget is None or not self.budget.spend_exhausted()

    def exhausted_reason(self, role: str) -> str | None:
        """Why :meth:`allows` says no (for the stop event), or None."""
        if self.allows(role):
            return None
        cap, spent = self.caps.get(role), self.spend(role)
        if cap is not None and cap.reached(spent):
            return (f"run.budget.roles.{role} reached (tokens {spent.tokens}/{cap.tokens}, "
                    f"cost ${spent.cost_usd:.4f}/{cap.cost_usd})")
        return "the run's token/USD budget is spent"

    def grader_refusal(self, task: Any) -> str | None:
        """Why a rollout of ``task`` may not start because its verifier calls the grader
        role and that role's cap (``run.budget.roles.grader``) is reached, or None."""
        if task is None or not getattr(task.format, "uses_grader", False) or self.allows("grader"):
            return None
        return f"{self.exhausted_reason('grader')}; no new rollout that needs the grader starts"

    def spend(self, role: str) -> RoleSpend:
        with self._lock:
            s = self._spend.get(role, RoleSpend())
            return RoleSpend(**vars(s))

    def by_role(self) -> dict[str, dict[str, Any]]:
        """Spend per role (roles with at least one call), for summaries and manifests."""
        with self._lock:
            return {r: self._spend[r].as_dict() for r in ROLES if self._spend.get(r) and self._spend[r].calls}


FAILED_MARK = "failed"
FAILED_UNCOUNTED_MARK = "failed-uncounted"
INTERRUPTED_MARK = "interrupted"
INTERRUPTED_UNCOUNTED_MARK = "interrupted-uncounted"
IN_FLIGHT_ERROR = ("in flight when its attempt ended unreported (the driver stopped, its worker was lost, or the "
                   "run ended); usage unknown")


def _rollout_starts(store: Any) -> dict[str, float]:
    """cache key -> the earliest ``started_at`` of its stored rollout rows."""
    try:
        rollouts = store.read("rollouts")
    except Exception:  # a run without rollouts yet
        return {}
    if rollouts.num_rows == 0 or "cache_key" not in rollouts.column_names:
        return {}
    out: dict[str, float] = {}
    starts = rollouts["started_at"].to_pylist() if "started_at" in rollouts.column_names else [None] * rollouts.num_rows
    for key, start in zip(rollouts["cache_key"].to_pylist(), starts):
        start = float("-inf") if start is None else float(start)
        out[key] = min(out.get(key, start), start)
    return out


def _uncovered_solver_call(call_id: str, rollout_starts: Mapping[str, float]) -> bool:
    """Whether a stored solver call's spend is carried by no stored rollout row (see the
    module docstring): a counted failed attempt's, or a final attempt's whose rollout row
    was never stored (or is later than the call: the rollout ran again after a resume)."""
    try:
        prefix, started, _index = call_id.rsplit(":", 2)
        started_at = float(started)
    except ValueError:  # not a solver call id of this module
        return False
    if prefix.endswith((":" + FAILED_UNCOUNTED_MARK, ":" + INTERRUPTED_UNCOUNTED_MARK)):
        return False
    if prefix.endswith((":" + FAILED_MARK, ":" + INTERRUPTED_MARK)):
        return True
    first = rollout_starts.get(prefix)
    return first is None or first > started_at


def spec_model(spec: Any) -> str | None:
    """The model an agent spec talks to, for its ``agent_calls`` rows: its ``llm.model``
    (LLM agents), else its ``model`` (a CLI agent's), else None (offline agents)."""
    if not isinstance(spec, Mapping):
        return None
    llm = spec.get("llm")
    model = llm.get("model") if isinstance(llm, Mapping) else spec.get("model")
    return None if model is None else str(model)
