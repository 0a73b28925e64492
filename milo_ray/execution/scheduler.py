"""RolloutScheduler: runs (harness, task, rollout_idx) requests across the cluster.

The scheduler is the driver-side half of rollout execution (DESIGN §2). It owns:

* **dispatch** -- :class:`~milo_ray.execution.workers.RolloutWorker` async actors, each
  holding ``slots_per_worker`` of the Ray resource ``sandbox_slot``, asked for as the queue
  needs and released when idle (:class:`~milo_ray.execution.pool.WorkerPool`), so the
  autoscaler sees the demand and concurrent runs share nodes without oversubscribing them.
  :class:`~milo_ray.execution.dispatch.Dispatch` decides which queued request goes to which
  free slot (round-robin across groups, within each group's limit); batches go out in one
  actor call and outcomes come back in one long poll, with no batch barrier;
* **the cache** -- a request's identity is ``RolloutRequest.key(model_id)``; a key runs at most
  once per run: duplicates share one execution, finished keys (this process's or the store's
  on resume) are returned without executing (:class:`~milo_ray.execution.cache.ResultCache`);
* **the budget** -- the uncached part of a request batch is reserved on the
  :class:`~milo_ray.execution.budget.BudgetLedger` before anything starts
  (:class:`BudgetExceeded` otherwise) and committed as results arrive; once a token or
  cost cap is reached no queued rollout starts, and the gateways' shared counter stops
  the running ones' model calls (:mod:`~milo_ray.execution.spend`);
* **faults** -- an executor that raises, or a worker actor / node that dies, is an
  infrastructure failure: retried with exponential backoff on a new worker (each retry a
  ``rollout_retry`` event), recorded with ``error_kind="infra"`` after ``max_retries``
  (:mod:`~milo_ray.execution.outcomes`). Harness and task failures are scores, never retried;
* **recording** -- the driver is the store's single writer: it fills the bookkeeping
  fields and appends each batch of finished results (the store moves traces to blobs).

All driver state lives on one asyncio event loop; :meth:`RolloutScheduler.run` gives
synchronous callers a private loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable, Mapping

from ray.exceptions import RayError

from milo_ray.core.rollouts import RolloutRequest, RolloutResult
from milo_ray.core.tasks import Task
from milo_ray.execution.budget import BudgetExceeded, BudgetLedger
from milo_ray.execution.cache import ResultCache
from milo_ray.execution.cluster import SLOT_RESOURCE
from milo_ray.execution.dispatch import Dispatch, GroupLimits
from milo_ray.boundary.gateway.call_journal import SessionJournal
from milo_ray.execution.outcomes import RetryPolicy, attempt_error, fill_bookkeeping, infra_result, timed_out_result
from milo_ray.execution.pool import WorkerPool
from milo_ray.execution.progress import RolloutProgress
from milo_ray.execution.spend import SchedulerSpend
from milo_ray.execution.workers import Item, Outcome, WorkerHandle, aget

log = logging.getLogger(__name__)

# How long one worker poll may wait for a finished rollout before returning empty.
_POLL_WAIT_S = 1.0
# A poll that has not answered after this long means the worker's event loop is
# wedged (e.g. an executor blocking inside aexecute); the worker is then replaced.
_STALL_S = 300.0


@dataclass(eq=False)
class _Job:
    """One unique key on its way through the scheduler."""

    key: str
    request: RolloutRequest
    future: asyncio.Future
    ledger: BudgetLedger  # the ledger it was reserved on (the run budget or the uncounted one)
    attempts: int = 0
    item_id: int = -1
    # What the final attempt's gateway charged to the run's budget counter (tokens, USD).
    metered: tuple[int, float] = (0, 0.0)


class RolloutScheduler:
    """Runs rollouts on Ray, streams results into the store, caches, budgets, retries.

    ``executor_config`` is a ``_target_`` mapping (or a picklable executor object) that
    each worker builds once. ``tasks`` are the tasks requests may name. ``budget``
    defaults to an uncapped ledger; on construction it is charged with the rollouts
    already in ``store`` (resume). Each worker holds ``slots_per_worker`` (None:
    ``slots_per_node``; at most the smallest slot count a node declares) of the Ray
    resource ``slot_resource`` (``sandbox_slot``) while it lives, so concurrent
    schedulers on one cluster queue for the slots instead of oversubscribing the
    sandboxes; at most ``max_workers`` workers (None: as many as the queue fills), each
    released after ``worker_idle_s`` without a rollout. A one-node Ray instance that
    declares no slots runs ``slots_per_node`` rollouts there; a locally started one
    declares ``slots_per_node`` (see :mod:`~milo_ray.execution.pool` for the rules).
    ``group_limits`` caps rollouts in flight per ``RolloutRequest.group``
    (``default_group_limit`` for unlisted groups; None = only the slots limit); change
    them later with :meth:`set_group_limit`.
    ``max_retries`` infrastructure retries per rollout, the n-th after
    ``retry_backoff_s * 2**(n-1)`` seconds, and ``max_harness_retries`` for all the rollouts
    of one harness over the run (None: no such bound). A rollout running longer than
    ``task.time_cap_s * time_cap_grace + task.grading_cap_s`` is cancelled and recorded ``timed_out``.
    ``progress``: None = live line on a TTY, False = quiet, or a ``RolloutProgress``.
    ``address`` is used to connect only when Ray is not initialised yet.
    ``usd_per_mtok``: (input, output) USD per million tokens; it prices every result
    whose executor reported no cost of its own (None: such results cost 0).
    ``worker_env``: variables each rollout worker is handed by an actor call as it comes up
    (the model gateway's keys; see :func:`~milo_ray.execution.workers.await_ready`).
    ``sweep_budget``: (ledger name, USD cap) of the sweep this run is a job of
    (``run.budget.sweep``): its gateways also reserve on and charge that shared ledger.
    """

    def __init__(
        self,
        executor_config: Any,
        tasks: Mapping[str, Task] | Iterable[Task],
        store: Any,
        model_id: str,
        run_id: str,
        budget: BudgetLedger | None = None,
        *,
        slots_per_node: int = 8,
        group_limits: Mapping[str, int] | None = None,
        default_group_limit: int | None = None,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
        max_harness_retries: int | None = 10,
        time_cap_grace: float = 1.25,
        progress: bool | RolloutProgress | None = None,
        address: str | None = None,
        slot_resource: str = SLOT_RESOURCE,
        slots_per_worker: int | None = None,
        max_workers: int | None = None,
        worker_idle_s: float = 60.0,
        usd_per_mtok: tuple[float, float] | None = None,
        worker_env: Mapping[str, str] | None = None,
        sweep_budget: tuple[str, float] | None = None,
    ) -> None:
        self.executor_config = executor_config
        self.tasks: dict[str, Task] = dict(tasks) if isinstance(tasks, Mapping) else {t.task_id: t for t in tasks}
        self.store = store
        self.model_id = model_id
        self.run_id = run_id
        # The run's budget, the uncounted ledger of count_budget=False batches and the
        # gateways' shared counter.
        self.spend = SchedulerSpend(budget if budget is not None else BudgetLedger(), executor_config, store,
                                    sweep=sweep_budget)
        self.budget, self.uncounted = self.spend.budget, self.spend.uncounted
        self._dispatch: Dispatch[_Job] = Dispatch(default_group_limit, group_limits)
        self.retry = RetryPolicy(max_retries, float(retry_backoff_s), max_harness_retries)
        if time_cap_grace < 1.0:
            raise ValueError(
                f"RolloutScheduler: time_cap_grace={time_cap_grace!r} must be >= 1 (it multiplies task.time_cap_s)"
            )
        self.time_cap_grace = float(time_cap_grace)
        self.progress = progress if isinstance(progress, RolloutProgress) else RolloutProgress(enabled=progress)
        if usd_per_mtok is not None and (len(usd_per_mtok) != 2 or min(usd_per_mtok) < 0):
            raise ValueError(f"RolloutScheduler: usd_per_mtok={usd_per_mtok!r} must be (input, output) prices >= 0")
        self.usd_per_mtok = usd_per_mtok
        # The run's AgentCallLog (set by the entry point): the model calls a real rollout
        # made are recorded there (role "solver") before the rollout itself is stored.
        self.agent_calls: Any = None
        self._journal = SessionJournal(store, executor_config)

        self._harnesses: dict[str, Any] = {}
        self._pool = WorkerPool(executor_config, self._harnesses, slots_per_node=slots_per_node,
                                slots_per_worker=slots_per_worker, max_workers=max_workers,
                                slot_resource=slot_resource, time_cap_grace=self.time_cap_grace, address=address,
                                worker_env=worker_env, worker_idle_s=worker_idle_s)
        self._pool.on_ready = self._pump
        self._pool.on_fatal = self._abandon_pending
        self._pool.on_released = lambda worker: self.store.event(
            "rollout_worker_released", {"node": worker.label, "worker": worker.key, "idle_s": self._pool.worker_idle_s})
        self._workers = self._pool.workers  # worker key -> WorkerHandle, the rollouts in flight there
        self._cache = ResultCache(store)
        # Resume: rollouts stored before this scheduler existed were spent already.
        self.budget.restore_from_rollouts(store.read("rollouts"))

        self._items = itertools.count()
        self._jobs: dict[str, _Job] = {}  # key -> unfinished job (queued, in flight or backing off)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # --- public API -------------------------------------------------------------------
    @property
    def group_limits(self) -> GroupLimits:
        """The groups with a limit of their own (read-only: use :meth:`set_group_limit`)."""
        return self._dispatch.limits

    @property
    def default_group_limit(self) -> int | None:
        return self._dispatch.default_limit

    def set_group_limit(self, group: str, limit: int | None) -> None:
        """Cap ``group`` at ``limit`` rollouts in flight (None: back to
        ``default_group_limit``). Takes effect at once: a raised limit starts queued
        rollouts now, a lowered one lets those in flight finish and starts no more
        until the group is under it."""
        if not isinstance(group, str):
            raise ValueError(f"RolloutScheduler.set_group_limit: group={group!r} must be a string")
        self._dispatch.set_limit(group, limit)
        if _loop_running() and asyncio.get_running_loop() is self._loop:
            self._pump()

    def recover_calls(self) -> int:
        """Record the journaled model calls :attr:`agent_calls` lacks, each once (see
        :mod:`~milo_ray.boundary.gateway.call_journal`); the entry point calls it on resume."""
        return self._journal.recover(self.agent_calls, self.model_id)

    def add_harness(self, harness: Any) -> None:
        """Make a harness known (before any request names it); shipped to each worker once."""
        hid = harness.harness_id
        if hid not in self._harnesses:
            self._harnesses[hid] = harness

    def add_tasks(self, tasks: Iterable[Task]) -> None:
        """Make more tasks known (e.g. a curriculum revision); shipped to workers on first use."""
        for t in tasks:
            self.tasks[t.task_id] = t

    def cached(self, request: RolloutRequest) -> RolloutResult | None:
        """The finished result for this request's key, from this run or the store, else None
        (infrastructure failures are not cached: they run again when requested again)."""
        return self._cache.get(request.key(self.model_id))

    async def arun(self, requests: Iterable[RolloutRequest], *, count_budget: bool = True) -> list[RolloutResult]:
        """Results in request order. Raises :class:`BudgetExceeded` before starting
        anything if the uncached part does not fit the execution budget, or after
        in-flight work settled if a token/cost cap stopped the batch midway (queued
        rollouts dropped, or running ones stopped at the gateway: ``partial`` then holds
        every result, the stopped ones included).

        ``count_budget=False`` runs the batch outside the run's budget (e.g. a final
        test-split evaluation); its spend is tallied on ``uncounted`` instead."""
        futures = await self._submit(list(requests), count_budget)
        if futures:
            await asyncio.wait(set(futures))
        return self._collect(futures, count_budget)

    async def astream(
        self, requests: Iterable[RolloutRequest], *, count_budget: bool = True
    ) -> AsyncIterator[RolloutResult]:
        """Yield one result per request, in completion order (cached ones first)."""
        futures = await self._submit(list(requests), count_budget)
        count: Counter[asyncio.Future] = Counter(futures)
        ready: asyncio.Queue[asyncio.Future] = asyncio.Queue()
        for fut in count:
            fut.add_done_callback(ready.put_nowait)
        failure: BaseException | None = None
        for _ in range(len(count)):
            fut = await ready.get()
            if fut.exception() is not None:
                failure = failure or fut.exception()
                continue
            if failure is None:
                failure = self.spend.stopped_midway(fut.result().cache_key, count_budget)
            for _ in range(count[fut]):
                yield fut.result()
        if failure is not None:
            raise failure

    def run(self, requests: Iterable[RolloutRequest], *, count_budget: bool = True) -> list[RolloutResult]:
        """Synchronous :meth:`arun` on the scheduler's private event loop."""
        if _loop_running():
            raise RuntimeError(
                "RolloutScheduler.run() was called from inside a running event loop; "
                "use `await scheduler.arun(requests)` (or `async for r in scheduler.astream(requests)`) there"
            )
        if self._own_loop is None or self._own_loop.is_closed():
            self._own_loop = asyncio.new_event_loop()
        return self._own_loop.run_until_complete(self.arun(requests, count_budget=count_budget))

    def worker_actors(self) -> dict[str, Any]:
        """Ready worker actor handles by ``node-label/worker-key`` (diagnostics and fault injection)."""
        return self._pool.actors()

    def close(self) -> None:
        """Stop the workers and the progress display. The store stays open (the caller owns it)."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()
        self.spend.stop_counter()
        self._journal.finish(self.agent_calls, self.model_id)
        self.progress.close()
        if self._own_loop is not None and not self._own_loop.is_closed():
            self._own_loop.close()

    def __enter__(self) -> "RolloutScheduler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- submission -------------------------------------------------------------------
    async def _submit(self, requests: list[RolloutRequest], count_budget: bool = True) -> list[asyncio.Future]:
        if self._closed:
            raise RuntimeError("RolloutScheduler is closed")
        loop = self._bind_loop()
        for r in requests:
            if r.harness_id not in self._harnesses:
                raise ValueError(f"request names harness {r.harness_id!r}, unknown: call add_harness(harness) first")
            if r.task_id not in self.tasks:
                raise ValueError(f"request names task {r.task_id!r}, which is not in the scheduler's tasks")
        keys = [r.key(self.model_id) for r in requests]
        self._cache.load(keys)
        new: dict[str, RolloutRequest] = {}
        for k, r in zip(keys, requests):
            if k not in self._cache and k not in self._jobs and k not in new:
                new[k] = r
        # Reserve the whole uncached part atomically, before any await: nothing starts
        # unless all of it fits, and concurrent callers cannot double-book a key.
        ledger = self.spend.ledger(count_budget)
        ledger.reserve(len(new))
        for k, r in new.items():
            job = _Job(k, r, loop.create_future(), ledger)
            self._jobs[k] = job
            self._dispatch.submit(r.group, job)
        self.progress.add(len(new), n_cached=sum(1 for k in keys if k in self._cache))
        futures: list[asyncio.Future] = []
        for k in keys:
            if k in self._cache:
                fut = loop.create_future()
                fut.set_result(self._cache[k])
            else:
                fut = self._jobs[k].future
            futures.append(fut)
        if new:
            try:
                await self._pool.ensure_started()
                # Each worker is handed the run's counter and the session's journal as it comes up.
                self._pool.run_budget = self.spend.start_counter()
                self._pool.call_journal = self._journal.start()
            except BaseException as exc:
                self._abandon_pending(exc)
                raise
            self._pump()
        return futures

    def _collect(self, futures: list[asyncio.Future], count_budget: bool = True) -> list[RolloutResult]:
        partial: dict[int, RolloutResult] = {}
        stop: BaseException | None = None
        for i, fut in enumerate(futures):
            exc = fut.exception()
            if exc is None:
                partial[i] = fut.result()
                stop = stop or self.spend.stopped_midway(partial[i].cache_key, count_budget)
            elif not isinstance(exc, BudgetExceeded):
                raise exc
            else:
                stop = stop or exc
        if stop is not None:
            raise BudgetExceeded(f"{stop} ({len(partial)} of {len(futures)} requests finished)", partial=partial)
        return [partial[i] for i in range(len(futures))]

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._jobs:
                raise RuntimeError(
                    "RolloutScheduler has rollouts in flight on another event loop; "
                    "drive one scheduler from one loop at a time"
                )
            self._loop = loop
            self._pool.bind_loop(loop)
        return loop

    # --- workers ----------------------------------------------------------------------
    def _lose_worker(self, worker: WorkerHandle, exc: BaseException) -> None:
        """The worker died or wedged (or its node is gone): its rollouts become
        infrastructure failures; the queue asks Ray for a new worker wherever slots are."""
        self._pool.retire(worker)
        jobs = list(worker.inflight.values())
        worker.inflight.clear()
        for job in jobs:
            self._dispatch.done(job.request.group)
        self.store.event("rollout_worker_lost", {"node": worker.label, "worker": worker.key, "error": repr(exc),
                                                 "in_flight": len(jobs)})
        self._record([r for job in jobs if (r := self._infra_failure(job, f"worker lost: {exc!r}", worker)) is not None])
        if not self._pool.can_place():
            self._abandon_pending(RuntimeError("every node with sandbox slots is gone; no rollout can run"))
        self._pump()

    # --- dispatch ---------------------------------------------------------------------
    def _pump(self) -> None:
        """Send the jobs the dispatch rules pick for the free slots, one batch per
        worker, then size the pool to what is in flight and could start."""
        if self._closed:
            return
        while True:
            picks = self._dispatch.pick(self._pool.free_slots())
            if not picks:
                break
            batches: dict[str, list[_Job]] = {}
            dropped = False
            for key, job in picks:
                # A rollout whose verifier calls the grader waits on that role's cap too.
                refused = self.agent_calls and self.agent_calls.grader_refusal(self.tasks.get(job.request.task_id))
                if job.ledger.spend_exhausted() or refused:
                    # Its slot is offered again on the next pass.
                    self._dispatch.done(job.request.group)
                    self._drop(job, BudgetExceeded(refused or "token/cost budget spent; no new rollouts start"))
                    dropped = True
                    continue
                job.item_id = next(self._items)
                job.attempts += 1
                self._workers[key].inflight[job.item_id] = job
                batches.setdefault(key, []).append(job)
            for key, jobs in batches.items():
                self._send(self._workers[key], jobs)
            if not dropped:
                break
        in_flight = sum(len(w.inflight) for w in self._workers.values())
        self._pool.scale(in_flight + self._dispatch.runnable())

    def _send(self, node: WorkerHandle, jobs: list[_Job]) -> None:
        items: list[Item] = [(j.item_id, j.request.harness_id, j.request.task_id, j.request.rollout_idx,
                              j.request.seed) for j in jobs]
        node.idle_since = None
        self._pool.ship(node, items, self.tasks, unbudgeted=[j.item_id for j in jobs if not self.spend.counts(j.ledger)])
        self.progress.started(len(jobs))
        if node.poller is None or node.poller.done():
            node.poller = asyncio.ensure_future(self._poll(node))
            node.poller.add_done_callback(self._poller_done)

    async def _poll(self, node: WorkerHandle) -> None:
        """The worker's only poller: long-polls it while rollouts are in flight there;
        a worker that dies or wedges is given up (its rollouts are retried elsewhere)."""
        while node.inflight and node.actor is not None:
            actor = node.actor
            try:
                outcomes = await asyncio.wait_for(aget(actor.poll.remote(_POLL_WAIT_S)), _POLL_WAIT_S + _STALL_S)
            except (RayError, asyncio.TimeoutError) as exc:
                if node.actor is actor:
                    self._lose_worker(node, exc)
                return
            if node.actor is not actor:
                return  # given up meanwhile: its rollouts were already settled as failures
            self._on_outcomes(node, outcomes)
            self._pump()  # slots freed by retried rollouts
        self._pool.idle(node)

    def _poller_done(self, task: asyncio.Task) -> None:
        # A poller only ends by exception on a scheduler bug (or a worker that cannot be
        # replaced); fail the waiting callers loudly instead of leaving them to wait
        # forever, and leave no state behind: reservations go back to the ledger, the
        # keys can be requested again.
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        # The callers re-raise exc with its traceback; the log only says it happened.
        log.error("rollout poller failed: %s: %s", type(exc).__name__, exc)
        for node in self._workers.values():
            for job in node.inflight.values():
                self._dispatch.done(job.request.group)
            node.inflight.clear()
        self._dispatch.clear()
        for job in list(self._jobs.values()):
            # One exception object per caller: sharing one would grow its traceback
            # with every caller that re-raises it.
            self._drop(job, RuntimeError(f"the rollout poller failed: {type(exc).__name__}: {exc}"))

    # --- outcomes ---------------------------------------------------------------------
    def _on_outcomes(self, node: WorkerHandle, outcomes: list[Outcome]) -> None:
        finished: list[RolloutResult] = []
        for o in outcomes:
            job = node.inflight.pop(o.item_id, None)
            if job is None:
                continue
            self._dispatch.done(job.request.group)
            if o.run_budget_refused is not None and self.spend.counts(job.ledger):
                self.spend.counter_refused(job.key, o.run_budget_refused, has_result=o.result is not None)
            infra_error = attempt_error(o)
            job.metered = (0, 0.0)
            if infra_error is not None:
                self._failed_attempt_calls(job, o.model_calls, o.metered)
                result = self._infra_failure(job, infra_error, node)
                if result is None:
                    continue
            elif o.capped:
                # Its calls were charged at the gateway; the timed-out result carries none.
                job.metered = o.metered
                result = timed_out_result(job.request, self.tasks[job.request.task_id], o, self.time_cap_grace)
            else:
                result = o.result
                job.metered = o.metered
            finished.append(self._fill(job, result, node, o.started_at, o.finished_at))
        self._record(finished)

    def _failed_attempt_calls(self, job: _Job, calls: list[dict[str, Any]],
                              metered: tuple[int, float] = (0, 0.0)) -> None:
        """The model calls of an attempt that failed: paid for, but no stored result will
        carry them. They are charged to the run's budget and recorded (role solver).
        ``metered``: what the attempt's gateway already charged to the run's counter."""
        if not calls:
            return
        self.spend.charge_failed_attempt(job.ledger, calls, metered)
        if self.agent_calls is not None:
            r = job.request
            self.agent_calls.record_solver_calls(
                calls, cache_key=job.key, harness_id=r.harness_id, round=r.round,
                failed_attempt="counted" if self.spend.counts(job.ledger) else "uncounted")

    def _infra_failure(self, job: _Job, error: str, node: WorkerHandle) -> RolloutResult | None:
        """Schedule a retry (None) or, past the limit, build the final infra result."""
        r = job.request
        delay = self.retry.backoff(job.attempts, r.harness_id)
        if delay is not None:
            self.store.event(
                "rollout_retry",
                {
                    "cache_key": job.key,
                    "task_id": r.task_id,
                    "rollout_idx": r.rollout_idx,
                    "attempt": job.attempts,
                    "error": error,
                    "node": node.label,
                    "backoff_s": delay,
                },
                round=r.round,
                harness_id=r.harness_id,
            )
            self.progress.retried()
            assert self._loop is not None
            self._loop.call_later(delay, self._requeue, job)
            return None
        now = time.time()
        return self._fill(job, infra_result(r, job.attempts, error, self.retry), node, now, now)

    def _requeue(self, job: _Job) -> None:
        if job.future.done():
            return
        self._dispatch.requeue(job.request.group, job)
        self._pump()

    def _fill(self, job: _Job, result: RolloutResult, node: WorkerHandle, started: float, finished: float) -> RolloutResult:
        r = job.request
        return fill_bookkeeping(
            result, r, run_id=self.run_id, split=r.split or self.tasks[r.task_id].split, node=node.label,
            started=started, finished=finished, cache_key=job.key, attempts=job.attempts,
            budgeted=self.spend.counts(job.ledger), usd_per_mtok=self.usd_per_mtok,
        )

    def _record(self, results: list[RolloutResult]) -> None:
        """Settle the budget, refill the freed slots, store the batch (single writer),
        then hand the results to their callers."""
        if not results:
            return
        for res in results:
            job = self._jobs[res.cache_key]
            job.ledger.commit(tokens=res.input_tokens + res.output_tokens, cost_usd=res.cost_usd or 0.0,
                              metered=job.metered)
        # Dispatch before writing: the next submission is on the critical path of every
        # wave of rollouts, the store write is not.
        self._pump()
        # The store moves each trace into a blob and sets trace_ref on the result in place.
        try:
            if self.agent_calls is not None:
                for res in results:
                    self.agent_calls.record_rollout_calls(res)
            self.store.append_rollouts(results)
        except Exception as exc:
            # Executed (and charged) but not stored: the callers get the store's error;
            # the poller and every other rollout go on.
            log.error("storing %d rollout results failed: %s: %s", len(results), type(exc).__name__, exc)
            for res in results:
                job = self._jobs.pop(res.cache_key)
                if not job.future.done():
                    error = RuntimeError(f"storing the rollout result failed: {exc}")
                    error.__cause__ = exc  # the entry point tells a full disk from a crash by it
                    job.future.set_exception(error)
            return
        for res in results:
            self.progress.finished(res)
            # An infra failure is returned to its callers but not cached: a later request
            # (or a resume) runs it again, as the store's completed_keys() implies.
            self._cache.add(res)
            job = self._jobs.pop(res.cache_key)
            if not job.future.done():
                job.future.set_result(res)

    def _abandon_pending(self, exc: BaseException) -> None:
        """Fail every job that is not in flight (queued or waiting out a retry backoff)."""
        self._dispatch.clear()
        inflight = {id(j) for n in self._workers.values() for j in n.inflight.values()}
        for job in [j for j in self._jobs.values() if id(j) not in inflight]:
            self._drop(job, exc)

    def _drop(self, job: _Job, exc: BaseException) -> None:
        """A job that will not run (again): its reservation is given back."""
        self._jobs.pop(job.key, None)
        job.ledger.release(1)
        self.progress.dropped()
        if not job.future.done():
            job.future.set_exception(exc)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
