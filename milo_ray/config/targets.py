"""Checks of the composed config's ``_target_`` specs before anything is built or written.

A run is assembled from independent groups (``benchmark``, ``executor``, ``model``,
``backend``, ``method``); a combination that cannot work must be refused in one line
before the run directory exists, not discovered inside a Ray worker or an hour into a
search. Nothing here constructs anything: a spec is checked by importing its
``_target_`` and binding its keys to the constructor's signature
(``inspect.signature(...).bind_partial``), so a heavy agent or executor costs nothing
until the run really starts.

Two declarations connect the groups:

* an executor class may define ``preflight(model, benchmark)`` (a static or class
  method; ``model`` a checked :class:`~milo_ray.config.schemas.ModelConfig`, ``benchmark`` the
  benchmark's config mapping) raising ``ValueError`` for a model or benchmark it cannot
  run (the surrogate executor simulates the solver, so it refuses a litellm model);
* a method class declares the agent roles it needs in ``agent_roles`` (MILO: mutators
  and orchestrator; SSR: judge, optimizer, embedder; eval: none).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from milo_ray.config.schemas import ModelConfig, model_config
from milo_ray.core.problems import Bounds, ExistingPath, Problem

AGENT_ROLES = ("mutators", "orchestrator", "judge", "optimizer", "embedder")
# Keys Hydra's instantiate reads itself; they are never constructor keywords.
_HYDRA_KEYS = {"_target_", "_convert_", "_recursive_", "_partial_", "_args_"}
_HINTS = {"model_id": "the solver's cache identity is model.id (the model group), not a benchmark or executor key"}


class CompositionError(ValueError):
    """A composition that cannot work; one line naming the key. The entry point reports it
    as bad input (``UserError``, exit 2)."""


@dataclass(frozen=True)
class Composition:
    """What the checks established: the checked model (``id`` filled in), the executor
    spec (resolved, ``${model}`` included) the workers build, and the agent specs."""

    model: ModelConfig
    executor: dict[str, Any]
    agents: dict[str, Any]


def _first_line(text: str) -> str:
    text = str(text).strip()
    return text.splitlines()[0] if text else text


def locate(path: str, spec: Any) -> Any:
    """The class or function a spec's ``_target_`` names; ``CompositionError`` naming ``path``."""
    if not isinstance(spec, Mapping):
        raise CompositionError(f"{path}: expected a mapping with a _target_ (the class to build), got {type(spec).__name__}")
    target = spec.get("_target_")
    if not isinstance(target, str) or not target.strip():
        raise CompositionError(f"{path}._target_: missing; give the dotted path of the class or function to build")
    # Hydra's own locator (what instantiate uses, so the same paths resolve); the public
    # hydra.utils.get_object would also log a multi-line error on a miss.
    from hydra._internal.utils import _locate

    try:
        return _locate(target)
    except Exception as exc:  # ImportError, AttributeError, or the module failing to import
        cause = exc.__cause__ or exc
        detail = f" ({_first_line(cause)})" if isinstance(cause, ImportError) and "No module named" not in str(cause) else ""
        raise CompositionError(f"{path}._target_={target}: no such class or function{detail}; check the dotted path") from None


def check_spec(path: str, spec: Any, *, borrowed: frozenset[str] = frozenset()) -> Any:
    """Check one ``_target_`` spec without building it: the target is importable and every
    key is a keyword its constructor accepts (nested specs too). Returns the target.
    ``borrowed``: keys whose value is an interpolation of another key; their values are
    checked where they are set, so a bad value is reported once, under the key given."""
    target = locate(path, spec)
    kwargs = {k: v for k, v in spec.items() if k not in _HYDRA_KEYS}
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without a signature: its construction will tell
        sig = None
    if sig is not None:
        try:
            sig.bind_partial(*list(spec.get("_args_") or []), **kwargs)
        except TypeError as exc:
            takes = [n for n, p in sig.parameters.items()
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            name = getattr(target, "__name__", str(target))
            bad = next((k for k in kwargs if k not in takes), None)
            if bad is None:
                raise CompositionError(f"{path}: {name} cannot take these arguments ({_first_line(exc)})") from None
            hint = f"; {_HINTS[bad]}" if bad in _HINTS else ""
            raise CompositionError(f"{path}.{bad}: {name} has no parameter '{bad}' (it takes {', '.join(takes) or 'none'})"
                            f"{hint}") from None
    problems = value_problems(path, target, {k: v for k, v in kwargs.items() if k not in borrowed})
    if problems:
        raise CompositionError("\n".join(p.line() for p in problems))
    if spec.get("_recursive_", True):
        for key, value in kwargs.items():
            for i, item in enumerate(value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, Mapping) and "_target_" in item:
                    suffix = f"[{i}]" if isinstance(value, (list, tuple)) else ""
                    check_spec(f"{path}.{key}{suffix}", item)
    return target


_SCALARS = (bool, int, float, str)


def _parameter_hints(target: Any) -> dict[str, Any]:
    """The constructor's parameter annotations, ``Annotated`` extras kept ({} when they
    cannot be resolved: then only the constructor itself checks its values)."""
    func = target.__init__ if inspect.isclass(target) else target
    try:
        return typing.get_type_hints(func, include_extras=True)
    except Exception:  # an annotation naming something only a type checker imports
        return {}


def _accepts(kind: Any, value: Any) -> bool:
    """Whether ``value`` fits a scalar annotation (int for float; never bool for a number)."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def value_problems(path: str, target: Any, kwargs: Mapping[str, Any]) -> list[Problem]:
    """Values that do not fit the constructor's scalar parameter types or the bounds its
    parameters declare (``Annotated[..., Bounds(...)]``)."""
    problems = []
    hints = _parameter_hints(target)
    for name, value in kwargs.items():
        hint = hints.get(name)
        if hint is None or value is None and _nullable(hint) or isinstance(value, Mapping) and "_target_" in value:
            continue  # a nested spec is checked on its own and built into what the parameter takes
        extras: tuple = ()
        if typing.get_origin(hint) is typing.Annotated:
            hint, *rest = typing.get_args(hint)
            extras = tuple(rest)
        kinds = _scalar_kinds(hint)
        if kinds and not any(_accepts(k, value) for k in kinds):
            names = " or ".join(k.__name__ for k in kinds) + (" (or null)" if _nullable(hint) else "")
            problems.append(Problem(f"{path}.{name}={value!r}", f"expected {names}", "pass a value of that type"))
            continue
        for extra in extras:
            found = extra.problem(f"{path}.{name}", value) if isinstance(extra, (Bounds, ExistingPath)) else None
            if found is not None:
                problems.append(found)
    return problems


def _nullable(hint: Any) -> bool:
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return type(None) in typing.get_args(hint)


def _scalar_kinds(hint: Any) -> tuple[type, ...]:
    """The scalar types a hint allows, when it allows only scalars (and None); else ()."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = tuple(a for a in args if a is not type(None))
    return kinds if kinds and all(k in _SCALARS for k in kinds) else ()


def check_agents(agents: Mapping[str, Any], roles: Sequence[str], method: str) -> None:
    """Every role ``roles`` lists is set; every spec given (needed or not) is importable and
    takes its keys; mutator names are unique. ``CompositionError`` naming the key."""
    for role in roles:
        if role not in AGENT_ROLES:
            raise CompositionError(f"method {method}: declares an unknown agent role {role!r} (roles: {AGENT_ROLES})")
        if not agents.get(role):
            raise CompositionError(f"backend.agents.{role}: not set, and method {method} needs it (it needs "
                            f"{', '.join(roles)}); set it in the backend config (e.g. backend=offline)")
    mutators = agents.get("mutators") or []
    if not isinstance(mutators, (list, tuple)):
        raise CompositionError(f"backend.agents.mutators: expected a list of mutator specs, got {type(mutators).__name__}")
    names: dict[str, int] = {}
    for i, spec in enumerate(mutators):
        # ``seats`` is the pool's (concurrent mutations the mutator's account allows), not a constructor keyword.
        seats = spec.get("seats") if isinstance(spec, Mapping) else None
        if seats is not None and (isinstance(seats, bool) or not isinstance(seats, int) or seats < 1):
            raise CompositionError(f"backend.agents.mutators[{i}].seats={seats!r}: expected an integer >= 1 (concurrent "
                                   "mutations the mutator's account allows, shared by every run on the cluster), or "
                                   "null (method.mutator_concurrency per run)")
        check_spec(f"backend.agents.mutators[{i}]",
                   {k: v for k, v in spec.items() if k != "seats"} if isinstance(spec, Mapping) else spec)
        name = None if spec.get("name") is None else str(spec["name"])
        if name is not None and name in names:
            raise CompositionError(f"backend.agents.mutators[{i}].name={name}: already the name of mutators[{names[name]}]; "
                            "give every mutator a distinct name")
        if name is not None:
            names[name] = i
    for role in AGENT_ROLES[1:]:
        if agents.get(role) is not None:
            check_spec(f"backend.agents.{role}", agents[role])


def _resolved(cfg: Any, section: str) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationKeyError, InterpolationResolutionError, MissingMandatoryValue

    try:
        return OmegaConf.to_container(cfg[section], resolve=True)
    except (InterpolationKeyError, InterpolationResolutionError) as exc:
        benchmark = OmegaConf.select(cfg, "benchmark._target_", default="?")
        raise CompositionError(f"{section}: {_first_line(exc)}; this {section} does not fit benchmark {benchmark} "
                        f"(choose a matching {section})") from None
    except MissingMandatoryValue as exc:
        raise CompositionError(f"{section}: {_first_line(exc)}; give the missing value") from None


def check_composition(cfg: Any) -> Composition:
    """Check the whole composition before anything is built: the model (and write its
    resolved ``id`` back into ``cfg.model.id``, so the stored config and the executor's
    ``${model}`` carry the identity), the benchmark, executor and method specs, the
    executor's preflight against the model and benchmark, and the agents the method
    needs. ``CompositionError`` listing every problem found, one line each naming its key
    (a check whose input already failed is skipped: the executor's preflight needs a valid
    model, benchmark and executor)."""
    from omegaconf import OmegaConf

    found: list[str] = []  # every problem of the pass, one line each; a check whose input failed is skipped

    def attempt(check: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except CompositionError as exc:
            found.extend(str(exc).splitlines())
        except ValueError as exc:  # the model's and the preflight's own refusals
            found.extend([_first_line(exc)] if check is _preflight else str(exc).splitlines())
        return None

    model = attempt(model_config, cfg.model)
    if model is not None and cfg.model.id != model.id:
        cfg.model.id = model.id
    benchmark = attempt(_resolved, cfg, "benchmark")
    if benchmark is not None:
        attempt(check_spec, "benchmark", benchmark, borrowed=_interpolated(cfg, "benchmark"))
    executor = attempt(_resolved, cfg, "executor")
    executor_cls = None if executor is None else attempt(check_spec, "executor", executor,
                                                         borrowed=_interpolated(cfg, "executor"))
    # The preflight reads the benchmark's settings, not its data: it runs beside a bad path
    # too, but not on a benchmark whose class does not exist (check_spec has said so).
    if model is not None and executor_cls is not None and benchmark is not None and _locatable("benchmark", benchmark):
        attempt(_preflight, executor_cls, model, benchmark, executor)
    method_spec = attempt(_resolved, cfg, "method")
    method_cls = None if method_spec is None else attempt(check_spec, "method", method_spec,
                                                          borrowed=_interpolated(cfg, "method"))
    if method_cls is not None:
        roles_for = getattr(method_cls, "agent_roles_for", None)  # roles that depend on the method's settings
        roles = tuple(roles_for(method_spec) if callable(roles_for) else getattr(method_cls, "agent_roles", ()) or ())
        agents = OmegaConf.to_container(cfg.backend.agents, resolve=True)
        attempt(check_agents, agents, roles, str(getattr(method_cls, "name", None) or method_spec["_target_"]))
        attempt(check_agent_models, agents, roles, backend_model=cfg.backend.get("model"))
    if found:
        raise CompositionError("\n".join(dict.fromkeys(found)))
    return Composition(model=model, executor=executor, agents=agents)


def _locatable(path: str, spec: Any) -> bool:
    try:
        locate(path, spec)
    except CompositionError:
        return False
    return True


def _interpolated(cfg: Any, section: str) -> frozenset[str]:
    """The top-level keys of ``cfg[section]`` whose value is an interpolation (``${...}``)."""
    from omegaconf import DictConfig, OmegaConf

    node = cfg.get(section)
    if not isinstance(node, DictConfig):
        return frozenset()
    return frozenset(str(k) for k in node.keys() if OmegaConf.is_interpolation(node, str(k)))


def _preflight(executor_cls: Any, model: ModelConfig, benchmark: Any, executor: Any) -> None:
    """The executor's own check of the model and benchmark it is given (``ValueError``)."""
    preflight = getattr(executor_cls, "preflight", None)
    if not callable(preflight):
        return
    if "executor" in inspect.signature(preflight).parameters:
        preflight(model, benchmark, executor=executor)
    else:
        preflight(model, benchmark)


def _llm_specs(agents: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(role, config path, llm block) of every agent spec that talks to a model."""
    out = [("mutators", f"backend.agents.mutators[{i}].llm", s["llm"])
           for i, s in enumerate(agents.get("mutators") or []) if isinstance(s, Mapping) and "llm" in s]
    # A CLI mutator's model gateway holds the model the CLI is served (its key goes to the task).
    out += [("mutators", f"backend.agents.mutators[{i}].gateway.llm", s["gateway"]["llm"])
            for i, s in enumerate(agents.get("mutators") or [])
            if isinstance(s, Mapping) and isinstance(s.get("gateway"), Mapping) and "llm" in s["gateway"]]
    for role in AGENT_ROLES[1:]:
        spec = agents.get(role)
        if isinstance(spec, Mapping) and "llm" in spec:
            out.append((role, f"backend.agents.{role}.llm", spec["llm"]))
    return out


def check_agent_models(agents: Mapping[str, Any], roles: Sequence[str], *, backend_model: Any = None,
                       env: Mapping[str, str] | None = None) -> None:
    """Every LLM agent's model settings are valid, and the roles the method uses have
    their credentials (the key variable is set) before anything runs; a ``backend.model``
    that no agent reads is refused. ``CompositionError`` naming the key."""
    from milo_ray.llm.client import api_key
    from milo_ray.llm.role_llm import RoleLLM

    specs = _llm_specs(agents)
    if backend_model and not specs:
        raise CompositionError(f"backend.model={backend_model}: no agent of this backend talks to a model (the offline "
                               "backend's agents are rule-based); use backend=litellm")
    for role, where, block in specs:
        try:
            llm = RoleLLM.of(block, where=where)
            if role in roles:
                api_key(llm.model_config(), env, where=where)
        except ValueError as exc:
            raise CompositionError(str(exc)) from None


def agent_env(agents: Mapping[str, Any]) -> dict[str, str]:
    """The driver's values of the key variables the LLM agents read (for workers
    elsewhere on a cluster); empty for offline agents."""
    import os

    from milo_ray.llm.client import credential_envs
    from milo_ray.llm.role_llm import RoleLLM

    names = set()
    for _, where, block in _llm_specs(agents):
        names.update(credential_envs(RoleLLM.of(block, where=where).model_config()))
    return {n: os.environ[n] for n in sorted(names) if os.environ.get(n)}


def worker_env(model: ModelConfig) -> dict[str, str]:
    """The environment the rollout workers need from the driver's: the model's API key
    variable (``model.api_key_env``, else the provider's own) and, for a ``bedrock/`` model,
    the AWS credential variables -- those the driver has."""
    import os

    from milo_ray.llm.client import credential_envs

    names = credential_envs(model) if model.solver else []
    return {n: os.environ[n] for n in names if os.environ.get(n)}
