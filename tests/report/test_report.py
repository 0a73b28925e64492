"""The run report and the comparison page, on run directories made here.

One module fixture runs, in one process (tests/entry/cli_jobs.py), a tiny SSR run, a
tiny MILO run and a two-job Hydra sweep of the MILO ablation rungs A and B. The pages
are checked for what they must hold (every figure each figure module draws for the
run, every table, valid PNG/SVG files, nothing loaded from the network) and their
numbers are checked against the Parquet files read directly with DuckDB.
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from milo_ray import results as R
from milo_ray.report import BENCHMARK_FIGURES, write_report
from milo_ray.store import schema

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@pytest.fixture(scope="module")
def runs(shared_runs) -> Path:
    """ssr, milo (which wrote its own report), sweep: tests/shared_runs.py."""
    return shared_runs


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "milo_ray.report", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=ENV)


class _Page(HTMLParser):
    """Tables (by id: rows of {column: cell attributes + text}), figures and any
    external reference of a report page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, dict]]] = {}
        self.figures: dict[str, bytes] = {}
        self.external: list[str] = []
        self._table = self._row = self._cell = None
        self._figure = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href"):
            if key in a and re.match(r"^(https?:)?//", a[key] or ""):
                self.external.append(a[key])
        if tag in ("script", "link", "iframe"):
            self.external.append(tag)
        if tag == "table":
            self._table = self.tables.setdefault(a.get("id", f"anon{len(self.tables)}"), [])
        elif tag == "tr" and self._table is not None:
            self._row = {}
        elif tag == "td" and self._row is not None:
            self._cell = {**a, "text": ""}
            self._row[a["data-col"]] = self._cell
        elif tag == "figure":
            self._figure = a["data-name"]
        elif tag == "img" and self._figure is not None:
            src = a["src"]
            assert src.startswith("data:image/png;base64,"), src[:60]
            self.figures[self._figure] = base64.b64decode(src.split(",", 1)[1])

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self._table.append(self._row)
            self._row = None
        elif tag == "td":
            self._cell = None
        elif tag == "figure":
            self._figure = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text("utf-8"))
    return page


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC, "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _expected_figures(run_dir: Path) -> list[str]:
    """Every figure the run's method plugin and the benchmark figure modules draw for this run."""
    res = R.load_run(run_dir)
    names = [f.name for s in res.plugin.report_sections(res) for f in s.figures]
    for module, _, _ in BENCHMARK_FIGURES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        names += [f.name for f in mod.figures(res)]
    return names


def _check_page(path: Path, run_dir: Path, tables: list[str]) -> _Page:
    page = _parse(path)
    assert not page.external, f"the page loads from outside itself: {page.external}"
    text = path.read_text("utf-8")
    assert '<p class="error">' not in text, re.search(r'<p class="error">(.*?)</p>', text).group(1)
    expected = _expected_figures(run_dir)
    assert expected, "no figure module drew anything for this run"
    assert sorted(page.figures) == sorted(expected)
    for name, png in page.figures.items():
        on_disk = (path.parent / f"{name}.png").read_bytes()
        assert on_disk == png, f"{name}: the embedded PNG differs from {name}.png"
        w, h = _png_size(png)
        assert w >= 400 and h >= 200 and len(png) > 10_000, f"{name}: a {w}x{h} PNG of {len(png)} bytes"
        svg = (path.parent / f"{name}.svg").read_text("utf-8")
        assert "<svg" in svg and len(svg) > 5_000
    for t in tables:
        assert page.tables.get(t), f"table {t} missing or empty; tables: {sorted(page.tables)}"
    for header in ("run id", "method", "benchmark", "status", "wall time", "models"):
        assert f"<dt>{header}</dt>" in text
    return page


def _sql(run_dir: Path, table: str, query: str) -> list[tuple]:
    return duckdb.sql(query.replace("T", f"read_parquet('{run_dir}/{table}/*.parquet')")).fetchall()


def _final_test(run: Path, harness_id: str, k: int) -> tuple[int, float, float, float, float]:
    """(tasks, PR@k, RR@k, pass@k, mean output tokens) of a harness's final test.

    Rollouts 0..k-1 of each task of the benchmark's test split that ran outside the
    search's budget: the final test draws its own rollouts, even on test tasks the search
    ran (those rows are the budgeted ones)."""
    tasks = R.load_run(run).split_tasks("test")
    assert tasks, "the benchmark's test split could not be rebuilt"
    listed = ", ".join(f"'{t}'" for t in tasks)
    where = f"harness_id = '{harness_id}' and rollout_idx < {k} and task_id in ({listed}) and not budgeted"
    n, cells, pr, rr, tok = _sql(run, "rollouts", "select count(distinct task_id), count(*), avg(score), "
                                                  f"avg((score = 1)::int), avg(output_tokens) from T where {where}")[0]
    assert n == len(tasks) and cells == n * k, "a test task without all its rollouts"
    (passed,) = _sql(run, "rollouts", f"select avg(p) from (select max((score = 1)::int) as p from T where {where} "
                                      "group by task_id)")[0]
    return n, pr, rr, passed, tok


def _value(cell: dict) -> float:
    return float(cell["data-v"])


def _shown(cell: dict, value: float, digits: int = 3) -> None:
    """The printed number is the stored one, rounded."""
    assert cell["text"].split()[0] == f"{value:.{digits}f}", (cell["text"], value)


def test_ssr_report_holds_every_figure_and_table(runs, tmp_path):
    proc = _cli(runs / "ssr", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path == tmp_path / "out" / "report.html"
    page = _check_page(path, runs / "ssr",
                       ["final-test-table", "harnesses-search-table", "spend-table", "ssr-decisions-table"])
    assert {"ssr_coverage", "ssr_bracket", "ssr_budget"} == set(page.figures)
    # the decisions table is the run's own selection events
    sel = [json.loads(p) for (p,) in _sql(runs / "ssr", "events", "select payload from T where kind = 'ssr.selection'")]
    rows = page.tables["ssr-decisions-table"]
    assert [r["decision"]["text"] for r in rows] == ["accepted" if s["replaced"] else "kept parent" for s in sel]
    assert [_value(r["parent_score"]) for r in rows] == [s["parent_score"] for s in sel]


def test_ssr_report_numbers_equal_the_parquet_tables(runs, tmp_path):
    run = runs / "ssr"
    page = _parse(write_report(run, tmp_path))
    summary = json.loads((run / "manifest.json").read_text())["summary"]
    rows = page.tables["final-test-table"]
    assert [r["harness_id"]["data-v"] for r in rows] == [r["harness_id"] for r in summary["final_test"]]
    for row, want_row in zip(rows, summary["final_test"]):
        hid = row["harness_id"]["data-v"]
        n, pr, rr, passed, tok = _final_test(run, hid, want_row["k"])
        assert int(_value(row["n_tasks"])) == n
        for col, want in (("pr_at_k", pr), ("rr_at_k", rr), ("pass_at_k", passed), ("mean_output_tokens", tok)):
            assert math.isclose(_value(row[col]), want, rel_tol=1e-9), (col, hid)
        _shown(row["pr_at_k"], pr)
        lo, hi = float(row["pr_at_k"]["data-lo"]), float(row["pr_at_k"]["data-hi"])
        assert lo < pr < hi
    spend = {r["role"]["data-v"]: r for r in page.tables["spend-table"]}
    want = _sql(run, "agent_calls", "select role, count(*), sum(input_tokens), sum(latency_s) from T group by role")
    assert set(spend) == {w[0] for w in want}
    for role, calls, tokens, seconds in want:
        assert _value(spend[role]["calls"]) == calls
        assert _value(spend[role]["input_tokens"]) == tokens
        assert math.isclose(_value(spend[role]["seconds"]), seconds, rel_tol=1e-9)


def test_milo_report_holds_every_figure_and_its_harness_numbers_equal_parquet(runs, tmp_path):
    run = runs / "milo"
    path = write_report(run, tmp_path)
    page = _check_page(path, run, ["final-test-table", "harnesses-search-table", "harnesses-val-table"])
    assert not [f for f in page.figures if f.startswith("ssr_")], "SSR figures on a MILO run"
    rows = page.tables["harnesses-search-table"]
    # k_search=1: PR@k of a harness on the search split is the mean of its search-split scores
    want = dict(_sql(run, "rollouts", "select harness_id, avg(score) from T where split = 'search' group by 1"))
    assert {r["harness_id"]["data-v"] for r in rows} == set(want)
    for r in rows:
        assert math.isclose(_value(r["pr_at_k"]), want[r["harness_id"]["data-v"]], rel_tol=1e-9)
        _shown(r["pr_at_k"], want[r["harness_id"]["data-v"]])


def test_a_finished_run_writes_its_report_and_prints_the_path_unless_told_not_to(runs):
    page = runs / "milo" / "report" / "report.html"
    assert page.is_file() and (runs / "milo" / "report" / "milo_pareto.png").is_file()
    assert f"report: {page}" in (runs / "stdout.txt").read_text()
    assert not (runs / "ssr" / "report").exists()  # run.report=false


def test_report_goes_to_the_run_directory_by_default(runs, tmp_path):
    run = tmp_path / "milo_default"
    shutil.copytree(runs / "milo", run, ignore=shutil.ignore_patterns("report"))
    proc = _cli(run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(proc.stdout.strip()) == run / "report" / "report.html"
    R.load_run(run)  # the report directory does not get in the way of reading the run


def test_a_run_missing_optional_tables_still_renders_with_no_data_sections(runs, tmp_path):
    run = tmp_path / "bare"
    shutil.copytree(runs / "ssr", run)
    for table in ("agent_calls", "experience", "events", "harnesses"):
        shutil.rmtree(run / table)
    path = write_report(run, tmp_path / "out")
    page = _parse(path)
    text = path.read_text("utf-8")
    assert page.figures.keys() <= {"ssr_budget"}  # rollouts are left: only the budget curve can be drawn
    assert "spend-table" not in page.tables
    assert re.search(r'<section id="spend"><h2>[^<]+</h2><p class="lead">[^<]*</p><p class="nodata">no data</p>', text)
    assert page.tables["final-test-table"], "the final test comes from rollouts and the manifest, still there"


def test_comparison_of_a_sweep_puts_both_rungs_side_by_side(runs, tmp_path):
    sweep = runs / "sweep"
    proc = _cli("--compare", sweep, "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = Path(proc.stdout.strip())
    page = _parse(path)
    assert not page.external
    rows = page.tables["compare-table"]
    assert [r["setting"]["text"] for r in rows] == ["milo_A", "milo_B"]
    assert [r["run"]["text"] for r in rows] == ["0", "1"]
    for row, job in zip(rows, ("0", "1")):
        incumbent = json.loads((sweep / job / "manifest.json").read_text())["summary"]["final_test"][0]
        _, pr, _, _, _ = _final_test(sweep / job, incumbent["harness_id"], incumbent["k"])
        assert math.isclose(_value(row["pr_at_k"]), pr, rel_tol=1e-9)
        _shown(row["pr_at_k"], pr)
    assert set(page.figures) == {"comparison_metrics"}
    _png_size(page.figures["comparison_metrics"])
    assert (tmp_path / "comparison_metrics.svg").exists()


def test_comparison_across_methods_names_each_setting(runs, tmp_path):
    path = Path(_cli("--compare", runs / "sweep", runs / "ssr", "--out", tmp_path).stdout.strip())
    rows = _parse(path).tables["compare-table"]
    assert [r["setting"]["text"] for r in rows] == ["milo_A", "milo_B", "ssr"]


def test_bad_input_exits_2_with_the_reason(runs, tmp_path):
    future = tmp_path / "future"
    shutil.copytree(runs / "milo", future, ignore=shutil.ignore_patterns("report"))  # the run wrote one
    part = sorted((future / "rollouts").glob("*.parquet"))[0]
    data = pq.read_table(part)
    meta = {**data.schema.metadata, schema.META_SCHEMA_VERSION: str(schema.SCHEMA_VERSION + 1).encode()}
    pq.write_table(data.replace_schema_metadata(meta), part)
    proc = _cli(future)
    assert proc.returncode == 2 and "newer milo_ray" in proc.stderr and "upgrade milo_ray" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (future / "report").exists()

    proc = _cli(tmp_path / "nowhere")
    assert proc.returncode == 2 and "no such directory" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = _cli("--compare", tmp_path / "empty", "--out", tmp_path / "c")
    assert proc.returncode == 2 and "no run directories" in proc.stderr
    proc = _cli(runs / "sweep")  # a sweep is not one run
    assert proc.returncode == 2 and "not a run directory" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("--compare", runs / "ssr", runs / "milo")
    assert proc.returncode == 2 and "--out" in proc.stderr


def test_the_report_redacts_registered_secrets_even_when_the_store_holds_them(runs, tmp_path):
    # A value the stored run does hold (a seed's name stands in for a leaked key): the page
    # and its figure files are redacted as they are written.
    from milo_ray import redaction

    run = tmp_path / "milo_secret"
    shutil.copytree(runs / "milo", run, ignore=shutil.ignore_patterns("report"))
    out = tmp_path / "out"
    assert "division_of_labor" in write_report(run, out).read_text()
    redaction.register({"FAKE_KEY": "division_of_labor"})
    try:
        page = write_report(run, tmp_path / "out2")
    finally:
        redaction.clear()
    files = [p for p in page.parent.iterdir() if p.suffix in (".html", ".svg")]
    assert all("division_of_labor" not in p.read_text() for p in files)
    assert "[redacted $FAKE_KEY]" in page.read_text()
