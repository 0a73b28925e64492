"""The journal of the search agents' model calls: what a mutator, a graft or an SSR
optimizer call paid for, on disk while the agent still runs.

An agent call's spend reaches the driver with its outcome, as one ``agent_calls`` row
(``mutate:i2:r7``). An agent loop makes tens of model calls, so when the outcome never
comes back -- the driver was killed, the agent's worker was lost, or the agent ran past
its time cap and its task was cancelled -- every call it made was paid and none recorded,
and a resumed run asks the same call again. The journal closes that gap the way the
solver's journal (:mod:`.call_journal`) does for rollouts:

* the driver hands each agent call a :class:`RoleCallTicket` (the call's id and role, a
  fresh attempt id and the session's journal buffer) along with its request;
* the process that runs the agent opens :func:`journaling` around it, and the agent's
  model gateway (:class:`~milo_ray.boundary.gateway.mutation.MutationGateway`) writes a
  ``begin`` record before each model call is forwarded and an ``end`` record with its
  metered row once it returned, tagged with the ticket;
* when the outcome does come back with the agent's own metered usage, the driver writes
  a ``covered`` record for the attempt (:meth:`RoleJournal.cover`) before it stores the
  call's row: the row holds that attempt's spend.

At the end of a session and when a run resumes, :meth:`RoleJournal.recover` stores each
attempt the journal knows and no row covers -- an attempt is covered when its ``covered``
record exists and its call's row is stored -- once, as ``<call_id>:interrupted:<attempt>``
under the call's role: the usage of its finished model calls, and how many were still in
flight (their usage never came back). That row charges the run's budget and the role's
cap like any other, once, since a later recovery finds it recorded.

Records travel as the solver's do: fire-and-forget to a buffer actor, appended by a
driver thread to ``<run>/journal/roles-<session>.jsonl``; the driver writes its
``covered`` records to the same file directly.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from milo_ray.llm.usage import AgentUsage
from milo_ray.boundary.gateway.call_journal import AttemptJournal, CallJournal, DrivenJournal, read_journal

log = logging.getLogger(__name__)

ROLE_JOURNAL_PREFIX = "roles"
INTERRUPTED_ROLE_MARK = "interrupted"


@dataclass(frozen=True)
class RoleCallTicket:
    """What the process running one agent call needs to journal it (picklable: it rides
    with the request into a Ray task). ``journal``: the session's buffer actor handle, or
    a :class:`~.call_journal.CallJournal` (one process, no Ray)."""

    journal: Any
    call_id: str
    role: str
    attempt: str = field(default_factory=lambda: uuid.uuid4().hex)


# The records of the agent call running in this context (None: not journaled).
current_role_call: contextvars.ContextVar["AttemptJournal | None"] = contextvars.ContextVar(
    "current_role_call", default=None)


def role_call_records(ticket: RoleCallTicket) -> AttemptJournal:
    """The journal one agent call's gateway grants write to: its model calls numbered in
    one sequence, each ``begin`` tagged with the call's id and role."""
    return AttemptJournal(ticket.journal, {"call_id": ticket.call_id, "role": ticket.role}, attempt=ticket.attempt)


@contextlib.contextmanager
def journaling(ticket: RoleCallTicket | None) -> Iterator[None]:
    """Journal the model calls the agent makes in this block (and in threads started with
    a copy of this context) under ``ticket``; None journals nothing."""
    token = current_role_call.set(role_call_records(ticket) if ticket is not None else None)
    try:
        yield
    finally:
        current_role_call.reset(token)


@dataclass(frozen=True)
class InterruptedRoleCall:
    """An attempt of an agent call that no stored row covers: its id and role, the usage
    of its finished model calls, and how many never finished."""

    call_id: str
    role: str
    attempt: str
    started_at: float
    usage: AgentUsage
    in_flight: int

    @property
    def row_id(self) -> str:
        return f"{self.call_id}:{INTERRUPTED_ROLE_MARK}:{self.attempt[:12]}"


def in_flight_note(n: int) -> str:
    return (f"interrupted: {n} model call(s) in flight when the agent call ended without an outcome "
            "(the driver stopped, its worker was lost, or it ran past its time cap); their usage never came back")


def uncovered_attempts(records: Iterable[dict[str, Any]], stored_ids: Iterable[str]) -> list[InterruptedRoleCall]:
    """The journaled attempts no stored row covers (see the module docstring), in the
    order they began."""
    stored = set(stored_ids)
    begins: dict[str, list[dict[str, Any]]] = {}
    ends: dict[tuple[str, int], dict[str, Any]] = {}
    covered: set[str] = set()
    for r in records:
        try:
            op, attempt = r["op"], str(r["a"])
            if op == "covered":
                covered.add(attempt)
            elif op == "begin":
                begins.setdefault(attempt, []).append(r)
            elif op == "end":
                ends[(attempt, int(r["n"]))] = r
        except (KeyError, TypeError, ValueError):
            continue
    out: list[InterruptedRoleCall] = []
    for attempt, opened in begins.items():
        try:
            call_id, role = str(opened[0]["call_id"]), str(opened[0]["role"])
            started = min(float(b["t"]) for b in opened)
        except (KeyError, TypeError, ValueError):
            continue
        if attempt in covered and call_id in stored:
            continue
        rows = [ends[(attempt, int(b["n"]))].get("call") for b in opened if (attempt, int(b["n"])) in ends]
        rows = [c for c in rows if isinstance(c, dict)]
        in_flight = len(opened) - len(rows)
        costs = [c.get("cost_usd") for c in rows]
        usage = AgentUsage(sum(int(c.get("input_tokens") or 0) for c in rows),
                           sum(int(c.get("output_tokens") or 0) for c in rows),
                           None if any(c is None for c in costs) else float(sum(costs)),
                           seconds=sum(float(c.get("seconds") or 0.0) for c in rows),
                           retries=sum(int(c.get("retries") or 0) for c in rows),
                           error=in_flight_note(in_flight) if in_flight else None)
        out.append(InterruptedRoleCall(call_id, role, attempt, started, usage, in_flight))
    out.sort(key=lambda c: (c.started_at, c.call_id))
    return out


class RoleJournal:
    """The driver's side of the search agents' journal for one run: tickets for agent
    calls, ``covered`` records, and the recovery of uncovered attempts. ``directory``: the
    run's journal directory (None: no journal -- an in-memory store; tickets are None).
    The session's buffer actor and file start with the first ticket (Ray must be
    initialized then); without Ray, records go to the file directly."""

    def __init__(self, directory: str | os.PathLike | None) -> None:
        self.directory = None if directory is None else Path(directory)
        self._driven: Any = None
        self._file: Any = None
        self._lock = threading.Lock()

    def ticket(self, call_id: str, role: str) -> RoleCallTicket | None:
        if self.directory is None:
            return None
        return RoleCallTicket(self._sink(), str(call_id), str(role))

    def cover(self, ticket: RoleCallTicket | None) -> None:
        """The agent call's outcome carries its attempt's metered usage: its row, stored
        next, holds that spend. Written (and flushed) before the row is stored."""
        if ticket is None or self.directory is None:
            return
        self._sink()
        self._file.write([{"op": "covered", "a": ticket.attempt, "call_id": ticket.call_id}])

    def _sink(self) -> Any:
        with self._lock:
            if self._file is None:
                import ray

                assert self.directory is not None
                if ray.is_initialized():
                    self._driven = DrivenJournal(self.directory, prefix=ROLE_JOURNAL_PREFIX)
                    self._file = self._driven.file
                else:
                    self._file = CallJournal(DrivenJournal.new_path(self.directory, ROLE_JOURNAL_PREFIX))
            return self._driven.actor if self._driven is not None else self._file

    def close(self) -> None:
        with self._lock:
            driven, file = self._driven, self._file
            self._driven = self._file = None
        if driven is not None:
            driven.close()
        elif file is not None:
            file.close()

    def recover(self, agent_calls: Any) -> int:
        """Store each uncovered attempt in ``agent_calls`` (an
        :class:`~milo_ray.search.agent_calls.AgentCallLog`) once; returns how many were
        new. Call it when no agent call of this run is running (resume, session end)."""
        if self.directory is None or agent_calls is None:
            return 0
        records = read_journal(self.directory, prefix=ROLE_JOURNAL_PREFIX, ops=("begin", "end", "covered"))
        return agent_calls.record_interrupted_roles(uncovered_attempts(records, agent_calls.call_ids()))

    def finish(self, agent_calls: Any) -> None:
        """The session ends: close the file, then store the attempts that ended without an
        outcome (timed out, lost). A failure is logged: the next resume stores them."""
        self.close()
        try:
            self.recover(agent_calls)
        except Exception:
            log.exception("could not record the journaled model calls of agent calls without an outcome")
