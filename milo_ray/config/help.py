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
    lines += [
        "",
        "Every key of the composed config:  python -m milo_ray.run --cfg job [overrides]",
        "Values with spaces, '=', ',' or braces are quoted for the shell and for Hydra: 'key=\"a b\"'",
        "Hydra's own flags (multirun, shell completion, ...):  python -m milo_ray.run --hydra-help",
        "Exit codes: 0 finished, 1 crashed, 2 bad input (nothing written), 3 every rollout failed as "
        "infrastructure (status failed_infra) or the disk filled, 130 interrupted (resumable).",
    ]
    return "\n".join(lines)
