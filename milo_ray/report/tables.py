"""DataFrames as HTML tables for the report: formatting only, never arithmetic.

Every number comes from :mod:`milo_ray.results` (or from a method plugin's report
tables); this module only chooses how to print it. A metric ``m``
with ``m_lo``/``m_hi`` columns is shown as one cell ``value [lo, hi]``. Each numeric
cell carries its exact value in ``data-v`` (and its interval in ``data-lo``/``data-hi``)
so the page can be checked against the Parquet tables without parsing rounded text.
"""

from __future__ import annotations

import html
import math
from typing import Any, Iterable

import pandas as pd

NO_DATA = "no data"

# Column -> header label; columns not listed keep their own name.
LABELS = {
    "harness_id": "harness", "name": "name", "origin": "origin", "island": "island", "round": "round",
    "n_tasks": "tasks", "k": "k", "pass_at_k": "pass@k", "pr_at_k": "PR@k", "rr_at_k": "RR@k",
    "mean_input_tokens": "input tok/rollout", "mean_output_tokens": "output tok/rollout",
    "mean_seconds": "s/rollout", "usd": "USD", "total_usd": "USD", "cost_usd": "USD", "role": "role",
    "model": "model", "calls": "calls", "input_tokens": "input tokens", "output_tokens": "output tokens",
    "seconds": "seconds", "true_score": "true quality", "wall_seconds": "wall s", "label": "label",
    "n_rollouts": "rollouts", "total_cost_usd": "USD", "timeouts": "timeouts", "errors": "errors",
    "unpriced_calls": "unpriced calls", "retries": "retries", "parent_score": "parent score",
    "best_child": "best child", "best_child_score": "best child score", "stop_reason": "stop", "race_stop": "race stop", "setting": "setting",
    "agent_calls": "agent calls", "agent_input_tokens": "agent input tok", "agent_output_tokens": "agent output tok",
    "agent_cost_usd": "agent USD", "rung": "rung", "run": "run", "run_id": "run id",
}
# Columns printed as a short id (full id in the title tooltip and data-v).
IDS = {"harness_id", "parent", "selected", "best_child", "incumbent", "parent_id"}
# Metric-like columns (values in [0, 1]) printed with 3 decimals.
METRICS = {"pass_at_k", "pr_at_k", "rr_at_k", "true_score", "true_quality", "score", "parent_score",
           "best_child_score", "mean_score"}


def _is_null(v: Any) -> bool:
    if v is None:
        return True
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def fmt(col: str, v: Any) -> str:
    """How one value of column ``col`` is printed."""
    if _is_null(v):
        return "unknown" if "usd" in col else "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if col == "wall_seconds":
        return duration(v)
    if col in IDS and isinstance(v, str):
        return v[:10]
    if isinstance(v, (int,)) or (hasattr(v, "dtype") and getattr(v.dtype, "kind", "") in "iu"):
        return f"{int(v):,}"
    if isinstance(v, float) or (hasattr(v, "dtype") and getattr(v.dtype, "kind", "") == "f"):
        v = float(v)
        if "usd" in col:
            return f"${v:,.4f}"
        if col in METRICS or col.endswith("_at_k"):
            return f"{v:.3f}"
        if "tokens" in col:
            return f"{v:,.0f}"
        if "seconds" in col or col.endswith("_s"):
            return f"{v:,.1f}"
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:,.3f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    return str(v)


def duration(s: Any) -> str:
    """Seconds as ``1h 02m 03s`` / ``4m 05s`` / ``6s``."""
    if not isinstance(s, (int, float)) or not math.isfinite(s):
        return "—"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else (f"{m}m {sec:02d}s" if m else f"{sec}s")


def _numeric(v: Any) -> float | None:
    if _is_null(v) or isinstance(v, (bool, str)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# Text longer than this wraps inside its cell (td.text), so one long sentence cannot push a
# table's other columns out of a 1,400-pixel window.
_WRAP_CHARS = 28


def _ci_columns(columns: Iterable[str]) -> dict[str, tuple[str, str]]:
    cols = set(columns)
    return {c: (f"{c}_lo", f"{c}_hi") for c in cols if f"{c}_lo" in cols and f"{c}_hi" in cols}


def render(df: pd.DataFrame | None, *, columns: list[str] | None = None, table_id: str = "",
           caption: str = "", empty: str = NO_DATA, interval: str = "95% CI") -> str:
    """``df`` as an HTML table (``columns`` selects and orders; absent ones are skipped).

    An empty or missing frame renders as a "no data" note, so a run without a table
    still gets its section. ``interval`` names what the ``_lo``/``_hi`` columns hold."""
    if df is None or len(df) == 0:
        return f'<p class="nodata">{html.escape(empty)}</p>'
    cis = _ci_columns(df.columns)
    hidden = {c for pair in cis.values() for c in pair}
    # A column null on every row (island of an SSR run) says nothing; USD stays,
    # where null means "could not be priced".
    cols = [c for c in (columns or list(df.columns))
            if c in df.columns and c not in hidden and ("usd" in c or not df[c].map(_is_null).all())]
    ident = f' id="{html.escape(table_id)}"' if table_id else ""
    head = "".join(f'<th data-col="{html.escape(c)}">{html.escape(LABELS.get(c, c))}'
                   f'{f"<span class=ci> [{html.escape(interval)}]</span>" if c in cis else ""}</th>' for c in cols)
    body = []
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            attrs = f' data-col="{html.escape(c)}"'
            num = _numeric(v)
            if num is not None:
                attrs += f' data-v="{num!r}" class="num"'
            elif isinstance(v, str):
                attrs += f' data-v="{html.escape(v)}"'
                if len(v) > _WRAP_CHARS:  # a sentence (a stop reason, an error) wraps rather than widening the table
                    attrs += ' class="text"'
            text = html.escape(fmt(c, v))
            if c in IDS and isinstance(v, str):
                text = f'<code title="{html.escape(v)}">{text}</code>'
            if c in cis:
                lo, hi = (_numeric(row[x]) for x in cis[c])
                if lo is not None and hi is not None:
                    attrs += f' data-lo="{lo!r}" data-hi="{hi!r}"'
                    text += f' <span class="ci">[{fmt(c, lo)}, {fmt(c, hi)}]</span>'
            cells.append(f"<td{attrs}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f'<div class="table-wrap"><table{ident}>{cap}<thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')
