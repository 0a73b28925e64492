"""Rollout value types: the request a method submits, the result an executor returns,
and the cache key that names a rollout in the store.

A *rollout* is one execution of one harness on one task (rollout index i of k).
Requests and results are small, frozen (or plain) picklable dataclasses so they cross Ray
process boundaries cheaply; traces travel inside the result and are moved into the
content-addressed blob store by the single store writer.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, fields
from typing import Any, Literal

from milo_ray.core.storable import storable, storable_text

ErrorKind = Literal["infra", "harness", "task"]
ERROR_KINDS: tuple[str, ...] = ("infra", "harness", "task")


def cache_key(harness_id: str, task_id: str, rollout_idx: int, model_id: str, seed: int) -> str:
    """Identity of a rollout: same key, same execution; a finished key never runs again.

    Stored runs hold these keys: the encoding below must never change."""
    raw = json.dumps([harness_id, task_id, int(rollout_idx), model_id, int(seed)])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class RolloutRequest:
    """What a method asks the scheduler to run.

    ``seed`` is the run seed; the executor derives the per-rollout stream from
    (seed, harness_id, task_id, rollout_idx) so results do not depend on scheduling.
    ``method``/``round``/``stage`` are bookkeeping copied into the rollouts table.
    ``group`` names the concurrency pool this request counts against (an island, a race).
    """

    harness_id: str
    task_id: str
    rollout_idx: int
    seed: int
    split: str = ""
    method: str = ""
    round: int = 0
    stage: str = ""
    group: str = "default"

    def key(self, model_id: str) -> str:
        return cache_key(self.harness_id, self.task_id, self.rollout_idx, model_id, self.seed)


@dataclass
class RolloutResult:
    """Outcome of one rollout. A failing task or harness is a score, not an exception.

    ``score`` is the fraction of tests passed (partial credit), ``resolved`` is
    ``score == 1``. ``error_kind`` is None on a clean run, ``"task"`` when the task's
    grading failed, ``"harness"`` when the harness crashed or could not be built, and
    ``"infra"`` only for failures that survived the scheduler's retries.
    ``invalid_tool_calls`` counts the model's tool calls whose arguments did not parse,
    over the steps of the rollout's trajectory (None: not counted -- no model ran, a
    surrogate rollout, or a run stored before the count existed). It comes from the
    trajectory the harness process streamed, as untrusted as its steps: a figure for
    diagnosis, never for budgets.
    ``trace`` (trajectory + test report) is replaced by ``trace_ref`` once stored.
    """

    harness_id: str
    task_id: str
    rollout_idx: int
    score: float
    input_tokens: int = 0
    output_tokens: int = 0
    # None: the model could not be priced (recorded as null, never as free).
    cost_usd: float | None = 0.0
    latency_s: float = 0.0
    timed_out: bool = False
    error_kind: str | None = None
    error: str | None = None
    invalid_tool_calls: int | None = None
    trace: dict[str, Any] | None = None
    trace_ref: str | None = None
    # Filled by the scheduler:
    run_id: str = ""
    method: str = ""
    round: int = 0
    stage: str = ""
    split: str = ""
    node: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    cache_key: str = ""
    attempts: int = 1
    # False for batches run outside the run's budget (final test evaluations).
    budgeted: bool = True

    @property
    def resolved(self) -> bool:
        return self.score >= 1.0

    def problem(self) -> str | None:
        """Why this result cannot be stored as an executor's answer (None when it can)."""
        if not isinstance(self.score, (int, float)) or not math.isfinite(self.score) or not 0.0 <= self.score <= 1.0:
            return f"score={self.score!r} is not a number in [0, 1]"
        if self.error_kind not in (None, *ERROR_KINDS):
            return f"error_kind={self.error_kind!r} is not one of {ERROR_KINDS} or None"
        for name in ("input_tokens", "output_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                return f"{name}={v!r} is not a non-negative integer"
        for name in ("cost_usd", "latency_s"):
            v = getattr(self, name)
            if v is None and name == "cost_usd":
                continue
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                return f"{name}={v!r} is not a finite non-negative number"
        v = self.invalid_tool_calls
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            return f"invalid_tool_calls={v!r} is not a non-negative integer or None"
        return None

    def make_storable(self) -> "RolloutResult":
        """Pass the untrusted text this result carries (its error, every string of its
        trace: the harness's steps, stderr, answers, file names) through
        :func:`~milo_ray.core.storable.storable`, in place; returns ``self``. Never raises."""
        if self.error is not None:
            self.error = storable_text(self.error)
        if self.trace is not None:
            self.trace = storable(self.trace)
        return self

    def make_unstorable_failure(self, why: str) -> "RolloutResult":
        """Turn this result, in place, into the record of a harness failure of its rollout
        (score 0, ``why`` in ``error``, no trace) when it still cannot be stored: what the
        harness produced is lost, the rollout is not, nor is any other. Identity and the
        driver's bookkeeping are kept; so are tokens and USD (the gateway's, already paid)
        when they are valid numbers. Returns ``self``."""
        self.score, self.error_kind, self.timed_out = 0.0, "harness", False
        self.error = storable_text(f"the rollout's result could not be stored ({why}); recorded as a harness "
                                   "failure with score 0", limit=1000)
        self.trace, self.trace_ref = None, None
        if _bad_count(self.input_tokens) or _bad_count(self.output_tokens):
            self.input_tokens, self.output_tokens = 0, 0
        if self.invalid_tool_calls is not None and _bad_count(self.invalid_tool_calls):
            self.invalid_tool_calls = None  # no count the table can hold: stored as not counted
        if self.cost_usd is not None and not _fine_number(self.cost_usd):
            self.cost_usd = None
        if not _fine_number(self.latency_s):
            self.latency_s = 0.0
        return self

    def row(self) -> dict[str, Any]:
        """The rollouts-table row (DESIGN §3); the trace itself is not part of it. Every
        other field is a scalar, so no copy is made (``asdict`` deep-copies, which was a
        fifth of the driver's time per stored rollout)."""
        d = {name: getattr(self, name) for name in _ROW_FIELDS}
        d["resolved"] = self.resolved
        return d


_ROW_FIELDS = tuple(f.name for f in fields(RolloutResult) if f.name != "trace")
_INT64_MAX = 2**63 - 1


def _bad_count(v: Any) -> bool:
    return not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _INT64_MAX


def _fine_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


class InfraFailure(Exception):
    """An executor raises this for an infrastructure failure (e.g. a model endpoint that
    kept failing past its retries) after the attempt already made model calls: the
    scheduler retries the rollout as for any raise, and records and charges
    ``model_calls`` (the failed attempt's calls, as ``trace["trajectory"]["calls"]``
    rows), which no stored result will carry."""

    def __init__(self, message: str, model_calls: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.model_calls = list(model_calls or [])
