"""The audit's stage-by-stage replay of the paired_rejects, bandit and lowrank rules takes
the Race's own decisions and spend on every task order, within the budget."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.ssr.audit import RewardMatrix
from milo_ray.ssr.audit_replay import RuleSpec, permutations, race_once, replay_rule

P = np.array([0.50, 0.45, 0.60, 0.70, 0.52, 0.68, 0.30])
SPECS = (RuleSpec("paired_rejects", "paired_rejects", stages=4),
         RuleSpec("paired_rejects+gate", "paired_rejects", stages=3, replace_alpha=0.1),
         RuleSpec("bandit", "bandit", block=5, alpha=0.1),
         RuleSpec("lowrank", "lowrank", block=5, rank=1, z=2.0))


def _matrix(seed=0, T=60, R=2):
    rng = np.random.default_rng(seed)
    rewards = rng.binomial(4, P[:, None, None], size=(len(P), T, R)) / 4.0  # dyadic: sums exact, ties as in Race
    return RewardMatrix(tuple(f"h{i}" for i in range(len(P))), tuple(f"x{t}" for t in range(T)), rewards,
                        diff_sizes=(0, 3, 1, 4, 1, 5, 9), truth=tuple(P), truth_source="exact:known")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label)
def test_the_stepwise_replay_takes_the_races_decisions_within_budget(spec):
    m = _matrix()
    perms = permutations(len(m.task_ids), 12, np.random.default_rng(5))
    diff = np.array(m.diff_sizes)
    for f in (0.1, 0.25, 0.6):
        budget = int(f * m.full_cost)
        out = replay_rule(m.rewards, spec, budget, perms, diff_sizes=diff, best_child=3)
        assert (out.executions <= budget).all()
        for k in range(len(perms)):
            assert (int(out.selected[k]), int(out.executions[k])) == \
                race_once(m.rewards, spec, budget, perms[k], diff_sizes=diff), (f, k)


def test_the_stepwise_replay_eliminates_on_a_matrix_with_clear_losers():
    # With 60 tasks at 60% of the cost, the bandit drops the 30% child before the end and
    # spends less than uniform racing of every child on the same tasks would.
    m = _matrix(seed=1)
    perms = permutations(len(m.task_ids), 8, np.random.default_rng(0))
    budget = int(0.6 * m.full_cost)
    out = replay_rule(m.rewards, RuleSpec("bandit", "bandit", block=5, alpha=0.1), budget, perms, best_child=3)
    assert out.best_kept.all() and (out.selected == 3).mean() >= 0.5
