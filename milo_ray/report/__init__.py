"""The run report: one self-contained ``report.html`` per run, one comparison page per
set of runs (``python -m milo_ray.report``).

This package owns presentation only. Every number comes from
:mod:`milo_ray.results` (``harness_metrics``, ``final_test``, ``spend_by_role``,
``compare``) or from the run's method plugin; nothing is recomputed here, so the
report, DuckDB queries and the results API always agree. The method's own sections
(figures and tables) come from its plugin's ``report_sections(res)``
(:mod:`milo_ray.search.plugin`); benchmark figures that any method's run can have
(the instance-level track's) come from the modules in :data:`BENCHMARK_FIGURES`.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import sys
import traceback
from pathlib import Path
from html import escape  # not `import html`: that name is this package's html submodule
from typing import Any

from milo_ray import redaction
from milo_ray.report.tables import duration, fmt
from milo_ray.search.plugin import Figure, ReportSection
from milo_ray.store.remote import is_uri

__all__ = ["Figure", "write_report", "write_comparison", "BENCHMARK_FIGURES"]

# Figures of a benchmark rather than a method: (module, section title, lead text). Each
# module exposes ``figures(res) -> list[Figure]`` ([] for runs it has nothing for).
BENCHMARK_FIGURES = (
    ("milo_ray.report.einstein_figures", "Instance-level problems",
     "Verified scores over wall time against the published anchors (MILO App. E)."),
)

# Sections of a benchmark rather than a method, after the final test: each module exposes
# ``sections(res) -> list[Section]`` ([] for runs it has nothing for).
BENCHMARK_SECTIONS = ("milo_ray.report.graded_tree",)


# Columns of the report's tables, in order (results.py's frames carry a few more).
METRICS = ("pass_at_k", "pr_at_k", "rr_at_k")
FINAL_COLUMNS = ["label", "harness_id", "island", "n_tasks", "k", *METRICS, "true_score", "mean_input_tokens",
                 "mean_output_tokens", "mean_seconds", "total_cost_usd", "timeouts", "errors"]
HARNESS_COLUMNS = ["harness_id", "name", "origin", "island", "round", "n_tasks", "k", *METRICS, "mean_input_tokens",
                   "mean_output_tokens", "mean_seconds", "total_cost_usd"]
SPEND_COLUMNS = ["role", "model", "calls", "input_tokens", "output_tokens", "cost_usd", "unpriced_calls", "seconds",
                 "retries", "errors"]


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write ``report.html`` (plus every figure as PNG and SVG) for one run and return
    its path. ``out_dir`` defaults to ``<run_dir>/report``. Raises
    ``results.RunDirError`` for a directory that is not a readable run."""
    from milo_ray import results
    from milo_ray.report import html as page
    from milo_ray.report import tables

    res = results.load_run(run_dir)
    remote = is_uri(str(run_dir))  # read from a snapshot: the report goes to ./<run name>/report
    out = Path(out_dir) if out_dir is not None else (Path(res.name) if remote else Path(run_dir)) / "report"
    out.mkdir(parents=True, exist_ok=True)
    spend = results.spend_by_role(res)
    run_row = results.compare([res]).iloc[0]  # wall time as the comparison page shows it

    final = results.final_test(res)
    sections = [
        page.Section("overview", "Overview", _overview(res)),
        page.Section("final-test", "Final test results",
                     f'<p class="lead">{escape(final_test_lead(res))}</p>'
                     + tables.render(final, columns=FINAL_COLUMNS, table_id="final-test-table")
                     + _held_out_table(res)),
        *_benchmark_sections(res),
        *_figure_sections(res, out),
        page.Section("spend", "Spend by agent role",
                     '<p class="lead">Search agents\' calls (solver rollouts are in the harness tables). USD is '
                     '"unknown" when any call of the row could not be priced.</p>'
                     + tables.render(spend, columns=SPEND_COLUMNS, table_id="spend-table")),
        page.Section("harnesses", "Harnesses",
                     '<p class="lead">Every harness evaluated during the search: pass@k, PR@k and RR@k with '
                     "task-clustered 95% CIs, mean tokens and seconds per rollout, total USD.</p>",
                     [page.Section(f"harnesses-{split}", title,
                                   tables.render(results.harness_metrics(res, split=split), columns=HARNESS_COLUMNS,
                                                 table_id=f"harnesses-{split}-table"))
                      for split, title in (("search", "Search split"), ("val", "Validation split"))]),
        page.Section("config", "Configuration", _config(res)),
    ]
    doc = page.page(title=f"Run {res.manifest.get('run_id') or Path(run_dir).name}",
                    subtitle=f"{res.method} on {res.benchmark} · {run_dir if remote else Path(run_dir).resolve()}",
                    header=_header(res, spend, run_row.get("wall_seconds")), sections=sections, footer=_footer())
    path = out / "report.html"
    # The store's texts are redacted already; the page is redacted again as it is written
    # (a last line of defence: see milo_ray/redaction.py).
    path.write_text(redaction.redact(doc), encoding="utf-8")
    return path


def write_comparison(paths: list[str | Path], out_dir: str | Path, notes: tuple[str, ...] | list[str] = ()) -> Path:
    """Write ``comparison.html`` (table + plot) comparing the runs under ``paths``
    (run directories or sweep directories) and return its path; ``notes`` are warnings
    shown above the table (e.g. a sweep's runs that could not be read)."""
    from milo_ray.report.compare import write_comparison as _write

    return _write(paths, out_dir, notes)


def _figure_sections(res: Any, out: Path) -> list:
    """The method's sections (its plugin's), then one per benchmark figure module with
    figures for this run (PNG/SVG written to ``out``)."""
    from milo_ray.report import html as page
    from milo_ray.report import tables

    number = 0

    def section(s: ReportSection):
        nonlocal number
        body = f'<p class="lead">{escape(s.lead)}</p>'
        if s.error is not None:
            body += f'<p class="error">{escape(s.error)}</p>'
        for fig in s.figures:
            number += 1
            body += page.figure_block(fig, number, out)
        for t in s.tables:
            body += f"<h3>{escape(t.heading)}</h3>" + tables.render(t.frame, table_id=t.table_id)
        return page.Section(s.key, s.title, body)

    sections = [section(s) for s in _method_sections(res)]
    for module, title, lead in BENCHMARK_FIGURES:
        figs, error = _figures_of(module, res)
        if figs or error is not None:
            sections.append(section(ReportSection(module.rsplit(".", 1)[-1].replace("_figures", "") + "-figures",
                                                  title, lead, figs, error=error)))
    if not sections:
        sections.append(page.Section("figures", "Figures", '<p class="nodata">no data: this run has no figures '
                                     "(no method-specific events were recorded)</p>"))
    return sections


def _benchmark_sections(res: Any) -> list:
    """The sections of :data:`BENCHMARK_SECTIONS` for this run. A module that fails on it
    yields its error for the page (and stderr) instead of taking the report down."""
    from milo_ray.report import html as page

    out = []
    for module in BENCHMARK_SECTIONS:
        try:
            out += importlib.import_module(module).sections(res)
        except Exception as e:  # noqa: BLE001 -- reported on the page and on stderr, never swallowed
            print(f"milo_ray.report: {module}.sections failed: {traceback.format_exc(limit=3)}", file=sys.stderr)
            why = escape(f"{module}.sections failed on this run: {type(e).__name__}: {e}")
            name = module.rsplit(".", 1)[-1]
            out.append(page.Section(name, name.replace("_", " "), f'<p class="error">{why}</p>'))
    return out


def _method_sections(res: Any) -> list[ReportSection]:
    """The run's method plugin's sections. A plugin that fails on this run yields its
    error for the page (and stderr) instead of taking the whole report down: the tables
    are still worth reading."""
    plugin = res.plugin
    try:
        return list(plugin.report_sections(res))
    except Exception as e:  # noqa: BLE001 -- reported on the page and on stderr, never swallowed
        print(f"milo_ray.report: the {plugin.name} plugin's report sections failed: {traceback.format_exc(limit=3)}",
              file=sys.stderr)
        return [ReportSection(f"{plugin.name}-figures", f"{plugin.name} search", "",
                              error=f"the {plugin.name} method's report sections failed on this run: "
                                    f"{type(e).__name__}: {e}")]


def _figures_of(module: str, res: Any) -> tuple[list[Figure], str | None]:
    """The module's figures, or ([], None) when the module is not installed. A module
    that fails on this run yields its error for the page (and stderr)."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return [], None
        raise
    try:
        return list(mod.figures(res)), None
    except Exception as e:  # noqa: BLE001 -- reported on the page and on stderr, never swallowed
        tb = traceback.format_exc(limit=3)
        print(f"milo_ray.report: {module}.figures failed: {tb}", file=sys.stderr)
        return [], f"{module}.figures failed on this run: {type(e).__name__}: {e}"


def _status_badge(status: str) -> str:
    s = escape(str(status or "unknown"))
    return f'<span class="badge {s}">{s}</span>'


def _time(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "—"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _models(res: Any, spend: Any) -> str:
    m = res.manifest
    models = m.get("models") or {}
    parts = []
    solver = (models.get("solver") or {}).get("id") or m.get("model_id")
    if solver:
        parts.append(f"solver <code>{escape(str(solver))}</code>")
    emb = models.get("embedder") or {}
    if emb.get("used"):
        parts.append("embedder " + ", ".join(f"<code>{escape(str(u))}</code>" for u in emb["used"]))
    if spend is not None and len(spend) and "model" in spend:
        seen = set()
        for _, r in spend.iterrows():
            model = r.get("model")
            if isinstance(model, str) and model and (r["role"], model) not in seen and r["role"] != "embedder":
                seen.add((r["role"], model))
                parts.append(f"{escape(str(r['role']))} <code>{escape(model)}</code>")
    return "; ".join(parts) or "—"


def _header(res: Any, spend: Any, wall_seconds: Any) -> list[tuple[str, str]]:
    m = res.manifest
    return [
        ("run id", escape(str(m.get("run_id") or "—"))),
        ("method", escape(str(res.method))),
        ("benchmark", escape(str(res.benchmark))),
        ("status", _status_badge(res.status)),
        ("wall time", duration(wall_seconds)),
        ("started", _time(m.get("started_at"))),
        ("models", _models(res, spend)),
        ("seed · git", f"{escape(str(m.get('seed', '—')))} · <code>{escape(str(m.get('git_sha') or '—')[:10])}</code>"),
    ]


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool)) or v is None


def final_test_lead(res: Any) -> str:
    """What the final-test tables hold, said as it is: whose rollouts, on which tasks, how
    many per task, whether they were drawn fresh, and how many of those tasks the search
    itself ran (a figure over them is not held out; the held-out table excludes them)."""
    if res.summary.get("mode") == "oracle":
        return ("The tasks' reference solutions (executor.agent=oracle), not a harness: every task of every split "
                "once, with task-clustered 95% confidence intervals.")
    spec = res.plugin.final_test(res)
    tasks = list(spec.task_ids) if spec.task_ids is not None else None
    size = f"{len(tasks)} tasks" if tasks is not None else "its tasks"
    per_task = f", {spec.k} rollout(s) per task" if spec.k is not None else ""
    if res.method == "eval" or not res.plugin.searches:
        return (f"The evaluated harnesses on the {spec.split} split ({size}{per_task}), with task-clustered 95% "
                "confidence intervals (MILO §5.2).")
    text = (f"The search's final harness(es) on the {spec.split} split ({size}{per_task}), with task-clustered 95% "
            "confidence intervals (MILO §5.2).")
    if spec.cache_keys is not None and len(res.rollouts):
        tested = res.rollouts[res.rollouts["cache_key"].isin(spec.cache_keys)]
        reused = int(tested["budgeted"].fillna(True).astype(bool).sum()) if "budgeted" in tested else 0
        text += (f" {reused} of its rollouts are the search's own, reused (a run made before final tests drew "
                 "fresh rollouts)." if reused else " Every rollout was drawn for the test: none is the search's.")
    held = spec.held_out_task_ids
    if tasks is None or held is None:
        return text
    shared = len(tasks) - len(held)
    if not shared:
        return text + " None of these tasks was run by the search: the figure is held out."
    text += (f" {shared} of these tasks were also run by the search (the papers' full benchmark), so this figure "
             "is not held out")
    return text + (f"; the second table scores the same rollouts on the {len(held)} tasks the search never ran "
                   "(held out)." if held else "; every test task was, so there is no held-out figure.")


def _held_out_table(res: Any) -> str:
    """The final test over the held-out tasks alone, where the test split also holds
    tasks the search ran ('' where the whole split is held out or none of it is)."""
    from milo_ray import results
    from milo_ray.report import tables

    spec = res.plugin.final_test(res)
    held, tasks = spec.held_out_task_ids, spec.task_ids
    if res.summary.get("mode") == "oracle" or not held or tasks is None or len(held) == len(tasks):
        return ""
    return (f"<h3>Held-out tasks only: the {len(held)} {escape(spec.split)} tasks the search never ran</h3>"
            + tables.render(results.final_test(res, tasks="held_out"),
                            columns=[c for c in FINAL_COLUMNS if c != "true_score"],
                            table_id="final-test-held-out-table"))


def _overview(res: Any) -> str:
    """The run summary's scalar facts (stop reason, rounds, executions, ...) as recorded."""
    from milo_ray.report import html as page

    summary = res.manifest.get("summary")
    if not isinstance(summary, dict) or not summary:
        status = res.manifest.get("status")
        return f'<p class="nodata">no data: the run has no summary yet (status: {escape(str(status))})</p>'
    items = [(k.replace("_", " "), escape(fmt(k, v))) for k, v in summary.items() if _scalar(v)]
    budget = res.manifest.get("budget")
    if isinstance(budget, dict):
        items += [(f"budget {k.replace('_', ' ')}", escape(fmt(k, v))) for k, v in budget.items() if _scalar(v)]
    return page.facts(items)


def _config(res: Any) -> str:
    cfg = res.manifest.get("config")
    if not cfg:
        return '<p class="nodata">no data: the manifest holds no resolved config</p>'
    text = json.dumps(cfg, indent=2, sort_keys=True, default=str)
    return f"<details><summary>Resolved configuration</summary><pre>{escape(text)}</pre></details>"


def _footer() -> str:
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"Generated by milo_ray.report at {now}. Numbers from milo_ray.results; figures also saved as PNG and SVG."
