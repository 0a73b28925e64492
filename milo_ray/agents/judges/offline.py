"""The offline experience judge: a deterministic, documented stand-in for the LLM judge.

It reads what an LLM judge would read — the trajectory, the ctrf test report, the
score, the pool statistics in ``feedback['pool']`` — and answers with the verdict
schema of ``milo_ray.agents.judges.schema``:

* failure modes are recognized from the trajectory: explicit tags the trajectory
  carries (``failure_mode(s)``, per-step ``kind``/``event``), the timed-out flag,
  and cue phrases in every text field of the trajectory and in the failed tests'
  messages (a fixed cue table per mode in ``FAILURE_MODES``);
* **w (importance)** — how general the failure is across the pool: a per-mode prior
  (process failures such as premature completion or lax verification recur on many
  tasks; missing know-how is task-specific) averaged with the share of the pool the
  mode can plausibly affect (the pool's timeout rate for deadline overruns, its
  unresolved rate otherwise). Resolved trajectories get a low w: a success teaches
  less that transfers;
* **a (actionability)** — whether a known mechanism addresses the recognized mode
  (``MECHANISMS[name].addresses``), scaled by how clearly the mode stands out;
* **u (confidence)** — high for a clean pass or a clear single-mode failure, lower
  when the ending is ambiguous or noisy: partial credit, an infrastructure or
  harness error, competing modes, or no recognizable cue at all;
* a summary, the transferable insight, and suggestions that name the mechanisms to
  add (or the parameter to tune).

``malformed_rate`` makes a seeded fraction of answers malformed (non-JSON, a score
outside [0, 1], or a missing field) to exercise the caller's re-ask path.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any, Iterable

import numpy as np

from milo_ray.llm.usage import AgentReply, AgentUsage
from milo_ray.harness.mechanisms import FAILURE_MODES, MECHANISMS

# Generality prior per failure mode (see the module docstring).
MODE_PRIOR: dict[str, float] = {
    "premature_completion": 0.85,
    "lax_verification": 0.8,
    "deadline_overrun": 0.7,
    "context_overflow": 0.6,
    "tool_misuse": 0.55,
    "missing_knowhow": 0.35,
}

# Cue phrases (lower case) that reveal a mode in the trajectory's ending or in the
# failed tests' messages. Specific phrases only: generic words ("error", "expected")
# would fire on every failing trace and drown the signal.
MODE_CUES: dict[str, tuple[str, ...]] = {
    "premature_completion": ("should be complete", "without further checks", "declared done", "stopped early",
                             "finished early", "not implemented", "required behaviour missing",
                             "required behavior missing", "left a stub"),
    "deadline_overrun": ("time limit", "timed out", "attempt was stopped", "ran out of time", "deadline",
                         "time cap"),
    "lax_verification": ("smoke check", "sanity check", "confirms the fix works", "did not run the tests",
                         "without running the tests", "edge case returns wrong value", "weak check"),
    "missing_knowhow": ("unknown option", "do not know how", "don't know how", "no matching subcommand",
                        "not configured", "command not found", "unfamiliar toolchain"),
    "context_overflow": ("context window exceeded", "context length", "lost track", "characters of output",
                         "summarized and dropped", "inconsistent state"),
    "tool_misuse": ("invalid arguments", "not found in file", "overwriting the whole file", "wrote 0 bytes",
                    "truncated or malformed", "malformed tool call", "destructive"),
}

# How many trailing trajectory steps form the "ending" the judge reads closely.
ENDING_STEPS = 8

_TAG_KEYS = ("failure_mode", "failure_modes", "kind", "event", "type", "mode")


def _strings(obj: Any, depth: int = 0) -> Iterable[str]:
    """Every string in a nested JSON object (bounded depth)."""
    if depth > 8:
        return
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v, depth + 1)


def _tags(obj: Any, modes: tuple[str, ...], depth: int = 0) -> Iterable[str]:
    """Failure-mode names given explicitly under tag-like keys anywhere in the trajectory."""
    if depth > 8:
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in _TAG_KEYS:
                for s in ([v] if isinstance(v, str) else v if isinstance(v, list) else []):
                    if isinstance(s, str) and s in modes:
                        yield s
            else:
                yield from _tags(v, modes, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            yield from _tags(v, modes, depth + 1)


def _failed_test_messages(ctrf: dict[str, Any]) -> list[str]:
    tests = (ctrf.get("results") or ctrf).get("tests") or []
    out = []
    for t in tests:
        if isinstance(t, dict) and t.get("status") not in ("passed", "skipped"):
            out.append(" ".join(str(t.get(k, "")) for k in ("message", "trace")))
    return out


class OfflineJudge:
    """Deterministic judge; see the module docstring for how w, a, u are computed."""

    name = "offline-judge"

    def __init__(self, malformed_rate: float = 0.0, seed: int = 0, max_suggestions: int = 3) -> None:
        if not 0.0 <= malformed_rate <= 1.0:
            raise ValueError(f"OfflineJudge: malformed_rate={malformed_rate} must be in [0, 1]")
        self.malformed_rate = float(malformed_rate)
        self.seed = int(seed)
        self.max_suggestions = int(max_suggestions)
        self._asked: Counter[str] = Counter()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ analysis
    def failure_modes(self, trajectory: dict[str, Any], feedback: dict[str, Any]) -> Counter[str]:
        """Evidence strength per failure mode: explicit tags (3 each), each cue found in
        the trajectory's ending or in a distinct failed-test message (1 each), the
        timed-out flag (3) and a model tool call in the ending whose arguments did not
        parse (a step's ``invalid_tool_calls``: 3, tool misuse)."""

        modes = tuple(FAILURE_MODES)
        hits: Counter[str] = Counter()
        for m in _tags(trajectory, modes):
            hits[m] += 3
        steps = trajectory.get("steps") if isinstance(trajectory, dict) else None
        ending = steps[-ENDING_STEPS:] if isinstance(steps, list) else trajectory
        rest = {k: v for k, v in trajectory.items() if k != "steps"} if isinstance(trajectory, dict) else {}
        text = " \n".join(s.lower() for s in [*_strings(ending), *_strings(rest.get("final", {}))])
        messages = sorted({m.lower() for m in _failed_test_messages(feedback.get("ctrf") or {})})
        for mode in modes:
            for cue in MODE_CUES.get(mode, ()):
                hits[mode] += (cue in text) + sum(1 for m in messages if cue in m)
        final = trajectory.get("final") if isinstance(trajectory, dict) else None
        if feedback.get("timed_out") or (isinstance(final, dict) and final.get("status") == "timeout"):
            hits["deadline_overrun"] += 3
        if isinstance(steps, list) and any(isinstance(s, dict) and s.get("invalid_tool_calls") for s in ending):
            # The step's structure says it whatever words the model client chose for the
            # parse error (an answer of only such calls ends the loop with no text at all).
            hits["tool_misuse"] += 3
        return +hits

    def mechanisms_for(self, mode: str) -> list[str]:
        """Mechanisms that address ``mode``, most specific first (fewest other modes)."""
        names = [n for n, spec in MECHANISMS.items() if mode in spec.addresses]
        return sorted(names, key=lambda n: (len(MECHANISMS[n].addresses), n))

    def verdict(self, trajectory: dict[str, Any], feedback: dict[str, Any], task_id: str) -> dict[str, Any]:
        """The well-formed verdict for one trajectory (no malformed injection)."""
        score = float(feedback.get("score", 0.0))
        resolved = bool(feedback.get("resolved", score >= 1.0))
        pool = feedback.get("pool") or {}
        hits = self.failure_modes(trajectory, feedback)
        ranked = sorted(hits.items(), key=lambda kv: (-kv[1], kv[0]))
        error_kind = feedback.get("error_kind")

        if resolved and not feedback.get("timed_out"):
            w = 0.25
            # A success that still shows a mode is worth a little more: it was a near miss.
            mode = ranked[0][0] if ranked else None
            a = 0.3 if mode else 0.15
            u = 0.9 if not ranked else 0.75
            mechs = self.mechanisms_for(mode)[:1] if mode else []
            summary = (f"Task {task_id} resolved (score {score:.2f})."
                       + (f" Signs of {mode.replace('_', ' ')} appeared but did not cost the task." if mode else
                          " The harness's current workflow handled it cleanly."))
            insight = ("Keep the mechanisms that made this pass; guard the near miss."
                       if mode else "The current workflow suffices for tasks like this one.")
            suggestions = [f"Keep the current workflow; consider {m} to guard against {mode.replace('_', ' ')}."
                           for m in mechs] or ["No change needed for tasks like this one."]
            return {"w": w, "a": a, "u": u, "summary": summary, "insights": insight,
                    "suggestions": suggestions, "failure_modes": [mode] if mode else [], "mechanisms": mechs}

        if not ranked:
            mode, strength, second = None, 0, 0
        else:
            mode, strength = ranked[0]
            second = ranked[1][1] if len(ranked) > 1 else 0
        unresolved = 1.0 - float(pool.get("resolved_rate", 0.5))
        if mode is None:
            w = 0.3 * max(unresolved, 0.1)
            a, u = 0.1, 0.3
            summary = f"Task {task_id} failed (score {score:.2f}) with no recognizable failure pattern."
            insight = "The cause of this failure is unclear from the trace."
            return {"w": round(w, 4), "a": a, "u": u, "summary": summary, "insights": insight,
                    "suggestions": ["Inspect the raw trajectory before changing the harness."],
                    "failure_modes": [], "mechanisms": []}

        share = float(pool.get("timeout_rate", unresolved)) if mode == "deadline_overrun" else unresolved
        w = 0.5 * MODE_PRIOR.get(mode, 0.5) + 0.5 * min(1.0, max(0.0, share))
        clarity = strength / (strength + second)  # 1.0 when one mode stands alone
        mechs = self.mechanisms_for(mode)
        a = (0.55 + 0.4 * clarity) if mechs else 0.15
        u = 0.9
        if 0.0 < score < 1.0:
            u -= 0.15  # partial credit: which part failed is less certain
        if error_kind in ("infra", "harness"):
            u -= 0.3  # the ending says more about the setup than the workflow
        u -= 0.3 * (1.0 - clarity)  # competing explanations
        if strength < 2:
            u -= 0.15  # a single weak cue
        u = min(1.0, max(0.05, u))

        label = mode.replace("_", " ")
        summary = f"Task {task_id} failed (score {score:.2f}); the trace shows {label}."
        if second:
            summary += f" Also present: {ranked[1][0].replace('_', ' ')}."
        insight = f"{label.capitalize()} is a recurring process failure that a harness mechanism can counter."
        suggestions = []
        for m in mechs[: self.max_suggestions]:
            spec = MECHANISMS[m]
            line = f"Add {m}: {spec.description}"
            if spec.params:
                p, v = next(iter(spec.params.items()))
                line += f" If it is already present, tune {p} (now {v})."
            suggestions.append(line)
        return {"w": round(w, 4), "a": round(a, 4), "u": round(u, 4), "summary": summary, "insights": insight,
                "suggestions": suggestions or [f"Counter {label} in the harness instructions."],
                "failure_modes": [m for m, _ in ranked[:2]], "mechanisms": mechs[: self.max_suggestions]}

    # ------------------------------------------------------------------ protocol
    def judge(self, trajectory: dict[str, Any], feedback: dict[str, Any], task_id: str) -> AgentReply[Any]:
        t0 = time.perf_counter()
        out = self._answer(trajectory, feedback, task_id)
        return AgentReply(out, AgentUsage(cost_usd=0.0, seconds=time.perf_counter() - t0))

    def _answer(self, trajectory: dict[str, Any], feedback: dict[str, Any], task_id: str) -> Any:
        with self._lock:
            attempt = self._asked[task_id]
            self._asked[task_id] += 1
        out = self.verdict(trajectory, feedback, task_id)
        if self.malformed_rate > 0:
            rng = np.random.default_rng([self.seed, attempt, *task_id.encode()])
            if rng.random() < self.malformed_rate:
                kind = int(rng.integers(0, 3))
                if kind == 0:
                    return "the trajectory shows a failure; w=0.8"  # not JSON
                if kind == 1:
                    return {**out, "w": 1.0 + float(rng.random()) + 0.01}  # out of range
                return {k: v for k, v in out.items() if k != "summary"}  # missing field
        return json.loads(json.dumps(out))
