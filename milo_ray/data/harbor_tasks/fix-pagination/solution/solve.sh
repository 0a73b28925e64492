#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
from pathlib import Path
p = Path("pager.py")
src = p.read_text()
src = src.replace("return total // per_page", "return -(-total // per_page)")
src = src.replace("start = page * per_page", "start = (page - 1) * per_page")
src = src.replace("return index // per_page", "return index // per_page + 1")
p.write_text(src)
PY
