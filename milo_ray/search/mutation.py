"""One mutation, run the same way for every method: MILO's mutator pool, MILO's graft
and SSR's candidate generation all go through this module.

What one mutation is:

1. the agent is built from its ``_target_`` spec once per process and run session
   (``scope``) and reused for every mutation that process serves in that session (an
   LLM agent holds its client, connection pool and rate limiter; building one per call
   would throw them away). Agents are shared by the threads of a process, so their
   ``mutate``/``graft`` must be re-entrant;
2. the agent runs under the time cap (see "Time caps" below);
3. the child is read back: returned by the agent, or written to
   ``request.workdir/harness.py`` (plus extra files; a stale ``harness.py`` left in a
   reused workdir is removed before the call);
4. a child identical to the parent is rejected; any other child is validated in a
   fresh subprocess (:func:`milo_ray.harness.validate.validate`);
5. the outcome carries the child (also when invalid: MILO records rejected children),
   the reason it cannot be used, the agent's report and its :class:`AgentUsage`.

Nothing here raises for a bad agent or a bad child: a failure is an outcome.

Time caps. On Ray (:func:`run_mutation_async`, :func:`run_mutations`) the body is a
streaming task that reports when it starts and when the agent has answered; the
caller's clock starts when the task starts (not while it waits for a CPU), and an
agent still working at the cap has its task cancelled with ``force=True``, which
ends the worker process and with it the hung agent and anything it was still
spending (that spend is unknown: the outcome's ``cost_usd`` is None). Validation
then has its own limit. Without Ray (:func:`run_mutation` called directly, or
:func:`run_mutations` with ``use_ray=False``) the agent runs in a daemon thread
joined with the cap; past it the call is abandoned and the agent forgotten, but the
thread runs on until the agent returns (nothing in-process can stop it).

Files on other nodes: the request names paths on the driver's filesystem (parent
harness, evidence directory, paths in its context, lineage files its memory names).
On Ray the driver packs them into one content-addressed tree in the object store
(:class:`ShippedFiles`, :mod:`milo_ray.boundary.shipping`); the worker reads them from
its node's cache of unpacked trees, works in a private copy of the workdir, and sees
the request, its memory text and its context rewritten to those paths. No worker reads a
driver path or writes into the run directory: the child travels back as content, and what
the agent wrote in and beside the workdir comes back for the caller to keep there
(:func:`keep_artifacts`), so a re-draw finds it as on one machine.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from milo_ray.llm.client import use_secrets
from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.llm.usage import AgentUsage
from milo_ray.boundary.gateway.role_journal import RoleCallTicket, journaling
from milo_ray.boundary.shipping import ShippingError
from milo_ray.harness.model import ENTRY_FILE, Harness
from milo_ray.harness.validate import sandbox_factory_from, validate
from milo_ray.search.agent_cache import agent_for, build_agent, forget_agent  # noqa: F401 (build_agent: its callers' import)
from milo_ray.search.mutation_files import ShippedFiles, _artifacts, keep_artifacts, ship_files

# After the cap (agent) or the validation limit, a Ray caller waits this much longer
# for the task's own answer before it cancels the task: process start-up and result
# transfer are not the agent's time.
GRACE_S = 10.0


@dataclass(frozen=True)
class ValidationOptions:
    """How children are validated: forbidden fragments (task ids and instruction
    texts; see ``harness.validate``), the subprocess's wall-clock limit, and the
    entry function children must define (``build_agent`` for agent harnesses,
    ``optimize`` for optimizer programs)."""

    forbidden: tuple[str, ...] = ()
    timeout_s: float = 60.0
    enabled: bool = True
    entry: str = "build_agent"
    # The run's ``sandbox`` config (a plain mapping): the import check runs in that kind of
    # sandbox (see harness.validate.sandbox_factory_from); None: the default (bwrap).
    sandbox: Any = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class MutationOutcome:
    """The result of one mutation.

    child: the agent's output read back (also when it failed validation: MILO keeps
        rejected children in its lineage); None when there is none.
    error: why there is no child (agent crashed, timed out, produced nothing).
    validation_error: why the child cannot be used (identical to the parent, or the
        validator's one-line reason).
    """

    child: Harness | None
    error: str | None = None
    validation_error: str | None = None
    report: str = ""
    usage: AgentUsage = AgentUsage()
    # Files a shipped mutation's agent wrote in its workdir (``/<path>``) and beside it
    # (transcripts, prompts: ``<workdir>.transcript.json`` ... by suffix), carried back
    # for the caller to keep where the run keeps the workdir (:func:`keep_artifacts`).
    artifacts: dict[str, bytes] = field(default_factory=dict)
    # Whether ``usage`` is the agent's own account of its model calls. False when the agent
    # ended without one (timed out, crashed, lost with its worker): what those calls cost is
    # known only from the journal (:mod:`~milo_ray.boundary.gateway.role_journal`).
    metered: bool = False

    @property
    def ok(self) -> bool:
        return self.child is not None and self.error is None and self.validation_error is None

    @property
    def reason(self) -> str | None:
        """One line saying why the child is rejected (None when it is usable)."""
        if self.error is not None:
            return self.error
        if self.child is None:
            return "no child"
        return None if self.validation_error is None else f"validation: {self.validation_error}"


def failed(why: str, seconds: float) -> MutationOutcome:
    """An outcome without a child whose agent spend is unknown (timed out, lost)."""
    return MutationOutcome(None, error=why, usage=AgentUsage(cost_usd=None, seconds=seconds, error=why))


# --------------------------------------------------------------------------- the body

def run_mutation(spec: Any, request: MutationRequest, *, time_cap_s: float | None,
                 validation: ValidationOptions | None = None, call: str = "mutate",
                 shipped: ShippedFiles | None = None, scope: str | None = None,
                 ticket: RoleCallTicket | None = None) -> MutationOutcome:
    """Run one mutation in this process (see the module docstring). ``call`` names the
    agent method: ``mutate`` (mutators, SSR's optimizer) or ``graft`` (MILO's
    orchestrator). ``time_cap_s`` None: no in-process cap (the Ray caller enforces it).
    ``scope``: whose agents to reuse (a run session; see :func:`agent_for`).
    ``ticket``: journal the agent's model calls under it (None: not journaled)."""
    steps = _mutation_steps(spec, request, time_cap_s=time_cap_s, validation=validation, call=call, shipped=shipped,
                            scope=scope, ticket=ticket)
    return keep_artifacts(request, [x for x in steps if isinstance(x, MutationOutcome)][-1])


def _mutation_steps(spec: Any, request: MutationRequest, *, time_cap_s: float | None,
                    validation: ValidationOptions | None, call: str,
                    shipped: ShippedFiles | None, scope: str | None = None,
                    ticket: RoleCallTicket | None = None) -> Iterator[Any]:
    """The body as steps: ``"started"``, ``"answered"`` (the agent is done; validation
    follows), then the :class:`MutationOutcome`."""
    yield "started"
    t0 = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="milo-ray-mutation-")) if shipped is not None else None
    try:
        if shipped is not None:
            try:
                request = shipped.unpack(request, scratch)
            except ShippingError as e:
                why = f"the mutation's files did not arrive: {e}"[:2000]
                yield MutationOutcome(None, error=why, usage=AgentUsage(cost_usd=0.0, error=why))
                return
        for out in _steps_here(spec, request, time_cap_s=time_cap_s, validation=validation, call=call, scope=scope,
                               t0=t0, ticket=ticket):
            if isinstance(out, MutationOutcome) and scratch is not None:
                out = replace(out, artifacts=_artifacts(Path(request.workdir)))
            yield out
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _steps_here(spec: Any, request: MutationRequest, *, time_cap_s: float | None, validation: ValidationOptions | None,
                call: str, scope: str | None, t0: float, ticket: RoleCallTicket | None = None) -> Iterator[Any]:
    """The mutation itself, on files of this machine."""
    workdir = Path(request.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / ENTRY_FILE).unlink(missing_ok=True)  # a re-draw reuses the workdir: no stale child
    res, error = _call_with_cap(spec, request, call, time_cap_s, scope, ticket)
    seconds = time.monotonic() - t0
    yield "answered"
    if error is not None:
        yield MutationOutcome(None, error=error, usage=AgentUsage(cost_usd=None, seconds=seconds, error=error))
        return
    usage = res.usage.with_seconds(seconds)
    child, error = _read_child(res, request)
    if error is not None:
        yield MutationOutcome(None, error=error, report=res.report, usage=usage.with_error(error), metered=True)
        return
    verdict = _validate(child, request.parent, validation or ValidationOptions())
    yield MutationOutcome(child, validation_error=verdict, report=res.report, usage=usage, metered=True)


def _call_with_cap(spec: Any, request: MutationRequest, call: str, time_cap_s: float | None,
                   scope: str | None, ticket: RoleCallTicket | None = None) -> tuple[MutationResult | None, str | None]:
    """The agent's answer, or why there is none."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            with journaling(ticket):
                box["res"] = getattr(agent_for(spec, scope), call)(request)
        except BaseException as e:  # an agent crash is a rejected child, never a crashed run
            box["exc"] = e

    if time_cap_s is None:
        target()
    else:
        worker = threading.Thread(target=target, name=f"mutation-{call}", daemon=True)
        worker.start()
        worker.join(time_cap_s)
        if worker.is_alive():
            forget_agent(spec, scope)
            return None, f"timed out after {time_cap_s:g}s"
    who = "graft" if call == "graft" else "mutator"
    if "exc" in box:
        e = box["exc"]
        return None, f"{who} crashed: {type(e).__name__}: {e}"[:2000]
    res = box.get("res")
    if not isinstance(res, MutationResult):
        return None, f"{who} returned {type(res).__name__}, not MutationResult"
    return res, None


def _read_child(res: MutationResult, request: MutationRequest) -> tuple[Harness | None, str | None]:
    if res.error is not None:
        return None, res.error
    if res.child is not None:
        return res.child, None
    # The protocol allows writing the child into the workdir instead of returning it.
    if (Path(request.workdir) / ENTRY_FILE).is_file():
        try:
            name = str(request.context.get("child_name") or "")
            return Harness.from_dir(request.workdir, name=name), None
        except Exception as e:
            return None, f"invalid output in workdir: {e}"[:2000]
    return None, "mutator produced no child"


# Validation is a pure function of the harness content and the options, and a
# subprocess start costs seconds; agents often re-propose an identical child, so
# definite verdicts are remembered per process (a timeout or a crash of the
# validator may be load, not the child: those are not remembered).
_VERDICTS: dict[tuple[str, tuple[str, ...], float, str], str | None] = {}
_VERDICTS_LOCK = threading.Lock()
_TRANSIENT_CHECKS = ("timeout", "crash")


def _validate(child: Harness, parent: Harness, options: ValidationOptions) -> str | None:
    if child.harness_id == parent.harness_id:
        return "duplicate: identical to the parent"
    if not options.enabled:
        return None
    key = (child.harness_id, tuple(options.forbidden), float(options.timeout_s), options.entry,
           json.dumps(options.sandbox, sort_keys=True, default=str))
    with _VERDICTS_LOCK:
        if key in _VERDICTS:
            return _VERDICTS[key]

    v = validate(child, forbidden_fragments=options.forbidden, timeout_s=options.timeout_s, entry=options.entry,
                 sandbox=_validation_sandbox(options.sandbox))
    verdict = None if v.ok else v.reason
    if v.check not in _TRANSIENT_CHECKS:
        with _VERDICTS_LOCK:
            _VERDICTS[key] = verdict
    return verdict


_SANDBOXES: dict[str, Any] = {}
_SANDBOXES_LOCK = threading.Lock()


def _validation_sandbox(node: Any) -> Any:
    """The sandbox factory for ``node`` (the run's sandbox config), built once per process."""
    if node is None:
        return None
    key = json.dumps(node, sort_keys=True, default=str)
    with _SANDBOXES_LOCK:
        if key not in _SANDBOXES:
            _SANDBOXES[key] = sandbox_factory_from(node)
        return _SANDBOXES[key]


# --------------------------------------------------------------------------- Ray callers

def _streaming_body(spec: Any, request: MutationRequest, validation: ValidationOptions | None, call: str,
                    shipped: ShippedFiles | None, scope: str | None, ticket: RoleCallTicket | None = None,
                    secrets: Mapping[str, str] | None = None) -> Iterator[Any]:
    with use_secrets(secrets):
        yield from _mutation_steps(spec, request, time_cap_s=None, validation=validation, call=call,
                                   shipped=shipped, scope=scope, ticket=ticket)


_remote_body: Any = None


def _remote(num_cpus: float, env: Mapping[str, str] | None) -> Any:
    """The body as a Ray task with these options. ``env``: variables the agent needs from
    the driver (its model's key), handed to the task as an argument (never through Ray's
    runtime_env, which Ray logs, nor the worker's environment; the agent reads them via
    :func:`milo_ray.llm.client.use_secrets`); never part of any stored config."""
    global _remote_body
    if _remote_body is None:
        import ray

        # No retries: a mutation is a paid agent call; a lost worker is a rejected child.
        _remote_body = ray.remote(max_retries=0)(_streaming_body)
    options: dict[str, Any] = {"num_cpus": num_cpus}
    return _WithSecrets(_remote_body.options(**options), dict(env or {}))


class _WithSecrets:
    """A remote function whose calls carry the driver's secrets as their last argument."""

    def __init__(self, fn: Any, secrets: dict[str, str]) -> None:
        self.fn, self.secrets = fn, secrets

    def remote(self, *args: Any) -> Any:
        return self.fn.remote(*args, self.secrets)


class _Flight:
    """One mutation in flight on Ray: its stream and the caller's deadlines."""

    def __init__(self, stream: Any, time_cap_s: float, validation: ValidationOptions | None) -> None:
        self.stream = stream
        self.cap = float(time_cap_s)
        self.validate_s = (validation or ValidationOptions()).timeout_s
        self.submitted = time.monotonic()
        self.started: float | None = None
        self.answered: float | None = None

    def deadline(self) -> float:
        """When the caller stops waiting: none while queued for a CPU; the cap once the
        agent runs; the validation limit once it answered."""
        if self.started is None:
            return float("inf")
        if self.answered is None:
            return self.started + self.cap + GRACE_S
        return self.answered + self.validate_s + GRACE_S

    def advance(self, item: Any) -> MutationOutcome | None:
        now = time.monotonic()
        if item == "started":
            self.started = now
        elif item == "answered":
            self.answered = now
        elif isinstance(item, MutationOutcome):
            return item
        return None

    def expired(self) -> MutationOutcome:
        """Cancel the task (ending its process) and say why."""
        import ray

        ray.cancel(self.stream, force=True)
        spent = time.monotonic() - (self.started or self.submitted)
        if self.answered is None:
            return failed(f"timed out after {self.cap:g}s", spent)
        return failed(f"validation did not finish within {self.validate_s:g}s", spent)


def _lost(e: BaseException, since: float) -> MutationOutcome:
    """The outcome of a mutation whose worker died (its child is rejected); ``since``: when
    its clock started (monotonic)."""
    return failed(f"mutation task failed: {type(e).__name__}: {e}"[:2000], time.monotonic() - since)


async def run_mutation_async(spec: Any, request: MutationRequest, *, time_cap_s: float,
                             validation: ValidationOptions | None = None, call: str = "mutate",
                             num_cpus: float = 1.0, shipped: ShippedFiles | None = None,
                             scope: str | None = None, env: Mapping[str, str] | None = None,
                             keep_files: bool = True, ticket: RoleCallTicket | None = None) -> MutationOutcome:
    """One mutation as a Ray task, awaited under the cap (see the module docstring).
    Cancelling the awaiting coroutine cancels the task too. ``env``: see :func:`_remote`.
    ``shipped``: the request's files packed by the caller (None: packed here).
    ``keep_files``: write the artifacts beside the workdir here (False: the outcome
    carries them, for a caller on another machine to :func:`keep_artifacts`). ``ticket``:
    journal the agent's model calls under it (:mod:`~milo_ray.boundary.gateway.role_journal`)."""
    if shipped is None:
        shipped = await asyncio.to_thread(ship_files, request)
    if _through_ray_client():
        out = await _relayed(spec, request, time_cap_s=time_cap_s, validation=validation, call=call,
                             num_cpus=num_cpus, shipped=shipped, scope=scope, env=env, ticket=ticket)
        return keep_artifacts(request, out) if keep_files else out
    flight = _Flight(_remote(num_cpus, env).remote(spec, request, validation, call, shipped, scope, ticket),
                     time_cap_s, validation)
    try:
        while True:
            timeout = flight.deadline() - time.monotonic()
            try:
                ref = await asyncio.wait_for(flight.stream.__anext__(), timeout=None if timeout == float("inf")
                                             else max(0.0, timeout))
                out = flight.advance(await ref)
            except asyncio.TimeoutError:
                return flight.expired()
            except StopAsyncIteration:
                return failed("mutation task ended without an outcome", time.monotonic() - flight.submitted)
            if out is not None:
                return keep_artifacts(request, out) if keep_files else out
    except asyncio.CancelledError:
        import ray

        ray.cancel(flight.stream, force=True)
        raise
    except Exception as e:  # the worker died: the child is rejected
        return _lost(e, flight.started or flight.submitted)


def _through_ray_client() -> bool:
    """Whether this process reaches Ray as a Ray Client (``ray://``), where a task's
    results cannot be streamed back as they come."""
    from ray.util.client import ray as client

    return client.is_connected()


def _on_the_cluster(spec: Any, request: MutationRequest, time_cap_s: float, validation: ValidationOptions | None,
                    call: str, num_cpus: float, shipped: ShippedFiles | None, scope: str | None,
                    env: Mapping[str, str] | None, ticket: RoleCallTicket | None) -> MutationOutcome:
    return asyncio.run(run_mutation_async(spec, request, time_cap_s=time_cap_s, validation=validation, call=call,
                                          num_cpus=num_cpus, shipped=shipped, scope=scope, env=env,
                                          keep_files=False, ticket=ticket))


_relay: Any = None


def _relay_task(spec: Any, request: MutationRequest, *, time_cap_s: float, validation: ValidationOptions | None,
                call: str, num_cpus: float, shipped: ShippedFiles | None, scope: str | None,
                env: Mapping[str, str] | None, ticket: RoleCallTicket | None) -> Any:
    """The reference of :func:`_on_the_cluster` submitted for one mutation."""
    global _relay
    import ray

    if _relay is None:
        _relay = ray.remote(num_cpus=0, max_retries=0)(_on_the_cluster)
    return _relay.remote(spec, request, time_cap_s, validation, call, num_cpus, shipped, scope, dict(env or {}),
                         ticket)


async def _relayed(spec: Any, request: MutationRequest, **kwargs: Any) -> MutationOutcome:
    """One mutation for a Ray Client driver: a task on the cluster (no CPU of its own)
    runs :func:`run_mutation_async` there, where the body's progress can stream and the
    cap is kept as on any other driver, and returns the outcome. Cancelling it cancels
    the body too (``ray.cancel`` is recursive)."""
    import ray

    ref = _relay_task(spec, request, **kwargs)
    started = time.monotonic()
    try:
        return await ref
    except asyncio.CancelledError:
        ray.cancel(ref, force=True)
        raise
    except Exception as e:  # the relay's worker died: the child is rejected
        return _lost(e, started)


def run_mutations(spec: Any, requests: Sequence[MutationRequest], *, time_cap_s: float,
                  validation: ValidationOptions | None = None, max_concurrent: int = 4, num_cpus: float = 1.0,
                  use_ray: bool | None = None, scope: str | None = None,
                  on_done: Callable[[int, MutationOutcome], None] | None = None,
                  env: Mapping[str, str] | None = None,
                  tickets: Sequence[RoleCallTicket | None] | None = None) -> list[MutationOutcome]:
    """Several mutations in parallel (Ray tasks when connected to Ray, else threads;
    ``use_ray`` forces the choice), each under the cap; outcomes in ``requests``
    order. ``on_done(i, outcome)`` is called on the caller's thread as each finishes.
    ``env``: see :func:`_remote` (threads share the driver's environment already).
    ``tickets``: one per request, the journal ticket of its agent call (None: none)."""
    if not requests:
        return []
    import ray

    tickets = list(tickets) if tickets is not None else [None] * len(requests)
    if len(tickets) != len(requests):
        raise ValueError(f"run_mutations: {len(tickets)} tickets for {len(requests)} requests")
    if not (ray.is_initialized() if use_ray is None else use_ray):
        return _run_in_threads(spec, requests, time_cap_s=time_cap_s, validation=validation,
                               max_concurrent=max_concurrent, on_done=on_done, scope=scope, tickets=tickets)
    if _through_ray_client():
        return _run_relayed(spec, requests, time_cap_s=time_cap_s, validation=validation,
                            max_concurrent=max_concurrent, num_cpus=num_cpus, scope=scope, on_done=on_done, env=env,
                            tickets=tickets)
    body = _remote(num_cpus, env)
    spec_ref = ray.put(spec)
    results: dict[int, MutationOutcome] = {}
    flights: dict[int, _Flight] = {}
    queue = list(enumerate(requests))

    def finish(i: int, out: MutationOutcome) -> None:
        out = results[i] = keep_artifacts(requests[i], out)
        flights.pop(i)
        if on_done is not None:
            on_done(i, out)

    while queue or flights:
        while queue and len(flights) < max_concurrent:
            i, req = queue.pop(0)
            flights[i] = _Flight(body.remote(spec_ref, req, validation, "mutate", ship_files(req), scope, tickets[i]),
                                 time_cap_s, validation)
        streams = [f.stream for f in flights.values()]
        wait_s = min(f.deadline() for f in flights.values()) - time.monotonic()
        ray.wait(streams, num_returns=1, timeout=None if wait_s == float("inf") else max(0.0, wait_s))
        ready, _ = ray.wait(streams, num_returns=len(streams), timeout=0)  # everything ready by now
        for i, f in list(flights.items()):
            if any(r is f.stream for r in ready):
                try:
                    out = f.advance(ray.get(next(f.stream)))
                except StopIteration:
                    out = failed("mutation task ended without an outcome", time.monotonic() - f.submitted)
                except Exception as e:  # the worker died: this child is lost, the others go on
                    out = _lost(e, f.started or f.submitted)
                if out is not None:
                    finish(i, out)
            elif time.monotonic() >= f.deadline():
                finish(i, f.expired())
    return [results[i] for i in range(len(requests))]


def _run_relayed(spec: Any, requests: Sequence[MutationRequest], *, time_cap_s: float,
                 validation: ValidationOptions | None, max_concurrent: int, num_cpus: float, scope: str | None,
                 on_done: Callable[[int, MutationOutcome], None] | None, env: Mapping[str, str] | None,
                 tickets: Sequence[RoleCallTicket | None]) -> list[MutationOutcome]:
    """:func:`run_mutations` for a Ray Client driver: each mutation relayed through a task
    on the cluster (:func:`_relayed`), at most ``max_concurrent`` at once."""
    import ray

    results: dict[int, MutationOutcome] = {}
    pending: dict[int, tuple[Any, float]] = {}
    queue = list(enumerate(requests))
    while queue or pending:
        while queue and len(pending) < max_concurrent:
            i, req = queue.pop(0)
            ref = _relay_task(spec, req, time_cap_s=time_cap_s, validation=validation, call="mutate",
                              num_cpus=num_cpus, shipped=ship_files(req), scope=scope, env=env, ticket=tickets[i])
            pending[i] = (ref, time.monotonic())
        ready, _ = ray.wait([ref for ref, _ in pending.values()], num_returns=1)
        done = {r.hex() for r in ready}
        for i, (ref, submitted) in list(pending.items()):
            if ref.hex() not in done:
                continue
            try:
                out = ray.get(ref)
            except Exception as e:  # the relay's worker died: this child is lost, the others go on
                out = _lost(e, submitted)
            del pending[i]
            out = results[i] = keep_artifacts(requests[i], out)
            if on_done is not None:
                on_done(i, out)
    return [results[i] for i in range(len(requests))]


def _run_in_threads(spec: Any, requests: Sequence[MutationRequest], *, time_cap_s: float,
                    validation: ValidationOptions | None, max_concurrent: int,
                    on_done: Callable[[int, MutationOutcome], None] | None,
                    scope: str | None, tickets: Sequence[RoleCallTicket | None]) -> list[MutationOutcome]:
    with ThreadPoolExecutor(max_workers=max(1, min(max_concurrent, len(requests)))) as pool:
        futs = [pool.submit(run_mutation, spec, r, time_cap_s=time_cap_s, validation=validation, scope=scope,
                            ticket=t) for r, t in zip(requests, tickets)]
        out = []
        for i, f in enumerate(futs):
            out.append(f.result())
            if on_done is not None:
                on_done(i, out[-1])
        return out
