"""Entry point of the harness-validation subprocess (``python -P -m
milo_ray.harness._validate_child <workdir>``).

Owns the checks that must execute harness code, or that resolve imports against
the installed environment: compile every ``.py`` file, resolve every import
statically, import ``harness.py``, inspect its entry function (``build_agent`` for
an agent harness, ``optimize`` for an optimizer program). It runs in a fresh
interpreter started by :mod:`milo_ray.harness.validate`, never inside the
caller's process, so a harness that loops, allocates without bound, calls
``sys.exit`` or ``os._exit`` at import cannot touch the caller.

Invocation: ``python -P -m milo_ray.harness._validate_child <workdir> <entry> [<result>]``,
inside the validation sandbox. ``<workdir>/src/`` holds the harness files (read-only);
the current directory is an empty writable one. The result is one JSON object
``{"ok": bool, "check": str | null, "reason": str | null, "imports": [...]}`` written to
the file ``<result>`` (else as one line on the original stdout). Anything the harness
prints goes to stderr, so it cannot corrupt it.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import resource
import sys
import traceback
from pathlib import Path

ENTRY_FILE = "harness.py"
ENTRY_FUNCTION = "build_agent"
# The entry functions a harness may be validated for, with the call they must accept.
ENTRIES = {
    "build_agent": "build_agent(model, backend)",
    "optimize": "optimize(values, *, seed, deadline)",
}
# Exceptions whose handler makes an import optional: the harness survives its absence.
_GUARD_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


class CheckFailed(Exception):
    def __init__(self, check: str, reason: str) -> None:
        super().__init__(reason)
        self.check = check
        self.reason = reason


# --------------------------------------------------------------------------- syntax


def compile_all(src: Path) -> dict[str, ast.Module]:
    """Parse and compile every .py file; the first SyntaxError names file:line."""
    trees: dict[str, ast.Module] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        try:
            text = path.read_text()
            tree = ast.parse(text, filename=rel)
            compile(tree, rel, "exec", dont_inherit=True)
        except SyntaxError as e:
            where = f"{rel}:{e.lineno}" if e.lineno else rel
            raise CheckFailed("syntax", f"{where}: {type(e).__name__}: {e.msg}") from None
        except (ValueError, UnicodeDecodeError) as e:  # null bytes, undecodable text
            raise CheckFailed("syntax", f"{rel}: cannot compile: {e}") from None
        trees[rel] = tree
    return trees


# --------------------------------------------------------------------------- imports


class _ImportCollector(ast.NodeVisitor):
    """Every import of one file as (module, level, lineno, guarded).

    ``guarded`` marks imports the harness survives without: inside ``try`` with an
    ImportError-catching handler, or under ``if TYPE_CHECKING:``. Literal calls of
    ``importlib.import_module("x")`` / ``__import__("x")`` count as imports too."""

    def __init__(self) -> None:
        self.found: list[tuple[str, int, int, bool]] = []
        self._guard = 0

    def _add(self, module: str, level: int, lineno: int) -> None:
        self.found.append((module, level, lineno, self._guard > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, 0, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._add(node.module, 0, node.lineno)
        else:
            # "from . import x" may name submodules; "from .m import x" names module m.
            targets = [node.module] if node.module else [a.name for a in node.names]
            for t in targets:
                self._add(t, node.level, node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith("."):
                self._add(arg.value, 0, node.lineno)
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        guarded = any(_handler_guards(h) for h in node.handlers)
        self._guard += guarded
        for stmt in node.body:
            self.visit(stmt)
        self._guard -= guarded
        for part in (node.handlers, node.orelse, node.finalbody):
            for stmt in part:
                self.visit(stmt)

    visit_TryStar = visit_Try

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        type_checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        self.visit(test)
        self._guard += type_checking
        for stmt in node.body:
            self.visit(stmt)
        self._guard -= type_checking
        for stmt in node.orelse:
            self.visit(stmt)


def _handler_guards(handler: ast.ExceptHandler) -> bool:
    t = handler.type
    if t is None:
        return True
    names = t.elts if isinstance(t, ast.Tuple) else [t]
    return any(
        (isinstance(n, ast.Name) and n.id in _GUARD_EXCEPTIONS)
        or (isinstance(n, ast.Attribute) and n.attr in _GUARD_EXCEPTIONS)
        for n in names
    )


def _local_module_exists(base: Path, dotted: str) -> bool:
    target = base.joinpath(*dotted.split("."))
    return target.with_suffix(".py").is_file() or target.is_dir()


def resolve_imports(src: Path, trees: dict[str, ast.Module]) -> list[dict]:
    """Check each unguarded import resolves to the stdlib, an installed distribution
    or a module inside the harness directory; the first one that does not fails."""
    seen: dict[tuple[str, int, str], str] = {}
    report: list[dict] = []
    for rel, tree in trees.items():
        collector = _ImportCollector()
        collector.visit(tree)
        file_dir = (src / rel).parent
        for module, level, lineno, guarded in collector.found:
            if guarded:
                origin = "optional"
            else:
                key = (module, level, str(file_dir) if level else "")
                if key not in seen:
                    seen[key] = _classify(src, file_dir, module, level)
                origin = seen[key]
            name = "." * level + module
            report.append({"module": name, "file": rel, "line": lineno, "origin": origin})
            if origin == "unresolved":
                raise CheckFailed(
                    "imports",
                    f"{rel}:{lineno}: import {name!r} does not resolve to the standard library, an "
                    f"installed package or a module inside the harness directory; the harness must "
                    f"be self-contained",
                )
    return report


def _classify(src: Path, file_dir: Path, module: str, level: int) -> str:
    if level:
        base = file_dir
        for _ in range(level - 1):
            base = base.parent
        inside = base == src or src in base.parents
        return "local" if inside and _local_module_exists(base, module) else "unresolved"
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return "stdlib"
    if _local_module_exists(src, top):
        return "local" if _local_module_exists(src, module) or "." not in module else "unresolved"
    try:
        # find_spec on a dotted name imports its parent packages: installed code, not
        # harness code, and only ever inside this subprocess.
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    except Exception:  # a parent package that fails on import
        found = False
    return "installed" if found else "unresolved"


# --------------------------------------------------------------------------- import + entry


def _limit_note() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return "" if soft == resource.RLIM_INFINITY else f" (address-space limit {soft // (1024 * 1024)} MB)"


def import_entry(src: Path):
    """Execute harness.py as module ``harness``; failures name the harness line."""
    sys.path.insert(0, str(src))
    spec = importlib.util.spec_from_file_location("harness", src / ENTRY_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["harness"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # SystemExit and MemoryError are harness failures too
        where = ""
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            fpath = Path(frame.filename)
            if fpath.is_absolute() and (fpath == src or src in fpath.parents):
                where = f" at {fpath.relative_to(src).as_posix()}:{frame.lineno}"
                break
        note = _limit_note() if isinstance(e, MemoryError) else ""
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckFailed(
            "import", f"importing {ENTRY_FILE} raised {type(e).__name__}{': ' + detail if detail else ''}{where}{note}"
        ) from None
    return module


def check_entry(module, entry: str = ENTRY_FUNCTION) -> None:
    """The entry function exists and accepts the call the runner makes (``ENTRIES``)."""
    fn = getattr(module, entry, None)
    if fn is None:
        raise CheckFailed("entry", f"{ENTRY_FILE} defines no {ENTRIES[entry]}")
    if not callable(fn):
        raise CheckFailed("entry", f"{entry} is not callable (it is a {type(fn).__name__})")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise CheckFailed("signature", f"cannot read the signature of {entry}: {e}") from None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    required = [p for p in sig.parameters.values() if p.kind not in variadic and p.default is p.empty]
    if entry == "build_agent":
        if len(required) != 2 or any(p.kind not in positional for p in required):
            raise CheckFailed(
                "signature",
                f"{entry}{sig} must take exactly two required positional parameters "
                f"(model, backend); any other parameter needs a default",
            )
        return
    # optimize: the runner calls optimize(values, seed=..., deadline=...).
    req_pos = [p for p in required if p.kind in positional]
    keyword_only = {p.name for p in sig.parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY}
    other_required = [p.name for p in required if p.kind not in positional and p.name not in ("seed", "deadline")]
    if len(req_pos) != 1 or not {"seed", "deadline"} <= keyword_only or other_required:
        raise CheckFailed(
            "signature",
            f"{entry}{sig} must take exactly one required positional parameter (values) and the "
            f"keyword-only parameters seed and deadline; any other parameter needs a default",
        )


# --------------------------------------------------------------------------- main


def run_checks(workdir: Path, entry: str = ENTRY_FUNCTION) -> dict:
    src = (workdir / "src").resolve()
    imports: list[dict] = []
    try:
        if not (src / ENTRY_FILE).is_file():
            raise CheckFailed("entry", f"missing {ENTRY_FILE}")
        trees = compile_all(src)
        imports = resolve_imports(src, trees)
        check_entry(import_entry(src), entry)
    except CheckFailed as e:
        return {"ok": False, "check": e.check, "reason": e.reason, "imports": imports}
    return {"ok": True, "check": None, "reason": None, "imports": imports}


def main(argv: list[str]) -> None:
    if len(argv) not in (3, 4) or argv[2] not in ENTRIES:
        sys.stderr.write(f"usage: python -m milo_ray.harness._validate_child <workdir> <{'|'.join(ENTRIES)}> [<result>]\n")
        os._exit(2)
    # Resolved before harness code runs: an os.chdir at import must not move the result.
    result_path = os.path.abspath(argv[3]) if len(argv) == 4 else None
    # Keep the result channel private: harness prints land on stderr instead.
    result_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        result = run_checks(Path(argv[1]), argv[2])
    except BaseException as e:  # our own failure (e.g. memory exhausted while checking)
        result = {"ok": False, "check": "crash", "reason": f"validator failed: {type(e).__name__}: {e}{_limit_note()}"}
    try:
        line = json.dumps(result)
    except (TypeError, ValueError):
        line = json.dumps({"ok": False, "check": "crash", "reason": "validator produced an unserializable result"})
    data = (line + "\n").encode()
    if result_path is not None:
        result_fd = os.open(result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    while data:
        data = data[os.write(result_fd, data):]
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter shutdown: harness atexit hooks or non-daemon threads must not
    # turn a finished validation into a timeout.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
