"""The ``grader`` role: the model a task format's verifier calls (a PaperBench rubric
judge), made on the host after the agent's processes are dead, on a grant of its own.

Owns :class:`GraderSettings` (``executor.grader``: which model, the per-rollout grading
budget), :class:`RolloutGrader` (one rollout's metered grader: counts calls and tokens,
refuses past the budget with :class:`~milo_ray.core.tasks.GraderRefused`, keeps one row
per call) and the two ways a call is answered:

* ``llm``: the role's model (a :class:`~milo_ray.llm.role_llm.RoleLLM` block, like every
  search role's ``llm``), reached through a model gateway in this worker
  (:class:`~milo_ray.boundary.gateway.mutation.MutationGateway`) with a token issued per
  call: the key stays in the gateway, and the tokens and USD are the gateway's;
* ``scripted``: deterministic verdicts for offline runs and tests. A verdict request
  carries its requirement between ``<requirement>`` tags and the evidence between
  ``<submission>`` tags; the scripted grader passes the requirement when every term
  written in backquotes in it occurs in the evidence, and answers
  ``{"score": 0|1, "reason": ...}``. ``fail`` lists purposes it answers with text that is
  not a verdict (a judge failure, rehearsed). Its tokens are the characters / 4, so the
  budget binds offline as it does online; it costs nothing (USD 0).

The rows travel with the rollout (``trace["grader"]``) and the driver records them in
``agent_calls`` as role ``grader`` (:meth:`~milo_ray.search.agent_calls.AgentCallLog.record_rollout_calls`),
charged to the run's budget and ``run.budget.roles.grader``; the rollout's own tokens
stay the solver's. The harness never sees any of it: the grader exists only in the
worker, and only once grading begins.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from milo_ray.core.tasks import GraderRefused

SCRIPTED_MODEL = "scripted-grader"


class GraderUnavailable(RuntimeError):
    """The grader's model call failed after the gateway's retries: an infrastructure
    failure of the rollout (retried by the scheduler), never a 0 for the submission."""
_TERM = re.compile(r"`([^`\n]{1,80})`")


@dataclass(frozen=True)
class GraderSettings:
    """``executor.grader``. llm: the grader's model (a role ``llm`` block); scripted: use
    the deterministic offline grader instead; max_calls / max_tokens: the grading budget
    of one rollout (model calls; input + output tokens); fail: purposes the scripted
    grader answers with a non-verdict."""

    llm: Mapping[str, Any] | None = None
    scripted: bool = False
    max_calls: int = 200
    max_tokens: int = 4_000_000
    fail: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, spec: Any) -> "GraderSettings | None":
        """Checked settings from ``executor.grader`` (None: no grader configured);
        ``ValueError`` names the field and the fix."""
        if spec is None:
            return None
        if isinstance(spec, GraderSettings):
            return spec
        if not isinstance(spec, Mapping) and type(spec).__name__ != "DictConfig":
            raise ValueError(f"executor.grader: expected a mapping (llm, scripted, max_calls, max_tokens), got "
                             f"{type(spec).__name__}")
        spec = dict(spec)
        known = {"llm", "scripted", "max_calls", "max_tokens", "fail"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"executor.grader: unknown key(s) {unknown}; allowed: {sorted(known)}")
        llm, scripted = spec.get("llm"), bool(spec.get("scripted", False))
        if llm is None and not scripted:
            return None
        if llm is not None and scripted:
            raise ValueError("executor.grader: both llm and scripted=true are set; choose one (scripted=false to "
                             "grade with the model)")
        if llm is not None:
            from milo_ray.llm.role_llm import RoleLLM

            llm = dict(llm)
            RoleLLM.of(llm, where="executor.grader.llm")  # checked now, in the driver
        for key in ("max_calls", "max_tokens"):
            v = spec.get(key, getattr(cls, key))
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"executor.grader.{key}={v!r}: must be an integer >= 1 (the grading budget of one "
                                 "rollout)")
        return cls(llm=llm, scripted=scripted, max_calls=int(spec.get("max_calls", cls.max_calls)),
                   max_tokens=int(spec.get("max_tokens", cls.max_tokens)),
                   fail=tuple(str(x) for x in (spec.get("fail") or ())))

    @property
    def model(self) -> str:
        return SCRIPTED_MODEL if self.llm is None else str(self.llm["model"])

    def for_rollout(self, label: str, secrets: Mapping[str, str] | None = None) -> "RolloutGrader":
        return RolloutGrader(self, label, secrets)


class RolloutGrader:
    """One rollout's grader (the :class:`~milo_ray.core.tasks.Grader` protocol): every
    call counted against ``settings.max_calls`` / ``max_tokens`` and kept in
    :attr:`calls` (rows as the ``agent_calls`` ledger reads them)."""

    def __init__(self, settings: GraderSettings, label: str, secrets: Mapping[str, str] | None = None) -> None:
        self.settings, self.label = settings, label
        self._secrets = secrets
        self.calls: list[dict[str, Any]] = []
        self.refused = 0

    @property
    def tokens(self) -> int:
        return sum(int(c["input_tokens"]) + int(c["output_tokens"]) for c in self.calls)

    def ask(self, system: str, user: str, *, purpose: str) -> str:
        s = self.settings
        if len(self.calls) >= s.max_calls or self.tokens >= s.max_tokens:
            self.refused += 1
            raise GraderRefused(f"grading budget spent: {len(self.calls)}/{s.max_calls} calls, "
                                f"{self.tokens}/{s.max_tokens} tokens (executor.grader.max_calls / max_tokens)")
        if s.llm is None:
            return self._scripted(system, user, purpose)
        return self._llm(system, user, purpose)

    def record(self) -> dict[str, Any]:
        """What the rollout's trace keeps: the calls, the budget and what it refused."""
        return {"model": self.settings.model, "calls": list(self.calls), "refused": self.refused,
                "budget": {"max_calls": self.settings.max_calls, "max_tokens": self.settings.max_tokens}}

    # --- the two ways of answering ----------------------------------------------------------
    def _scripted(self, system: str, user: str, purpose: str) -> str:
        started = time.time()
        if purpose in self.settings.fail:
            answer = "I cannot decide."
        else:
            requirement = _section(user, "requirement")
            evidence = _section(user, "submission")
            terms = _TERM.findall(requirement)
            missing = [t for t in terms if t not in evidence]
            ok = bool(terms) and not missing
            reason = (f"every named term occurs in the submission ({', '.join(terms)})" if ok else
                      f"missing from the submission: {', '.join(missing)}" if missing else
                      "the requirement names no term to look for")
            answer = json.dumps({"score": int(ok), "reason": reason})
        self.calls.append({"purpose": purpose, "model": SCRIPTED_MODEL, "started_at": started,
                           "input_tokens": -(-(len(system) + len(user)) // 4), "output_tokens": -(-len(answer) // 4),
                           "cost_usd": 0.0, "seconds": time.time() - started, "retries": 0, "error": None})
        return answer

    def _llm(self, system: str, user: str, purpose: str) -> str:
        import contextlib

        from milo_ray.boundary.gateway.mutation import MutationGateway
        from milo_ray.llm.client import use_secrets
        from milo_ray.llm.role_llm import RoleLLM, metered_chat_model

        llm = RoleLLM.of(self.settings.llm, where="executor.grader.llm")
        gateway = MutationGateway.shared(llm)
        started = time.time()
        answer, error = None, None
        secrets = use_secrets(self._secrets) if self._secrets is not None else contextlib.nullcontext()
        with secrets, metered_chat_model(llm, gateway, role="grader", caller=f"{self.label}:{purpose}") as mc:
            try:
                out = mc.model.invoke([("system", system), ("user", user)])
                answer = out.content if isinstance(out.content, str) else json.dumps(out.content)
            except Exception as exc:  # noqa: BLE001 -- a failed call is a judge failure, recorded
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        for row in mc.calls() or [{"input_tokens": 0, "output_tokens": 0, "cost_usd": None, "retries": 0}]:
            self.calls.append({"purpose": purpose, "model": row.get("model") or llm.model,
                               "started_at": float(row.get("started_at") or started),
                               "input_tokens": int(row.get("input_tokens") or 0),
                               "output_tokens": int(row.get("output_tokens") or 0), "cost_usd": row.get("cost_usd"),
                               "seconds": float(row.get("seconds") or (time.time() - started)),
                               "retries": int(row.get("retries") or 0), "error": row.get("error") or error})
        if answer is None:
            raise GraderUnavailable(f"grader call failed: {error}")
        return answer


def _section(text: str, tag: str) -> str:
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.S)
    return m.group(1) if m else ""
