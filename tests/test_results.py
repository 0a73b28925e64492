"""milo_ray.results against run directories made here: every number is checked against
the Parquet files read independently (DuckDB, pyarrow, scipy) and, for the final test,
against what the run itself reported in manifest["summary"].

One module fixture runs, in one process (tests/entry/cli_jobs.py), a two-job MILO sweep
(ablation rungs A and B), an SSR run, an instance-level (einstein) MILO run and an eval
run, each tiny.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import zstandard
from scipy import stats

from milo_ray import results as R
from milo_ray.store import schema

METRICS = ("pass_at_k", "pr_at_k", "rr_at_k")


@pytest.fixture(scope="module")
def runs(shared_runs) -> Path:
    """sweep/0 and sweep/1 (MILO rungs A, B), ssr, einstein, eval: tests/shared_runs.py."""
    return shared_runs


def _sql(run_dir: Path, table: str, query: str) -> list[tuple]:
    """``query`` with ``T`` standing for the table's Parquet files, read by DuckDB directly."""
    return duckdb.sql(query.replace("T", f"read_parquet('{run_dir}/{table}/*.parquet')")).fetchall()


def _ci(values: np.ndarray) -> tuple[float, float]:
    """The task-clustered Student-t 95% interval of DESIGN §4.4, written out here."""
    n = len(values)
    half = stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / math.sqrt(n)
    return max(0.0, values.mean() - half), min(1.0, values.mean() + half)


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


# ---- loading ------------------------------------------------------------------------------
def test_load_run_reads_every_table_and_blob(runs):
    run = runs / "sweep" / "0"
    res = R.load_run(run)
    assert (res.method, res.benchmark, res.status, res.rung) == ("milo", "surrogate_tb21", "finished", "A")
    for table in R.TABLES:
        frame = getattr(res, table)
        assert list(frame.columns[: len(schema.COLUMNS[table])]) == list(schema.COLUMNS[table]), table
        stored = list((run / table).glob("*.parquet"))
        expected = _sql(run, table, "select count(*) from T")[0][0] if stored else 0
        assert len(frame) == expected, table
    assert len(res.experience) == 0 and len(res.rollouts) > 0  # MILO stores no experience: an empty typed frame
    assert str(res.experience["round"].dtype) == "Int64"
    # events: ordered by seq, payload decoded into data
    (seqs, payloads) = zip(*_sql(run, "events", "select seq, payload from T order by seq"))
    assert list(res.events["seq"]) == list(seqs)
    assert list(res.events["data"]) == [json.loads(p) if p else {} for p in payloads]
    summary = res.events_of("milo.summary")
    assert len(summary) == 1 and summary[0]["final_test"][0]["harness_id"] == res.summary["final_test"][0]["harness_id"]
    assert res.events_of("no.such.kind") == []
    # blobs, decoded independently of milo_ray.store: a zstd frame holding a type tag + body
    ref = res.rollouts["trace_ref"].dropna().iloc[0]
    plain = zstandard.ZstdDecompressor().decompress((run / "blobs" / ref[:2] / f"{ref}.zst").read_bytes())
    assert res.trace(ref) == json.loads(plain[1:]) and plain[:1] == b"J"
    assert res.trace("0" * 64) is None and res.trace(None) is None
    src_ref = res.harnesses["source_ref"].dropna().iloc[0]
    files = json.loads(zstandard.ZstdDecompressor().decompress(
        (run / "blobs" / src_ref[:2] / f"{src_ref}.zst").read_bytes())[1:])
    assert res.source_files(src_ref) == files
    text = res.source(src_ref)
    assert all(body in text for body in files.values())


def test_an_unfinished_run_loads_and_reports_its_status(runs, tmp_path):
    run = tmp_path / "live"
    shutil.copytree(runs / "sweep" / "1", run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["status"] = "running"
    del manifest["summary"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    res = R.load_run(run)
    assert res.status == "running" and res.summary == {}
    # Without a summary the final test lists the harnesses with test-split rollouts.
    test = R.final_test(res)
    stored = _sql(run, "rollouts", "select distinct harness_id from T where split = 'test'")
    assert set(test["harness_id"]) == {h for (h,) in stored}


# ---- metrics ------------------------------------------------------------------------------
def test_harness_metrics_equal_an_independent_computation(runs):
    run = runs / "sweep" / "0"
    res = R.load_run(run)
    frame = R.harness_metrics(res, split="search")
    rows = _sql(run, "rollouts", "select harness_id, task_id, rollout_idx, score, output_tokens, latency_s "
                                 "from T where split = 'search'")
    assert rows and set(frame["harness_id"]) == {r[0] for r in rows}
    assert frame["n_tasks"].min() >= 2  # the intervals below are real intervals
    for h in frame.to_dict("records"):
        mine = [r for r in rows if r[0] == h["harness_id"]]
        k = max(r[2] for r in mine) + 1
        tasks = sorted({r[1] for r in mine})
        S = np.zeros((len(tasks), k))
        for r in mine:
            S[tasks.index(r[1]), r[2]] = r[3]
        per_task = {"pass_at_k": (S.max(axis=1) == 1).astype(float), "pr_at_k": S.mean(axis=1),
                    "rr_at_k": (S == 1).mean(axis=1)}
        assert (h["n_tasks"], h["k"]) == (len(tasks), k)
        for m, v in per_task.items():
            assert _close(h[m], v.mean()), m
            lo, hi = _ci(v)
            assert _close(h[f"{m}_lo"], lo) and _close(h[f"{m}_hi"], hi), m
        assert _close(h["mean_output_tokens"], np.mean([r[4] for r in mine]))
        assert _close(h["mean_seconds"], np.mean([r[5] for r in mine]))
    # k caps the attempts counted; a bad k is refused naming it
    assert (R.harness_metrics(res, split="search", k=1)["k"] == 1).all()
    with pytest.raises(ValueError, match="k=0"):
        R.harness_metrics(res, k=0)
    assert R.harness_metrics(res, split="no-such-split").empty


@pytest.mark.parametrize("name", ["sweep/0", "ssr"])
def test_a_search_final_test_shares_no_rollout_with_the_search(runs, name):
    # The draws that chose the harness are never its test result: the final test's cache
    # keys are disjoint from every budgeted (search) rollout's, on every task, and every
    # one of them ran outside the budget.
    res = R.load_run(runs / name)
    spec = res.plugin.final_test(res)
    searched = res.rollouts[res.rollouts["budgeted"]]
    assert len(searched) and spec.cache_keys
    assert spec.cache_keys.isdisjoint(set(searched["cache_key"]))
    tested = res.rollouts[res.rollouts["cache_key"].isin(spec.cache_keys)]
    assert not tested["budgeted"].any() and set(tested["split"]) == {spec.split}
    # ... though the test split holds tasks the search ran (surrogate_tb21's full benchmark)
    assert set(searched["task_id"]) & set(spec.task_ids)


@pytest.mark.parametrize("name", ["sweep/0", "ssr"])
def test_the_held_out_final_test_scores_only_the_test_tasks_the_search_never_ran(runs, name):
    res = R.load_run(runs / name)
    spec = res.plugin.final_test(res)
    searched = set(res.rollouts.loc[res.rollouts["budgeted"], "task_id"])
    held = [t for t in spec.task_ids if t not in searched]
    assert list(spec.held_out_task_ids) == held and 0 < len(held) < len(spec.task_ids)
    full, part = R.final_test(res), R.final_test(res, tasks="held_out")
    assert list(part["harness_id"]) == list(full["harness_id"]) and (part["n_tasks"] == len(held)).all()
    assert part["true_score"].isna().all()
    reported = res.summary["final_test_held_out"]
    for row, rep in zip(part.to_dict("records"), reported):
        assert (row["harness_id"], row["n_tasks"]) == (rep["harness_id"], rep["n_tasks"])
        for key in (*METRICS, "mean_output_tokens", "mean_seconds", "timeouts", "errors"):
            assert _close(row[key], rep[key]), key
        # recomputed here from the rollouts of the held-out tasks alone
        mine = res.rollouts[res.rollouts["cache_key"].isin(spec.cache_keys) & res.rollouts["task_id"].isin(held)
                            & (res.rollouts["harness_id"] == row["harness_id"])]
        assert _close(row["pr_at_k"], mine["score"].sum() / (len(held) * row["k"]))
    row = R.compare([res]).iloc[0]
    assert row["held_out_n_tasks"] == len(held) and _close(row["held_out_pr_at_k"], part["pr_at_k"].iloc[0])


def test_an_eval_run_has_no_held_out_final_test(runs):
    res = R.load_run(runs / "eval")
    with pytest.raises(ValueError, match="does not search"):
        R.final_test(res, tasks="held_out")
    assert R.compare([res])["held_out_pr_at_k"].isna().all()
    with pytest.raises(ValueError, match="tasks='everything'"):
        R.final_test(res, tasks="everything")


@pytest.mark.parametrize("name", ["sweep/0", "sweep/1", "ssr", "eval"])
def test_final_test_matches_what_the_run_reported(runs, name):
    res = R.load_run(runs / name)
    reported = res.summary["harnesses" if name == "eval" else "final_test"]
    test = R.final_test(res)
    assert len(test) == len(reported) >= 1
    if name == "ssr":
        assert list(test["label"]) == ["ssr final", "ssr initial"][: len(test)]
    for row, rep in zip(test.to_dict("records"), reported):
        assert (row["harness_id"], row["label"], row["n_tasks"], row["k"]) == \
            (rep["harness_id"], rep["name"], rep["n_tasks"], rep["k"])
        assert row["n_rollouts"] == row["n_tasks"] * row["k"]
        for key in (*METRICS, "mean_output_tokens", "mean_seconds", "timeouts", "errors", "true_score"):
            assert _close(row[key], rep[key]), key
        for m, ci in (("pr_at_k", "pr_ci"), ("rr_at_k", "rr_ci")):
            assert _close(row[f"{m}_lo"], rep[ci][0]) and _close(row[f"{m}_hi"], rep[ci][1]), ci
    # A search's final test draws its own rollouts: every one is stored under the test
    # split, outside the budget, even on test tasks the search ran.
    if name != "eval":
        labelled = _sql(runs / name, "rollouts", f"select count(*) from T where split = 'test' and not budgeted "
                                                 f"and harness_id = '{reported[0]['harness_id']}'")[0][0]
        assert labelled == reported[0]["n_tasks"] * reported[0]["k"]



@pytest.mark.parametrize("name", ["sweep/0", "ssr", "eval"])
def test_the_final_test_is_read_from_what_the_run_recorded_not_rebuilt(runs, name, tmp_path):
    # The run recorded its final test (split, k, task ids, the cache keys it used): with a
    # benchmark that cannot be rebuilt here, the final test reads the same, without a warning.
    spec = R.load_run(runs / name).summary["final_test_spec"]
    expected = R.final_test(R.load_run(runs / name))
    assert (spec["k"], len(spec["task_ids"])) == (expected["k"].iloc[0], expected["n_tasks"].iloc[0])
    assert len(spec["cache_keys"]) >= expected["n_rollouts"].max()
    run = tmp_path / "moved"
    shutil.copytree(runs / name, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["benchmark"]["_target_"] = "no.such.module.Benchmark"
    (run / "manifest.json").write_text(json.dumps(manifest))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = R.final_test(R.load_run(run))
    pd.testing.assert_frame_equal(got, expected)


def test_einstein_scores_are_rewards(runs):
    run = runs / "einstein"
    res = R.load_run(run)
    assert (res.method, res.benchmark) == ("milo", "einstein")
    scores = [s for (s,) in _sql(run, "rollouts", "select score from T")]
    assert any(0 < s < 1 for s in scores)  # partial rewards, not pass/fail
    # The benchmark rebuilt from the manifest (keys stored sorted) draws the run's own
    # splits: no fallback warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        test = R.final_test(res)
    for row, rep in zip(test.to_dict("records"), res.summary["final_test"]):
        for key in (*METRICS, "mean_seconds", "n_tasks", "k"):
            assert _close(row[key], rep[key]), key
    search = R.harness_metrics(res)
    expected = dict(_sql(run, "rollouts", "select harness_id, avg(score) from T where split = 'search' group by 1"))
    assert {h: pytest.approx(v) for h, v in expected.items()} == dict(zip(search["harness_id"], search["pr_at_k"]))


def test_spend_by_role_equals_the_agent_calls_table(runs):
    for name in ("ssr", "sweep/1"):
        run = runs / name
        res = R.load_run(run)
        spend = R.spend_by_role(res)
        rows = _sql(run, "agent_calls", "select role, coalesce(model, ''), count(*), sum(input_tokens), "
                                        "sum(output_tokens), sum(latency_s), count(*) - count(cost_usd) from T "
                                        "group by 1, 2")
        assert rows
        got = {(r["role"], r["model"] or ""): r for r in spend.to_dict("records")}
        assert set(got) == {(r[0], r[1]) for r in rows}
        for role, model, calls, tin, tout, secs, unpriced in rows:
            g = got[(role, model)]
            assert (g["calls"], g["input_tokens"], g["output_tokens"], g["unpriced_calls"]) == (calls, tin, tout, unpriced)
            assert _close(g["seconds"], secs)
        for role, s in res.summary["spend_by_role"].items():
            mine = spend[spend["role"] == role]
            assert (int(mine["calls"].sum()), int(mine["output_tokens"].sum())) == (s["calls"], s["output_tokens"])
        order = [schema.AGENT_ROLES.index(r) for r in spend["role"]]
        assert order == sorted(order)


# ---- sweeps -------------------------------------------------------------------------------
def test_a_sweep_compares_and_connects_with_a_run_column(runs):
    sweep = runs / "sweep"
    assert R.find_runs(sweep) == [sweep / "0", sweep / "1"]
    assert R.find_runs(sweep / "1") == [sweep / "1"]
    table = R.compare([R.load_run(p) for p in R.find_runs(sweep)])
    assert list(table["run"]) == ["0", "1"] and list(table["rung"]) == ["A", "B"]
    for row in table.to_dict("records"):
        res = R.load_run(sweep / row["run"])
        best = res.summary["final_test"][0]
        assert row["harness_id"] == best["harness_id"] and _close(row["pr_at_k"], best["pr_at_k"])
        assert _close(row["pr_at_k_lo"], best["pr_ci"][0])
        assert row["rollouts"] == _sql(sweep / row["run"], "rollouts", "select count(*) from T")[0][0]
        assert row["status"] == "finished" and 0 < row["wall_seconds"] < 600
    con = R.connect(sweep)
    for table_name in ("rollouts", "events", "harnesses", "agent_calls"):
        counts = dict(con.sql(f"select run, count(*) from {table_name} group by run").fetchall())
        assert counts == {d: _sql(sweep / d, table_name, "select count(*) from T")[0][0] for d in ("0", "1")}
    by_run = con.sql("select run, avg(score) from rollouts where split = 'test' group by run order by run").fetchall()
    assert [r for r, _ in by_run] == ["0", "1"]
    assert con.sql("select run, method, rung, status from runs order by run").fetchall() == \
        [("0", "milo", "A", "finished"), ("1", "milo", "B", "finished")]
    # A table no run stored is still a view with every column.
    cols = [c[0] for c in con.sql("describe experience").fetchall()]
    assert cols == [*schema.COLUMNS["experience"], "run"]
    assert con.sql("select count(*) from experience").fetchall() == [(0,)]


def test_connect_to_one_run_names_it_dot(runs):
    con = R.connect(runs / "ssr")
    assert con.sql("select distinct run from rollouts").fetchall() == [(".",)]
    assert con.sql("select count(*) from experience").fetchall()[0][0] == \
        _sql(runs / "ssr", "experience", "select count(*) from T")[0][0] > 0


# ---- bad input ----------------------------------------------------------------------------
def test_unreadable_run_dirs_raise_errors_naming_the_path_and_the_fix(runs, tmp_path):
    with pytest.raises(R.RunDirError, match="no such directory"):
        R.load_run(tmp_path / "missing")
    with pytest.raises(R.RunDirError, match=r"not a run directory.*find_runs"):
        R.load_run(runs / "sweep")  # a sweep, not a run
    (tmp_path / "empty").mkdir()
    with pytest.raises(R.RunDirError, match="no run directories"):
        R.find_runs(tmp_path / "empty")
    with pytest.raises(R.RunDirError, match="not a run directory"):
        R.load_run(tmp_path / "empty")

    corrupt = tmp_path / "corrupt"
    shutil.copytree(runs / "sweep" / "0", corrupt)
    (corrupt / "manifest.json").write_text("{not json")
    with pytest.raises(R.RunDirError, match=f"{corrupt}/manifest.json: corrupt manifest"):
        R.load_run(corrupt)

    future = tmp_path / "future"
    shutil.copytree(runs / "sweep" / "0", future)
    part = sorted((future / "rollouts").glob("*.parquet"))[0]
    data = pq.read_table(part)
    meta = {**data.schema.metadata, schema.META_SCHEMA_VERSION: str(schema.SCHEMA_VERSION + 1).encode()}
    pq.write_table(data.replace_schema_metadata(meta), part)
    for call in (R.load_run, R.connect):
        with pytest.raises(R.RunDirError, match=f"{part}.*newer milo_ray.*upgrade milo_ray"):
            call(future)


def test_importing_milo_ray_and_its_entry_point_does_not_import_pandas():
    # pandas loads with milo_ray.results (and pyarrow.dataset), not with the package or the run command.
    code = "import sys, milo_ray, milo_ray.run, milo_ray.search.scores; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
