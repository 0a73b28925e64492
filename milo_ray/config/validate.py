"""One validation pass over a command line and the config it composes, before a run writes
anything; every problem found is a :class:`~milo_ray.config.errors.Problem` (key, what is
wrong, the fix) and all of them are raised together as one
:class:`~milo_ray.config.errors.ConfigError` (exit 2).

The facts come from Hydra's own objects, never from its message texts: overrides are
parsed with Hydra's override parser, a missing option is a ``MissingConfigException``
carrying the missing file and the options, a bad value an OmegaConf error carrying its
``full_key``. Keys an override adds with ``+`` to a typed section are looked up in the
structured schema (``+`` bypasses Hydra's struct mode, so Hydra would accept them).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable, Sequence

from milo_ray.config.errors import ConfigError, UserError, raise_all
from milo_ray.config.paths import config_groups
from milo_ray.core.problems import InvalidSettings, Problem

# Flags after which Hydra does not run a job (or runs a sweep we cannot pre-compose).
_NO_PRECHECK_FLAGS = {"-m", "--multirun", "--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i",
                      "--shell-completion", "-sc", "--version", "--resolve", "-p", "--package"}
# Sections typed by a dataclass schema (milo_ray.config.schemas.Config): ``+`` may not add keys there.
_TYPED_SECTIONS = ("run", "execution", "model", "backend")
_UNKNOWN_FIX = "check the spelling (print every key with --cfg job)"


def _first_line(text: Any) -> str:
    text = str(text).strip()
    return text.splitlines()[0] if text else text


def _top_level_keys() -> set[str]:
    from milo_ray.config.schemas import Config

    return {f.name for f in dataclasses.fields(Config)}


def _schema_has(key: str) -> bool:
    """Whether the structured schema declares ``key`` (a dotted key in a typed section);
    below a field that is not itself a schema (an agent spec, ``model.extra_body``) any
    key is the field's own business."""
    from milo_ray.config.schemas import Config

    schema: Any = Config
    for part in key.split("."):
        if not dataclasses.is_dataclass(schema):
            return True
        field = {f.name: f for f in dataclasses.fields(schema)}.get(part)
        if field is None:
            return False
        schema = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    return True


def parse_overrides(argv: Sequence[str]) -> tuple[list[Any], list[Problem]]:
    """Hydra's parsed overrides of ``argv`` and a problem for every one it cannot parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed, problems = [], []
    for arg in argv:
        try:
            parsed += parser.parse_overrides([arg])
        except OverrideParseException as exc:
            problems.append(Problem(exc.override or arg, f"cannot be parsed ({_first_line(exc.message)})",
                                    "write overrides as key=value, quoting values with spaces, = or {...}"))
    return parsed, problems


def override_problems(overrides: Iterable[Any], conf_dir: str) -> list[Problem]:
    """What is wrong with parsed overrides before anything is composed: a group option that
    does not exist, a key outside every section, a ``+`` key a typed section does not declare."""
    groups, top = config_groups(conf_dir), _top_level_keys()
    problems = []
    for o in overrides:
        key = o.key_or_group
        head = key.split(".")[0].split("@")[0]
        if head == "hydra" or key.startswith("hydra/"):
            continue
        if key in groups and not o.is_delete() and not o.is_sweep_override():
            value = o.value()
            if isinstance(value, str) and value not in groups[key]:
                what = "experiment" if key == "experiment" else f"option for '{key}'"
                problems.append(Problem(f"{key}={value}", f"no {what} named '{value}'",
                                        _did_you_mean(value, groups[key], key=f"{key}={{}}")
                                        + f"available: {', '.join(groups[key]) or 'none'}"))
            continue
        if head not in top and head not in groups:
            problems.append(Problem(key, "unknown config key",
                                    _did_you_mean(head, sorted(top | set(groups))) + _UNKNOWN_FIX))
        elif (o.is_add() or o.is_force_add()) and head in _TYPED_SECTIONS and not _schema_has(key):
            problems.append(Problem(key, "unknown config key", _UNKNOWN_FIX))
    return problems


def _did_you_mean(word: str, choices: Iterable[str], *, key: str = "{}") -> str:
    """``did you mean 'X'? `` for the closest of ``choices`` to a misspelt ``word`` ('' when
    none is close); ``key`` formats the suggestion (``method={}``)."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{key.format(close[0])}'? " if close else ""


def explain(exc: BaseException, conf_dir: str) -> Problem:
    """The problem a failed composition reports, from the facts its exception carries."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and "/" in exc.missing_cfg_file:
        group, name = exc.missing_cfg_file.rsplit("/", 1)
        options = exc.options if exc.options is not None else config_groups(conf_dir).get(group, [])
        what = "experiment" if group == "experiment" else f"option for '{group}'"
        return Problem(f"{group}={name}", f"no {what} named '{name}'", f"available: {', '.join(options) or 'none'}")
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if isinstance(cause, ValidationError):
        return Problem(cause.full_key or "?", _first_line(cause.msg), "pass a value of the declared type")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return Problem(cause.full_key or str(cause.key), "unknown config key", _UNKNOWN_FIX)
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        return Problem(cause.full_key, _first_line(cause.msg), "give a value the config accepts")
    return Problem("configuration", _first_line(cause), "fix the config (print it with --cfg job)")


def check_overrides(conf_dir: str, argv: list[str]) -> Any:
    """Check the command line ``argv`` and the config it composes; ``ConfigError`` listing
    every problem found. Returns the composed config (None when the flags leave the
    command to Hydra).

    Sweeps and Hydra's informational flags are left to Hydra (each sweep job is
    still checked by the structured schema when it is composed)."""
    if any(a in _NO_PRECHECK_FLAGS or a.startswith("--config") for a in argv):
        return None
    argv = [a for a in argv if not a.startswith("hydra.") and not a.startswith("hydra/")
            and not a.startswith("+hydra")]
    problems: list[Problem] = []
    usable: list[str] = []
    for arg in argv:
        parsed, found = parse_overrides([arg])
        found = found or override_problems(parsed, conf_dir)
        problems += found
        if not found:
            usable.append(arg)
    # The keys of a group whose option does not exist cannot be checked: its schema is unknown.
    groups = config_groups(conf_dir)
    unknown = {p.key.split("=", 1)[0] for p in problems if p.key.split("=", 1)[0] in groups}
    usable = [a for a in usable if override_key(a).split(".")[0] not in unknown]
    cfg, found = compose_every_problem(conf_dir, usable)
    problems += found
    if cfg is None:
        raise_all(problems)
    if cfg.run.resume:
        manifest = Path(cfg.run.resume).expanduser() / "manifest.json"
        # A run on object storage (s3://...) is checked by the job, which fetches its manifest.
        if "://" not in str(cfg.run.resume) and not manifest.is_file():
            raise ConfigError([*problems, Problem(f"run.resume={cfg.run.resume}", "no run there (manifest.json missing)",
                                                  "pass the run directory printed at the end of a run")])
        raise_all(problems)
        check_resume_overrides(argv)
    problems += settings_problems(cfg)
    if not cfg.run.resume:  # a resumed run runs its stored config: the job checks that one
        problems += composition_problems(cfg)
    # The settings and the composition both check the model: a problem is listed once.
    raise_all({p.line(): p for p in problems}.values())
    return cfg


def compose_every_problem(conf_dir: str, argv: list[str]) -> tuple[Any, list[Problem]]:
    """Compose ``argv``; each override composition refuses is reported and left out, and the
    rest composed again, so one pass finds every such problem. Returns the config composed
    from the overrides that passed (None when even that fails) and the problems, each
    unknown key with a "did you mean" from the keys beside it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    problems: list[Problem] = []
    remaining = list(argv)
    cfg = None
    for _ in range(len(argv) + 1):
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
                cfg = compose("config", overrides=remaining)
            break
        except Exception as exc:  # Hydra raises several unrelated types for input errors
            problem = explain(exc, conf_dir)
            problems.append(problem)
            culprit = _culprit(problem.key, remaining)
            if culprit is None:
                break
            remaining.remove(culprit)
        finally:
            GlobalHydra.instance().clear()
    if cfg is not None:
        problems = [_with_suggestion(p, cfg) for p in problems]
    return cfg, problems


def _culprit(key: str, overrides: list[str]) -> str | None:
    """The override a composition problem about ``key`` (``a.b`` or ``group=option``) came from."""
    key = key.split("=", 1)[0]
    for o in overrides:
        if override_key(o) == key:
            return o
    for o in overrides:
        k = override_key(o)
        if key.startswith(k + ".") or k.startswith(key + "."):
            return o
    return None


def _with_suggestion(problem: Problem, cfg: Any) -> Problem:
    """An unknown key's problem with the closest key beside it, when one is close."""
    from omegaconf import DictConfig, OmegaConf

    if problem.problem != "unknown config key" or "." not in problem.key:
        return problem
    parent, leaf = problem.key.rsplit(".", 1)
    node = OmegaConf.select(cfg, parent, default=None)
    if not isinstance(node, DictConfig):
        return problem
    hint = _did_you_mean(leaf, [str(k) for k in node.keys()], key=f"{parent}.{{}}")
    return dataclasses.replace(problem, fix=hint + problem.fix) if hint else problem


def composition_problems(cfg: Any) -> list[Problem]:
    """:func:`milo_ray.config.targets.check_composition`'s problems, one per line it reports."""
    from milo_ray.config.targets import CompositionError, check_composition as check

    try:
        check(cfg)
    except CompositionError as exc:
        return [_problem_of(line) for line in str(exc).splitlines() if line.strip()]
    return []


def _problem_of(line: str) -> Problem:
    """A problem from a check's ``key: what is wrong; fix`` line."""
    key, sep, rest = line.partition(": ")
    return Problem(key, rest) if sep else Problem("configuration", line)


def check_composition(cfg: Any) -> Any:
    """:func:`milo_ray.config.targets.check_composition` with its error as a ``UserError``:
    the model, the benchmark/executor/method specs, the executor's preflight and the agents
    the method needs, all checked without building anything."""
    from milo_ray.config.targets import CompositionError, check_composition as check

    try:
        return check(cfg)
    except CompositionError as exc:
        raise UserError(str(exc)) from None


def check_tasks_runnable(executor_spec: Any, executor_node: Any, tasks: Any, *, skip: bool = False) -> dict[str, str]:
    """Ask the executor (when it can tell: ``unsupported_tasks``) about every task, one at
    a time. Tasks it cannot run refuse the run with a ``UserError`` listing every one of
    them, one per line; with ``skip`` (``run.skip_unrunnable_tasks``) they are returned
    instead ({task id: why}) for the caller to drop with a warning."""
    from milo_ray.config.targets import CompositionError, locate

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


def _role_cap_problems(roles: Any) -> list[Problem]:
    from omegaconf import OmegaConf

    from milo_ray.search.agent_calls import role_caps

    try:
        role_caps(OmegaConf.to_container(roles, resolve=True) if roles is not None else None)
    except InvalidSettings as exc:
        return list(exc.problems)
    return []


def _at_least(key: str, value: Any, low: float, *, nullable: bool, integer: bool, unit: str = "") -> Problem | None:
    if value is None:
        return None if nullable else Problem(f"{key}={value}", f"must be {'an integer ' if integer else ''}>= {low:g}"
                                                               f"{unit}")
    if value < low:
        return Problem(f"{key}={value}", f"must be {'an integer ' if integer else ''}>= {low:g}{unit}"
                                         + (" (or null)" if nullable else ""))
    return None


def settings_problems(cfg: Any) -> list[Problem]:
    """Every problem of the run, execution and model settings' values."""
    from milo_ray.config.schemas import model_config

    run, ex = cfg.run, cfg.execution
    problems: list[Problem] = []
    if run.time_limit_s is not None and run.time_limit_s <= 0:
        problems.append(Problem(f"run.time_limit_s={run.time_limit_s}", "must be > 0 seconds (or null for no limit)"))
    for name in ("executions", "tokens", "cost_usd"):
        value = run.budget[name]
        if value is not None and value <= 0:  # a run with nothing to spend would "finish" having done nothing
            problems.append(Problem(f"run.budget.{name}={value}", "must be > 0 (or null for unlimited)"))
    problems += _role_cap_problems(run.budget.get("roles"))
    sweep = run.budget.get("sweep") or {}
    ledger, sweep_usd = sweep.get("ledger"), sweep.get("cost_usd")
    if (ledger is None) != (sweep_usd is None):
        problems.append(Problem("run.budget.sweep.ledger / run.budget.sweep.cost_usd", "only one given",
                                "give both or neither (hydra.launcher.max_usd sets both for every job of a sweep)"))
    elif sweep_usd is not None and (isinstance(sweep_usd, bool) or not isinstance(sweep_usd, (int, float))
                                    or not sweep_usd > 0):
        problems.append(Problem(f"run.budget.sweep.cost_usd={sweep_usd}", "must be > 0 USD"))
    model = None
    try:
        model = model_config(cfg.model)
    except InvalidSettings as exc:
        problems += exc.problems
    except ValueError as exc:
        problems.append(Problem("model", str(exc)))
    if model is not None and run.budget.cost_usd is not None and run.budget.cost_usd >= 0 \
            and model.usd_per_mtok_input is None:
        problems.append(Problem(f"run.budget.cost_usd={run.budget.cost_usd}",
                                f"model {model.id!r} has no price, so a USD cap would never be reached",
                                "set model.usd_per_mtok_input and model.usd_per_mtok_output, or cap run.budget.tokens "
                                "instead"))
    for name, low, nullable in (("slots_per_node", 1, False), ("num_cpus", 1, True), ("group_limit", 1, True),
                                ("max_retries", 0, False), ("slots_per_worker", 1, True), ("max_workers", 1, True)):
        problems.append(_at_least(f"execution.{name}", ex[name], low, nullable=nullable, integer=True))
    problems.append(_at_least("execution.worker_idle_s", ex.worker_idle_s, 0, nullable=False, integer=False,
                              unit=" seconds"))
    if not ex.slot_resource:
        problems.append(Problem("execution.slot_resource", "empty", "name the Ray resource each node declares per "
                                "sandbox (default sandbox_slot)"))
    return [p for p in problems if p is not None]


def check_settings(cfg: Any) -> None:
    """Value checks of the run, execution and model settings: a ``ConfigError`` listing
    every problem, each naming the key.

    The command-line pre-check calls it, and so does every job before it writes
    anything (multirun jobs included: the pre-check does not see sweeps)."""
    raise_all(settings_problems(cfg))
