"""The gateways' journal of model calls: every call on disk from the moment it is
forwarded, and its usage from the moment the provider answered.

A rollout's model calls reach the driver with its outcome, so the calls of an attempt
that never reports were paid for and never recorded: its driver was killed, its worker's
node was lost, or the run stopped while it ran. The journal closes that gap. Each
gateway writes two records per call, through one small actor on the driver's node that
appends them to a file of the run directory (``<run>/journal/calls-<session>.jsonl``):

* ``begin`` before the call is forwarded: the attempt, the call's number in the attempt,
  the rollout (harness, task, rollout index, seed), whether it counts against the run's
  budget, and its start time;
* ``end`` once it returned: the same attempt and number, its index among the attempt's
  calls (the position it has in the rollout's trace) and its metered row (tokens, USD,
  latency, error), exactly as the rollout's result would carry it.

When the driver starts again (``run.resume=``), or when a session's scheduler closes,
:func:`unrecorded_calls` pairs the records and keeps the calls ``agent_calls`` does not
hold: a finished call with its real usage, a call still in flight with its usage
unknown. The driver records each once (:meth:`~milo_ray.search.agent_calls.AgentCallLog.record_interrupted`)
and charges a counted one to the run's budget once; a call is known by its rollout's
cache key, start time and index, so a later resume finds it recorded and adds nothing.

Why the driver writes the file rather than a worker or an actor: the driver's run
directory is the only place every session of the run can read, and no node need see it
-- workers on other nodes do not, nor does any node when the driver joins through Ray
Client (``ray://``) from a machine of its own. So the gateways send their records as
fire-and-forget calls (one caller's calls run in order, so a call's ``end`` never
precedes its ``begin``) to a small buffer actor, and a thread of the driver takes them
from it as they arrive (a long poll) and appends them to the file, flushed to the
operating system per batch: a killed driver loses what it had not yet taken (about a
round trip), never what the file holds. A torn last line is skipped when read.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

log = logging.getLogger(__name__)

JOURNAL_DIR = "journal"

# The attempt journal of the rollout attempt running in this context (None: the run keeps
# no journal -- an in-memory store, or an executor whose calls no gateway meters).
current_attempt_journal: contextvars.ContextVar["AttemptJournal | None"] = contextvars.ContextVar(
    "current_attempt_journal", default=None)


class CallJournal:
    """Appends records as JSON lines to ``path`` (flushed per batch). Thread-safe."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, records: list[dict[str, Any]]) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.write("".join(json.dumps(r, default=str) + "\n" for r in records))
            self._file.flush()

    def flush(self) -> None:
        """Return once every record sent before this call is in the file."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                self._file.close()


class JournalBuffer:
    """The records the gateways sent and the driver has not yet taken (an async actor:
    a :meth:`take` waiting for records never blocks a :meth:`write`)."""

    def __init__(self) -> None:
        from milo_ray.boundary.mailbox import Mailbox

        self._mailbox = Mailbox()

    async def write(self, records: list[dict[str, Any]]) -> None:
        self._mailbox.put(*records)

    async def wake(self) -> None:
        """End a waiting :meth:`take` now (the session is closing)."""
        self._mailbox.wake()

    async def take(self, wait_s: float) -> list[dict[str, Any]]:
        """Every record held, waiting up to ``wait_s`` for the first one."""
        return await self._mailbox.take(wait_s)


class DrivenJournal:
    """The session's journal: a :class:`JournalBuffer` actor the gateways write to
    (:attr:`actor`, the handle the workers are given) and a driver thread appending what
    it takes from it to a new file under ``directory``. Ray must be initialized."""

    # Between two takes that found records, at least this long: a busy run's records
    # arrive in batches of this period rather than one round trip each.
    MIN_PERIOD_S = 0.02
    POLL_S = 1.0

    def __init__(self, directory: str | os.PathLike, *, prefix: str = "calls") -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.file = CallJournal(self.new_path(directory, prefix))
        # On the driver's node when it has one (a round trip from the driver stays local);
        # num_cpus=0: microseconds of work per record, never waiting for a CPU rollouts hold.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.actor = ray.remote(num_cpus=0, max_restarts=0)(JournalBuffer).options(scheduling_strategy=here).remote()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="milo-ray-call-journal", daemon=True)
        self._thread.start()

    @staticmethod
    def new_path(directory: str | os.PathLike, prefix: str) -> Path:
        """A new session's file: ``<directory>/<prefix>-<time>-<random>.jsonl``."""
        return Path(directory) / f"{prefix}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.jsonl"

    def _take(self, wait_s: float) -> int:
        import ray

        records = ray.get(self.actor.take.remote(wait_s), timeout=wait_s + 30)
        if records:
            self.file.write(records)
        return len(records)

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                if self._take(self.POLL_S):
                    self._stop.wait(self.MIN_PERIOD_S)
            except Exception as exc:  # Ray going away under a closing session
                if not self._stop.is_set():
                    log.warning("call journal: taking records failed: %s", exc)
                    self._stop.wait(self.POLL_S)

    def close(self) -> None:
        """Take what is left, close the file and end the actor (harmless once Ray is gone)."""
        self._stop.set()
        try:
            import ray

            ray.get(self.actor.wake.remote(), timeout=30)
        except Exception:
            pass
        self._thread.join(timeout=self.POLL_S + 35)
        try:
            import ray

            self._take(0)
            ray.kill(self.actor)
        except Exception:  # Ray already shut down, or the actor died: the file holds what it got
            pass
        self.file.close()


class AttemptJournal:
    """One attempt's records, as a gateway's grants write them: each model call's
    ``begin`` (numbered in the attempt) and ``end``, carrying ``tag`` -- what the attempt
    was for -- on its ``begin``. Every grant given the same journal numbers its calls in
    one sequence.

    ``journal``: the session's :class:`JournalBuffer` actor handle, or a
    :class:`CallJournal` (one process, no Ray). :meth:`for_rollout` makes a rollout
    attempt's (made by the rollout worker); the search agents' calls are tagged by
    :mod:`~milo_ray.boundary.gateway.role_journal`."""

    def __init__(self, journal: Any, tag: dict[str, Any], *, attempt: str | None = None) -> None:
        self.journal = journal
        self._remote = hasattr(getattr(journal, "write", None), "remote")
        self.attempt = attempt or uuid.uuid4().hex
        self.tag = dict(tag)
        self._numbers = itertools.count()

    @classmethod
    def for_rollout(cls, journal: Any, item: tuple[str, str, int, int], *, counted: bool) -> "AttemptJournal":
        """``item``: (harness_id, task_id, rollout_idx, seed); ``counted``: whether the
        rollout counts against the run's budget."""
        return cls(journal, {"item": [str(item[0]), str(item[1]), int(item[2]), int(item[3])],
                             "counted": bool(counted)})

    def began(self, started_at: float) -> int:
        """A call is about to be forwarded; returns its number in this attempt."""
        n = next(self._numbers)
        self._send({"op": "begin", "a": self.attempt, "n": n, **self.tag, "t": float(started_at)})
        return n

    def finished(self, n: int, index: int, call: dict[str, Any]) -> None:
        """Call ``n`` returned: ``index`` is its position among the attempt's calls,
        ``call`` its metered row."""
        self._send({"op": "end", "a": self.attempt, "n": int(n), "i": int(index), "call": call})

    def _send(self, record: dict[str, Any]) -> None:
        try:
            if self._remote:
                self.journal.write.remote([record])  # runs even with its ref dropped
            else:
                self.journal.write([record])
        except Exception as exc:  # the journal is gone (its driver too): nothing left to tell
            log.debug("call journal unreachable: %s", exc)


@dataclass(frozen=True)
class UnrecordedCall:
    """A journaled call that ``agent_calls`` does not hold. ``call`` is its metered row,
    or None when it was still in flight (its usage is unknown)."""

    cache_key: str
    harness_id: str
    started_at: float
    number: int
    counted: bool
    call: dict[str, Any] | None


def read_journal(directory: str | os.PathLike, *, prefix: str = "calls",
                 ops: tuple[str, ...] = ("begin", "end")) -> list[dict[str, Any]]:
    """Every record (of the kinds ``ops``) of every session's file ``<prefix>-*.jsonl``
    under ``directory`` (a torn line skipped)."""
    out: list[dict[str, Any]] = []
    root = Path(directory)
    if not root.is_dir():
        return out
    for path in sorted(root.glob(f"{prefix}-*.jsonl")):
        out.extend(_records(path, ops))
    return out


def _records(path: Path, ops: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:  # the line a killed writer left half-written
                continue
            if isinstance(record, dict) and record.get("op") in ops:
                yield record


def solver_call_identity(call_id: str) -> tuple[str, str, str] | None:
    """(cache key, start time, index) of a stored solver call id (``<key>:[tag:]<t>:<i>``)."""
    try:
        prefix, started, index = call_id.rsplit(":", 2)
    except ValueError:
        return None
    return prefix.split(":", 1)[0], started, index


def unrecorded_calls(records: Iterable[dict[str, Any]], stored_ids: Iterable[str], model_id: str) -> list[UnrecordedCall]:
    """The journaled calls no stored ``agent_calls`` row names (see the module docstring).

    A call's stored id holds its rollout's cache key, its start time and its index in the
    attempt; a finished call is matched on those three, a call in flight (no ``end``) on
    none, since nothing stored can name it."""
    from milo_ray.core.rollouts import cache_key

    stored = {ident for ident in map(solver_call_identity, stored_ids) if ident is not None}
    begins: dict[tuple[str, int], dict[str, Any]] = {}
    ends: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        try:
            ident = (str(r["a"]), int(r["n"]))
        except (KeyError, TypeError, ValueError):
            continue
        (begins if r["op"] == "begin" else ends)[ident] = r
    out: list[UnrecordedCall] = []
    for ident, begin in begins.items():
        try:
            harness_id, task_id, rollout_idx, seed = begin["item"]
            key = cache_key(harness_id, task_id, int(rollout_idx), model_id, int(seed))
            started_at = float(begin["t"])
        except (KeyError, TypeError, ValueError):
            continue
        end = ends.get(ident)
        call = end.get("call") if end is not None else None
        if isinstance(call, dict):
            started = float(call.get("started_at") or started_at)
            if (key, f"{started:.6f}", str(int(end.get("i", -1)))) in stored:
                continue
        else:
            call = None
        out.append(UnrecordedCall(key, str(harness_id), started_at, ident[1], bool(begin.get("counted", True)), call))
    out.sort(key=lambda c: (c.started_at, c.cache_key, c.number))
    return out


class SessionJournal:
    """The driver's side of the journal for one scheduler: the session's
    :class:`DrivenJournal`, started with the first rollouts, and the recovery of what the
    journal knows and ``agent_calls`` does not. A run keeps a journal when its store has a directory and its executor's
    model calls go through a gateway (``meters_model_calls``); otherwise this does nothing."""

    def __init__(self, store: Any, executor_config: Any) -> None:
        from milo_ray.boundary.gateway.run_budget import meters_model_calls

        root = getattr(store, "root", None)
        wanted = root is not None and Path(root).is_dir() and meters_model_calls(executor_config)
        self.directory: Path | None = Path(root) / JOURNAL_DIR if wanted else None
        self.journal: DrivenJournal | None = None

    def start(self) -> Any:
        """The handle the session's gateways write to (started once; None when the run
        keeps no journal)."""
        if self.directory is not None and self.journal is None:
            self.journal = DrivenJournal(self.directory)
        return None if self.journal is None else self.journal.actor

    def stop(self) -> None:
        if self.journal is not None:
            self.journal.close()
            self.journal = None

    def finish(self, agent_calls: Any, model_id: str) -> None:
        """The session ends: close its file and record the calls of attempts that never
        reported (cancelled at the end, or lost with a worker), which were paid for. A
        failure is logged, not raised: the next resume records them."""
        self.stop()
        try:
            self.recover(agent_calls, model_id)
        except Exception:
            log.exception("could not record the journaled model calls of unreported attempts")

    def recover(self, agent_calls: Any, model_id: str) -> int:
        """Record in ``agent_calls`` (an :class:`~milo_ray.search.agent_calls.AgentCallLog`)
        every journaled call it does not hold; returns how many were added."""
        if self.directory is None or agent_calls is None:
            return 0
        calls = unrecorded_calls(read_journal(self.directory), agent_calls.call_ids(), model_id)
        return agent_calls.record_interrupted(calls) if calls else 0
