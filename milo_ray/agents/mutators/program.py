"""The offline program mutator: a deterministic, LLM-free stand-in for a coding agent
that edits optimizer programs (the instance-level track, MILO App. E).

It is NOT an LLM. Like :mod:`milo_ray.agents.mutators.offline` for agent harnesses, it
reads what an LLM coding agent would read and writes a complete child by code
transformation, so the search loop, the evidence plumbing and validation run for real
offline. What it edits is the layout every seed optimizer follows (einstein notes):

* ``CONFIG = {...}``: a module-level dict literal of numeric tunables. A value is moved
  by a log-normal multiplicative factor ``exp(dir * max(|z|, 0.05))``, ``z ~ N(0, sigma)``,
  clipped to [1/4, 4]; ints stay ints (>= 1, and always change), floats keep their sign,
  a fraction-like value in (0, 1) (decay, shrink, beta, ...) moves in odds space and
  stays in (0, 1), a growth-like value > 1 moves by its excess over 1 and stays > 1.
  Booleans and zeros are not tunables here (a multiplicative step cannot move a zero).
* ``STAGES = [...]``: a list literal of stage names, each with a ``def stage_<name>``
  in the same file or one of the runner's ready-made stages
  (:data:`milo_ray.boundary.inside.optimizer_blocks.STAGE_SETTINGS`) whose settings CONFIG holds. Edits: ``swap`` two neighbours, ``repeat`` a stage, ``drop`` one
  (never the last), ``add`` a defined but unused stage. A name without a function is
  never written.

Edits are applied to the text at the literal nodes' positions (``ast`` offsets), so
comments and the rest of the file survive; the STAGES list is regenerated whole.

Which tunables move, and which way, comes from the evidence directory
(``milo_ray.harness.evidence``): for an optimizer rollout ``traces/<task>/trajectory.json``
is the run's publish log ``[[t_seconds, score], ...]`` (``rollout-<i>/trajectory.json``
when k > 1) and ``traces/<task>/result.json`` holds per rollout ``seconds``,
``timed_out``, ``error_kind`` and ``error`` (the executor's reason). Each run is classed:

* ``stall``: its last improvement came in the first half of the run, or it never
  improved -> longer / hotter schedules, more restarts (schedule keys up; stage
  ``repeat`` / ``add``);
* ``slow``: still improving in the last fifth of the run, or killed at the deadline ->
  faster, cheaper stages (length and resolution keys down; stage ``drop``);
* ``constraint``: the final point was infeasible (a constraint reason) -> smaller steps
  (step-size and temperature keys down).

The most frequent class wins (ties: constraint, stall, slow); with no signal any
tunable moves either way. Key classes come from the words of the key's name
(``_KEY_CLASSES``: ``t_hot`` is a temperature, ``lbfgs_maxiter`` a length, ``beta1`` none).

History: ``request.memory_markdown`` (the lineage snapshot, parsed by
``diagnosis.parse_memory``) gives the labels of rejected children anywhere in the tree;
each label is split into atomic edits (``CONFIG.<key> up|down``, ``STAGES <op> <name>``)
and none of those is proposed again.

Personalities: ``tuner`` (moves 1-2 keys, moderate steps, rarely touches STAGES),
``restructurer`` (always edits STAGES, at most one small key move), ``bold`` (three
keys, large steps, STAGES half the time). Every choice is a function of
``request.seed`` and the personality. The report's first line is the edit label.
Usage is ``AgentUsage(cost_usd=0.0)``: an offline edit is free.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from milo_ray.agents.mutators.diagnosis import parse_memory
from milo_ray.agents.protocols import MutationRequest, MutationResult
from milo_ray.llm.usage import AgentUsage
from milo_ray.core.seeds import derive_seed
from milo_ray.boundary.inside.optimizer_blocks import STAGE_SETTINGS
from milo_ray.harness.mechanisms.analysis import parse_source
from milo_ray.harness.model import ENTRY_FILE, Harness


@dataclass(frozen=True)
class Personality:
    n_keys: tuple[int, int]  # how many CONFIG keys one edit moves (inclusive range)
    sigma: float  # log-normal spread of a multiplicative step
    p_stage: float  # probability of also editing STAGES


PERSONALITIES: dict[str, Personality] = {
    "tuner": Personality((1, 2), 0.3, 0.15),
    "restructurer": Personality((0, 1), 0.2, 1.0),
    "bold": Personality((3, 3), 0.6, 0.5),
}

# Key name -> class, by the name's words (split at "_" and digits, so "beta1" is not an
# "eta" and "n_steps" is not a "step"); the first class with a matching word wins.
# "t" as a first word is a temperature (t_hot, t_cold): the seeds' naming.
_KEY_CLASSES: tuple[tuple[str, frozenset[str]], ...] = (
    ("restarts", frozenset({"restart", "restarts", "population", "pop", "trials", "starts", "tries"})),
    ("step", frozenset({"lr", "learning", "step", "stepsize", "sigma", "noise", "eta", "jitter", "perturb",
                        "radius", "scale", "mutation"})),
    ("temperature", frozenset({"t", "temp", "temperature", "heat", "hot", "cold", "t0"})),
    ("length", frozenset({"iter", "iters", "maxiter", "steps", "rounds", "rungs", "epochs", "sweeps", "patience",
                          "len", "length", "passes", "evals", "time", "budget", "duration"})),
    ("resolution", frozenset({"upsample", "factor", "refine", "resolution", "grid", "points"})),
)
# Floats whose meaning lives on one side of 1: a fraction-like value in (0, 1) moves in
# odds space (stays in (0, 1); 0.999 can still move), a growth-like value > 1 moves by
# its excess over 1 (stays > 1), so a "shrink" never becomes a growth or vice versa.
_FRACTION = re.compile(r"frac|prob|ratio|decay|momentum|beta|shrink|share|keep|accept", re.I)
_GROWTH = re.compile(r"grow|expand|mult|factor|ratio", re.I)

# Evidence class -> {key class: direction}; and the stage ops it favours.
_TARGETS: dict[str, dict[str, int]] = {
    "stall": {"length": +1, "temperature": +1, "restarts": +1},
    "slow": {"length": -1, "resolution": -1},
    "constraint": {"step": -1, "temperature": -1},
}
_STAGE_OPS: dict[str | None, tuple[str, ...]] = {
    "stall": ("repeat", "add", "swap"),
    "slow": ("drop", "swap"),
    "constraint": ("swap", "drop", "add"),
    None: ("swap", "repeat", "drop", "add"),
}
_CONSTRAINT = re.compile(r"needs |non-finite|infeasible|constraint|not a vector|expected a 1-D", re.I)
_ATOM = re.compile(r"CONFIG\.(\w+) (up|down)|STAGES (swap|repeat|drop|add) ([\w,]+)")
STALL_FRAC = 0.5  # last improvement before this fraction of the run: stalled
SLOW_FRAC = 0.8  # an improvement after this fraction: still improving at the deadline
_MIN_Z, _MAX_FACTOR = 0.05, 4.0


def key_class(key: str) -> str:
    words = [w for w in re.split(r"[_\d]+", key.lower()) if w]
    if words[:1] == ["t"]:
        return "temperature"
    return next((c for c, ws in _KEY_CLASSES if ws & set(words)), "other")


# ------------------------------------------------------------------ parsing
@dataclass
class Program:
    """Where CONFIG and STAGES sit in a program's text."""

    source: str
    config: dict[str, tuple[int | float, ast.expr]]  # key -> (value, value node)
    stages: list[str]
    stages_node: ast.List
    stage_funcs: list[str]  # names x with a top-level def stage_x (file order), then the given stages it can run


def parse_program(source: str) -> Program:
    """The program's CONFIG/STAGES literals; ValueError naming what is missing."""
    tree = parse_source(source)
    config_node = stages_node = None
    funcs: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs.append(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Name) and t.id == "CONFIG":
                config_node = node.value
            if isinstance(t, ast.Name) and t.id == "STAGES":
                stages_node = node.value
    if "optimize" not in funcs:
        raise ValueError("program defines no top-level optimize(values, *, seed, deadline)")
    if not isinstance(config_node, ast.Dict):
        raise ValueError("program has no module-level CONFIG = {...} dict literal")
    if not isinstance(stages_node, ast.List):
        raise ValueError("program has no module-level STAGES = [...] list literal")
    config: dict[str, tuple[int | float, ast.expr]] = {}
    for k, v in zip(config_node.keys, config_node.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            continue
        try:
            value = ast.literal_eval(v)
        except ValueError:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            config[k.value] = (value, v)
    stages: list[str] = []
    for e in stages_node.elts:
        if not (isinstance(e, ast.Constant) and isinstance(e.value, str)):
            raise ValueError("STAGES: every entry must be a string literal (a stage name)")
        stages.append(e.value)
    stage_funcs = [f[len("stage_"):] for f in funcs if f.startswith("stage_")]
    # The runner's ready-made stages count as the program's when its CONFIG holds every
    # setting they read (otherwise naming one would crash the child).
    stage_funcs += [name for name, keys in STAGE_SETTINGS.items()
                    if name not in stage_funcs and all(k in config for k in keys)]
    missing = [s for s in stages if s not in stage_funcs]
    if missing:
        raise ValueError(f"STAGES: {missing[0]!r} has no def stage_{missing[0]} in the file "
                         "(nor is it a given stage whose settings CONFIG holds)")
    return Program(source, config, stages, stages_node, stage_funcs)


def _offset(lines: list[bytes], lineno: int, col: int) -> int:
    """Byte offset of an ast (lineno, col_offset) position (col offsets are UTF-8 bytes)."""
    return sum(len(lines[i]) for i in range(lineno - 1)) + col


def apply_edits(prog: Program, values: dict[str, int | float], stages: list[str] | None) -> str:
    """The program text with CONFIG values and/or the STAGES literal replaced in place."""
    data = prog.source.encode()
    lines = data.splitlines(keepends=True)
    spans: list[tuple[int, int, str]] = []
    for key, new in values.items():
        node = prog.config[key][1]
        spans.append((_offset(lines, node.lineno, node.col_offset),
                      _offset(lines, node.end_lineno or node.lineno, node.end_col_offset or 0), repr(new)))
    if stages is not None:
        n = prog.stages_node
        spans.append((_offset(lines, n.lineno, n.col_offset), _offset(lines, n.end_lineno or n.lineno,
                      n.end_col_offset or 0), "[" + ", ".join(json.dumps(s) for s in stages) + "]"))
    for start, end, text in sorted(spans, reverse=True):
        data = data[:start] + text.encode() + data[end:]
    return data.decode()


# ----------------------------------------------------------------- evidence
@dataclass
class Evidence:
    counts: Counter = field(default_factory=Counter)  # class -> number of runs
    examples: dict[str, str] = field(default_factory=dict)  # class -> task id
    n_runs: int = 0

    def signal(self) -> str | None:
        order = ("constraint", "stall", "slow")
        ranked = sorted((c for c in order if self.counts[c] > 0), key=lambda c: (-self.counts[c], order.index(c)))
        return ranked[0] if ranked else None


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _points(obj: Any) -> list[tuple[float, float]] | None:
    """The publish log of a trajectory file: ``[[t, score], ...]`` (or a whole trace
    dict holding it under ``trajectory``); None when the file is something else."""
    if isinstance(obj, dict):
        obj = obj.get("trajectory")
    if not isinstance(obj, list):
        return None
    out = []
    for p in obj:
        if isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, (int, float)) for x in p):
            out.append((float(p[0]), float(p[1])))
    return out


def classify_run(points: list[tuple[float, float]] | None, rollout: dict[str, Any]) -> str | None:
    """``constraint`` | ``stall`` | ``slow`` | None for one rollout (see module docstring)."""
    err = str(rollout.get("error") or "")
    if rollout.get("error_kind") == "harness" and _CONSTRAINT.search(err):
        return "constraint"
    timed_out = bool(rollout.get("timed_out"))
    if not points:
        if points is None and not rollout:
            return None  # nothing to read
        return "slow" if timed_out else "stall"
    # The log holds each strictly better point, so its last entry is the last improvement.
    last = points[-1][0]
    # The run's budget when the evidence gives it (a program that returns early did
    # stall); else the rollout's wall time.
    budget = (rollout.get("run") or {}).get("budget_s")
    duration = max(float(budget if budget else rollout.get("seconds") or 0.0), last)
    if timed_out or (duration > 0 and last >= SLOW_FRAC * duration):
        return "slow"
    if duration > 0 and last <= STALL_FRAC * duration:
        return "stall"
    return None


def read_evidence(evidence_dir: Path | None) -> Evidence:
    ev = Evidence()
    root = Path(evidence_dir) / "traces" if evidence_dir else None
    if root is None or not root.is_dir():
        return ev
    for tdir in sorted(p for p in root.iterdir() if p.is_dir()):
        result = _load(tdir / "result.json") or {}
        rollouts = {int(r.get("rollout_idx", i)): r for i, r in enumerate(result.get("rollouts") or [])
                    if isinstance(r, dict)}
        per = sorted(tdir.glob("rollout-*/trajectory.json"))
        runs: list[tuple[Any, dict[str, Any]]] = []
        if per:
            for f in per:
                idx = f.parent.name.removeprefix("rollout-")
                runs.append((_points(_load(f)), rollouts.get(int(idx), {}) if idx.isdigit() else {}))
        else:
            first = rollouts[min(rollouts)] if rollouts else {}
            runs.append((_points(_load(tdir / "trajectory.json")), first))
        for points, roll in runs:
            c = classify_run(points, roll)
            ev.n_runs += 1
            if c:
                ev.counts[c] += 1
                ev.examples.setdefault(c, tdir.name)
    return ev


def rejected_atoms(memory_markdown: str) -> set[tuple[str, str, str]]:
    """Atomic edits of every rejected child in the lineage snapshot."""
    atoms: set[tuple[str, str, str]] = set()
    for label in parse_memory(memory_markdown).rejected:
        for m in _ATOM.finditer(label):
            atoms.add(("CONFIG", m.group(1), m.group(2)) if m.group(1) else ("STAGES", m.group(3), m.group(4)))
    return atoms


# ------------------------------------------------------------------ choices
def _fmt(v: int | float) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def perturb(key: str, value: int | float, direction: int, sigma: float, rng: np.random.Generator) -> int | float:
    """``value`` moved by a log-normal factor in ``direction`` (see module docstring)."""
    z = max(abs(float(rng.normal(0.0, sigma))), _MIN_Z)
    factor = min(math.exp(z), _MAX_FACTOR) ** direction
    if isinstance(value, int):
        new = max(1, int(round(value * factor)))
        if new == value:  # small ints: the step must still move the value
            new = max(1, value + direction)
        return new
    fraction = 0 < value < 1 and _FRACTION.search(key)
    if fraction:
        odds = value / (1 - value) * factor
        new_f = odds / (1 + odds)
    elif value > 1 and _GROWTH.search(key):
        new_f = 1 + (value - 1) * factor
    else:
        new_f = value * factor
    short = float(f"{new_f:.6g}")  # readable literals, unless rounding would undo the move or reach 0/1
    if short == value or (fraction and not 0 < short < 1) or (value > 1 and short <= 1 < new_f):
        return new_f
    return short


def stage_edits(stages: list[str], funcs: list[str]) -> list[tuple[str, str, list[str]]]:
    """Every possible STAGES edit: (op, atom name, new list)."""
    out: list[tuple[str, str, list[str]]] = []
    for i in range(len(stages) - 1):
        if stages[i] != stages[i + 1]:
            new = stages[:i] + [stages[i + 1], stages[i]] + stages[i + 2:]
            out.append(("swap", f"{stages[i]},{stages[i + 1]}", new))
    for i, s in enumerate(stages):
        if ("repeat", s) not in {(o, a) for o, a, _ in out}:
            out.append(("repeat", s, stages[:i + 1] + [s] + stages[i + 1:]))
    if len(stages) > 1:
        for i, s in enumerate(stages):
            if ("drop", s) not in {(o, a) for o, a, _ in out}:
                out.append(("drop", s, stages[:i] + stages[i + 1:]))
    for f in funcs:
        if f not in stages:
            out.append(("add", f, stages + [f]))
    return out


class OfflineProgramMutator:
    """Mutator protocol implementation for optimizer programs (see module docstring)."""

    def __init__(self, personality: str = "tuner", name: str | None = None) -> None:
        if personality not in PERSONALITIES:
            raise ValueError(f"personality {personality!r}: choose one of {sorted(PERSONALITIES)}")
        self.personality = personality
        self.p = PERSONALITIES[personality]
        self.name = name or f"offline-program-{personality}"

    def _config_moves(self, prog: Program, signal: str | None, banned: set, rng: np.random.Generator,
                      n: int) -> list[tuple[str, int]]:
        movable = [k for k, (v, _n) in prog.config.items() if v != 0]

        def open_(k: str, d: int) -> bool:  # untried, and possible (an int at 1 cannot go down)
            return ("CONFIG", k, "up" if d > 0 else "down") not in banned and not (
                d < 0 and isinstance(prog.config[k][0], int) and prog.config[k][0] <= 1)

        targets = _TARGETS.get(signal or "", {})
        aimed = [(k, targets[key_class(k)]) for k in movable if key_class(k) in targets]
        aimed = [(k, d) for k, d in aimed if open_(k, d)]
        picks = [aimed[i] for i in rng.permutation(len(aimed))][:n]
        if len(picks) < n:  # no (more) evidence-directed move: any untried move of any key
            used = {k for k, _d in picks}
            free = [(k, d) for k in movable if k not in used for d in (1, -1) if open_(k, d)]
            for i in rng.permutation(len(free)):
                k, d = free[i]
                if len(picks) >= n:
                    break
                if k not in {x for x, _ in picks}:
                    picks.append((k, d))
        return picks

    def _stage_move(self, prog: Program, signal: str | None, banned: set,
                    rng: np.random.Generator) -> tuple[str, str, list[str]] | None:
        edits = [e for e in stage_edits(prog.stages, prog.stage_funcs) if ("STAGES", e[0], e[1]) not in banned]
        if not edits:
            return None
        # The signal's ops, earlier ones likelier (weights k, k-1, ..., 1); any op if none applies.
        ops = [o for o in _STAGE_OPS[signal] if any(e[0] == o for e in edits)]
        if ops:
            w = np.arange(len(ops), 0, -1, dtype=float)
            op = ops[int(rng.choice(len(ops), p=w / w.sum()))]
            edits = [e for e in edits if e[0] == op]
        return edits[int(rng.integers(len(edits)))]

    def mutate(self, request: MutationRequest) -> MutationResult:
        try:
            return self._mutate(request)
        except Exception as e:  # the protocol: a mutator reports, never raises
            return MutationResult(None, error=f"program mutator failed: {type(e).__name__}: {e}")

    def _mutate(self, request: MutationRequest) -> MutationResult:
        parent_file = Path(request.parent_dir) / ENTRY_FILE if request.parent_dir else None
        source = parent_file.read_text() if parent_file and parent_file.exists() else request.parent.source
        try:
            prog = parse_program(source)
        except SyntaxError as e:
            return MutationResult(None, error=f"parent program does not compile: {e}")
        except ValueError as e:
            return MutationResult(None, error=f"parent program cannot be edited: {e}")
        rng = np.random.default_rng(derive_seed(request.seed, "program-mutator", self.personality))
        ev = read_evidence(request.evidence_dir)
        signal = ev.signal()
        banned = rejected_atoms(request.memory_markdown)
        lo, hi = self.p.n_keys
        n_keys = int(rng.integers(lo, hi + 1))
        stage = self._stage_move(prog, signal, banned, rng) if (n_keys == 0 or rng.random() < self.p.p_stage) else None
        moves = self._config_moves(prog, signal, banned, rng, n_keys)
        if not moves and stage is None:  # the personality's pick was impossible: try the other kind
            stage = self._stage_move(prog, signal, banned, rng)
            moves = [] if stage else self._config_moves(prog, signal, banned, rng, 1)
        if not moves and stage is None:
            return MutationResult(None, error="no untried edit: every CONFIG move and STAGES edit was rejected before "
                                              "(or the program has no nonzero numeric tunable and no stage edit)")
        values = {k: perturb(k, prog.config[k][0], d, self.p.sigma, rng) for k, d in moves}
        moves = [(k, d) for k, d in moves if values[k] != prog.config[k][0]]  # a clipped fraction may not move
        values = {k: values[k] for k, _d in moves}
        if not moves and stage is None:
            return MutationResult(None, error="the chosen CONFIG moves are at their bounds; nothing changed")
        child = apply_edits(prog, values, stage[2] if stage else None)
        try:  # the child keeps optimize, CONFIG and STAGES, with the values written
            written = parse_program(child)
        except (SyntaxError, ValueError) as e:
            return MutationResult(None, error=f"edited program does not parse back: {e}")
        if any(written.config[k][0] != v for k, v in values.items()):
            return MutationResult(None, error="edited program does not hold the new CONFIG values")
        parts = [f"CONFIG.{k} {'up' if d > 0 else 'down'} ({_fmt(prog.config[k][0])}->{_fmt(values[k])})"
                 for k, d in moves]
        if stage:
            parts.append(f"STAGES {stage[0]} {stage[1]}")
        label = "; ".join(parts)
        workdir = Path(request.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / ENTRY_FILE).write_text(child)
        why = (f"{signal} in {ev.counts[signal]} of {ev.n_runs} runs (e.g. {ev.examples[signal]})"
               if signal else f"no stall/slow/constraint signal in {ev.n_runs} runs")
        report = "\n".join([
            label,
            f"evidence: {why}",
            f"stages: {prog.stages} -> {stage[2]}" if stage else f"stages: {prog.stages} (unchanged)",
            f"avoided: {len(banned)} rejected edits from the lineage",
            f"change: {label}",
        ])
        files = {**request.parent.files, ENTRY_FILE: child}
        return MutationResult(Harness(files, name=f"{request.parent.name or 'program'}+"), report=report,
                              usage=AgentUsage(cost_usd=0.0))
