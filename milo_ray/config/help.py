"""``python -m milo_ray.run --help``: the options a person can choose, generated from
``conf/`` and the ConfigStore.

Hydra's own help lists every node of its config store, schemas included; this one lists
every config group with its selectable options (``conf/<group>/*.yaml`` and the options
stored in the ConfigStore, schemas left out), the experiments, and every run-level key
with the one-line help its schema field carries (``schemas.setting``). Nothing is listed
by hand, so a new group, option or run key appears here without an edit.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from milo_ray.config.paths import config_groups

# group -> what it swaps. A group without an entry is still listed, by its options alone
# (tests/entry/test_cli_runs.py asserts that every group has one).
GROUP_HELP = {
    "method": "the search method",
    "benchmark": "tasks, splits, grading data, seed harnesses; brings its usual executor",
    "executor": "how one harness runs on one task; receives the model (surrogate: simulated, model=offline only)",
    "sandbox": "where a real agent's commands run (bwrap, docker, local); the surrogate ignores it",
    "backend": "the agents of the search: mutators, orchestrator, judge, optimizer, embedder "
               "(litellm: LLM agents on backend.model, each role's llm block overridable)",
    "model": "the solver: id (part of every rollout cache key), litellm string, endpoint, key variable name, prices",
    "execution": "where Ray runs",
    "tracking": "experiment tracking: none, or mlflow (config, per-round metrics, final test, manifest, report)",
}
_EXPERIMENT = "experiment"


def run_keys() -> Iterator[tuple[str, str]]:
    """(key, help) of every run-level setting, read from the ``run`` node of the stored
    top-level schema; a schema whose fields all share one schema (the per-role caps)
    is shown once with its names as a placeholder."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from milo_ray.config.schemas import register_configs

    register_configs()
    node = ConfigStore.instance().load("config_schema.yaml").node
    yield from _walk(OmegaConf.get_type(node, "run"), "run")


def _walk(schema: Any, prefix: str) -> Iterator[tuple[str, str]]:
    fields = dataclasses.fields(schema)
    kinds = {_schema_of(f) for f in fields}
    if len(fields) > 1 and len(kinds) == 1 and None not in kinds:
        (kind,) = kinds
        names = ", ".join(f.name for f in fields)
        yield from ((key, f"{text} (ROLE: {names})") for key, text in _walk(kind, f"{prefix}.ROLE"))
        return
    for f in fields:
        key = f"{prefix}.{f.name}"
        kind = _schema_of(f)
        if kind is not None:
            yield from _walk(kind, key)
        else:
            yield key, f.metadata.get("help", "")


def _schema_of(f: dataclasses.Field) -> Any:
    """The schema (dataclass) a field holds, if it holds one."""
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return type(value) if dataclasses.is_dataclass(value) else None
    return None


def usage(conf_dir: str) -> str:
    groups = config_groups(conf_dir)
    experiments = groups.pop(_EXPERIMENT, [])
    lines = [
        "usage: python -m milo_ray.run [group=option ...] [+experiment=NAME] [key=value ...] [-m sweeps]",
        "",
        "Config groups (group=option):",
    ]
    width = max(map(len, groups), default=10)
    for group in sorted(groups, key=lambda g: (g not in GROUP_HELP, list(GROUP_HELP).index(g) if g in GROUP_HELP
                                               else 0, g)):
        lines.append(f"  {group:<{width}} {', '.join(groups[group]) or '(no option files: set its keys)'}")
        if group in GROUP_HELP:
            lines.append(f"  {'':<{width}} ({GROUP_HELP[group]})")
    lines += ["", "Experiments (+experiment=NAME, paper configurations as overrides):",
              f"  {', '.join(experiments)}", "", "Run-level keys:"]
    keys = list(run_keys())
    key_width = max(len(k) for k, _ in keys)
    lines += [f"  {key:<{key_width}} {text}" for key, text in keys]
    for name, rows in method_keys().items():
        lines += ["", f"Method keys of the {name.removesuffix('_schema')} methods (method.KEY):"]
        lines += _key_lines(rows)
    lines += ["", "Sweep launcher keys (-m hydra/launcher=ray_jobs; hydra.launcher.KEY):"]
    lines += _key_lines(launcher_keys())
    lines += [
        "",
        "Every key of the composed config:  python -m milo_ray.run --cfg job [overrides]",
        "Values with spaces, '=', ',' or braces are quoted for the shell and for Hydra: 'key=\"a b\"'",
        "Hydra's own flags (multirun, shell completion, ...):  python -m milo_ray.run --hydra-help",
        "Exit codes: 0 finished, 1 crashed, 2 bad input (nothing written), 3 every rollout failed as "
        "infrastructure (status failed_infra) or the disk filled, 130 interrupted (resumable).",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Every key a schema declares, with its type, default and help: the --help sections for the
# method and launcher keys, and the generated configuration reference of the docs site.


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    key: str
    type: str
    default: str
    help: str


def schema_keys(schema: Any, prefix: str) -> list[KeyDoc]:
    """Every leaf key of ``schema`` (a dataclass) under ``prefix``: its type, its default and
    its help -- the field's ``help`` metadata (:func:`milo_ray.config.schemas.setting`), else
    its entry in the class docstring (``name: text``, continued by deeper-indented lines), else
    the comment right above the field; nested schemas are walked."""
    docs = _docstring_entries(schema)
    comments = _field_comments(schema)
    rows: list[KeyDoc] = []
    for f in dataclasses.fields(schema):
        if f.name.startswith("_"):
            continue
        key = f"{prefix}.{f.name}"
        kind = _schema_of(f)
        if kind is not None:
            rows += schema_keys(kind, key)
            continue
        text = f.metadata.get("help") or docs.get(f.name) or comments.get(f.name, "")
        rows.append(KeyDoc(key, _type_name(f.type), _default_of(f), " ".join(text.split())))
    return rows


def _type_name(t: Any) -> str:
    name = t if isinstance(t, str) else getattr(t, "__name__", None) or str(t)
    return str(name).replace("typing.", "")


def _default_of(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def _docstring_entries(schema: Any) -> dict[str, str]:
    """``name: text`` entries of a class docstring (several names may share one entry:
    ``a / b: text``)."""
    import inspect
    import re

    doc = inspect.getdoc(schema) or ""
    entries: dict[str, str] = {}
    names: list[str] = []
    for line in doc.splitlines():
        m = re.match(r"^([a-z_][a-z0-9_]*(?:\s*/\s*[a-z_][a-z0-9_]*)*):\s+(.*)$", line)
        if m:
            names = [n.strip() for n in m.group(1).split("/")]
            for n in names:
                entries[n] = m.group(2)
        elif names and line.startswith((" ", "\t")) and line.strip():
            for n in names:
                entries[n] += " " + line.strip()
        else:
            names = []
    return entries


def _field_comments(schema: Any) -> dict[str, str]:
    """The ``#`` comment lines right above each field of a dataclass's source."""
    import inspect
    import re

    try:
        source = inspect.getsource(schema)
    except (OSError, TypeError):
        return {}
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("# "))
            continue
        m = re.match(r"^\s+([a-z_][a-z0-9_]*)\s*:", line)
        if m and pending:
            comments[m.group(1)] = " ".join(pending)
        pending = []
    return comments


def stored_schemas(group: str) -> dict[str, Any]:
    """The schemas (dataclasses) stored in the ConfigStore under ``group``, by name."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from milo_ray.config.schemas import register_configs

    register_configs()
    found: dict[str, Any] = {}
    for name in ConfigStore.instance().list(group):
        node = ConfigStore.instance().load(f"{group}/{name}").node
        kind = OmegaConf.get_type(node)
        if kind is not None and dataclasses.is_dataclass(kind):
            found[name.removesuffix(".yaml")] = kind
    return found


def method_keys() -> dict[str, list[KeyDoc]]:
    """Each method schema's keys (``method.KEY``), by schema name (``milo_schema``, ...)."""
    return {name: schema_keys(kind, "method") for name, kind in sorted(stored_schemas("method").items())}


def launcher_keys() -> list[KeyDoc]:
    """The ``hydra/launcher=ray_jobs`` keys (``hydra.launcher.KEY``): its schema, found by
    name like the method schemas (the sweep package sits above this module)."""
    mod = __import__("milo_ray.sweep.settings", fromlist=["RayJobsLauncherConf"])
    return schema_keys(mod.RayJobsLauncherConf, "hydra.launcher")


def _key_lines(rows: list[KeyDoc]) -> list[str]:
    """One line per key: its name and the first sentence of its help."""
    width = max(len(r.key) for r in rows)
    return [f"  {r.key:<{width}} {_first_sentence(r.help)}" for r in rows]


def plain(text: str) -> str:
    """Docstring markup out of a help text: ``:class:`~a.b.C``` becomes ``C``, double
    backquotes single ones."""
    import re

    text = re.sub(r":[a-z]+:`~?([\w.]+)`", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return text.replace("``", "`")


def _first_sentence(text: str) -> str:
    import re

    text = plain(text).replace("`", "")
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!App)\.\s", text)
    return text if m is None else text[:m.start() + 1]


def reference_page(conf_dir: str) -> str:
    """The configuration reference of the docs site, as Markdown: every group and option
    (with the values its file sets), every experiment (its overrides), and every key of the
    run, of each stored schema (model, backend, execution, tracking), of each method and of
    the sweep launcher, with its type, default and help. Generated at each docs build from
    ``conf/`` and the schemas, so it lists what the code accepts."""
    from omegaconf import OmegaConf

    groups = config_groups(conf_dir)
    experiments = groups.pop(_EXPERIMENT, [])
    out = ["# Configuration keys", "",
           "Generated from `conf/` and the config schemas when the site is built; "
           "`python -m milo_ray.run --help` prints the same keys in short. "
           "How a run is configured: [Configuration](../how-to/configuration.md).", ""]
    out += ["## Config groups", "",
            "Choose an option with `group=option`; each option file sets the values below "
            "(`${...}` are interpolations, resolved when the run composes).", ""]
    for group in sorted(groups):
        out += [f"### `{group}`", ""]
        if group in GROUP_HELP:
            out += [GROUP_HELP[group][0].upper() + GROUP_HELP[group][1:] + ".", ""]
        for option in groups[group]:
            values = _flat(OmegaConf.to_container(OmegaConf.load(f"{conf_dir}/{group}/{option}.yaml"),
                                                  resolve=False))
            out += [f"**`{group}={option}`**", ""]
            out += ["| key | value |", "|---|---|"] + [f"| `{k}` | {_cell(v)} |" for k, v in values] + [""] \
                if values else ["(no keys of its own)", ""]
    out += ["## Experiments", "", "`+experiment=NAME`: a paper configuration, as overrides.", ""]
    for name in experiments:
        values = _flat(OmegaConf.to_container(OmegaConf.load(f"{conf_dir}/{_EXPERIMENT}/{name}.yaml"),
                                              resolve=False))
        out += [f"**`{name}`**", "", "| key | value |", "|---|---|"]
        out += [f"| `{k}` | {_cell(v)} |" for k, v in values] + [""]
    from milo_ray.config.schemas import Config

    sections = [("Run-level keys", "run", schema_keys(_field_type(Config, "run"), "run"))]
    for group, prefix in (("model", "model"), ("backend", "backend"), ("execution", "execution"),
                          ("tracking", "tracking")):
        for name, kind in sorted(stored_schemas(group).items()):
            sections.append((f"`{prefix}` keys ({name})", prefix, schema_keys(kind, prefix)))
    for name, rows in method_keys().items():
        sections.append((f"Method keys: {name.removesuffix('_schema')}", "method", rows))
    sections.append(("Sweep launcher keys (`hydra/launcher=ray_jobs`)", "hydra.launcher", launcher_keys()))
    out += ["## Keys", ""]
    for title, _, rows in sections:
        out += [f"### {title}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        out += [f"| `{r.key}` | `{r.type}` | {_cell(r.default)} | {_cell(plain(r.help))} |" for r in rows] + [""]
    return "\n".join(out) + "\n"


def _field_type(schema: Any, name: str) -> Any:
    f = next(f for f in dataclasses.fields(schema) if f.name == name)
    return _schema_of(f)


def _flat(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf; a list of mappings is indexed (``pool[0].name``);
    Hydra's ``defaults`` list is left out (it is how the file composes, not a key)."""
    if isinstance(value, dict):
        rows: list[tuple[str, Any]] = []
        for k, v in value.items():
            if not prefix and k == "defaults":
                continue
            key = f"{prefix}.{k}" if prefix else str(k)
            rows += _flat(v, key) if isinstance(v, (dict, list)) and v else [(key, v)]
        return rows
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return [row for i, v in enumerate(value) for row in _flat(v, f"{prefix}[{i}]")]
    return [(prefix, "null" if value is None else value)]


def _cell(value: Any) -> str:
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return f"`{text}`" if text and not text.startswith("`") and len(text) < 80 and " " not in text.strip() else text
