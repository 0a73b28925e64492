"""``python -m milo_ray.run --help``: the options a person can choose, read from ``conf/``.

Hydra's own help lists every node of its config store, schemas included; this one
lists only the config groups' option files, the experiments and the run-level keys.
"""

from __future__ import annotations

from pathlib import Path

# group -> what it swaps (the README's configuration table says the same)
GROUPS = {
    "method": "the search method",
    "benchmark": "tasks, splits, grading data, seed harnesses",
    "executor": "how one harness runs on one task; receives the model (surrogate: simulated, model=offline only)",
    "backend": "the agents of the search: mutators, orchestrator, judge, optimizer, embedder "
               "(litellm: LLM agents on backend.model, each role's llm block overridable)",
    "model": "the solver: id (part of every rollout cache key), litellm string, endpoint, key variable name, prices",
    "execution": "where Ray runs",
    "tracking": "experiment tracking: none, or mlflow (config, per-round metrics, final test, manifest, report)",
}


def options(conf_dir: str, group: str) -> list[str]:
    """The selectable options of a config group: its YAML files."""
    folder = Path(conf_dir) / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


RUN_KEYS = {
    "run.dir": "the run directory, the only one a run writes (default runs/<timestamp>)",
    "run.resume": "continue an interrupted run from its directory, with its stored config",
    "run.seed": "the run seed (islands, candidates and rollouts derive theirs)",
    "run.time_limit_s": "wall-clock limit of the run, earlier sessions counted (null: none)",
    "run.budget.executions": "rollout budget; cached rollouts are free (null: unlimited)",
    "run.budget.tokens": "token cap on rollouts and agent calls (null: unlimited)",
    "run.budget.cost_usd": "USD cap on rollouts and agent calls; needs model prices (null: unlimited)",
    "run.budget.roles.ROLE.tokens": "token cap of one agent role (solver, mutator, orchestrator, judge, optimizer, embedder)",
    "run.budget.roles.ROLE.cost_usd": "USD cap of one agent role",
    "run.progress": "live progress (rollouts, islands/races, best, spend, ETA; true/false; null: when a terminal)",
}


def usage(conf_dir: str) -> str:
    lines = [
        "usage: python -m milo_ray.run [group=option ...] [+experiment=NAME] [key=value ...] [-m sweeps]",
        "",
        "Config groups (group=option):",
    ]
    for group, what in GROUPS.items():
        lines.append(f"  {group:<10} {', '.join(options(conf_dir, group))}")
        lines.append(f"  {'':<10} ({what})")
    lines += ["", "Experiments (+experiment=NAME, paper configurations as overrides):",
              f"  {', '.join(options(conf_dir, 'experiment'))}", "", "Run-level keys:"]
    width = max(map(len, RUN_KEYS))
    lines += [f"  {key:<{width}} {text}" for key, text in RUN_KEYS.items()]
    lines += [
        "",
        "Every key of the composed config:  python -m milo_ray.run --cfg job [overrides]",
        "Hydra's own flags (multirun, shell completion, ...):  python -m milo_ray.run --hydra-help",
        "Exit codes: 0 finished, 1 crashed, 2 bad input (nothing written), 3 every rollout failed as "
        "infrastructure (status failed_infra), 130 interrupted (resumable).",
    ]
    return "\n".join(lines)
