"""One round's experience records: judged once, read back on resume (SSR §4.1).

:func:`judge_round` turns the parent's training rollouts into judged, embedded
records. A record whose ``ssr.judged`` event is stored is read back from it, with the
embedding stored in its ``experience`` row; only the rest are judged. Each judge call
(every attempt, re-asks included) is recorded in ``agent_calls`` under a
deterministic id before the record's event is written, so a replayed step is never
charged twice. The embedder is not a paid call but is recorded (role ``embedder``,
zero tokens, measured seconds) so the ledger shows every agent the run used.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from milo_ray.llm.usage import AgentUsage
from milo_ray.ssr import evidence as ev
from milo_ray.ssr.events import Judged, SSREvent
from milo_ray.ssr.state import RoundRecord
from milo_ray.ssr.store_io import StoreWriter


def agent_name(agent: Any) -> str:
    """The label an agent is recorded under: its ``name``, else its class name."""
    name = getattr(agent, "name", None)
    return str(name) if name else type(agent).__name__


def judge_call_id(rnd: int, parent_id: str, task_id: str, attempt: int) -> str:
    return f"judge:r{rnd}:{parent_id[:12]}:{task_id}:a{attempt}"


def to_event(rec: ev.ExperienceRecord) -> Judged:
    return Judged(rec.round, rec.harness_id, rec.task_id, float(rec.score), bool(rec.resolved), rec.w, rec.a, rec.u,
                  rec.summary, list(rec.suggestions), rec.insights, list(rec.failure_modes), list(rec.mechanisms),
                  rec.trace_ref, rec.judge_error, rec.attempts)


def from_event(j: Judged) -> ev.ExperienceRecord:
    return ev.ExperienceRecord(j.task_id, j.round, j.harness_id, j.score, j.resolved, w=j.w, a=j.a, u=j.u,
                               summary=j.summary, suggestions=list(j.suggestions), insights=j.insights,
                               failure_modes=list(j.failure_modes), mechanisms=list(j.mechanisms),
                               trace_ref=j.trace_ref, judge_error=j.judge_error, attempts=j.attempts)


def judge_round(*, judge: Any, embedder: Any, results: Sequence[Any], recorded: RoundRecord,
                emit: Callable[[SSREvent], None], out: StoreWriter, store: Any, calls: Any, parent_id: str, rnd: int,
                retries: int, workers: int) -> list[ev.ExperienceRecord]:
    """Records of ``results`` (the parent's refresh rollouts) in their order, each
    judged and embedded once over the run's sessions; experience rows written.
    ``recorded`` is the round's record so far, ``emit`` stores (and projects) an event."""
    done = {t: from_event(j) for t, j in recorded.judged.items()}
    judge_label = agent_name(judge)
    judge_model = getattr(getattr(judge, "llm", None), "model", None)  # an LLM judge's model; offline: None

    def keep(rec: ev.ExperienceRecord) -> None:
        for k, usage in enumerate(rec.usage):
            calls.record("judge", usage, call_id=judge_call_id(rnd, parent_id, rec.task_id, k), agent=judge_label,
                         model=judge_model, round=rnd)
        emit(to_event(rec))

    items = ev.judge_items(results, store, skip=done)
    fresh = ev.judge_records(judge, items, round=rnd, harness_id=parent_id, retries=retries, workers=workers,
                             on_record=keep)
    by_task = {**done, **{r.task_id: r for r in fresh}}
    records = [by_task[r.task_id] for r in results]
    for r in records:
        if r.ok and r.embedding is None:
            r.embedding = out.stored_embedding(parent_id, rnd, r.task_id)
    t0 = time.perf_counter()
    if ev.embed_records(records, embedder):
        calls.record("embedder", AgentUsage(cost_usd=0.0, seconds=time.perf_counter() - t0),
                     call_id=f"embed:r{rnd}:{parent_id[:12]}", agent=agent_name(embedder), round=rnd)
    out.experience(records)
    return records
