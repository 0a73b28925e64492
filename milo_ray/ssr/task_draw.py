"""How a race draws the tasks of its stages from its pool: uniformly (the paper's) or by
how much the tasks separate the current population (``method.task_draw``).

A task that every harness of the population passes, or every one fails, says little
about which child is better: a pass/fail execution on it is nearly the same for all of
them, so its paired difference is mostly zero. A task the population passes about half
the time is where a harness effect shows (the logistic slope p·(1 − p) is largest at
p = ½). :class:`DiscriminativeDraw` therefore orders the pool by the population's pass
rate on each task: tasks inside the intermediate ``band`` first, then tasks with too
few observations to tell (``min_obs``), then the rest nearest ½ first; within each group
uniformly at random. :class:`UniformDraw` ignores the rates (the baseline).

The rates come from :func:`population_rates`: the mean reward per task over the
recorded executions of the harnesses in the current population only, so when the
population changes (a new parent, new children, harnesses dropped) the rates, and the
draw, change with it. The draw only orders the pool the race is given (SSR's racing
validation tasks and its training classes); the test split is never in that pool, and a
held-out split used for monitoring is never drawn through it.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from milo_ray.search.strategy import Choice

Rates = Mapping[str, tuple[float, int]]  # task id -> (population pass rate, executions observed)


def population_rates(cells: Iterable[tuple[str, str, float]], population: Iterable[str]) -> dict[str, tuple[float, int]]:
    """Per task, (mean reward, number of executions) over the ``cells`` (harness, task,
    reward) of harnesses in ``population``; other harnesses' cells are ignored."""
    members = set(population)
    sums: dict[str, list[float]] = {}
    for h, t, s in cells:
        if h in members:
            acc = sums.setdefault(t, [0.0, 0])
            acc[0] += float(s)
            acc[1] += 1
    return {t: (s / n, int(n)) for t, (s, n) in sums.items()}


@runtime_checkable
class TaskDraw(Protocol):
    """Orders a pool of task ids for drawing (first = drawn first). ``key`` is the
    preference alone (lower first), for pools that keep an order of their own as the
    tie-break (SSR's training classes keep RER order within a key)."""

    name: str

    def key(self, rate: tuple[float, int] | None) -> tuple[int, float]:
        ...

    def order(self, pool: Sequence[str], rates: Rates, rng: np.random.Generator) -> list[str]:
        ...


class UniformDraw:
    """A uniform permutation of the pool, whatever the rates (the paper's draw)."""

    name = "uniform"

    def key(self, rate: tuple[float, int] | None) -> tuple[int, float]:
        return 0, 0.0

    def order(self, pool: Sequence[str], rates: Rates, rng: np.random.Generator) -> list[str]:
        return [pool[i] for i in rng.permutation(len(pool))]


class DiscriminativeDraw:
    """Intermediate-band tasks first (population pass rate in [lo, hi]), then tasks with
    fewer than ``min_obs`` observed executions, then the rest by distance to ½; random
    within each group. The default band [0.2, 0.8] keeps tasks whose pass/fail variance
    p·(1 − p) is at least 0.16 of its 0.25 maximum."""

    name = "discriminative"

    def __init__(self, band: Sequence[float] = (0.2, 0.8), min_obs: int = 2) -> None:
        lo, hi = (float(x) for x in band)
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"method.task_draw: band must be [lo, hi] with 0 <= lo < hi <= 1, got {list(band)}")
        if int(min_obs) < 1:
            raise ValueError(f"method.task_draw: min_obs must be >= 1, got {min_obs}")
        self.band, self.min_obs = (lo, hi), int(min_obs)

    def key(self, rate: tuple[float, int] | None) -> tuple[int, float]:
        """(group, rank in it): group 0 in band, 1 too few observations, 2 outside the
        band ranked by distance to ½ (the first two groups are not ranked)."""
        if rate is None or rate[1] < self.min_obs:
            return 1, 0.0
        p = rate[0]
        return (0, 0.0) if self.band[0] <= p <= self.band[1] else (2, abs(p - 0.5))

    def order(self, pool: Sequence[str], rates: Rates, rng: np.random.Generator) -> list[str]:
        shuffled = [pool[i] for i in rng.permutation(len(pool))]
        # Stable sort of a uniform permutation: ties inside a group stay in random order.
        return sorted(shuffled, key=lambda t: self.key(rates.get(t)))


TASK_DRAWS: Choice[TaskDraw] = Choice("task draw", {"uniform": UniformDraw, "discriminative": DiscriminativeDraw},
                                      TaskDraw)
