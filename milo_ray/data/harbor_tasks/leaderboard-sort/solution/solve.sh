#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
from pathlib import Path
p = Path("scores/leaderboard.py")
src = p.read_text()
old = src[src.index('    ordered = sorted('):src.index('    return ordered')]
new = '''    ordered = sorted(entries, key=lambda e: (-e["score"], e["time"], e["name"].lower()))
    ranked = []
    for position, entry in enumerate(ordered, start=1):
        tied = ranked and (ranked[-1]["score"], ranked[-1]["time"]) == (entry["score"], entry["time"])
        ranked.append({**entry, "rank": ranked[-1]["rank"] if tied else position})
    ordered = ranked
'''
p.write_text(src.replace(old, new))
PY
