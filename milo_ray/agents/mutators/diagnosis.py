"""What an offline mutator reads, turned into a diagnosis.

* Traces: the *ending* (last steps) of each failed task's ``trajectory.json`` is
  matched against textual patterns of the failure modes — the kind of evidence a
  reader of a real trace uses (a timeout notice, "should be complete" without a
  check, a smoke check, unknown options, a context-window notice, tool-argument errors,
  a tool call of the model whose arguments did not parse: a step's ``invalid_tool_calls``).
* SSR experience records: summary, suggestions and insights are matched against the
  same vocabulary plus the mechanism names they suggest, weighted by w * q.
* Lineage memory (markdown): node lines holding ``mutation: <label>`` and
  ``verdict: admitted|rejected ...``, fields separated by `` | `` (the MILO renderer's
  convention); an optional ``Δacc <+x.xxx>`` field; indentation = depth. Any other
  line is ignored, so a different rendering degrades to "no history", never an error.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milo_ray.harness.mechanisms import FAILURE_MODES, MECHANISMS

ENDING_PATTERNS: dict[str, re.Pattern[str]] = {
    "deadline_overrun": re.compile(r"time limit of \S+ reached|timed out|time ?limit exceeded|deadline", re.I),
    "premature_completion": re.compile(r"should be complete|without further checks|assume it works|finishing now", re.I),
    "lax_verification": re.compile(r"smoke check|sanity check|prints ok|confirms the fix", re.I),
    "missing_knowhow": re.compile(r"do not know how|don't know how|unknown option|no matching subcommand|not sure how", re.I),
    "context_overflow": re.compile(r"context window exceeded|lost track|context length", re.I),
    "tool_misuse": re.compile(r"old_string not found|invalid arguments|malformed tool call|wrote 0 bytes", re.I),
}

RECORD_PATTERNS: dict[str, re.Pattern[str]] = {
    "premature_completion": re.compile(r"premature|declar\w* (success|done|complete)|stops? (too )?early|skipped step", re.I),
    "deadline_overrun": re.compile(r"deadline|time ?out|timed out|time limit|overrun|pacing", re.I),
    "lax_verification": re.compile(r"lax|weak (self-)?check|verif|smoke check|insufficient test", re.I),
    "missing_knowhow": re.compile(r"know-?how|does not know|unfamiliar|toolchain|configur", re.I),
    "context_overflow": re.compile(r"context (window|overflow|length)|lost track|too much output", re.I),
    "tool_misuse": re.compile(r"tool (misuse|error)|invalid argument|malformed|edit failed", re.I),
}


def classify_ending(trajectory: dict[str, Any], tail: int = 4) -> str | None:
    """The failure mode a trajectory's last steps show, or None when nothing matches."""
    steps = (trajectory or {}).get("steps") or []
    ending = [s for s in steps[-tail:] if isinstance(s, dict)]
    text = " ".join(str(s.get("content", "")) + " " + json.dumps(s.get("tool_calls", "")) for s in ending)
    if (trajectory or {}).get("final", {}).get("status") == "timeout":
        text += " timed out"
    if any(s.get("invalid_tool_calls") for s in ending):
        # Said by the step's structure, not its text: an answer holding only such calls
        # ends the agent's loop with no error message at all.
        text += " malformed tool call"
    hits = [m for m, p in ENDING_PATTERNS.items() if p.search(text)]
    return hits[0] if len(hits) >= 1 else None


@dataclass
class Diagnosis:
    counts: Counter = field(default_factory=Counter)  # mode -> weight
    examples: dict[str, str] = field(default_factory=dict)  # mode -> task id
    n_failed: int = 0
    source: str = "traces"

    def ranked(self) -> list[str]:
        """Modes by weight (ties in FAILURE_MODES order)."""
        return sorted((m for m in self.counts if self.counts[m] > 0),
                      key=lambda m: (-self.counts[m], FAILURE_MODES.index(m)))


def _failed(tdir: Path) -> bool:
    if (tdir / "result.json").exists():
        return True
    try:
        s = json.loads((tdir / "ctrf.json").read_text())["results"]["summary"]
        return int(s["failed"]) > 0
    except Exception:
        return False


def diagnose_traces(evidence_dir: Path) -> Diagnosis:
    d = Diagnosis()
    tdirs = sorted(p for p in (Path(evidence_dir) / "traces").glob("*") if p.is_dir()) if evidence_dir else []
    for tdir in tdirs:
        if not _failed(tdir):
            continue
        d.n_failed += 1
        files = [tdir / "trajectory.json"] + sorted(tdir.glob("rollout-*/trajectory.json"))
        seen: set[str] = set()
        for f in files:
            try:
                mode = classify_ending(json.loads(f.read_text()))
            except (OSError, ValueError):
                continue
            if mode and mode not in seen:  # one vote per task and mode
                seen.add(mode)
                d.counts[mode] += 1
                d.examples.setdefault(mode, tdir.name)
    return d


def diagnose_records(records: list[dict[str, Any]]) -> Diagnosis:
    d = Diagnosis(source="records")
    for r in records:
        text = " ".join([str(r.get("summary", "")), str(r.get("insights", "")),
                         " ".join(map(str, r.get("suggestions") or []))])
        weight = float(r.get("w", 1.0)) * float(r.get("q", r.get("a", 1.0) * r.get("u", 1.0)))
        weight = max(weight, 1e-3)
        modes = {m for m, p in RECORD_PATTERNS.items() if p.search(text)}
        for name, spec in MECHANISMS.items():  # a suggested mechanism votes for what it addresses
            if name in text or name.replace("_", " ") in text:
                modes |= set(spec.addresses[:1])
        for m in modes:
            d.counts[m] += weight
            d.examples.setdefault(m, str(r.get("task_id", "?")))
        d.n_failed += 1
    return d


@dataclass
class History:
    rejected: set[str] = field(default_factory=set)  # labels of rejected children
    admitted: set[str] = field(default_factory=set)
    recent: list[tuple[str, bool, float | None]] = field(default_factory=list)  # (label, admitted, Δacc)


_MUT = re.compile(r"mutation:\s*([^|]+)")
_VERDICT = re.compile(r"verdict:\s*(admitted|rejected)")
_DACC = re.compile(r"Δacc\s*([+-]?\d+(?:\.\d+)?)")


def parse_memory(markdown: str, parent_node: str | None = None) -> History:
    """Edit labels and verdicts from the lineage snapshot. ``recent`` lists the children
    of ``parent_node`` (a node id shown as ``[id]`` on a tree line ``- [id] ...``) when
    it is found, else the last child lines of the whole tree (the island's history)."""
    h = History()
    tree: list[tuple[int, str]] = []
    for line in (markdown or "").splitlines():
        m, v = _MUT.search(line), _VERDICT.search(line)
        if m and v:
            (h.admitted if v.group(1) == "admitted" else h.rejected).add(m.group(1).strip())
        if line.lstrip().startswith("- ["):
            tree.append((len(line) - len(line.lstrip()), line))
    chosen = [l for _i, l in tree]
    if parent_node:
        at = next((k for k, (_i, l) in enumerate(tree) if l.lstrip().startswith(f"- [{parent_node}]")), None)
        if at is not None:
            base, chosen = tree[at][0], []
            for indent, line in tree[at + 1:]:
                if indent <= base:
                    break
                if indent == base + 2:
                    chosen.append(line)
    for line in chosen:
        m, v = _MUT.search(line), _VERDICT.search(line)
        if m and v:
            dacc = _DACC.search(line)
            h.recent.append((m.group(1).strip(), v.group(1) == "admitted", float(dacc.group(1)) if dacc else None))
    return h
