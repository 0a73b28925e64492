"""Turning bad input into one clear line (key + fix) before a run writes anything.

Hydra's own errors are multi-line and exit with 1; the entry point composes the
config once up front, maps any failure to a single ``UserError`` message here, and
exits with 2.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

# Flags after which Hydra does not run a job (or runs a sweep we cannot pre-compose).
_NO_PRECHECK_FLAGS = {"-m", "--multirun", "--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i",
                      "--shell-completion", "-sc", "--version", "--resolve", "-p", "--package"}


class UserError(Exception):
    """Bad input from the person running the command; printed as one line, exit 2."""


# Hydra exits with 1 on its own input errors, which the entry point reports as bad input
# (2) unless a job has started. A launcher whose jobs run in their own processes
# (milo_ray.sweep) says when it started them; kept here, not in the entry point's module,
# because under ``python -m milo_ray.run`` that module is ``__main__``, not the one a
# launcher imports.
_jobs_launched = False


def set_jobs_launched(value: bool = True) -> None:
    global _jobs_launched
    _jobs_launched = bool(value)


def jobs_launched() -> bool:
    return _jobs_launched


def _available(conf_dir: str, group: str) -> list[str]:
    folder = Path(conf_dir) / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def explain(exc: BaseException, conf_dir: str) -> str:
    """One line naming the offending key and how to fix it."""
    text = str(exc)
    cause = exc.__cause__
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if missing:
        group, name = missing.groups()
        options = ", ".join(_available(conf_dir, group)) or "none"
        what = "experiment" if group == "experiment" else f"option for '{group}'"
        return f"{group}={name}: no {what} named '{name}'; available: {options}"
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown:
        key = unknown.group(1)
        return f"{key}: unknown config key; check the spelling (print every key with --cfg job)"
    if cause is not None and "could not be converted" in str(cause):
        key = re.search(r"full_key: (\S+)", str(cause))
        return f"{key.group(1) if key else '?'}: {_first_line(str(cause))}; pass a value of the declared type"
    if "Error parsing override" in text:
        return f"{_first_line(text)}; write overrides as key=value"
    detail = _first_line(str(cause)) if cause is not None else _first_line(text)
    return f"configuration error: {detail}"


def _check_known_keys(node: Any, schema: type, path: str) -> None:
    """Reject keys a typed section does not declare (``+run.x=1`` would otherwise pass)."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        if key not in fields:
            raise UserError(f"{path}.{key}: unknown config key; check the spelling (print every key with --cfg job)")
        factory = fields[key].default_factory
        if factory is not dataclasses.MISSING and dataclasses.is_dataclass(default := factory()):
            _check_known_keys(node[key], type(default), f"{path}.{key}")


def check_known_keys(cfg: Any) -> None:
    """Refuse keys the typed sections (run, execution, model, backend) do not declare."""
    from milo_ray.config import BackendConfig, ExecutionConfig, ModelConfig, RunConfig

    for section, schema in (("run", RunConfig), ("execution", ExecutionConfig), ("model", ModelConfig),
                            ("backend", BackendConfig)):
        _check_known_keys(cfg[section], schema, section)


def check_overrides(conf_dir: str, argv: list[str]) -> None:
    """Compose the config for ``argv`` and raise ``UserError`` on any problem.

    Sweeps and Hydra's informational flags are left to Hydra (each sweep job is
    still checked by the structured schema when it is composed)."""
    if any(a in _NO_PRECHECK_FLAGS or a.startswith("--config") for a in argv):
        return
    overrides = [a for a in argv if not a.startswith("hydra.") and not a.startswith("hydra/")
                 and not a.startswith("+hydra")]
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    except Exception as exc:  # Hydra raises several unrelated types for input errors
        raise UserError(explain(exc, conf_dir)) from None
    finally:
        GlobalHydra.instance().clear()
    check_known_keys(cfg)
    if cfg.run.resume:
        manifest = Path(cfg.run.resume).expanduser() / "manifest.json"
        if not manifest.is_file():
            raise UserError(f"run.resume={cfg.run.resume}: no run there (manifest.json missing); "
                            "pass the run directory printed at the end of a run")
        check_resume_overrides(overrides)
    check_settings(cfg)
    if not cfg.run.resume:  # a resumed run runs its stored config: the job checks that one
        check_composition(cfg)


def check_composition(cfg: Any) -> Any:
    """:func:`milo_ray.config_targets.check_composition` with its error as a ``UserError``:
    the model, the benchmark/executor/method specs, the executor's preflight and the agents
    the method needs, all checked without building anything."""
    from milo_ray.config_targets import CompositionError, check_composition as check

    try:
        return check(cfg)
    except CompositionError as exc:
        raise UserError(str(exc)) from None


def check_tasks_runnable(executor_spec: Any, executor_node: Any, tasks: Any, *, skip: bool = False) -> dict[str, str]:
    """Ask the executor (when it can tell: ``unsupported_tasks``) about every task, one at
    a time. Tasks it cannot run refuse the run with a ``UserError`` listing every one of
    them, one per line; with ``skip`` (``run.skip_unrunnable_tasks``) they are returned
    instead ({task id: why}) for the caller to drop with a warning."""
    from milo_ray.config_targets import CompositionError, locate

    try:
        cls = locate("executor", executor_spec)
    except CompositionError as exc:
        raise UserError(str(exc)) from None
    if not callable(getattr(cls, "unsupported_tasks", None)):
        return {}
    from hydra.utils import instantiate

    try:
        executor = instantiate(executor_node, _convert_="all")
    except Exception as exc:
        raise UserError(f"executor: {_first_line(str(exc.__cause__ or exc))}") from None
    problems: dict[str, str] = {}
    unique = list({t.task_id: t for t in tasks}.values())
    for task in unique:
        why = list(executor.unsupported_tasks([task]))
        if why:
            problems[task.task_id] = "; ".join(why)
    if problems and not skip:
        raise UserError(f"executor: {len(problems)} of {len(unique)} tasks cannot run here (fix them, choose another "
                        "sandbox, or set run.skip_unrunnable_tasks=true to skip them with a warning):\n"
                        + "\n".join(problems.values()))
    return problems


def check_seed_harnesses(benchmark: Any, sandbox_node: Any = None) -> None:
    """Validate the seed harnesses a user gave by path (``benchmark.seeds``) before the run,
    in the run's sandbox (``sandbox`` group) as children are; the bundled seeds are the
    project's own and are not re-validated. ``UserError`` names ``benchmark.seeds``, the
    harness directory, what failed and the fix."""
    if getattr(benchmark, "artifact_entry", "build_agent") != "build_agent":
        return  # optimizer programs (the instance-level track) have their own seeds field
    from milo_ray.harness.seeds import load_seeds

    bundled = {h.harness_id for h in load_seeds()}
    try:
        user = [h for h in benchmark.seed_harnesses() if h.harness_id not in bundled]
    except ValueError as exc:
        raise UserError(str(exc).strip()) from None
    if not user:
        return
    from milo_ray.harness.validate import sandbox_factory_from, validate_many

    try:
        factory = sandbox_factory_from(sandbox_node)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    results = validate_many(user, sandbox=factory)
    bad = [f"{h.name}: {r.check}: {r.reason}" for h, r in zip(user, results) if not r.ok]
    if bad:
        raise UserError(f"benchmark.seeds: {len(bad)} harness director{'y' if len(bad) == 1 else 'ies'} failed "
                        "validation (fix the harness, or remove it from benchmark.seeds):\n" + "\n".join(bad))


# What a resumed run may be given again; everything else is the stored config.
RESUMABLE_KEYS = ("run.resume", "run.time_limit_s", "run.progress", "run.report", "run.budget", "execution")


def override_key(override: str) -> str:
    """The config key of one command-line override (``+a.b=1`` -> ``a.b``, ``method=x`` -> ``method``)."""
    return override.split("=", 1)[0].lstrip("+~").strip()


def check_resume_overrides(overrides: list[str]) -> None:
    """A resumed run continues with its stored config: an override that would change it
    is refused rather than silently ignored."""
    for o in overrides:
        key = override_key(o)
        if key.startswith("hydra") or any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS):
            continue
        raise UserError(f"{key}: a resumed run continues with its stored config and cannot change it; "
                        "only run.time_limit_s, run.progress, run.report, run.budget.* and execution.* may be given "
                        "with run.resume (start a new run to change anything else)")


def _check_role_caps(roles: Any) -> None:
    from omegaconf import OmegaConf

    from milo_ray.search.agent_calls import role_caps

    try:
        role_caps(OmegaConf.to_container(roles, resolve=True) if roles is not None else None)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def check_settings(cfg: Any) -> None:
    """Value checks of the run, execution and model settings (``UserError`` naming the key).

    The command-line pre-check calls it, and so does every job before it writes
    anything (multirun jobs included: the pre-check does not see sweeps)."""
    run, ex = cfg.run, cfg.execution
    if run.time_limit_s is not None and run.time_limit_s <= 0:
        raise UserError(f"run.time_limit_s={run.time_limit_s}: must be > 0 seconds (or null for no limit)")
    for name in ("executions", "tokens", "cost_usd"):
        value = run.budget[name]
        if value is not None and value < 0:
            raise UserError(f"run.budget.{name}={value}: must be >= 0 (or null for unlimited)")
    _check_role_caps(run.budget.get("roles"))
    from milo_ray.config import model_config

    try:
        model = model_config(cfg.model)
    except ValueError as exc:
        raise UserError(_first_line(str(exc))) from None
    if run.budget.cost_usd is not None and model.usd_per_mtok_input is None:
        raise UserError(f"run.budget.cost_usd={run.budget.cost_usd}: model {model.id!r} has no price, so a USD cap "
                        "would never be reached; set model.usd_per_mtok_input and model.usd_per_mtok_output, "
                        "or cap run.budget.tokens instead")
    for name, low, nullable in (("slots_per_node", 1, False), ("num_cpus", 1, True), ("group_limit", 1, True),
                                ("max_retries", 0, False), ("slots_per_worker", 1, True), ("max_workers", 1, True)):
        value = ex[name]
        if value is None and nullable:
            continue
        if value is None or value < low:
            raise UserError(f"execution.{name}={value}: must be an integer >= {low}" + (" (or null)" if nullable else ""))
    if ex.worker_idle_s is None or ex.worker_idle_s < 0:
        raise UserError(f"execution.worker_idle_s={ex.worker_idle_s}: must be >= 0 seconds")
    if not ex.slot_resource:
        raise UserError("execution.slot_resource is empty: name the Ray resource each node declares per sandbox "
                        "(default sandbox_slot)")
