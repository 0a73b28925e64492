"""Static analysis of harness source: which mechanisms are present *and wired*.

A mechanism counts only if (a) its top-level definition exists with the right shape
(a class with its hook methods, a dict/str constant, a function) and (b) build_agent
references it in the assembly list of its slot, and that list is passed to the agent
constructor. Parameters are read from keyword literals of the wiring call, falling
back to the literal defaults of the definition's signature, then to the catalog.
Nothing here imports or runs the harness.
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass, field
from typing import Any

from milo_ray.harness.mechanisms.catalog import MECHANISMS, SLOTS, MechanismSpec

CONSTRUCTORS = ("create_deep_agent", "create_agent")


@dataclass
class SlotInfo:
    """One assembly list in build_agent: its literal and the elements appended later."""

    name: str
    assign: ast.stmt | None = None  # the `slot = [...]` statement
    literal: ast.List | None = None
    elements: list[ast.expr] = field(default_factory=list)


@dataclass
class HarnessAst:
    tree: ast.Module
    defs: dict[str, ast.stmt]  # top-level name -> defining statement
    build: ast.FunctionDef | None
    constructor: ast.Call | None
    slots: dict[str, SlotInfo]
    wired_slots: set[str]

    @property
    def framework(self) -> str | None:
        if self.constructor is None or not isinstance(self.constructor.func, ast.Name):
            return None
        return self.constructor.func.id


def literal(node: ast.AST) -> Any:
    """The Python value of a literal expression, or raise ValueError."""
    return ast.literal_eval(node)


def _top_level_defs(tree: ast.Module) -> dict[str, ast.stmt]:
    defs: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defs[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    defs[t.id] = stmt
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            defs[stmt.target.id] = stmt
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for a in stmt.names:
                defs[(a.asname or a.name).split(".")[0]] = stmt
    return defs


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


# CPython 3.11 keeps the recursion depth of its AST object constructor in
# per-interpreter state: two threads inside ast.parse at once (a garbage-collector
# finalizer can switch threads in the middle of one) may fail with "SystemError: AST
# constructor recursion depth mismatch". Candidates and children are written in
# threads, so every parse of harness source here takes this lock. Code outside this
# module (a library's thread still running after an agent's cap) can race the lock
# too; a parse is pure, so that failure is retried.
_AST_LOCK = threading.Lock()
_AST_RACE = "AST constructor recursion depth mismatch"
_AST_ATTEMPTS = 5


def parse_source(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse`` serialized across threads (see ``_AST_LOCK``), retried when another
    thread's parse outside the lock corrupted the constructor's depth count."""
    for attempt in range(_AST_ATTEMPTS):
        try:
            with _AST_LOCK:
                return ast.parse(source, mode=mode)
        except SystemError as e:
            if _AST_RACE not in str(e) or attempt == _AST_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def parse_harness(source: str) -> HarnessAst | None:
    """Parse and locate build_agent, its constructor call and assembly lists; None if
    the source does not parse or has no top-level build_agent."""
    try:
        tree = parse_source(source)
    except (SyntaxError, ValueError):
        return None
    defs = _top_level_defs(tree)
    build = defs.get("build_agent")
    if not isinstance(build, ast.FunctionDef):
        return None
    slots = {s: SlotInfo(s) for s in SLOTS}
    constructor: ast.Call | None = None
    for stmt in build.body:
        target = value = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            target, value = stmt.targets[0].id, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            target, value = stmt.target.id, stmt.value
        if target in slots and isinstance(value, ast.List):
            slots[target].assign, slots[target].literal = stmt, value
            slots[target].elements = list(value.elts)
            continue
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id in slots:
            if isinstance(stmt.value, ast.List):
                slots[stmt.target.id].elements += list(stmt.value.elts)
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            f = stmt.value.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in slots:
                if f.attr == "append" and stmt.value.args:
                    slots[f.value.id].elements.append(stmt.value.args[0])
                elif f.attr == "extend" and stmt.value.args and isinstance(stmt.value.args[0], ast.List):
                    slots[f.value.id].elements += list(stmt.value.args[0].elts)
    for node in ast.walk(build):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CONSTRUCTORS:
            constructor = node
    wired: set[str] = set()
    if constructor is not None:
        for arg in [*constructor.args, *(k.value for k in constructor.keywords)]:
            wired |= _names_in(arg) & set(SLOTS)
        if constructor.func.id == "create_agent":  # type: ignore[union-attr]
            wired.discard("subagents")  # a bare loop has nowhere to run sub-agents
    return HarnessAst(tree, defs, build, constructor, slots, wired)


def _element_symbol(elt: ast.expr) -> tuple[str | None, ast.Call | None]:
    """The symbol an assembly-list element references, and its call if it is one."""
    if isinstance(elt, ast.Starred):
        elt = elt.value
    if isinstance(elt, ast.Name):
        return elt.id, None
    if isinstance(elt, ast.Call) and isinstance(elt.func, ast.Name):
        return elt.func.id, elt
    return None, None


def _signature_defaults(fn: ast.FunctionDef) -> dict[str, Any]:
    out: dict[str, Any] = {}
    args = fn.args
    pos = args.posonlyargs + args.args
    for a, d in zip(pos[len(pos) - len(args.defaults):], args.defaults):
        try:
            out[a.arg] = literal(d)
        except ValueError:
            pass
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        if d is not None:
            try:
                out[a.arg] = literal(d)
            except ValueError:
                pass
    return out


def _definition_ok(spec: MechanismSpec, node: ast.stmt | None) -> bool:
    if node is None:
        return False
    if spec.kind == "middleware":
        if not isinstance(node, ast.ClassDef):
            return False
        methods = {s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        return all(h in methods for h in spec.hooks)
    if spec.kind == "prompt":
        return isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant) \
            and isinstance(node.value.value, str) and bool(node.value.value.strip())
    if spec.kind == "subagent":
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or not isinstance(node.value, ast.Dict):
            return False
        keys = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        return {"name", "description"} <= keys
    if spec.kind == "tool":
        return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    return False


def _params(spec: MechanismSpec, definition: ast.stmt, call: ast.Call | None) -> dict[str, Any]:
    params = dict(spec.params)
    init = None
    if isinstance(definition, ast.ClassDef):
        init = next((s for s in definition.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
    elif isinstance(definition, ast.FunctionDef):
        init = definition
    if init is not None:
        defaults = _signature_defaults(init)
        params.update({k: v for k, v in defaults.items() if k in spec.params})
    if call is not None:
        for kw in call.keywords:
            if kw.arg in spec.params:
                try:
                    params[kw.arg] = literal(kw.value)
                except ValueError:
                    pass  # a computed value: keep the default the code would fall back to
    return params


def find_element(h: HarnessAst, spec: MechanismSpec) -> tuple[ast.expr, ast.Call | None] | None:
    """The assembly-list element wiring ``spec`` (first one), if any."""
    if spec.slot is None:
        return None
    for elt in h.slots[spec.slot].elements:
        sym, call = _element_symbol(elt)
        if sym == spec.symbol:
            return elt, call
    return None


def detect_in(h: HarnessAst) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    if h.framework == "create_deep_agent" and "create_deep_agent" in h.defs:
        found["deepagents_stack"] = {}
    for name, spec in MECHANISMS.items():
        if spec.kind == "framework" or spec.slot not in h.wired_slots:
            continue
        if any(r not in found for r in spec.requires):
            continue
        hit = find_element(h, spec)
        definition = h.defs.get(spec.symbol)
        if hit is None or not _definition_ok(spec, definition):
            continue
        found[name] = _params(spec, definition, hit[1])  # type: ignore[arg-type]
    return found


def detect_mechanisms(source: str) -> dict[str, dict[str, Any]]:
    """{mechanism name: params} for every mechanism present and wired in ``source``.

    An unparsable source, or one without a top-level build_agent, has none.
    """
    h = parse_harness(source)
    return {} if h is None else detect_in(h)
