"""SSR's report figures draw what the stored events and tables say: the coverage curve
is the kernel's objective over the stored evidence order, the bracket shows each
candidate's stage scores, eliminations and the round's decision, the budget curve
counts budgeted executions only. Built on in-memory runs (RunResults of hand-made
tables with the payloads milo_ray.ssr.events writes), so each case is exact and fast;
tests/report/test_report.py renders the figures from real SSR runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from milo_ray import results as R
from milo_ray.kernels.submodular import clipped_cosine, coverage_objective, rer_order
from milo_ray.ssr import figures as S
from milo_ray.ssr.events import SSR_EVENTS, CandidatesChosen, Refreshed, RoundStarted, Selection, StageResult, Stopped
from milo_ray.store import schema

T0 = 1_000.0


def _empty(table: str) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in schema.COLUMNS[table]})


def _events(evs: list) -> pd.DataFrame:
    rows = []
    for i, e in enumerate(evs):
        if isinstance(e, tuple):  # (kind, payload, columns) for kinds without a dataclass
            kind, payload, cols = e
        else:
            kind, payload, cols = SSR_EVENTS.kind_of(e), e.to_payload(), e.columns()
        rows.append({"seq": i, "time": T0 + i, "kind": kind, "round": cols.get("round"), "island": None,
                     "harness_id": cols.get("harness_id"), "payload": json.dumps(payload), "data": payload})
    return pd.DataFrame(rows)


def _run(events: list, *, experience: pd.DataFrame | None = None, rollouts: pd.DataFrame | None = None,
         method: str = "ssr", budget: int = 40) -> R.RunResults:
    manifest = {"run_id": "t", "status": "finished", "started_at": T0, "finished_at": T0 + 100,
                "config": {"run": {"budget": {"executions": budget}}}}
    return R.RunResults(run_dir=Path("/nonexistent"), manifest=manifest, method=method, benchmark="synthetic",
                        rollouts=_empty("rollouts") if rollouts is None else rollouts,
                        harnesses=_empty("harnesses"), events=_events(events), agent_calls=_empty("agent_calls"),
                        experience=_empty("experience") if experience is None else experience)


def _records(n: int, rnd: int, parent: str, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    a, u = rng.uniform(0.2, 1, n), rng.uniform(0.2, 1, n)
    return pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "round": rnd, "harness_id": parent,
                         "w": rng.uniform(0.1, 1, n), "a": a, "u": u, "q": a * u,
                         "embedding": [rng.normal(size=8).astype(np.float32) for _ in range(n)],
                         "judge_error": None})


def _line(fig, label: str) -> np.ndarray:
    for ax in fig.fig.axes:
        for line in ax.get_lines():
            if line.get_label() == label:
                return np.asarray(line.get_ydata(), dtype=float)
    raise AssertionError(f"no line labelled {label!r}")


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.fig.axes for t in ax.texts]


def test_coverage_curve_is_the_kernel_objective_of_each_prefix_of_the_stored_order():
    recs = _records(7, 0, "P", seed=1)
    S_ = clipped_cosine(np.stack(recs["embedding"]))
    greedy = [recs["task_id"][i] for i in rer_order(recs["w"], recs["q"], S_)]
    stored = greedy[::-1]  # not the greedy order: the figure must draw the order the run stored
    res = _run([Refreshed(0, "P", 7, 3, 0.5, [], stored, "rer", 7)], experience=recs)
    fig = S.coverage_figure(res)
    F = _line(fig, "rer order")
    idx = {t: i for i, t in enumerate(recs["task_id"])}
    want = [coverage_objective([idx[t] for t in stored[:k]], recs["w"], recs["q"], S_) for k in range(8)]
    np.testing.assert_allclose(F, want, rtol=1e-12)
    assert F[0] == 0 and np.all(np.diff(F) >= 0)


def test_coverage_uses_only_the_rounds_own_judged_records():
    good = _records(5, 1, "P1", seed=2)
    failed = pd.DataFrame({"task_id": ["bad"], "round": 1, "harness_id": "P1", "w": None, "a": None, "u": None,
                           "q": None, "embedding": None, "judge_error": "after 3 attempts: no JSON"})
    other = _records(5, 0, "P0", seed=3)  # same task ids, another round and parent
    order = list(good["task_id"])
    res = _run([Refreshed(1, "P1", 6, 2, 0.5, ["bad"], order, "rer", 6)],
               experience=pd.concat([other, failed, good], ignore_index=True))
    F = _line(S.coverage_figure(res), "rer order")
    np.testing.assert_allclose(F, S.coverage_curve(good, order), rtol=1e-12)
    assert len(F) == 6  # k = 0..5: the failed judgment is not evidence


def test_no_experience_means_no_coverage_figure_and_no_ssr_events_mean_no_figures():
    res = _run([Refreshed(0, "P", 3, 1, 0.5, [], ["t0", "t1", "t2"], "rer", 3)])
    assert S.coverage_figure(res) is None
    assert S.figures(_run([])) == []
    assert _run([]).plugin.report_sections(_run([])) == []


def _race_round(rnd: int, parent: str, accept: bool) -> list:
    """Three candidates: c0 eliminated at stage 1, c1 the finalist, c2 a repeat of c1's
    harness (recorded without an error, as the loop writes a duplicate that survived its
    re-draws)."""
    A, B = f"{rnd}A", f"{rnd}B"
    gen = [{"index": 0, "scale": 2, "harness_id": A, "error": None},
           {"index": 1, "scale": 4, "harness_id": B, "error": None},
           {"index": 2, "scale": 6, "harness_id": B, "error": None}]
    s1 = {parent: 0.5, A: 0.25, B: 0.75}
    s2 = {parent: 0.6, B: 0.7 if accept else 0.6}
    return [CandidatesChosen(rnd, parent, gen, [A, B], "rer"),
            StageResult(rnd, parent, 1, s1, [A], [B], 4),
            StageResult(rnd, parent, 2, s2, [], [B], 8),
            Selection(rnd, B if accept else parent, parent, B if accept else parent, accept, 2, "completed",
                      s2[parent], B, s2[B], 12, s2)]


def test_bracket_shows_scores_eliminations_duplicates_and_each_decision():
    res = _run([*_race_round(0, "P", accept=True), *_race_round(1, "0B", accept=False)])
    fig = S.bracket_figure(res)
    ax0, ax1 = fig.fig.axes
    t0 = [t.get_text() for t in ax0.texts]
    assert "accepted" in t0 and "duplicate of c1" in t0
    assert {"0.250", "0.750", "0.700"} <= set(t0)
    parent_row = [t.get_text() for t in ax0.texts if t.get_position()[1] > 0]  # scores sit just above their row
    assert parent_row == ["0.500", "0.600"]
    t1 = [t.get_text() for t in ax1.texts]
    assert "kept (parent)" in t1 and "best child: not strictly better" in t1 and "accepted" not in t1
    # c0 is crossed out at stage 1 (the red x marker), in both rounds
    for ax in (ax0, ax1):
        xs = [(ln.get_xdata()[0], ln.get_ydata()[0]) for ln in ax.get_lines() if ln.get_marker() == "x"]
        assert xs == [(1, -1)]
    rows = S.ssr_decisions(res)
    assert rows["decision"].tolist() == ["accepted", "kept parent"]
    assert rows["generated"].tolist() == [3, 3] and rows["raced"].tolist() == [2, 2]


def test_budget_curve_counts_budgeted_executions_against_the_cap():
    n_budgeted, n_test = 9, 5
    rollouts = _empty("rollouts").reindex(range(n_budgeted + n_test))
    rollouts["finished_at"] = T0 + np.arange(n_budgeted + n_test, dtype=float)
    rollouts["budgeted"] = [True] * n_budgeted + [False] * n_test
    rollouts["split"] = ["search"] * n_budgeted + ["test"] * n_test
    summary = ("ssr.summary", {"execution_budget": 30}, {"round": 1, "harness_id": "P"})
    res = _run([RoundStarted(0, "P", 0, 0), Stopped("budget", round=1, harness_id="P", rounds=1, incumbent="P", executions_used=n_budgeted), summary],
               rollouts=rollouts, budget=999)
    fig = S.budget_figure(res)
    y = _line(fig, "budgeted executions")
    assert y[0] == 0 and y.max() == n_budgeted
    cap = _line(fig, "budget B = 30")  # the run's own recorded budget wins over the config
    assert set(cap) == {30}
    assert "r0" in " ".join(_texts(fig))


@pytest.mark.parametrize("kind", ["coverage", "bracket", "budget"])
def test_every_figure_is_absent_without_its_data(kind):
    build = {"coverage": S.coverage_figure, "bracket": S.bracket_figure, "budget": S.budget_figure}[kind]
    assert build(_run([])) is None


def test_the_audit_figure_plots_each_rules_regret_from_the_runs_audit_file(tmp_path):
    from milo_ray.ssr.audit_regimes import synthetic_matrix
    from milo_ray.ssr.audit_table import audit_matrix, summarize, write_parquet

    res = _run([])
    assert S.audit_figure(res) is None  # no audit file: no figure
    rows = audit_matrix(synthetic_matrix("wide", seed=0, tasks=40), fractions=(0.2, 0.4), replays=10)
    summary = [{"group": "wide", **r} for r in summarize(rows)]
    write_parquet(tmp_path / S.AUDIT_FILE, rows, summary)
    res = R.RunResults(**{**res.__dict__, "run_dir": tmp_path})
    fig = S.audit_figure(res)
    assert fig is not None and fig.name == "ssr_racing_audit"
    ax = fig.fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    sh = next(r for r in summary if r["rule"] == "successive_halving" and r["fraction"] == 0.4)
    assert lines["successive_halving"].get_ydata()[1] == pytest.approx(sh["regret"])
    assert {"uniform", "paired", "full matrix (100%)", "keep parent"} <= set(lines)
