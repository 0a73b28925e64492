"""The racing audit's task-draw dimension: discriminative orders read the matrix's
history (an earlier population, never a selection cell) and put intermediate-band tasks
first; the uniform orders stay what they were."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.ssr.audit import RewardMatrix, seed_history
from milo_ray.ssr.audit_regimes import synthetic_matrix
from milo_ray.ssr.audit_replay import RuleSpec, draw_permutations, permutations
from milo_ray.ssr.audit_table import audit_matrix


def _history(rates: list[float], n: int = 10) -> np.ndarray:
    """One harness per observation: a task of rate p passes in the first round(p·n) rows."""
    h = np.zeros((n, len(rates), 1))
    for t, p in enumerate(rates):
        h[: int(round(p * n)), t, 0] = 1.0
    return h


def test_discriminative_orders_put_intermediate_band_tasks_first():
    rates = [0.0, 1.0, 0.5, 0.1, 0.6, 1.0, 0.9, 0.3]
    perms = draw_permutations(_history(rates), len(rates), 20, np.random.default_rng(0))
    band = {2, 4, 7}
    assert all(set(row[:3]) == band for row in perms)
    # outside the band, nearest ½ first: 0.1 and 0.9 before 0.0 and 1.0
    assert all(set(row[3:5]) == {3, 6} for row in perms)
    assert len({tuple(row[:3]) for row in perms}) > 1  # random within the band


def test_uniform_orders_do_not_depend_on_the_history():
    a = draw_permutations(_history([0.5] * 6), 6, 5, np.random.default_rng(3), "uniform")
    b = permutations(6, 5, np.random.default_rng(3))
    assert (a == b).all()


def test_discriminative_draw_without_history_is_refused_naming_it():
    m = synthetic_matrix("wide", seed=0, children=3, tasks=20, history=0)
    with pytest.raises(ValueError, match="no history"):
        audit_matrix(m, fractions=(0.2,), rules=(RuleSpec("u+disc", "uniform", stages=1, draw="discriminative"),),
                     replays=5)


def test_uniform_rows_are_the_same_with_the_draw_dimension_added():
    m = synthetic_matrix("wide", seed=1, children=4, tasks=40)
    plain = audit_matrix(m, fractions=(0.2,), rules=(RuleSpec("successive_halving", "successive_halving"),),
                         replays=20)
    both = audit_matrix(m, fractions=(0.2,), rules=(RuleSpec("successive_halving", "successive_halving"),
                                                    RuleSpec("sh+disc", "successive_halving",
                                                             draw="discriminative")), replays=20)
    pick = {r["rule"]: r["regret"] for r in both}
    assert {r["rule"]: r["regret"] for r in plain}["successive_halving"] == pick["successive_halving"]
    assert "sh+disc" in pick


def test_history_round_trips_and_a_matrix_without_one_loads_as_none(tmp_path):
    m = synthetic_matrix("bimodal", seed=2, children=3, tasks=12)
    m.save(tmp_path / "m.npz")
    back = RewardMatrix.load(tmp_path / "m.npz")
    assert back.history is not None and (back.history == m.history).all()
    bare = synthetic_matrix("bimodal", seed=2, children=3, tasks=12, history=0)
    bare.save(tmp_path / "b.npz")
    assert RewardMatrix.load(tmp_path / "b.npz").history is None
    assert (bare.rewards == m.rewards).all()  # the history is drawn after the matrix


def test_seed_history_never_uses_the_matrix_rollout_indices():
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark

    bench = SurrogateBenchmark(preset="surrogate_swepro", seed=0, calibrate_to="stock", audit_split=True)
    tasks = [t.task_id for t in bench.tasks("audit")[:6]]
    m = RewardMatrix(("a", "b"), tuple(tasks), np.zeros((2, 6, 2)))
    with pytest.raises(ValueError, match="first_index"):
        seed_history(m, bench, executor=bench.executor_config(), first_index=1)
    got = seed_history(m, bench, executor=bench.executor_config(), rollouts=2)
    assert got.history.shape == (len(bench.seed_harnesses()), 6, 2)


def test_the_audit_figure_draws_the_new_rules_and_each_draw_in_its_rules_colour(tmp_path):
    from dataclasses import replace

    from milo_ray.results import RunResults
    from milo_ray.ssr import figures as S
    from milo_ray.ssr.audit_table import DEFAULT_RULES, summarize, write_parquet

    rules = DEFAULT_RULES + tuple(replace(r, label=f"{r.label}+disc", draw="discriminative") for r in DEFAULT_RULES)
    rows = audit_matrix(synthetic_matrix("wide", seed=0, tasks=40), fractions=(0.2, 0.4), rules=rules, replays=8)
    write_parquet(tmp_path / S.AUDIT_FILE, rows, [{"group": "wide", **r} for r in summarize(rows)])
    res = RunResults.__new__(RunResults)
    res.run_dir = tmp_path
    lines = {ln.get_label(): ln for ln in S.audit_figure(res).fig.axes[0].get_lines()}
    assert {"paired_rejects", "bandit", "lowrank", "lowrank+disc", "halving_k4+disc"} <= set(lines)
    for base in ("lowrank", "halving_k4", "uniform"):
        assert lines[f"{base}+disc"].get_color() == lines[base].get_color()
        assert lines[f"{base}+disc"].get_linestyle() == "--" and lines[base].get_linestyle() == "-"
    colors = [lines[r.label].get_color() for r in DEFAULT_RULES]
    assert len({tuple(c) for c in colors}) == len(colors)  # every rule its own colour
