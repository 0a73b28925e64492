"""The rollout worker: an async Ray actor running rollouts as coroutines.

A :class:`RolloutWorker` actor holds a fixed number of sandbox slots (a Ray resource,
``sandbox_slot``) for its life. It builds the executor once from config, caches
harnesses (by ``harness_id``) and tasks (by ``task_id``) that the driver ships to it
once, and runs up to ``slots`` rollouts at a time as asyncio tasks in its event loop.
A rollout is I/O-bound (model calls, sandbox commands), so one process serves several
slots; a Ray task per rollout would cost a worker process per concurrent rollout.

The protocol with the driver is two calls, both batched so the per-call cost is
amortised over many rollouts:

* ``submit(items, harness_refs, tasks)`` starts a batch and returns at once;
* ``poll(max_wait_s)`` returns every outcome finished since the last poll, waiting
  up to ``max_wait_s`` for the first one (a long poll, so results stream back as
  they finish without a batch barrier).

Per-rollout time caps are enforced here, next to the rollout: past
``task.time_cap_s * time_cap_grace + task.grading_cap_s`` after the executor call started
running (for a blocking ``execute``, once it got a thread) the coroutine is cancelled and the outcome
is marked as capped. An executor that raises is reported as an infrastructure failure
(the driver decides about retries); a ``SystemExit`` from it is a harness failure. The actor is a thin shell around
:class:`WorkerCore`, which is plain asyncio and testable without Ray.

The driver-side half of a worker's life is here too: :class:`WorkerHandle` is the
driver's record of one worker, :func:`create_worker` asks Ray for it (its slots as a
resource request, no node affinity: Ray places it where slots are free) and
:func:`await_ready` waits until it is placed and has built its executor. How many
workers a run has is :class:`~milo_ray.execution.pool.WorkerPool`'s business.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import os
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from milo_ray.core.rollouts import RolloutResult
from milo_ray.core.tasks import Task
from milo_ray.boundary.gateway.call_journal import AttemptJournal, current_attempt_journal
from milo_ray.boundary.gateway.run_budget import RolloutBudget, current_rollout_budget
from milo_ray.boundary.mailbox import Mailbox

log = logging.getLogger(__name__)

# Actor calls beyond the rollout slots: submit/poll/ready must never queue behind rollouts.
_CONTROL_CALLS = 4

# (item_id, harness_id, task_id, rollout_idx, seed): what the driver sends per rollout.
Item = tuple[int, str, str, int, int]


@dataclass
class Outcome:
    """What one attempt of one rollout produced, as seen by the worker.

    Exactly one of ``result`` / ``infra_error`` / ``capped`` describes it:
    a result returned by the executor, an exception it raised, or the time cap.
    """

    item_id: int
    result: RolloutResult | None
    infra_error: str | None
    capped: bool
    started_at: float
    finished_at: float
    # Model calls a failed attempt made (an executor's InfraFailure carries them).
    model_calls: list[dict[str, Any]] = field(default_factory=list)
    # What the attempt's gateway already charged to the run's budget counter (tokens, USD),
    # and why that counter refused one of its calls (None: it did not).
    metered: tuple[int, float] = (0, 0.0)
    run_budget_refused: str | None = None


def build_executor(executor_config: Any) -> Any:
    """Instantiate an executor from a ``_target_`` mapping (dict or DictConfig);
    an already-built executor object is used as is."""
    if isinstance(executor_config, Mapping) or type(executor_config).__name__ == "DictConfig":
        from hydra.utils import instantiate

        executor = instantiate(executor_config)
    else:
        executor = executor_config
    if not callable(getattr(executor, "execute", None)) and not callable(getattr(executor, "aexecute", None)):
        raise TypeError(
            f"executor_config built {type(executor).__name__!r}, which has neither execute() nor aexecute(); "
            "point _target_ at an Executor (milo_ray.core.executor.Executor)"
        )
    return executor


class WorkerCore:
    """Runs rollouts concurrently on one event loop; holds the node's caches."""

    def __init__(self, executor_config: Any, slots: int, time_cap_grace: float) -> None:
        if slots < 1:
            raise ValueError(f"WorkerCore: slots={slots} must be >= 1")
        self.executor = build_executor(executor_config)
        aexecute = getattr(self.executor, "aexecute", None)
        self._aexecute = aexecute if callable(aexecute) else None
        self.slots = slots
        self.time_cap_grace = float(time_cap_grace)
        # A blocking execute() runs on these threads so it cannot stall the loop. Twice
        # the slots: a thread whose rollout hit the time cap cannot be interrupted and
        # keeps its thread until the blocking call returns.
        self._threads: ThreadPoolExecutor | None = None
        # Shipped objects, registered when a submit names them (before it awaits
        # anything) as futures, so a rollout of a concurrent submit waits for the same
        # fetch instead of finding nothing. The refs allow a failed fetch to be retried.
        self.harnesses: dict[str, asyncio.Future] = {}
        self.tasks: dict[str, asyncio.Future] = {}
        self._refs: dict[tuple[str, str], Any] = {}
        self._sem: asyncio.Semaphore | None = None
        self._outcomes = Mailbox()  # finished rollouts the driver has not yet polled
        self._running: set[asyncio.Task] = set()
        # The run's budget counter (a RunSpendActor handle, set by the driver; None: the
        # run has no token/USD cap, or its executor meters no model calls).
        self.run_budget: Any = None
        # The session's call journal (a JournalBuffer actor handle, set by the driver; None:
        # the run keeps none): every rollout attempt's gateway writes its calls there.
        self.call_journal: Any = None

    def _loop_state(self) -> None:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.slots)

    async def submit(self, items: list[Item], harness_refs: dict[str, Any], tasks: dict[str, Any],
                     unbudgeted: Collection[int] = ()) -> int:
        """Register the shipped harnesses/tasks and start the rollouts; returns at once.
        ``unbudgeted``: item ids run outside the run's budget (final evaluations).

        Nothing here awaits: the driver marks a harness or task as shipped when it sends
        the first submit naming it, and a later submit may arrive while that object is
        still being fetched, so each object is a future its rollouts wait for."""
        self._loop_state()
        for hid, ref in harness_refs.items():
            self._register(self.harnesses, "harness", hid, ref)
        for tid, task in tasks.items():
            self._register(self.tasks, "task", tid, task)
        skip = set(unbudgeted)
        for item in items:
            budget = RolloutBudget(self.run_budget) if self.run_budget is not None and item[0] not in skip else None
            journal = (AttemptJournal.for_rollout(self.call_journal, item[1:], counted=item[0] not in skip)
                       if self.call_journal is not None else None)
            t = asyncio.create_task(self._run(item, budget, journal))
            self._running.add(t)
            t.add_done_callback(self._running.discard)
        return len(self._running)

    def _register(self, cache: dict[str, asyncio.Future], kind: str, key: str, value: Any) -> None:
        fut = cache.get(key)
        if fut is not None and not _failed(fut):
            return  # known, or being fetched: the first shipment wins
        self._refs[(kind, key)] = value
        cache[key] = _fetch(value)

    async def _resolve(self, cache: dict[str, asyncio.Future], kind: str, key: str) -> Any:
        fut = cache.get(key)
        if fut is None:
            raise KeyError(f"{kind} {key!r} was never shipped to this worker")
        if _failed(fut):
            # An earlier fetch failed (e.g. a lost object): fetch again for this rollout.
            fut = cache[key] = _fetch(self._refs[(kind, key)])
        # Shielded: a rollout cancelled while waiting must not cancel the shared fetch.
        return await asyncio.shield(fut)

    def _launch(
        self, harness: Any, task: Task, rollout_idx: int, seed: int
    ) -> tuple[asyncio.Future, asyncio.Future | None]:
        """Start the executor call. Returns the call's future and, for a blocking
        ``execute``, a future set once the call got a thread and actually runs (None
        when it runs from now on)."""
        if self._aexecute is not None:
            return asyncio.ensure_future(_guard_async(self._aexecute, harness, task, rollout_idx, seed)), None
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=2 * self.slots, thread_name_prefix="rollout")
        loop = asyncio.get_running_loop()
        began = loop.create_future()
        # In a copy of this rollout's context, as a task would be: its share of the run's
        # budget (current_rollout_budget) reaches a blocking executor too.
        fn = functools.partial(contextvars.copy_context().run, _guard_thread, loop, began, self.executor.execute,
                               harness, task, rollout_idx, seed)
        return loop.run_in_executor(self._threads, fn), began

    async def _run(self, item: Item, budget: RolloutBudget | None = None, journal: AttemptJournal | None = None) -> None:
        item_id, harness_id, task_id, rollout_idx, seed = item
        assert self._sem is not None
        # This task's own context: the executor's gateway finds the rollout's share of the
        # run's budget and the attempt's journal here (the executor call below runs in a copy of it).
        current_rollout_budget.set(budget)
        current_attempt_journal.set(journal)
        async with self._sem:
            started = time.time()
            result: RolloutResult | None = None
            infra_error: str | None = None
            model_calls: list[dict[str, Any]] = []
            capped = False
            try:
                harness = await self._resolve(self.harnesses, "harness", harness_id)
                task = await self._resolve(self.tasks, "task", task_id)
                cap = task.time_cap_s * self.time_cap_grace + max(float(task.grading_cap_s or 0.0), 0.0)
                limit = cap if 0 < cap < math.inf else None
                job, began = self._launch(harness, task, rollout_idx, seed)
                if began is not None:
                    # The cap counts from when the call runs, not while it waits for a
                    # thread (all of them may be held by calls that overran their cap and
                    # cannot be interrupted). One that gets none within a cap never ran:
                    # an infrastructure failure, not a timeout of the task.
                    done, _ = await asyncio.wait({job, began}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
                    if not done:
                        job.cancel()
                        raise _NoThread(
                            f"no executor thread became free within {cap:g} s "
                            "(all are held by rollouts that overran their time cap)"
                        )
                started = time.time()
                # asyncio.wait (not wait_for) so a TimeoutError raised *by the executor*
                # is an infrastructure failure, not mistaken for the cap.
                done, _ = await asyncio.wait({job}, timeout=limit)
                if not done:
                    job.cancel()
                    capped = True
                else:
                    exc = job.exception()
                    if isinstance(exc, _HarnessExit):
                        # The harness exited the interpreter (sys.exit) or raised
                        # KeyboardInterrupt on its thread: the harness failed.
                        result = RolloutResult(
                            harness_id=harness_id,
                            task_id=task_id,
                            rollout_idx=rollout_idx,
                            score=0.0,
                            latency_s=max(time.time() - started, 0.0),
                            error_kind="harness",
                            error=str(exc),
                        )
                    else:
                        value = job.result()
                        if not isinstance(value, RolloutResult):
                            raise TypeError(f"executor returned {type(value).__name__}, expected RolloutResult")
                        result = value
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the executor raising = infrastructure failure
                infra_error = f"{type(exc).__name__}: {exc}"
                model_calls = list(getattr(exc, "model_calls", None) or [])
            finished = time.time()
        self._outcomes.put(Outcome(item_id, result, infra_error, capped, started, finished, model_calls,
                                   metered=budget.metered if budget else (0, 0.0),
                                   run_budget_refused=budget.refused if budget else None))

    async def poll(self, max_wait_s: float) -> list[Outcome]:
        return await self._outcomes.take(max_wait_s)

    def in_flight(self) -> int:
        return len(self._running)


class _HarnessExit(Exception):
    """A ``SystemExit`` (or, on an executor thread, ``KeyboardInterrupt``) raised by the
    executor, carried as an ordinary exception so it cannot end the worker's event loop."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"harness raised {type(exc).__name__}({', '.join(map(repr, exc.args))})")


class _NoThread(Exception):
    """A blocking rollout found no free executor thread within its time cap."""


def _fetch(value: Any) -> asyncio.Future:
    """A future for a shipped object: resolved already, or fetching an ObjectRef."""
    if isinstance(value, ray.ObjectRef):
        return asyncio.ensure_future(_await(value))
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


def _failed(fut: asyncio.Future) -> bool:
    return fut.done() and (fut.cancelled() or fut.exception() is not None)


async def _await(ref: Any) -> Any:
    return await ref


async def _guard_async(aexecute: Any, *args: Any) -> Any:
    try:
        return await aexecute(*args)
    except SystemExit as exc:
        # Only SystemExit: a KeyboardInterrupt on the loop thread may be a real signal.
        raise _HarnessExit(exc) from None


def _set_began(began: asyncio.Future) -> None:
    if not began.done():
        began.set_result(None)


def _guard_thread(loop: asyncio.AbstractEventLoop, began: asyncio.Future, execute: Any, *args: Any) -> Any:
    """Runs on an executor thread: reports that the call started, then runs it."""
    loop.call_soon_threadsafe(_set_began, began)
    try:
        return execute(*args)
    except (SystemExit, KeyboardInterrupt) as exc:
        # No signal reaches a non-main thread: either was raised by the harness itself.
        raise _HarnessExit(exc) from None


class _RolloutWorkerShell:
    """Ray actor shell around :class:`WorkerCore` (construction errors are reported by
    ``ready()`` instead of killing the actor, so the driver can name the bad config)."""

    def __init__(self, executor_config: Any, slots: int, time_cap_grace: float) -> None:
        self.core: WorkerCore | None = None
        self.error: str | None = None
        try:
            self.core = WorkerCore(executor_config, slots, time_cap_grace)
        except Exception:
            self.error = traceback.format_exc()

    async def ready(self) -> dict[str, Any]:
        return {"error": self.error, "node_id": ray.get_runtime_context().get_node_id(),
                "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    async def set_secrets(self, env: dict[str, str]) -> None:
        """The driver's key variables for the executor (kept in its memory only)."""
        assert self.core is not None, self.error
        set_secrets = getattr(self.core.executor, "set_secrets", None)
        if callable(set_secrets):
            set_secrets(env)

    async def set_run_budget(self, counter: Any) -> None:
        """The run's budget counter (a RunSpendActor handle), which every budgeted rollout's
        gateway checks before each model call and charges after it."""
        assert self.core is not None, self.error
        self.core.run_budget = counter

    async def set_call_journal(self, journal: Any) -> None:
        """The session's call journal (a CallJournal actor handle), where every rollout
        attempt's gateway writes its model calls as they are forwarded and as they return."""
        assert self.core is not None, self.error
        self.core.call_journal = journal

    async def submit(self, items: list[Item], harness_refs: dict[str, Any], tasks: dict[str, Task],
                     unbudgeted: Collection[int] = ()) -> int:
        assert self.core is not None, self.error
        return await self.core.submit(items, harness_refs, tasks, unbudgeted)

    async def poll(self, max_wait_s: float) -> list[Outcome]:
        assert self.core is not None, self.error
        return await self.core.poll(max_wait_s)

    async def in_flight(self) -> int:
        return 0 if self.core is None else self.core.in_flight()


# num_cpus=0: the worker waits on I/O; its capacity is the sandbox slots it holds.
RolloutWorker = ray.remote(num_cpus=0)(_RolloutWorkerShell)


# --- driver side: one worker as the driver sees it, and starting one ----------------


@dataclass(eq=False)
class WorkerHandle:
    """The driver's view of one worker actor: its slots, where Ray placed it, what was
    shipped to it, and the rollouts in flight there (item id -> the scheduler's job).

    A worker is *pending* from its creation until Ray placed it and it built its
    executor (``ready``); a pending worker's resource request is the demand the
    autoscaler sees. ``label`` names the node it runs on (``ip:node-id-prefix``), which
    is what every result records as its ``node``."""

    key: str
    slots: int
    actor: Any = None
    ready: bool = False
    node_id: str = ""
    label: str = ""
    harnesses: set[str] = field(default_factory=set)
    tasks: set[str] = field(default_factory=set)
    inflight: dict[int, Any] = field(default_factory=dict)
    poller: Any = None  # the asyncio task long-polling this worker
    idle_since: float | None = None  # monotonic time its last rollout ended (None: busy or never used)

    def free(self) -> int:
        return self.slots - len(self.inflight) if (self.ready and self.actor is not None) else 0


def node_label(node_id: str, ip: str) -> str:
    return f"{ip or '?'}:{node_id[:8]}"


def create_worker(worker: WorkerHandle, config_ref: Any, time_cap_grace: float, *, slot_resource: str | None,
                  pin_node: str | None) -> None:
    """Create the worker's actor (placement is Ray's business; this does not wait).

    ``slot_resource``: the actor holds ``worker.slots`` of it for its whole life, so Ray
    places it only where that many slots are free, two runs never oversubscribe a node,
    and a worker that cannot be placed is pending demand. ``pin_node``: instead, pin it
    to that node without a resource request (a one-node instance that declares no slots).

    Secrets are not given here: the key variables the worker's executor needs (the
    model's API key, named by ``model.api_key_env``) are handed to the started worker by
    :func:`await_ready`, as an argument of one actor call
    (:meth:`_RolloutWorkerShell.set_secrets`) -- never through Ray's runtime environment
    (which Ray logs) or the worker's environment, and never through the executor config,
    which is stored in the manifest."""
    opts: dict[str, Any] = {
        "max_concurrency": worker.slots + _CONTROL_CALLS,
        "max_restarts": 0,
    }
    if pin_node is not None:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(pin_node, soft=False)
    if slot_resource is not None:
        opts["resources"] = {slot_resource: worker.slots}
    worker.actor = RolloutWorker.options(**opts).remote(config_ref, worker.slots, time_cap_grace)


async def await_ready(worker: WorkerHandle, env: Mapping[str, str] | None = None,
                      run_budget: Any = None, call_journal: Any = None) -> str | None:
    """Wait until Ray placed the worker and it built its executor; no timeout, since
    a pending worker may wait for the autoscaler or for another run's slots. Returns the
    executor construction error (a config problem) or None. Raises RayError when the
    actor died first (its node was lost, or the pool cancelled it). ``env``: the key
    variables its executor needs, handed over once it is up; ``run_budget``: the run's
    budget counter, and ``call_journal``: the session's call journal, both handed over
    before any rollout reaches the worker."""
    info = await aget(worker.actor.ready.remote())
    if info["error"]:
        return info["error"]
    if env:
        await aget(worker.actor.set_secrets.remote(dict(env)))
    if run_budget is not None:
        await aget(worker.actor.set_run_budget.remote(run_budget))
    if call_journal is not None:
        await aget(worker.actor.set_call_journal.remote(call_journal))
    worker.node_id = info["node_id"]
    worker.label = node_label(info["node_id"], info.get("ip", ""))
    worker.ready = True
    return None


async def aget(ref: Any) -> Any:
    """Await an ObjectRef as a coroutine (what ``asyncio.wait_for`` wants)."""
    return await ref
