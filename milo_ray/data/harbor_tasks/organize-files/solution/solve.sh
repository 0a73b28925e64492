#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import json, shutil
from pathlib import Path
CATEGORIES = {"images": {"jpg", "jpeg", "png", "gif"}, "documents": {"pdf", "txt", "md"},
              "data": {"csv", "json"}, "code": {"py", "sh"}}
index = {}
for f in sorted(Path("inbox").iterdir()):
    ext = f.name.rsplit(".", 1)[1].lower() if "." in f.name else ""
    cat = next((c for c, exts in CATEGORIES.items() if ext in exts), "other")
    (Path("sorted") / cat).mkdir(parents=True, exist_ok=True)
    shutil.move(str(f), Path("sorted") / cat / f.name)
    index.setdefault(cat, []).append(f.name)
json.dump({c: sorted(n) for c, n in index.items()}, open("sorted/index.json", "w"), indent=2)
PY
