"""One round's children (SSR §4.2): each optimizer answer asked for once over the
run's sessions.

:class:`ChildMaker` builds the M evidence sets and requests of a round, asks the
optimizer (through :func:`milo_ray.ssr.candidates.generate_candidates`) for the
answers the store does not hold yet, and re-draws children identical to the parent or
to an earlier candidate. Each answer is recorded as it comes back: the optimizer call
in ``agent_calls`` (``optimize:r{round}:c{index}:d{draw}``), the child's files as a
blob and the answer as an ``ssr.candidate`` event. A resumed round reads recorded
answers back (the child from its blob) and generates only the missing ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from milo_ray.agents.protocols import MutationRequest
from milo_ray.core.seeds import derive_seed
from milo_ray.harness.evidence import write_evidence_dir
from milo_ray.harness.model import Harness
from milo_ray.search.agent_calls import spec_model
from milo_ray.ssr import evidence as ev
from milo_ray.ssr.candidates import CandidateJob, generate_candidates
from milo_ray.ssr.events import CandidateDrawn, SSREvent
from milo_ray.ssr.state import RoundRecord

METHOD = "ssr"


@dataclass(frozen=True)
class Drawn:
    """One candidate's latest answer and its child (None when there is none)."""

    answer: CandidateDrawn
    child: Harness | None

    @property
    def index(self) -> int:
        return self.answer.index

    @property
    def error(self) -> str | None:
        return self.answer.error


def duplicates(parent: Harness, outcomes: Sequence[Any]) -> list[int]:
    """Indices of valid children identical to the parent or to an earlier candidate
    (``outcomes``: objects with ``index``, ``child`` and ``error``)."""
    seen, dups = {parent.harness_id}, []
    for o in outcomes:
        if o.child is None or o.error is not None:
            continue
        if o.child.harness_id in seen:
            dups.append(o.index)
        else:
            seen.add(o.child.harness_id)
    return dups


def optimize_call_id(rnd: int, index: int, draw: int) -> str:
    return f"optimize:r{rnd}:c{index}:d{draw}"


class ChildMaker:
    """Draws a round's children; ``emit`` stores (and projects) an event, ``calls`` is
    the run's ``AgentCallLog``; ``scope`` the run session whose optimizer agents are reused;
    ``env`` the optimizer's key variables for its Ray tasks; ``entry`` the artifact's entry
    function children are validated against."""

    def __init__(self, *, cfg: Any, seed: int, optimizer_spec: Any, optimizer_name: str, forbidden: Sequence[str],
                 tasks: dict[str, Any], store: Any, calls: Any, emit: Callable[[SSREvent], None], work: Path,
                 scope: str | None = None, env: dict[str, str] | None = None, entry: str = "build_agent",
                 sandbox: dict[str, Any] | None = None) -> None:
        self.cfg, self.seed, self.scope, self.env, self.entry = cfg, seed, scope, dict(env or {}), entry
        self.sandbox = sandbox
        self.optimizer_spec, self.optimizer_name, self.forbidden = optimizer_spec, optimizer_name, forbidden
        self.tasks, self.store, self.calls, self.emit, self.work = tasks, store, calls, emit, work

    def request_context(self, recs: Sequence[Any], rnd: int, i: int) -> dict[str, Any]:
        """What candidate ``i`` of round ``rnd`` is told beside its workspace: its records
        (``scale`` of them) and the artifact's entry, which picks the optimizer's
        instructions (a harness or an optimizer program)."""
        return {"records": [r.as_dict() for r in recs], "scale": len(recs), "round": rnd, "candidate_index": i,
                "method": METHOD, "artifact_entry": self.entry}

    def evidence_sets(self, order: list[str], m: int, rnd: int) -> list[tuple[str, ...]]:
        rng = np.random.default_rng(derive_seed(self.seed, "evidence", rnd))
        return ev.evidence_sets(order, self.cfg.scales, self.cfg.evidence_strategy, rng)[:m]

    def draw(self, parent: Harness, ev_state: dict, sets: list[tuple[str, ...]], rnd: int,
             rec: RoundRecord) -> tuple[list[Drawn], dict[int, int]]:
        """Every candidate's final answer (in index order) and the re-draws each took."""
        requests = _Requests(self, parent, ev_state, sets, rnd)
        drawn = self._answers(parent, [(i, 0) for i in range(len(sets))], requests, rnd, rec)
        redrawn: dict[int, int] = {}
        for attempt in range(1, self.cfg.duplicate_retries + 1):
            # An optimizer given the same evidence twice (topk_fixed, fixed_n) may write the
            # same child twice; re-drawing it with a fresh seed, as an LLM sampled again
            # would, keeps M distinct racers under every evidence strategy.
            dups = duplicates(parent, drawn)
            if not dups:
                break
            wanted = [(i, attempt) for i in dups]
            if any(w not in rec.draws for w in wanted) and not self.calls.allows("optimizer"):
                break  # the optimizer's cap is reached: no new call; the duplicates are dropped
            for d in self._answers(parent, wanted, requests, rnd, rec):
                drawn[d.index] = d
                redrawn[d.index] = attempt
        return drawn, redrawn

    def _answers(self, parent: Harness, wanted: list[tuple[int, int]], requests: "_Requests", rnd: int,
                 rec: RoundRecord) -> list[Drawn]:
        """Answers for (index, draw) pairs: recorded ones read back, the rest generated
        (concurrently) and recorded."""
        missing = [(i, d) for i, d in wanted if (i, d) not in rec.draws]
        model = spec_model(self.optimizer_spec)
        jobs = [replace(requests.job(i, d), ticket=self.calls.ticket(optimize_call_id(rnd, i, d), "optimizer", model))
                for i, d in missing]
        fresh: dict[tuple[int, int], Harness | None] = {}
        if jobs:
            outcomes = generate_candidates(self.optimizer_spec, jobs, forbidden=self.forbidden,
                                           timeout_s=self.cfg.validate_timeout_s,
                                           max_concurrent=self.cfg.max_concurrent_candidates,
                                           time_cap_s=self.cfg.optimizer_time_cap_s, scope=self.scope,
                                           env=self.env, entry=self.entry, sandbox=self.sandbox)
            for (i, d), job, o in zip(missing, jobs, outcomes):
                self.calls.record("optimizer", o.usage, call_id=optimize_call_id(rnd, i, d),
                                  agent=self.optimizer_name, model=model, candidate=i, round=rnd,
                                  covers=job.ticket if o.metered else None)
                child = o.child
                self.emit(CandidateDrawn(
                    rnd, parent.harness_id, o.index, d, o.scale, o.seed,
                    child.harness_id if child is not None else None,
                    self.store.put_harness_source(dict(child.files)) if child is not None else None,
                    child.name if child is not None else None, o.error, o.report[:2000]))
                fresh[(i, d)] = child
        out = []
        for key in wanted:
            answer = rec.draws[key]
            child = fresh[key] if key in fresh else self._read_child(answer)
            out.append(Drawn(answer, child))
        return out

    def _read_child(self, answer: CandidateDrawn) -> Harness | None:
        if answer.source_ref is None:
            return None
        child = Harness(dict(self.store.get_blob(answer.source_ref)), name=answer.name or "")
        if child.harness_id != answer.child_id:
            raise ValueError(f"ssr.candidate round {answer.round} index {answer.index}: source blob "
                             f"{answer.source_ref} hashes to {child.harness_id[:12]}, not {answer.child_id}")
        return child


class _Requests:
    """The round's optimizer requests, written to the workspace only when one is needed
    (a resumed round whose answers are all recorded writes nothing)."""

    def __init__(self, maker: ChildMaker, parent: Harness, ev_state: dict, sets: list[tuple[str, ...]],
                 rnd: int) -> None:
        self.maker, self.parent, self.ev_state, self.sets, self.rnd = maker, parent, ev_state, sets, rnd
        self.rdir = maker.work / f"round-{rnd:03d}"
        self._first: dict[int, CandidateJob] = {}
        self._parent_dir: Path | None = None

    def job(self, i: int, draw: int) -> CandidateJob:
        if i not in self._first:
            self._first[i] = self._build(i)
        job = self._first[i]
        if draw == 0:
            return job
        # A re-draw: the same request and workspace, a fresh seed.
        seed = derive_seed(self.maker.seed, "candidate", self.rnd, i, draw)
        return CandidateJob(i, job.scale, replace(job.request, seed=seed))

    def _build(self, i: int) -> CandidateJob:
        if self._parent_dir is None:
            self._parent_dir = self.parent.write_to(self.rdir / "parent")
        tasks = self.sets[i]
        by_task = {r.task_id: r for r in self.ev_state["records"]}
        res_by_task = {r.task_id: r for r in self.ev_state["results"]}
        cdir = self.rdir / f"candidate-{i}"
        recs = [by_task[t] for t in tasks]
        edir = write_evidence_dir(cdir / "evidence", self.parent, [res_by_task[t] for t in tasks], self.maker.tasks,
                                  self.maker.store)
        (cdir / "work").mkdir(parents=True, exist_ok=True)
        memory = ev.render_memory(recs, k=len(tasks), n=len(self.ev_state["order"]), evidence_dir=str(edir))
        req = MutationRequest(parent=self.parent, parent_dir=self._parent_dir, evidence_dir=Path(edir),
                              memory_markdown=memory, workdir=cdir / "work",
                              seed=derive_seed(self.maker.seed, "candidate", self.rnd, i),
                              context=self.maker.request_context(recs, self.rnd, i))
        return CandidateJob(i, len(tasks), req)
