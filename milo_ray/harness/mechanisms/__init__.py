"""Harness mechanisms: the catalog, static detection and code transformations.

``from milo_ray.harness.mechanisms import FAILURE_MODES, MECHANISMS, MechanismSpec,
detect_mechanisms, add_mechanism, remove_mechanism, set_param``.

* ``catalog.py``  — FAILURE_MODES and one MechanismSpec per mechanism.
* ``templates.py`` — the real deepagents/langchain code of each mechanism.
* ``analysis.py`` — detect_mechanisms(source) by AST: present *and* wired.
* ``transform.py`` — add/remove/set_param as source-to-source transformations.
"""

from milo_ray.harness.mechanisms.analysis import detect_mechanisms, parse_harness
from milo_ray.harness.mechanisms.catalog import (
    FAILURE_MODES,
    KINDS,
    MECHANISMS,
    SLOTS,
    MechanismSpec,
    mechanisms_addressing,
    spec,
)
from milo_ray.harness.mechanisms.transform import add_mechanism, ensure_imports, remove_mechanism, set_param

__all__ = [
    "FAILURE_MODES",
    "KINDS",
    "MECHANISMS",
    "SLOTS",
    "MechanismSpec",
    "add_mechanism",
    "detect_mechanisms",
    "ensure_imports",
    "mechanisms_addressing",
    "parse_harness",
    "remove_mechanism",
    "set_param",
    "spec",
]
