"""The racing audit's replay for rules whose decisions are not a fixed keep count: every
replay raced stage by stage, the rule object itself deciding after each stage.

Used for ``paired_rejects``, ``bandit`` and ``lowrank`` (:mod:`milo_ray.ssr.audit_replay`
dispatches here). Per replay it carries out what :class:`~milo_ray.ssr.racing.Race` does
on a validation-only race: the budget gate per stage, cumulative scores over the tasks
raced, the ranking (higher score, fewer diff lines, lower index), the rule's
:class:`~milo_ray.ssr.racing_view.RuleDecision` on a
:class:`~milo_ray.ssr.racing_view.StageView` built from the matrix, the rule's early
stop, the decision on the last completed stage and the optional parent-replacement gate.
The tests hold it to ``race_once`` (the ``Race`` object) on the same permutations.

Cost: replays × stages calls of the rule on (runners × tasks-so-far) arrays, no per-cell
Python work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from milo_ray.ssr.racing import RaceConfig
from milo_ray.ssr.racing_view import StageView, paired_t, t_critical


def replay_stepwise(rewards: np.ndarray, rule: Any, cfg: RaceConfig, budget: int, perms: np.ndarray,
                    diff: np.ndarray, best_child: int | None, history: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(selected harness per replay, executions per replay, whether ``best_child`` was
    still racing at the decision) for ``rule`` under ``cfg`` within ``budget``.
    ``diff``: the children's diff sizes (``diff[h − 1]`` for harness h), the tie-break.
    ``history``: earlier harnesses × tasks × rollouts, shown to the rule as the view's
    ``prior`` (their per-task means on the tasks raced)."""
    H, T, R = rewards.shape
    prior = None if history is None or not history.size else history.mean(axis=2)
    M, N = H - 1, perms.shape[0]
    ids = [f"h{i}" for i in range(H)]
    sums = rewards.sum(axis=2)
    selected = np.zeros(N, dtype=np.int64)
    spent = np.zeros(N, dtype=np.int64)
    kept = np.zeros(N, dtype=bool)
    for k in range(N):
        order = perms[k]
        active = list(range(1, H))
        left, end, completed = int(budget), 0, 0
        last: np.ndarray | None = None
        for r in range(1, cfg.stages + 1):
            size = min(cfg.b_v[r - 1], T - end)
            if size <= 0:
                break
            need = R * (len(active) + 1) * size
            if need > left:
                break
            left -= need
            spent[k] += need
            end += size
            completed = r
            cols = order[:end]
            runners = active + [0]
            last = sums[:, cols].sum(axis=1) / (end * R)  # every harness; only the runners' are read
            if r == cfg.stages:
                break
            ranked = sorted(active, key=lambda h: (-last[h], diff[h - 1], h))
            view = StageView(r, cfg.stages, M, tuple(ids[h] for h in ranked), ids[0],
                             tuple(f"x{j}" for j in cols), {ids[h]: sums[h, cols] / R for h in runners},
                             {ids[h]: float(last[h]) for h in runners},
                             {} if prior is None else {f"g{j}": prior[j, cols] for j in range(len(prior))})
            decision = rule.after_stage(view)
            keep = {int(h[1:]) for h in decision.keep}
            if not keep or not keep <= set(active):
                raise ValueError(f"racing rule {rule.name!r}: kept {sorted(decision.keep)}, not a non-empty subset "
                                 f"of the children racing")
            active = [h for h in active if h in keep]
            if decision.stop:
                break
        if last is None:
            continue
        best = min(active, key=lambda h: (-last[h], diff[h - 1], h))
        replaced = bool(last[best] > last[0])
        if replaced and cfg.replace_alpha is not None:
            d = (sums[best, order[:end]] - sums[0, order[:end]]) / R
            replaced = end >= 2 and bool(paired_t(d) > t_critical(cfg.replace_alpha, end))
        selected[k] = best if replaced else 0
        kept[k] = best_child is not None and best_child in active
    return selected, spent, kept & (spent > 0)
