"""Looking at a page as its reader does: headless Chromium lays an HTML page out at a given
window width and reports which tables do not fit their container, and screenshots it.

The check runs in the browser's own layout engine: a copy of the page gets a script that,
once laid out, marks every ``.table-wrap`` (the report's table container, which scrolls
sideways when its table is wider) whose content is wider than its box, and Chromium's
``--dump-dom`` prints the page as the script left it."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

_MEASURE = """<script>
window.addEventListener('load', () => {
  const out = [];
  document.querySelectorAll('.table-wrap').forEach((w, i) => {
    const t = w.querySelector('table');
    const name = (t && (t.id || (t.querySelector('caption') || {}).textContent)) || ('table ' + i);
    if (w.scrollWidth > w.clientWidth + 1) out.push(name.trim() + ' (' + w.scrollWidth + ' > ' + w.clientWidth + ' px)');
  });
  const p = document.createElement('pre'); p.id = 'milo-overflow'; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
});
</script>"""


def chromium() -> str | None:
    """The Chromium binary on this machine, or None."""
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    binary = chromium()
    if binary is None:
        raise RuntimeError("no Chromium on this machine (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="milo-chromium-") as profile:
        return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=timeout)


def overflowing_tables(page: Path, width: int = 1400, height: int = 1000, timeout: float = 120.0) -> list[str]:
    """The tables of ``page`` wider than their container at a ``width``-pixel window: each
    named by its id or caption, with its content and box widths."""
    import json

    html = page.read_text(encoding="utf-8")
    probe = page.with_name(f".{page.stem}.measure.html")  # beside the page: relative images still load
    probe.write_text(html.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    try:
        done = _run([f"--window-size={width},{height}", "--virtual-time-budget=3000", "--dump-dom",
                     probe.resolve().as_uri()], timeout)
    finally:
        probe.unlink(missing_ok=True)
    m = re.search(r'<pre id="milo-overflow">(.*?)</pre>', done.stdout, re.S)
    if m is None:
        raise RuntimeError(f"Chromium did not lay the page out (exit {done.returncode}): {done.stderr[-800:]}")
    return json.loads(m.group(1).replace("&quot;", '"').replace("&gt;", ">").replace("&lt;", "<")
                      .replace("&amp;", "&"))


def screenshot(page: Path, out: Path, width: int = 1400, height: int = 1800, timeout: float = 120.0) -> Path:
    """A PNG of ``page`` as a ``width`` x ``height`` window shows it."""
    _run([f"--window-size={width},{height}", "--virtual-time-budget=3000", f"--screenshot={out.resolve()}",
          page.resolve().as_uri()], timeout)
    if not out.exists():
        raise RuntimeError(f"Chromium wrote no screenshot of {page}")
    return out
