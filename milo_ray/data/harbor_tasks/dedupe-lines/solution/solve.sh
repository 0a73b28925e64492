#!/bin/bash
set -euo pipefail
cd /app
mkdir -p output
python3 - <<'PY'
import json
raw = open("data/subscribers.txt").read().splitlines()
seen, out, blank = set(), [], 0
for line in raw:
    addr = line.strip().lower()
    if not addr:
        blank += 1
    elif addr not in seen:
        seen.add(addr)
        out.append(addr)
open("output/subscribers_clean.txt", "w").write("".join(a + "\n" for a in out))
stats = {"input_lines": len(raw), "blank_lines": blank, "unique": len(out),
         "duplicates_removed": len(raw) - blank - len(out)}
json.dump(stats, open("output/stats.json", "w"))
PY
