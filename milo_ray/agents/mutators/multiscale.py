"""Evidence-proportional edit plans for SSR's candidate optimizer (papers/002 §4.2).

SSR hands each candidate a nested prefix of the ranked experience records; a larger,
more representative prefix should justify a broader edit. This module turns one
prefix into an edit plan the way a careful LLM optimizer reading the records would:

1. **Aggregate** the records into failure-mode evidence: each record's weight w·q goes
   to the modes it points to (the judge's ``failure_modes`` when given — the first at
   full weight, the rest at half — else cue phrases in its summary/insight), and to the
   mechanisms its suggestions name. Resolved near-misses count at a quarter weight.
2. **Decide the breadth** from the evidence: a mode earns its own change when at least
   ``MIN_RECORDS`` distinct records show it *and* its weight is at least ``MIN_SHARE``
   of the prefix's failure weight. Small prefixes clear few modes (1–2 focused
   changes); the full prefix clears the recurring ones (a broader redesign), capped.
3. **Pick one change per mode**: the best-supported mechanism not already present
   (support from the suggestions, breadth over the other observed modes, synergies
   with what is present or already chosen), or — when a present mechanism addresses
   the mode and the evidence says it under-fires — a step of its parameter. Known
   conflicts (``MechanismSpec.conflicts``) are never added; a change whose mechanism
   already covers a later mode removes that mode from the plan.
4. **Respect the time budget**: when deadline overruns are a large share of the
   failures the harness cannot afford more stop-gates (middleware that sends the agent
   back when it would finish); none is added and no gate is tightened, and relaxing a
   present gate becomes a candidate change for the deadline mode.

Only what an LLM optimizer sees is used: the records, the parent's source (via
``detect_mechanisms``) and the mechanism catalog as known techniques. Every choice
is a function of the evidence and the injected ``numpy.random.Generator``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from milo_ray.agents.mutators.diagnosis import RECORD_PATTERNS
from milo_ray.harness.mechanisms import FAILURE_MODES, MECHANISMS, mechanisms_addressing

MIN_RECORDS = 3  # distinct records a mode needs before it earns its own change
MIN_SHARE = 0.12  # ... and its share of the prefix's failure weight
MAX_CHANGES = 6  # a redesign still changes a handful of things, not the whole harness
RECORDS_PER_CHANGE = 15  # records of evidence that license one more change
SECOND_PASS_RECORDS = 2  # an unqualified mode still gets a deepening change with this many records
TIME_PRESSED_SHARE = 0.3  # deadline share of failure weight above which gates are unaffordable
NEAR_MISS_WEIGHT = 0.25  # a resolved record that still shows a mode

# Parameters that make a gate bounce the agent more often (raising them costs time).
GATE_PARAMS = ("max_gates", "max_iterations")


def is_gate(name: str) -> bool:
    """A stop-gate: middleware that re-opens the episode when the agent would finish.
    Read from the catalog: a completion hook (after_model) or a bounce-count parameter."""
    spec = MECHANISMS[name]
    return spec.kind == "middleware" and ("after_model" in spec.hooks or any(p in spec.params for p in GATE_PARAMS))


@dataclass
class Evidence:
    """A prefix's records aggregated into failure-mode and mechanism evidence."""

    n_records: int = 0
    n_failed: int = 0
    failure_weight: float = 0.0  # Σ w·q over the failed records
    mode_weight: Counter = field(default_factory=Counter)  # mode -> Σ w·q pointing to it
    mode_records: Counter = field(default_factory=Counter)  # mode -> distinct records
    mech_support: Counter = field(default_factory=Counter)  # mechanism -> Σ w·q of records naming it
    examples: dict[str, str] = field(default_factory=dict)

    def share(self, mode: str) -> float:
        return self.mode_weight[mode] / self.failure_weight if self.failure_weight > 0 else 0.0

    def ranked(self) -> list[str]:
        return sorted((m for m in FAILURE_MODES if self.mode_weight[m] > 0),
                      key=lambda m: (-self.mode_weight[m], FAILURE_MODES.index(m)))

    def qualified(self, min_records: int = MIN_RECORDS, min_share: float = MIN_SHARE) -> list[str]:
        """Modes whose evidence justifies a change of their own, strongest first."""
        return [m for m in self.ranked() if self.mode_records[m] >= min_records and self.share(m) >= min_share]

    @property
    def time_pressed(self) -> bool:
        return self.share("deadline_overrun") >= TIME_PRESSED_SHARE


def _num(x: Any, default: float) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if np.isfinite(v) else default


_NAME_RE = {n: re.compile(rf"\b{re.escape(n)}\b|\b{re.escape(n.replace('_', ' '))}\b", re.I) for n in MECHANISMS}


def aggregate(records: Sequence[dict[str, Any]]) -> Evidence:
    """Aggregate experience records (dicts as in ``ExperienceRecord.as_dict``)."""
    ev = Evidence()
    for r in records:
        if not isinstance(r, dict):
            continue
        ev.n_records += 1
        q = r.get("q")
        if q is None:
            q = _num(r.get("a"), 1.0) * _num(r.get("u"), 1.0)
        weight = max(_num(r.get("w"), 1.0) * _num(q, 1.0), 1e-3)
        resolved = bool(r.get("resolved", False)) or _num(r.get("score"), 0.0) >= 1.0
        if resolved:
            weight *= NEAR_MISS_WEIGHT
        else:
            ev.n_failed += 1
            ev.failure_weight += weight
        # Which modes the record points to: the judge's own labels first.
        modes: dict[str, float] = {}
        for i, m in enumerate(r.get("failure_modes") or []):
            if m in FAILURE_MODES and m not in modes:
                modes[m] = 1.0 if i == 0 else 0.5
        if not modes:
            text = " ".join([str(r.get("summary", "")), str(r.get("insights", ""))])
            for m, pat in RECORD_PATTERNS.items():
                if pat.search(text):
                    modes[m] = 1.0
        suggestions = " ".join(map(str, r.get("suggestions") or []))
        named = [n for n in MECHANISMS if n in (r.get("mechanisms") or []) or _NAME_RE[n].search(suggestions)]
        if not modes and named:  # only suggestions: they point to what the named mechanisms address
            votes = Counter(m for n in named for m in MECHANISMS[n].addresses[:1])
            top = max(votes.values())
            modes = {m: 1.0 for m, c in votes.items() if c == top}
        for m, f in modes.items():
            ev.mode_weight[m] += weight * f
            if not resolved:
                ev.mode_records[m] += 1
                ev.examples.setdefault(m, str(r.get("task_id", "?")))
        for k, n in enumerate(named):  # the judge lists the most specific mechanism first
            ev.mech_support[n] += weight / (1.0 + 0.5 * k)
    return ev


@dataclass(frozen=True)
class Change:
    """One planned change: the ops for ``OfflineMutator._apply`` and why."""

    mode: str
    label: str
    ops: tuple[tuple, ...]
    score: float


@dataclass
class Plan:
    changes: list[Change]
    modes: list[str]  # the modes the evidence qualified (in evidence order)
    time_pressed: bool
    skipped: dict[str, str] = field(default_factory=dict)  # mode -> why it got no change

    @property
    def label(self) -> str:
        return " & ".join(c.label for c in self.changes)

    @property
    def ops(self) -> list[tuple]:
        return [op for c in self.changes for op in c.ops]


class Planner:
    """Builds an edit plan from aggregated evidence (see the module docstring).

    temperature: Gumbel noise on option scores (seeded); step: grid steps per tune;
    per_mode: changes per qualified mode; max_changes: cap on the plan.
    """

    def __init__(self, *, temperature: float = 0.2, step: int = 1, per_mode: int = 1,
                 max_changes: int = MAX_CHANGES, partner: dict[str, str] | None = None,
                 stepper: Any = None) -> None:
        self.temperature = float(temperature)
        self.step = int(step)
        self.per_mode = int(per_mode)
        self.max_changes = int(max_changes)
        self.partner = partner or {}
        self.stepper = stepper

    # ------------------------------------------------------------------ options
    def _add_option(self, name: str, mode: str, ev: Evidence, have: set[str], top: float) -> tuple[float, str, tuple] | None:
        spec = MECHANISMS[name]
        if name in have or any(c in have for c in spec.conflicts) or any(name in MECHANISMS[h].conflicts for h in have):
            return None
        ops: list[tuple] = [("add", name)]
        label = f"add {name}"
        partner = self.partner.get(name)
        if partner and partner not in have:
            if any(c in have for c in MECHANISMS[partner].conflicts):
                return None
            ops.insert(0, ("add", partner))
            label = f"add {name}+{partner}"
        added = [op[1] for op in ops]
        if ev.time_pressed and any(is_gate(n) for n in added):
            return None  # the traces say the harness cannot afford another stop-gate
        mode_w = max(ev.mode_weight[mode], 1e-9)
        support = min(1.0, ev.mech_support[name] / mode_w)
        breadth = sum(ev.mode_weight[m] for m in spec.addresses if m != mode) / top
        synergy = sum(s in have for s in spec.synergies) + sum(name in MECHANISMS[h].synergies for h in have)
        score = 1.0 + 0.8 * support + 0.4 * min(breadth, 1.0) + 0.15 * min(synergy, 2) + 0.2 * (spec.addresses[0] == mode)
        return score, label, tuple(ops)

    def _tune_options(self, mode: str, ev: Evidence, present: dict[str, dict[str, Any]],
                      have: set[str]) -> list[tuple[float, str, tuple]]:
        """Step a present mechanism that addresses ``mode`` (it under-fires), or — for a
        time-pressed harness's deadline mode — relax a present gate."""
        out = []
        for name, params in present.items():
            if name not in have:
                continue
            addresses = mode in MECHANISMS[name].addresses
            relax = mode == "deadline_overrun" and ev.time_pressed and is_gate(name)
            if not (addresses or relax):
                continue
            for param, cur in params.items():
                if relax:
                    new = _relax(name, param, cur)
                else:
                    new = self.stepper(name, param, cur, mode, self.step)
                    if new is not None and ev.time_pressed and param in GATE_PARAMS and new > cur:
                        new = None  # more bounces cost time the harness does not have
                if new is None:
                    continue
                support = min(1.0, ev.mech_support[name] / max(ev.mode_weight[mode], 1e-9))
                score = (0.9 if relax else 0.8) + 0.6 * support
                out.append((score, f"set {name}.{param}={new}", (("set", name, param, new),)))
        return out

    # --------------------------------------------------------------------- plan
    def budget(self, ev: Evidence) -> int:
        """How many changes the prefix licenses: one per ``RECORDS_PER_CHANGE`` records
        beyond the first change, capped — more (and more representative) evidence
        supports a broader edit."""
        return max(1, min(self.max_changes, 1 + ev.n_records // RECORDS_PER_CHANGE))

    def _options(self, mode: str, ev: Evidence, present: dict[str, dict[str, Any]], have: set[str], top: float,
                 taken: set[str], exclude: set[str]) -> list[tuple[float, str, tuple]]:
        opts = [o for o in (self._add_option(n, mode, ev, have, top) for n in mechanisms_addressing(mode)) if o]
        opts += self._tune_options(mode, ev, present, have)
        touched = {op[1] for lab in taken for op in self._ops_of.get(lab, ())}
        return [o for o in opts if o[1] not in exclude and o[1] not in taken
                and not (o[2][0][0] == "set" and o[2][0][1] in touched)]

    def plan(self, ev: Evidence, present: dict[str, dict[str, Any]], rng: np.random.Generator,
             exclude: set[str] = frozenset()) -> Plan:
        qualified = ev.qualified()
        ranked = ev.ranked()
        modes = qualified or ranked[:1] or [str(rng.choice(FAILURE_MODES))]
        top = max([ev.mode_weight[m] for m in ranked] + [1e-9])
        budget = self.budget(ev)
        have = set(present)
        plan = Plan([], list(modes), ev.time_pressed)
        self._ops_of: dict[str, tuple] = {}
        covered: set[str] = set()

        def take(mode: str, opts: list[tuple[float, str, tuple]]) -> None:
            noisy = sorted(((s + self.temperature * rng.gumbel(), s, lab, ops) for s, lab, ops in opts),
                           key=lambda o: -o[0])
            for _n, s, lab, ops in noisy[: self.per_mode]:
                plan.changes.append(Change(mode, lab, ops, s))
                self._ops_of[lab] = ops
                for op in ops:
                    if op[0] == "add":
                        have.add(op[1])
                        covered.update(set(MECHANISMS[op[1]].addresses) & set(modes) - {mode})

        # Pass 1: one change per qualified mode, strongest evidence first.
        for mode in modes:
            if len(plan.changes) >= budget:
                plan.skipped[mode] = "change budget of this prefix reached"
                continue
            if mode in covered:
                plan.skipped[mode] = "covered by an earlier change"
                continue
            opts = self._options(mode, ev, present, have, top, {c.label for c in plan.changes}, exclude)
            if not opts:
                plan.skipped[mode] = "no affordable, conflict-free option"
                continue
            take(mode, opts)
        # Pass 2: budget left over deepens the plan — a further change for each mode with
        # recurring evidence (qualified first), so a broad prefix gets a broad redesign.
        extra = modes + [m for m in ranked if m not in modes and ev.mode_records[m] >= SECOND_PASS_RECORDS]
        while len(plan.changes) < budget:
            before = len(plan.changes)
            for mode in extra:
                if len(plan.changes) >= budget:
                    break
                opts = self._options(mode, ev, present, have, top, {c.label for c in plan.changes}, exclude)
                if opts:
                    take(mode, opts)
                    plan.skipped.pop(mode, None)
            if len(plan.changes) == before:
                break
        return plan


def _relax(name: str, param: str, current: Any) -> Any | None:
    """One grid step toward fewer/earlier-relaxing bounces, or None when already minimal."""
    grid = sorted(MECHANISMS[name].grid.get(param, ()))
    if not grid or param not in GATE_PARAMS + ("relax_frac",):
        return None
    pos = min(range(len(grid)), key=lambda i: abs(grid[i] - current))
    new = grid[max(0, pos - 1)]
    return None if new == current else new
