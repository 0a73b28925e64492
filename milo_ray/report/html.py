"""The report page: one self-contained HTML file (inline CSS, images as base64 PNG).

Nothing here loads from the network, so ``report.html`` opens offline and can be
mailed or attached as one file. Each figure is also written beside the page as PNG
and SVG (for papers and slides); the page links the SVG by relative path.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from milo_ray import redaction
from milo_ray.report.figure import Figure

PNG_DPI = 130

CSS = """
:root { --fg:#1f2933; --muted:#616e7c; --line:#e4e7eb; --accent:#1565c0; --bg:#ffffff; --panel:#f7f9fb; }
* { box-sizing: border-box; }
body { margin:0; font: 14px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); background: var(--bg); }
header { background: #102a43; color: #f0f4f8; padding: 22px 40px 18px; }
header h1 { margin: 0 0 4px; font-size: 22px; font-weight: 600; letter-spacing: .2px; }
header .sub { color: #bcccdc; font-size: 13px; }
header dl { display: grid; grid-template-columns: repeat(auto-fill, minmax(210px, 1fr)); gap: 8px 24px;
            margin: 16px 0 0; }
header dt { font-size: 11px; text-transform: uppercase; letter-spacing: .6px; color: #9fb3c8; }
header dd { margin: 0; font-size: 14px; word-break: break-word; }
header code { background: rgba(255,255,255,.12); color: #f0f4f8; }
.badge { display:inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.badge.finished { background:#c6f6d5; color:#22543d; } .badge.running { background:#fefcbf; color:#744210; }
.badge.failed, .badge.crashed, .badge.interrupted { background:#fed7d7; color:#822727; }
.layout { display: flex; align-items: flex-start; }
nav { position: sticky; top: 0; width: 220px; flex: none; padding: 20px 12px 20px 28px; font-size: 13px;
      max-height: 100vh; overflow-y: auto; }
nav .toc-title { font-size: 11px; text-transform: uppercase; letter-spacing: .6px; color: var(--muted);
                 margin-bottom: 6px; }
nav ol { list-style: none; padding: 0; margin: 0; }
nav li { margin: 3px 0; } nav li li { margin-left: 12px; font-size: 12px; }
nav a { color: var(--fg); text-decoration: none; } nav a:hover { color: var(--accent); }
main { flex: 1; min-width: 0; padding: 8px 40px 60px 20px; max-width: 1180px; }
section { border-bottom: 1px solid var(--line); padding: 14px 0 22px; }
h2 { font-size: 18px; margin: 10px 0 8px; } h3 { font-size: 15px; margin: 18px 0 6px; color: #334e68; }
p.lead { color: var(--muted); margin: 0 0 10px; }
p.nodata { color: var(--muted); font-style: italic; background: var(--panel); padding: 8px 12px;
           border-left: 3px solid var(--line); }
p.warn { background:#fffbea; border-left: 3px solid #f0b429; padding: 8px 12px; }
p.error { background:#fff5f5; border-left: 3px solid #e53e3e; padding: 8px 12px; font-family: monospace; }
.table-wrap { overflow-x: auto; margin: 6px 0 14px; }
table { border-collapse: collapse; font-size: 12.5px; min-width: 50%; }
caption { text-align: left; color: var(--muted); padding-bottom: 4px; caption-side: top; }
th { text-align: left; font-weight: 600; border-bottom: 2px solid #bcccdc; padding: 6px 5px; white-space: nowrap;
     background: var(--panel); }
td { border-bottom: 1px solid var(--line); padding: 4px 5px; white-space: nowrap; }
td.text { white-space: normal; min-width: 14ch; max-width: 34ch; overflow-wrap: anywhere; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:hover { background: #f0f4f8; }
.ci { color: var(--muted); font-size: 11px; }
td .ci { display: block; line-height: 1.2; }  /* a value's interval under it: half the column's width */
th { white-space: normal; min-width: 6ch; }
code { font: 12px/1.4 SFMono-Regular, Menlo, Consolas, monospace; background: var(--panel); padding: 0 3px;
       border-radius: 3px; }
figure { margin: 12px 0 22px; background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 12px; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: #3e4c59; font-size: 13px; margin-top: 8px; }
figcaption b { color: var(--fg); } figcaption a { color: var(--accent); font-size: 12px; }
dl.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: 2px 24px; margin: 6px 0;
           font-size: 13px; }
dl.facts div { display: flex; gap: 10px; border-bottom: 1px dotted var(--line); padding: 2px 0; }
dl.facts dt { color: var(--muted); flex: 0 0 46%; } dl.facts dd { margin: 0; word-break: break-all; }
details { margin: 8px 0; } summary { cursor: pointer; color: var(--accent); }
pre { background: var(--panel); padding: 10px; overflow-x: auto; font-size: 12px; border-radius: 4px; }
footer { color: var(--muted); font-size: 12px; padding: 16px 40px; }
@media print { nav { display: none; } main { padding: 0 20px; } }
"""


@dataclass
class Section:
    """One report section: ``body`` is trusted HTML built by this package, ``children``
    are nested sections listed under it in the table of contents."""

    anchor: str
    title: str
    body: str = ""
    children: list["Section"] = field(default_factory=list)


def figure_block(fig: Figure, number: int, out_dir: Path) -> str:
    """Write ``<out>/<name>.png`` and ``.svg`` and return the figure's HTML (PNG inline)."""
    buf = io.BytesIO()
    fig.fig.savefig(buf, format="png", dpi=PNG_DPI, facecolor="white")
    png = buf.getvalue()
    (out_dir / f"{fig.name}.png").write_bytes(png)
    svg = io.StringIO()
    fig.fig.savefig(svg, format="svg", facecolor="white")
    (out_dir / f"{fig.name}.svg").write_text(redaction.redact(svg.getvalue()), encoding="utf-8")
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure id="fig-{html.escape(fig.name)}" data-name="{html.escape(fig.name)}">'
            f'<img alt="{html.escape(fig.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>Figure {number}. {html.escape(fig.title)}.</b> {html.escape(fig.caption)} "
            f'<a href="{html.escape(fig.name)}.svg">SVG</a> · <a href="{html.escape(fig.name)}.png">PNG</a>'
            f"</figcaption></figure>")


def facts(items: Iterable[tuple[str, str]], *, cls: str = "facts") -> str:
    """A definition list of (label, already-escaped HTML value) pairs."""
    # Each pair in its own <div> (valid in a <dl>), so a grid lays out pairs, not terms.
    return f'<dl class="{cls}">' + "".join(f"<div><dt>{html.escape(k)}</dt><dd>{v}</dd></div>"
                                           for k, v in items) + "</dl>"


def _toc(sections: list[Section]) -> str:
    def items(secs: list[Section]) -> str:
        out = []
        for s in secs:
            sub = f"<ol>{items(s.children)}</ol>" if s.children else ""
            out.append(f'<li><a href="#{html.escape(s.anchor)}">{html.escape(s.title)}</a>{sub}</li>')
        return "".join(out)

    return f'<nav><div class="toc-title">Contents</div><ol>{items(sections)}</ol></nav>'


def _section(s: Section, level: int = 2) -> str:
    inner = "".join(_section(c, level + 1) for c in s.children)
    tag = f"h{level}"
    if level == 2:
        return f'<section id="{html.escape(s.anchor)}"><{tag}>{html.escape(s.title)}</{tag}>{s.body}{inner}</section>'
    return f'<div id="{html.escape(s.anchor)}"><{tag}>{html.escape(s.title)}</{tag}>{s.body}{inner}</div>'


def page(*, title: str, subtitle: str, header: list[tuple[str, str]], sections: list[Section], footer: str) -> str:
    """The whole document. ``header`` values are already-escaped HTML."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>{html.escape(title)}</h1><div class=\"sub\">{html.escape(subtitle)}</div>"
            f"{facts(header, cls='hdr')}</header>"
            f"<div class=\"layout\">{_toc(sections)}<main>{''.join(_section(s) for s in sections)}</main></div>"
            f"<footer>{footer}</footer></body></html>\n")
