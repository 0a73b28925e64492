"""ARE's interpreter for the tests that run scenarios for real: CI builds ARE's
environment (``.ci/run``, ``scripts/are_env.sh``) and sets ``MILO_RAY_ARE_PYTHON`` only
when the build worked, saying why otherwise; so an unset variable skips, saying how to
get it, and a variable that names no interpreter fails."""

from __future__ import annotations

import os
from pathlib import Path


def are_interpreter() -> Path:
    """The interpreter ``MILO_RAY_ARE_PYTHON`` names, or a skip / failure (module docstring)."""
    import pytest

    py = os.environ.get("MILO_RAY_ARE_PYTHON")
    if not py:
        pytest.skip("needs ARE's interpreter: run scripts/are_env.sh and export "
                    "MILO_RAY_ARE_PYTHON=~/.cache/milo_ray/are-venv/bin/python")
    if not Path(py).is_file():
        pytest.fail(f"MILO_RAY_ARE_PYTHON={py!r} names no interpreter")
    return Path(py)
