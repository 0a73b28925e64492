"""Code transformations on harness source: add, remove and re-parameterize mechanisms.

Every transformation is a text splice located by the AST (so comments, docstrings and
formatting elsewhere survive) and is followed by a re-parse; the result is always a
complete, compilable harness, or a ValueError says why the edit is impossible. They
work on any harness whose build_agent assembles its agent from the assembly lists
(``prompt_blocks``, ``tools``, ``subagents``, ``middleware``) passed to
``create_deep_agent`` / ``create_agent`` — the layout of every seed harness.
"""

from __future__ import annotations

import ast
from typing import Any

from milo_ray.harness.mechanisms import templates as T
from milo_ray.harness.mechanisms.analysis import (
    HarnessAst,
    _definition_ok,
    _element_symbol,
    detect_in,
    find_element,
    parse_harness,
    parse_source,
)
from milo_ray.harness.mechanisms.catalog import MECHANISMS, MechanismSpec, spec as get_spec

_SLOT_DECL = {
    "prompt_blocks": "prompt_blocks: list[str] = []",
    "tools": "tools: list[Any] = []",
    "subagents": "subagents: list[dict[str, Any]] = []",
    "middleware": "middleware: list[Any] = []",
}
_SYSTEM_PROMPT_EXPR = '"\\n\\n".join(prompt_blocks) or None'


# ----------------------------------------------------------------------------- text
def _abs(source: str, lineno: int, col: int) -> int:
    """Character offset of an AST (1-based line, utf-8 byte column) position."""
    lines = source.splitlines(keepends=True)
    start = sum(len(l) for l in lines[: lineno - 1])
    line = lines[lineno - 1] if lineno - 1 < len(lines) else ""
    return start + len(line.encode()[:col].decode(errors="ignore"))


def _span(source: str, node: ast.AST) -> tuple[int, int]:
    return (_abs(source, node.lineno, node.col_offset),  # type: ignore[attr-defined]
            _abs(source, node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]


def _replace(source: str, node: ast.AST, text: str) -> str:
    a, b = _span(source, node)
    return source[:a] + text + source[b:]


def _segment(source: str, node: ast.AST) -> str:
    a, b = _span(source, node)
    return source[a:b]


def _line_start(source: str, lineno: int) -> int:
    return _abs(source, lineno, 0)


def _stmt_first_line(stmt: ast.stmt) -> int:
    decos = getattr(stmt, "decorator_list", None) or []
    return min([stmt.lineno] + [d.lineno for d in decos])


def _delete_stmt(source: str, stmt: ast.stmt) -> str:
    a = _line_start(source, _stmt_first_line(stmt))
    b = _line_start(source, stmt.end_lineno + 1) if stmt.end_lineno else len(source)  # type: ignore[operator]
    out = source[:a] + source[b:]
    while "\n\n\n\n" in out:  # keep at most two blank lines where a definition was
        out = out.replace("\n\n\n\n", "\n\n\n")
    return out


def _parse(source: str) -> HarnessAst:
    h = parse_harness(source)
    if h is None:
        raise ValueError("harness source: does not parse or has no top-level build_agent(model, backend)")
    return h


def _indent_of(source: str, stmt: ast.stmt) -> str:
    line = source.splitlines()[stmt.lineno - 1]
    return line[: len(line) - len(line.lstrip())]


# -------------------------------------------------------------------- building blocks
def ensure_imports(source: str, names: tuple[str, ...]) -> str:
    """Add the import line of every name in ``names`` not yet bound at top level."""
    h = _parse(source)
    missing = [T.IMPORT_LINES[n] for n in names if n not in h.defs and n in T.IMPORT_LINES]
    missing = list(dict.fromkeys(missing))
    if not missing:
        return source
    imports = [s for s in h.tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    if imports:
        at = _line_start(source, imports[-1].end_lineno + 1)  # type: ignore[operator]
    else:
        body = h.tree.body
        doc = body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
        at = _line_start(source, body[0].end_lineno + 1) if doc else 0  # type: ignore[operator]
    return source[:at] + "".join(m + "\n" for m in missing) + source[at:]


def _insert_before_build(source: str, text: str) -> str:
    h = _parse(source)
    at = _line_start(source, _stmt_first_line(h.build))  # type: ignore[arg-type]
    return source[:at] + text.strip("\n") + "\n\n\n" + source[at:]


def _render_list(elements: list[str], indent: str) -> str:
    one_line = "[" + ", ".join(elements) + "]"
    if len(one_line) + len(indent) <= 88:
        return one_line
    inner = indent + "    "
    return "[\n" + "".join(f"{inner}{e},\n" for e in elements) + indent + "]"


def _ensure_slot(source: str, slot: str) -> str:
    """Make sure build_agent has ``slot = [...]`` and passes it to the constructor."""
    h = _parse(source)
    if h.constructor is None:
        raise ValueError("build_agent: no create_deep_agent/create_agent call to wire mechanisms into")
    if h.slots[slot].literal is None:
        ctor_stmt = next(s for s in h.build.body if any(n is h.constructor for n in ast.walk(s)))  # type: ignore[union-attr]
        indent = _indent_of(source, ctor_stmt)
        at = _line_start(source, ctor_stmt.lineno)
        source = source[:at] + indent + _SLOT_DECL[slot] + "\n" + source[at:]
        source = ensure_imports(source, ("Any",))
        h = _parse(source)
    if slot not in h.wired_slots:
        if slot == "subagents" and h.framework != "create_deep_agent":
            raise ValueError("sub-agents need the deepagents stack: add_mechanism(source, 'deepagents_stack') first")
        call = h.constructor
        assert call is not None
        kws = [k for k in call.keywords if k.arg != ("system_prompt" if slot == "prompt_blocks" else slot)]
        if slot == "prompt_blocks":
            old = next((k.value for k in call.keywords if k.arg == "system_prompt"), None)
            old_txt = _segment(source, old) if old is not None else "None"
            value = parse_source(f'"\\n\\n".join(p for p in [{old_txt}, *prompt_blocks] if p) or None', mode="eval").body
            kws.append(ast.keyword(arg="system_prompt", value=value))
        elif slot == "tools" and call.args[1:2]:
            call.args = call.args[:1]
            kws.append(ast.keyword(arg="tools", value=ast.Name("tools")))
        else:
            kws.append(ast.keyword(arg=slot, value=ast.Name(slot)))
        new = ast.Call(func=call.func, args=call.args, keywords=kws)
        source = _replace(source, call, ast.unparse(new))
    return source


def _set_slot_elements(source: str, slot: str, keep: list[str]) -> str:
    h = _parse(source)
    info = h.slots[slot]
    assert info.literal is not None and info.assign is not None
    return _replace(source, info.literal, _render_list(keep, _indent_of(source, info.assign)))


def _append_to_slot(source: str, slot: str, element: str) -> str:
    source = _ensure_slot(source, slot)
    h = _parse(source)
    lit = h.slots[slot].literal
    assert lit is not None
    return _set_slot_elements(source, slot, [_segment(source, e) for e in lit.elts] + [element])


def _kwargs_text(spec: MechanismSpec, params: dict[str, Any]) -> str:
    kw = ", ".join(f"{k}={params[k]!r}" for k in spec.params)
    if "({kwargs})" in spec.wiring:
        return spec.wiring.replace("{kwargs}", kw)
    return spec.wiring.replace("{kwargs}", f", {kw}" if kw else "")


def _check_value(spec: MechanismSpec, param: str, value: Any) -> Any:
    if param not in spec.params:
        raise ValueError(f"{spec.name}.{param}: unknown parameter; {spec.name} has {sorted(spec.params) or 'none'}")
    default = spec.params[param]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{spec.name}.{param}: expected a number, got {value!r}")
    if isinstance(default, int):
        if int(value) != value or value < 0:
            raise ValueError(f"{spec.name}.{param}: expected a non-negative integer, got {value!r}")
        value = int(value)
        if param == "max_chars" and value < 200:
            raise ValueError(f"{spec.name}.max_chars: must be >= 200 to keep observations usable, got {value}")
    else:
        value = float(value)
        if param.endswith("_frac") and not 0.0 < value <= 1.0:
            raise ValueError(f"{spec.name}.{param}: a fraction of the time budget in (0, 1], got {value}")
    return value


def _remove_symbol_if_unused(source: str, symbol: str) -> str:
    h = _parse(source)
    node = h.defs.get(symbol)
    if node is None or isinstance(node, (ast.Import, ast.ImportFrom)):
        return source
    own = {id(n) for n in ast.walk(node)}
    used = any(isinstance(n, ast.Name) and n.id == symbol and id(n) not in own for n in ast.walk(h.tree))
    return source if used else _delete_stmt(source, node)


# --------------------------------------------------------------------- framework swap
def _ctor_parts(source: str, h: HarnessAst) -> dict[str, str]:
    call = h.constructor
    if call is None:
        raise ValueError("build_agent: no create_deep_agent/create_agent call")
    parts = {k.arg: _segment(source, k.value) for k in call.keywords if k.arg}
    if call.args:
        parts.setdefault("model", _segment(source, call.args[0]))
    if call.args[1:2]:
        parts.setdefault("tools", _segment(source, call.args[1]))
    return parts


def _to_deepagents(source: str) -> str:
    h = _parse(source)
    if h.framework == "create_deep_agent":
        return source
    for slot in ("prompt_blocks", "tools", "middleware"):
        source = _ensure_slot(source, slot)
    h = _parse(source)
    # deepagents brings its own read_file/write_file/execute; keep tool names unique.
    lit = h.slots["tools"].literal
    if lit is not None:
        keep = [e for e in lit.elts if _element_symbol(e)[0] != "make_core_tools"]
        source = _set_slot_elements(source, "tools", [_segment(source, e) for e in keep])
        h = _parse(source)
    if h.slots["subagents"].literal is None:
        ctor_stmt = next(s for s in h.build.body if any(n is h.constructor for n in ast.walk(s)))  # type: ignore[union-attr]
        at = _line_start(source, ctor_stmt.lineno)
        source = source[:at] + _indent_of(source, ctor_stmt) + _SLOT_DECL["subagents"] + "\n" + source[at:]
        h = _parse(source)
    parts = _ctor_parts(source, h)
    backend = h.build.args.args[1].arg if len(h.build.args.args) > 1 else "backend"  # type: ignore[union-attr]
    new = (f"create_deep_agent(model={parts.get('model', 'model')}, backend={backend}, "
           f"system_prompt={parts.get('system_prompt', _SYSTEM_PROMPT_EXPR)}, tools={parts.get('tools', 'tools')}, "
           f"subagents=subagents, middleware={parts.get('middleware', 'middleware')})")
    source = _replace(source, h.constructor, new)  # type: ignore[arg-type]
    source = ensure_imports(source, ("create_deep_agent", "Any"))
    return _remove_symbol_if_unused(source, "make_core_tools")


def _to_bare(source: str) -> str:
    h = _parse(source)
    if h.framework != "create_deep_agent":
        return source
    for name, sp in MECHANISMS.items():
        if "deepagents_stack" in sp.requires:
            source = remove_mechanism(source, name)
    h = _parse(source)
    parts = _ctor_parts(source, h)
    new = (f"create_agent(model={parts.get('model', 'model')}, tools={parts.get('tools', 'tools')}, "
           f"system_prompt={parts.get('system_prompt', _SYSTEM_PROMPT_EXPR)}, "
           f"middleware={parts.get('middleware', 'middleware')})")
    source = _replace(source, h.constructor, new)  # type: ignore[arg-type]
    source = ensure_imports(source, ("create_agent", "tool", "Any"))
    h = _parse(source)
    if "make_core_tools" not in h.defs:
        source = _insert_before_build(source, T.CORE_TOOLS)
    source = _ensure_slot(source, "tools")
    h = _parse(source)
    lit = h.slots["tools"].literal
    assert lit is not None
    if not any(_element_symbol(e)[0] == "make_core_tools" for e in lit.elts):
        backend = h.build.args.args[1].arg if len(h.build.args.args) > 1 else "backend"  # type: ignore[union-attr]
        elts = [f"*make_core_tools({backend})"] + [_segment(source, e) for e in lit.elts]
        source = _set_slot_elements(source, "tools", elts)
    return source


# ------------------------------------------------------------------------------ API
def add_mechanism(source: str, name: str, **params: Any) -> str:
    """Return ``source`` with mechanism ``name`` defined and wired into build_agent.

    Missing requirements are added first (a sub-agent brings the deepagents stack);
    a mechanism already present gets the given parameters set instead.
    """
    sp = get_spec(name)
    params = {k: _check_value(sp, k, v) for k, v in params.items()}
    h = _parse(source)
    present = detect_in(h)
    if name in present:
        for k, v in params.items():
            source = set_param(source, name, k, v)
        return source
    if sp.kind == "framework":
        return _to_deepagents(source)
    for req in sp.requires:
        if req not in present:
            source = add_mechanism(source, req)
    source = ensure_imports(source, sp.imports)
    h = _parse(source)
    if not _definition_ok(sp, h.defs.get(sp.symbol)):
        for sym in (sp.symbol, *sp.extra_symbols):  # a broken leftover is replaced whole
            node = _parse(source).defs.get(sym)
            if node is not None and not isinstance(node, (ast.Import, ast.ImportFrom)):
                source = _delete_stmt(source, node)
        source = _insert_before_build(source, sp.template)
    h = _parse(source)
    if find_element(h, sp) is None:
        source = _append_to_slot(source, sp.slot, _kwargs_text(sp, {**sp.params, **params}))  # type: ignore[arg-type]
    elif params:
        for k, v in params.items():
            source = set_param(source, name, k, v)
    if name not in detect_in(_parse(source)):
        raise ValueError(f"add_mechanism({name!r}): the harness layout did not let the mechanism be wired")
    return source


def remove_mechanism(source: str, name: str) -> str:
    """Return ``source`` without mechanism ``name``: its wiring and (unused) definitions go."""
    sp = get_spec(name)
    if sp.kind == "framework":
        return _to_bare(source)
    h = _parse(source)
    info = h.slots[sp.slot]  # type: ignore[index]
    if info.literal is not None:
        keep = [e for e in info.literal.elts if _element_symbol(e)[0] != sp.symbol]
        if len(keep) != len(info.literal.elts):
            source = _set_slot_elements(source, sp.slot, [_segment(source, e) for e in keep])  # type: ignore[arg-type]
    # appended wiring (`slot.append(X(...))`) goes statement by statement
    while True:
        h = _parse(source)
        stmt = next((s for s in h.build.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)  # type: ignore[union-attr]
                     and isinstance(s.value.func, ast.Attribute) and isinstance(s.value.func.value, ast.Name)
                     and s.value.func.value.id == sp.slot
                     and any(_element_symbol(a)[0] == sp.symbol for a in s.value.args)), None)
        if stmt is None:
            break
        source = _delete_stmt(source, stmt)
    for sym in (sp.symbol, *sp.extra_symbols):
        source = _remove_symbol_if_unused(source, sym)
    return source


def set_param(source: str, name: str, param: str, value: Any) -> str:
    """Return ``source`` with ``param`` of mechanism ``name`` set to the literal ``value``."""
    sp = get_spec(name)
    value = _check_value(sp, param, value)
    h = _parse(source)
    if name not in detect_in(h):
        raise ValueError(f"set_param({name!r}, {param!r}): mechanism not present in the harness; add it first")
    elt, call = find_element(h, sp)  # type: ignore[misc]
    if call is None:
        raise ValueError(f"set_param({name!r}): its wiring is not a call, so it has no parameters")
    kws = [k for k in call.keywords if k.arg != param] + [ast.keyword(arg=param, value=ast.Constant(value))]
    new = ast.Call(func=call.func, args=call.args, keywords=kws)
    return _replace(source, call, ast.unparse(new))
