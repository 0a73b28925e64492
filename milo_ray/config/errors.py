"""The errors of bad input: what the entry point prints as one line per problem and exits 2.

A :class:`~milo_ray.core.problems.Problem` carries the config key, what is wrong and how to fix it, so a check
states facts and the message is written in one place. A :class:`ConfigError` holds every
problem one validation pass found: a person fixing a config sees all of them at once,
not one per attempt.
"""

from __future__ import annotations

from typing import Iterable

from milo_ray.core.problems import Problem, Problems


class UserError(Exception):
    """Bad input from the person running the command; printed whole, exit 2."""


class ConfigError(Problems, UserError):
    """Every problem one validation pass found, one line each."""


def raise_all(problems: Iterable[Problem]) -> None:
    """Raise a :class:`ConfigError` if ``problems`` holds any."""
    found = list(problems)
    if found:
        raise ConfigError(found)


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
