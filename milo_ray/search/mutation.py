"""One mutation, run the same way for every method: MILO's mutator pool, MILO's graft
and SSR's candidate generation all go through :func:`run_mutation`.

What one mutation is (the body runs in a Ray task, or in a thread without Ray):

1. the agent is built from its ``_target_`` spec once per process and reused for
   every mutation that process serves (an LLM agent holds its client, connection pool
   and rate limiter; building one per call would throw them away);
2. the agent runs under the time cap; past it the call is abandoned and the child
   rejected with the reason (a Ray caller also cancels the task, which kills a hung
   agent's process);
3. the child is read back: returned by the agent, or written to
   ``request.workdir/harness.py`` (plus extra files);
4. a child identical to the parent is rejected; any other child is validated in a
   fresh subprocess (:func:`milo_ray.harness.validate.validate`);
5. the outcome carries the child (also when invalid: a method records it), the
   reason it cannot be used, the agent's report and its :class:`AgentUsage`.

Nothing here raises for a bad agent or a bad child: a failure is an outcome.

Files on other nodes: the request names paths on the driver's filesystem (parent
harness, evidence directory). When the cluster has more than one node, the
submitting side packs those directories into the object store
(:class:`ShippedFiles`) and a worker that cannot see the paths unpacks them into a
local directory first; on one machine (or a shared filesystem) paths are used as is.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.agents.usage import AgentUsage
from milo_ray.harness.model import ENTRY_FILE, Harness

# Past the cap a Ray caller waits this much longer for the task's own "timed out"
# outcome (which keeps the agent's usage) before it cancels the task outright.
CANCEL_GRACE_S = 10.0


@dataclass(frozen=True)
class ValidationOptions:
    """How children are validated: forbidden fragments (task ids and instruction
    texts; see ``harness.validate``) and the subprocess's wall-clock limit."""

    forbidden: tuple[str, ...] = ()
    timeout_s: float = 60.0
    enabled: bool = True


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
    node: str | None = None

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

    def as_result(self) -> MutationResult:
        """The agent-protocol view (child or error) with the usage."""
        u = self.usage
        return MutationResult(self.child if self.error is None else None, report=self.report, error=self.error,
                              input_tokens=u.input_tokens, output_tokens=u.output_tokens, seconds=u.seconds,
                              cost_usd=u.cost_usd, retries=u.retries)


# --------------------------------------------------------------------------- agents per process

_AGENTS: dict[str, Any] = {}
_AGENTS_LOCK = threading.Lock()


def _spec_key(spec: Any) -> str | None:
    if isinstance(spec, dict):
        return json.dumps(spec, sort_keys=True, default=str)
    return None


def agent_for(spec: Any) -> Any:
    """The agent of ``spec`` in this process: a ``_target_`` dict is built once and
    reused; an already built object is used as is."""
    key = _spec_key(spec)
    if key is None:
        if spec is None:
            raise ValueError("agent spec is missing (expected a `_target_` dict under backend.agents)")
        return spec
    with _AGENTS_LOCK:
        agent = _AGENTS.get(key)
        if agent is None:
            if "_target_" not in spec:
                raise ValueError(f"agent spec has no _target_ (keys: {sorted(spec)}); see conf/backend/*.yaml")
            from hydra.utils import instantiate

            agent = _AGENTS[key] = instantiate({k: v for k, v in spec.items() if k != "name"}
                                               if _takes_no_name(spec) else spec, _convert_="all")
        return agent


def _takes_no_name(spec: dict[str, Any]) -> bool:
    """Pool specs may carry a display ``name`` their class does not accept."""
    if "name" not in spec:
        return False
    import inspect

    from hydra.utils import get_class

    try:
        params = inspect.signature(get_class(spec["_target_"])).parameters
    except Exception:
        return False
    return "name" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values())


def forget_agent(spec: Any) -> None:
    """Drop a cached agent (after a timeout its state is unknown)."""
    key = _spec_key(spec)
    if key is not None:
        with _AGENTS_LOCK:
            _AGENTS.pop(key, None)


# --------------------------------------------------------------------------- shipping files

@dataclass(frozen=True)
class ShippedFiles:
    """The request's directories as one tar archive, for workers on other nodes."""

    archive: bytes
    roots: dict[str, str] = field(default_factory=dict)  # field of the request -> path it was packed from

    @classmethod
    def pack(cls, request: MutationRequest) -> "ShippedFiles":
        buf = io.BytesIO()
        roots: dict[str, str] = {}
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name in ("parent_dir", "evidence_dir"):
                path = Path(getattr(request, name))
                if path.is_dir():
                    tar.add(str(path), arcname=name)
                    roots[name] = str(path)
        return cls(buf.getvalue(), roots)

    def unpack(self, request: MutationRequest, into: Path) -> MutationRequest:
        """The request with its directories unpacked under ``into`` (only those the
        worker cannot see where the driver had them)."""
        missing = {n for n, p in self.roots.items() if not Path(p).is_dir()}
        if not missing:
            return request
        with tarfile.open(fileobj=io.BytesIO(self.archive), mode="r:gz") as tar:
            tar.extractall(into, filter="data")
        return replace(request, **{n: into / n for n in missing})


# --------------------------------------------------------------------------- the body

def run_mutation(spec: Any, request: MutationRequest, *, time_cap_s: float,
                 validation: ValidationOptions | None = None, call: str = "mutate",
                 shipped: ShippedFiles | None = None) -> MutationOutcome:
    """Run one mutation (see the module docstring). ``call`` names the agent method:
    ``mutate`` (mutators, SSR's optimizer) or ``graft`` (MILO's orchestrator)."""
    import os
    import socket

    t0 = time.monotonic()
    node = f"{socket.gethostname()}:{os.getpid()}"
    scratch: Path | None = None
    try:
        if shipped is not None:
            scratch = Path(tempfile.mkdtemp(prefix="milo-ray-mutation-"))
            request = shipped.unpack(request, scratch)
        Path(request.workdir).mkdir(parents=True, exist_ok=True)
        res, error = _call_with_cap(spec, request, call, time_cap_s)
        seconds = time.monotonic() - t0
        if error is not None:
            return MutationOutcome(None, error=error, usage=AgentUsage(cost_usd=None, seconds=seconds, error=error),
                                   node=node)
        usage = res.usage.with_seconds(seconds)
        child, error = _read_child(res, request)
        if error is not None:
            return MutationOutcome(None, error=error, report=res.report, usage=usage.with_error(error), node=node)
        verdict = _validate(child, request.parent, validation or ValidationOptions())
        return MutationOutcome(child, validation_error=verdict, report=res.report, usage=usage, node=node)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _call_with_cap(spec: Any, request: MutationRequest, call: str,
                   time_cap_s: float) -> tuple[MutationResult | None, str | None]:
    """The agent's answer, or why there is none. The call runs in a daemon thread so
    the cap holds even in-process; a call past the cap is abandoned (its thread keeps
    running until it returns; a Ray caller kills the whole process instead)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["res"] = getattr(agent_for(spec), call)(request)
        except BaseException as e:  # an agent crash is a rejected child, never a crashed run
            box["exc"] = e

    worker = threading.Thread(target=target, name=f"mutation-{call}", daemon=True)
    worker.start()
    worker.join(time_cap_s)
    if worker.is_alive():
        forget_agent(spec)
        return None, f"timed out after {time_cap_s:g}s"
    if "exc" in box:
        e = box["exc"]
        return None, f"{_role_word(call)} crashed: {type(e).__name__}: {e}"[:2000]
    res = box.get("res")
    if not isinstance(res, MutationResult):
        return None, f"{_role_word(call)} returned {type(res).__name__}, not MutationResult"
    return res, None


def _role_word(call: str) -> str:
    return "graft" if call == "graft" else "mutator"


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
# verdicts are remembered per process.
_VERDICTS: dict[tuple[str, int, float], str | None] = {}


def _validate(child: Harness, parent: Harness, options: ValidationOptions) -> str | None:
    if child.harness_id == parent.harness_id:
        return "duplicate: identical to the parent"
    if not options.enabled:
        return None
    key = (child.harness_id, hash(options.forbidden), float(options.timeout_s))
    if key not in _VERDICTS:
        from milo_ray.harness.validate import validate

        v = validate(child, forbidden_fragments=options.forbidden, timeout_s=options.timeout_s)
        _VERDICTS[key] = None if v.ok else v.reason
    return _VERDICTS[key]


# --------------------------------------------------------------------------- Ray callers

_remote_body: Any = None


def _remote() -> Any:
    global _remote_body
    if _remote_body is None:
        import ray

        # No retries: a mutation is a paid agent call; a lost worker is a rejected child.
        _remote_body = ray.remote(max_retries=0)(run_mutation)
    return _remote_body


def ship_files(request: MutationRequest) -> ShippedFiles | None:
    """Pack the request's directories when workers may not see the driver's disk."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    return ShippedFiles.pack(request) if len(alive) > 1 else None


def _timeout_outcome(time_cap_s: float, seconds: float, why: str) -> MutationOutcome:
    return MutationOutcome(None, error=why, usage=AgentUsage(cost_usd=None, seconds=seconds, error=why))


async def run_mutation_async(spec: Any, request: MutationRequest, *, time_cap_s: float,
                             validation: ValidationOptions | None = None, call: str = "mutate",
                             num_cpus: float = 1.0) -> MutationOutcome:
    """One mutation as a Ray task, awaited with the cap (plus a grace for the task's
    own timeout outcome); past it the task is cancelled and the child rejected."""
    import ray

    t0 = time.monotonic()
    ref = _remote().options(num_cpus=num_cpus).remote(spec, request, time_cap_s=time_cap_s, validation=validation,
                                                      call=call, shipped=ship_files(request))
    try:
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout=time_cap_s + CANCEL_GRACE_S)
    except asyncio.TimeoutError:
        ray.cancel(ref, force=True)
        return _timeout_outcome(time_cap_s, time.monotonic() - t0, f"timed out after {time_cap_s:g}s")
    except Exception as e:  # worker died, task cancelled: the child is rejected
        return _timeout_outcome(time_cap_s, time.monotonic() - t0,
                                f"mutation task failed: {type(e).__name__}: {e}"[:2000])


def run_mutations(spec: Any, requests: Sequence[MutationRequest], *, time_cap_s: float,
                  validation: ValidationOptions | None = None, max_concurrent: int = 4, num_cpus: float = 1.0,
                  use_ray: bool | None = None,
                  on_done: Callable[[int, MutationOutcome], None] | None = None) -> list[MutationOutcome]:
    """Several mutations in parallel (Ray tasks when connected to Ray, else threads;
    ``use_ray`` forces the choice), each under the cap; outcomes in ``requests``
    order. ``on_done(i, outcome)`` is called on the caller's thread as each finishes."""
    if not requests:
        return []
    import ray

    if not (ray.is_initialized() if use_ray is None else use_ray):
        with ThreadPoolExecutor(max_workers=max(1, min(max_concurrent, len(requests)))) as pool:
            futs = [pool.submit(run_mutation, spec, r, time_cap_s=time_cap_s, validation=validation)
                    for r in requests]
            out = []
            for i, f in enumerate(futs):
                out.append(f.result())
                if on_done is not None:
                    on_done(i, out[-1])
            return out
    body = _remote().options(num_cpus=num_cpus)
    spec_ref = ray.put(spec)
    results: dict[int, MutationOutcome] = {}
    pending: dict[Any, tuple[int, float]] = {}
    queue = list(enumerate(requests))
    while queue or pending:
        while queue and len(pending) < max_concurrent:
            i, req = queue.pop(0)
            ref = body.remote(spec_ref, req, time_cap_s=time_cap_s, validation=validation, shipped=ship_files(req))
            pending[ref] = (i, time.monotonic())
        now = time.monotonic()
        first_deadline = min(t0 + time_cap_s + CANCEL_GRACE_S for _, t0 in pending.values())
        done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, first_deadline - now))
        for ref in done:
            i, t0 = pending.pop(ref)
            try:
                results[i] = ray.get(ref)
            except Exception as e:  # the worker died: this child is lost, the others go on
                results[i] = _timeout_outcome(time_cap_s, time.monotonic() - t0,
                                              f"mutation task failed: {type(e).__name__}: {e}"[:2000])
            if on_done is not None:
                on_done(i, results[i])
        now = time.monotonic()
        for ref, (i, t0) in list(pending.items()):
            if now - t0 >= time_cap_s + CANCEL_GRACE_S:  # hung past the cap: kill it
                ray.cancel(ref, force=True)
                del pending[ref]
                results[i] = _timeout_outcome(time_cap_s, now - t0, f"timed out after {time_cap_s:g}s")
                if on_done is not None:
                    on_done(i, results[i])
    return [results[i] for i in range(len(requests))]
