"""The report and the comparison page fit a 1,400-pixel window: no table needs sideways
scrolling, laid out by headless Chromium (milo_ray.testing.browser). Runs whose stop
reasons are long sentences, as real ones are, are the case that used to push the metric
columns out of sight."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from milo_ray.testing.browser import chromium, overflowing_tables, screenshot

@pytest.fixture(autouse=True)
def _browser():
    # CI installs Chromium (.ci/run), so there a missing browser is a failure, not a skip.
    if chromium() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs the report's layout checks, but no Chromium is installed")
        pytest.skip("needs Chromium (apt-get install chromium)")

LONG_STOP = ("budget: run.budget.executions=700 reached after round 12 of island 3 "
             "(every island had stalled for 3 rounds; the orchestrator's last graft was rejected)")


def _with_long_stop_reason(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest.setdefault("summary", {})["stop_reason"] = LONG_STOP
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_the_comparison_page_shows_every_metric_column_at_1400_px(shared_runs, tmp_path):
    from milo_ray.report import write_comparison

    runs = [_with_long_stop_reason(shared_runs / name, tmp_path / "runs" / name.replace("/", "-"))
            for name in ("milo", "ssr", "sweep/0", "sweep/1")]
    page = write_comparison(runs, tmp_path / "cmp")
    assert overflowing_tables(page) == []
    screenshot(page, tmp_path / "comparison-1400.png")


def test_the_run_report_fits_1400_px(shared_runs, tmp_path):
    from milo_ray.report import write_report

    run = _with_long_stop_reason(shared_runs / "milo", tmp_path / "milo")
    page = write_report(run, tmp_path / "report")
    assert overflowing_tables(page) == []


def _legend_collisions(fig) -> list[str]:
    """Texts of ``fig``'s legends that leave the figure or overlap another visible text (a
    node label, a tick label, a title), as drawn by Agg."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(fig)  # the report draws with Agg too
    canvas.draw()
    renderer = canvas.get_renderer()
    page = fig.bbox
    legends = [lg for lg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if lg is not None]
    legend_texts = [t for lg in legends for t in lg.get_texts() if t.get_visible() and t.get_text()]
    others = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
              and t not in legend_texts and not any(t in lg.findobj(Text) for lg in legends)]
    found = []
    for t in legend_texts:
        box = t.get_window_extent(renderer)
        if box.x0 < page.x0 - 1 or box.x1 > page.x1 + 1 or box.y0 < page.y0 - 1 or box.y1 > page.y1 + 1:
            found.append(f"legend entry {t.get_text()!r} leaves the figure")
        for o in others:
            if box.overlaps(o.get_window_extent(renderer)):
                found.append(f"legend entry {t.get_text()!r} overlaps {o.get_text()!r}")
    return found


def test_no_milo_figure_has_a_legend_entry_over_a_label_or_off_the_figure(shared_runs):
    from milo_ray.milo.figures import figures
    from milo_ray.results import load_run

    figs = figures(load_run(shared_runs / "milo"))
    assert any(f.name.startswith("milo_lineage") for f in figs)
    problems = {f.name: _legend_collisions(f.fig) for f in figs}
    assert not {k: v for k, v in problems.items() if v}
