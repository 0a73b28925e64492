"""Experience records and their ordering (SSR §4.1; DESIGN §4.2).

This module owns the step from a parent's training trajectories to the ranked
evidence the candidate optimizer sees:

1. ``judge_records``: the judge distills each trajectory + feedback (ctrf test report,
   score) into a verdict (w, a, u, summary, suggestions, insights). A malformed or
   out-of-range answer is re-asked up to ``retries`` times; if it still fails the
   record is kept with ``judge_error`` set and **excluded from ranking** (its scores
   are stored as null, never clipped or zero-filled, so they cannot pose as data).
   Judge calls run on a thread pool: they are I/O-bound (an HTTP request per call
   for the LLM judge; microseconds for the offline judge), the traces already live
   in the driver's store, and threads avoid shipping every trace to a Ray worker.
2. ``embed_records``: z_i = embedding of summary + insights (records read back from
   the store keep the stored vector and are not embedded again).
3. ``order_records``: the records in evidence order, by an ordering strategy: RER
   greedy over w, q = a·u and S = clipped cosine (or the RANDOM / QUALITY-ONLY
   ablation orderings; :mod:`milo_ray.ssr.strategies`).
4. ``evidence_sets``: the per-candidate record sets, by an evidence-set strategy
   (nested multiscale prefixes, or the TOP-K FIXED / TOP-K RESAMPLING / FIXED-N
   ablations).
5. ``render_memory``: the markdown the optimizer reads.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

import numpy as np

from milo_ray.agents.judges.schema import JudgeOutputError, parse_verdict, verdict_tags
from milo_ray.llm.usage import AgentUsage, reply_parts
from milo_ray.ssr.strategies import EVIDENCE_SETS, ORDERINGS, EvidenceOrdering, EvidenceSets


@dataclass
class ExperienceRecord:
    """One judged training trajectory. ``ok`` records have w, a, u, q in [0, 1]."""

    task_id: str
    round: int
    harness_id: str
    score: float
    resolved: bool
    w: float | None = None
    a: float | None = None
    u: float | None = None
    summary: str = ""
    suggestions: list[str] = field(default_factory=list)
    insights: str = ""
    failure_modes: list[str] = field(default_factory=list)
    mechanisms: list[str] = field(default_factory=list)
    trace_ref: str | None = None
    judge_error: str | None = None
    attempts: int = 0
    embedding: np.ndarray | None = None
    usage: list[AgentUsage] = field(default_factory=list)  # one per judge call (re-asks included)
    embedder: str | None = None  # the model that actually embedded ``text``

    @property
    def ok(self) -> bool:
        return self.judge_error is None

    @property
    def q(self) -> float | None:
        return None if self.a is None or self.u is None else self.a * self.u

    @property
    def text(self) -> str:
        """What is embedded: the summary and the extracted insights."""
        return f"{self.summary}\n{self.insights}".strip()

    def as_dict(self) -> dict[str, Any]:
        """JSON-able view handed to the optimizer (``MutationRequest.context['records']``)."""
        return {
            "task_id": self.task_id, "score": self.score, "resolved": self.resolved,
            "w": self.w, "a": self.a, "u": self.u, "q": self.q, "summary": self.summary,
            "suggestions": list(self.suggestions), "insights": self.insights,
            "failure_modes": list(self.failure_modes), "mechanisms": list(self.mechanisms),
            "trace_ref": self.trace_ref,
        }

    def row(self) -> dict[str, Any]:
        """The ``experience`` table row (DESIGN §3)."""
        return {
            "task_id": self.task_id, "round": self.round, "harness_id": self.harness_id,
            "w": self.w, "a": self.a, "u": self.u, "q": self.q, "summary": self.summary,
            "suggestions": list(self.suggestions),
            "embedding": None if self.embedding is None else [float(x) for x in self.embedding],
            "judge_error": self.judge_error, "trace_ref": self.trace_ref, "embedder": self.embedder,
        }


@dataclass(frozen=True)
class JudgeItem:
    """One trajectory to judge."""

    task_id: str
    trajectory: dict[str, Any]
    feedback: dict[str, Any]
    score: float
    resolved: bool
    trace_ref: str | None = None


def judge_one(judge: Any, item: JudgeItem, *, round: int, harness_id: str, retries: int) -> ExperienceRecord:
    """Ask, validate, re-ask up to ``retries`` times; never clip, never raise for a bad answer.

    A re-ask passes ``feedback['reask'] = {"error": why the last answer was rejected,
    "previous": that answer as text ("" when the call gave none)}``, so an LLM judge can
    correct its answer; judges that do not read it are asked the same question again."""
    rec = ExperienceRecord(item.task_id, round, harness_id, item.score, item.resolved, trace_ref=item.trace_ref)
    last, previous = "", ""
    for attempt in range(retries + 1):
        rec.attempts = attempt + 1
        feedback = item.feedback if attempt == 0 else {**item.feedback, "reask": {"error": last, "previous": previous}}
        raw = None
        try:
            raw, usage = reply_parts(judge.judge(item.trajectory, feedback, item.task_id))
            rec.usage.append(usage)
            if raw is None and usage.error:
                raise JudgeOutputError(f"judge call failed: {usage.error}")
            v = parse_verdict(raw)
        except JudgeOutputError as e:
            last, previous = str(e), _as_text(raw)
            continue
        except Exception as e:  # a crashing judge call is a judge failure too, and is re-asked
            last, previous = f"{type(e).__name__}: {e}", _as_text(raw)
            continue
        tags = verdict_tags(raw)
        rec.w, rec.a, rec.u = v.w, v.a, v.u
        rec.summary, rec.suggestions, rec.insights = v.summary, list(v.suggestions), v.insights
        rec.failure_modes, rec.mechanisms = tags["failure_modes"], tags["mechanisms"]
        return rec
    rec.judge_error = f"after {retries + 1} attempts: {last}"[:2000]
    return rec


def _as_text(raw: Any) -> str:
    """A rejected answer as the judge would read it back."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    try:
        return json.dumps(raw, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(raw)


def judge_records(judge: Any, items: Sequence[JudgeItem], *, round: int, harness_id: str, retries: int = 2,
                  workers: int = 8,
                  on_record: Callable[[ExperienceRecord], None] | None = None) -> list[ExperienceRecord]:
    """Judge every item concurrently; records come back in ``items`` order.

    ``on_record`` is called in the calling thread with each record as soon as it is
    judged (completion order), so the caller can store it before the slower ones
    finish: a run killed mid-judging keeps what was already paid for.
    """
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as pool:
        futs = [pool.submit(judge_one, judge, it, round=round, harness_id=harness_id, retries=retries) for it in items]
        if on_record is not None:
            for f in as_completed(futs):
                on_record(f.result())
        return [f.result() for f in futs]


def embed_records(records: Sequence[ExperienceRecord], embedder: Any) -> int:
    """Fill ``embedding`` of every judged record that has none yet (judge failures get
    none); returns how many texts the embedder was given (0: no call)."""
    todo = [r for r in records if r.ok and r.embedding is None]
    if not todo:
        return 0
    Z = np.asarray(embedder.embed([r.text for r in todo]), dtype=np.float32)
    if Z.shape[0] != len(todo):
        raise ValueError(f"embedder returned {Z.shape[0]} rows for {len(todo)} texts")
    for r, z in zip(todo, Z):
        r.embedding = z
        r.embedder = embedder.model_name
    return len(todo)


def order_records(records: Sequence[ExperienceRecord], ordering: str | EvidenceOrdering,
                  rng: np.random.Generator) -> list[str]:
    """Task ids of the judged records in evidence order (judge failures excluded).

    ``ordering``: an :class:`~milo_ray.ssr.strategies.EvidenceOrdering` or a registered
    name: ``rer`` (the submodular greedy permutation, ties by lower record index),
    ``quality_only`` (q descending, ties by lower index) or ``random`` (uniform).
    """
    strategy = ORDERINGS.resolve(ordering, key="ordering") if isinstance(ordering, str) else ordering
    ok = [r for r in records if r.ok]
    if not ok:
        return []
    return [ok[int(i)].task_id for i in strategy.order(ok, rng)]


def scale_sizes(n: int, fractions: Sequence[float]) -> list[int]:
    """k = ⌈α·n⌉ per scale, as the kernel defines them: strictly increasing, repeated
    sizes kept once, the full pool always last (so tiny pools yield fewer scales)."""
    from milo_ray.kernels.submodular import prefix_sizes

    return [int(k) for k in prefix_sizes(n, list(fractions))]


def evidence_sets(order: Sequence[str], fractions: Sequence[float], strategy: str | EvidenceSets,
                  rng: np.random.Generator) -> list[tuple[str, ...]]:
    """One evidence set per candidate (task ids, each in evidence order).

    ``strategy``: an :class:`~milo_ray.ssr.strategies.EvidenceSets` or a registered name:
    ``rer`` (nested prefixes ⌈α_i·N⌉), ``topk_fixed`` (the same top ⌈α_1·N⌉ for all),
    ``topk_resampling`` (an independent uniform ⌈α_1·N⌉-subset each), ``fixed_n`` (all N).
    No evidence (every judge call failed) gives no candidates under every strategy, so
    the ablations stay comparable.
    """
    sets = EVIDENCE_SETS.resolve(strategy, key="evidence") if isinstance(strategy, str) else strategy
    if not order:
        return []
    return sets.sets(order, scale_sizes(len(order), fractions), len(fractions), rng)


def render_memory(records: Sequence[ExperienceRecord], *, k: int, n: int, evidence_dir: str = "") -> str:
    """The optimizer's view of its evidence: ranked summaries and suggestions, with
    where the raw trajectories live (read on demand)."""
    lines = [
        f"# Experience records ({k} of {n}, in evidence order)",
        "",
        "Each record distills one training trajectory of the parent harness: what happened,",
        "why, and what to change in the harness. Scores: w = importance (generality),",
        "a = actionability, u = judge confidence.",
    ]
    if evidence_dir:
        lines.append(f"Raw trajectories of these records: `{evidence_dir}/traces/<task_id>/trajectory.json`.")
    for i, r in enumerate(records, 1):
        status = "resolved" if r.resolved else f"score {r.score:.2f}"
        lines += ["", f"## {i}. {r.task_id} ({status}; w={r.w:.2f} a={r.a:.2f} u={r.u:.2f})", "", r.summary]
        if r.insights:
            lines += ["", f"Insight: {r.insights}"]
        if r.suggestions:
            lines += ["", "Suggestions:"] + [f"- {s}" for s in r.suggestions]
    return "\n".join(lines) + "\n"


def pool_statistics(results: Sequence[Any]) -> dict[str, Any]:
    """Pool-level facts handed to the judge in ``feedback['pool']`` so it can rate how
    general an experience is (fraction resolved, timed out, mean score, task count)."""
    n = len(results)
    if not n:
        return {"tasks": 0}
    return {
        "tasks": n,
        "resolved_rate": sum(1 for r in results if r.score >= 1.0) / n,
        "timeout_rate": sum(1 for r in results if r.timed_out) / n,
        "mean_score": float(np.mean([r.score for r in results])),
    }


def judge_items(results: Sequence[Any], store: Any, *, skip: Collection[str] = ()) -> list[JudgeItem]:
    """Turn stored training rollouts into judge inputs (trace from the blob store).

    ``skip``: task ids already judged (a resumed round); they get no item, but the pool
    statistics every item carries still cover all ``results``, so the remaining inputs
    are the ones an uninterrupted round would have judged.
    """
    pool = pool_statistics(results)
    items = []
    for r in results:
        if r.task_id in skip:
            continue
        trace = (store.get_blob(r.trace_ref) if r.trace_ref else r.trace) or {}
        feedback = {
            "score": r.score, "resolved": r.score >= 1.0, "timed_out": r.timed_out,
            "error_kind": r.error_kind, "error": r.error, "ctrf": trace.get("ctrf", {}), "pool": pool,
            "verifier": trace.get("verifier") or {},
        }
        items.append(JudgeItem(r.task_id, trace.get("trajectory", {}), feedback, r.score, r.score >= 1.0, r.trace_ref))
    return items
