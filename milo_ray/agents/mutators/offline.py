"""Offline mutators: deterministic, LLM-free harness editors that read what an LLM
mutator reads and write a complete child harness by code transformation.

Inputs (MILO App. C.1): ``request.parent_dir/harness.py``; the evidence directory
(``traces/<task>/trajectory.json`` endings of failed tasks, ``ctrf.json``,
``result.json``); ``request.memory_markdown`` (the lineage snapshot; conventions in
``diagnosis.py``: node lines with ``mutation: <label>`` and ``verdict: admitted|rejected``,
`` | ``-separated, optional ``Δacc``; ``request.context['parent_node']`` names the
parent's node id when known). For SSR, ``request.context['records']`` — experience
records (summary, suggestions, w, a, u, q, task_id) — replace the traces as evidence.

Procedure: diagnose the dominant failure mode; read the history so an edit whose label
was rejected is not retried; choose the scope by the paper's rule — STRUCTURAL when the
parent's last children were rejected (2 for bold/explorer, 3 otherwise) or their Δacc
is flat, else REFINEMENT (one mechanism added, or one parameter stepped); apply it with
``milo_ray.harness.mechanisms``; write ``workdir/harness.py`` and a short report whose
first line is the edit label (``add X``, ``set X.p=v``, ``structural: <strategy> (...)``).

Personalities differ in real ways: ``conservative`` (small steps, prefers tuning,
little noise), ``bold`` (adds two mechanisms at once, bigger parameter steps, goes
structural sooner), ``explorer`` (high noise, sometimes off-target), ``sloppy``
(conservative choices but, with probability 0.3, writes a harness that does not
compile — validation must reject it). Every choice is a function of request.seed.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from milo_ray.agents.mutators.diagnosis import Diagnosis, History, diagnose_records, diagnose_traces, parse_memory
from milo_ray.agents.mutators.multiscale import MAX_CHANGES, Planner, aggregate
from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.harness.mechanisms import (
    FAILURE_MODES,
    MECHANISMS,
    add_mechanism,
    detect_mechanisms,
    mechanisms_addressing,
    remove_mechanism,
    set_param,
)
from milo_ray.harness.model import ENTRY_FILE, Harness


@dataclass(frozen=True)
class Personality:
    temperature: float  # Gumbel noise on candidate scores
    param_step: int  # grid steps per parameter edit
    structural_after: int  # rejected children in a row that force a structural change
    n_add: int  # mechanisms added by one refinement
    prefer_param: float  # score bonus for tuning an existing mechanism over adding one
    off_target: float = 0.0  # probability of working on the second-ranked mode
    error_rate: float = 0.0  # probability of writing a child that does not compile


PERSONALITIES: dict[str, Personality] = {
    "conservative": Personality(0.2, 1, 3, 1, 0.4),
    "bold": Personality(0.5, 2, 2, 2, -0.3),
    "explorer": Personality(1.2, 1, 2, 1, 0.0, off_target=0.25),
    "sloppy": Personality(0.4, 1, 3, 1, 0.2, error_rate=0.3),
}

# A gate that only works with a partner: adding it alone would be a hollow edit.
PARTNER = {"completion_gate": "verifier_subagent", "verifier_gate": "verifier_subagent"}

# Structural redesigns: a different control strategy per failure class (remove, add).
STRATEGIES: dict[str, list[tuple[str, tuple[str, ...], tuple[str, ...]]]] = {
    "premature_completion": [
        ("verification-gated stopping", ("plan_gate", "completion_gate", "rubric_gate"),
         ("verifier_subagent", "verifier_gate", "anti_stub_check")),
        ("plan-and-check discipline", ("completion_gate",), ("plan_protocol", "plan_nudge", "plan_gate")),
    ],
    "lax_verification": [
        ("independent adversarial verifier", ("completion_gate", "rubric_gate"), ("verifier_subagent", "verifier_gate")),
        ("reproduce-first rubric gate", ("verifier_gate", "completion_gate", "plan_protocol"),
         ("scientist_protocol", "rubric_gate")),
    ],
    "deadline_overrun": [
        ("scaffold floor and deadline clock", ("plan_gate", "completion_gate"), ("scaffold_floor", "deadline_governor")),
        ("floor with stub check", ("plan_gate",), ("scaffold_floor", "anti_stub_check", "deadline_governor")),
    ],
    "context_overflow": [
        ("division of labor", (), ("explorer_subagent", "coder_subagent", "delegation_protocol")),
        ("context discipline", (), ("context_clamp", "explorer_subagent")),
    ],
    "missing_knowhow": [
        ("know-how distillation", (), ("skills_library", "reflection_memory")),
        ("explore before acting", (), ("explorer_subagent", "delegation_protocol", "skills_library")),
    ],
    "tool_misuse": [
        ("safe editing", (), ("deepagents_stack", "coder_subagent", "reflection_memory")),
        ("learn from tool errors", (), ("reflection_memory", "edit_tool")),
    ],
}


def _rng(seed: int, personality: str) -> np.random.Generator:
    salt = int.from_bytes(hashlib.sha256(personality.encode()).digest()[:8], "little")
    return np.random.default_rng([int(seed) & (2**63 - 1), salt])


def _step(name: str, param: str, current: Any, mode: str, steps: int) -> Any | None:
    """The grid value ``steps`` away from ``current`` in the direction that addresses ``mode``."""
    grid = sorted(MECHANISMS[name].grid.get(param, ()))
    if not grid:
        return None
    if param == "max_chars" or (param == "relax_frac" and mode == "deadline_overrun"):
        direction = -1  # tighter clamp / earlier relaxation
    elif param == "final_frac":
        direction = 1 if current < 0.8 else -1
    elif param == "warn_frac":
        direction = -1 if mode == "deadline_overrun" else 1
    else:
        direction = 1  # more gates, iterations, notes
    pos = min(range(len(grid)), key=lambda i: abs(grid[i] - current))
    new = grid[max(0, min(len(grid) - 1, pos + direction * steps))]
    return None if new == current else new


def _parent_source(request: MutationRequest) -> tuple[str, str | None]:
    """The parent's ``harness.py`` as the mutator finds it on disk (falling back to the
    in-memory harness), or an error when it does not compile."""
    parent_file = Path(request.parent_dir) / ENTRY_FILE
    source = parent_file.read_text() if parent_file.exists() else request.parent.source
    try:
        compile(source, "harness.py", "exec")
    except SyntaxError as e:
        return source, f"parent harness does not compile: {e}"
    return source, None


class OfflineMutator:
    """Mutator protocol implementation (see module docstring)."""

    def __init__(self, personality: str = "conservative", name: str | None = None) -> None:
        if personality not in PERSONALITIES:
            raise ValueError(f"personality {personality!r}: choose one of {sorted(PERSONALITIES)}")
        self.personality = personality
        self.p = PERSONALITIES[personality]
        self.name = name or f"offline-{personality}"

    # ---------------------------------------------------------------- choices
    def _candidates(self, source: str, mode: str, present: dict[str, dict[str, Any]],
                    hist: History) -> list[tuple[float, str, list[tuple]]]:
        out: list[tuple[float, str, list[tuple]]] = []
        for name in mechanisms_addressing(mode):
            if name in present:
                for param, cur in present[name].items():
                    new = _step(name, param, cur, mode, self.p.param_step)
                    if new is not None:
                        label = f"set {name}.{param}={new}"
                        out.append((1.0 + self.p.prefer_param, label, [("set", name, param, new)]))
                continue
            ops: list[tuple] = [("add", name)]
            label = f"add {name}"
            partner = PARTNER.get(name)
            if partner and partner not in present:
                ops.insert(0, ("add", partner))
                label = f"add {name}+{partner}"
            spec = MECHANISMS[name]
            score = 1.0 + 0.3 * sum(s in present for s in spec.synergies) - 0.4 * sum(c in present for c in spec.conflicts)
            score += 0.2 * (spec.addresses[0] == mode)
            out.append((score, label, ops))
        return [c for c in out if c[1] not in hist.rejected]

    def _structural(self, mode_order: list[str], present: dict[str, Any], hist: History) -> tuple[str, list[tuple]] | None:
        for mode in mode_order:
            for strategy, drop, add in STRATEGIES[mode]:
                rm = [n for n in drop if n in present]
                ad = [n for n in add if n not in present]
                if not ad:
                    continue
                label = f"structural: {strategy} ({' '.join(['-' + n for n in rm] + ['+' + n for n in ad])})"
                if label in hist.rejected:
                    continue
                return label, [("remove", n) for n in rm] + [("add", n) for n in ad]
        return None

    def _stuck(self, hist: History) -> str | None:
        k = self.p.structural_after
        last = hist.recent[-k:]
        if len(last) >= k and not any(ok for _l, ok, _d in last):
            return f"last {k} children rejected"
        deltas = [d for _l, _ok, d in hist.recent[-3:] if d is not None]
        if len(deltas) >= 3 and max(abs(d) for d in deltas) < 0.005:
            return "pass rate flat across the last 3 edges"
        return None

    # ------------------------------------------------------------------ apply
    @staticmethod
    def _apply(source: str, ops: list[tuple]) -> str:
        for op in ops:
            if op[0] == "add":
                source = add_mechanism(source, op[1])
            elif op[0] == "remove":
                source = remove_mechanism(source, op[1])
            else:
                source = set_param(source, op[1], op[2], op[3])
        return source

    @staticmethod
    def _corrupt(source: str, rng: np.random.Generator) -> str:
        """A sloppy slip: drop a closing bracket in build_agent or leave a merge marker."""
        at = source.find("def build_agent")
        closers = [m.start() for m in re.finditer(r"[)\]]", source[at:])] if at >= 0 else []
        if closers and rng.random() < 0.7:
            i = at + closers[int(rng.integers(len(closers)))]
            out = source[:i] + source[i + 1:]
        else:
            out = source.replace("def build_agent", "<<<<<<< ours\ndef build_agent", 1)
        try:
            compile(out, "harness.py", "exec")
        except SyntaxError:
            return out
        return "<<<<<<< ours\n" + out

    # ------------------------------------------------------------------- main
    def mutate(self, request: MutationRequest) -> MutationResult:
        rng = _rng(request.seed, self.personality)
        source, error = _parent_source(request)
        if error:
            return MutationResult(None, error=error)
        records = (request.context or {}).get("records")
        diag: Diagnosis = diagnose_records(records) if isinstance(records, list) else diagnose_traces(request.evidence_dir)
        hist = parse_memory(request.memory_markdown, (request.context or {}).get("parent_node"))
        present = detect_mechanisms(source)
        ranked = diag.ranked() or list(rng.permutation(FAILURE_MODES))
        mode_order = ranked + [m for m in FAILURE_MODES if m not in ranked]
        if len(ranked) > 1 and rng.random() < self.p.off_target:
            mode_order = [mode_order[1], mode_order[0]] + mode_order[2:]
        stuck = self._stuck(hist)
        choice: tuple[str, list[tuple]] | None = None
        scope = "refinement"
        focus = mode_order[0]
        if stuck:
            choice = self._structural(mode_order, present, hist)
            scope = "structural"
        if choice is None:
            scope = "refinement"
            for mode in mode_order:
                cands = self._candidates(source, mode, present, hist)
                if not cands:
                    continue
                noisy = [(s + self.p.temperature * rng.gumbel(), lab, ops) for s, lab, ops in cands]
                noisy.sort(key=lambda c: -c[0])
                picked = noisy[: self.p.n_add]
                choice = (" & ".join(c[1] for c in picked), [op for c in picked for op in c[2]])
                focus = mode
                break
        if choice is None:
            return MutationResult(None, error="no untried edit addresses the diagnosed failure modes")
        label, ops = choice
        try:
            child = self._apply(source, ops)
        except ValueError as e:
            return MutationResult(None, report=label, error=f"edit could not be applied: {e}")
        if rng.random() < self.p.error_rate:
            child = self._corrupt(child, rng)
        workdir = Path(request.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / ENTRY_FILE).write_text(child)
        n = diag.counts.get(focus, 0)
        report = "\n".join([
            label,
            f"failure mode: {focus} ({n:.3g} of {diag.n_failed} failed {diag.source})",
            f"evidence task: {diag.examples.get(focus, '-')}",
            f"scope: {scope}" + (f" ({stuck})" if stuck and scope == "structural" else ""),
            f"change: {label}",
        ])
        files = {**request.parent.files, ENTRY_FILE: child}
        return MutationResult(Harness(files, name=f"{request.parent.name or 'harness'}+"), report=report)


class OfflineCandidateOptimizer(OfflineMutator):
    """SSR's candidate optimizer: the same engine, reading ``context['records']``.

    With records it plans an evidence-proportional edit (``multiscale.py``): one change
    per failure mode the prefix's records support, so a larger, more representative
    prefix yields a broader, better-supported child. Without records (or when no
    change can be planned) it falls back to the single-edit engine above.
    """

    def __init__(self, personality: str = "conservative", name: str | None = None,
                 max_changes: int = MAX_CHANGES) -> None:
        super().__init__(personality, name or f"offline-optimizer-{personality}")
        self.planner = Planner(temperature=self.p.temperature, step=self.p.param_step,
                               max_changes=max_changes + self.p.n_add - 1, partner=PARTNER, stepper=_step)

    def mutate(self, request: MutationRequest) -> MutationResult:
        records = (request.context or {}).get("records")
        if not isinstance(records, list) or not records:
            return super().mutate(request)
        rng = _rng(request.seed, self.personality)
        source, error = _parent_source(request)
        if error:
            return MutationResult(None, error=error)
        ev = aggregate(records)
        hist = parse_memory(request.memory_markdown, (request.context or {}).get("parent_node"))
        plan = self.planner.plan(ev, detect_mechanisms(source), rng, exclude=hist.rejected)
        child, applied, failed = source, [], []
        for change in plan.changes:  # one change at a time: an impossible one is dropped, not fatal
            try:
                child = self._apply(child, list(change.ops))
                applied.append(change)
            except ValueError as e:
                failed.append(f"{change.label}: {e}")
        if not applied:
            return super().mutate(request)
        if rng.random() < self.p.error_rate:
            child = self._corrupt(child, rng)
        workdir = Path(request.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / ENTRY_FILE).write_text(child)
        label = " & ".join(c.label for c in applied)
        scope = "refinement" if len(applied) == 1 else f"redesign ({len(applied)} changes)"
        lines = [label,
                 f"evidence: {ev.n_records} records ({ev.n_failed} failed), failure weight {ev.failure_weight:.3g}"
                 + ("; time-pressed: no new stop-gates" if plan.time_pressed else ""),
                 f"scope: {scope}"]
        for mode in plan.modes:
            done = [c.label for c in applied if c.mode == mode]
            why = ", ".join(done) if done else plan.skipped.get(mode, "change could not be applied")
            lines.append(f"failure mode: {mode} (weight {ev.mode_weight[mode]:.3g}, share {ev.share(mode):.0%}, "
                         f"{ev.mode_records[mode]} records, e.g. {ev.examples.get(mode, '-')}) -> {why}")
        lines += [f"dropped: {f}" for f in failed]
        lines.append(f"change: {label}")
        files = {**request.parent.files, ENTRY_FILE: child}
        return MutationResult(Harness(files, name=f"{request.parent.name or 'harness'}+"), report="\n".join(lines))
