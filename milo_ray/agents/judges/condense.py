"""Condensing a trajectory to the judge's reading budget: a pure, deterministic rule.

The judge reads a trajectory as the text :func:`render` makes of it (one JSON object,
one step per line). Its size in tokens is *estimated* as ``ceil(chars / 4)`` of that
text (:func:`estimate_tokens`); no tokenizer is loaded, so the rule is the same for
every model and the caller keeps a margin for the estimate's error.

Steps are handled in **units** so that a tool call is never separated from its result:
a unit is one non-tool step followed by the ``tool`` steps right after it (the results
of the calls it made). The first ``FIRST_UNITS`` units (the task instruction and the
first action) and the last ``LAST_UNITS`` units (the ending, which decides most about a
verdict) are the *kept* units; the others are the *middle*.

:func:`condense` applies these stages in order and stops at the first that fits:

0. the trajectory fits: it is returned unchanged (the same object);
1. a top-level ``calls`` list (per model-call accounting, which ``final`` already
   totals) is replaced by ``calls_omitted``, its length;
2. every string longer than ``MIDDLE_FIELD_CHARS`` inside a middle step is cut to its
   head and tail with a ``[... N chars omitted ...]`` marker in between (a command's
   start and its error usually both survive);
3. middle units are dropped oldest first; the dropped run is replaced by one marker
   step ``{"omitted": "[... K steps omitted ...]", "from_step": i, "to_step": j}``;
4. strings in the kept units and in the non-step fields are cut the same way, with a
   limit halving from ``KEPT_FIELD_CHARS`` down to ``MIN_FIELD_CHARS``;
5. kept units are dropped too (into the same marker): first the opening units after
   the first one, then the ending's units oldest first, so the instruction and the
   very last unit are the last to go.

If even that does not fit, ``CondenseInfo.fits`` is False and the caller decides (the
LLM judge then makes no call). Inputs are never mutated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

FIRST_UNITS = 2
LAST_UNITS = 6
MIDDLE_FIELD_CHARS = 600
KEPT_FIELD_CHARS = 4000
MIN_FIELD_CHARS = 200


@dataclass(frozen=True)
class CondenseInfo:
    """What :func:`condense` cut. ``tokens`` is the estimate of the result."""

    condensed: bool
    tokens_before: int
    tokens: int
    budget_tokens: int
    steps_before: int
    steps_omitted: int = 0
    omitted_range: tuple[int, int] | None = None  # first and last omitted step index
    fields_shortened: int = 0
    calls_omitted: int = 0
    fits: bool = True

    def describe(self) -> str:
        """One sentence for the judge: what it is not seeing."""
        if not self.condensed:
            return "The trajectory is shown whole."
        parts = []
        if self.steps_omitted:
            lo, hi = self.omitted_range or (0, 0)
            parts.append(f"{self.steps_omitted} of {self.steps_before} steps were omitted (steps {lo} to {hi}, "
                         "marked where they were)")
        if self.fields_shortened:
            parts.append(f"{self.fields_shortened} long text fields were cut to their start and end "
                         "(marked '[... N chars omitted ...]')")
        if self.calls_omitted:
            parts.append(f"the per-call accounting list ({self.calls_omitted} model calls) was replaced by its count")
        return (f"The trajectory was condensed from about {self.tokens_before} to about {self.tokens} tokens to fit "
                f"a budget of {self.budget_tokens}: " + "; ".join(parts) + ". The opening and the ending steps "
                "are kept whole as far as the budget allowed.")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str)


def render(trajectory: dict[str, Any]) -> str:
    """The text the judge reads: a JSON object, ``steps`` last with one step per line."""
    head = [f"  {_dumps(k)}: {_dumps(v)}" for k, v in trajectory.items() if k != "steps"]
    steps = trajectory.get("steps")
    if isinstance(steps, list):
        body = ",\n".join(f"    {_dumps(s)}" for s in steps)
        head.append('  "steps": [\n' + body + "\n  ]" if steps else '  "steps": []')
    elif "steps" in trajectory:
        head.append(f'  "steps": {_dumps(steps)}')
    return "{\n" + ",\n".join(head) + "\n}"


def estimate_tokens(text: str) -> int:
    """ceil(chars / 4): the rule's token estimate."""
    return math.ceil(len(text) / 4)


def _cut(text: str, limit: int) -> str:
    """``text`` cut to its head and tail around a marker, when longer than ``limit``."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}[... {len(text) - 2 * half} chars omitted ...]{text[len(text) - half:]}"


def _shorten(obj: Any, limit: int, counter: list[int]) -> Any:
    """A copy of ``obj`` with every string longer than ``limit`` cut; counts the cuts."""
    if isinstance(obj, str):
        if len(obj) > limit:
            counter[0] += 1
            return _cut(obj, limit)
        return obj
    if isinstance(obj, dict):
        return {k: _shorten(v, limit, counter) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_shorten(v, limit, counter) for v in obj]
    return obj


def _units(steps: list[Any]) -> list[list[int]]:
    """Step indices grouped so that tool results stay with the step that called them."""
    units: list[list[int]] = []
    for i, s in enumerate(steps):
        if units and isinstance(s, dict) and s.get("role") == "tool":
            units[-1].append(i)
        else:
            units.append([i])
    return units


def _step_no(steps: list[Any], i: int) -> int:
    s = steps[i]
    return int(s["step"]) if isinstance(s, dict) and isinstance(s.get("step"), int) else i


class _Work:
    """The mutable state of one condensation (a copy; the input is never touched)."""

    def __init__(self, trajectory: dict[str, Any], budget_tokens: int) -> None:
        self.header = {k: v for k, v in trajectory.items() if k != "steps"}
        raw = trajectory.get("steps")
        self.has_steps = "steps" in trajectory
        self.steps: list[Any] = list(raw) if isinstance(raw, list) else []
        self.other_steps = None if isinstance(raw, list) else raw
        self.units = _units(self.steps)
        self.dropped: set[int] = set()  # unit indices
        self.shortened = [0]
        self.calls_omitted = 0
        self.budget = budget_tokens

    def build(self) -> dict[str, Any]:
        out = dict(self.header)
        if not self.has_steps:
            return out
        if self.other_steps is not None:
            out["steps"] = self.other_steps
            return out
        steps: list[Any] = []
        marker_at = None
        for u, idx in enumerate(self.units):
            if u in self.dropped:
                if marker_at is None:
                    marker_at = len(steps)
                    steps.append(None)
                continue
            steps.extend(self.steps[i] for i in idx)
        if marker_at is not None:
            gone = sorted(i for u in self.dropped for i in self.units[u])
            lo, hi = _step_no(self.steps, gone[0]), _step_no(self.steps, gone[-1])
            steps[marker_at] = {"omitted": f"[... {len(gone)} steps omitted ...]", "from_step": lo, "to_step": hi}
        out["steps"] = steps
        return out

    def tokens(self) -> int:
        return estimate_tokens(render(self.build()))

    def fits(self) -> bool:
        return self.tokens() <= self.budget

    def shorten_units(self, units: list[int], limit: int) -> None:
        for u in units:
            for i in self.units[u]:
                self.steps[i] = _shorten(self.steps[i], limit, self.shortened)

    def drop_until_fits(self, order: list[int]) -> None:
        # The size is tracked by subtraction (a dropped step's line is its JSON plus
        # indent and separator) and re-rendered only when it looks small enough, so a
        # long trajectory is not rendered once per dropped unit.
        size = len(render(self.build()))
        for u in order:
            if math.ceil(size / 4) <= self.budget:
                size = len(render(self.build()))
                if math.ceil(size / 4) <= self.budget:
                    return
            self.dropped.add(u)
            size -= sum(len(_dumps(self.steps[i])) + 6 for i in self.units[u])

    def info(self, before: int, steps_before: int) -> CondenseInfo:
        gone = sorted(i for u in self.dropped for i in self.units[u])
        rng = (_step_no(self.steps, gone[0]), _step_no(self.steps, gone[-1])) if gone else None
        tokens = self.tokens()
        return CondenseInfo(True, before, tokens, self.budget, steps_before, len(gone), rng, self.shortened[0],
                            self.calls_omitted, tokens <= self.budget)


def condense(trajectory: dict[str, Any], budget_tokens: int) -> tuple[dict[str, Any], CondenseInfo]:
    """``trajectory`` within ``budget_tokens`` (estimated) by the module's rule, and what
    was cut. Deterministic; never mutates ``trajectory``."""
    if not isinstance(trajectory, dict):
        raise TypeError(f"condense: trajectory must be a dict, got {type(trajectory).__name__}")
    if int(budget_tokens) < 1:
        raise ValueError(f"condense: budget_tokens={budget_tokens} must be >= 1")
    budget_tokens = int(budget_tokens)
    before = estimate_tokens(render(trajectory))
    steps = trajectory.get("steps")
    n_steps = len(steps) if isinstance(steps, list) else 0
    if before <= budget_tokens:
        return trajectory, CondenseInfo(False, before, before, budget_tokens, n_steps)

    w = _Work(trajectory, budget_tokens)
    # 1. per-call accounting: `final` already carries its totals
    if isinstance(w.header.get("calls"), list):
        w.calls_omitted = len(w.header.pop("calls"))
        w.header["calls_omitted"] = w.calls_omitted
    n = len(w.units)
    first = list(range(min(FIRST_UNITS, n)))
    last = [u for u in range(max(0, n - LAST_UNITS), n) if u not in first]
    middle = [u for u in range(n) if u not in first and u not in last]
    # 2. shorten the middle's long fields
    if not w.fits():
        w.shorten_units(middle, MIDDLE_FIELD_CHARS)
    # 3. drop middle units, oldest first
    w.drop_until_fits(middle)
    # 4. shorten the kept units and the non-step fields, gently first
    limit = KEPT_FIELD_CHARS
    while not w.fits() and limit >= MIN_FIELD_CHARS:
        w.shorten_units([u for u in first + last if u not in w.dropped], limit)
        w.header = _shorten(w.header, limit, w.shortened)
        if w.other_steps is not None:
            w.other_steps = _shorten(w.other_steps, limit, w.shortened)
        limit //= 2
    # 5. drop kept units: the opening after the instruction, then the ending oldest first
    w.drop_until_fits(first[1:] + last[:-1])
    w.drop_until_fits(first[:1])
    w.drop_until_fits(last[-1:])
    return w.build(), w.info(before, n_steps)
