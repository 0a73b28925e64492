"""Rewrite ``from OLD import names`` statements to the modules the names now live in.

The value types moved into :mod:`milo_ray.core` (tasks, rollouts, the executor protocol,
seed derivation, the task-format protocol). This rewrites every import of a moved name,
at any indentation and across parenthesized lines, splitting one statement into one per
new home; names that did not move stay where they were. Purely mechanical, so it can be
rerun on any branch that still imports the old homes:

    python scripts/rewrite_imports.py milo_ray tests scripts hydra_plugins
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

# old module -> {name: new module}; a name not listed stays in the old module.
MOVES: dict[str, dict[str, str]] = {
    "milo_ray.execution.types": {
        "Task": "milo_ray.core.tasks",
        "ErrorKind": "milo_ray.core.rollouts",
        "ERROR_KINDS": "milo_ray.core.rollouts",
        "cache_key": "milo_ray.core.rollouts",
        "RolloutRequest": "milo_ray.core.rollouts",
        "RolloutResult": "milo_ray.core.rollouts",
        "InfraFailure": "milo_ray.core.rollouts",
        "Executor": "milo_ray.core.executor",
        "HarnessLike": "milo_ray.core.executor",
    },
    "milo_ray.search.seeds": {"derive_seed": "milo_ray.core.seeds"},
    "milo_ray.execution.harness_process": {"is_endpoint_error": "milo_ray.core.failures"},
    "milo_ray.execution.agent_executor": {"is_endpoint_error": "milo_ray.core.failures"},
    "milo_ray.benchmarks.task_format": {
        "Verdict": "milo_ray.core.tasks",
        "TaskFormat": "milo_ray.core.tasks",
        "format_of": "milo_ray.core.tasks",
    },
}
# Whole modules that moved: old module -> the new home of every name MOVES does not list.
MODULE_MOVES: dict[str, str] = {
    "milo_ray.config": "milo_ray.config.schemas",
    "milo_ray.config_path": "milo_ray.config.paths",
    "milo_ray.cli_help": "milo_ray.config.help",
    "milo_ray.config_errors": "milo_ray.config.validate",
    "milo_ray.config_targets": "milo_ray.config.targets",
}
MOVES.update({
    "milo_ray.config_errors": {"UserError": "milo_ray.config.errors", "set_jobs_launched": "milo_ray.config.errors",
                               "jobs_launched": "milo_ray.config.errors"},
})
for _old in MODULE_MOVES:
    MOVES.setdefault(_old, {})
# Dotted references in strings and docstrings (monkeypatch targets, Sphinx roles).
TEXT_MOVES = {f"{old}.{name}": f"{new}.{name}" for old, names in MOVES.items() for name, new in names.items()}
# Module references in text: ``milo_ray.config_errors.check_x`` and ``milo_ray.cli_help``.
# ``milo_ray.config`` itself is now the package, so only its dotted names are rewritten, by
# ast (imports) and by the schema names below.
_TEXT_MODULES = {old: new for old, new in MODULE_MOVES.items() if old != "milo_ray.config"}


_STRING_IMPORT = re.compile(r"^([ \t]*)from (" + "|".join(re.escape(m) for m in MOVES) + r") import ([\w, ]+)$",
                            re.MULTILINE)


# ``milo_ray.config.ModelConfig`` (a schema name) -> ``milo_ray.config.schemas.ModelConfig``.
_SCHEMA_NAMES = ("Config", "RunConfig", "ExecutionConfig", "ModelConfig", "BackendConfig", "AgentsConfig",
                 "BudgetConfig", "RoleBudgetConfig", "RoleBudgetsConfig", "MlflowTrackingConfig", "EvalConfig",
                 "register_configs", "model_config", "OFFLINE_MODEL_ID")
_SCHEMA_REF = re.compile(r"milo_ray\.config\.(" + "|".join(_SCHEMA_NAMES) + r")\b")


def _split(indent: str, module: str, names: str) -> str:
    groups: dict[str, list[str]] = {}
    for name in (n.strip() for n in names.split(",") if n.strip()):
        default = MODULE_MOVES.get(module, module)
        groups.setdefault(MOVES[module].get(name.split(" as ")[0], default), []).append(name)
    return "\n".join(f"{indent}from {home} import {', '.join(ns)}" for home, ns in groups.items())


def rewrite(text: str) -> str:
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MOVES):
            continue
        moves = MOVES[node.module]
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            home = moves.get(alias.name, MODULE_MOVES.get(node.module, node.module))
            groups.setdefault(home, []).append(alias.name + (f" as {alias.asname}" if alias.asname else ""))
        first = lines[node.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        last = lines[node.end_lineno - 1]
        # A trailing comment on the statement's last line stays with the first new line.
        tail = last.rstrip("\n")[node.end_col_offset:]
        new = [f"{indent}from {home} import {', '.join(names)}" for home, names in groups.items()]
        new[0] += tail
        edits.append((node.lineno, node.end_lineno, "".join(line + "\n" for line in new)))
    for start, end, new in sorted(edits, reverse=True):
        lines[start - 1:end] = [new]
    out = "".join(lines)
    # Single-line imports inside strings (code a test runs in a subprocess).
    out = _STRING_IMPORT.sub(lambda m: _split(m.group(1), m.group(2), m.group(3)), out)
    for old, new in TEXT_MOVES.items():
        out = out.replace(old, new)
    for old, new in _TEXT_MODULES.items():
        out = re.sub(re.escape(old) + r"\b", new, out)
    out = _SCHEMA_REF.sub(lambda m: f"milo_ray.config.schemas.{m.group(1)}", out)
    return out


def main(roots: list[str]) -> int:
    changed = 0
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            text = path.read_text()
            if path.resolve() == Path(__file__).resolve():
                continue
            new = rewrite(text)
            if new != text:
                path.write_text(new)
                changed += 1
                print(path)
    print(f"{changed} files rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["milo_ray", "tests", "scripts", "hydra_plugins"]))
