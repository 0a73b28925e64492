"""Strategies chosen by config (DESIGN §5.10): how a config field names a strategy object.

A method's strategy field (``method.parent_selection``, ``method.memory``,
``method.ordering``, ``method.evidence``, ``method.racing``) holds what users write: a
registered name (``softmax``, ``rer``, ...). It may instead hold a mapping with a
``_target_`` naming a class or factory that builds an object of the field's protocol
(Hydra builds it when it builds the method; a config constructed directly builds it
here), or that object itself. Either way the method works with the object; events and
summaries record the object's ``name``, which for a registered strategy is the name the
user wrote, so runs configured by name record exactly what they always did.

Owns :class:`Choice` (one field's allowed values: its registered names, the protocol an
object must satisfy, and the one error that names the key, the allowed values and the
fix), :func:`choice_field` (declares the field in a config dataclass, so the schema is
the one place the allowed values are written) and :func:`check_choices` (validates every
declared field of a config in one pass).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")

CHOICE = "milo_ray.choice"  # the field-metadata key a Choice is declared under


class Choice(Generic[T]):
    """The allowed values of one config field.

    ``what``: what the field chooses, for messages ("parent selection"). ``names``:
    registered name -> zero-argument factory of its object (for a plain enumerated
    field, its value). ``protocol``: a ``runtime_checkable`` protocol an object given by
    ``_target_`` must satisfy; None when only the registered names are allowed.
    """

    def __init__(self, what: str, names: Mapping[str, Callable[[], T]], protocol: type | None = None) -> None:
        if not names:
            raise ValueError(f"Choice({what!r}) needs at least one registered name")
        self.what = what
        self._factories = dict(names)
        self.protocol = protocol

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def allowed(self) -> str:
        """The allowed values as a message lists them."""
        names = ", ".join(repr(n) for n in self.names)
        if self.protocol is None:
            return names
        return f"{names}, or a {{_target_: ...}} building a {self.protocol.__name__}"

    def _refuse(self, key: str, value: Any, problem: str) -> ValueError:
        return ValueError(f"{key}={value!r}: {problem}; allowed: {self.allowed()}; "
                          f"fix: set {key}={self.names[0]} (or another allowed value)")

    def resolve(self, value: Any, *, key: str) -> T:
        """The strategy ``value`` stands for; ``ValueError`` naming ``key``, the allowed
        values and the fix when it stands for none."""
        if isinstance(value, str):
            factory = self._factories.get(value)
            if factory is None:
                raise self._refuse(key, value, f"unknown {self.what}")
            return factory()
        if self.protocol is None:
            raise self._refuse(key, value, f"a {self.what} is one of the names")
        built = self._build(value, key) if isinstance(value, Mapping) else value
        if not isinstance(built, self.protocol):
            missing = [m for m in _members(self.protocol) if not hasattr(built, m)]
            raise self._refuse(key, dict(value) if isinstance(value, Mapping) else value,
                               f"{type(built).__name__} is not a {self.protocol.__name__} "
                               f"(it lacks {', '.join(missing)})")
        return built

    def _build(self, spec: Mapping[str, Any], key: str) -> Any:
        if "_target_" not in spec:
            raise self._refuse(key, dict(spec), "a mapping needs a _target_ naming the class that builds it")
        from hydra.errors import InstantiationException
        from hydra.utils import instantiate

        try:
            return instantiate(dict(spec), _convert_="all")
        except InstantiationException as exc:
            cause = " ".join(str(exc.__cause__ or exc).split())
            raise ValueError(f"{key}._target_={spec['_target_']}: cannot be built ({cause}); "
                             "check the dotted path and its arguments") from None


def _members(protocol: type) -> list[str]:
    """What a protocol asks for: its annotated attributes and its methods."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    return sorted(names)


def choice_field(choice: Choice[Any], default: str) -> Any:
    """A config dataclass field whose allowed values are ``choice`` (default ``default``)."""
    if default not in choice.names:
        raise ValueError(f"choice_field: default {default!r} is not one of {choice.names}")
    return dataclasses.field(default=default, metadata={CHOICE: choice})


def check_choices(config: Any, *, prefix: str) -> None:
    """Resolve every choice field of the dataclass ``config`` (``prefix``: the config
    group its keys live under, e.g. ``method``); the first bad value raises."""
    for f in dataclasses.fields(config):
        choice = f.metadata.get(CHOICE)
        if choice is not None:
            choice.resolve(getattr(config, f.name), key=f"{prefix}.{f.name}")


def resolve_field(config: Any, name: str, *, prefix: str) -> Any:
    """The strategy object of ``config``'s choice field ``name``."""
    f = next((f for f in dataclasses.fields(config) if f.name == name), None)
    if f is None or CHOICE not in f.metadata:
        raise KeyError(f"{type(config).__name__}.{name} is not a choice field")
    return f.metadata[CHOICE].resolve(getattr(config, name), key=f"{prefix}.{name}")
