"""Fixtures for the kernel tests: read-only arrays catch any in-place mutation."""

from __future__ import annotations

import numpy as np
import pytest


def _freeze(*arrays):
    out = []
    for a in arrays:
        a = np.array(a, dtype=np.float64)
        a.flags.writeable = False
        out.append(a)
    return out[0] if len(out) == 1 else tuple(out)


@pytest.fixture
def freeze():
    """``freeze(a, b, ...)`` -> float64 copies with ``writeable = False``."""
    return _freeze


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
