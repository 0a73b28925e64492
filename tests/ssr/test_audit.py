"""The racing audit scores every selection by true quality (never by the cells that
chose it), replays each rule exactly as the ``Race`` object would, and pairs every rule
with the uniform subset on the same task orders."""

from __future__ import annotations

import numpy as np
import pytest

from milo_ray.ssr.audit import HeldOut, RewardMatrix, held_out_from_rollouts, matrix_from_rollouts
from milo_ray.ssr.audit_regimes import REGIMES, expected_score, synthetic_matrix
from milo_ray.ssr.audit_replay import RuleSpec, permutations, race_once, replay_rule
from milo_ray.ssr.audit_table import DEFAULT_RULES, audit_matrix, summarize, write_parquet

P = np.array([0.50, 0.45, 0.60, 0.70, 0.52, 0.68, 0.30])  # known per-harness success probabilities


def _known_matrix(seed=0, T=60, R=2, quarter=False):
    """Bernoulli(P[h]) rewards (or multiples of 1/4 with mean P[h] when ``quarter``, so
    cumulative sums are exact and ties fall as in the Race); truth = P."""
    rng = np.random.default_rng(seed)
    if quarter:
        rewards = rng.binomial(4, P[:, None, None], size=(len(P), T, R)) / 4.0
    else:
        rewards = (rng.random((len(P), T, R)) < P[:, None, None]).astype(float)
    return RewardMatrix(tuple(f"h{i}" for i in range(len(P))), tuple(f"x{t}" for t in range(T)), rewards,
                        diff_sizes=(0, 3, 1, 4, 1, 5, 9), truth=tuple(P), truth_source="exact:known")


@pytest.mark.parametrize("spec", DEFAULT_RULES, ids=lambda s: s.label)
def test_the_vectorized_replay_takes_the_races_decisions(spec):
    m = _known_matrix(quarter=True)
    perms = permutations(len(m.task_ids), 25, np.random.default_rng(3))
    for f in (0.1, 0.3, 0.6):
        budget = int(f * m.full_cost)
        out = replay_rule(m.rewards, spec, budget, perms, diff_sizes=np.array(m.diff_sizes))
        for k in range(len(perms)):
            assert (int(out.selected[k]), int(out.executions[k])) == \
                race_once(m.rewards, spec, budget, perms[k], diff_sizes=np.array(m.diff_sizes)), (f, k)


def test_true_regret_equals_a_direct_computation_on_known_probabilities():
    m = _known_matrix()
    rows = audit_matrix(m, fractions=(0.2, 0.5), replays=40, seed=7)
    by = {(r["rule"], r["fraction"]): r for r in rows}
    best = P.max()
    assert by[("keep_parent", 0.0)]["regret"] == pytest.approx(100 * (best - P[0]))
    assert by[("random_child", 0.0)]["regret"] == pytest.approx(100 * (best - P[1:].mean()))
    assert by[("oracle", 0.0)]["regret"] == 0.0
    perms = permutations(len(m.task_ids), 40, np.random.default_rng(7))  # the audit's own task orders
    means = m.rewards.mean(axis=2)
    for f in (0.2, 0.5):
        # The uniform subset by hand: every harness on the first b tasks of each order,
        # the best child (ties: fewer diff lines, lower index) only if strictly above the parent.
        b = int(f * m.full_cost) // (2 * len(P))
        regrets = []
        for perm in perms:
            s = means[:, perm[:b]].mean(axis=1)
            child = min(range(1, len(P)), key=lambda h: (-s[h], m.diff_sizes[h], h))
            regrets.append(100 * (best - P[child if s[child] > s[0] else 0]))
        assert by[("uniform", f)]["regret"] == pytest.approx(np.mean(regrets))
        assert by[("uniform", f)]["executions"] == 2 * len(P) * b
        # Every other rule: the Race object itself on the same orders.
        for spec in DEFAULT_RULES:
            sel = [race_once(m.rewards, spec, int(f * m.full_cost), perm, diff_sizes=np.array(m.diff_sizes))[0]
                   for perm in perms]
            direct = np.mean([100 * (best - P[s]) for s in sel])
            assert by[(spec.label, f)]["regret"] == pytest.approx(direct), spec.label
            assert by[(spec.label, f)]["vs_uniform"] == pytest.approx(direct - np.mean(regrets)), spec.label
    full = by[("full_matrix", 1.0)]
    q = m.quality()
    child = min(range(1, len(P)), key=lambda h: (-q[h], m.diff_sizes[h], h))
    assert full["regret"] == pytest.approx(100 * (best - P[child if q[child] > q[0] else 0]))
    assert full["executions"] == m.full_cost


def test_regret_is_scored_by_truth_not_by_the_matrix():
    # Same rewards, truth reversed: the in-sample regret stays, the true regret follows the truth.
    m = _known_matrix()
    flipped = m.with_truth(tuple(P[::-1]), "exact:flipped")
    a = {(r["rule"], r["fraction"]): r for r in audit_matrix(m, fractions=(0.4,), replays=20)}
    b = {(r["rule"], r["fraction"]): r for r in audit_matrix(flipped, fractions=(0.4,), replays=20)}
    assert a[("uniform", 0.4)]["in_sample_regret"] == b[("uniform", 0.4)]["in_sample_regret"]
    assert a[("uniform", 0.4)]["regret"] != b[("uniform", 0.4)]["regret"]


def test_a_matrix_without_truth_is_refused():
    m = _known_matrix()
    bare = RewardMatrix(m.harness_ids, m.task_ids, m.rewards)
    with pytest.raises(ValueError, match="no truth"):
        audit_matrix(bare, replays=2)


def test_replays_stay_within_budget():
    m = _known_matrix()
    perms = permutations(len(m.task_ids), 50, np.random.default_rng(0))
    for spec in DEFAULT_RULES:
        for f in (0.05, 0.2, 0.4, 0.6):
            out = replay_rule(m.rewards, spec, int(f * m.full_cost), perms)
            assert (out.executions <= f * m.full_cost).all(), spec.label
            assert ((out.selected >= 0) & (out.selected < len(P))).all()


def test_summary_pairs_each_rule_with_uniform_across_matrices(tmp_path):
    import pyarrow.parquet as pq

    rows = []
    for s in range(3):
        rows += audit_matrix(synthetic_matrix("wide", seed=s, tasks=40), fractions=(0.4,), replays=30, seed=s,
                             label=f"m{s}")
    summary = summarize(rows)
    sh = next(r for r in summary if r["rule"] == "successive_halving")
    per = [r["vs_uniform"] for r in rows if r["rule"] == "successive_halving"]
    assert sh["matrices"] == 3 and sh["vs_uniform"] == pytest.approx(np.mean(per))
    assert sh["vs_uniform_se"] == pytest.approx(np.std(per, ddof=1) / np.sqrt(3))
    path = tmp_path / "audit.parquet"
    write_parquet(path, rows, summary, source="wide")
    t = pq.read_table(path).to_pandas()
    assert set(t["level"]) == {"matrix", "summary"} and (t["source"] == "wide").all()
    assert len(t[t["level"] == "summary"]) == len(summary)


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_synthetic_truth_is_the_expected_score_of_a_fresh_task(regime):
    m = synthetic_matrix(regime, seed=1, tasks=20)
    rng = np.random.default_rng(0)
    z = rng.normal(0, np.hypot(1.5, 0.5), 400_000)
    theta = np.log(np.asarray(m.truth[:2]) / (1 - np.asarray(m.truth[:2])))  # any θ: check the quadrature
    mc = (1 / (1 + np.exp(-(theta[:, None] + z[None])))).mean(axis=1)
    assert expected_score(theta, np.hypot(1.5, 0.5)) == pytest.approx(mc, abs=2e-3)


def test_held_out_scoring_never_uses_a_selection_cell():
    rows = [{"harness_id": h, "task_id": f"t{t}", "rollout_idx": i, "split": "val", "score": float((t + i) % 2)}
            for h in ("p", "a") for t in range(10) for i in range(2)]
    # The test split's executions, and the val tasks' third rollouts, are held out.
    rows += [{"harness_id": h, "task_id": f"s{t}", "rollout_idx": 0, "split": "test", "score": q}
             for h, q in (("p", 0.25), ("a", 0.75)) for t in range(4)]
    rows += [{"harness_id": h, "task_id": "t0", "rollout_idx": 2, "split": "val", "score": 1.0} for h in ("p", "a")]
    m = matrix_from_rollouts(rows, rollouts=2, parent="p", split="val", min_tasks=10)
    scored = held_out_from_rollouts(m, rows, split="test")
    assert scored.truth == (0.25, 0.75)
    assert not scored.held_out.cells & m.selection_cells()
    # Any other split: every non-selection cell, here test plus the third val rollouts.
    other = held_out_from_rollouts(m, rows)
    assert ("p", "t0", 2) in other.held_out.cells and not other.held_out.cells & m.selection_cells()
    # Poisoning the selection cells changes nothing held out.
    poisoned = [dict(r, score=1.0) if r["split"] == "val" and r["rollout_idx"] < 2 else r for r in rows]
    assert held_out_from_rollouts(m, poisoned, split="test").truth == scored.truth
    with pytest.raises(ValueError, match="are selection cells"):
        m.with_truth(HeldOut.from_results(m.harness_ids, [("p", "t0", 0, 1.0), ("a", "t1", 1, 0.0)]), "x")


def test_matrix_from_rollouts_keeps_the_complete_sub_matrix():
    rows = []
    for h in ("p", "a", "b"):
        for t in range(12):
            for i in range(2):
                rows.append({"harness_id": h, "task_id": f"t{t}", "rollout_idx": i, "score": float((t + i) % 2)})
    rows.append({"harness_id": "c", "task_id": "t0", "rollout_idx": 0, "score": 1.0})  # incomplete harness
    m = matrix_from_rollouts(rows, rollouts=2, parent="p", min_tasks=10)
    assert m.harness_ids[0] == "p" and set(m.harness_ids) == {"p", "a", "b"}
    assert m.rewards.shape == (3, 12, 2)


# --- the audit's task set (papers/002 §6.5: disjoint from candidate generation and test) ----

def test_generated_audit_matrix_is_disjoint_from_test_and_training_tasks_by_default(tmp_path):
    from milo_ray.agents.embedder import HashingEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.agents.mutators.offline import OfflineCandidateOptimizer
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.ssr.audit import generate_surrogate_matrix

    bench = SurrogateBenchmark("surrogate_deepswe")
    m = generate_surrogate_matrix(bench, executor=bench.executor_config(), optimizer=OfflineCandidateOptimizer(),
                                  judge=OfflineJudge(), embedder=HashingEmbedder(), workdir=tmp_path, per_scale=1,
                                  scales=(0.5, 1.0), rollouts=1)
    audit_ids = set(m.task_ids)
    assert audit_ids and not audit_ids & {t.task_id for t in bench.tasks("test")}
    assert not audit_ids & {t.task_id for t in bench.tasks("train")}
    assert audit_ids == {t.task_id for t in bench.tasks("val")}  # no audit split: the validation split
    # Ground truth: each harness's exact expected test score.
    assert m.truth_source == "exact:test" and len(m.truth) == len(m.harness_ids)


def test_generated_matrix_uses_the_audit_split_and_held_out_runs_without_ground_truth(tmp_path):
    from milo_ray.agents.embedder import HashingEmbedder
    from milo_ray.agents.judges.offline import OfflineJudge
    from milo_ray.agents.mutators.offline import OfflineCandidateOptimizer
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.ssr.audit import generate_surrogate_matrix

    class NoTruth:  # the surrogate's tasks without its ground truth
        def __init__(self, bench):
            self._b = bench

        def __getattr__(self, name):
            if name == "true_quality":
                raise AttributeError(name)
            return getattr(self._b, name)

    bench = SurrogateBenchmark("surrogate_deepswe", audit_split=True)
    test = bench.tasks("test")[:5]
    bench_nt = NoTruth(bench)
    bench_nt.tasks = lambda split: test if split == "test" else bench.tasks(split)
    m = generate_surrogate_matrix(bench_nt, executor=bench.executor_config(), optimizer=OfflineCandidateOptimizer(),
                                  judge=OfflineJudge(), embedder=HashingEmbedder(), workdir=tmp_path, per_scale=1,
                                  scales=(0.5, 1.0), rollouts=1)
    assert set(m.task_ids) == {t.task_id for t in bench.tasks("audit")} and len(m.task_ids) == 160
    assert m.truth_source.startswith("held-out:test")
    assert {c[2] for c in m.held_out.cells} == {1, 2}  # fresh rollout indices after the matrix's
    assert {c[1] for c in m.held_out.cells} == {t.task_id for t in test}
    assert not m.held_out.cells & m.selection_cells()


@pytest.mark.parametrize("splits,other", [(("val", "test"), "test"), (("train",), "train")])
def test_an_audit_set_overlapping_test_or_training_tasks_is_refused(splits, other):
    from milo_ray.benchmarks.surrogate import SurrogateBenchmark
    from milo_ray.ssr.audit import audit_tasks

    with pytest.raises(ValueError, match=rf"audit_splits=.*also in the '{other}' split"):
        audit_tasks(SurrogateBenchmark("surrogate_deepswe"), splits)
