"""Input validation shared by the numeric kernels.

Every public kernel converts its array arguments through these helpers at the
boundary, so a bad input fails with a ``ValueError`` that names the argument and
the fix instead of silently producing a wrong number.  The helpers never modify
the caller's array: they return a float64 view or copy that the kernel treats
as read-only.
"""

from __future__ import annotations

import numbers

import numpy as np


def as_array(
    name: str,
    value,
    *,
    ndim: int,
    allow_empty: bool = True,
    dtype=np.float64,
) -> np.ndarray:
    """Convert ``value`` to a finite ``dtype`` array of exactly ``ndim`` dimensions."""
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected a numeric array, got {type(value).__name__} ({exc})") from None
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {arr.shape}")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name}: must not be empty (shape {arr.shape})")
    if arr.size and not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(
            f"{name}: contains a non-finite value {float(arr[tuple(bad)])!r} at index {tuple(int(b) for b in bad)}"
        )
    return arr


def check_range(name: str, arr: np.ndarray, *, low: float | None = None, high: float | None = None) -> None:
    """Raise if any element of ``arr`` lies outside ``[low, high]``."""
    if arr.size == 0:
        return
    if low is not None and arr.min() < low:
        idx = np.unravel_index(int(np.argmin(arr)), arr.shape)
        raise ValueError(f"{name}: values must be >= {low}, got {float(arr[idx])!r} at index {tuple(int(i) for i in idx)}")
    if high is not None and arr.max() > high:
        idx = np.unravel_index(int(np.argmax(arr)), arr.shape)
        raise ValueError(f"{name}: values must be <= {high}, got {float(arr[idx])!r} at index {tuple(int(i) for i in idx)}")


def as_scalar(name: str, value, *, low: float | None = None, strict_low: bool = False) -> float:
    """A finite real scalar, optionally bounded below (``> low`` when ``strict_low``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a real number, got {type(value).__name__}")
    x = float(value)
    if not np.isfinite(x):
        raise ValueError(f"{name}: must be finite, got {x!r}")
    if low is not None:
        if strict_low and not x > low:
            raise ValueError(f"{name}: must be > {low}, got {x!r}")
        if not strict_low and not x >= low:
            raise ValueError(f"{name}: must be >= {low}, got {x!r}")
    return x


def as_int(name: str, value, *, low: int = 0) -> int:
    """A Python int ``>= low`` (numpy integers accepted, bools and floats rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__}")
    v = int(value)
    if v < low:
        raise ValueError(f"{name}: must be >= {low}, got {v}")
    return v


def check_eps(eps) -> float:
    """The dominance tolerance: finite and non-negative."""
    return as_scalar("eps", eps, low=0.0)
