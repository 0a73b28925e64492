"""The one type every figure module returns (``figures(res) -> list[Figure]``)."""

from dataclasses import dataclass
from typing import Any


@dataclass
class Figure:
    """A titled, captioned matplotlib figure; ``name`` is the file stem the report
    writes (``<out>/<name>.png`` and ``.svg``)."""

    name: str
    title: str
    caption: str
    fig: Any  # a matplotlib.figure.Figure built with the object API (Agg), never pyplot
